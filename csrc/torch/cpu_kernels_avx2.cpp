// The CPU kernels compiled for avx2,fma (see cpu_kernels.h); cpu_backend.cpp
// calls them only on a CPU that has these features.
#include "cpu_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
#define FLN_CPU_ISA avx2
#include "cpu_kernels_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace fln::glue {
static const CpuKernels kKernels{"avx2", &avx2::fwd, &avx2::bwd, &avx2::softmax,
                                  &avx2::add_norm_fwd, &avx2::add_norm_bwd, &avx2::rope};
const CpuKernels* const kCpuKernelsAvx2 = &kKernels;
}  // namespace fln::glue
#else
namespace fln::glue {
const CpuKernels* const kCpuKernelsAvx2 = nullptr;
}  // namespace fln::glue
#endif
