// CPU backend of the rotary embedding (params.h), forward and backward.
// Framework-free: raw pointers in, a caller-supplied parallel-for over the
// [0, batch * seq) tokens.  Each token's cos/sin row is turned once into two
// coefficient rows, out[i] = x[i] * c[i] + x[partner(i)] * e[i], which every
// head of q and k then uses; math in fp32 (fp64 for double).
#pragma once
#include <cstdint>
#include <vector>

#include "../dtypes.h"
#include "params.h"

#ifndef FLN_CPU_ISA
#define FLN_CPU_ISA base
#endif

namespace fln::cpu {
inline namespace FLN_CPU_ISA {

namespace rope_detail {

// One head: the rotated part from the coefficient rows, the rest copied.
template <typename T, typename A>
inline void rotate_row(const T* x, T* out, const A* c, const A* e, int64_t rot, int64_t dim, bool interleaved) {
  if (interleaved) {
    for (int64_t i = 0; i < rot; i += 2) {
      const A x0 = load_as<A>(x[i]), x1 = load_as<A>(x[i + 1]);
      out[i] = store_as<T>(x0 * c[i] + x1 * e[i]);
      out[i + 1] = store_as<T>(x1 * c[i + 1] + x0 * e[i + 1]);
    }
  } else {
    const int64_t h = rot / 2;
    for (int64_t i = 0; i < h; ++i) {
      const A x0 = load_as<A>(x[i]), x1 = load_as<A>(x[i + h]);
      out[i] = store_as<T>(x0 * c[i] + x1 * e[i]);
      out[i + h] = store_as<T>(x1 * c[i + h] + x0 * e[i + h]);
    }
  }
  for (int64_t i = rot; i < dim; ++i) out[i] = x[i];
}

}  // namespace rope_detail

// T: q's and k's dtype; C: cos's and sin's (T or float).
template <typename T, typename C, typename ParallelFor>
void rope(const RopeParams& p, ParallelFor&& parallel_for) {
  using A = acc_t<T>;
  const int64_t rot = p.rotary_dim, dim = p.head_dim, half = rot / 2;
  parallel_for(p.batch * p.seq, [&](int64_t t0, int64_t t1) {
    std::vector<A> c(static_cast<size_t>(rot)), e(static_cast<size_t>(rot));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / p.seq, s = t % p.seq;
      const C* cr = static_cast<const C*>(p.cos) + b * p.cs_batch + s * p.cs_seq;
      const C* sr = static_cast<const C*>(p.sin) + b * p.cs_batch + s * p.cs_seq;
      for (int64_t i = 0; i < rot; ++i) {
        // partner j and sign (-1 for the first element of a pair)
        const bool first = p.interleaved ? i % 2 == 0 : i < half;
        const int64_t j = p.interleaved ? (i ^ 1) : first ? i + half : i - half;
        const A sign = first ? A(-1) : A(1);
        c[i] = load_as<A>(cr[i]);
        e[i] = p.backward ? -sign * load_as<A>(sr[j]) : sign * load_as<A>(sr[i]);
      }
      auto heads = [&](const void* in, const RopeStrides& si, void* out, const RopeStrides& so, int64_t n) {
        for (int64_t h = 0; h < n; ++h)
          rope_detail::rotate_row(static_cast<const T*>(in) + b * si.batch + s * si.seq + h * si.head,
                                  static_cast<T*>(out) + b * so.batch + s * so.seq + h * so.head, c.data(),
                                  e.data(), rot, dim, p.interleaved);
      };
      heads(p.q, p.q_in, p.q_out, p.q_out_strides, p.heads_q);
      if (p.heads_k > 0) heads(p.k, p.k_in, p.k_out, p.k_out_strides, p.heads_k);
    }
  });
}

}  // namespace FLN_CPU_ISA
}  // namespace fln::cpu
