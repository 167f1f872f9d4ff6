// Framework-free description of one fused pre-norm call,
//   h = dropout(x) + residual,  y = normalize(h) * (weight + weight_offset) + bias,
// and of its backward.  Filled on the host by the torch glue (or any C++
// program) and passed by value to the CPU and CUDA kernels.  Row r of an
// input starts at ptr + r * stride (elements, unit inner stride); outputs are
// dense [rows, cols].  Every optional pointer may be null.
#pragma once
#include <cstdint>

namespace fln {

// Where the dropout mask comes from: Philox4x32-10 keyed by seed, counter
// (offset / 4, element / 8) (philox.h).  When seed_ptr is set (a CUDA graph
// being captured, or a backward that reads what its forward drew) seed and
// offset are read from seed_ptr[0] and offset_ptr[0] + offset_extra on the
// device, as torch's philox unpack does.
struct DropoutRng {
  uint64_t seed = 0;
  uint64_t offset = 0;
  const int64_t* seed_ptr = nullptr;
  const int64_t* offset_ptr = nullptr;
  uint64_t offset_extra = 0;
};

struct AddNormFwdParams {
  int64_t rows = 0;
  int64_t cols = 0;
  const void* x = nullptr;          // [rows, cols] of T, row stride x_stride
  int64_t x_stride = 0;
  const void* residual = nullptr;   // [rows, cols] of R, row stride residual_stride
  int64_t residual_stride = 0;
  const void* w = nullptr;          // [cols] of W
  const void* b = nullptr;          // [cols] of W (LayerNorm)
  void* y = nullptr;                // [rows, cols] of T
  void* h = nullptr;                // [rows, cols] of R: the pre-norm sum, stored when set
  void* mean = nullptr;             // [rows] of acc type (LayerNorm), stored when set
  void* rstd = nullptr;             // [rows] of acc type, stored when set
  uint8_t* mask = nullptr;          // [rows, cols] keep mask (0/1), stored when set
  int64_t* rng_out = nullptr;       // [2]: the seed and offset used, stored when set (for the backward)
  double eps = 1e-5;
  float weight_offset = 0.f;
  double dropout_p = 0;             // 0: no dropout (bitwise the plain path); 1: every element dropped
  DropoutRng rng;
  bool rms = false;
};

struct AddNormBwdParams {
  int64_t rows = 0;
  int64_t cols = 0;
  const void* h = nullptr;          // [rows, cols] of R (the forward's h, or x where h is x)
  int64_t h_stride = 0;
  const void* dy = nullptr;         // [rows, cols] of T
  int64_t dy_stride = 0;
  const void* dh = nullptr;         // [rows, cols] of R: the gradient flowing into h from its other uses
  int64_t dh_stride = 0;
  const void* mean = nullptr;       // [rows] acc type (LayerNorm)
  const void* rstd = nullptr;       // [rows] acc type
  const void* w = nullptr;          // [cols] of W
  void* dx = nullptr;               // [rows, cols] of T: dh * keep / (1 - p)
  void* dresidual = nullptr;        // [rows, cols] of R: dh
  void* dw = nullptr;               // [cols] of W
  void* db = nullptr;               // [cols] of W
  float weight_offset = 0.f;
  double dropout_p = 0;
  DropoutRng rng;
  bool rms = false;
};

}  // namespace fln
