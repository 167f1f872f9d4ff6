// CPU backend of the fused pre-norm op (params.h), forward and backward.
// Framework-free: raw pointers in, a caller-supplied parallel-for over
// [0, n) drives the rows.  Statistics in the accumulation type (fp32, fp64
// for double) by two passes over a scratch row of h; the weight gradients go
// through per-chunk partial rows added in a fixed order, so they are bitwise
// reproducible whatever the thread count.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../cpu/norm_cpu.h"
#include "../dtypes.h"
#include "params.h"
#include "philox.h"

namespace fln::cpu {

namespace add_norm_detail {

template <typename A, typename F>
inline A sum8(int64_t n, F&& f) {  // 8 accumulators: vectorises, fixed order
  A s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += f(i + k);
  for (; i < n; ++i) s[0] += f(i);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

template <typename W, typename A>
inline std::vector<A> load_param(const void* p, int64_t n, A fill, A add = A(0)) {
  std::vector<A> out(size_t(n), fill + add);
  if (p)
    for (int64_t i = 0; i < n; ++i) out[i] = load_as<A>(static_cast<const W*>(p)[i]) + add;
  return out;
}

template <typename A>
inline DropoutMask host_mask(const DropoutRng& rng, int64_t cols, double p) {
  const uint64_t seed = rng.seed_ptr ? uint64_t(*rng.seed_ptr) : rng.seed;
  const uint64_t offset = rng.offset_ptr ? uint64_t(*rng.offset_ptr) + rng.offset_extra : rng.offset;
  return DropoutMask::make(seed, offset, cols, p);
}

}  // namespace add_norm_detail

template <typename T, typename W, typename R, typename ParallelFor>
void add_norm_fwd(const AddNormFwdParams& p, ParallelFor&& parallel_for) {
  using namespace add_norm_detail;
  using A = acc_t<T>;
  const int64_t n = p.cols;
  const bool dropout = p.dropout_p > 0.0;
  const DropoutMask dm = dropout ? host_mask<A>(p.rng, n, p.dropout_p) : DropoutMask{};
  if (p.rng_out) {
    p.rng_out[0] = int64_t(dm.seed);
    p.rng_out[1] = int64_t(dm.offset);
  }
  const std::vector<A> w = load_param<W, A>(p.w, n, A(1), A(p.weight_offset));
  const std::vector<A> b = load_param<W, A>(p.b, n, A(0));
  parallel_for(p.rows, [&](int64_t begin, int64_t end) {
    std::vector<A> buf(static_cast<size_t>(n));
    A* __restrict h = buf.data();
    for (int64_t r = begin; r < end; ++r) {
      const T* x = static_cast<const T*>(p.x) + r * p.x_stride;
      const R* res = p.residual ? static_cast<const R*>(p.residual) + r * p.residual_stride : nullptr;
      Philox4 draws{};  // one draw serves four columns (rows are padded to a multiple of 4)
      for (int64_t i = 0; i < n; ++i) {
        A v = load_as<A>(x[i]);
        if (dropout) {
          if ((i & 3) == 0) draws = dm.draws(r, i);
          const bool keep = dm.keep(draws, i);
          if (p.mask) p.mask[r * n + i] = keep;
          v = keep ? v * A(dm.scale) : A(0);
        }
        if (res) v += load_as<A>(res[i]);
        // y normalizes the h that is returned: h rounded to R.
        const R hr = store_as<R>(v);
        if (p.h) static_cast<R*>(p.h)[r * n + i] = hr;
        h[i] = load_as<A>(hr);
      }
      // Shifted by the first element: exact for constant rows.
      const A mean = p.rms ? A(0) : h[0] + sum8<A>(n, [&](int64_t i) { return h[i] - h[0]; }) / A(n);
      const A var = sum8<A>(n, [&](int64_t i) { return (h[i] - mean) * (h[i] - mean); }) / A(n);
      const A rstd = A(1) / std::sqrt(var + A(p.eps));
      T* y = static_cast<T*>(p.y) + r * n;
      for (int64_t i = 0; i < n; ++i) y[i] = store_as<T>((h[i] - mean) * rstd * w[i] + b[i]);
      if (p.mean) static_cast<A*>(p.mean)[r] = mean;
      if (p.rstd) static_cast<A*>(p.rstd)[r] = rstd;
    }
  });
}

template <typename T, typename W, typename R, typename ParallelFor>
void add_norm_bwd(const AddNormBwdParams& p, ParallelFor&& parallel_for) {
  using namespace add_norm_detail;
  using A = acc_t<T>;
  const int64_t n = p.cols, rows = p.rows;
  const bool dropout = p.dropout_p > 0.0;
  const DropoutMask dm = dropout ? host_mask<A>(p.rng, n, p.dropout_p) : DropoutMask{};
  const std::vector<A> w = load_param<W, A>(p.w, n, A(1), A(p.weight_offset));
  const bool want_w = p.dw || p.db;
  const int64_t per = bwd_chunk_rows(rows), chunks = bwd_num_chunks(rows);  // the plain backward's chunks
  std::vector<A> part_w(want_w ? size_t(chunks * n) : 0), part_b(want_w ? size_t(chunks * n) : 0);
  parallel_for(chunks, [&](int64_t c0, int64_t c1) {
    std::vector<A> hb(static_cast<size_t>(n)), gb(static_cast<size_t>(n));
    for (int64_t c = c0; c < c1; ++c) {
      A* pw = want_w ? part_w.data() + c * n : nullptr;
      A* pb = want_w ? part_b.data() + c * n : nullptr;
      for (int64_t r = c * per; r < std::min(rows, (c + 1) * per); ++r) {
        const R* hr = static_cast<const R*>(p.h) + r * p.h_stride;
        const T* dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
        const A mean = p.rms ? A(0) : static_cast<const A*>(p.mean)[r];
        const A rstd = static_cast<const A*>(p.rstd)[r];
        A* __restrict xhat = hb.data();
        A* __restrict g = gb.data();
        for (int64_t i = 0; i < n; ++i) {
          const A d = load_as<A>(dy[i]);
          xhat[i] = (load_as<A>(hr[i]) - mean) * rstd;
          g[i] = d * w[i];
          if (pw) {
            pw[i] += d * xhat[i];
            pb[i] += d;
          }
        }
        const A c_gx = sum8<A>(n, [&](int64_t i) { return g[i] * xhat[i]; }) / A(n);
        const A c_g = p.rms ? A(0) : sum8<A>(n, [&](int64_t i) { return g[i]; }) / A(n);
        const R* dh = p.dh ? static_cast<const R*>(p.dh) + r * p.dh_stride : nullptr;
        Philox4 draws{};
        for (int64_t i = 0; i < n; ++i) {
          A v = rstd * (g[i] - c_g - xhat[i] * c_gx);
          if (dh) v += load_as<A>(dh[i]);
          if (p.dresidual) static_cast<R*>(p.dresidual)[r * n + i] = store_as<R>(v);
          if (p.dx) {
            if (dropout && (i & 3) == 0) draws = dm.draws(r, i);
            const A dxv = dropout ? (dm.keep(draws, i) ? v * A(dm.scale) : A(0)) : v;
            static_cast<T*>(p.dx)[r * n + i] = store_as<T>(dxv);
          }
        }
      }
    }
  });
  if (!want_w) return;
  for (int64_t i = 0; i < n; ++i) {  // fixed-order finalize
    A sw = 0, sb = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      sw += part_w[c * n + i];
      sb += part_b[c * n + i];
    }
    if (p.dw) static_cast<W*>(p.dw)[i] = store_as<W>(sw);
    if (p.db) static_cast<W*>(p.db)[i] = store_as<W>(sb);
  }
}

}  // namespace fln::cpu
