// The CPU kernels' entry points, one set per instruction set.  Each set is
// the same source (cpu_kernels_impl.h over the ops' cpu.h headers) compiled
// in its own file under a target pragma and its own namespace;
// cpu_backend.cpp picks the best set the CPU supports, once.  The headers
// below are included here, before any target pragma, so that their inline
// functions are built for the baseline set alone.
#pragma once
#include <ATen/Parallel.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "../kernels/add_norm/params.h"
#include "../kernels/add_norm/philox.h"
#include "../kernels/dtypes.h"
#include "../kernels/params.h"
#include "../kernels/rope/params.h"
#include "../kernels/softmax/params.h"
#include "dispatch.h"

namespace fln::glue {

struct CpuKernels {
  const char* isa;
  void (*fwd)(const FwdParams& p, at::ScalarType xt, at::ScalarType wt);
  void (*bwd)(const BwdParams& p, at::ScalarType xt, at::ScalarType wt);
  void (*softmax)(const SoftmaxParams& p, at::ScalarType t);
  void (*add_norm_fwd)(const AddNormFwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt);
  void (*add_norm_bwd)(const AddNormBwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt);
  void (*rope)(const RopeParams& p, at::ScalarType t, at::ScalarType c);
};

// Null where this build has no such set (another architecture, or a compiler
// without the target pragma).
extern const CpuKernels* const kCpuKernelsBase;
extern const CpuKernels* const kCpuKernelsAvx2;
extern const CpuKernels* const kCpuKernelsAvx512;

// The set the CPU backend runs ("base", "avx2" or "avx512").
const char* cpu_kernels_isa();
// The other ops' CPU kernels of that set (large outputs' pages advised huge, as the norms').
void cpu_softmax(const SoftmaxParams& p, at::ScalarType t);
void cpu_add_norm_fwd(const AddNormFwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt);
void cpu_add_norm_bwd(const AddNormBwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt);
void cpu_rope(const RopeParams& p, at::ScalarType t, at::ScalarType c);

}  // namespace fln::glue
