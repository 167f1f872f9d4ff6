// Framework-free description of one normalization call.  Filled on the host by
// the torch glue (or by a test / another C++ program) and passed by value to the
// CPU and CUDA kernels.  Rows have `cols` elements; row r of x starts at
// x + r * x_stride (elements), so any 2-D strided view with a unit inner stride
// is read in place.  Outputs (y, dx) are dense: row r starts at r * cols.
#pragma once
#include <cstdint>

namespace fln {

struct FwdParams {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t x_stride = 0;
  const void* x = nullptr;
  const void* w = nullptr;  // optional, [cols]
  const void* b = nullptr;  // optional, [cols] (LayerNorm only)
  void* y = nullptr;        // [rows, cols]
  void* mean = nullptr;     // [rows] of acc type; LayerNorm only, may be null
  void* rstd = nullptr;     // [rows] of acc type; may be null
  double eps = 1e-5;
  bool rms = false;         // RMSNorm: no mean subtraction, no bias
};

struct BwdParams {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t x_stride = 0;
  int64_t dy_stride = 0;
  const void* x = nullptr;
  const void* dy = nullptr;
  const void* mean = nullptr;  // [rows] acc type (LayerNorm)
  const void* rstd = nullptr;  // [rows] acc type
  const void* w = nullptr;     // optional, [cols]
  void* dx = nullptr;          // optional output [rows, cols]
  void* dw = nullptr;          // optional output [cols], weight dtype
  void* db = nullptr;          // optional output [cols], weight dtype
  bool rms = false;
};

}  // namespace fln
