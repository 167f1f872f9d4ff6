// CPU backend of the fused pre-norm op (params.h), forward and backward.
// Framework-free: raw pointers in, a caller-supplied parallel-for over
// [0, n) drives the rows.  Statistics in the accumulation type (fp32, fp64
// for double) by mean_var (norm_cpu.h) over h, which is held in its own
// dtype; the weight gradients go
// through per-chunk partial rows added in a fixed order, so they are bitwise
// reproducible whatever the thread count.  Optional inputs and outputs are
// compile-time choices (a loop of its own, or one loop per combination), so
// that every loop but the dropout draws vectorizes; built once per
// instruction set with the norms (csrc/torch/cpu_kernels.h).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../cpu/norm_cpu.h"
#include "../dtypes.h"
#include "params.h"
#include "philox.h"

namespace fln::cpu {
inline namespace FLN_CPU_ISA {

namespace add_norm_detail {

template <typename W, typename A>
inline std::vector<A> load_param(const void* p, int64_t n, A fill, A add = A(0)) {
  std::vector<A> out(size_t(n), fill + add);
  if (p)
    for (int64_t i = 0; i < n; ++i) out[i] = load_as<A>(static_cast<const W*>(p)[i]) + add;
  return out;
}

inline DropoutMask host_mask(const DropoutRng& rng, int64_t cols, double p) {
  const uint64_t seed = rng.seed_ptr ? uint64_t(*rng.seed_ptr) : rng.seed;
  const uint64_t offset = rng.offset_ptr ? uint64_t(*rng.offset_ptr) + rng.offset_extra : rng.offset;
  return DropoutMask::make(seed, offset, cols, p);
}

// Row r's keep flags, eight from each Philox draw, into keep[0, padded_cols):
// a loop over the row's blocks, which vectorizes (about 7x the
// element-by-element draws).
inline void keep_flags(const DropoutMask& dm, int64_t r, uint8_t* __restrict keep) {
  constexpr int kBlock = DropoutMask::kBlock;
  const uint64_t first = uint64_t(r * dm.padded_cols) / kBlock, counter = dm.offset >> 2;
  for (int64_t k = 0; k < dm.padded_cols / kBlock; ++k) {
    const Philox4 d = philox4x32_10(counter, first + uint64_t(k), dm.seed);
    for (int e = 0; e < kBlock; ++e) keep[kBlock * k + e] = dm.keep(d, e);
  }
}

// Calls f with each flag as a std::bool_constant.
template <typename F>
inline void with_flags(bool a, bool b, bool c, bool d, F&& f) {
  auto tag = [](bool v, auto&& g) {
    if (v) g(std::true_type{});
    else g(std::false_type{});
  };
  tag(a, [&](auto ta) {
    tag(b, [&](auto tb) { tag(c, [&](auto tc) { tag(d, [&](auto td) { f(ta, tb, tc, td); }); }); });
  });
}

// xhat = (h - mean) * rstd and g = dy * w of a row and, where pw is given,
// the row's terms of the weight gradients added into a chunk's partial rows.
// The pointers are __restrict parameters, which GCC honors (on local
// pointers it did not, and this loop ran scalar).
template <typename A, typename R, typename T>
inline void bwd_row_terms(const R* __restrict h, const T* __restrict dy, const A* __restrict w, int64_t n, A mean,
                          A rstd, A* __restrict xhat, A* __restrict g, A* __restrict pw, A* __restrict pb) {
  if (pw)
    for (int64_t i = 0; i < n; ++i) {
      const A d = load_as<A>(dy[i]);
      xhat[i] = (load_as<A>(h[i]) - mean) * rstd;
      g[i] = d * w[i];
      pw[i] += d * xhat[i];
      pb[i] += d;
    }
  else
    for (int64_t i = 0; i < n; ++i) {
      xhat[i] = (load_as<A>(h[i]) - mean) * rstd;
      g[i] = load_as<A>(dy[i]) * w[i];
    }
}

}  // namespace add_norm_detail

template <typename T, typename W, typename R, typename ParallelFor>
void add_norm_fwd(const AddNormFwdParams& p, ParallelFor&& parallel_for) {
  using namespace add_norm_detail;
  using A = acc_t<T>;
  const int64_t n = p.cols;
  const bool dropout = p.dropout_p > 0.0;
  const DropoutMask dm = dropout ? host_mask(p.rng, n, p.dropout_p) : DropoutMask{};
  if (p.rng_out) {
    p.rng_out[0] = int64_t(dm.seed);
    p.rng_out[1] = int64_t(dm.offset);
  }
  const std::vector<A> wv = load_param<W, A>(p.w, n, A(1), A(p.weight_offset));
  const std::vector<A> bv = load_param<W, A>(p.b, n, A(0));
  parallel_for(p.rows, [&](int64_t begin, int64_t end) {
    constexpr bool kConvertH = !std::is_same_v<R, A>;
    std::vector<R> scratch(p.h ? 0 : static_cast<size_t>(n));  // h when it is not returned
    std::vector<A> block(kConvertH ? static_cast<size_t>(std::min(n, kStatsBlock)) : 0);
    std::vector<uint8_t> keep(dropout ? static_cast<size_t>(dm.padded_cols) : 0);
    const A* __restrict w = wv.data();
    const A* __restrict b = bv.data();
    const A scale = A(dm.scale);
    for (int64_t r = begin; r < end; ++r) {
      const T* __restrict x = static_cast<const T*>(p.x) + r * p.x_stride;
      const R* __restrict res = p.residual ? static_cast<const R*>(p.residual) + r * p.residual_stride : nullptr;
      // h = dropout(x) + residual, held in its own type R (p.h's row, else scratch):
      // y normalizes the h that is returned, and a 16-bit h is half the bytes to walk.
      R* __restrict h = p.h ? static_cast<R*>(p.h) + r * n : scratch.data();
      if (!dropout) {
        if (res)
          for (int64_t i = 0; i < n; ++i) h[i] = store_as<R>(load_as<A>(x[i]) + load_as<A>(res[i]));
        else
          for (int64_t i = 0; i < n; ++i) h[i] = store_as<R>(load_as<A>(x[i]));
      } else {
        const uint8_t* __restrict kept = keep.data();
        keep_flags(dm, r, keep.data());
        if (p.mask) std::copy(kept, kept + n, p.mask + r * n);
        if (res)
          for (int64_t i = 0; i < n; ++i)
            h[i] = store_as<R>((kept[i] ? load_as<A>(x[i]) * scale : A(0)) + load_as<A>(res[i]));
        else
          for (int64_t i = 0; i < n; ++i) h[i] = store_as<R>(kept[i] ? load_as<A>(x[i]) * scale : A(0));
      }
      A mean = A(0), var;
      if (p.rms) {
        var = lane_sum<A>(n, [&](int64_t i) { const A v = load_as<A>(h[i]); return v * v; }) / A(n);
      } else {
        mean_var<A>(n, [&](int64_t b0, int64_t nb) -> const A* {
          if constexpr (kConvertH) {
            to_acc(h + b0, nb, block.data());
            return block.data();
          } else {
            return h + b0;
          }
        }, mean, var);
      }
      const A rstd = A(1) / std::sqrt(var + A(p.eps));
      T* __restrict y = static_cast<T*>(p.y) + r * n;
      for (int64_t i = 0; i < n; ++i) y[i] = store_as<T>((load_as<A>(h[i]) - mean) * rstd * w[i] + b[i]);
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
  const DropoutMask dm = dropout ? host_mask(p.rng, n, p.dropout_p) : DropoutMask{};
  const std::vector<A> wv = load_param<W, A>(p.w, n, A(1), A(p.weight_offset));
  const bool want_w = p.dw || p.db;
  const int64_t per = bwd_chunk_rows(rows), chunks = bwd_num_chunks(rows);  // the plain backward's chunks
  std::vector<A> part_w(want_w ? size_t(chunks * n) : 0), part_b(want_w ? size_t(chunks * n) : 0);
  parallel_for(chunks, [&](int64_t c0, int64_t c1) {
    std::vector<A> hb(static_cast<size_t>(n)), gb(static_cast<size_t>(n));
    std::vector<uint8_t> keep(dropout ? static_cast<size_t>(dm.padded_cols) : 0);
    A* __restrict xhat = hb.data();
    A* __restrict g = gb.data();
    const A* __restrict w = wv.data();
    for (int64_t c = c0; c < c1; ++c) {
      A* __restrict pw = want_w ? part_w.data() + c * n : nullptr;
      A* __restrict pb = want_w ? part_b.data() + c * n : nullptr;
      for (int64_t r = c * per; r < std::min(rows, (c + 1) * per); ++r) {
        const R* __restrict hr = static_cast<const R*>(p.h) + r * p.h_stride;
        const T* __restrict dy = static_cast<const T*>(p.dy) + r * p.dy_stride;
        const A mean = p.rms ? A(0) : static_cast<const A*>(p.mean)[r];
        const A rstd = static_cast<const A*>(p.rstd)[r];
        bwd_row_terms(hr, dy, w, n, mean, rstd, xhat, g, pw, pb);
        A sum_g, sum_gx;
        lane_sum2<A>(n, [&](int64_t i) { return g[i]; }, [&](int64_t i) { return g[i] * xhat[i]; }, sum_g, sum_gx);
        const A c_g = p.rms ? A(0) : sum_g / A(n), c_gx = sum_gx / A(n);
        // dh, the norm's gradient plus the one flowing into h from its other
        // uses, stored as dresidual and, dropped out, as dx: one loop for each
        // combination of outputs, so that every one vectorizes.
        if (dropout && p.dx) keep_flags(dm, r, keep.data());
        const R* __restrict dh_in = p.dh ? static_cast<const R*>(p.dh) + r * p.dh_stride : nullptr;
        R* __restrict dres = p.dresidual ? static_cast<R*>(p.dresidual) + r * n : nullptr;
        T* __restrict dx = p.dx ? static_cast<T*>(p.dx) + r * n : nullptr;
        const A scale = A(dm.scale);
        const uint8_t* __restrict kept = keep.data();
        with_flags(dh_in != nullptr, dres != nullptr, dx != nullptr, dropout, [&](auto has_dh, auto has_dres, auto has_dx,
                                                                                 auto drop) {
          for (int64_t i = 0; i < n; ++i) {
            A v = rstd * (g[i] - c_g - xhat[i] * c_gx);
            if constexpr (has_dh) v += load_as<A>(dh_in[i]);
            if constexpr (has_dres) dres[i] = store_as<R>(v);
            if constexpr (has_dx) {
              if constexpr (drop) v = kept[i] ? v * scale : A(0);
              dx[i] = store_as<T>(v);
            }
          }
        });
      }
    }
  });
  finalize_weight_grads(part_w.data(), part_b.data(), chunks, n, static_cast<W*>(p.dw), static_cast<W*>(p.db),
                        parallel_for);
}

}  // namespace FLN_CPU_ISA
}  // namespace fln::cpu
