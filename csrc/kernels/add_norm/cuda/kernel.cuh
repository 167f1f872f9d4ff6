// The fused pre-norm kernels (params.h): one forward and one backward
// template, each a shared prologue (load x and the residual, drop out, form
// h) and epilogue (normalize, affine, store) around one of four row
// strategies (Mode), chosen by plan.h:
//   kRow         a team of threads_per_row threads of one CTA holds a row in
//                registers (several rows a CTA for short rows);
//   kCluster     the same team in each CTA of a thread-block cluster (sm_90),
//                the row's statistics pushed into each CTA's shared memory; a
//                persistent grid, each cluster walking rows (the forward with
//                the next row's inputs in flight; forward rows of one CTA
//                that fit few CTAs an SM walk as clusters of one, plan.h);
//   kGroup       rows too long for a cluster: the same team in each CTA of a
//                group of CTAs, all resident at once (a cooperative launch),
//                the statistics traded through global memory (common.cuh);
//                the same persistent walk as kCluster;
//   kSplitStats  rows whose group cannot be resident, and fp64 rows past a
//   kSplitApply  cluster: `chunks` CTAs each reduce a slice of the row into
//                a workspace, then each re-reads its slice and finishes it
//                (inputs read twice).
// A row's columns are spread over its threads in 16-byte accesses: access i
// of thread t holds columns (i * row_threads + t) * VEC ... + VEC - 1, so a
// warp's accesses are contiguous.
#pragma once
#include <cooperative_groups.h>

#include "../../cuda/common.cuh"
#include "../params.h"
#include "../philox.h"
#include "plan.h"

namespace fln::cuda::add_norm {

enum class Mode { kRow, kCluster, kGroup, kSplitStats, kSplitApply };

// The modes whose grid is persistent, each group of CTAs walking rows.
constexpr bool walks_rows(Mode m) { return m == Mode::kCluster || m == Mode::kGroup; }

struct Layout {
  int threads_per_row = 1;  // of one CTA: a power of two up to 32, or whole warps (then one row a CTA)
  int cluster = 1;          // kCluster, kGroup: CTAs on a row (a cluster, or a group)
  int chunks = 1;           // kSplit*: CTAs on a row (gridDim.x)
  unsigned* row_ticket = nullptr;  // kCluster forward: the counter later rows are taken from (zeroed), or none
  unsigned long long* group_slots = nullptr;  // kGroup: the exchange slots (common.cuh), zeroed
  int64_t prefetch_rows = 0;  // kRow forward with kPrefetch: rows ahead whose inputs are asked of L2
};

// b / n for counts, 0 <= b <= n (fp32): the instructions of IEEE
// division's fast path, so the same correctly rounded quotient, without its
// slow path, which only denormal or extreme exponents take and whose call
// (at every butterfly step) cost about 10 instructions and pinned registers.
__device__ __forceinline__ float count_ratio(float b, float n) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(n));
  r = __fmaf_rn(r, __fmaf_rn(-n, r, 1.0f), r);
  const float q = __fmul_rn(b, r);
  return __fmaf_rn(r, __fmaf_rn(-n, q, b), q);
}
__device__ __forceinline__ double count_ratio(double b, double n) { return b / n; }

// LayerNorm's statistics of a slice of a row, (count, mean, M2), as
// RowReducer's op: each thread starts from a pass over its registers shifted
// by its first element; slices merge by Chan et al.'s rule,
// mean = mean_a + (mean_b - mean_a) * n_b / n, in a fixed order: one
// algorithm for every row strategy, exact for constant rows (every
// difference is zero).  The rule is not symmetric: partners of a butterfly
// may round differently by an ulp; each result is deterministic.  RMSNorm
// and the backward reduce plain sums (InterleavedSumOp).
struct ChanOp {
  template <typename A, int K>
  __device__ __forceinline__ static void merge(A (&a)[K], const A (&b)[K]) {
    static_assert(K == 3, "(count, mean, M2)");
    const A n = a[0] + b[0];
    const A wb = n > A(0) ? count_ratio(b[0], n) : A(0);
    const A d = b[1] - a[1];
    a[2] = a[2] + b[2] + a[0] * wb * d * d;  // an empty side gives 0, even where d * d overflows
    a[1] = a[1] + d * wb;
    a[0] = n;
  }
  template <typename A>
  __device__ __forceinline__ static A identity(int) {
    return A(0);
  }
};

// Reduces over a row's threads: lanes, the CTA's warps, and (kCluster) the
// cluster's CTAs, pushed with st.async onto an mbarrier in each CTA, or
// (kGroup) the group's CTAs through global memory (common.cuh); kSplit*
// modes reduce their CTA's slice.
// Its row_in_cta is 0: a team of whole warps, the only one that reduces
// through shared memory, holds one row a CTA.
template <typename A, int K, Mode M, typename Op = InterleavedSumOp, bool kCtaToken = false>
using Reducer = RowReducer<A, K, 2, M == Mode::kCluster, Op, kCtaToken, M == Mode::kGroup>;

// A thread's place on its rows.
struct Place {
  int64_t first_row, row_step;  // rows first_row, first_row + row_step, ...
  int t, row_threads;           // this thread among the row's threads, and how many
  bool leader;                  // the one thread of a row that stores its mean and rstd
  int chunk;                    // kSplit*: which CTA of the row
  int row_in_cta;               // kRow, kCluster, kGroup: this thread's row among its CTA's rows
};

template <Mode M>
__device__ __forceinline__ Place place(const Layout& lay) {
  Place pl;
  const int tpr = lay.threads_per_row;
  if constexpr (M == Mode::kSplitStats || M == Mode::kSplitApply) {
    pl.chunk = blockIdx.x;
    pl.t = blockIdx.x * tpr + threadIdx.x;
    pl.row_threads = tpr * lay.chunks;
    pl.first_row = blockIdx.y;
    pl.row_step = gridDim.y;
    pl.leader = blockIdx.x == 0 && threadIdx.x == 0;
    pl.row_in_cta = 0;
  } else {
    // A team smaller than its CTA is a power of two of lanes (Layout), so
    // shifts place a thread; kCluster and kGroup launch several CTAs a row.
    int rank = 0;
    int64_t group = blockIdx.x, groups = gridDim.x;
    if constexpr (M == Mode::kCluster) {
      rank = cluster_rank_or_zero(lay.cluster);
    } else if constexpr (M == Mode::kGroup) {
      rank = int(blockIdx.x % unsigned(lay.cluster));
    }
    if constexpr (walks_rows(M)) {
      group /= lay.cluster;
      groups /= lay.cluster;
    }
    const bool one_row = tpr == int(blockDim.x);
    const int log_tpr = __ffs(tpr) - 1;
    const int rows_per_cta = one_row ? 1 : int(blockDim.x) >> log_tpr;
    pl.row_in_cta = one_row ? 0 : int(threadIdx.x) >> log_tpr;
    pl.chunk = 0;
    pl.t = rank * tpr + (one_row ? int(threadIdx.x) : int(threadIdx.x) & (tpr - 1));
    pl.row_threads = tpr * lay.cluster;
    pl.first_row = group * rows_per_cta + pl.row_in_cta;
    pl.row_step = groups * rows_per_cta;
    pl.leader = pl.t == 0;
  }
  return pl;
}

// The keep bits of the four elements of half a block, held by its two words
// (16 bits of a draw an element).
__device__ __forceinline__ uint32_t half_block_bits(const DropoutMask& dm, uint32_t w0, uint32_t w1) {
  return uint32_t((w0 & 0xFFFFu) < dm.threshold) | uint32_t((w0 >> 16) < dm.threshold) << 1 |
         uint32_t((w1 & 0xFFFFu) < dm.threshold) << 2 | uint32_t((w1 >> 16) < dm.threshold) << 3;
}

// The dropout keep bits of one access of VEC <= 4 elements at (row, col), col
// a multiple of VEC: the access lies in one half of a block, two words.
template <int VEC>
__device__ __forceinline__ uint32_t keep_bits(const DropoutMask& dm, int64_t row, int64_t col) {
  static_assert(VEC <= 4, "wider accesses test each element's draw where it is used");
  const Philox4 d = dm.draws(row, col);
  const bool upper = col & 4;
  const uint32_t words[2] = {upper ? d.v[2] : d.v[0], upper ? d.v[3] : d.v[1]};
  if constexpr (VEC == 4) return half_block_bits(dm, words[0], words[1]);
  const int first = int(col & 3);
  uint32_t bits = 0;
#pragma unroll
  for (int k = 0; k < VEC; ++k) {
    const int e = first + k;
    const uint32_t w = e & 2 ? words[1] : words[0];
    bits |= uint32_t(((e & 1 ? w >> 16 : w) & 0xFFFFu) < dm.threshold) << k;
  }
  return bits;
}

// The keep bits of a thread's accesses i and i + 1 of four elements (fp32
// rows), a draw serving eight elements as in 16-bit rows: where a row's team
// is an even number of lanes, lanes 2j and 2j + 1 hold the two halves of each
// block, so the even lane draws access i's block, the odd lane access i + 1's,
// and the pair swaps the halves it does not own with two shuffles.  Every lane
// of the warp calls it (i + 1 == NV: access i alone, drawn by each lane).
template <int NV, typename Col>
__device__ __forceinline__ void keep_bits_fp32(const DropoutMask& dm, int64_t row, Col col, bool paired, int i,
                                               uint32_t (&keep)[NV]) {
  if (i + 1 < NV && paired) {
    auto bits = [&](uint32_t w0, uint32_t w1) { return half_block_bits(dm, w0, w1); };
    const bool odd = threadIdx.x & 1;
    const Philox4 d = dm.draws(row, col(odd ? i + 1 : i));
    const uint32_t own0 = odd ? d.v[2] : d.v[0], own1 = odd ? d.v[3] : d.v[1];
    const uint32_t got0 = __shfl_xor_sync(0xFFFFFFFFu, odd ? d.v[0] : d.v[2], 1);
    const uint32_t got1 = __shfl_xor_sync(0xFFFFFFFFu, odd ? d.v[1] : d.v[3], 1);
    keep[i] = odd ? bits(got0, got1) : bits(own0, own1);
    keep[i + 1] = odd ? bits(own0, own1) : bits(got0, got1);
  } else {
    keep[i] = keep_bits<4>(dm, row, col(i));
    if (i + 1 < NV) keep[i + 1] = keep_bits<4>(dm, row, col(i + 1));
  }
}

__device__ __forceinline__ DropoutMask device_mask(const DropoutRng& rng, int64_t cols, double p) {
  const uint64_t seed = rng.seed_ptr ? uint64_t(*rng.seed_ptr) : rng.seed;
  const uint64_t offset = rng.offset_ptr ? uint64_t(*rng.offset_ptr) + rng.offset_extra : rng.offset;
  return DropoutMask::make(seed, offset, cols, p);
}

// VEC accumulators rounded to R, packed as a Frag.
template <typename DR, typename A, int VEC>
__device__ __forceinline__ Frag<DR, VEC> to_frag(const A (&v)[VEC]) {
  Frag<DR, VEC> f;
  if constexpr (sizeof(DR) == 2 && VEC % 2 == 0) {
#pragma unroll
    for (int k = 0; k < VEC / 2; ++k) f.r.v[k] = acc_to_bits(v[2 * k], v[2 * k + 1], static_cast<DR*>(nullptr));
  } else if constexpr (sizeof(DR) == 2) {  // VEC 1: the low half holds the element
    const DR e = from_acc<DR>(v[0]);
    f.r.v[0] = *reinterpret_cast<const unsigned short*>(&e);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) f.r.v[k] = from_acc<DR>(v[k]);
  }
  return f;
}

// ---------------------------------------------------------------------------
// Forward.  Statistics workspace of the split modes: [rows][chunks] Stats.
// ---------------------------------------------------------------------------
// kDropout false: compiled for dropout_p == 0 only (the launch picks it
// then), without the dropout code, whose registers and predicate tests the
// compiler otherwise keeps on the p == 0 path too.
template <typename T, typename W, typename R, int VEC, int NV, Mode M, bool kDropout, bool kWhole = false,
          bool kPrefetch = false>
__global__ void FLN_MAX_REGS(walks_rows(M) ? kFwdClusterRegs : kFwdRegs)
add_norm_fwd_kernel(AddNormFwdParams p, Layout lay, dacc_t<T>* work) {
  using A = dacc_t<T>;
  using DT = device_t<T>;
  using DW = device_t<W>;
  using DR = device_t<R>;
  constexpr int K = 3;  // LayerNorm (count, mean, M2); RMSNorm reduces sum(h^2)
  constexpr bool kCl = M == Mode::kCluster;
  constexpr bool kWalk = walks_rows(M);
  __shared__ ReduceSmem<A, K> sh;
  __shared__ ReduceSmem<A, 1> sh1;
  __shared__ int ticket_slots[2];
  Reducer<A, K, M, ChanOp, kCl> red{sh, lay.threads_per_row, lay.cluster, 0};  // kCl: tickets' tokens
  Reducer<A, 1, M, InterleavedSumOp, kCl> red1{sh1, lay.threads_per_row, lay.cluster, 0};
  static_assert(!kPrefetch || M == Mode::kRow, "one-shot rows only");
  red.group_slots = red1.group_slots = lay.group_slots;
  if (p.rms) red1.init();
  else red.init();
  const Place pl = place<M>(lay);
  const int64_t n = p.cols;
  auto col = [&](int i) { return int64_t(i * pl.row_threads + pl.t) * VEC; };
  // kWhole: the row is exactly NV accesses of every thread, none past its end.
  auto in_row = [&](int i) { return kWhole || col(i) < n; };
  const bool dropout = kDropout && p.dropout_p > 0.0;
  DropoutMask dm{};
  if (dropout) dm = device_mask(p.rng, n, p.dropout_p);
  if (p.rng_out && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    p.rng_out[0] = int64_t(dm.seed);
    p.rng_out[1] = int64_t(dm.offset);
  }
  const A woff = A(p.weight_offset);
  // kCluster and kGroup (a persistent grid) load the next row's x and
  // residual before this row is reduced and written, so a row's loads are
  // always in flight.
  struct RowIn {
    Frag<DT, VEC> x[NV];
    Frag<DR, VEC> r[NV];
  };
  // A row's pointers are formed once, its accesses offset from them: the
  // 64-bit row offset is otherwise recomputed at every access.
  auto x_row = [&](int64_t row) { return static_cast<const DT*>(p.x) + row * p.x_stride; };
  auto r_row = [&](int64_t row) {
    return p.residual ? static_cast<const DR*>(p.residual) + row * p.residual_stride : nullptr;
  };
  auto load_row = [&](int64_t row, RowIn& in) {
    const DT* xr = x_row(row);
    const DR* rr = r_row(row);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (row >= p.rows || !in_row(i)) continue;
      load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(in.x[i], xr + col(i));
      if (rr) in.r[i].load(rr + col(i));
    }
  };
  RowIn next;
  if constexpr (kWalk) load_row(pl.first_row, next);
  // Which rows a group (a CTA or cluster) takes: first_row, first_row +
  // row_step, ...; with lay.row_ticket (kCluster: one row a group) its first
  // three rows are those and each later one is 3 * row_step plus a ticket of
  // the counter, so that fast groups take more rows (a static schedule ends
  // with its slowest group).  Thread 0 of the group's first CTA takes a
  // ticket at the top of every row; the row's reduction hands the one it
  // took a row earlier to the group (RowReducer's token), so the atomic's
  // latency hides behind a row; it names the row two ahead, whose loads the
  // next row issues.  A group stops at its first row past the rows; the
  // tickets it took after it are later, so past the rows too.
  const bool tickets = kCl && lay.row_ticket != nullptr;  // uniform
  const bool ticket_taker = tickets && pl.t == 0;
  int fresh = 0;                                  // ticket_taker: this row's ticket
  int token = int(pl.first_row - pl.row_step);    // a row old; at first, the third row less 3 * row_step
  int64_t next_row = pl.first_row + pl.row_step;  // the row whose loads this row issues (kWalk)
  auto advance = [&]() {
    const int64_t r = next_row;
    next_row = tickets ? 3 * pl.row_step + token : next_row + pl.row_step;
    token = fresh;  // others' are replaced by the next reduction's
    return r;
  };
  // Loop while any row of this CTA (cluster) is live: trip counts stay
  // uniform, so every thread reaches every barrier.
  for (int64_t row = pl.first_row;; row = advance()) {
    const int64_t cta_first = row - pl.row_in_cta;
    if (cta_first >= p.rows) break;
    const bool live = row < p.rows;
    // Prologue: h = dropout(x) + residual, held as R (y normalizes the h
    // that is returned, and 16-bit values stay packed two to a register); the
    // split's second pass reads h back.  Every load of the row is issued
    // before the first store: a store may alias a later load, so the
    // compiler would not move that load above it.
    Frag<DR, VEC> h[NV];
    Frag<DT, VEC> xf[NV];
    Frag<DR, VEC> rf[NV];
    auto valid = [&](int i) { return live && in_row(i); };
    DR* const hg = p.h ? static_cast<DR*>(p.h) + row * n : nullptr;
    if constexpr (kWalk) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        xf[i] = next.x[i];
        rf[i] = next.r[i];
      }
      load_row(next_row, next);
    } else {
      const DT* xr = x_row(row);
      const DR* rr = r_row(row);
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (!valid(i)) continue;
        const int64_t c = col(i);
        if constexpr (M == Mode::kSplitApply) {
          h[i].load(hg + c);
        } else {
          load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(xf[i], xr + c);
          if (rr) rf[i].load(rr + c);
        }
      }
      // A CTA taken once asks L2 for the row lay.prefetch_rows on, which a CTA
      // a quarter round of resident CTAs later takes (plan.h).
      if constexpr (kPrefetch) {
        const int64_t ahead = row + lay.prefetch_rows;
        if (live && ahead < p.rows) {
#pragma unroll
          for (int i = 0; i < NV; ++i) {
            if (!in_row(i)) continue;
            prefetch_l2(x_row(ahead) + col(i));
            if (rr) prefetch_l2(r_row(ahead) + col(i));
          }
        }
      }
    }
    uint32_t keep4[VEC == 4 ? NV : 1];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t c = col(i);
      // fp32 rows draw a pair of accesses at a time, before any lane leaves.
      if constexpr (VEC == 4 && M != Mode::kSplitApply)
        if (dropout && i % 2 == 0) keep_bits_fp32(dm, row, col, lay.threads_per_row % 2 == 0, i, keep4);
      if (!valid(i)) {
        h[i].zero();
        continue;
      }
      if constexpr (M != Mode::kSplitApply) {
        const bool plain = !dropout && !p.residual && std::is_same_v<DR, DT>;
        if (plain) {  // h is x
          if constexpr (std::is_same_v<DR, DT>) h[i] = xf[i];
        } else {
          // 16-bit rows test each element's draw where it is used (packed keep
          // bits cost about 2 instructions an element); other rows use keep_bits.
          constexpr int kBlock = DropoutMask::kBlock;
          constexpr bool kDraws = VEC % kBlock == 0;
          Philox4 draws[kDraws ? VEC / kBlock : 1];
          uint32_t keep = ~0u;
          auto kept = [&](int k) -> bool {
            if constexpr (kDraws) return dm.keep(draws[k / kBlock], k % kBlock);
            else return (keep >> k) & 1u;
          };
          if (dropout) {
            if constexpr (kDraws) {
#pragma unroll
              for (int q = 0; q < VEC / kBlock; ++q) draws[q] = dm.draws(row, c + kBlock * q);
            } else if constexpr (VEC == 4) {
              keep = keep4[i];
            } else {
              keep = keep_bits<VEC>(dm, row, c);
            }
            if (p.mask) {
              Vec<uint8_t, VEC> mv;
#pragma unroll
              for (int k = 0; k < VEC; ++k) mv.v[k] = uint8_t(kept(k));
              *reinterpret_cast<Vec<uint8_t, VEC>*>(p.mask + row * n + c) = mv;
            }
          }
          A hv[VEC];
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            A v = xf[i].get(k);
            if (dropout) v = kept(k) ? v * A(dm.scale) : A(0);
            if (p.residual) v += A(rf[i].get(k));
            hv[k] = v;
          }
          h[i] = to_frag<DR>(hv);
        }
        if (hg) h[i].store(hg + c);
      }
    }
    // Statistics.  Their reduction hands the token on (tickets only).
    if (ticket_taker) fresh = int(take_ticket(lay.row_ticket));
    int* const slots = tickets ? ticket_slots : nullptr;
    A mean = A(0), rstd = A(0);
    const bool split_first = M == Mode::kSplitStats;
    if (p.rms) {
      A s[1] = {A(0)};
#pragma unroll
      for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int k = 0; k < VEC; ++k) s[0] += h[i].get(k) * h[i].get(k);
      if constexpr (M != Mode::kSplitApply) red1.reduce(s, token, slots);
      if constexpr (M == Mode::kSplitStats) {
        if (live && threadIdx.x == 0) work[(row * lay.chunks + pl.chunk) * K] = s[0];
      } else if constexpr (M == Mode::kSplitApply) {
        s[0] = A(0);
        for (int c = 0; c < lay.chunks; ++c) s[0] += live ? work[(row * lay.chunks + c) * K] : A(0);
      }
      rstd = rsqrt_acc(s[0] / A(n) + A(p.eps));
    } else {
      A s[K];
      int cnt = 0;
      const A shift = A(h[0].get(0));  // this thread's first element (0 where it has none)
      A sum = A(0);
#pragma unroll
      for (int i = 0; i < NV; ++i)
        if (in_row(i))
#pragma unroll
          for (int k = 0; k < VEC; ++k) sum += A(h[i].get(k)) - shift;
#pragma unroll
      for (int i = 0; i < NV; ++i) cnt += live && in_row(i) ? VEC : 0;
      const A m = cnt ? shift + sum / A(cnt) : A(0);
      A m2 = A(0);
#pragma unroll
      for (int i = 0; i < NV; ++i)
        if (in_row(i))
#pragma unroll
          for (int k = 0; k < VEC; ++k) m2 += (A(h[i].get(k)) - m) * (A(h[i].get(k)) - m);
      s[0] = A(cnt);
      s[1] = m;
      s[2] = live ? m2 : A(0);
      if constexpr (M != Mode::kSplitApply) red.reduce(s, token, slots);
      if constexpr (M == Mode::kSplitStats) {
        if (live && threadIdx.x == 0)
#pragma unroll
          for (int k = 0; k < K; ++k) work[(row * lay.chunks + pl.chunk) * K + k] = s[k];
      } else if constexpr (M == Mode::kSplitApply) {
#pragma unroll
        for (int k = 0; k < K; ++k) s[k] = A(0);
        for (int c = 0; c < lay.chunks && live; ++c) {
          A o[K];
#pragma unroll
          for (int k = 0; k < K; ++k) o[k] = work[(row * lay.chunks + c) * K + k];
          ChanOp::merge(s, o);
        }
      }
      mean = s[1];
      rstd = rsqrt_acc(s[2] / A(n) + A(p.eps));
    }
    if (split_first || !live) continue;
    if (pl.leader) {
      if (p.mean) static_cast<A*>(p.mean)[row] = mean;
      if (p.rstd) static_cast<A*>(p.rstd)[row] = rstd;
    }
    // Epilogue: y = (h - mean) * rstd * (w + weight_offset) + b.  The
    // pointers are __restrict__, so the compiler may hoist weight and bias
    // loads above earlier stores as registers allow.
    const DW* __restrict__ wg = static_cast<const DW*>(p.w);
    const DW* __restrict__ bg = static_cast<const DW*>(p.b);
    DT* __restrict__ yg = static_cast<DT*>(p.y) + row * n;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t c = col(i);
      if (!in_row(i)) continue;
      Frag<DW, VEC> wf, bf;
      if (wg) wf.load(wg + c);
      if (bg) bf.load(bg + c);
      A y[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        A v = (A(h[i].get(k)) - mean) * rstd;
        if (wg) v *= A(wf.get(k)) + woff;
        else v *= A(1) + woff;
        if (bg) v += A(bf.get(k));
        y[k] = v;
      }
      store_vec(yg + c, y);
    }
  }
  red.finish();  // the same cluster meeting as red1's
}

// ---------------------------------------------------------------------------
// Backward.  A persistent grid: each team keeps dweight / dbias partials for
// its columns in registers over all its rows, then writes one partial row
// (part_w / part_b [groups][cols]); finalize_kernel adds them in a fixed
// order.  Split modes: the first pass writes each chunk's two sums to the
// workspace ([rows][chunks][2]), the second finishes the row.
// ---------------------------------------------------------------------------
template <typename T, typename W, typename R, int VEC, int NV, Mode M, bool kPair = false, bool kPrefetch = false>
__global__ void FLN_MAX_REGS(bwd_registers(sizeof(T), NV * VEC, kPair))
add_norm_bwd_kernel(AddNormBwdParams p, Layout lay, dacc_t<T>* part_w, dacc_t<T>* part_b, dacc_t<T>* work) {
  using A = dacc_t<T>;
  using DT = device_t<T>;
  using DW = device_t<W>;
  using DR = device_t<R>;
  extern __shared__ __align__(16) unsigned char merge_smem[];
  // Rows in pairs with one reduction of four sums (plan.h), or one at a time.
  static_assert(!kPair || (M == Mode::kCluster && bwd_row_pairs(sizeof(T), sizeof(R), NV * VEC, VEC)),
                "pairs: 16-byte cluster rows");
  static_assert(!kPrefetch || (!kPair && (M == Mode::kRow || M == Mode::kCluster)), "rows walked one at a time");
  constexpr int kSums = kPair ? 4 : 2;
  __shared__ ReduceSmem<A, kSums> sh;
  Reducer<A, kSums, M> red{sh, lay.threads_per_row, lay.cluster, 0};
  red.group_slots = lay.group_slots;
  red.init();
  const Place pl = place<M>(lay);
  const int64_t n = p.cols;
  auto col = [&](int i) { return int64_t(i * pl.row_threads + pl.t) * VEC; };
  const bool dropout = p.dropout_p > 0.0;
  const A woff = A(p.weight_offset);
  // This thread's columns are the same in every row: its weights stay in
  // registers, packed (1 without a weight, offset added at use).
  Frag<DW, VEC> w[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    if (p.w && col(i) < n) w[i].load(static_cast<const DW*>(p.w) + col(i));
    else w[i].one();
  }
  constexpr bool kPartials = M != Mode::kSplitStats;
  A pw[kPartials ? NV : 1][VEC], pb[kPartials ? NV : 1][VEC];
#pragma unroll
  for (int i = 0; i < (kPartials ? NV : 1); ++i)
#pragma unroll
    for (int k = 0; k < VEC; ++k) pw[i][k] = pb[i][k] = A(0);
  const A inv_n = A(1) / A(n);
  // One row's inputs, loaded a row (a pair) ahead of it, so that their DRAM
  // latency overlaps the reductions and stores of the rows before.
  struct RowIn {
    Frag<DR, VEC> h[NV];
    Frag<DT, VEC> dy[NV];
    A mean, rstd;
  };
  const bool want_dh = p.dh && M != Mode::kSplitStats;
  auto load_row = [&](int64_t row, RowIn& in) {
    const bool live = row < p.rows;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (live && col(i) < n) {
        load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(in.h[i], static_cast<const DR*>(p.h) + row * p.h_stride + col(i));
        load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(in.dy[i], static_cast<const DT*>(p.dy) + row * p.dy_stride + col(i));
      } else {
        in.h[i].zero();
        in.dy[i].zero();
      }
    }
    in.mean = live && !p.rms ? static_cast<const A*>(p.mean)[row] : A(0);
    in.rstd = live ? static_cast<const A*>(p.rstd)[row] : A(0);
  };
  // kPrefetch: the row after the one in registers is asked of L2 (plan.h).
  auto prefetch_row = [&](int64_t row) {
    if (row >= p.rows) return;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (col(i) >= n) continue;
      prefetch_l2(static_cast<const DR*>(p.h) + row * p.h_stride + col(i));
      prefetch_l2(static_cast<const DT*>(p.dy) + row * p.dy_stride + col(i));
      if (want_dh) prefetch_l2(static_cast<const DR*>(p.dh) + row * p.dh_stride + col(i));
    }
  };
  // Rows in pairs.  sum(g * xhat), sum(g), g = dy * (w + offset), into s[0],
  // s[1]; and the row's dweight / dbias partials.
  auto row_sums = [&](const RowIn& cur, A* s) {
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A xh = (A(cur.h[i].get(k)) - cur.mean) * cur.rstd, d = A(cur.dy[i].get(k)),
                g = d * (A(w[i].get(k)) + woff);
        s[0] += g * xh;
        s[1] += g;
        if constexpr (kPartials) {
          pw[i][k] += d * xh;
          pb[i][k] += d;
        }
      }
  };
  // dh = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dh_in (RMSNorm: no
  // mean(g)), stored as dresidual and, dropped out, as dx.
  auto row_out = [&](int64_t row, const RowIn& cur, const Frag<DR, VEC> (&dhf)[NV], A sum_gx, A sum_g) {
    const A mean = cur.mean, rstd = cur.rstd;
    const A c_gx = sum_gx * inv_n, c_g = p.rms ? A(0) : sum_g * inv_n;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t c = col(i);
      if (c >= n) continue;
      A dh[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A xh = (A(cur.h[i].get(k)) - mean) * rstd, g = A(cur.dy[i].get(k)) * (A(w[i].get(k)) + woff);
        dh[k] = rstd * (g - c_g - xh * c_gx);
        if (p.dh) dh[k] += A(dhf[i].get(k));
      }
      if (p.dresidual) store_vec(static_cast<DR*>(p.dresidual) + row * n + c, dh);
      if (p.dx) {
        if (dropout) {
          const DropoutMask dm = device_mask(p.rng, n, p.dropout_p);  // rebuilt where used: no registers held
          if constexpr (VEC % DropoutMask::kBlock == 0) {  // each element's draw tested where used
#pragma unroll
            for (int q = 0; q < VEC / DropoutMask::kBlock; ++q) {
              const Philox4 d = dm.draws(row, c + DropoutMask::kBlock * q);
#pragma unroll
              for (int k = 0; k < DropoutMask::kBlock; ++k) {
                A& v = dh[DropoutMask::kBlock * q + k];
                v = dm.keep(d, k) ? v * A(dm.scale) : A(0);
              }
            }
          } else {  // fp32: a draw an access (lane pairs, as in the forward, ran slower in the backward)
            const uint32_t keep = keep_bits<VEC>(dm, row, c);
#pragma unroll
            for (int k = 0; k < VEC; ++k) dh[k] = (keep >> k) & 1u ? dh[k] * A(dm.scale) : A(0);
          }
        }
        store_vec(static_cast<DT*>(p.dx) + row * n + c, dh);
      }
    }
  };
  // Two rows (row and row + row_step), one reduction; their buffers are
  // refilled two rows ahead before it.
  auto row_pair = [&](int64_t row, RowIn (&ahead)[2]) -> bool {
    if (row - pl.row_in_cta >= p.rows) return false;
    const RowIn c0 = ahead[0], c1 = ahead[1];
    load_row(row + 2 * pl.row_step, ahead[0]);
    load_row(row + 3 * pl.row_step, ahead[1]);
    A s[kSums] = {};
    row_sums(c0, s);
    row_sums(c1, s + 2);
    Frag<DR, VEC> dh0[NV], dh1[NV];  // loaded before the reduction, which their latency overlaps
    if (want_dh) {
#pragma unroll
      for (int i = 0; i < NV; ++i)
        if (col(i) < n) {
          if (row < p.rows) dh0[i].load(static_cast<const DR*>(p.dh) + row * p.dh_stride + col(i));
          if (row + pl.row_step < p.rows)
            dh1[i].load(static_cast<const DR*>(p.dh) + (row + pl.row_step) * p.dh_stride + col(i));
        }
    }
    red.reduce(s);
    if (row < p.rows) row_out(row, c0, dh0, s[0], s[1]);
    if (row + pl.row_step < p.rows) row_out(row + pl.row_step, c1, dh1, s[2], s[3]);
    return true;
  };
  // Rows one at a time keep their own loop: written through the lambdas above,
  // their code changed and one-CTA rows ran slower (docs/design.md).
  if constexpr (kPair) {
    RowIn ahead[2];
    load_row(pl.first_row, ahead[0]);
    load_row(pl.first_row + pl.row_step, ahead[1]);
    for (int64_t row = pl.first_row;; row += 2 * pl.row_step)
      if (!row_pair(row, ahead)) break;
  } else {
    RowIn next;
    load_row(pl.first_row, next);
    for (int64_t row = pl.first_row;; row += pl.row_step) {
      const int64_t cta_first = row - pl.row_in_cta;
      if (cta_first >= p.rows) break;
      const bool live = row < p.rows;
      const RowIn cur = next;
      load_row(row + pl.row_step, next);
      if constexpr (kPrefetch) prefetch_row(row + 2 * pl.row_step);
      const auto& hf = cur.h;
      const auto& dyf = cur.dy;
      const A mean = cur.mean, rstd = cur.rstd;
      Frag<DR, VEC> dhf[NV];
      if (p.dh && M != Mode::kSplitStats)
#pragma unroll
        for (int i = 0; i < NV; ++i)
          if (live && col(i) < n) dhf[i].load(static_cast<const DR*>(p.dh) + row * p.dh_stride + col(i));
      // sum(g * xhat), sum(g), g = dy * (w + offset)
      A s[2] = {A(0), A(0)};
#pragma unroll
      for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A xh = (A(hf[i].get(k)) - mean) * rstd, d = A(dyf[i].get(k)), g = d * (A(w[i].get(k)) + woff);
          s[0] += g * xh;
          s[1] += g;
          if constexpr (kPartials) {
            pw[i][k] += d * xh;
            pb[i][k] += d;
          }
        }
      if constexpr (M != Mode::kSplitApply) red.reduce(s);
      if constexpr (M == Mode::kSplitStats) {
        if (live && threadIdx.x == 0) {
          work[(row * lay.chunks + pl.chunk) * 2] = s[0];
          work[(row * lay.chunks + pl.chunk) * 2 + 1] = s[1];
        }
        continue;
      } else {
        if constexpr (M == Mode::kSplitApply) {
          s[0] = s[1] = A(0);
          for (int c = 0; c < lay.chunks && live; ++c) {
            s[0] += work[(row * lay.chunks + c) * 2];
            s[1] += work[(row * lay.chunks + c) * 2 + 1];
          }
        }
        if (!live) continue;
        // dh = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dh_in (RMSNorm: no mean(g))
        const A c_gx = s[0] * inv_n, c_g = p.rms ? A(0) : s[1] * inv_n;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          const int64_t c = col(i);
          if (c >= n) continue;
          A dh[VEC];
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const A xh = (A(hf[i].get(k)) - mean) * rstd, g = A(dyf[i].get(k)) * (A(w[i].get(k)) + woff);
            dh[k] = rstd * (g - c_g - xh * c_gx);
            if (p.dh) dh[k] += A(dhf[i].get(k));
          }
          if (p.dresidual) store_vec(static_cast<DR*>(p.dresidual) + row * n + c, dh);
          if (p.dx) {
            if (dropout) {
              const DropoutMask dm = device_mask(p.rng, n, p.dropout_p);  // rebuilt where used: no registers held
              if constexpr (VEC % DropoutMask::kBlock == 0) {  // each element's draw tested where used
#pragma unroll
                for (int q = 0; q < VEC / DropoutMask::kBlock; ++q) {
                  const Philox4 d = dm.draws(row, c + DropoutMask::kBlock * q);
#pragma unroll
                  for (int k = 0; k < DropoutMask::kBlock; ++k) {
                    A& v = dh[DropoutMask::kBlock * q + k];
                    v = dm.keep(d, k) ? v * A(dm.scale) : A(0);
                  }
                }
              } else {  // fp32: a draw an access (lane pairs, as in the forward, ran slower in the backward)
                const uint32_t keep = keep_bits<VEC>(dm, row, c);
#pragma unroll
                for (int k = 0; k < VEC; ++k) dh[k] = (keep >> k) & 1u ? dh[k] * A(dm.scale) : A(0);
              }
            }
            store_vec(static_cast<DT*>(p.dx) + row * n + c, dh);
          }
        }
      }
    }
  }
  red.finish();
  if constexpr (kPartials) {
    if (part_w == nullptr) return;
    // One partial row per CTA: its rows' teams merged in row order.
    const int tpr = lay.threads_per_row, rows_per_cta = blockDim.x / tpr;
    const int64_t part = M == Mode::kSplitApply ? int64_t(blockIdx.y) : int64_t(blockIdx.x / lay.cluster);
    A* sm = reinterpret_cast<A*>(merge_smem);
    if (rows_per_cta > 1) {
#pragma unroll
      for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          sm[((i * VEC + k) * 2) * blockDim.x + threadIdx.x] = pw[i][k];
          sm[((i * VEC + k) * 2 + 1) * blockDim.x + threadIdx.x] = pb[i][k];
        }
      __syncthreads();
      if (int(threadIdx.x) >= tpr) return;
      for (int r = 1; r < rows_per_cta; ++r)
#pragma unroll
        for (int i = 0; i < NV; ++i)
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            pw[i][k] += sm[((i * VEC + k) * 2) * blockDim.x + r * tpr + threadIdx.x];
            pb[i][k] += sm[((i * VEC + k) * 2 + 1) * blockDim.x + r * tpr + threadIdx.x];
          }
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t c = col(i);
      if (c >= n) continue;
      store_vec(part_w + part * n + c, pw[i]);
      if (part_b) store_vec(part_b + part * n + c, pb[i]);
    }
  }
}

// dw[c] = sum over q of part_w[q][c] in a fixed order (and db from part_b):
// a CTA owns 32 columns; its kFinalizeWarps warps take partial rows w, w +
// kFinalizeWarps, ... in ascending order, then their sums are added in warp
// order.  blockIdx.y picks dweight (0) or dbias (1).  nparts == 0 gives zeros.
constexpr int kFinalizeWarps = 16;

template <typename W, typename A>
__global__ void __launch_bounds__(kFinalizeWarps * 32)
add_norm_finalize_kernel(const A* __restrict__ part_w, const A* __restrict__ part_b, int64_t nparts, int64_t n,
                         W* __restrict__ dw, W* __restrict__ db) {
  __shared__ A s[kFinalizeWarps][33];
  const A* part = blockIdx.y == 0 ? part_w : part_b;
  W* out = blockIdx.y == 0 ? dw : db;
  if (out == nullptr) return;  // uniform per CTA
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = int64_t(blockIdx.x) * 32 + lane;
  A acc[4] = {A(0), A(0), A(0), A(0)};
  if (c < n) {
    int64_t q = warp;
    for (; q + 3 * kFinalizeWarps < nparts; q += 4 * kFinalizeWarps)
#pragma unroll
      for (int u = 0; u < 4; ++u) acc[u] += part[(q + u * kFinalizeWarps) * n + c];
    for (; q < nparts; q += kFinalizeWarps) acc[0] += part[q * n + c];
  }
  s[warp][lane] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  __syncthreads();
  if (warp != 0 || c >= n) return;
  A total = A(0);
  for (int w = 0; w < kFinalizeWarps; ++w) total += s[w][lane];
  out[c] = from_acc<W>(total);
}

}  // namespace fln::cuda::add_norm
