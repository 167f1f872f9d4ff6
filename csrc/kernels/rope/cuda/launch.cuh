// Launcher of the rotary kernel: plan.h's plan turned into an instantiation
// (access width, pairing, direction), a grid and a launch on the caller's stream.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "../../cuda/launch_common.cuh"
#include "kernel.cuh"
#include "plan.h"
#include "rope_cuda.h"

namespace fln::cuda {

template <typename T, typename C>
cudaError_t rope(const RopeParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  using namespace rotary;
  const int64_t tokens = p.batch * p.seq, rows = p.heads_q + p.heads_k;
  if (tokens == 0 || rows == 0 || p.head_dim == 0) return cudaSuccess;
  // 16-byte accesses where every pointer, stride and size allows; else one element.
  constexpr int V = 16 / sizeof(T);
  auto whole = [](const RopeStrides& s) { return s.batch % V == 0 && s.seq % V == 0 && s.head % V == 0; };
  bool vec_ok = p.head_dim % (2 * V) == 0 && p.rotary_dim % (2 * V) == 0 && p.cs_batch % V == 0 &&
                p.cs_seq % V == 0 && aligned(p.cos, 16) && aligned(p.sin, 16) && aligned(p.q, 16) &&
                aligned(p.q_out, 16) && whole(p.q_in) && whole(p.q_out_strides);
  if (p.heads_k > 0)
    vec_ok = vec_ok && aligned(p.k, 16) && aligned(p.k_out, 16) && whole(p.k_in) && whole(p.k_out_strides);
  const rotary::Plan pl = rotary::make_plan(tokens, rows, p.head_dim, int(sizeof(T)), vec_ok);
  const int threads = pl.threads_x * pl.threads_y * pl.threads_z;
  auto go = [&](auto vec_tag, auto interleaved_tag, auto bwd_tag) {
    auto* kernel =
        &rope_kernel<T, C, decltype(vec_tag)::value, decltype(interleaved_tag)::value, decltype(bwd_tag)::value>;
    const int64_t ahead = prefetch_tokens(resident_groups(kernel, dev, threads, 1, 0), pl.threads_z);
    const Layout lay{pl.threads_x, pl.threads_y, pl.threads_z, ahead, ahead / p.seq, ahead % p.seq};
    kernel<<<dim3(unsigned(pl.grid)), dim3(unsigned(threads)), 0, stream>>>(p, lay);
  };
  auto with_bwd = [&](auto vec_tag, auto interleaved_tag) {
    if (p.backward) go(vec_tag, interleaved_tag, std::true_type{});
    else go(vec_tag, interleaved_tag, std::false_type{});
  };
  auto with_pairs = [&](auto vec_tag) {
    if (p.interleaved) with_bwd(vec_tag, std::true_type{});
    else with_bwd(vec_tag, std::false_type{});
  };
  if (pl.vec == V) with_pairs(std::integral_constant<int, V>{});
  else with_pairs(std::integral_constant<int, 1>{});
  return cudaGetLastError();
}

}  // namespace fln::cuda
