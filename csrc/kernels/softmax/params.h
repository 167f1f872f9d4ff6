// Framework-free description of one softmax call over the last dim of a
// [rows, cols] matrix whose rows lie `stride` elements apart (unit inner
// stride).  Filled on the host by the torch glue (or any C++ program) and
// passed by value to the CPU and CUDA kernels.
//
// Forward (x -> y), with z = scale * x over the row's kept columns:
//   softmax      y = exp(z - max z) / sum exp(z - max z)
//   log-softmax  y = z - max z - log sum exp(z - max z)
// Backward (y, dy -> dx), the sums over the kept columns:
//   softmax      dx = scale * y * (dy - sum(dy * y))
//   log-softmax  dx = scale * (dy - exp(y) * sum(dy))
// Causal (the attention form, as Megatron's scaled_upper_triang_masked_softmax):
// the rows are those of [..., q_len, cols] matrices; row r is query
// i = r % q_len and keeps columns j <= i + (cols - q_len) (the bottom-right
// aligned triangle; q_len == cols is Megatron's square).  The glue requires
// q_len <= cols, so every row keeps at least one column.  Masked columns get
// y = 0 (log-softmax: -inf) and dx = 0, and their dy is ignored (those
// outputs are constants); the mask is never materialized.
// Math in fp32 (fp64 for double); a row of only -inf gives NaN, as torch.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define FLN_SOFTMAX_HD __host__ __device__
#else
#define FLN_SOFTMAX_HD
#endif

namespace fln {

struct SoftmaxParams {
  int64_t rows = 0;
  int64_t cols = 0;
  const void* in = nullptr;    // forward: x; backward: y (of T)
  int64_t in_stride = 0;       // elements between rows
  const void* grad = nullptr;  // backward: dy (of T)
  int64_t grad_stride = 0;
  void* out = nullptr;         // forward: y; backward: dx (of T)
  int64_t out_stride = 0;
  double scale = 1.0;
  bool log = false;            // log-softmax
  bool causal = false;
  int64_t q_len = 1;           // causal: rows of one matrix, 1 .. cols
  bool backward = false;
};

// Columns [0, kept) of row r are kept.
FLN_SOFTMAX_HD inline int64_t softmax_kept(const SoftmaxParams& p, int64_t r) {
  if (!p.causal) return p.cols;
  return r % p.q_len + (p.cols - p.q_len) + 1;
}

}  // namespace fln
