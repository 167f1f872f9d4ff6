// The CPU kernels compiled for avx512f,avx512bw,avx512vl,avx512dq,avx2,fma (see cpu_kernels.h); cpu_backend.cpp
// calls them only on a CPU that has these features.
#include "cpu_kernels.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")
#endif
#define FLN_CPU_ISA avx512
#include "cpu_kernels_impl.h"
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace fln::glue {
static const CpuKernels kKernels{"avx512", &avx512::fwd, &avx512::bwd, &avx512::softmax,
                                  &avx512::add_norm_fwd, &avx512::add_norm_bwd, &avx512::rope};
const CpuKernels* const kCpuKernelsAvx512 = &kKernels;
}  // namespace fln::glue
#else
namespace fln::glue {
const CpuKernels* const kCpuKernelsAvx512 = nullptr;
}  // namespace fln::glue
#endif
