// One instruction set's CPU kernels (see cpu_kernels.h).  Included once per
// file, after every library header, with FLN_CPU_ISA set and, for the x86
// sets, inside a target pragma: only the code below is compiled for that set.
#include "../kernels/add_norm/cpu.h"
#include "../kernels/cpu/norm_cpu.h"
#include "../kernels/rope/cpu.h"
#include "../kernels/softmax/cpu.h"

namespace fln::glue::FLN_CPU_ISA {

// Rows per task: enough work to amortise a task.  at::parallel_for gives each
// thread one contiguous range, so the per-task scratch is set up once a thread.
static auto parallel_rows(int64_t cols) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
  return [grain](int64_t n, auto&& fn) { at::parallel_for(0, n, grain, fn); };
}

static void fwd(const FwdParams& p, at::ScalarType xt, at::ScalarType wt) {
  dispatch_norm_types(xt, wt, [&](auto t, auto w) {
    using T = typename decltype(t)::type;
    using W = typename decltype(w)::type;
    fln::cpu::norm_fwd<T, W>(p, parallel_rows(p.cols));
  });
}

// Softmax rows a task: about 32K elements.
static void softmax(const SoftmaxParams& p, at::ScalarType t) {
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, p.cols));
  dispatch_norm_types(t, t, [&](auto tt, auto) {
    fln::cpu::softmax<typename decltype(tt)::type>(p, [grain](int64_t n, auto&& fn) { at::parallel_for(0, n, grain, fn); });
  });
}

static void bwd(const BwdParams& p, at::ScalarType xt, at::ScalarType wt) {
  dispatch_norm_types(xt, wt, [&](auto t, auto w) {
    using T = typename decltype(t)::type;
    using W = typename decltype(w)::type;
    fln::cpu::norm_bwd<T, W>(p, [](int64_t n, auto&& fn) { at::parallel_for(0, n, 1, fn); });
  });
}

static void add_norm_fwd(const AddNormFwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt) {
  dispatch_add_norm_types(xt, wt, rt, [&](auto t, auto w, auto r) {
    fln::cpu::add_norm_fwd<typename decltype(t)::type, typename decltype(w)::type, typename decltype(r)::type>(
        p, parallel_rows(p.cols));
  });
}

static void add_norm_bwd(const AddNormBwdParams& p, at::ScalarType xt, at::ScalarType wt, at::ScalarType rt) {
  dispatch_add_norm_types(xt, wt, rt, [&](auto t, auto w, auto r) {
    fln::cpu::add_norm_bwd<typename decltype(t)::type, typename decltype(w)::type, typename decltype(r)::type>(
        p, [](int64_t n, auto&& fn) { at::parallel_for(0, n, 1, fn); });
  });
}

// Tokens a task: about 32K elements of q and k.
static void rope(const RopeParams& p, at::ScalarType t, at::ScalarType c) {
  const int64_t per_token = std::max<int64_t>(1, (p.heads_q + p.heads_k) * p.head_dim);
  const int64_t grain = std::max<int64_t>(1, 32768 / per_token);
  dispatch_norm_types(t, c, [&](auto tt, auto ct) {  // cos/sin: q's dtype or float32, as a norm's weight
    fln::cpu::rope<typename decltype(tt)::type, typename decltype(ct)::type>(
        p, [grain](int64_t n, auto&& fn) { at::parallel_for(0, n, grain, fn); });
  });
}

}  // namespace fln::glue::FLN_CPU_ISA
