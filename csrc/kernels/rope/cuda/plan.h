// The launch rule of the rotary kernel (kernel.cuh): a pure function of the
// head size, the rows (heads of q and k) of one token and the element size.
#pragma once
#include <cstdint>

namespace fln::cuda::rotary {

// A thread moves one unit of a head: two accesses of 16 bytes (vec elements
// each; 1 element where a pointer, stride or size is not a multiple), which
// hold whole rotation pairs, so no data crosses threads.  It holds
// kRowsInFlight heads of one token (4 x 32 = 128 bytes in flight at 16 bytes)
// with the unit's cos and sin, loaded once per token and reused for each of
// those heads; a CTA of kCtaThreads covers whole tokens where they fit.
constexpr int kCtaThreads = 256;
constexpr int kRowsInFlight = 4;
constexpr int kMinCtas = 2;  // CTAs an SM the registers allow: up to 128 registers a thread

struct Plan {
  int vec = 1;           // elements per access
  int threads_x = 1;     // over the units of a head
  int threads_y = 1;     // over the heads of a token, kRowsInFlight each
  int threads_z = 1;     // over tokens
  int64_t grid = 0;      // CTAs; each loops over its tokens grid-stride
};

constexpr int64_t kMaxGrid = 0x7fffffff;

// Tokens ahead a thread prefetches into L2: the tokens of half a round of
// resident CTAs.  The rows a thread holds in registers alone keep too few
// bytes in flight to cover DRAM latency at full bandwidth; half a round ahead
// lands in L2 before the CTAs that read it start, and stays a few MB, far
// below L2's size.
inline int64_t prefetch_tokens(int64_t resident_ctas, int threads_z) { return resident_ctas * threads_z / 2; }

inline Plan make_plan(int64_t tokens, int64_t rows, int64_t head_dim, int elem_bytes, bool vec_ok) {
  Plan p;
  p.vec = vec_ok ? 16 / elem_bytes : 1;
  const int64_t units = head_dim / (2 * p.vec);
  p.threads_x = int(units < kCtaThreads ? units : kCtaThreads);
  if (p.threads_x < 1) p.threads_x = 1;
  const int64_t want_y = (rows + kRowsInFlight - 1) / kRowsInFlight, max_y = kCtaThreads / p.threads_x;
  p.threads_y = int(want_y < max_y ? want_y : max_y);
  if (p.threads_y < 1) p.threads_y = 1;
  p.threads_z = kCtaThreads / (p.threads_x * p.threads_y);
  if (p.threads_z < 1) p.threads_z = 1;
  const int64_t groups = (tokens + p.threads_z - 1) / p.threads_z;
  p.grid = groups < kMaxGrid ? groups : kMaxGrid;
  return p;
}

}  // namespace fln::cuda::rotary
