// Backward kernels.
//
// norm_bwd_kernel: rows held in registers like the forward (x and dy are
// read once, dx written once).  The grid is persistent: each CTA (or cluster)
// walks many rows and keeps its dweight / dbias partials for the columns it
// owns in fp32 shared memory (registers would cap the bytes in flight), then
// writes one partial row.  finalize_kernel adds
// the partial rows in a fixed order, so the weight gradients are bitwise
// reproducible; no atomics anywhere.
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

// PREFETCH: the loads of the CTA's next row are issued before the current
// row is reduced and written, into a second set of registers, so a thread has
// two rows in flight; the register cap is relaxed to 128 to hold them (one
// 512-thread CTA per SM, or more of smaller CTAs).
template <typename T, typename W, int VEC, int NV, bool PREFETCH = false>
__global__ void __launch_bounds__(kMaxCtaThreads, PREFETCH ? 1 : 2)
norm_bwd_kernel(BwdParams p, RowLayout lay, dacc_t<T>* part_w, dacc_t<T>* part_b) {
  using A = dacc_t<T>;
  using Slot = PartialSlot<A, VEC>;
  constexpr int kPer = Slot::kElems, kSlots = VEC / kPer;  // slots per access
  __shared__ ReduceSmem<A, 2> smem;
  // (dweight, dbias) partials, [NV * kSlots][CTA threads]: each thread owns
  // its slots (no barrier until the merge) and a warp's accesses are consecutive.
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  Slot* acc = reinterpret_cast<Slot*>(dyn_smem);
  const int tpr = lay.tpr, rpc = blockDim.x / tpr, cta = blockDim.x;
  const int row_in_cta = threadIdx.x / tpr, lane = threadIdx.x % tpr;
  const int crank = cluster_rank_or_zero(lay.csize);
  const int stride = tpr * lay.csize;
  const int t = crank * tpr + lane;
  const int64_t group = blockIdx.x / lay.csize, ngroups = gridDim.x / lay.csize;
  const int64_t n = p.cols;
  const T* __restrict__ xg = static_cast<const T*>(p.x);
  const T* __restrict__ dyg = static_cast<const T*>(p.dy);
  const W* __restrict__ wg = static_cast<const W*>(p.w);
  const A inv_n = A(1) / A(n);
  const bool want_dw = part_w != nullptr || part_b != nullptr;
  RowReducer<A, 2> red{smem, tpr, lay.csize, row_in_cta};

  // This thread's columns are the same in every row: its weights stay in
  // registers (1.0 without a weight, so no branch per element).
  Frag<W, VEC> w[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int64_t c = int64_t(i * stride + t) * VEC;
    if (wg && c < n) w[i].load(wg + c);
    else w[i].one();
  }
  if (want_dw)
#pragma unroll
    for (int e = 0; e < NV * kSlots; ++e) acc[e * cta + threadIdx.x] = Slot{};

  // One row's inputs, in the storage dtype (zeros past the row or the rows).
  struct RowIn {
    Frag<T, VEC> x[NV], dy[NV];
    A mean, rstd;
  };
  auto load_row = [&](int64_t row, RowIn& r) {
    const bool live = row < p.rows;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t c = int64_t(i * stride + t) * VEC;
      if (!live || c >= n) {
        r.x[i].zero();
        r.dy[i].zero();
      } else {
        r.x[i].load(xg + row * p.x_stride + c);
        r.dy[i].load(dyg + row * p.dy_stride + c);
      }
    }
    r.mean = (live && !p.rms) ? static_cast<const A*>(p.mean)[row] : A(0);
    r.rstd = live ? static_cast<const A*>(p.rstd)[row] : A(0);
  };
  RowIn cur, next;
  if constexpr (PREFETCH) load_row(group * rpc + row_in_cta, next);

  for (int64_t base = group * rpc; base < p.rows; base += ngroups * rpc) {
    const int64_t row = base + row_in_cta;
    const bool live = row < p.rows;
    if constexpr (PREFETCH) {
      cur = next;
      load_row(base + ngroups * rpc + row_in_cta, next);
    } else {
      load_row(row, cur);
    }
    const Frag<T, VEC>* x = cur.x;
    const Frag<T, VEC>* dy = cur.dy;
    const A mean = cur.mean, rstd = cur.rstd;
    A s[2] = {0, 0};  // sum(g * xhat), sum(g) with g = dy * w
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      A s0 = 0, s1 = 0;
#pragma unroll
      for (int j = 0; j < kSlots; ++j) {
        Slot a{};
        if (want_dw) a = acc[(i * kSlots + j) * cta + threadIdx.x];
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          const int k = j * kPer + e;
          const A xh = (x[i].get(k) - mean) * rstd, d = dy[i].get(k), g = d * w[i].get(k);
          a.dw[e] += d * xh;
          a.db[e] += d;
          s0 += g * xh;
          s1 += g;
        }
        if (want_dw) acc[(i * kSlots + j) * cta + threadIdx.x] = a;
      }
      s[0] += s0;
      s[1] += s1;
    }
    if (p.dx == nullptr) continue;  // uniform: no reduction needed
    red.sum(s);
    if (!live) continue;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
    //    = g * rstd - ((x - mean) * c1 + c0),  c1 = rstd^2 mean(g xhat), c0 = rstd mean(g)
    const A c1 = s[0] * inv_n * rstd * rstd, c0 = p.rms ? A(0) : s[1] * inv_n * rstd;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t c = int64_t(i * stride + t) * VEC;
      if (c >= n) continue;
      A dx[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const A t0 = (x[i].get(k) - mean) * c1 + c0;
        dx[k] = dy[i].get(k) * w[i].get(k) * rstd - t0;
      }
      store_vec(static_cast<T*>(p.dx) + row * n + c, dx);
    }
  }
  red.finish();
  if (!want_dw) return;

  // Merge the rows of this CTA in row order, then write partial row `group`.
  if (rpc > 1) {
    __syncthreads();
    if (row_in_cta != 0) return;
  }
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int64_t c = int64_t(i * stride + t) * VEC;
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

// out[c] = sum over p of part[p * n + c], p ascending, for 32 columns per CTA:
// 32 x 32 threads, each summing a fixed strided subset of partial rows, then
// the 32 subsets added in order.  blockIdx.y picks dweight (0) or dbias (1),
// so one launch finalizes both.  With nparts == 0 it writes zeros.
template <typename W, typename A>
__global__ void __launch_bounds__(1024)
finalize_kernel(const A* __restrict__ part_w, const A* __restrict__ part_b, int64_t nparts, int64_t n,
                W* __restrict__ dw, W* __restrict__ db) {
  __shared__ A s[32][33];
  const A* part = blockIdx.y == 0 ? part_w : part_b;
  W* out = blockIdx.y == 0 ? dw : db;
  if (out == nullptr) return;  // uniform per CTA
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  A acc = 0;
  if (c < n)
    for (int64_t q = threadIdx.y; q < nparts; q += 32) acc += part[q * n + c];
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= n) return;
  A total = 0;
  for (int k = 0; k < 32; ++k) total += s[k][threadIdx.x];
  out[c] = from_acc<W>(total);
}

}  // namespace fln::cuda
