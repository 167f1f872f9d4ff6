// CPU LayerNorm / RMSNorm kernels, forward and backward.  Framework-free:
// raw pointers in, a caller-supplied parallel-for drives the rows.
//
// Forward, per row: load into an acc-type scratch row, mean (LayerNorm), then
// variance as the mean of squared deviations over the scratch row (two passes
// over on-chip data: accurate when |mean| >> std), then y.
//
// Backward, per row: xhat = (x - mean) * rstd, g = dy * w,
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (RMSNorm drops mean(g)).
// dweight = sum_rows dy * xhat and dbias = sum_rows dy are reduced through
// per-chunk partials (a chunk is a fixed slice of rows that depends only on the
// problem size, never on the thread count) and a fixed-order finalize, so the
// result is bitwise identical from run to run.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../dtypes.h"
#include "../params.h"

namespace fln::cpu {

// Sum of f(i) for i < n with 8 independent accumulators, so the loop
// vectorises without reassociation flags; the order is fixed, so the result
// is deterministic.
template <typename A, typename F>
inline A sum8(int64_t n, F&& f) {
  A s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += f(i + k);
  for (; i < n; ++i) s[0] += f(i);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

template <typename T, typename A>
inline void load_row(const T* src, int64_t n, A* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = load_as<A>(src[i]);
}

template <typename W, typename A>
inline std::vector<A> load_param(const void* p, int64_t n, A fill) {
  std::vector<A> out(size_t(n), fill);
  if (p) load_row(static_cast<const W*>(p), n, out.data());
  return out;
}

// Forward over rows [begin, end).
template <typename T, typename W>
void norm_fwd_rows(const FwdParams& p, int64_t begin, int64_t end) {
  using A = acc_t<T>;
  const int64_t n = p.cols;
  const std::vector<A> w = load_param<W, A>(p.w, n, A(1));
  const std::vector<A> b = load_param<W, A>(p.b, n, A(0));
  std::vector<A> row_buf(static_cast<size_t>(n));
  A* __restrict row = row_buf.data();
  const A* __restrict wp = w.data();
  const A* __restrict bp = b.data();
  for (int64_t r = begin; r < end; ++r) {
    load_row(static_cast<const T*>(p.x) + r * p.x_stride, n, row);
    const A mean = p.rms ? A(0) : sum8<A>(n, [&](int64_t i) { return row[i]; }) / A(n);
    const A var = sum8<A>(n, [&](int64_t i) { return (row[i] - mean) * (row[i] - mean); }) / A(n);
    const A rstd = A(1) / std::sqrt(var + A(p.eps));
    T* __restrict y = static_cast<T*>(p.y) + r * n;
    for (int64_t i = 0; i < n; ++i) y[i] = store_as<T>((row[i] - mean) * rstd * wp[i] + bp[i]);
    if (p.mean) static_cast<A*>(p.mean)[r] = mean;
    if (p.rstd) static_cast<A*>(p.rstd)[r] = rstd;
  }
}

// Rows per backward chunk: a pure function of the problem size.  Chunks are
// large enough to amortise their partial rows and few enough (<= 64) that the
// finalize stays cheap.
inline int64_t bwd_chunk_rows(int64_t rows) {
  const int64_t max_chunks = 64, min_rows = 16;
  return std::max(min_rows, (rows + max_chunks - 1) / max_chunks);
}
inline int64_t bwd_num_chunks(int64_t rows) {
  return rows == 0 ? 0 : (rows + bwd_chunk_rows(rows) - 1) / bwd_chunk_rows(rows);
}

// Backward over chunk c: writes dx for its rows and, when requested, its
// partial dweight / dbias rows (cols each) into part_w / part_b.
template <typename T, typename W>
void norm_bwd_chunk(const BwdParams& p, int64_t c, acc_t<T>* part_w, acc_t<T>* part_b) {
  using A = acc_t<T>;
  const int64_t n = p.cols;
  const int64_t begin = c * bwd_chunk_rows(p.rows);
  const int64_t end = std::min(p.rows, begin + bwd_chunk_rows(p.rows));
  const std::vector<A> w = load_param<W, A>(p.w, n, A(1));
  std::vector<A> xhat_buf(static_cast<size_t>(n)), g_buf(static_cast<size_t>(n));
  A* __restrict xhat = xhat_buf.data();
  A* __restrict g = g_buf.data();
  const A* __restrict wp = w.data();
  if (part_w) std::fill(part_w, part_w + n, A(0));
  if (part_b) std::fill(part_b, part_b + n, A(0));
  for (int64_t r = begin; r < end; ++r) {
    const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
    const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
    const A mean = p.rms ? A(0) : static_cast<const A*>(p.mean)[r];
    const A rstd = static_cast<const A*>(p.rstd)[r];
    for (int64_t i = 0; i < n; ++i) {
      const A d = load_as<A>(dy[i]);
      xhat[i] = (load_as<A>(x[i]) - mean) * rstd;
      g[i] = d * wp[i];
    }
    if (part_w)
      for (int64_t i = 0; i < n; ++i) part_w[i] += load_as<A>(dy[i]) * xhat[i];
    if (part_b)
      for (int64_t i = 0; i < n; ++i) part_b[i] += load_as<A>(dy[i]);
    if (!p.dx) continue;
    const A c_gx = sum8<A>(n, [&](int64_t i) { return g[i] * xhat[i]; }) / A(n);
    const A c_g = p.rms ? A(0) : sum8<A>(n, [&](int64_t i) { return g[i]; }) / A(n);
    T* __restrict dx = static_cast<T*>(p.dx) + r * n;
    for (int64_t i = 0; i < n; ++i) dx[i] = store_as<T>(rstd * (g[i] - c_g - xhat[i] * c_gx));
  }
}

// Sums the partial rows in chunk order and stores in the weight dtype.
template <typename W, typename A>
void finalize_partials(const A* parts, int64_t nparts, int64_t cols, W* out) {
  std::vector<A> acc(size_t(cols), A(0));
  for (int64_t c = 0; c < nparts; ++c)
    for (int64_t i = 0; i < cols; ++i) acc[i] += parts[c * cols + i];
  for (int64_t i = 0; i < cols; ++i) out[i] = store_as<W>(acc[i]);
}

// Whole ops.  ParallelFor is callable as pf(n, fn) and must call fn(begin, end)
// over a partition of [0, n); a serial loop is a valid choice.
template <typename T, typename W, typename ParallelFor>
void norm_fwd(const FwdParams& p, ParallelFor&& pf) {
  pf(p.rows, [&](int64_t b, int64_t e) { norm_fwd_rows<T, W>(p, b, e); });
}

template <typename T, typename W, typename ParallelFor>
void norm_bwd(const BwdParams& p, ParallelFor&& pf) {
  using A = acc_t<T>;
  const int64_t chunks = bwd_num_chunks(p.rows);
  const int64_t n = p.cols;
  std::vector<A> part_w(p.dw ? size_t(chunks * n) : 0), part_b(p.db ? size_t(chunks * n) : 0);
  pf(chunks, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c)
      norm_bwd_chunk<T, W>(p, c, p.dw ? part_w.data() + c * n : nullptr,
                           p.db ? part_b.data() + c * n : nullptr);
  });
  if (p.dw) finalize_partials(part_w.data(), chunks, n, static_cast<W*>(p.dw));
  if (p.db) finalize_partials(part_b.data(), chunks, n, static_cast<W*>(p.db));
}

inline auto serial_for() {
  return [](int64_t n, auto&& fn) { if (n > 0) fn(int64_t(0), n); };
}

}  // namespace fln::cpu
