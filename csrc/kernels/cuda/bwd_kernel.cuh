// Backward kernels.
//
// norm_bwd_kernel: rows held on chip like the forward (x and dy are read
// once, dx written once).  The grid is persistent: each CTA (or cluster)
// walks many rows and keeps dweight / dbias partials for the columns it owns,
// in fp32 shared memory or, with the staged pipes, in registers; then it
// writes one partial row.  finalize_kernel adds the partial rows in a fixed
// order, so the weight gradients are bitwise reproducible; no atomics anywhere.
#pragma once
#include "common.cuh"
#include "fwd_kernel.cuh"
#include "../params.h"

namespace fln::cuda {

// dweight / dbias partial slots in shared memory: a pair of elements per
// slot when VEC is even (one 16-byte access for four fp32 accumulators).
template <typename A, int VEC>
struct alignas(sizeof(A) * (VEC % 2 == 0 ? 4 : 2)) PartialSlot {
  static constexpr int kElems = VEC % 2 == 0 ? 2 : 1;
  A dw[kElems], db[kElems];
};

// How the loads of a CTA's next rows overlap the current row's work.
enum class BwdPipe {
  // None: the row is loaded when its turn comes (other CTAs overlap it).
  kNone,
  // The next row is loaded into a second set of registers before the current
  // one is reduced and written.
  kPrefetch,
  // 16-byte accesses only: a ring of kBwdStages row buffers in shared memory,
  // filled with cp.async kBwdStages - 1 rows ahead, each thread its own slots
  // (no barrier).  The dweight / dbias partials stay in fp32 registers while
  // the CTA walks its rows and reach shared memory only to be merged.
  // kStaged copies the current row into registers for both passes;
  // kStagedReread reads it from its buffer in each pass, so nothing but the
  // partials and weights is live across the reduction (fewer registers).
  kStaged,
  kStagedReread,
  // kStaged over two rows at a time (a stage holds both, rows `step` apart):
  // one reduction, and in a cluster one exchange, carries both rows' sums,
  // so the per-reduction work (shuffles, barrier, exchange, pipe upkeep) is
  // paid once per 32 elements a thread (16-bit rows of 16 a thread).
  kStagedPair,
};
constexpr int kBwdStages = 3;

constexpr bool staged(BwdPipe p) {
  return p == BwdPipe::kStaged || p == BwdPipe::kStagedReread || p == BwdPipe::kStagedPair;
}
// Rows of a CTA's row group reduced together.
constexpr int bwd_rows_per_sum(BwdPipe p) { return p == BwdPipe::kStagedPair ? 2 : 1; }

// The backward of one CTA (or cluster) over its rows; the kernels below
// differ only in their register cap.
template <typename T, typename W, int VEC, int NV, BwdPipe PIPE>
__device__ __forceinline__ void norm_bwd_rows(BwdParams p, RowLayout lay, dacc_t<T>* part_w, dacc_t<T>* part_b) {
  using A = dacc_t<T>;
  using Slot = PartialSlot<A, VEC>;
  constexpr int kPer = Slot::kElems, kSlots = VEC / kPer;  // slots per access
  constexpr bool kStagedPipe = staged(PIPE), kRegAcc = kStagedPipe;
  constexpr int kRows = bwd_rows_per_sum(PIPE), kSums = 2 * kRows;
  // kNone runs 16-bit rows no other pipe fits, whose kernel spills at 16
  // elements a thread and 64 registers.  There, x and dy loads that skip L1
  // and evict-first dx stores leave L1 to the spills, which measured faster.
  // fp32 clusters, which do not spill, and the other pipes ran slower with
  // them.
  constexpr bool kStream = PIPE == BwdPipe::kNone && sizeof(T) == 2;
  static_assert(!kStagedPipe || VEC * sizeof(T) == 16, "cp.async stages move 16-byte accesses");
  // 16-bit x: xhat = x * rstd - mean * rstd and (x - mean) * c1 + c0 =
  // x * c1 + (c0 - mean * c1), one FMA an element each (as the forward's
  // xhat).  Rounding the row's constants costs about 2^-24 |mean| / std of
  // xhat, and a 16-bit x whose |mean| / std passes 2^11 has barely two values
  // a row.  fp32 x keeps the subtraction: an offset of 1e4 is exact there
  // (test_layer_norm_data_offset_by_1e4).  Not in the prefetch pipe's two
  // rows of 16 elements: its 96-register kernel then spilled in the row loop
  // and ran far slower.
  constexpr bool kFold = sizeof(T) == 2 && (kStagedPipe || NV * VEC <= 8);
  __shared__ ReduceSmem<A, kSums, 4> smem;
  // (dweight, dbias) partials, [NV * kSlots][CTA threads]: each thread owns
  // its slots (no barrier until the merge) and a warp's accesses are
  // consecutive.  Staged pipes: the stage buffers, [stage][row of the
  // iteration][access][x, dy][CTA threads]; the partials take the same
  // memory only for the final merge.
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  Slot* acc = reinterpret_cast<Slot*>(dyn_smem);
  Frag<T, VEC>* stages = reinterpret_cast<Frag<T, VEC>*>(dyn_smem);
  const int tpr = lay.tpr, rpc = blockDim.x / tpr, cta = blockDim.x;
  const int row_in_cta = threadIdx.x / tpr, lane = threadIdx.x % tpr;
  const int crank = cluster_rank_or_zero(lay.csize);
  const int stride = tpr * lay.csize;
  const int t = crank * tpr + lane;
  const int64_t group = blockIdx.x / lay.csize, ngroups = gridDim.x / lay.csize;
  const int64_t step = ngroups * rpc;  // rows between a CTA's consecutive row groups
  const int64_t iter_step = step * kRows;  // rows between the first rows of consecutive iterations
  const int64_t n = p.cols;
  const T* __restrict__ xg = static_cast<const T*>(p.x);
  const T* __restrict__ dyg = static_cast<const T*>(p.dy);
  const W* __restrict__ wg = static_cast<const W*>(p.w);
  const A* __restrict__ meang = static_cast<const A*>(p.mean);
  const A* __restrict__ rstdg = static_cast<const A*>(p.rstd);
  const A inv_n = A(1) / A(n);
  const bool want_dw = part_w != nullptr || part_b != nullptr;
  RowReducer<A, kSums, 4> red{smem, tpr, lay.csize, row_in_cta};
  red.init();
  // Stage s, row j of the iteration, access i, x (0) or dy (1).
  auto stage_slot = [&](int s, int j, int i, int which) {
    return (((s * kRows + j) * NV + i) * 2 + which) * cta + threadIdx.x;
  };
  auto col = [&](int i) { return int64_t(i * stride + t) * VEC; };

  // This thread's columns are the same in every row: its weights stay in
  // registers (1.0 without a weight, so no branch per element).
  Frag<W, VEC> w[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    if (wg && col(i) < n) w[i].load(wg + col(i));
    else w[i].one();
  }
  A rw[kRegAcc ? NV * VEC : 1], rb[kRegAcc ? NV * VEC : 1];
  if constexpr (kRegAcc) {
#pragma unroll
    for (int k = 0; k < NV * VEC; ++k) rw[k] = rb[k] = A(0);
  } else if (want_dw) {
#pragma unroll
    for (int e = 0; e < NV * kSlots; ++e) acc[e * cta + threadIdx.x] = Slot{};
  }

  // One row's inputs, in the storage dtype (zeros past the row or the rows).
  struct RowIn {
    Frag<T, VEC> x[NV], dy[NV];
    A mean, rstd;
  };
  auto load_stat = [&](int64_t row, A& mean, A& rstd) {
    mean = (row < p.rows && !p.rms) ? meang[row] : A(0);
    rstd = row < p.rows ? rstdg[row] : A(0);
  };
  auto load_row = [&](int64_t row, RowIn& r) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (row >= p.rows || col(i) >= n) {
        r.x[i].zero();
        r.dy[i].zero();
      } else {
        const int64_t xo = row * p.x_stride + col(i), dyo = row * p.dy_stride + col(i);
        // evict_last in L2, as the forward's x (fwd_kernel.cuh), which
        // measured faster here too.
        if constexpr (kStream) {
          load_l1<L1Policy::kNoAllocate, L2Policy::kEvictLast>(r.x[i], xg + xo);
          load_l1<L1Policy::kNoAllocate, L2Policy::kEvictLast>(r.dy[i], dyg + dyo);
        } else {
          load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(r.x[i], xg + xo);
          load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(r.dy[i], dyg + dyo);
        }
      }
    }
    load_stat(row, r.mean, r.rstd);
  };
  // Staged: start the copies of the iteration at `base` (kRows rows) into stage s.
  auto issue = [&](int64_t base, int s) {
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const int64_t row = base + row_in_cta + j * step;
#pragma unroll
      for (int i = 0; i < NV; ++i)
        if (row < p.rows && col(i) < n) {
          cp_async16(&stages[stage_slot(s, j, i, 0)], xg + row * p.x_stride + col(i));
          cp_async16(&stages[stage_slot(s, j, i, 1)], dyg + row * p.dy_stride + col(i));
        }
    }
    cp_async_commit();  // one group per iteration, empty or not, so the count stays fixed
  };
  // Staged: the statistics of an iteration's rows.
  struct Stats {
    A mean[kRows], rstd[kRows];
  };
  auto load_stats = [&](int64_t base, Stats& st) {
#pragma unroll
    for (int j = 0; j < kRows; ++j) load_stat(base + row_in_cta + j * step, st.mean[j], st.rstd[j]);
  };

  RowIn cur, next;
  // Staged: the statistics of the next iteration and of the one after, loaded
  // as far ahead as the rows themselves.  One row ahead, their latency showed
  // whenever a row took less time than a load.
  Stats st_next{}, st_ahead{};
  Frag<T, VEC> xs[kStagedPipe && PIPE != BwdPipe::kStagedReread ? kRows : 1][NV];
  Frag<T, VEC> dys[kStagedPipe && PIPE != BwdPipe::kStagedReread ? kRows : 1][NV];
  int stage = 0;  // staged: the buffer of the current iteration
  if constexpr (PIPE == BwdPipe::kPrefetch) load_row(group * rpc + row_in_cta, next);
  if constexpr (kStagedPipe) {
#pragma unroll
    for (int s = 0; s < kBwdStages - 1; ++s) issue(group * rpc + s * iter_step, s);
    load_stats(group * rpc, st_next);
    load_stats(group * rpc + iter_step, st_ahead);
  }

  for (int64_t base = group * rpc; base < p.rows; base += iter_step) {
    A mean[kRows], rstd[kRows];
    if constexpr (PIPE == BwdPipe::kPrefetch) {
      cur = next;
      load_row(base + step + row_in_cta, next);
    } else if constexpr (kStagedPipe) {
      // Into the buffer read last.
      issue(base + (kBwdStages - 1) * iter_step, stage == 0 ? kBwdStages - 1 : stage - 1);
      cp_async_wait<kBwdStages - 1>();  // this iteration's copies have landed
      const Stats st = st_next;
      st_next = st_ahead;
      load_stats(base + 2 * iter_step, st_ahead);  // the statistics, two iterations ahead
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        mean[j] = st.mean[j];
        rstd[j] = st.rstd[j];
      }
      if constexpr (PIPE != BwdPipe::kStagedReread)
#pragma unroll
        for (int j = 0; j < kRows; ++j)
#pragma unroll
          for (int i = 0; i < NV; ++i) {
            xs[j][i] = stages[stage_slot(stage, j, i, 0)];  // stale past the row: skipped below
            dys[j][i] = stages[stage_slot(stage, j, i, 1)];
          }
    } else {
      load_row(base + row_in_cta, cur);
    }
    if constexpr (!kStagedPipe) {
      mean[0] = cur.mean;
      rstd[0] = cur.rstd;
    }
    auto x = [&](int j, int i) -> Frag<T, VEC> {
      if constexpr (PIPE == BwdPipe::kStagedReread) return stages[stage_slot(stage, j, i, 0)];
      else if constexpr (kStagedPipe) return xs[j][i];
      else return cur.x[i];
    };
    auto dy = [&](int j, int i) -> Frag<T, VEC> {
      if constexpr (PIPE == BwdPipe::kStagedReread) return stages[stage_slot(stage, j, i, 1)];
      else if constexpr (kStagedPipe) return dys[j][i];
      else return cur.dy[i];
    };
    A s[kSums] = {};  // per row j: sum(g * xhat), sum(g) with g = dy * w
#pragma unroll
    for (int j = 0; j < kRows; ++j) {
      const bool live = base + row_in_cta + j * step < p.rows;
      const A shift = -mean[j] * rstd[j];
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (kStagedPipe && (!live || col(i) >= n)) continue;  // stale buffer slots
        const Frag<T, VEC> xi = x(j, i), dyi = dy(j, i);
        A s0 = 0, s1 = 0;
#pragma unroll
        for (int q = 0; q < kSlots; ++q) {
          Slot a{};
          if (!kRegAcc && want_dw) a = acc[(i * kSlots + q) * cta + threadIdx.x];
#pragma unroll
          for (int e = 0; e < kPer; ++e) {
            const int k = q * kPer + e;
            const A xh = kFold ? xi.get(k) * rstd[j] + shift : (xi.get(k) - mean[j]) * rstd[j];
            const A d = dyi.get(k), g = d * w[i].get(k);
            if constexpr (kRegAcc) {
              rw[i * VEC + k] += d * xh;
              rb[i * VEC + k] += d;
            } else {
              a.dw[e] += d * xh;
              a.db[e] += d;
            }
            s0 += g * xh;
            s1 += g;
          }
          if (!kRegAcc && want_dw) acc[(i * kSlots + q) * cta + threadIdx.x] = a;
        }
        s[2 * j] += s0;
        s[2 * j + 1] += s1;
      }
    }
    if (p.dx != nullptr) {  // uniform: else no reduction is needed
      red.reduce(s);
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        const int64_t row = base + row_in_cta + j * step;
        // dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        //    = g * rstd - ((x - mean) * c1 + c0),  c1 = rstd^2 mean(g xhat), c0 = rstd mean(g)
        const A r = rstd[j], c1 = s[2 * j] * inv_n * r * r, c0 = p.rms ? A(0) : s[2 * j + 1] * inv_n * r;
        const A c0x = c0 - mean[j] * c1;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          if (row >= p.rows || col(i) >= n) continue;
          const Frag<T, VEC> xi = x(j, i), dyi = dy(j, i);
          A dx[VEC];
#pragma unroll
          for (int k = 0; k < VEC; ++k) {
            const A t0 = kFold ? xi.get(k) * c1 + c0x : (xi.get(k) - mean[j]) * c1 + c0;
            dx[k] = dyi.get(k) * w[i].get(k) * r - t0;
          }
          store_vec<kStream>(static_cast<T*>(p.dx) + row * n + col(i), dx);
        }
      }
    }
    if constexpr (kStagedPipe) stage = stage + 1 == kBwdStages ? 0 : stage + 1;
  }
  red.finish();
  if constexpr (kStagedPipe) cp_async_wait<0>();  // none left: every copy was for a row visited
  if (!want_dw) return;
  if constexpr (kRegAcc) {
    if (rpc == 1) {  // one row per CTA: the registers are the partial row
      store_partial_row<NV, VEC>(rw, rb, part_w, part_b, group, n, col);
      return;
    }
    __syncthreads();  // the partial slots overlap the stage buffers, which every thread is done with
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        Slot a;
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          a.dw[e] = rw[i * VEC + j * kPer + e];
          a.db[e] = rb[i * VEC + j * kPer + e];
        }
        acc[(i * kSlots + j) * cta + threadIdx.x] = a;  // own slots: the merge below reads them
      }
  }

  // Merge the rows of this CTA in row order, then write partial row `group`.
  if (rpc > 1) {
    __syncthreads();
    if (row_in_cta != 0) return;
  }
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int64_t c = col(i);
    if (c >= n) continue;
    A dw[VEC], db[VEC];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      Slot a = acc[(i * kSlots + j) * cta + lane];
      for (int r = 1; r < rpc; ++r) {
        const Slot o = acc[(i * kSlots + j) * cta + r * tpr + lane];
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          a.dw[e] += o.dw[e];
          a.db[e] += o.db[e];
        }
      }
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        dw[j * kPer + e] = a.dw[e];
        db[j * kPer + e] = a.db[e];
      }
    }
    if (part_w) store_vec(part_w + group * n + c, dw);
    if (part_b) store_vec(part_b + group * n + c, db);
  }
}

// Register caps (at most 64K / REGS threads per SM): 64, two 512-thread CTAs
// per SM, through launch bounds; larger caps through __maxnreg__.  Each form
// measured faster where it is used: fp32 under kNone ran slower with
// __maxnreg__(64) than with the launch bounds, bf16 under kStaged slower with
// launch bounds (512, 1) than with __maxnreg__(128).
template <typename T, typename W, int VEC, int NV, BwdPipe PIPE>
__global__ void __launch_bounds__(kMaxCtaThreads, 2)
norm_bwd_kernel(BwdParams p, RowLayout lay, dacc_t<T>* part_w, dacc_t<T>* part_b) {
  norm_bwd_rows<T, W, VEC, NV, PIPE>(p, lay, part_w, part_b);
}

template <typename T, typename W, int VEC, int NV, BwdPipe PIPE, int REGS>
__global__ void FLN_MAX_REGS(REGS)
norm_bwd_kernel_capped(BwdParams p, RowLayout lay, dacc_t<T>* part_w, dacc_t<T>* part_b) {
  norm_bwd_rows<T, W, VEC, NV, PIPE>(p, lay, part_w, part_b);
}

// out[c] = sum over q of part[q * n + c], in a fixed order, so the weight
// gradients are bitwise reproducible.  A CTA owns 32 * VEC columns (VEC
// consecutive columns a lane, one 16-byte load where n allows); its
// kFinWarps warps split the partial rows, warp w taking rows w, w +
// kFinWarps, ... in ascending order with kFinUnroll loads in flight, and the
// warps' sums are then added in warp order.  blockIdx.y picks dweight (0) or
// dbias (1), so one launch finalizes both.  With nparts == 0 it writes zeros.
// It may be launched as a programmatic dependent of the kernel that wrote
// the partials (see launch.cuh): it waits for that grid before reading.
constexpr int kFinWarps = 32, kFinUnroll = 4;

template <typename W, typename A, int VEC>
__global__ void __launch_bounds__(kFinWarps * 32)
finalize_kernel(const A* __restrict__ part_w, const A* __restrict__ part_b, int64_t nparts, int64_t n,
                W* __restrict__ dw, W* __restrict__ db) {
  __shared__ __align__(16) A s[kFinWarps][32 * VEC];
  wait_for_primary_grid();
  const A* part = blockIdx.y == 0 ? part_w : part_b;
  W* out = blockIdx.y == 0 ? dw : db;
  if (out == nullptr) return;  // uniform per CTA
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c0 = int64_t(blockIdx.x) * 32 * VEC, c = c0 + lane * VEC;
  A acc[VEC] = {};
  auto add = [&](const A (&v)[VEC]) {
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] += v[k];
  };
  if (c < n) {
    int64_t q = warp;
    for (; q + (kFinUnroll - 1) * kFinWarps < nparts; q += kFinUnroll * kFinWarps) {
      A v[kFinUnroll][VEC];
#pragma unroll
      for (int u = 0; u < kFinUnroll; ++u) load_vec(part + (q + u * kFinWarps) * n + c, v[u]);
#pragma unroll
      for (int u = 0; u < kFinUnroll; ++u) add(v[u]);
    }
    for (; q < nparts; q += kFinWarps) {
      A v[VEC];
      load_vec(part + q * n + c, v);
      add(v);
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) s[warp][lane * VEC + k] = acc[k];
  __syncthreads();
  const int64_t col = c0 + threadIdx.x;  // one thread per column for the last sum
  if (threadIdx.x >= 32 * VEC || col >= n) return;
  A total = 0;
  for (int w = 0; w < kFinWarps; ++w) total += s[w][threadIdx.x];
  out[col] = from_acc<W>(total);
}

}  // namespace fln::cuda
