// The rows of an input as (data, row stride) with unit inner stride: any
// layout that reshapes to such a view (contiguous, row-sliced, row-expanded)
// is read in place; anything else is copied once to contiguous.
#pragma once
#include <ATen/ATen.h>

namespace fln::glue {

struct Rows {
  at::Tensor t;    // keeps the data alive
  int64_t stride;  // elements between row starts
};

inline Rows rows_view(const at::Tensor& t, int64_t rows, int64_t cols) {
  if (t.is_contiguous()) return {t, cols};  // the hot path: no view to build
  at::Tensor v = t.reshape({rows, cols});
  if (cols > 1 && v.stride(1) != 1) v = v.contiguous();
  return {v, v.stride(0)};
}

}  // namespace fln::glue
