// The launch rule of the softmax kernels (kernel.cuh), forward and backward:
// a pure function of the row's size in bytes and the device.
#pragma once
#include <cstdint>

namespace fln::cuda::softmax_kernels {

enum class Strategy { kRow, kCluster, kLoop };

struct Plan {
  Strategy strategy = Strategy::kRow;
  int vec = 1;              // elements per access: 16 bytes where every pointer and stride allows
  int accesses = 1;         // accesses a thread holds per row (the kernels' NV)
  int threads_per_row = 1;  // of one CTA
  int cta_threads = 128;
  int cluster = 1;          // kCluster: CTAs on a row
};

// A thread holds 64 bytes of each input of a row in registers (x in the
// forward; y and dy in the backward), all loads issued before the row's
// reduction: four 16-byte loads in flight a thread, as the norms' forward.
// One-element accesses (unaligned or odd rows) keep at most 8 (at 16 the
// 16-bit forward spilled at 96 registers).
constexpr int kThreadBytes = 64;
constexpr int kMaxAccesses = 8;
// Short rows share a CTA of this many threads, a team of lanes each; longer
// rows take a CTA of whole warps, up to kPlanMaxThreads (a 32 KB slice of x).
constexpr int kShortRowCta = 128;
constexpr int kPlanMaxThreads = 512;
// Past one CTA, sm_90 spreads a row over a cluster of up to 16 CTAs (512 KB
// of x: fp32 131072, 16-bit 262144), the row still read once.  Past that,
// or before sm_90, or where the cluster cannot be scheduled, one CTA of
// kLoopThreads takes a row in two passes over global memory (reduce, then
// re-read and write; the first pass marks its lines evict-last in L2 so the
// second can hit there).
constexpr int kPlanMaxCluster = 16;
constexpr int kLoopThreads = 512;

constexpr int accesses_per_thread(int vec, int elem_bytes) {
  const int n = kThreadBytes / (vec * elem_bytes);
  return n < 1 ? 1 : n > kMaxAccesses ? kMaxAccesses : n;
}

inline int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// The two-pass strategy (also for a row whose cluster cannot be scheduled).
inline Plan loop_plan(Plan p) {
  p.strategy = Strategy::kLoop;
  p.threads_per_row = p.cta_threads = kLoopThreads;
  p.cluster = 1;
  return p;
}

inline Plan make_plan(int64_t cols, int elem_bytes, bool vec_ok, int cc_major) {
  Plan p;
  p.vec = vec_ok ? 16 / elem_bytes : 1;
  p.accesses = accesses_per_thread(p.vec, elem_bytes);
  const int64_t accesses = (cols + p.vec - 1) / p.vec;
  const int64_t threads = (accesses + p.accesses - 1) / p.accesses;
  if (threads <= 32) {
    p.threads_per_row = next_pow2(threads);
    p.cta_threads = kShortRowCta;
    return p;
  }
  const int64_t ctas = (threads + kPlanMaxThreads - 1) / kPlanMaxThreads;
  if (ctas == 1 || (cc_major >= 9 && ctas <= kPlanMaxCluster)) {
    p.threads_per_row = int(((threads + ctas - 1) / ctas + 31) / 32 * 32);
    p.cta_threads = p.threads_per_row;
    if (ctas > 1) {
      p.strategy = Strategy::kCluster;
      p.cluster = int(ctas);
    }
    return p;
  }
  return loop_plan(p);
}

}  // namespace fln::cuda::softmax_kernels
