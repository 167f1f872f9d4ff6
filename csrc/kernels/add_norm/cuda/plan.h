// The launch rule of the fused pre-norm kernels (kernel.cuh), forward and
// backward: a pure function of the row's size in bytes and the device.
#pragma once
#include <cstdint>

#include "../../cuda/device_info.h"

namespace fln::cuda::add_norm {

enum class Strategy { kRow, kCluster, kGroup, kSplit };

struct Plan {
  Strategy strategy = Strategy::kRow;
  int vec = 1;               // elements per access: 16 bytes where every pointer and stride allows
  int accesses = 1;          // accesses a thread holds per row (the kernel's NV)
  int threads_per_row = 1;   // of one CTA
  int cta_threads = 128;
  int cluster = 1;           // kCluster, kGroup: CTAs on a row
  int chunks = 1;            // kSplit: CTAs on a row, each reading its slice twice
};

// A thread's slice of a row, held in registers: 64 bytes of x in the forward
// (four 16-byte loads in flight at 16-bit and fp32, with as many of the
// residual, all issued before the first store), in up to 96 registers (capped
// at 64 it spills and keeps fewer loads in flight).  Cluster rows (a persistent
// grid) also hold the next row's x and residual, in up to 128 registers: their
// CTAs of 256-512 threads mostly fit once an SM at 96 too. The backward holds 8
// elements a thread, with their fp32 dweight / dbias partials and the next
// row's inputs (prefetched), in up to 96 registers where a thread's inputs are
// 16 bytes (16-bit), 128 otherwise: capped lower, it spills in every row, and
// 16-bit short rows at 128 keep fewer CTAs an SM.  Backward rows past one CTA
// keep 8 elements a thread where a cluster of up to 16 CTAs holds them (16-bit
// threads of 16 elements, at 128 registers, spilled 40-80 bytes in cluster
// rows); elsewhere they take 32 bytes of each input a thread first.
constexpr int kFwdThreadBytes = 64;
constexpr int kFwdRegs = 96;
constexpr int kFwdClusterRegs = 128;
constexpr int kBwdThreadElems = 8;
constexpr int kBwdLongRowBytes = 32;
// Backward rows of whole warps whose threads hold 16 bytes each of h and dy
// (16-bit, 8 elements) go in pairs: one reduction of four sums, so one barrier
// and one cluster push, serves two rows, whose loads are in flight two rows
// ahead.  At 8 elements a thread those per-row costs, not the bytes, set the
// rate.  The two rows' buffers take 128 registers (112 spilled 68 bytes), so
// the launcher pairs only where that keeps as many CTAs resident as one row at
// 96 (CTAs of 9-10 warps fit twice an SM at 96, once at 128).  Rows of one CTA
// pair as clusters of one CTA.
constexpr bool bwd_row_pairs(int x_bytes, int h_bytes, int elems, int vec) {
  return vec > 1 && (x_bytes + h_bytes) * elems <= 32;
}
constexpr int bwd_registers(int x_bytes, int elems, bool pairs) { return pairs || x_bytes * elems > 16 ? 128 : 96; }
// Backward rows walked one at a time have the next row's h and dy and this
// row's dh in flight while a row reduces.  Where those come to fewer bytes an
// SM (resident CTAs x threads x bytes a thread) than the SM's share of the
// DRAM bandwidth moves in a loaded DRAM latency (Little's law), each thread
// also asks L2 for the row after; with more in flight the prefetch only adds
// traffic.
constexpr int64_t kDramLatencyNs = 1000;
inline int64_t sm_dram_bytes(const DeviceInfo& dev, int64_t ns) { return dev.dram_bytes_per_us * ns / 1000 / dev.sm_count; }
inline bool bwd_prefetch(int64_t ctas_per_sm, int cta_threads, int bytes_ahead, const DeviceInfo& dev) {
  return ctas_per_sm * cta_threads * bytes_ahead < sm_dram_bytes(dev, kDramLatencyNs);
}
// Forward rows a CTA takes once (no walk) load their x and residual, then
// reduce and store with nothing in flight.  Where the rows resident CTAs hold
// come to fewer bytes an SM than its DRAM share over kFwdPrefetchNs, each CTA
// also asks L2 for the rows of the CTA a quarter round of resident CTAs later:
// further ahead, L2 evicts the lines before they are used.  Teams whose access
// spans less than a 128-byte line take none: each line is asked for twice.
constexpr int64_t kFwdPrefetchNs = 2500;
constexpr int kFwdPrefetchRoundParts = 4;
constexpr int kLineBytes = 128;
inline bool fwd_prefetch(int64_t ctas_per_sm, int64_t cta_row_bytes, int team_access_bytes, const DeviceInfo& dev) {
  return team_access_bytes >= kLineBytes && ctas_per_sm * cta_row_bytes < sm_dram_bytes(dev, kFwdPrefetchNs);
}
constexpr int kMaxAccesses = 8;
// Short rows share a CTA of this many threads, a team of lanes each; longer
// rows take a CTA of whole warps, up to kPlanMaxThreads.
constexpr int kShortRowCta = 128;
constexpr int kPlanMaxThreads = 512;
// Past one CTA, sm_90 spreads a row over a cluster of up to 16 CTAs; past
// that (or before sm_90) over CTAs that meet through global memory.
constexpr int kPlanMaxCluster = 16;

constexpr int accesses_per_thread(bool bwd, int vec, int elem_bytes, bool long_row = false) {
  const int short_row = kBwdThreadElems / vec, long_row_n = kBwdLongRowBytes / (vec * elem_bytes);
  const int n = !bwd ? kFwdThreadBytes / (vec * elem_bytes)
                     : long_row && long_row_n > short_row ? long_row_n : short_row;
  return n < 1 ? 1 : n > kMaxAccesses ? kMaxAccesses : n;
}

inline int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

inline Plan make_plan(int64_t cols, int elem_bytes, bool vec_ok, bool bwd, int cc_major) {
  Plan p;
  p.vec = vec_ok ? 16 / elem_bytes : 1;
  p.accesses = accesses_per_thread(bwd, p.vec, elem_bytes);
  const int64_t accesses = (cols + p.vec - 1) / p.vec;
  int64_t threads = (accesses + p.accesses - 1) / p.accesses;
  const bool cluster_holds = cc_major >= 9 && threads <= int64_t(kPlanMaxThreads) * kPlanMaxCluster;
  if (bwd && threads > kPlanMaxThreads && !cluster_holds) {
    p.accesses = accesses_per_thread(bwd, p.vec, elem_bytes, true);
    threads = (accesses + p.accesses - 1) / p.accesses;
  }
  if (threads <= 32) {
    p.threads_per_row = next_pow2(threads);
    p.cta_threads = kShortRowCta;
    return p;
  }
  const int64_t ctas = (threads + kPlanMaxThreads - 1) / kPlanMaxThreads;
  p.threads_per_row = int(((threads + ctas - 1) / ctas + 31) / 32 * 32);
  p.cta_threads = p.threads_per_row;
  if (ctas == 1) return p;
  if (cc_major >= 9 && ctas <= kPlanMaxCluster) {
    p.strategy = Strategy::kCluster;
    p.cluster = int(ctas);
  } else {
    p.strategy = Strategy::kSplit;
    p.chunks = int(ctas);
  }
  return p;
}

// Forward rows of one CTA take a CTA each, unless fewer than
// kFwdMinRowCtas of those CTAs fit an SM: then too few rows' loads are in
// flight while rows reduce, so the rows walk a persistent grid that issues
// each next row's loads before this row is reduced: the cluster strategy
// with clusters of one CTA (docs/design.md has the measurements).
constexpr int kFwdMinRowCtas = 4;
inline bool one_cta_row(const Plan& p) { return p.strategy == Strategy::kRow && p.threads_per_row == p.cta_threads; }
inline Plan walking_plan(Plan p) {
  p.strategy = Strategy::kCluster;
  p.cluster = 1;
  return p;
}

// Forward groups of the cluster strategy (clusters, or walking CTAs) with at
// least kTicketMinRows rows each take rows past their first three from a
// counter (kernel.cuh): zeroing it costs a memset, about a microsecond.
constexpr int64_t kTicketMinRows = 16;
inline bool fwd_row_tickets(int64_t rows, int64_t groups) {
  return rows >= kTicketMinRows * groups && rows < INT32_MAX;
}

// Rows past a cluster (16 CTAs, or before sm_90 past one CTA) take a group of
// the same CTAs, all resident at once (a cooperative launch), which trade the
// row's statistics through global memory and walk rows as clusters do: one
// read of each input.  Where a row's CTAs cannot all be resident, or with
// fp64 statistics, the split reads its inputs twice.
inline Plan group_plan(Plan p) {
  p.strategy = Strategy::kGroup;
  p.cluster = p.chunks;
  p.chunks = 1;
  return p;
}

// The split strategy for a row whose cluster cannot be scheduled.
inline Plan split_plan(Plan p) {
  p.strategy = Strategy::kSplit;
  p.chunks = p.cluster;
  p.cluster = 1;
  return p;
}

}  // namespace fln::cuda::add_norm
