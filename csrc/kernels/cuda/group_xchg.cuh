// The exchange of a row group (sm_90+): G CTAs of a persistent,
// cooperatively launched grid own one row, each CTA a slice, and trade the
// row's sums through global memory, where a thread-block cluster (at most 16
// CTAs) would use distributed shared memory.  Each CTA has whole warps of
// compute threads and one exchange warp, which publishes the CTA's two sums
// of a row and collects the group's.  The backward (bwd_group_kernel.cuh) and
// the forward (fwd_group_kernel.cuh) share it.
#pragma once
#include "common.cuh"

namespace fln::cuda {

constexpr int kMaxGroupCtas = 128;  // four slots a lane of the exchange warp

// The compute threads (tpr, whole warps, at most kMaxCtaThreads) and the
// CTAs of a group; the grid is ngroups * size CTAs of tpr + 32 threads.
struct GroupLayout {
  int tpr;
  int size;
};

// A CTA's place among the row groups: its rank in its group of G CTAs, its
// group, and the rows the group walks (group, group + ngroups, ...).
struct GroupPlace {
  int rank;
  int64_t group, ngroups;
  int64_t rows;  // rows of the walk
  __device__ __forceinline__ int64_t row(int64_t j) const { return group + j * ngroups; }
};

__device__ __forceinline__ GroupPlace group_place(int G, int64_t rows) {
  GroupPlace g;
  g.rank = int(blockIdx.x) % G;
  g.group = blockIdx.x / G;
  g.ngroups = gridDim.x / G;
  g.rows = g.group < rows ? (rows - g.group + g.ngroups - 1) / g.ngroups : 0;
  return g;
}

// The hand-off inside a CTA between its compute warps and its exchange
// warp, for row j of the walk in buffer j % NB (a row's buffers are reused
// NB rows later; group_exchange_walk bounds the distance): each compute
// warp puts its pair (two sums; the forward's mean and M2) and arrives on
// sums_ready; the exchange warp waits for them all, trades the CTA's pair
// with the group, puts the row's pair in totals and arrives on
// totals_ready, which the compute warps wait for.  Phases of row j: parity
// (j / NB) & 1.
template <int NB>
struct GroupHandoff {
  float warp_sums[NB][kMaxCtaThreads / 32][2];
  float totals[NB][2];
  alignas(8) uint64_t sums_ready[NB], totals_ready[NB];

  // Thread 0; a CTA barrier must follow before either side uses it.
  __device__ void init(int nwarps) {
    for (int b = 0; b < NB; ++b) {
      mbar_init(&sums_ready[b], uint32_t(nwarps));
      mbar_init(&totals_ready[b], 1);
    }
  }
  // A compute warp's lane 0.
  __device__ void put_sums(int64_t j, int warp, float s0, float s1) {
    const int b = int(j % NB);
    warp_sums[b][warp][0] = s0;
    warp_sums[b][warp][1] = s1;
    mbar_arrive(smem_addr(&sums_ready[b]));
  }
  // The exchange warp: returns row j's per-warp sums (buffer j % NB).
  __device__ const float (*wait_sums(int64_t j))[2] {
    const int b = int(j % NB);
    mbar_wait(smem_addr(&sums_ready[b]), uint32_t(j / NB) & 1u);
    return warp_sums[b];
  }
  // The exchange warp's lane 0.
  __device__ void put_totals(int64_t j, float t0, float t1) {
    const int b = int(j % NB);
    totals[b][0] = t0;
    totals[b][1] = t1;
    mbar_arrive(smem_addr(&totals_ready[b]));
  }
  // A compute thread: returns row j's group totals.
  __device__ const float* wait_totals(int64_t j) {
    const int b = int(j % NB);
    mbar_wait(smem_addr(&totals_ready[b]), uint32_t(j / NB) & 1u);
    return totals[b];
  }
};

// A compute thread's columns of a weight (kOne: 1 where absent) or bias (0
// where absent) array in fp32 registers, unpacked once for the whole walk
// (16-bit weights unpacked twice an element a row ran slower):
// out[i * VEC + k] is column col(i) + k.
template <typename W, int NV, int VEC, bool kOne, typename Col>
__device__ __forceinline__ void group_params(const void* arr, Col col, int64_t n, float (&out)[NV * VEC]) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    Frag<W, VEC> f;
    if (arr && col(i) < n) f.load(static_cast<const W*>(arr) + col(i));
    else if (kOne) f.one();
    else f.zero();
#pragma unroll
    for (int k = 0; k < VEC; ++k) out[i * VEC + k] = f.get(k);
  }
}

// Global exchange memory, zeroed before the launch: slots[group][buffer][CTA],
// each two 64-bit words (first sum, tag) and (second sum, tag), tag = the
// row's index in the group's walk + 1.  A word is written and read as one
// single-copy-atomic access, so a reader that sees a row's tag in both words
// has that row's sums: no fence and no counter, one store to publish and
// one load (or a few, while it is not there yet) to collect, as in NCCL's
// LL protocol.  The loads are relaxed: as acquires each cost an L1
// invalidation (CCTL.IVALL) and they were issued one after another.  The one
// ordering the protocol needs, that a CTA rewrites a buffer only after every
// CTA's loads of it have returned, comes from its store being issued only
// once the tags it polled (which other CTAs stored after those loads) were
// seen.  A group cycles through kGroupXchgBufs buffers (group_exchange_walk
// says why that is enough).
struct GroupXchg {
  unsigned long long* slots;
};
constexpr int kGroupXchgBufs = 8;

__device__ __forceinline__ void st_relaxed_gpu_v2(unsigned long long* p, unsigned long long a,
                                                  unsigned long long b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("st.relaxed.gpu.global.v2.b64 [%0], {%1, %2};\n" ::"l"(p), "l"(a), "l"(b) : "memory");
#endif
}

__device__ __forceinline__ void ld_relaxed_gpu_v2(const unsigned long long* p, unsigned long long& a,
                                                  unsigned long long& b) {
  a = b = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.relaxed.gpu.global.v2.b64 {%0, %1}, [%2];\n" : "=l"(a), "=l"(b) : "l"(p) : "memory");
#endif
}

// The exchange warp's lane 0: publish this CTA's pair of walk row j in
// its slot of the row's buffer (one store of two tagged words).
__device__ __forceinline__ void group_publish(unsigned long long* slots, int G, int rank, int64_t j, float c0,
                                              float c1) {
  const unsigned long long tag = (unsigned long long)(j + 1) << 32;
  st_relaxed_gpu_v2(&slots[(j % kGroupXchgBufs * G + rank) * 2], tag | __float_as_uint(c0), tag | __float_as_uint(c1));
}

// The whole exchange warp: poll the G slots of walk row j until every one
// carries its tag.  Lane l ends with the sums of CTAs l, l + 32, ... in v[0],
// v[1], ... (zeros past G).
__device__ __forceinline__ void group_poll(const unsigned long long* slots, int G, int64_t j, int lane,
                                           float2 (&v)[kMaxGroupCtas / 32]) {
  const unsigned tag = unsigned(j + 1);
  const unsigned long long* row_slots = &slots[j % kGroupXchgBufs * G * 2];
  for (;;) {
    bool ok = true;
#pragma unroll
    for (int h = 0; h < kMaxGroupCtas / 32; ++h) {
      const int c = lane + 32 * h;
      v[h] = make_float2(0.f, 0.f);
      if (c < G) {
        unsigned long long a, b;
        ld_relaxed_gpu_v2(&row_slots[c * 2], a, b);
        ok = ok && unsigned(a >> 32) == tag && unsigned(b >> 32) == tag;
        v[h] = make_float2(__uint_as_float(unsigned(a)), __uint_as_float(unsigned(b)));
      }
    }
    if (__all_sync(0xffffffffu, ok)) break;
  }
}

// The exchange warp's walk over its group's rows_g rows: publish row j, then
// collect row j + 1 - LAG, so a row's totals are collected while the compute
// warps sum the LAG - 1 rows after it, and before they need them LAG rows
// later.  A CTA publishing row j has collected row j - LAG, and every CTA had
// published that row after collecting row j + 1 - 2 LAG: all have read the
// slots of rows up to there, so row j may take the buffer of row j - 2 LAG.
template <int LAG, typename Publish, typename Collect>
__device__ __forceinline__ void group_exchange_walk(int64_t rows_g, Publish publish, Collect collect) {
  static_assert(kGroupXchgBufs >= 2 * LAG, "a slot is rewritten only after every CTA has read it");
  for (int64_t j = 0; j < rows_g; ++j) {
    publish(j);
    if (j + 1 >= LAG) collect(j + 1 - LAG);
  }
  for (int64_t j = rows_g + 1 - LAG > 0 ? rows_g + 1 - LAG : 0; j < rows_g; ++j) collect(j);
}

}  // namespace fln::cuda
