// The CPU kernels for the baseline instruction set of the build (see cpu_kernels.h).
#include "cpu_kernels.h"

#define FLN_CPU_ISA base
#include "cpu_kernels_impl.h"

namespace fln::glue {
static const CpuKernels kKernels{"base", &base::fwd, &base::bwd, &base::softmax,
                                  &base::add_norm_fwd, &base::add_norm_bwd, &base::rope};
const CpuKernels* const kCpuKernelsBase = &kKernels;
}  // namespace fln::glue
