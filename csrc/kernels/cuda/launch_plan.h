// The one launch heuristic for the CUDA kernels: a pure function of the
// problem size, the dtype and the device, so it is unit-tested on the host.
#pragma once
#include <cstdint>

#include "device_info.h"

namespace fln::cuda {

struct Plan {
  bool registers = true;  // register kernels; false: looped fallback kernels
  int vec = 1;            // elements per access
  int nv = 1;             // accesses per thread per row
  int tpr = 1;            // threads of a CTA per row (a power of two up to 32, else whole warps)
  int csize = 1;          // CTAs of a cluster per row
  int cta_threads = 128;  // threads per CTA
  int rows_per_cta = 1;
  int64_t groups = 0;     // row groups (CTAs, or clusters) in the grid, before any persistence cap
  bool cache_wb = false;  // forward clusters: weight and bias slices kept in shared memory
  bool x_smem = false;    // forward: the row is kept in shared memory, not registers
  bool stage_x = false;   // forward weight-cache clusters: the next row is staged in shared memory
  bool group = false;     // rows past a cluster: csize CTAs exchange sums in global memory
  bool short_rows = false;  // forward rows of one warp at most: fwd_rows_kernel.cuh
  int rows_per_thread = 1;  // short_rows: rows each thread holds (same columns)
  bool reread = false;      // forward: one CTA a row reads it twice (fwd_reread_kernel.cuh)
  bool exact = false;       // reread: nv accesses a thread cover the row exactly (the straight-line variant)
};

// Forward rows of at most 32 lanes of kShortRowAccesses 16-byte accesses
// (2 KB: bf16 1024, fp32 512) take the short-row kernel
// (fwd_rows_kernel.cuh): tpr lanes a row, a power of two up to 32, nv
// accesses a lane (as many as the row needs: 3 at bf16 768, whose fourth
// access would idle if nv were a power of two), and kShortRowAccesses / nv
// rows a thread (rounded down), in CTAs of kShortRowCta.  RMSNorm spreads a
// row over as many lanes as it has accesses (up to 32), so that a thread's
// loads of weight serve up to four rows.  LayerNorm sums each row twice
// (mean, then variance), a shuffle a butterfly level each: it takes as few
// lanes as hold the row in kShortRowAccesses accesses, two levels fewer a sum
// at bf16 256 (8 lanes of 4 accesses, against 32 lanes of one), at the price
// of its weight and bias loaded for every row.  Fewer lanes measured faster
// for LayerNorm (bf16, fp32; fp16 256 lost a little) and slower for RMSNorm.
constexpr int kShortRowAccesses = 4;
constexpr int kShortRowCta = 128;

// Forward rows kept in shared memory (Plan::x_smem).  On sm_90 the rows of
// 16-80 KB of 2- and 4-byte types are re-read instead (kRereadMaxRow; and
// LayerNorm's 16-bit rows from 14 KB, reread_min_row; and rows of 10-21 KB
// that two accesses a thread cover exactly, reread_pair_fits), except one-CTA
// register rows and the longer rows of staged clusters; what follows decides
// the rest (rows past 80 KB, fp64, sm_80).  A register plan keeps at most 64K
// registers of 64 per thread busy on an SM, and CTAs of 384 or 448 threads
// leave a quarter or an eighth of that idle: too few bytes of rows in flight.
// Rows of at least min_row_bytes whose register plan keeps less than
// max_inflight bytes in flight per SM are held in shared memory instead.
// Each CTA holds at most slice_bytes of its row (a cluster past that), with
// about nv 16-byte accesses a thread.  min_row_bytes is 16 KB: rows of
// 12-14 KB ran faster in registers, rows of 24 KB did not.  A 32 KB slice ran
// slower.  A register cluster that stages the next row counts it in flight
// too (register_inflight), so bf16 24576 and 49152 stay staged clusters,
// which measured faster there.  Rows longer than one_cta_min_row that fit one
// slice take one CTA whatever the register plan, unless clusters exist
// (sm_90) and the row's weight and bias come to more bytes than the row: the
// one CTA reads them from L1/L2 for every row, and the register plan (a
// cluster with the weight cache for bf16 32768, one 512-thread CTA for fp32
// 16384) measured faster there.
struct XSmemTuning {
  int64_t min_row_bytes = 16 * 1024;
  int64_t max_inflight = 64 * 1024;
  int64_t one_cta_min_row = 32 * 1024;
  int64_t slice_bytes = 64 * 1024;
  int nv = 8;
};
constexpr int kXSmemMaxNv = 32;

inline int64_t x_smem_bytes(int cta_threads, int nv) { return int64_t(cta_threads) * nv * 16; }

// Shared memory of the forward's weight and bias cache (Plan::cache_wb);
// w_bytes is the weight's element size, 0 without weight and bias, and
// w_arrays how many of the two the forward reads.  With Plan::stage_x,
// x_smem_bytes(cta_threads, nv) more hold the next row, and kTicketSlotBytes
// the row tickets' token (so a launch may pass kWbCacheMax by those 16).
constexpr int64_t wb_cache_smem(int cta_threads, int nv, int vec, int w_bytes, int w_arrays) {
  return w_arrays * int64_t(cta_threads) * nv * vec * w_bytes;
}

// Accesses of `vec` elements a thread may hold per row.  Forward: 64 bytes of
// x in the storage dtype (four 16-byte loads in flight); `long_row` (rows
// that would otherwise span a cluster, see register_plan) gives 4- and 8-byte
// types 128 bytes.  16-bit types stay at 64 bytes (32 elements): at 128 bytes
// a thread holds 64 elements and spills, and bf16 65536 ran slower than at 64
// bytes with the weight cache (Plan::cache_wb).
// Backward: 8 elements each of x and dy (16 bytes of a 16-bit type, 32 of
// fp32; 32 bytes of 8-byte types); `long_row` doubles that for 2- and 4-byte
// types.  16-bit rows of up to 4096 elements ran faster at 8 elements a
// thread under the prefetch pipe, 1024 threads an SM, than at 16.  The scalar
// path (vec 1) keeps at most 16 (forward) or 8 (backward) elements: each
// takes a whole register.
constexpr int max_accesses(bool bwd, int vec, int elem_bytes, bool long_row = false) {
  const int bwd_bytes = (elem_bytes == 2 ? 16 : 32) * (long_row && elem_bytes <= 4 ? 2 : 1);
  const int n = (bwd ? bwd_bytes : long_row && elem_bytes >= 4 ? 128 : 64) / (vec * elem_bytes);
  const int cap = vec == 1 ? (bwd ? 8 : 16) : n;
  return n < 1 ? 1 : n < cap ? n : cap;
}

// Shared memory of the backward register kernel: a (dweight, dbias) pair of
// accumulators per element a thread holds.
constexpr int64_t bwd_partials_smem(int cta_threads, int nv, int vec, int acc_bytes) {
  return int64_t(cta_threads) * nv * vec * 2 * acc_bytes;
}

// Shared memory of the backward's staged pipes: kBwdStages (bwd_kernel.cuh)
// iterations of `rows` rows of x and dy, 16-byte accesses; the partials
// reuse it for the final merge, so a launch takes the larger of the two.
constexpr int64_t bwd_stage_smem(int stages, int rows, int cta_threads, int nv) {
  return int64_t(stages) * rows * cta_threads * nv * 2 * 16;
}

// CTAs of a row group at most (Plan::group: bwd_group_kernel.cuh,
// fwd_group_kernel.cuh), the bytes of x (and as many of dy) of a row each
// holds, and the elements each thread holds: with several rows of them in
// shared memory, a row's output can trail its sums by a few rows.
constexpr int kMaxGroup = 128;
constexpr int64_t kGroupSliceBytes = 16 * 1024;
constexpr int kGroupElems = 16;
constexpr int group_cta_max(int nv) { return int(kGroupSliceBytes / (int64_t(nv) * 16)); }

// At most this much, so that two CTAs still share an SM.
constexpr int64_t kWbCacheMax = 100 * 1024;

// Staged clusters (Plan::stage_x) of a persistent grid of `resident` clusters
// take their rows past the first three from a counter (RowLayout::row_ticket,
// fwd_kernel.cuh) where there are at least kTicketMinRows rows a cluster: a
// static schedule waits for its slowest cluster, while the counter's zeroing
// and the tickets cost about a microsecond a call, which shows where clusters
// have few rows.  Ticket numbers are ints.
constexpr int64_t kTicketMinRows = 16;
// Dynamic shared memory of the row tickets' token slots (after the stage's).
constexpr int64_t kTicketSlotBytes = 16;
inline bool use_row_tickets(const Plan& p, int64_t resident) {
  return p.stage_x && p.csize > 1 && p.groups >= kTicketMinRows * resident && p.groups < INT32_MAX;
}

// Threads per CTA at most (kMaxCtaThreads in common.cuh): two CTAs share an
// SM, so one's loads overlap the other's reductions.
constexpr int kMaxCta = 512;

inline int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// The shared-memory forward plan (Plan::x_smem), or registers == false if
// the row does not fit it.
inline Plan x_smem_plan(int64_t rows, int64_t cols, int elem_bytes, const DeviceInfo& dev, const XSmemTuning& xs) {
  Plan p;
  p.x_smem = true;
  p.vec = 16 / elem_bytes;
  const int64_t nvec = (cols + p.vec - 1) / p.vec;
  const int64_t per_slice = xs.slice_bytes / 16;
  const int64_t cs = (nvec + per_slice - 1) / per_slice;
  if (dev.cc_major < 8 || (cs > 1 && (dev.cc_major < 9 || cs > 16))) {
    p.registers = false;
    return p;
  }
  p.csize = next_pow2(cs);
  const int64_t per_cta = (nvec + p.csize - 1) / p.csize;
  int64_t warps = (per_cta + int64_t(xs.nv) * 32 - 1) / (int64_t(xs.nv) * 32);
  if (warps > kMaxCta / 32) warps = kMaxCta / 32;
  p.tpr = p.cta_threads = int(warps * 32);
  p.nv = int((per_cta + p.tpr - 1) / p.tpr);
  p.groups = rows;
  p.registers = p.nv <= kXSmemMaxNv;
  return p;
}

// Bytes of rows a register plan keeps in flight per SM, if registers are what
// bounds it: 64 registers a thread (the kernels' launch bounds) of 64K; a
// plan that stages the next row (Plan::stage_x) holds two rows.
inline int64_t register_inflight(const Plan& p, int64_t cols, int elem_bytes) {
  int64_t ctas = 65536 / (64 * int64_t(p.cta_threads));
  if (ctas > 32) ctas = 32;
  return ctas * p.rows_per_cta * (cols * elem_bytes / p.csize) * (p.stage_x ? 2 : 1);
}

// A row group (Plan::group): csize CTAs of whole warps, as few as cover the
// row at kGroupElems elements a thread and at most group_cta_max(nv) threads
// a CTA (kGroupSliceBytes of x).
inline Plan group_layout(int64_t rows, int64_t nvec, int vec) {
  Plan p;
  p.group = true;
  p.vec = vec;
  const int nv = p.nv = kGroupElems / vec;
  const int64_t threads = (nvec + nv - 1) / nv;
  p.csize = int((threads + group_cta_max(nv) - 1) / group_cta_max(nv));
  const int64_t per_cta = (threads + p.csize - 1) / p.csize;
  p.tpr = p.cta_threads = int((per_cta + 31) / 32 * 32);
  p.groups = rows;
  return p;
}

inline Plan short_row_layout(int64_t rows, int64_t nvec, int vec, bool two_sums) {
  Plan p;
  p.short_rows = true;
  p.vec = vec;
  const int64_t lanes = two_sums ? (nvec + kShortRowAccesses - 1) / kShortRowAccesses : nvec;
  p.tpr = next_pow2(lanes < 32 ? lanes : 32);
  p.nv = int((nvec + p.tpr - 1) / p.tpr);
  p.rows_per_thread = kShortRowAccesses / p.nv;
  p.cta_threads = kShortRowCta;
  p.rows_per_cta = kShortRowCta / p.tpr * p.rows_per_thread;
  p.groups = (rows + p.rows_per_cta - 1) / p.rows_per_cta;
  return p;
}

// The re-reading forward (Plan::reread, fwd_reread_kernel.cuh): one CTA of
// whole warps a row, at most kRereadCta threads, kRereadAccesses 16-byte
// accesses a thread where that many threads cover the row.  Forward rows of
// 16-byte accesses of 2- and 4-byte types from XSmemTuning::min_row_bytes
// (reread_min_row, below) to kRereadMaxRow take it on sm_90, except where the
// register plan is one CTA that keeps max_inflight bytes in flight (bf16
// 16384, fp32 8192, and bf16 8192 with an fp32 weight: there the register
// rows ran ahead; bf16 8192 and fp32 4096 with weights of x's dtype take the
// pair rows, below), unless reread_despite_inflight (below), and except the
// longer rows of staged clusters (reread_max_row, below).  Rows of 10-21 KB
// that two accesses a thread cover exactly take it whatever their register
// plan (reread_pair_fits, below).  sm_90 only: sm_80 has 192 KB of L1 and
// shared memory, not 256, and newer GPUs run the kernel from compute_90 PTX,
// whose JIT ignores the launch bounds' CTAs an SM.  Up to kRereadMaxRow the
// rows of an SM's two CTAs and the weight stay in L1, so the second walk is
// nearly free; past it the second walk goes to L2 (docs/design.md has the
// measurements).
constexpr int kRereadCta = 1024;
constexpr int kRereadAccesses = 4;
constexpr int64_t kRereadMaxRow = 80 * 1024;
// The looped walk's CTA (reread_layout) takes kRereadAccesses a thread, or
// fewer where CTAs of at most kRereadFillMaxCta threads then fill more of an
// SM's kRereadSmThreads thread slots: bf16 12288 and fp32 6144 run 512
// threads of 3 accesses (four CTAs, 2048 threads), not 384 of 4 (five, 1920).
// Larger CTAs leave fewer of them an SM to overlap one another's reductions.
constexpr int kRereadFillMaxCta = 512;

// One-CTA register rows that keep max_inflight bytes in flight an SM stay in
// registers, except 16-bit rows of kMaxCta threads (two CTAs an SM: bf16
// 16384), which ran faster re-read with the L2 hints both kernels carry
// (LayerNorm bf16 level).  LN bf16 8192 (256 threads, four CTAs an SM) and LN
// fp32 8192 ran slower re-read.
inline bool reread_despite_inflight(const Plan& r, int elem_bytes) {
  return elem_bytes == 2 && r.cta_threads == kMaxCta;
}

// The longest row re-read where the register plan is a staged cluster
// (Plan::stage_x; measured where its clusters take row tickets) and the
// weight and bias are of x's dtype: the rows of two CTAs an SM and their
// weight and bias must stay in L1 for the second walk, and past that the
// staged cluster runs ahead: past 48 KB where LayerNorm's weight and bias
// outweigh the row, past 64 KB otherwise.  16-bit x with fp32 weight and bias
// stays re-read up to kRereadMaxRow: its staged cluster ran far behind.
constexpr int64_t kRereadMaxStagedRow = 64 * 1024;
constexpr int64_t kRereadMaxStagedRowParams = 48 * 1024;
inline int64_t reread_max_row(const Plan& r, int elem_bytes, int w_bytes, bool params_outweigh_row) {
  if (!r.stage_x || w_bytes > elem_bytes) return kRereadMaxRow;
  return params_outweigh_row ? kRereadMaxStagedRowParams : kRereadMaxStagedRow;
}

// The shortest row re-read: XSmemTuning::min_row_bytes, except 16-bit rows
// whose weight and bias (LayerNorm's, of x's dtype) outweigh the row, from
// kRereadMinRowParams: their register CTA (224 threads at bf16 7168, 256 past
// it) keeps 56-64 KB in flight an SM, and they ran faster re-read; every
// other row measured under 16 KB ran slower re-read.
constexpr int64_t kRereadMinRowParams = 14 * 1024;
inline int64_t reread_min_row(int elem_bytes, int w_bytes, bool params_outweigh_row, const XSmemTuning& xs) {
  const bool params_16bit = elem_bytes == 2 && w_bytes == elem_bytes && params_outweigh_row;
  return params_16bit && kRereadMinRowParams < xs.min_row_bytes ? kRereadMinRowParams : xs.min_row_bytes;
}

// Rows that kRereadPairAccesses 16-byte accesses a thread cover exactly take
// the re-read kernel's straight-line variant (fwd_reread_kernel.cuh, NV = 2),
// one CTA of cols / (2 * vec) threads a row, where at least
// kRereadPairMinCtas such CTAs share an SM and fill at least 7/8 of its
// kRereadSmThreads thread slots, and the CTA has at least kRereadPairMinCta
// threads: rows of 10-21 KB (bf16 5120-10752 and fp32 2560-5376, a multiple
// of 64 accesses, but not CTAs of 352, 416, 544 or 576 threads), with weights
// of x's dtype or none.  Like torch.compile's Triton kernels (one
// straight-line program a row, 16 warps at RMS bf16 8192): more threads,
// fewer registers and instructions a thread than the register rows or the
// looped walk at kRereadAccesses, and measured faster than those or level.
// Two CTAs an SM, CTAs of 256 threads, and 768-thread CTAs lost or gained
// little, hence the bounds; the same layout through the looped walk lost.
constexpr int kRereadPairAccesses = 2;
constexpr int kRereadPairMinCta = 320;
constexpr int kRereadPairMinCtas = 3;
constexpr int kRereadSmThreads = 2048;  // kRereadMinCtas CTAs of kRereadCta threads an SM (32 registers)
inline bool reread_pair_fits(int64_t nvec) {
  if (nvec % (32 * kRereadPairAccesses) != 0) return false;
  const int64_t t = nvec / kRereadPairAccesses, ctas = kRereadSmThreads / t;
  return t >= kRereadPairMinCta && ctas >= kRereadPairMinCtas && ctas * t * 8 >= int64_t(kRereadSmThreads) * 7;
}

// LayerNorm's 16-bit pair rows with weight and bias (both of x's dtype) take
// kRereadQuadAccesses a thread instead, in CTAs a quarter of the row's
// accesses, where the pair's CTAs are fewer than kRereadQuadPairCtas an SM or
// leave more than 1/16 of its thread slots idle, and the quad's CTAs (whole
// warps) leave at most 1/16 idle: bf16 7168 (nine CTAs of 224 threads, not
// four of 448) and 10240 (six of 320, not three of 640), but not 5120, 6144
// (five or six pair CTAs, 1920 threads) or 8192 (four, 2048).  LayerNorm's
// write walk goes one access at a time (fwd_reread_kernel.cuh), so its pair
// CTAs hold their threads longer than RMSNorm's.  Quads measured faster at
// 7168 and 10240 (bf16, fp16) and slower at 5120-8192; RMSNorm's pair rows
// (write walk two at a time) lost as quads.  Measured in 16-bit with weight
// and bias only.
constexpr int kRereadQuadAccesses = 4;
constexpr int kRereadQuadPairCtas = 4;
inline bool reread_quad_beats_pair(int64_t nvec) {
  auto full = [](int64_t t) { return kRereadSmThreads / t * t * 16 >= int64_t(kRereadSmThreads) * 15; };
  const int64_t pair = nvec / kRereadPairAccesses, quad = nvec / kRereadQuadAccesses;
  if (kRereadSmThreads / pair >= kRereadQuadPairCtas && full(pair)) return false;
  return nvec % (32 * kRereadQuadAccesses) == 0 && full(quad);
}

// The straight-line variant runs a plan of exactly nv accesses a thread
// (kRereadPairAccesses, or kRereadQuadAccesses in 16-bit), one CTA a row (a
// grid of at most 2^31 - 1 CTAs).
inline bool reread_exact(const Plan& p, int64_t cols) {
  return p.reread && p.exact && p.tpr == p.cta_threads && int64_t(p.tpr) * p.nv * p.vec == cols &&
         p.groups < INT32_MAX;
}

inline Plan reread_straight_layout(int64_t rows, int64_t nvec, int vec, int nv) {
  Plan p;
  p.reread = p.exact = true;
  p.vec = vec;
  p.nv = nv;
  p.tpr = p.cta_threads = int(nvec / nv);
  p.groups = rows;
  return p;
}

inline Plan reread_layout(int64_t rows, int64_t nvec, int vec) {
  Plan p;
  p.reread = true;
  p.vec = vec;
  int64_t warps = (nvec + int64_t(kRereadAccesses) * 32 - 1) / (int64_t(kRereadAccesses) * 32);
  if (warps > kRereadCta / 32) warps = kRereadCta / 32;
  // Fewer accesses a thread where CTAs of at most kRereadFillMaxCta threads
  // then fill more of an SM's thread slots.
  auto filled = [](int64_t w) { return kRereadSmThreads / (w * 32) * (w * 32); };
  for (int nv = kRereadAccesses - 1; nv >= 1; --nv) {
    const int64_t w = (nvec + int64_t(nv) * 32 - 1) / (int64_t(nv) * 32);
    if (w * 32 > kRereadFillMaxCta) break;
    if (filled(w) > filled(warps)) warps = w;
  }
  p.tpr = p.cta_threads = int(warps * 32);
  p.nv = int((nvec + p.tpr - 1) / p.tpr);
  p.groups = rows;
  return p;
}

// The register-kernel layout of a row of `nvec` accesses of `vec` elements,
// at most nv_max a thread; registers == false where no CTA or cluster can
// hold it (the split path).
inline Plan register_layout(int64_t rows, int64_t nvec, int vec, int nv_max, bool bwd, const DeviceInfo& dev,
                            int w_bytes, int w_arrays, bool two_sums = false) {
  if (!bwd && vec > 1 && nvec <= 32 * kShortRowAccesses) return short_row_layout(rows, nvec, vec, two_sums);
  Plan p;
  p.vec = vec;
  // Give each thread nv_max accesses (several 16-byte loads in flight) and
  // use as many threads as that takes; past kMaxCta threads, split the row
  // over a thread-block cluster (sm_90+, at most 16 CTAs), else fall back.
  const int64_t threads = (nvec + nv_max - 1) / nv_max;
  if (threads > kMaxCta) {
    // Rows past a 16-CTA cluster (16-byte accesses of 2- and 4-byte types): a
    // row group of as many CTAs as the row needs, which exchange the row's
    // sums through global memory (Plan::group), rather than the split path,
    // which reads x (and dy) twice.  The backward's 16-bit rows past 8 CTAs
    // too: their group's CTAs are the cluster's (512 threads of 16 elements),
    // and the group fills 128 SMs where 16-CTA clusters fill 112 (measured
    // faster).
    const int64_t cs = (threads + kMaxCta - 1) / kMaxCta;
    const bool past_8 = bwd && cs > 8 && group_cta_max(kGroupElems / vec) >= kMaxCta;
    if (vec >= 4 && dev.cc_major >= 9 && (cs > 16 || past_8)) {
      const Plan g = group_layout(rows, nvec, vec);
      if (g.csize <= kMaxGroup) return g;
    }
    if (dev.cc_major < 9 || cs > 16) {
      p.registers = false;
      p.cta_threads = 512;
      p.groups = rows;
      return p;
    }
    p.csize = next_pow2(cs);
    // Whole warps per CTA, as few as cover the row: fp32 12288 takes two CTAs
    // of 384 threads, not of 512 with a quarter idle.
    const int64_t per_cta = (threads + p.csize - 1) / p.csize;
    p.tpr = int((per_cta + 31) / 32 * 32);
  } else if (threads > 32) {
    // Whole warps, not a power of two: hidden 5120 in bf16 is 640 accesses,
    // so 160 threads with 4 each, where 256 threads would leave 38% of the
    // lanes idle (and ran far slower).
    p.tpr = int((threads + 31) / 32 * 32);
  } else {
    p.tpr = next_pow2(threads);  // lanes of one warp, reduced by shuffles
  }
  const int64_t per_thread = (nvec + int64_t(p.tpr) * p.csize - 1) / (int64_t(p.tpr) * p.csize);
  p.nv = next_pow2(per_thread);
  // Small rows: several rows per 128-thread CTA.  Otherwise one row per CTA.
  p.cta_threads = p.tpr < 128 && (p.tpr & (p.tpr - 1)) == 0 ? 128 : p.tpr;
  p.rows_per_cta = p.cta_threads / p.tpr;
  p.groups = (rows + p.rows_per_cta - 1) / p.rows_per_cta;
  // Forward clusters run a persistent grid, each CTA on the same columns of
  // many rows: its weight and bias slices are read once into shared memory
  // rather than from L2 for every row.  The cache holds only the arrays the
  // launch reads (measured faster for RMSNorm, which has no bias).
  const int64_t cache = wb_cache_smem(p.cta_threads, p.nv, p.vec, w_bytes, w_arrays);
  p.cache_wb = !bwd && p.csize > 1 && p.vec > 1 && w_bytes > 0 && w_arrays > 0 && cache <= kWbCacheMax;
  // And, where it still fits beside the cache, the next row's slice is copied
  // into shared memory (cp.async) while the current one is reduced and
  // written.  Where it does not (fp32 24576: two CTAs of 384 threads, 96 KB
  // of cache), the narrower layout it would force ran slower.  A second
  // staged row beside RMSNorm's weight-only cache ran slower too.
  p.stage_x = p.cache_wb && cache + x_smem_bytes(p.cta_threads, p.nv) <= kWbCacheMax;
  return p;
}

// The register-kernel plan: the layout at max_accesses' budget, or, for rows
// that need more than one CTA at it, at the `long_row` budget where:
// - backward: always (8-byte rows have no larger budget).  fp32 clusters of
//   16 elements a thread, staged, beat those of 8 (at 12288 and 24576 level
//   or slightly behind) since cluster sums are pushed (RowReducer); with a
//   cluster barrier a row they had lost.
// - forward: 4- and 8-byte rows, unless the narrower thread's cluster stages
//   the next row (Plan::stage_x), or the wider thread's cluster loses the
//   weight cache that the narrower one keeps: the 128-byte threads' cache
//   takes 128 KB at 512 threads.  The staged cluster beat the one-CTA
//   128-byte threads and the wide cluster that could not stage.  Forward rows
//   past a 16-CTA cluster of the narrower threads take a row group instead
//   (register_layout), which beat the wide cluster and the split path there;
//   groups lost to the clusters that hold a row.
inline Plan register_plan(int64_t rows, int64_t cols, int elem_bytes, int acc_bytes, bool vec_ok, bool bwd,
                          const DeviceInfo& dev, int w_bytes, int w_arrays = 2, bool two_sums = false) {
  const int vec = vec_ok ? 16 / elem_bytes : 1;
  const int64_t nvec = (cols + vec - 1) / vec;
  const int narrow = max_accesses(bwd, vec, elem_bytes), wide = max_accesses(bwd, vec, elem_bytes, true);
  const Plan n = register_layout(rows, nvec, vec, narrow, bwd, dev, w_bytes, w_arrays, two_sums);
  if ((n.group && !bwd) || wide == narrow || (nvec + narrow - 1) / narrow <= kMaxCta) return n;
  Plan w = register_layout(rows, nvec, vec, wide, bwd, dev, w_bytes, w_arrays, two_sums);
  w.stage_x = false;  // staged rows have the narrow threads' kernels only (pick_fwd)
  if (bwd) return w;
  return n.stage_x || (w.csize > 1 && !w.cache_wb && n.cache_wb) ? n : w;
}

// vec_ok: every pointer and row stride allows accesses of 16 bytes and cols is
// a multiple of that width (the caller checks alignment at run time).
// w_bytes: the element size of the weight and bias, 0 without either;
// w_arrays: how many of the two the forward reads; two_sums: the forward
// reduces two sums a row (LayerNorm), so its short rows take fewer lanes
// (short_row_layout).
inline Plan make_plan(int64_t rows, int64_t cols, int elem_bytes, int acc_bytes, bool vec_ok, bool bwd,
                      const DeviceInfo& dev, int w_bytes = 0, int w_arrays = 2, bool two_sums = false,
                      const XSmemTuning& xs = XSmemTuning{}) {
  const Plan r = register_plan(rows, cols, elem_bytes, acc_bytes, vec_ok, bwd, dev, w_bytes, w_arrays, two_sums);
  const int64_t row_bytes = cols * elem_bytes;
  const bool params_outweigh_row = cols * w_bytes * w_arrays > row_bytes;
  if (bwd || !vec_ok || !r.registers || r.group) return r;
  if (dev.cc_major == 9 && elem_bytes <= 4 && w_bytes <= elem_bytes && reread_pair_fits(cols / r.vec)) {
    const bool quad = two_sums && elem_bytes == 2 && w_bytes == elem_bytes && w_arrays == 2 &&
                      reread_quad_beats_pair(cols / r.vec);
    return reread_straight_layout(rows, cols / r.vec, r.vec, quad ? kRereadQuadAccesses : kRereadPairAccesses);
  }
  const bool inflight_ok = register_inflight(r, cols, elem_bytes) >= xs.max_inflight;
  const bool keep_registers =
      r.csize == 1 && inflight_ok && !reread_despite_inflight(r, elem_bytes);
  const bool reread_row = row_bytes >= reread_min_row(elem_bytes, w_bytes, params_outweigh_row, xs) &&
                          row_bytes <= reread_max_row(r, elem_bytes, w_bytes, params_outweigh_row);
  if (dev.cc_major == 9 && elem_bytes <= 4 && reread_row && !keep_registers)
    return reread_layout(rows, cols / r.vec, r.vec);
  if (row_bytes < xs.min_row_bytes) return r;
  const bool one_cta = row_bytes > xs.one_cta_min_row && row_bytes <= xs.slice_bytes &&
                       (dev.cc_major < 9 || !params_outweigh_row);
  if (!one_cta && inflight_ok) return r;
  const Plan s = x_smem_plan(rows, cols, elem_bytes, dev, xs);
  return s.registers ? s : r;
}

}  // namespace fln::cuda
