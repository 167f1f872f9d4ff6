// CPU backend of the softmax (params.h), forward and backward.
// Framework-free: raw pointers in, a caller-supplied parallel-for over the
// rows.  Each row is converted once into an accumulator buffer (fp32; fp64
// for double) whose passes are plain loops the compiler vectorizes, except
// the exponentials.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../dtypes.h"
#include "params.h"

namespace fln::cpu {

namespace softmax_detail {

// max(v) with NaN kept (a NaN anywhere makes the row NaN, as torch).
template <typename A>
inline A row_max(const A* v, int64_t n) {
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t j = 0; j < n; ++j) m = (v[j] > m || v[j] != v[j]) ? v[j] : m;
  return m;
}

template <typename T, typename A>
void forward_row(const T* x, T* y, A* buf, int64_t n, int64_t kept, A scale, bool log) {
  for (int64_t j = 0; j < kept; ++j) buf[j] = load_as<A>(x[j]) * scale;
  const A m = row_max(buf, kept);  // -inf for a row of -inf: every output is then NaN, as torch
  A sum = A(0);
  if (log) {
    for (int64_t j = 0; j < kept; ++j) sum += std::exp(buf[j] - m);
    const A lse = m + std::log(sum);
    for (int64_t j = 0; j < kept; ++j) y[j] = store_as<T>(buf[j] - lse);
  } else {
    for (int64_t j = 0; j < kept; ++j) {
      buf[j] = std::exp(buf[j] - m);
      sum += buf[j];
    }
    const A inv = A(1) / sum;
    for (int64_t j = 0; j < kept; ++j) y[j] = store_as<T>(buf[j] * inv);
  }
  const T masked = store_as<T>(log ? -std::numeric_limits<A>::infinity() : A(0));
  for (int64_t j = kept; j < n; ++j) y[j] = masked;
}

template <typename T, typename A>
void backward_row(const T* y, const T* dy, T* dx, A* buf, int64_t n, int64_t kept, A scale, bool log) {
  A sum = A(0);
  if (log) {
    for (int64_t j = 0; j < kept; ++j) sum += load_as<A>(dy[j]);
    for (int64_t j = 0; j < kept; ++j) buf[j] = std::exp(load_as<A>(y[j]));
    for (int64_t j = 0; j < kept; ++j) dx[j] = store_as<T>(scale * (load_as<A>(dy[j]) - buf[j] * sum));
  } else {
    for (int64_t j = 0; j < kept; ++j) {
      buf[j] = load_as<A>(y[j]);
      sum += load_as<A>(dy[j]) * buf[j];
    }
    for (int64_t j = 0; j < kept; ++j) dx[j] = store_as<T>(scale * buf[j] * (load_as<A>(dy[j]) - sum));
  }
  for (int64_t j = kept; j < n; ++j) dx[j] = store_as<T>(A(0));
}

}  // namespace softmax_detail

template <typename T, typename ParallelFor>
void softmax(const SoftmaxParams& p, ParallelFor&& parallel_for) {
  using A = acc_t<T>;
  const A scale = A(p.scale);
  parallel_for(p.rows, [&](int64_t r0, int64_t r1) {
    std::vector<A> buf(static_cast<size_t>(p.cols));
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

}  // namespace fln::cpu
