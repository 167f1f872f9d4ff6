// CPU backend of the softmax (params.h), forward and backward.
// Framework-free: raw pointers in, a caller-supplied parallel-for over the
// rows.  Each pass over a row is a plain loop the compiler vectorizes: the
// input converted to the accumulator type (fp32; fp64 for double) in
// registers, sums and max over independent lanes (norm_cpu.h), and in fp32
// an exponential of its own (exp_approx) where std::exp would keep the loop
// scalar.  Built once per instruction set, as the norms
// (csrc/torch/cpu_kernels_impl.h).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../cpu/norm_cpu.h"
#include "../dtypes.h"
#include "params.h"

namespace fln::cpu {
inline namespace FLN_CPU_ISA {

namespace softmax_detail {

// exp(v) in loops that vectorize: v = n ln2 + r with |r| <= ln2 / 2
// (Cody-Waite), e^r by its Taylor series to r^7 (relative error under 1e-8
// there), times 2^n built in the exponent bits, in two factors so that every
// n of the range is a normal float.  Under -87.3 (where e^v nears the smallest
// normal float) it gives 0, over 88.7 infinity; NaN stays NaN.
inline float exp_approx(float v) {
  const float x = v > -87.3f ? (v <= 88.7f ? v : 88.7f) : -87.3f;  // NaN: -87.3, its result replaced below
  const float n = (x * 1.44269504f + 12582912.f) - 12582912.f;      // round to nearest: 1.5 * 2^23
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;      // ln2 in two parts
  float p = 1.f / 5040;
  p = p * r + 1.f / 720;
  p = p * r + 1.f / 120;
  p = p * r + 1.f / 24;
  p = p * r + 1.f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t n_total = int32_t(n), n_half = n_total >> 1;  // n in [-126, 128]
  const int32_t bits_a = (n_half + 127) << 23, bits_b = (n_total - n_half + 127) << 23;
  float scale_a, scale_b;
  std::memcpy(&scale_a, &bits_a, 4);
  std::memcpy(&scale_b, &bits_b, 4);
  const float e = p * scale_a * scale_b;
  return v > -87.3f ? (v <= 88.7f ? e : std::numeric_limits<float>::infinity()) : (v != v ? v : 0.f);
}
inline double exp_approx(double v) { return std::exp(v); }

// max(f(j)) over independent lanes; NaNs are passed over here, and reach the
// output through the sum of the exponentials (a NaN anywhere makes the row
// NaN, as torch).
template <typename A, typename F>
inline A lane_max(int64_t n, F&& f) {
  constexpr int L = kLanes<A>;
  A m[L];
  for (int k = 0; k < L; ++k) m[k] = -std::numeric_limits<A>::infinity();
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int k = 0; k < L; ++k) {
      const A v = f(i + k);
      m[k] = v > m[k] ? v : m[k];
    }
  for (int k = 0; k < L && i + k < n; ++k) {
    const A v = f(i + k);
    m[k] = v > m[k] ? v : m[k];
  }
  return reduce_lanes<A, L>(m, [](A a, A b) { return a > b ? a : b; });
}

// Three passes over a row held in L1/L2: the max of z = scale x; the
// exponentials and their sum (softmax keeps them); the output.  A 16-bit row
// is converted once, into buf, in the first pass; fp32 is read in place.
template <typename T, typename A>
void forward_row(const T* __restrict x, T* __restrict y, A* __restrict buf, int64_t n, int64_t kept, A scale,
                 bool log) {
  constexpr bool kConvert = !std::is_same_v<T, A>;
  const A m = lane_max<A>(kept, [&](int64_t j) {
    const A v = load_as<A>(x[j]) * scale;
    if constexpr (kConvert) buf[j] = v;
    return v;
  });
  auto z = [&](int64_t j) {
    if constexpr (kConvert) return buf[j];
    else return x[j] * scale;
  };
  const A base = m == -std::numeric_limits<A>::infinity() ? A(0) : m;  // a row of -inf: NaN, as torch
  if (log) {
    const A log_sum = std::log(lane_sum<A>(kept, [&](int64_t j) { return exp_approx(z(j) - base); }));
    // y = (z - max) - log(sum): no large lse to round
    for (int64_t j = 0; j < kept; ++j) y[j] = store_as<T>((z(j) - base) - log_sum);
  } else {
    // The exponentials are held in y itself where it has the accumulator type (a
    // smaller working set in L2 for long rows), else in buf.
    A* __restrict e;
    if constexpr (kConvert) e = buf;
    else e = y;
    const A sum = lane_sum<A>(kept, [&](int64_t j) {
      const A v = exp_approx(z(j) - base);
      e[j] = v;
      return v;
    });
    const A inv = A(1) / sum;
    if constexpr (kConvert)
      for (int64_t j = 0; j < kept; ++j) y[j] = store_as<T>(e[j] * inv);
    else
      for (int64_t j = 0; j < kept; ++j) e[j] *= inv;
  }
  const T masked = store_as<T>(log ? -std::numeric_limits<A>::infinity() : A(0));
  for (int64_t j = kept; j < n; ++j) y[j] = masked;
}

// Two passes: the row's sum, then dx.
template <typename T, typename A>
void backward_row(const T* __restrict y, const T* __restrict dy, T* __restrict dx, int64_t n, int64_t kept, A scale,
                  bool log) {
  auto yv = [&](int64_t j) { return load_as<A>(y[j]); };
  auto g = [&](int64_t j) { return load_as<A>(dy[j]); };
  if (log) {
    // exp(y) of whatever y the caller passes, positive too
    const A sum = lane_sum<A>(kept, g);
    for (int64_t j = 0; j < kept; ++j) dx[j] = store_as<T>(scale * (g(j) - exp_approx(yv(j)) * sum));
  } else {
    const A sum = lane_sum<A>(kept, [&](int64_t j) { return g(j) * yv(j); });
    for (int64_t j = 0; j < kept; ++j) dx[j] = store_as<T>(scale * yv(j) * (g(j) - sum));
  }
  for (int64_t j = kept; j < n; ++j) dx[j] = store_as<T>(A(0));
}

}  // namespace softmax_detail

template <typename T, typename ParallelFor>
void softmax(const SoftmaxParams& p, ParallelFor&& parallel_for) {
  using A = acc_t<T>;
  const A scale = A(p.scale);
  parallel_for(p.rows, [&](int64_t r0, int64_t r1) {
    std::vector<A> buf(p.backward || std::is_same_v<T, A> ? 0 : static_cast<size_t>(p.cols));  // 16-bit rows as A
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t kept = softmax_kept(p, r);
      const T* in = static_cast<const T*>(p.in) + r * p.in_stride;
      T* out = static_cast<T*>(p.out) + r * p.out_stride;
      if (p.backward)
        softmax_detail::backward_row(in, static_cast<const T*>(p.grad) + r * p.grad_stride, out, p.cols, kept,
                                     scale, p.log);
      else
        softmax_detail::forward_row(in, out, buf.data(), p.cols, kept, scale, p.log);
    }
  });
}

}  // namespace FLN_CPU_ISA
}  // namespace fln::cpu
