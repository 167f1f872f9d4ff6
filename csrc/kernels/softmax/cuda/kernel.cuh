// The softmax kernels (params.h), forward and backward, with three row
// strategies chosen by plan.h:
//   kRow      a team of threads_per_row threads of one CTA holds a row in
//             registers (several rows a CTA for short rows): x is read once;
//   kCluster  the same team in each CTA of a thread-block cluster (sm_90),
//             the row's statistics exchanged through distributed shared memory;
//   loop      (separate kernels) one CTA a row, two passes over global memory.
// A row's columns are spread over its threads in accesses of VEC elements:
// access i of thread t holds columns (i * row_threads + t) * VEC ..., so a
// warp's accesses are contiguous.  The row kernels load with an L2
// evict-last hint, as the norms' register kernels do (worth 1-4 points of
// copy bandwidth there).  Causal rows keep columns [0, kept): the masked ones
// are never used, and written as 0 (log-softmax: -inf; dx: 0).  No access
// starts past kept, but the 16-byte access that straddles it loads up to
// VEC - 1 masked elements (inside the row: cols is a multiple of VEC there),
// which every use tests away (col + k < kept).
//
// The forward is one pass over the registers: each thread takes the max m of
// its z = scale * x and s = sum exp(z - m); the row's (max, sum) pairs are
// merged (online softmax), and y = exp(z - M) / S.  A row of -inf has
// M = -inf and S = 0, so y is NaN, as torch's.
#pragma once
#include <cooperative_groups.h>

#include <cmath>

#include "../../cuda/common.cuh"
#include "../params.h"
#include "plan.h"

namespace fln::cuda::softmax_kernels {

enum class Mode { kRow, kCluster };

constexpr int kMaxThreads = 512;  // a CTA; plan.h keeps to it
constexpr int kMaxCluster = 16;
// Register caps: 64 lets two CTAs of 512 threads share an SM, so one's loads
// overlap the other's reduction (at 96 a CTA of 512 threads had an SM to
// itself, and the bf16 forward ran far slower).  The forward takes each
// exponential twice rather than hold them.  The log-softmax backward of
// 16-byte accesses spills at 64 and takes 128; double 96.  The loop kernels
// stream, two CTAs an SM.
template <typename T>
constexpr int row_regs(bool log_backward) {
  return log_backward && sizeof(T) <= 4 ? 128 : sizeof(T) == 8 ? 96 : 64;
}
constexpr int kLoopRegs = 64;

struct Layout {
  int threads_per_row = 1;  // of one CTA: a power of two up to 32, or whole warps (then one row a CTA)
  int cluster = 1;          // kCluster: CTAs of a cluster on a row
};

__device__ __forceinline__ float exp_acc(float v) { return exp2f(v * 1.4426950408889634f); }
__device__ __forceinline__ double exp_acc(double v) { return exp(v); }
__device__ __forceinline__ float max_acc(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_acc(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float fma_acc(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_acc(double a, double b, double c) { return fma(a, b, c); }
// A product rounded on its own: never contracted with an addition into an FMA.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
template <typename A>
__device__ __forceinline__ A neg_inf() {
  return A(-INFINITY);
}
// The forward's exponential of z - m (<= 0): fp32 as ex2.approx.ftz of
// (z - m) log2(e), one FMUL and one MUFU (results under 2^-126 flush to 0,
// which the float sum cannot see); double as exp.  z - m is formed first, in
// one FMA from x: folding log2(e) into the scale would overflow for
// |scale x| > 2.4e38 and make log-softmax's z - lse lose digits.
__device__ __forceinline__ float fwd_exp(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v * 1.4426950408889634f));
  return r;
}
__device__ __forceinline__ double fwd_exp(double v) { return exp(v); }
__device__ __forceinline__ float log_acc(float v) { return logf(v); }
__device__ __forceinline__ double log_acc(double v) { return log(v); }

// A slice's (max, sum of exp(z - max)) as RowReducer's op: merged
// pairwise, the sums rescaled to the larger max.  Empty slices are (-inf, 0):
// their exponent offset is taken as 0 so no -inf - -inf is formed.  Both
// products are rounded before the sum, so merge(a, b) and merge(b, a) give
// the same bits (contracted, a * b + c * d is fma(a, b, c * d) one way and
// fma(c, d, a * b) the other, which may differ in the last bit).
struct MaxSumOp {
  template <typename A>
  __device__ __forceinline__ static void merge(A (&a)[2], const A (&b)[2]) {
    const A mx = max_acc(a[0], b[0]);
    const A base = mx == neg_inf<A>() ? A(0) : mx;
    a[1] = mul_rn(a[1], fwd_exp(a[0] - base)) + mul_rn(b[1], fwd_exp(b[0] - base));
    a[0] = mx;
  }
  template <typename A>
  __device__ __forceinline__ static A identity(int k) {
    return k == 0 ? neg_inf<A>() : A(0);
  }
};
template <typename A, bool kCluster>
using MaxSumReducer = RowReducer<A, 2, 2, kCluster, MaxSumOp>;

// A thread's place on its rows (kRow, kCluster).
struct Place {
  int64_t first_row, row_step;  // the CTA's (cluster's) rows: first_row + row_in_cta, + row_step, ...
  int t, row_threads;           // this thread among the row's threads, and how many
  int row_in_cta;
};

template <Mode M>
__device__ __forceinline__ Place place(const Layout& lay) {
  // A team smaller than its CTA is a power of two of lanes (plan.h), and only
  // kCluster spreads a row over CTAs, so shifts place a thread: no division.
  Place pl;
  const int tpr = lay.threads_per_row;
  const bool one_row = tpr == int(blockDim.x);
  const int log_tpr = __ffs(tpr) - 1;
  const int rows_per_cta = one_row ? 1 : int(blockDim.x) >> log_tpr;
  int rank = 0, ctas = 1;
  int64_t group = blockIdx.x, groups = gridDim.x;
  if constexpr (M == Mode::kCluster) {
    ctas = lay.cluster;
    rank = cluster_rank_or_zero(lay.cluster);
    group = int(blockIdx.x) / lay.cluster;
    groups = int(gridDim.x) / lay.cluster;
  }
  pl.row_in_cta = one_row ? 0 : int(threadIdx.x) >> log_tpr;
  pl.t = rank * tpr + (one_row ? int(threadIdx.x) : int(threadIdx.x) & (tpr - 1));
  pl.row_threads = tpr * ctas;
  pl.first_row = group * rows_per_cta;
  pl.row_step = groups * rows_per_cta;
  return pl;
}

// ---------------------------------------------------------------------------
// Forward, a row in registers.
// ---------------------------------------------------------------------------
template <typename T, int VEC, int NV, Mode M, bool kLog, bool kCausal>
__global__ void FLN_MAX_REGS(row_regs<T>(false)) softmax_fwd_kernel(const SoftmaxParams p, const Layout lay) {
  using A = dacc_t<T>;
  using D = device_t<T>;
  constexpr bool kCl = M == Mode::kCluster;
  __shared__ ReduceSmem<A, 2> sh;
  const Place pl = place<M>(lay);
  MaxSumReducer<A, kCl> red{sh, lay.threads_per_row, lay.cluster, pl.row_in_cta};
  red.init();
  // Columns are ints: the plans give these kernels rows of at most 2^18
  // elements (plan.h), and 64-bit column arithmetic cost instructions per access.
  const int n = int(p.cols);
  const int step = pl.row_threads * VEC;  // columns from one of a thread's accesses to the next
  const int first_col = pl.t * VEC;
  auto col = [&](int i) { return i * step + first_col; };
  const A scale = A(p.scale);
  // A row's kept columns: every column without the mask (the launch picks kCausal = p.causal).
  auto kept_of = [&](int64_t row) { return row >= p.rows ? 0 : kCausal ? int(softmax_kept(p, row)) : n; };
  // An access at or past kept is never read, so it is left unset.
  auto load_row = [&](int64_t row, Frag<D, VEC>(&xf)[NV]) {
    const int kept = kept_of(row);
    const D* x = static_cast<const D*>(p.in) + row * p.in_stride + first_col;  // access i is i * step on
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (col(i) < kept) load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(xf[i], x + i * step);
  };
  // kCluster (a persistent grid) loads the next row before this one is reduced
  // across the cluster and written, so its loads stay in flight through the
  // exchange; within 64 registers, so two CTAs still share an SM.
  Frag<D, VEC> next[NV];
  if constexpr (kCl) load_row(pl.first_row + pl.row_in_cta, next);
  // The loop bound is uniform over the CTA (cluster), so every thread reaches every barrier.
  for (int64_t first = pl.first_row; first < p.rows; first += pl.row_step) {
    const int64_t row = first + pl.row_in_cta;
    const bool live = row < p.rows;
    const int kept = kept_of(row);
    Frag<D, VEC> xf[NV];
    if constexpr (kCl) {
#pragma unroll
      for (int i = 0; i < NV; ++i) xf[i] = next[i];
      load_row(row + pl.row_step, next);
    } else {
      load_row(row, xf);
    }
    // f(k) for each kept element of access i.  Without the mask an access is
    // whole or past the row (cols is a multiple of VEC), so only causal rows
    // test elements (the forward is bound by its instructions in 16-bit).
    auto each_kept = [&](int i, auto&& f) {
      if constexpr (kCausal) {
        const int left = kept - col(i);
        const int valid = left >= VEC ? VEC : left < 0 ? 0 : left;
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          if (k < valid) f(k);
      } else if (col(i) < kept) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) f(k);
      }
    };
    // Without the mask, a thread whose last access is in the row (every
    // thread, where the team's accesses cover the row exactly) holds only
    // kept elements: that case is compiled apart, with no test an access.
    // Not in kCluster: there the two copies spilled (8 bytes in bf16).
    const bool whole = !kCausal && !kCl && col(NV - 1) < kept;
    A r[2];  // the thread's, then the row's (M, S)
    auto thread_stats = [&](auto whole_tag) {
      auto each = [&](int i, auto&& f) {
        if constexpr (decltype(whole_tag)::value) {
#pragma unroll
          for (int k = 0; k < VEC; ++k) f(k);
        } else {
          each_kept(i, f);
        }
      };
      A m = neg_inf<A>();
#pragma unroll
      for (int i = 0; i < NV; ++i) each(i, [&](int k) { m = max_acc(m, A(xf[i].get(k)) * scale); });
      const A base = m == neg_inf<A>() ? A(0) : m;
      A s = A(0);
#pragma unroll
      for (int i = 0; i < NV; ++i) each(i, [&](int k) { s += fwd_exp(fma_acc(A(xf[i].get(k)), scale, -base)); });
      r[0] = m;
      r[1] = s;
    };
    if (whole) thread_stats(std::true_type{});
    else thread_stats(std::false_type{});
    red.reduce(r);
    if (!live) continue;
    // softmax: exp(z - M) / S, the exponential taken again rather than held
    // (held, a thread's fp32 copies doubled its registers and halved the CTAs
    // an SM); log-softmax: z - (M + log S).  Masked columns: 0 (log: -inf).
    const A row_base = r[0] == neg_inf<A>() ? A(0) : r[0];  // a row of -inf: S = 0, so y is NaN
    const A inv = A(1) / r[1];
    const A log_s = kLog ? log_acc(r[1]) : A(0);
    D* y = static_cast<D*>(p.out) + row * p.out_stride + first_col;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (col(i) >= n) continue;
      A o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k) o[k] = kLog ? neg_inf<A>() : A(0);
      auto out = [&](int k) {
        const A v = A(xf[i].get(k));
        const A d = fma_acc(v, scale, -row_base);  // z - M
        o[k] = kLog ? d - log_s : fwd_exp(d) * inv;
      };
      // Without the mask a live row keeps all n columns: the test above suffices.
      if constexpr (kCausal) {
        each_kept(i, out);
      } else {
#pragma unroll
        for (int k = 0; k < VEC; ++k) out(k);
      }
      store_vec(y + i * step, o);
    }
  }
  red.finish();
}

// The backward's per-element pieces: the row sum's term, and dx from it.
template <bool kLog, typename A>
__device__ __forceinline__ A bwd_term(A y, A dy) {
  return kLog ? dy : dy * y;
}
template <bool kLog, typename A>
__device__ __forceinline__ A bwd_dx(A y, A dy, A sum, A scale) {
  return kLog ? scale * (dy - exp_acc(y) * sum) : scale * y * (dy - sum);
}

// ---------------------------------------------------------------------------
// Backward, a row of y and dy in registers: one pass.
// ---------------------------------------------------------------------------
template <typename T, int VEC, int NV, Mode M, bool kLog>
__global__ void FLN_MAX_REGS(row_regs<T>(kLog)) softmax_bwd_kernel(const SoftmaxParams p, const Layout lay) {
  using A = dacc_t<T>;
  using D = device_t<T>;
  constexpr bool kCl = M == Mode::kCluster;
  __shared__ ReduceSmem<A, 1> sh;
  const Place pl = place<M>(lay);
  RowReducer<A, 1, 2, kCl> red{sh, lay.threads_per_row, lay.cluster, pl.row_in_cta};
  red.init();
  const int64_t n = p.cols;
  auto col = [&](int i) { return (int64_t(i) * pl.row_threads + pl.t) * VEC; };
  const A scale = A(p.scale);
  for (int64_t first = pl.first_row; first < p.rows; first += pl.row_step) {
    const int64_t row = first + pl.row_in_cta;
    const bool live = row < p.rows;
    const int64_t kept = live ? softmax_kept(p, row) : 0;
    const D* y = static_cast<const D*>(p.in) + row * p.in_stride;
    const D* dy = static_cast<const D*>(p.grad) + row * p.grad_stride;
    Frag<D, VEC> yf[NV], gf[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (col(i) < kept) {
        load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(yf[i], y + col(i));
        load_l1<L1Policy::kNormal, L2Policy::kEvictLast>(gf[i], dy + col(i));
      } else {
        yf[i].zero();
        gf[i].zero();
      }
    }
    A s[1] = {A(0)};
#pragma unroll
    for (int i = 0; i < NV; ++i)
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        if (col(i) + k < kept) s[0] += bwd_term<kLog>(A(yf[i].get(k)), A(gf[i].get(k)));
    red.reduce(s);
    if (!live) continue;
    D* dx = static_cast<D*>(p.out) + row * p.out_stride;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t c = col(i);
      if (c >= n) continue;
      A o[VEC];
#pragma unroll
      for (int k = 0; k < VEC; ++k)
        o[k] = c + k < kept ? bwd_dx<kLog>(A(yf[i].get(k)), A(gf[i].get(k)), s[0], scale) : A(0);
      store_vec(dx + c, o);
    }
  }
  red.finish();
}

// ---------------------------------------------------------------------------
// Rows past a cluster: one CTA of kLoopThreads a row, grid-stride over rows.
// Pass 1 reduces the row chunk by chunk (NV accesses a thread, loads marked
// evict-last in L2); pass 2 reads it again (evict-first) and writes.
// ---------------------------------------------------------------------------
template <typename T, int VEC, int NV, bool kLog>
__global__ void FLN_MAX_REGS(kLoopRegs) softmax_fwd_loop_kernel(const SoftmaxParams p) {
  using A = dacc_t<T>;
  using D = device_t<T>;
  __shared__ ReduceSmem<A, 2> sh;
  MaxSumReducer<A, false> red{sh, int(blockDim.x), 1, 0};
  const int64_t n = p.cols, chunk = int64_t(blockDim.x) * NV * VEC;
  const A scale = A(p.scale);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t kept = softmax_kept(p, row);
    const D* x = static_cast<const D*>(p.in) + row * p.in_stride;
    A r[2] = {neg_inf<A>(), A(0)};  // the row's (M, S), chunk by chunk
    for (int64_t c0 = 0; c0 < kept; c0 += chunk) {
      auto col = [&](int i) { return c0 + (int64_t(i) * blockDim.x + threadIdx.x) * VEC; };
      Frag<D, VEC> xf[NV];
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (col(i) < kept) load_l1<L1Policy::kNoAllocate, L2Policy::kEvictLast>(xf[i], x + col(i));
        else xf[i].zero();
      }
      A m = neg_inf<A>();
#pragma unroll
      for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          if (col(i) + k < kept) m = max_acc(m, A(xf[i].get(k)) * scale);
      const A base = m == neg_inf<A>() ? A(0) : m;
      A s = A(0);
#pragma unroll
      for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          if (col(i) + k < kept) s += fwd_exp(fma_acc(A(xf[i].get(k)), scale, -base));
      const A chunk_ms[2] = {m, s};
      MaxSumOp::merge(r, chunk_ms);
    }
    red.reduce(r);
    const A base = r[0] == neg_inf<A>() ? A(0) : r[0];  // a row of -inf: S = 0, so y is NaN
    const A inv = A(1) / r[1], log_s = log_acc(r[1]);
    D* y = static_cast<D*>(p.out) + row * p.out_stride;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      auto col = [&](int i) { return c0 + (int64_t(i) * blockDim.x + threadIdx.x) * VEC; };
      Frag<D, VEC> xf[NV];
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (col(i) < kept) load_l1<L1Policy::kNoAllocate, L2Policy::kEvictFirst>(xf[i], x + col(i));
        else xf[i].zero();
      }
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int64_t c = col(i);
        if (c >= n) continue;
        A o[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
          const A d = fma_acc(A(xf[i].get(k)), scale, -base);  // z - M
          if constexpr (kLog) o[k] = c + k < kept ? d - log_s : neg_inf<A>();
          else o[k] = c + k < kept ? fwd_exp(d) * inv : A(0);
        }
        store_vec(y + c, o);
      }
    }
  }
}

template <typename T, int VEC, int NV, bool kLog>
__global__ void FLN_MAX_REGS(kLoopRegs) softmax_bwd_loop_kernel(const SoftmaxParams p) {
  using A = dacc_t<T>;
  using D = device_t<T>;
  __shared__ ReduceSmem<A, 1> sh;
  RowReducer<A, 1, 2, false> red{sh, int(blockDim.x), 1, 0};
  const int64_t n = p.cols, chunk = int64_t(blockDim.x) * NV * VEC;
  const A scale = A(p.scale);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const int64_t kept = softmax_kept(p, row);
    const D* y = static_cast<const D*>(p.in) + row * p.in_stride;
    const D* dy = static_cast<const D*>(p.grad) + row * p.grad_stride;
    A s[1] = {A(0)};
    for (int64_t c0 = 0; c0 < kept; c0 += chunk) {
      auto col = [&](int i) { return c0 + (int64_t(i) * blockDim.x + threadIdx.x) * VEC; };
      Frag<D, VEC> yf[NV], gf[NV];
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (col(i) < kept) {
          if constexpr (!kLog) load_l1<L1Policy::kNoAllocate, L2Policy::kEvictLast>(yf[i], y + col(i));
          load_l1<L1Policy::kNoAllocate, L2Policy::kEvictLast>(gf[i], dy + col(i));
        }
      }
#pragma unroll
      for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          if (col(i) + k < kept) s[0] += kLog ? A(gf[i].get(k)) : bwd_term<false>(A(yf[i].get(k)), A(gf[i].get(k)));
    }
    red.reduce(s);
    D* dx = static_cast<D*>(p.out) + row * p.out_stride;
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
      auto col = [&](int i) { return c0 + (int64_t(i) * blockDim.x + threadIdx.x) * VEC; };
      Frag<D, VEC> yf[NV], gf[NV];
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (col(i) < kept) {
          load_l1<L1Policy::kNoAllocate, L2Policy::kEvictFirst>(yf[i], y + col(i));
          load_l1<L1Policy::kNoAllocate, L2Policy::kEvictFirst>(gf[i], dy + col(i));
        } else {
          yf[i].zero();
          gf[i].zero();
        }
      }
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int64_t c = col(i);
        if (c >= n) continue;
        A o[VEC];
#pragma unroll
        for (int k = 0; k < VEC; ++k)
          o[k] = c + k < kept ? bwd_dx<kLog>(A(yf[i].get(k)), A(gf[i].get(k)), s[0], scale) : A(0);
        store_vec(dx + c, o);
      }
    }
  }
}

}  // namespace fln::cuda::softmax_kernels
