// dtype dispatch for the kernels: (input dtype) x (weight dtype: same or float32).
#pragma once
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include "../kernels/dtypes.h"

namespace fln::glue {

template <typename T> struct Tag { using type = T; };

// Calls f(Tag<T>{}, Tag<W>{}) with the kernels' storage types.
template <typename F>
void dispatch_norm_types(at::ScalarType xt, at::ScalarType wt, F&& f) {
  auto with_weight = [&](auto t) {
    if (wt == xt) f(t, t);
    else f(t, Tag<float>{});
  };
  switch (xt) {
    case at::kDouble: with_weight(Tag<double>{}); break;
    case at::kFloat: with_weight(Tag<float>{}); break;
    case at::kHalf: with_weight(Tag<fln::Half>{}); break;
    case at::kBFloat16: with_weight(Tag<fln::BFloat16>{}); break;
    default: TORCH_CHECK_VALUE(false, "fused_layernorm: unsupported dtype ", xt);
  }
}

// Calls f(Tag<T>{}, Tag<W>{}, Tag<R>{}): the fused op's h dtype R is x's or float32.
template <typename F>
void dispatch_add_norm_types(at::ScalarType xt, at::ScalarType wt, at::ScalarType rt, F&& f) {
  dispatch_norm_types(xt, wt, [&](auto t, auto w) {
    if (rt == xt) f(t, w, t);
    else f(t, w, Tag<float>{});
  });
}

}  // namespace fln::glue
