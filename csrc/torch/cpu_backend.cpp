// CPU backend: the framework-free CPU kernels, built once per instruction set
// (cpu_kernels_*.cpp), driven by at::parallel_for.  The set is chosen once,
// from what the CPU supports; ATEN_CPU_CAPABILITY (default, avx2, avx512), the
// variable that caps torch's own CPU kernels, caps ours the same way.
#include <cstdint>
#include <cstdlib>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cpu_kernels.h"
#include "norm_ops.h"

namespace fln::glue {

namespace {

bool cpu_has(const char* feature) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const std::string f(feature);
  if (f == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (f == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
  (void)feature;
  return false;
}

const CpuKernels& pick_kernels() {
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  const std::string limit = cap ? cap : "";
  const bool allow512 = limit.empty() || limit == "avx512";
  const bool allow2 = allow512 || limit == "avx2";
  if (allow512 && kCpuKernelsAvx512 && cpu_has("avx512")) return *kCpuKernelsAvx512;
  if (allow2 && kCpuKernelsAvx2 && cpu_has("avx2")) return *kCpuKernelsAvx2;
  return *kCpuKernelsBase;
}

const CpuKernels& kernels() {
  static const CpuKernels& k = pick_kernels();
  return k;
}

// Large outputs are fresh pages (allocations this size are mmapped anew each
// time), and their first-touch page faults cost more than the kernel itself;
// transparent huge pages, where the system grants them on request, take 512
// times fewer.  A hint on memory we are about to fill: a refusal changes nothing.
void advise_huge_pages(void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (data == nullptr || bytes < int64_t(2 * kHuge)) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + uintptr_t(bytes)) & ~(kHuge - 1);
  if (end > begin) (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

void cpu_fwd(const FwdParams& p, at::ScalarType xt, at::ScalarType wt, const Tensor&) {
  advise_huge_pages(p.y, p.rows * p.cols * int64_t(c10::elementSize(xt)));
  kernels().fwd(p, xt, wt);
}

void cpu_bwd(const BwdParams& p, at::ScalarType xt, at::ScalarType wt, const Tensor&) {
  advise_huge_pages(p.dx, p.rows * p.cols * int64_t(c10::elementSize(xt)));
  kernels().bwd(p, xt, wt);
}

}  // namespace

const char* cpu_kernels_isa() { return kernels().isa; }

void cpu_softmax(const SoftmaxParams& p, at::ScalarType t) {
  advise_huge_pages(p.out, p.rows * p.out_stride * int64_t(c10::elementSize(t)));
  kernels().softmax(p, t);
}

void cpu_add_norm_fwd(const AddNormFwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt) {
  advise_huge_pages(p.y, p.rows * p.cols * int64_t(c10::elementSize(xt)));
  advise_huge_pages(p.h, p.rows * p.cols * int64_t(c10::elementSize(rt)));
  kernels().add_norm_fwd(p, xt, wt, rt);
}

void cpu_add_norm_bwd(const AddNormBwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt) {
  advise_huge_pages(p.dx, p.rows * p.cols * int64_t(c10::elementSize(xt)));
  advise_huge_pages(p.dresidual, p.rows * p.cols * int64_t(c10::elementSize(rt)));
  kernels().add_norm_bwd(p, xt, wt, rt);
}

void cpu_rope(const RopeParams& p, at::ScalarType t, at::ScalarType c) { kernels().rope(p, t, c); }

const Backend kCpuBackend{&cpu_fwd, &cpu_bwd};

}  // namespace fln::glue
