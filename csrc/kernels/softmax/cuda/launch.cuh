// Launchers of the softmax kernels: plan.h's plan turned into an
// instantiation (access width, accesses a thread, strategy, log), a grid and
// a launch on the caller's stream, through the helpers every op shares
// (cuda/launch_common.cuh).
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "../../cuda/launch_common.cuh"
#include "kernel.cuh"
#include "plan.h"
#include "softmax_cuda.h"

namespace fln::cuda {

namespace softmax_kernels {

static_assert(kPlanMaxThreads == kMaxThreads && kPlanMaxCluster == kMaxCluster, "plan.h and kernel.cuh agree");
static_assert(kPlanMaxThreads <= kMaxCtaThreads && kLoopThreads <= kMaxCtaThreads, "RowReducer's warp slots");
static_assert(int64_t(kPlanMaxCluster) * kPlanMaxThreads * kThreadBytes <= INT32_MAX,
              "the row kernels count a row's columns in ints");

// The backward's loop kernel holds half the accesses of each input (two
// inputs in 64 registers: with all of them, fp32 spilled).
template <int NV>
constexpr int kLoopBwdAccesses = NV > 1 ? NV / 2 : 1;

// 16-byte accesses where every pointer and row stride allows; else one element.
template <typename T>
bool vec_ok(const SoftmaxParams& p) {
  constexpr int V = 16 / sizeof(T);
  bool ok = p.cols % V == 0 && p.in_stride % V == 0 && p.out_stride % V == 0 && aligned(p.in, 16) &&
            aligned(p.out, 16);
  if (p.backward) ok = ok && p.grad_stride % V == 0 && aligned(p.grad, 16);
  return ok;
}

// Calls f(vec_tag, nv_tag, log_tag) for the plan's access width (the accesses
// a thread follow from it) and p.log.
template <typename T, typename F>
cudaError_t with_tags(const Plan& pl, bool log, F&& f) {
  constexpr int kWide = 16 / sizeof(T);
  auto with_log = [&](auto vec_tag) -> cudaError_t {
    constexpr int NV = accesses_per_thread(decltype(vec_tag)::value, sizeof(T));
    if (pl.accesses != NV) return cudaErrorInvalidConfiguration;  // plan.h and the instantiations disagree
    if (log) return f(vec_tag, std::integral_constant<int, NV>{}, std::true_type{});
    return f(vec_tag, std::integral_constant<int, NV>{}, std::false_type{});
  };
  if (pl.vec == kWide) return with_log(std::integral_constant<int, kWide>{});
  return with_log(std::integral_constant<int, 1>{});
}

// Launches a row kernel (kRow; kCluster falls back to the loop kernel where
// no cluster fits), else the loop kernel.
template <typename RowK, typename ClusterK, typename LoopK>
cudaError_t run(const SoftmaxParams& p, Plan pl, const DeviceInfo& dev, cudaStream_t stream, RowK row_k,
                ClusterK cluster_k, LoopK loop_k) {
  const Layout lay{pl.threads_per_row, pl.cluster};
  if (pl.strategy == Strategy::kRow) {
    const int rows_per_cta = pl.cta_threads / pl.threads_per_row;
    int64_t groups = (p.rows + rows_per_cta - 1) / rows_per_cta;
    if (groups > INT32_MAX) groups = INT32_MAX;  // the kernel loops over the rest
    return launch(row_k, dim3(unsigned(groups)), pl.cta_threads, 0, 1, stream, p, lay);
  }
  if (pl.strategy == Strategy::kCluster) {
    const int64_t res = resident_groups(cluster_k, dev, pl.cta_threads, pl.cluster, 0);
    if (res > 0) {  // a persistent grid of clusters
      const int64_t groups = p.rows < res ? p.rows : res;
      const cudaError_t e =
          launch(cluster_k, dim3(unsigned(groups * pl.cluster)), pl.cta_threads, 0, pl.cluster, stream, p, lay);
      // A cluster the occupancy query admitted but the launch refused (a
      // non-sticky configuration error, cleared by launch(); nothing ran):
      // the loop kernel below takes the rows rather than the op failing.
      if (e != cudaErrorInvalidClusterSize && e != cudaErrorLaunchOutOfResources) return e;
    }
    pl = loop_plan(pl);
  }
  const int64_t res = resident_groups(loop_k, dev, pl.cta_threads, 1, 0);
  int64_t grid = p.rows < res ? p.rows : res;
  if (grid < 1) grid = 1;
  return launch(loop_k, dim3(unsigned(grid)), pl.cta_threads, 0, 1, stream, p);
}

}  // namespace softmax_kernels

template <typename T>
cudaError_t softmax_fwd(const SoftmaxParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  using namespace softmax_kernels;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  const softmax_kernels::Plan pl = make_plan(p.cols, int(sizeof(T)), vec_ok<T>(p), dev.cc_major);
  return with_tags<T>(pl, p.log, [&](auto vec_tag, auto nv_tag, auto log_tag) {
    constexpr int VEC = decltype(vec_tag)::value, NV = decltype(nv_tag)::value;
    constexpr bool kLog = decltype(log_tag)::value;
    auto with_mask = [&](auto causal_tag) {
      constexpr bool kCausal = decltype(causal_tag)::value;
      return run(p, pl, dev, stream, &softmax_fwd_kernel<T, VEC, NV, Mode::kRow, kLog, kCausal>,
                 &softmax_fwd_kernel<T, VEC, NV, Mode::kCluster, kLog, kCausal>,
                 &softmax_fwd_loop_kernel<T, VEC, NV, kLog>);
    };
    return p.causal ? with_mask(std::true_type{}) : with_mask(std::false_type{});
  });
}

template <typename T>
cudaError_t softmax_bwd(const SoftmaxParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  using namespace softmax_kernels;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  const softmax_kernels::Plan pl = make_plan(p.cols, int(sizeof(T)), vec_ok<T>(p), dev.cc_major);
  return with_tags<T>(pl, p.log, [&](auto vec_tag, auto nv_tag, auto log_tag) {
    constexpr int VEC = decltype(vec_tag)::value, NV = decltype(nv_tag)::value;
    constexpr bool kLog = decltype(log_tag)::value;
    return run(p, pl, dev, stream, &softmax_bwd_kernel<T, VEC, NV, Mode::kRow, kLog>,
               &softmax_bwd_kernel<T, VEC, NV, Mode::kCluster, kLog>, &softmax_bwd_loop_kernel<T, VEC, kLoopBwdAccesses<NV>, kLog>);
  });
}

}  // namespace fln::cuda
