// CPU backend: the framework-free CPU kernels driven by at::parallel_for.
#include <ATen/Parallel.h>

#include "../kernels/cpu/norm_cpu.h"
#include "dispatch.h"
#include "norm_ops.h"

namespace fln::glue {

namespace {

// Rows (or backward chunks) per task: enough work to amortise a task.
auto parallel_rows(int64_t cols) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  return [grain](int64_t n, auto&& fn) { at::parallel_for(0, n, grain, fn); };
}

void cpu_fwd(const FwdParams& p, at::ScalarType xt, at::ScalarType wt, const Tensor&) {
  dispatch_norm_types(xt, wt, [&](auto t, auto w) {
    using T = typename decltype(t)::type;
    using W = typename decltype(w)::type;
    fln::cpu::norm_fwd<T, W>(p, parallel_rows(p.cols));
  });
}

void cpu_bwd(const BwdParams& p, at::ScalarType xt, at::ScalarType wt, const Tensor&) {
  dispatch_norm_types(xt, wt, [&](auto t, auto w) {
    using T = typename decltype(t)::type;
    using W = typename decltype(w)::type;
    fln::cpu::norm_bwd<T, W>(p, [](int64_t n, auto&& fn) { at::parallel_for(0, n, 1, fn); });
  });
}

}  // namespace

const Backend kCpuBackend{&cpu_fwd, &cpu_bwd};

}  // namespace fln::glue
