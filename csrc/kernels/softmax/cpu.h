// CPU backend of the softmax (params.h), forward and backward.
// Framework-free: raw pointers in, a caller-supplied parallel-for over the
// rows.  Each row is converted once into an accumulator buffer (fp32; fp64
// for double) whose passes are plain loops the compiler vectorizes: sums over
// independent lanes (norm_cpu.h), and in fp32 an exponential of its own
// (exp_nonpositive) where std::exp would keep the loop scalar.  Built once per
// instruction set, as the norms (csrc/torch/cpu_kernels_impl.h).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../cpu/norm_cpu.h"
#include "../dtypes.h"
#include "params.h"

namespace fln::cpu {
inline namespace FLN_CPU_ISA {

namespace softmax_detail {

// exp(v) for v <= 0 (or NaN), in loops that vectorize: v = n ln2 + r with
// |r| <= ln2 / 2 (Cody-Waite), e^r by its Taylor series to r^7 (relative
// error under 1e-8 there), times 2^n built in the exponent bits.  Under
// -87.3 (where e^v nears the smallest normal float) it gives 0; NaN stays NaN.
inline float exp_nonpositive(float v) {
  const float x = v > -87.3f ? v : -87.3f;  // NaN: -87.3, its result replaced below
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;  // round to nearest: 1.5 * 2^23
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln2 in two parts
  float p = 1.f / 5040;
  p = p * r + 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t bits = (int32_t(n) + 127) << 23;  // n in [-126, 0]
  float scale;
  std::memcpy(&scale, &bits, 4);
  const float e = p * scale;
  return v > -87.3f ? e : (v != v ? v : 0.f);
}
inline double exp_nonpositive(double v) { return std::exp(v); }

// max(v) with NaN kept (a NaN anywhere makes the row NaN, as torch), over
// independent lanes.
template <typename A>
inline A row_max(const A* v, int64_t n) {
  constexpr int L = kLanes<A>;
  A m[L];
  for (int k = 0; k < L; ++k) m[k] = -std::numeric_limits<A>::infinity();
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int k = 0; k < L; ++k) m[k] = (v[i + k] > m[k] || v[i + k] != v[i + k]) ? v[i + k] : m[k];
  for (int k = 0; k < L && i + k < n; ++k) m[k] = (v[i + k] > m[k] || v[i + k] != v[i + k]) ? v[i + k] : m[k];
  A r = m[0];
  for (int k = 1; k < L; ++k) r = (m[k] > r || m[k] != m[k]) ? m[k] : r;
  return r;
}

template <typename T, typename A>
void forward_row(const T* x, T* y, A* buf, int64_t n, int64_t kept, A scale, bool log) {
  for (int64_t j = 0; j < kept; ++j) buf[j] = load_acc<A>(x[j]) * scale;
  const A m = row_max(buf, kept);  // -inf for a row of -inf: every output is then NaN, as torch
  const A base = m == -std::numeric_limits<A>::infinity() ? A(0) : m;
  if (log) {
    A* e = buf + n;  // the exponentials in a loop of their own, which vectorizes
    for (int64_t j = 0; j < kept; ++j) e[j] = exp_nonpositive(buf[j] - base);
    const A log_sum = std::log(lane_sum<A>(kept, [&](int64_t j) { return e[j]; }));
    // y = (z - max) - log(sum): no large lse to round
    for (int64_t j = 0; j < kept; ++j) y[j] = store_acc<T>((buf[j] - base) - log_sum);
  } else {
    for (int64_t j = 0; j < kept; ++j) buf[j] = exp_nonpositive(buf[j] - base);
    const A inv = A(1) / lane_sum<A>(kept, [&](int64_t j) { return buf[j]; });
    for (int64_t j = 0; j < kept; ++j) y[j] = store_acc<T>(buf[j] * inv);
  }
  const T masked = store_acc<T>(log ? -std::numeric_limits<A>::infinity() : A(0));
  for (int64_t j = kept; j < n; ++j) y[j] = masked;
}

template <typename T, typename A>
void backward_row(const T* y, const T* dy, T* dx, A* buf, int64_t n, int64_t kept, A scale, bool log) {
  A* g = buf + n;  // dy as A
  for (int64_t j = 0; j < kept; ++j) g[j] = load_acc<A>(dy[j]);
  if (log) {
    // exp(y) of whatever y the caller passes: std::exp, not the nonpositive one.
    const A sum = lane_sum<A>(kept, [&](int64_t j) { return g[j]; });
    for (int64_t j = 0; j < kept; ++j) buf[j] = std::exp(load_acc<A>(y[j]));
    for (int64_t j = 0; j < kept; ++j) dx[j] = store_acc<T>(scale * (g[j] - buf[j] * sum));
  } else {
    for (int64_t j = 0; j < kept; ++j) buf[j] = load_acc<A>(y[j]);
    const A sum = lane_sum<A>(kept, [&](int64_t j) { return g[j] * buf[j]; });
    for (int64_t j = 0; j < kept; ++j) dx[j] = store_acc<T>(scale * buf[j] * (g[j] - sum));
  }
  for (int64_t j = kept; j < n; ++j) dx[j] = store_acc<T>(A(0));
}

}  // namespace softmax_detail

template <typename T, typename ParallelFor>
void softmax(const SoftmaxParams& p, ParallelFor&& parallel_for) {
  using A = acc_t<T>;
  const A scale = A(p.scale);
  parallel_for(p.rows, [&](int64_t r0, int64_t r1) {
    std::vector<A> buf(static_cast<size_t>(2 * p.cols));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t kept = softmax_kept(p, r);
      const T* in = static_cast<const T*>(p.in) + r * p.in_stride;
      T* out = static_cast<T*>(p.out) + r * p.out_stride;
      if (p.backward)
        softmax_detail::backward_row(in, static_cast<const T*>(p.grad) + r * p.grad_stride, out, buf.data(), p.cols,
                                     kept, scale, p.log);
      else
        softmax_detail::forward_row(in, out, buf.data(), p.cols, kept, scale, p.log);
    }
  });
}

}  // namespace FLN_CPU_ISA
}  // namespace fln::cpu
