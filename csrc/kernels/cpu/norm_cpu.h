// CPU LayerNorm / RMSNorm kernels, forward and backward.  Framework-free:
// raw pointers in, a caller-supplied parallel-for drives the rows.
//
// Every inner loop is a plain loop over contiguous arrays, so the compiler
// vectorises it; 16-bit values are converted in registers by branch-free
// selects (dtypes.h), or, where a row is read several times (the LayerNorm
// statistics' blocks, the backward), into a float scratch row first.  Built
// once per instruction set (FLN_CPU_ISA names the inline namespace, so the
// builds never collide at link time; see csrc/torch/cpu_backend.cpp).
//
// Forward, per row: mean and variance (LayerNorm; mean_var below: one pass
// over memory, accurate when |mean| >> std) or the mean square (RMSNorm), then
// y = (x - mean) * rstd * w + b.
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
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "../dtypes.h"
#include "../params.h"

#ifndef FLN_CPU_ISA
#define FLN_CPU_ISA base
#endif

namespace fln::cpu {
inline namespace FLN_CPU_ISA {

// Independent accumulators of a row sum: enough to fill two 512-bit or four
// 256-bit registers, so the adds pipeline without reassociation flags.  The
// order of the sum is fixed by the source, so it is deterministic.
template <typename A>
inline constexpr int kLanes = 64 / int(sizeof(A)) * 2;

// Pairwise reduction of the lanes (a sum unless `op` says otherwise), written
// as fresh halves so that the compiler keeps them in registers (an in-place
// tree spills them to the stack).
struct Plus {
  template <typename A>
  A operator()(A a, A b) const { return a + b; }
};
template <typename A, int L, typename Op = Plus>
inline A reduce_lanes(const A (&s)[L], Op op = {}) {
  if constexpr (L == 1) {
    return s[0];
  } else {
    A t[L / 2];
    for (int k = 0; k < L / 2; ++k) t[k] = op(s[k], s[k + L / 2]);
    return reduce_lanes<A, L / 2>(t, op);
  }
}

// Sum of f(i) for i < n.
template <typename A, typename F>
inline A lane_sum(int64_t n, F&& f) {
  constexpr int L = kLanes<A>;
  A s[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int k = 0; k < L; ++k) s[k] += f(i + k);
  for (int k = 0; k < L && i + k < n; ++k) s[k] += f(i + k);
  return reduce_lanes<A, L>(s);
}

// Sums of f(i) and g(i) for i < n in one pass.
template <typename A, typename F, typename G>
inline void lane_sum2(int64_t n, F&& f, G&& g, A& sf, A& sg) {
  constexpr int L = kLanes<A>;
  A a[L] = {}, b[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int k = 0; k < L; ++k) {
      a[k] += f(i + k);
      b[k] += g(i + k);
    }
  for (int k = 0; k < L && i + k < n; ++k) {
    a[k] += f(i + k);
    b[k] += g(i + k);
  }
  sf = reduce_lanes<A, L>(a);
  sg = reduce_lanes<A, L>(b);
}

// Mean and variance of a row for LayerNorm in one pass over memory: the row
// in blocks of kStatsBlock that stay in L1, each reduced in two passes there
// (shifted by its first element, then squared deviations about its mean), the
// blocks merged by Chan et al.'s rule.  Exact for constant rows (every
// difference is zero).  block(b0, nb) gives the values x[b0, b0 + nb) as A
// (a 16-bit row converted block by block).
inline constexpr int64_t kStatsBlock = 1024;
template <typename A, typename Block>
inline void mean_var(int64_t n, Block&& block, A& mean, A& var) {
  A count = A(0), m = A(0), m2 = A(0);
  for (int64_t b0 = 0; b0 < n; b0 += kStatsBlock) {
    const int64_t nb = std::min(kStatsBlock, n - b0);
    const A* __restrict xb = block(b0, nb);
    const A shift = xb[0];
    const A mb = shift + lane_sum<A>(nb, [&](int64_t i) { return xb[i] - shift; }) / A(nb);
    const A qb = lane_sum<A>(nb, [&](int64_t i) { return (xb[i] - mb) * (xb[i] - mb); });
    const A total = count + A(nb), d = mb - m, wb = A(nb) / total;
    m2 += qb + d * d * count * wb;
    m += d * wb;
    count = total;
  }
  mean = m;
  var = n > 0 ? m2 / A(n) : A(0);
}

template <typename S, typename A>
inline void to_acc(const S* __restrict s, int64_t n, A* __restrict d) {
  for (int64_t i = 0; i < n; ++i) d[i] = load_as<A>(s[i]);
}
template <typename D, typename A>
inline void from_acc(const A* __restrict s, int64_t n, D* __restrict d) {
  for (int64_t i = 0; i < n; ++i) d[i] = store_as<D>(s[i]);
}

// A row (or parameter) as acc-type values: in place when it is stored in the
// acc type, else converted into `buf`.
template <typename S, typename A>
inline const A* acc_view(const S* p, int64_t n, A* buf) {
  if constexpr (std::is_same_v<S, A>) {
    return p;
  } else {
    to_acc(p, n, buf);
    return buf;
  }
}

// out = (x - mean) * rstd * w + b in out's dtype, w and b optional.  x, w
// and b are read in their own dtypes and converted in registers: a 16-bit
// row and parameters stay half the bytes in L1 (at hidden 4096, fp32 copies
// of x, w and b filled 48 KB, and bf16 LayerNorm ran 14% behind torch's).
template <typename A, typename X, typename P, typename D>
inline void normalize_row(const X* __restrict x, int64_t n, A mean, A rstd, const P* __restrict w,
                          const P* __restrict b, D* __restrict out) {
  auto xv = [&](int64_t i) { return load_as<A>(x[i]); };
  if (w && b)
    for (int64_t i = 0; i < n; ++i)
      out[i] = store_as<D>((xv(i) - mean) * rstd * load_as<A>(w[i]) + load_as<A>(b[i]));
  else if (w)
    for (int64_t i = 0; i < n; ++i) out[i] = store_as<D>((xv(i) - mean) * rstd * load_as<A>(w[i]));
  else if (b)
    for (int64_t i = 0; i < n; ++i) out[i] = store_as<D>((xv(i) - mean) * rstd + load_as<A>(b[i]));
  else
    for (int64_t i = 0; i < n; ++i) out[i] = store_as<D>((xv(i) - mean) * rstd);
}

// Per-task scratch: the acc-type weight and bias (converted once per task)
// and the scratch rows of 16-bit dtypes.
template <typename A>
struct Scratch {
  std::vector<A> buf;
  A* take(int64_t n, size_t& used) {
    A* p = buf.data() + used;
    used += size_t(n);
    return p;
  }
};

// Forward over rows [begin, end).  The LayerNorm statistics of a 16-bit row
// read it block by block through an fp32 block buffer; the output pass reads
// the row again (from L1) in its own dtype.
template <typename T, typename W>
void norm_fwd_rows(const FwdParams& p, int64_t begin, int64_t end) {
  using A = acc_t<T>;
  constexpr bool kConvertX = !std::is_same_v<T, A>;
  const int64_t n = p.cols;
  const W* w = static_cast<const W*>(p.w);
  const W* b = p.b && !p.rms ? static_cast<const W*>(p.b) : nullptr;
  std::vector<A> block_buf(kConvertX ? size_t(std::min(n, kStatsBlock)) : 0);
  A* __restrict xblock = block_buf.data();
  for (int64_t r = begin; r < end; ++r) {
    const T* __restrict xr = static_cast<const T*>(p.x) + r * p.x_stride;
    A mean = A(0), var;
    if (p.rms)
      var = lane_sum<A>(n, [&](int64_t i) { const A v = load_as<A>(xr[i]); return v * v; }) / A(n);
    else
      mean_var<A>(n, [&](int64_t b0, int64_t nb) -> const A* {
        if constexpr (kConvertX) {
          to_acc(xr + b0, nb, xblock);
          return xblock;
        } else {
          return xr + b0;
        }
      }, mean, var);
    const A rstd = A(1) / std::sqrt(var + A(p.eps));
    normalize_row(xr, n, mean, rstd, w, b, static_cast<T*>(p.y) + r * n);
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

// Backward over chunks [c_begin, c_end): writes dx for their rows and, when
// requested, each chunk's partial dweight / dbias row (cols each) into
// part_w / part_b (indexed by chunk).
template <typename T, typename W>
void norm_bwd_chunks(const BwdParams& p, int64_t c_begin, int64_t c_end, acc_t<T>* part_w, acc_t<T>* part_b) {
  using A = acc_t<T>;
  constexpr bool kConvertX = !std::is_same_v<T, A>, kConvertW = !std::is_same_v<W, A>;
  const int64_t n = p.cols;
  Scratch<A> s;
  s.buf.resize(size_t(n) * ((kConvertW ? 1 : 0) + (kConvertX ? 2 : 0)));
  size_t used = 0;
  const A* __restrict w =
      p.w ? acc_view(static_cast<const W*>(p.w), n, kConvertW ? s.take(n, used) : nullptr) : nullptr;
  A* __restrict xbuf = kConvertX ? s.take(n, used) : nullptr;
  A* __restrict dybuf = kConvertX ? s.take(n, used) : nullptr;
  const A inv_n = A(1) / A(n);
  const bool rms = p.rms;
  for (int64_t c = c_begin; c < c_end; ++c) {
    const int64_t begin = c * bwd_chunk_rows(p.rows);
    const int64_t end = std::min(p.rows, begin + bwd_chunk_rows(p.rows));
    A* __restrict pw = part_w ? part_w + c * n : nullptr;
    A* __restrict pb = part_b ? part_b + c * n : nullptr;
    if (pw) std::fill(pw, pw + n, A(0));
    if (pb) std::fill(pb, pb + n, A(0));
    for (int64_t r = begin; r < end; ++r) {
      const T* __restrict xr = static_cast<const T*>(p.x) + r * p.x_stride;
      const T* __restrict dyr = static_cast<const T*>(p.dy) + r * p.dy_stride;
      const A* __restrict x;
      const A* __restrict dy;
      if constexpr (kConvertX) {
        for (int64_t i = 0; i < n; ++i) {
          xbuf[i] = load_as<A>(xr[i]);
          dybuf[i] = load_as<A>(dyr[i]);
        }
        x = xbuf;
        dy = dybuf;
      } else {
        x = xr;
        dy = dyr;
      }
      const A mean = rms ? A(0) : static_cast<const A*>(p.mean)[r];
      const A rstd = static_cast<const A*>(p.rstd)[r];
      if (!p.dx) {  // weight gradients only
        for (int64_t i = 0; i < n; ++i) {
          if (pw) pw[i] += dy[i] * ((x[i] - mean) * rstd);
          if (pb) pb[i] += dy[i];
        }
        continue;
      }
      // One pass over the row gives its sums, c_gx = mean(g * xhat) and
      // c_g = mean(g) with g = dy * w, and adds this row's weight-gradient
      // terms (grads(i, xhat)), which a pass of their own would re-read x and
      // dy and recompute xhat for.  Same operations, so the same bits.
      A s_gx, s_g = A(0);
      auto sums = [&](auto&& grads) {
        auto xhat = [&](int64_t i) { return (x[i] - mean) * rstd; };
        if (w) {
          auto gx = [&](int64_t i) { const A xh = xhat(i); grads(i, xh); return dy[i] * w[i] * xh; };
          if (rms) s_gx = lane_sum<A>(n, gx);
          else lane_sum2<A>(n, gx, [&](int64_t i) { return dy[i] * w[i]; }, s_gx, s_g);
        } else {
          auto gx = [&](int64_t i) { const A xh = xhat(i); grads(i, xh); return dy[i] * xh; };
          if (rms) s_gx = lane_sum<A>(n, gx);
          else lane_sum2<A>(n, gx, [&](int64_t i) { return dy[i]; }, s_gx, s_g);
        }
      };
      if (pw && pb) sums([&](int64_t i, A xh) { pw[i] += dy[i] * xh; pb[i] += dy[i]; });
      else if (pw) sums([&](int64_t i, A xh) { pw[i] += dy[i] * xh; });
      else if (pb) sums([&](int64_t i, A) { pb[i] += dy[i]; });
      else sums([](int64_t, A) {});
      const A c_gx = s_gx * inv_n, c_g = s_g * inv_n;
      T* __restrict dx = static_cast<T*>(p.dx) + r * n;
      if (w)
        for (int64_t i = 0; i < n; ++i)
          dx[i] = store_as<T>(rstd * (dy[i] * w[i] - c_g - ((x[i] - mean) * rstd) * c_gx));
      else
        for (int64_t i = 0; i < n; ++i) dx[i] = store_as<T>(rstd * (dy[i] - c_g - ((x[i] - mean) * rstd) * c_gx));
    }
  }
}

// Sums the partial rows of columns [begin, end) in chunk order and stores
// them in the weight dtype.
template <typename W, typename A>
void finalize_partials(const A* parts, int64_t nparts, int64_t cols, int64_t begin, int64_t end, W* out) {
  const int64_t m = end - begin;
  std::vector<A> acc(parts + begin, parts + end);
  for (int64_t c = 1; c < nparts; ++c) {
    const A* __restrict src = parts + c * cols + begin;
    A* __restrict dst = acc.data();
    for (int64_t i = 0; i < m; ++i) dst[i] += src[i];
  }
  from_acc(acc.data(), m, out + begin);
}

// Columns per finalize task.
inline constexpr int64_t kFinalizeCols = 1024;

// dw and db (either may be null) from the chunks' partial rows, added in chunk
// order, columns in parallel; zeros when there were no rows.
template <typename W, typename A, typename ParallelFor>
void finalize_weight_grads(const A* part_w, const A* part_b, int64_t chunks, int64_t n, W* dw, W* db,
                           ParallelFor&& pf) {
  if (!dw && !db) return;
  if (chunks == 0) {
    if (dw) std::fill(dw, dw + n, store_as<W>(A(0)));
    if (db) std::fill(db, db + n, store_as<W>(A(0)));
    return;
  }
  pf((n + kFinalizeCols - 1) / kFinalizeCols, [&](int64_t b, int64_t e) {
    const int64_t begin = b * kFinalizeCols, end = std::min(n, e * kFinalizeCols);
    if (dw) finalize_partials(part_w, chunks, n, begin, end, dw);
    if (db) finalize_partials(part_b, chunks, n, begin, end, db);
  });
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
  // Uninitialized: each chunk zeroes its own partial rows.
  std::unique_ptr<A[]> part_w(p.dw ? new A[size_t(chunks * n)] : nullptr);
  std::unique_ptr<A[]> part_b(p.db ? new A[size_t(chunks * n)] : nullptr);
  pf(chunks, [&](int64_t b, int64_t e) { norm_bwd_chunks<T, W>(p, b, e, part_w.get(), part_b.get()); });
  finalize_weight_grads(part_w.get(), part_b.get(), chunks, n, static_cast<W*>(p.dw), static_cast<W*>(p.db), pf);
}

inline auto serial_for() {
  return [](int64_t n, auto&& fn) { if (n > 0) fn(int64_t(0), n); };
}

}  // namespace FLN_CPU_ISA
}  // namespace fln::cpu
