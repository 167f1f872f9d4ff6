// Forward kernel, row held in registers.  `tpr` threads of a CTA (times
// `csize` CTAs of a cluster for the largest rows) own one row; each thread
// keeps NV accesses of VEC elements in the storage dtype (Frag: 16-bit types
// packed two to a register), and x is read from global memory once (plus
// the row's first element, which every thread reads: L1 serves it).  The
// statistics come from the registers (see kMaxShiftRatio), then y is
// written.  Rows are visited in a grid-stride loop (staged clusters: rows
// from a counter past the first three, see row_ticket) whose trip count is
// uniform across a CTA and its cluster, so every thread takes part in every
// barrier.
#pragma once
#include "common.cuh"
#include "../params.h"

namespace fln::cuda {

struct RowLayout {
  int tpr;    // threads of one CTA on a row (a power of two up to 32, else whole warps)
  int csize;  // CTAs of a cluster on a row (1 without clusters)
  // Staged clusters (STAGE, csize > 1): a counter, zero at launch, from
  // which each cluster takes its rows past its first three (null: every
  // cluster takes every ngroups-th row).  See the kernel.
  unsigned* row_ticket = nullptr;
};

// A thread's place in a RowLayout.  A CTA holds several rows only when tpr is
// a power of two, and csize is always a power of two (launch_plan.h;
// test_launch_plan.cpp checks both), so shifts and masks stand in for integer
// divisions: a forward CTA often runs a single row, so its setup is paid per
// row, and the divisions were a sizeable share of a thread's instructions.
struct RowCoords {
  int row_in_cta;  // which of the CTA's rows
  int rpc;         // rows per CTA
  int crank;       // rank of this CTA in its cluster
  int stride;      // threads on a row
  int t;           // this thread's index among them
  int group;       // row group (CTA, or cluster) of this CTA
  int ngroups;     // row groups in the grid
};

__device__ __forceinline__ RowCoords row_coords(const RowLayout& lay) {
  RowCoords r;
  const bool several = (lay.tpr & (lay.tpr - 1)) == 0 && lay.tpr < int(blockDim.x);
  const int tpr_log2 = __ffs(lay.tpr) - 1, cs_log2 = __ffs(lay.csize) - 1;
  r.row_in_cta = several ? int(threadIdx.x) >> tpr_log2 : 0;
  r.rpc = several ? int(blockDim.x) >> tpr_log2 : 1;
  r.crank = cluster_rank_or_zero(lay.csize);
  r.stride = lay.tpr * lay.csize;
  r.t = r.crank * lay.tpr + (several ? int(threadIdx.x) & (lay.tpr - 1) : int(threadIdx.x));
  r.group = int(blockIdx.x) >> cs_log2;
  r.ngroups = int(gridDim.x) >> cs_log2;
  return r;
}

// CACHE_WB (persistent grids): each thread copies its slice of weight and
// bias into shared memory once, [access][thread], and reads it back for every
// row, instead of re-reading it from L2 (long rows do not stay in L1).  Takes
// NV * blockDim.x * VEC * sizeof(W) bytes of dynamic shared memory for each
// of the two that the launch reads, the bias's after the weight's.
//
// STAGE (with CACHE_WB, 16-byte accesses): each thread also copies its
// slice of the next row into shared memory (cp.async, another NV *
// blockDim.x * 16 bytes, its own slots after the cache, then the row
// tickets' 16 bytes: kTicketSlotBytes) as soon as it has
// summed the current one, and reads it back into registers when that row's
// turn comes: the copy overlaps the cluster's reduction and the write of y.
//
// X_SMEM (16-byte accesses, one row per CTA, no CACHE_WB): the row is kept
// in shared memory instead of registers, in the same [access][thread] slots,
// copied there with cp.async.  Each thread reads back only the slots it
// copied, so no barrier is needed.  Shared memory holds more of a row than
// the registers can (more rows in flight per SM), at one shared-memory load
// per access and pass.  Takes nv * blockDim.x * 16 bytes (nv: the plan's
// accesses per thread, at most NV).  Weight and bias are read from L1 for
// every row; where they are 16-byte accesses (weights of x's dtype) they are
// loaded evict_last, so that the lines the other rows of the SM reuse stay
// there: at 2 x 64 KB of rows in shared memory an SM has about 124 KB of L1
// for 128 KB of fp32 16384 weight and bias, so LayerNorm's bias costs
// bandwidth where RMSNorm's weight alone fits.  The evict_last loads measured
// faster there; streaming the bias past L1 instead ran slower.  fp32 weights
// on 16-bit x take ordinary loads.
//
// Statistics.  RMSNorm reduces sum(x^2).  LayerNorm, in most kernels,
// reduces the sums of d = x - K and d^2 together, K the row's first
// element (0 where the row comes through shared memory): mean = K +
// sum(d) / n, var = sum(d^2) / n - (mean - K)^2.  The subtraction magnifies
// the rounding of sum(d^2) by 1 + (mean - K)^2 / var, so a row whose (mean -
// K)^2 exceeds kMaxShiftRatio * var (K an outlier), or whose var is not
// finite, takes a second pass, sum((x - mean)^2) over the registers, as
// the excluded kernels always do after a mean from the sum of x - x[0]: the
// scalar kernels, the 128-byte fp32 threads, and weights wider than x or x
// wider than 4 bytes (these spill with both paths, and ran slower with one
// reduction).  Elsewhere one reduction instead of two measured faster.
// A constant row's mean is its value and its variance 0 on every path (K = 0:
// 4-byte rows add the mean of x - mean, 16-bit rows take the second pass
// about common.cuh's snap_center).
constexpr float kMaxShiftRatio = 8;

// inv_n is 1 / cols, rounded once on the host.  The statistics multiply by
// it: a division costs about ten instructions and a branch in every row, and
// a reciprocal computed in the kernel holds a register for the whole kernel
// (the fp32 128-byte threads then spilled more and ran slower); a kernel
// parameter is read from the constant bank.
template <typename T, typename W, int VEC, int NV, bool CACHE_WB, bool X_SMEM, bool CLUSTER, bool STAGE>
__global__ void __launch_bounds__(kMaxCtaThreads, 2)
norm_fwd_kernel(FwdParams p, RowLayout lay, dacc_t<T> inv_n) {
  static_assert(!(X_SMEM && CACHE_WB), "one use of the dynamic shared memory at a time");
  static_assert(!STAGE || (CACHE_WB && VEC * sizeof(T) == 16), "rows are staged beside the weight cache");
  // Registers must be indexed by constants (full unroll); the shared-memory
  // loops are unrolled by 4, or their per-access addresses would all stay live.
  constexpr int kUnroll = X_SMEM && NV > 4 ? 4 : NV;
  using A = dacc_t<T>;
  __shared__ ReduceSmem<A, 1> smem;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  const RowCoords rc = row_coords(lay);
  // The dynamic shared memory follows the static (the window's 1 KB reserved,
  // then this kernel's two ReduceSmem: 800 bytes with fp32 sums).  Staged
  // clusters pad the static to a multiple of 128 bytes, so that their cache
  // and stage, filled by 16-byte cp.async, start on a 128-byte boundary
  // instead of 32 bytes past one (measured faster); 8 bytes more, 16 off a
  // 32-byte boundary, had made them far slower.  The asm keeps the otherwise
  // unused padding.
  if constexpr (STAGE) {
    constexpr int kStatic = int(sizeof(ReduceSmem<A, 1>) + sizeof(ReduceSmem<A, 2>));
    static_assert(kStatic % 16 == 0, "the padding rounds up 16-byte-aligned buffers");
    __shared__ __align__(16) unsigned char pad[kStatic % 128 ? 128 - kStatic % 128 : 128];
    asm volatile("" ::"r"(smem_addr(pad)));
  }
  const int tpr = lay.tpr, rpc = rc.rpc, row_in_cta = rc.row_in_cta, stride = rc.stride, t = rc.t;
  const int64_t group = rc.group, ngroups = rc.ngroups;
  // 64-bit columns: with int columns the shared-memory kernels (X_SMEM) ran
  // slower.
  const int64_t n = p.cols;
  auto col = [&](int i) { return int64_t(i * stride + t) * VEC; };
  const T* __restrict__ xg = static_cast<const T*>(p.x);
  const W* __restrict__ wg = static_cast<const W*>(p.w);
  const W* __restrict__ bg = static_cast<const W*>(p.b);
  RowReducer<A, 1, 2, CLUSTER> red{smem, tpr, lay.csize, row_in_cta};
  constexpr bool kShifted =
      sizeof(W) <= sizeof(T) && sizeof(T) <= 4 && (X_SMEM || (VEC > 1 && NV * VEC * sizeof(T) <= 64));
  // K = 0 where the row comes through shared memory (see below).
  constexpr bool kZeroK = STAGE || X_SMEM;
  __shared__ ReduceSmem<A, 2> smem2;
  RowReducer<A, 2, 2, CLUSTER> red2{smem2, tpr, lay.csize, row_in_cta};
  red.init();
  red2.init();
  // X_SMEM: this thread's slot for access i, [access][thread] 16-byte slots.
  // 16-bit rows address them by shared-window address (smem_addr), which
  // measured faster.  4- and 8-byte rows keep the generic pointer: the
  // address costs 3 registers, and fp32 12288's 384-thread CTAs then fit 2 an
  // SM instead of 3 and ran slower.
  constexpr bool kSmemAddr = X_SMEM && sizeof(T) == 2;
  const uint32_t xs_base = kSmemAddr ? smem_addr(dyn_smem) + threadIdx.x * 16 : 0;
  auto xs_slot = [&](int i) { return xs_base + uint32_t(i) * blockDim.x * 16; };
  Frag<T, VEC>* xs = reinterpret_cast<Frag<T, VEC>*>(dyn_smem) + threadIdx.x;
  Frag<W, VEC>* wcache = reinterpret_cast<Frag<W, VEC>*>(dyn_smem);
  Frag<W, VEC>* bcache = wcache + (wg ? NV * blockDim.x : 0);
  // STAGE: the next row's slots, [access][thread], after the cache.
  const uint32_t stage_base = STAGE ? smem_addr(bcache + (bg ? NV * blockDim.x : 0)) + threadIdx.x * 16 : 0;
  auto stage_slot = [&](int i) { return stage_base + uint32_t(i) * blockDim.x * 16; };
  // Which rows a staged cluster takes.  A static schedule (row group g takes
  // rows g, g + ngroups, ...) ends with its slowest cluster, and the clusters
  // run at different speeds.  With lay.row_ticket, a cluster's first three
  // rows are static and each later one is the next ticket of the counter:
  // thread 0 of the cluster's CTA 0 takes a ticket at the top of every row,
  // and the row's first reduction hands the one it took a row earlier to the
  // whole cluster (RowReducer's token), so the atomic's latency hides behind
  // a row.  A cluster stops at its first ticket past the rows; the ones it
  // took after it are past the rows too, so none in range is lost.  The
  // unstaged clusters keep the static schedule: the token's registers made
  // their 128-byte fp32 threads spill more.
  constexpr bool kTickets = CLUSTER && STAGE;
  const bool tickets = kTickets && lay.row_ticket != nullptr;  // uniform
  const bool ticket_taker = tickets && rc.crank == 0 && threadIdx.x == 0;
  // The token's two slots: after the stage slots, in the dynamic shared
  // memory (kTicketSlotBytes more), so that the static shared memory stays as
  // it was: 8 more bytes of it made every staged cluster far slower.
  int* const ticket_slots =
      reinterpret_cast<int*>(reinterpret_cast<unsigned char*>(bcache + (bg ? NV * blockDim.x : 0)) + NV * blockDim.x * 16);
  int token = group - ngroups;  // ticket_taker: the ticket taken a row earlier (at first: the third row's block, less 3 * ngroups)
  // The next two row blocks (of rpc rows), as steps from the one before.
  int step1 = ngroups, step2 = ngroups;
  // STAGE: start the copies of `row` into the stage slots, to be waited for
  // when its turn comes.
  auto stage_row = [&](int64_t row) {
    if (row < p.rows) {
      const T* r = xg + row * p.x_stride;
#pragma unroll
      for (int i = 0; i < NV; ++i)
        if (col(i) < n) cp_async16_to(stage_slot(i), r + col(i));
    }
    cp_async_commit();
  };
  // The first row's copies go out before the cache's, so that its DRAM
  // latency overlaps the cache's L2 reads; the cache is copied with cp.async
  // where its accesses are whole 16-byte units, so no thread stalls on it
  // before the first row.  The first row's wait (STAGE) or the one below
  // covers them.  Own slots only: no barrier.
  if constexpr (STAGE) stage_row(group * rpc + row_in_cta);
  if constexpr (CACHE_WB) {
    constexpr bool kCopyAsync = sizeof(Frag<W, VEC>) % 16 == 0;
    auto fill = [&](Frag<W, VEC>* slot, const W* src) {
      if constexpr (kCopyAsync) {
#pragma unroll
        for (int h = 0; h < int(sizeof(Frag<W, VEC>) / 16); ++h)
          cp_async16(reinterpret_cast<char*>(slot) + 16 * h, reinterpret_cast<const char*>(src) + 16 * h);
      } else {
        slot->load(src);
      }
    };
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t c = col(i);
      if (c >= n) continue;
      if (wg) fill(wcache + i * blockDim.x + threadIdx.x, wg + c);
      if (bg) fill(bcache + i * blockDim.x + threadIdx.x, bg + c);
    }
    if constexpr (kCopyAsync && !STAGE) cp_async_wait_all();
  }

  for (int64_t base = group * rpc; base < p.rows; base += int64_t(step1) * rpc, step1 = step2) {
    const int64_t row = base + row_in_cta;
    const bool live = row < p.rows;
    const T* xrow = xg + row * p.x_stride;  // addressed per row, offset per access
    Frag<T, VEC> xr[X_SMEM ? 1 : NV];
    if constexpr (STAGE) cp_async_wait_all();  // this row's stage slots have landed
    int ticket = 0;
    if (ticket_taker) ticket = int(take_ticket(lay.row_ticket));
    // The row's first reduction (carry() true once) hands on the token.
    bool carried = !kTickets;
    auto carry = [&]() -> int* {
      if (carried) return nullptr;
      carried = true;
      return ticket_slots;
    };
#pragma unroll kUnroll
    for (int i = 0; i < NV; ++i) {
      const int64_t c = col(i);
      if constexpr (X_SMEM) {
        if (live && c < n) {
          if constexpr (kSmemAddr) cp_async16_to(xs_slot(i), xrow + c);
          else cp_async16(xs + i * blockDim.x, xrow + c);
        }
      } else if constexpr (STAGE) {
        if (live && c < n) xr[i] = load_shared16<T, VEC>(stage_slot(i));
        else xr[i].zero();
      } else {
        // x, and below the weight and bias, are loaded evict_last in L2
        // (common.cuh's load_l1), which measured faster in the register rows
        // and fwd_rows_kernel.cuh.  cp.async copies with the same hint ran
        // far slower in the staged clusters and are left without it.
        if (live && c < n) load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(xr[i], xrow + c);
        else xr[i].zero();
      }
    }
    // LayerNorm's shift K, the row's first element, loaded with the row.
    // STAGE and X_SMEM kernels shift by K = 0 instead: the load of x[0] was a
    // global latency in every row and its register made the 16-bit STAGE
    // kernels spill; rows whose mean is far from 0 take the exact second
    // pass.  The register kernels keep K = x[0] (K = 0 there ran level or
    // slightly slower), as do the unshifted kernels' sums for the mean.
    A k0 = 0;
    if (!(kZeroK && kShifted) && !p.rms && live) k0 = to_acc(xrow[0]);
    // STAGE: the next row's copies start once this thread's partial sums
    // hold every value read from its stage slots (the empty asm consumes
    // them), so that no copy overwrites a slot before it is read.
    bool staged_next = !STAGE;
    auto stage_next = [&](A a, A b) {
      if constexpr (STAGE) {
        if (staged_next) return;
        if constexpr (sizeof(A) == 8) asm volatile("" ::"d"(a), "d"(b));
        else asm volatile("" ::"f"(a), "f"(b));
        stage_row(base + int64_t(step1) * rpc + row_in_cta);
        staged_next = true;
      }
    };
    if constexpr (X_SMEM) cp_async_wait_all();
    auto x = [&](int i) -> Frag<T, VEC> {
      if constexpr (kSmemAddr) return load_shared16<T, VEC>(xs_slot(i));
      else if constexpr (X_SMEM) return xs[i * blockDim.x];
      else return xr[i];
    };
    // Partials: one per access, added in order (NV independent chains).
    // A reduction of the sum of x - c (squared: of (x - c)^2) over the row,
    // divided by n; `centered` skips the padding (zeros, not x - c), which
    // RMSNorm's sum(x^2) (c = 0) needs no test for.
    auto row_mean_of = [&](auto centered, auto squared, A c) {
      A q[1] = {0};
#pragma unroll kUnroll
      for (int i = 0; i < NV; ++i) {
        const bool valid = col(i) < n;
        if (X_SMEM && (!live || !valid)) continue;  // unwritten slots
        if (centered() && !valid) continue;
        const Frag<T, VEC> xi = x(i);
        A qi = 0;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A d = centered() ? xi.get(k) - c : xi.get(k);
          qi += squared() ? d * d : d;
        }
        q[0] += qi;
      }
      stage_next(q[0], q[0]);
      red.reduce(q, token, carry());
      return q[0] * inv_n;
    };
    A mean = 0, var = 0;
    bool exact = true;  // var from a second pass, sum((x - center)^2)
    if (!p.rms) {
      if constexpr (kShifted) {
        // Sums of d = x - K and d^2, K the row's first element, in one
        // reduction: mean = K + sum(d) / n, var = sum(d^2) / n - (mean -
        // K)^2 (padding columns skipped, not counted as -K).
        A m[2] = {0, 0};
#pragma unroll kUnroll
        for (int i = 0; i < NV; ++i) {
          if (col(i) >= n) continue;
          if (X_SMEM && !live) continue;  // unwritten slots
          const Frag<T, VEC> xi = x(i);
          A a = 0, b = 0;
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const A d = xi.get(k) - k0;
            a += d;
            b += d * d;
          }
          m[0] += a;
          m[1] += b;
        }
        stage_next(m[0], m[1]);
        red2.reduce(m, token, carry());
        const A dm = m[0] * inv_n;
        mean = k0 + dm;
        var = m[1] * inv_n - dm * dm;
        // The sums are identical in every thread of a row; rows that share
        // a warp or a CTA must also agree before the shuffles or barrier.
        exact = !(dm * dm <= A(kMaxShiftRatio) * var && var < A(INFINITY));  // also NaN, overflow
        if (rpc > 1) exact = tpr > 32 ? __syncthreads_or(exact) : __any_sync(0xffffffffu, exact);
        // K = 0 leaves such a mean a few roundings off (n copies of 3.1 do
        // not sum to n * 3.1): 4-byte rows add the mean of x - mean (exact
        // for a constant row), 16-bit rows take the pass about snap_center.
        if (kZeroK && exact && sizeof(T) > 2) mean += row_mean_of(std::true_type{}, std::false_type{}, mean);
      } else {
        mean = k0 + row_mean_of(std::true_type{}, std::false_type{}, k0);
      }
    }
    if (exact) {  // uniform: see above
      if (p.rms) {
        var = row_mean_of(std::false_type{}, std::true_type{}, A(0));
      } else {
        A center = mean;
        if constexpr (kZeroK && kShifted && sizeof(T) == 2) center = snap_center<T>(mean);
        centered_stats(mean, var, center, row_mean_of(std::true_type{}, std::true_type{}, center));
      }
    }
    const A rstd = rsqrt_acc(var + A(p.eps));
    if (tickets) step2 = 3 * ngroups + token - int(base + step1);  // clusters: rpc = 1
    token = ticket;
    if (live && t == 0) {
      if (p.mean) static_cast<A*>(p.mean)[row] = mean;
      if (p.rstd) static_cast<A*>(p.rstd)[row] = rstd;
    }
    if (!live) continue;
    // xhat = x * rstd - mean * rstd: one FMA an element, not a subtraction
    // and a product (the loop is bound by issued instructions).  Rounding
    // mean * rstd adds half an fp32 ulp of |mean| * rstd to xhat: no more
    // than the rounding an fp32 x near the mean already carries.  A constant
    // row takes scale 0 (common.cuh's xhat_scale).
    const A scale = xhat_scale(p.rms, var, rstd);
    const A shift = -mean * scale;
    T* yrow = static_cast<T*>(p.y) + row * p.cols;
    // One loop per weight / bias combination (uniform for the launch), so no
    // access tests the pointers.
    auto write_row = [&](auto has_w, auto has_b) {
#pragma unroll kUnroll
      for (int i = 0; i < NV; ++i) {
        const int64_t c = col(i);
        if (c >= n) continue;
        Frag<W, VEC> w, b;
        if constexpr (CACHE_WB) {
          if constexpr (has_w()) w = wcache[i * blockDim.x + threadIdx.x];
          if constexpr (has_b()) b = bcache[i * blockDim.x + threadIdx.x];
        } else if constexpr (X_SMEM) {  // see kernel comment: weight and bias kept in L1
          if constexpr (has_w()) load_l1<L1Policy::kEvictLast, L2Policy::kEvictLast>(w, wg + c);
          if constexpr (has_b()) load_l1<L1Policy::kEvictLast, L2Policy::kEvictLast>(b, bg + c);
        } else {
          if constexpr (has_w()) load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(w, wg + c);
          if constexpr (has_b()) load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(b, bg + c);
        }
        const Frag<T, VEC> xi = x(i);
        A y[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A xh = xi.get(k) * scale + shift;
          y[k] = affine(has_w, has_b, xh, w, b, k);
        }
        store_vec(yrow + c, y);
      }
    };
    with_affine(wg, bg, write_row);
  }
  // A CTA with no row still has its cache copies in flight: none may land
  // after it exits.
  if constexpr (CACHE_WB) cp_async_wait_all();
  red.finish();  // also keeps red2's buffers alive for the other CTAs' stores
}

}  // namespace fln::cuda
