// The CUDA launch heuristic is a pure host function: check that every hidden
// size gets a plan that covers the whole row within the register budget.
#include <gtest/gtest.h>

#include "kernels/cuda/launch_plan.h"

using namespace fln::cuda;

namespace {

// w_arrays: how many of weight and bias the forward reads; fp32_params: they
// are float32 (16-bit x), else of the input's element size; two_sums:
// LayerNorm's forward (mean, then variance), else RMSNorm's.
void check_cover(int64_t cols, int elem, int acc, bool vec_ok, bool bwd, int cc, int w_arrays = 2,
                 bool fp32_params = false, bool two_sums = false) {
  DeviceInfo dev;
  dev.sm_count = 132;
  dev.cc_major = cc;
  const int w_bytes = w_arrays > 0 ? (fp32_params ? 4 : elem) : 0;
  const Plan p = make_plan(1000, cols, elem, acc, vec_ok, bwd, dev, w_bytes, w_arrays, two_sums);
  SCOPED_TRACE(testing::Message() << "cols=" << cols << " elem=" << elem << " bwd=" << bwd << " cc=" << cc
                                  << " w_arrays=" << w_arrays << " w_bytes=" << w_bytes << " two_sums=" << two_sums);
  if (!p.registers) {
    // Falls back only when one CTA cannot hold the row and clusters can't help.
    const int vec = vec_ok ? 16 / elem : 1;
    // The backward's wider budget is only for rows that fit one CTA with it.
    const int64_t per_cta = int64_t(kMaxCta) * max_accesses(bwd, vec, elem, !bwd) * vec;
    EXPECT_GT(cols, per_cta);
    if (cc >= 9) EXPECT_GT(cols, 16 * per_cta);
    // Past 16 CTAs the 16-byte rows of 2- and 4-byte types take row groups, up to kMaxGroup CTAs.
    if (cc >= 9 && vec_ok && elem <= 4)
      EXPECT_GT(cols, int64_t(kMaxGroup) * group_cta_max(kGroupElems / vec) * kGroupElems);
    return;
  }
  EXPECT_EQ(p.vec, vec_ok ? 16 / elem : 1);
  EXPECT_GE(int64_t(p.tpr) * p.csize * p.nv * p.vec, cols);          // covers the row
  if (p.group) {  // rows past a cluster: one row group kernel per dtype and direction, 16 elements a thread
    EXPECT_GE(cc, 9);
    EXPECT_LE(elem, 4);
    EXPECT_EQ(p.vec, 16 / elem);
    // Past a 16-CTA cluster of the register kernel's threads; the backward's
    // 16-bit rows past an 8-CTA one.
    const int64_t cluster_cols = int64_t(kMaxCta) * max_accesses(bwd, p.vec, elem, bwd) * p.vec;
    EXPECT_GT(cols, (bwd && elem == 2 ? 8 : 16) * cluster_cols);
    EXPECT_LE(p.csize, kMaxGroup);
    EXPECT_EQ(p.nv * p.vec, kGroupElems);
    EXPECT_EQ(p.tpr, p.cta_threads);
    EXPECT_EQ(p.tpr % 32, 0);
    EXPECT_LE(p.tpr, group_cta_max(p.nv));
    EXPECT_LT(int64_t(p.tpr - 32) * p.csize * p.nv * p.vec, cols);  // no idle warp
    EXPECT_EQ(p.groups, 1000);
    return;
  }
  EXPECT_EQ(p.csize & (p.csize - 1), 0);  // row_coords divides by csize with a shift
  // Forward rows of 16-80 KB (16-byte accesses of 2- and 4-byte types, sm_90)
  // are re-read, unless one CTA of registers keeps a full SM of bytes in
  // flight, or a staged cluster takes the row (past 48 KB where the weight
  // and bias outweigh it, past 64 KB otherwise).
  const XSmemTuning xs;
  const Plan r = register_plan(1000, cols, elem, acc, vec_ok, bwd, dev, w_bytes, w_arrays, two_sums);
  const bool params_outweigh = cols * w_bytes * w_arrays > cols * elem;
  const bool full_cta = r.csize == 1 && register_inflight(r, cols, elem) >= xs.max_inflight &&
                        !reread_despite_inflight(r, elem);
  const int64_t max_row = !r.stage_x || w_bytes > elem ? 80 * 1024 : params_outweigh ? 48 * 1024 : 64 * 1024;
  const int64_t min_row = elem == 2 && w_bytes == elem && params_outweigh ? 14 * 1024 : xs.min_row_bytes;
  const bool reread_row = !bwd && vec_ok && cc == 9 && elem <= 4 && cols * elem >= min_row &&
                          cols * elem <= max_row;
  // Rows that CTAs of at least 320 threads cover at two 16-byte accesses a
  // thread, where three or more of those CTAs share an SM and fill at least
  // 7/8 of its 2048 thread slots, with weights of x's dtype or none, take
  // the straight-line variant.
  const int64_t pair_threads = cols * elem / 32;
  const bool pair = !bwd && vec_ok && cc == 9 && elem <= 4 && w_bytes <= elem && (cols * elem) % 32 == 0 &&
                    pair_threads % 32 == 0 && pair_threads >= 320 && 3 * pair_threads <= 2048 &&
                    (2048 / pair_threads) * pair_threads >= 1792;
  // LayerNorm's 16-bit pair rows with weight and bias of x's dtype take four
  // accesses a thread where the pair's CTAs are fewer than four an SM or
  // leave more than 1/16 of its 2048 thread slots idle, and CTAs a quarter
  // of the row's accesses (whole warps) leave at most 1/16 idle.
  auto full = [](int64_t t) { return (2048 / t) * t * 16 >= 2048 * 15; };  // t > 0
  const int64_t nvec = cols * elem / 16;
  const bool quad = pair && two_sums && elem == 2 && w_bytes == elem && w_arrays == 2 &&
                    !(2048 / pair_threads >= 4 && full(pair_threads)) && nvec % 128 == 0 && full(nvec / 4);
  EXPECT_EQ(p.reread, pair || (reread_row && r.registers && !full_cta));
  EXPECT_EQ(reread_exact(p, cols), pair);
  if (p.reread) {  // fwd_reread_kernel.cuh: one CTA of whole warps a row
    EXPECT_EQ(p.csize, 1);
    EXPECT_EQ(p.tpr, p.cta_threads);
    EXPECT_EQ(p.cta_threads % 32, 0);
    EXPECT_LE(p.cta_threads, kRereadCta);
    EXPECT_EQ(p.groups, 1000);
    if (pair) {  // two (or four) accesses a thread, every one of them in the row
      EXPECT_EQ(p.nv, quad ? 4 : 2);
      EXPECT_EQ(int64_t(p.cta_threads) * p.nv * p.vec, cols);
      return;
    }
    if (p.cta_threads < kRereadCta) {  // at most kRereadAccesses a thread, no idle warp
      EXPECT_LE(p.nv, kRereadAccesses);
      EXPECT_LT(int64_t(p.cta_threads - 32) * p.nv * p.vec, cols);
      // Fewer than kRereadAccesses only in CTAs of at most kRereadFillMaxCta
      // threads that fill more of an SM than those of kRereadAccesses would.
      if (p.nv < kRereadAccesses) {
        EXPECT_LE(p.cta_threads, kRereadFillMaxCta);
        const int64_t t4 = (cols / p.vec + 32 * kRereadAccesses - 1) / (32 * kRereadAccesses) * 32;
        EXPECT_GT(kRereadSmThreads / p.cta_threads * p.cta_threads, kRereadSmThreads / t4 * t4);
      }
    }
    return;
  }
  if (p.short_rows) {  // forward rows of one warp at most (fwd_rows_kernel.cuh)
    EXPECT_FALSE(bwd);
    EXPECT_TRUE(vec_ok);
    EXPECT_EQ(p.csize, 1);
    EXPECT_LE(p.tpr, 32);
    EXPECT_EQ(p.tpr & (p.tpr - 1), 0);  // lanes of a warp: a power of two
    EXPECT_GE(p.nv, 1);
    EXPECT_LE(p.nv, kShortRowAccesses);
    EXPECT_EQ(p.rows_per_thread, kShortRowAccesses / p.nv);
    EXPECT_GE(int64_t(p.tpr) * p.nv * p.vec, cols);  // the row covered
    if (p.nv > 1) EXPECT_LT(int64_t(p.tpr) * (p.nv - 1) * p.vec, cols);  // no access a lane idle
    else EXPECT_LT(int64_t(p.tpr) * p.vec, 2 * cols);  // no lane idle by a power of two too many
    if (two_sums) {  // LayerNorm: as few lanes as hold the row in kShortRowAccesses accesses
      if (p.tpr > 1) EXPECT_LT(int64_t(p.tpr / 2) * kShortRowAccesses * p.vec, cols);
    } else if (p.nv > 1) {  // RMSNorm: a lane an access, up to 32
      EXPECT_EQ(p.tpr, 32);
    }
    EXPECT_EQ(p.cta_threads, kShortRowCta);
    EXPECT_EQ(p.rows_per_cta, kShortRowCta / p.tpr * p.rows_per_thread);
    EXPECT_EQ(p.groups, (1000 + p.rows_per_cta - 1) / p.rows_per_cta);
    return;
  }
  EXPECT_GT(cols * elem, (bwd || !vec_ok) ? 0 : 32 * kShortRowAccesses * 16);  // longer rows only
  if (p.x_smem) {  // row in shared memory: forward, 16-byte accesses, one row per CTA
    EXPECT_FALSE(bwd);
    EXPECT_TRUE(vec_ok);
    EXPECT_GE(cols * elem, xs.min_row_bytes);
    EXPECT_FALSE(p.cache_wb);
    EXPECT_EQ(p.tpr, p.cta_threads);
    EXPECT_EQ(p.cta_threads % 32, 0);
    EXPECT_LE(p.cta_threads, kMaxCta);
    EXPECT_LE(p.nv, kXSmemMaxNv);
    EXPECT_LE(x_smem_bytes(p.cta_threads, p.nv), xs.slice_bytes);  // at most one slice a CTA
    EXPECT_LE(p.csize, 16);
    if (p.csize > 1) {
      EXPECT_GE(cc, 9);
      EXPECT_GT(p.tpr, 32);  // RowReducer: a __syncthreads before each push of the cluster's sums
    }
    EXPECT_EQ(p.groups, 1000);
    // Only where registers would keep too little in flight, or the row fits
    // one CTA and (with clusters) its weight and bias come to at most its bytes.
    const bool one_cta = cols * elem > xs.one_cta_min_row && cols * elem <= xs.slice_bytes &&
                         (cc < 9 || w_arrays <= 1);
    if (one_cta)
      EXPECT_EQ(p.csize, 1);
    else
      EXPECT_LT(register_inflight(r, cols, elem), xs.max_inflight);
    return;
  }
  EXPECT_LE(p.nv, max_accesses(bwd, p.vec, elem, true));              // register budget
  // The larger forward budget only where a row would otherwise need a cluster.
  if (p.nv > max_accesses(bwd, p.vec, elem))
    EXPECT_GT(cols, int64_t(kMaxCta) * max_accesses(bwd, p.vec, elem) * p.vec);
  if (bwd) EXPECT_LE(bwd_partials_smem(p.cta_threads, p.nv, p.vec, acc), 64 * 1024);  // 3 CTAs per SM
  // Bytes of row per thread; 64 in the backward only for 4-byte rows.
  EXPECT_LE(p.nv * p.vec * elem, bwd ? (elem == 4 ? 64 : 32) : 128);
  // The forward's 128-byte threads never cost a cluster its weight cache.
  if (!bwd && p.vec > 1 && p.csize > 1 && w_arrays > 0 && !p.cache_wb)
    EXPECT_FALSE(register_layout(1000, cols / p.vec, p.vec, max_accesses(false, p.vec, elem), false, dev, w_bytes, w_arrays)
                     .cache_wb);
  if (bwd && p.nv * p.vec * elem > 32) EXPECT_GT(cols, int64_t(kMaxCta) * max_accesses(bwd, p.vec, elem) * p.vec);
  if (p.cache_wb) {  // forward clusters of 16-byte accesses, two CTAs per SM
    EXPECT_FALSE(bwd);
    EXPECT_GT(p.csize, 1);
    EXPECT_GT(p.vec, 1);
    EXPECT_LE(wb_cache_smem(p.cta_threads, p.nv, p.vec, elem, w_arrays), kWbCacheMax);
  }
  if (p.stage_x) {  // the next row beside the weight cache, at most 64 bytes a thread (pick_fwd)
    EXPECT_TRUE(p.cache_wb);
    EXPECT_LE(wb_cache_smem(p.cta_threads, p.nv, p.vec, elem, w_arrays) + x_smem_bytes(p.cta_threads, p.nv),
              kWbCacheMax);
    EXPECT_LE(p.nv, max_accesses(false, p.vec, elem));
  }
  if (p.tpr <= 32) EXPECT_EQ(p.tpr & (p.tpr - 1), 0);                 // lanes of a warp: power of two
  else EXPECT_EQ(p.tpr % 32, 0);                                       // else whole warps
  EXPECT_LE(p.tpr, kMaxCta);
  EXPECT_LE(p.csize, 16);
  if (p.csize > 1) {
    EXPECT_GE(cc, 9);
    EXPECT_EQ(p.tpr, p.cta_threads);  // one row per CTA in a cluster
    EXPECT_GT(p.tpr, 32);  // RowReducer: a __syncthreads before each push of the cluster's sums
    EXPECT_EQ(p.csize & (p.csize - 1), 0);
  }
  EXPECT_EQ(p.cta_threads % p.tpr, 0);
  if (p.rows_per_cta > 1) EXPECT_EQ(p.tpr & (p.tpr - 1), 0);  // and by tpr, where a CTA has several rows
  EXPECT_EQ(p.rows_per_cta, p.cta_threads / p.tpr);
  EXPECT_EQ(p.groups, (1000 + p.rows_per_cta - 1) / p.rows_per_cta);
}

}  // namespace

TEST(LaunchPlan, EveryHiddenSizeIsCovered) {
  for (int64_t cols = 1; cols <= 300000; cols += (cols < 2048 ? 1 : 997))
    for (int elem : {2, 4, 8})
      for (bool bwd : {false, true})
        for (int cc : {8, 9, 10}) {
          const int acc = elem == 8 ? 8 : 4;
          check_cover(cols, elem, acc, false, bwd, cc);
          if (cols % (16 / elem) == 0)
            for (int w_arrays : {0, 1, 2})
              for (bool two_sums : {false, true}) {
                if (bwd && two_sums) continue;  // a forward choice
                check_cover(cols, elem, acc, true, bwd, cc, w_arrays, false, two_sums);
                if (elem == 2 && w_arrays > 0) check_cover(cols, elem, acc, true, bwd, cc, w_arrays, true, two_sums);
              }
        }
}

TEST(LaunchPlan, EveryPairRowSizeIsChecked) {
  // The straight-line re-read rows (multiples of 64 accesses of 16 bytes)
  // fall between the every-size test's steps: every 16-byte multiple up to
  // 40 KB, forward, on every device.
  for (int64_t bytes = 16; bytes <= 40 * 1024; bytes += 16)
    for (int elem : {2, 4, 8})
      for (int cc : {8, 9, 10})
        for (int w_arrays : {0, 1, 2})
          for (bool two_sums : {false, true}) {
            check_cover(bytes / elem, elem, elem == 8 ? 8 : 4, true, false, cc, w_arrays, false, two_sums);
            if (elem == 2 && w_arrays > 0) check_cover(bytes / elem, elem, 4, true, false, cc, w_arrays, true, two_sums);
          }
}

TEST(LaunchPlan, PairRowsTakeTheStraightLineRereadKernel) {
  DeviceInfo dev;
  dev.cc_major = 9;
  // bf16 5120-10752 a multiple of 512 (CTAs of 320-672 threads, 3-6 an
  // SM), but not 4096 (256 threads), 5632 (352 threads, 1760 of 2048
  // slots), 12288 (768 threads, two an SM) or 16384; fp32 half those;
  // LayerNorm's and RMSNorm's, and without weight and bias.
  for (int64_t cols : {5120, 6144, 7168, 7680, 8192, 9728, 10240, 10752})
    for (int elem : {2, 4})
      for (int w_arrays : {0, 1, 2}) {
        const int64_t n = elem == 2 ? cols : cols / 2;
        const Plan p = make_plan(1 << 14, n, elem, 4, true, false, dev, w_arrays ? elem : 0, w_arrays);
        EXPECT_TRUE(p.reread && reread_exact(p, n)) << n << " " << elem;
        EXPECT_EQ(p.nv, 2);
        EXPECT_EQ(p.cta_threads, int(n * elem / 32));
      }
  // LayerNorm's 16-bit rows with weight and bias take four accesses a thread
  // at 7168 (nine CTAs of 224 threads) and 10240 (six of 320), two at 5120,
  // 6144, 8192 (five or more pair CTAs, at most 1/16 idle) and 10752 (672
  // threads: its quarter, 336, is not whole warps); fp32, without the bias
  // or RMSNorm's keep two.
  for (int64_t cols : {5120, 6144, 7168, 8192, 10240, 10752}) {
    const bool quad = cols == 7168 || cols == 10240;
    const Plan ln = make_plan(1 << 14, cols, 2, 4, true, false, dev, 2, 2, true);
    EXPECT_TRUE(reread_exact(ln, cols)) << cols;
    EXPECT_EQ(ln.nv, quad ? 4 : 2) << cols;
    EXPECT_EQ(ln.cta_threads, int(cols / (8 * ln.nv))) << cols;
    EXPECT_EQ(make_plan(1 << 14, cols, 2, 4, true, false, dev, 2, 1, true).nv, 2) << cols;
    EXPECT_EQ(make_plan(1 << 14, cols, 2, 4, true, false, dev, 2, 2, false).nv, 2) << cols;
    EXPECT_EQ(make_plan(1 << 14, cols / 2, 4, 4, true, false, dev, 4, 2, true).nv, 2) << cols;
  }
  for (int64_t cols : {4096, 12288, 7176, 5632, 6656, 8704, 9216, 14336, 16384}) {
    const Plan p = make_plan(1 << 14, cols, 2, 4, true, false, dev, 2);
    EXPECT_FALSE(reread_exact(p, cols)) << cols;
  }
  // Not with fp32 weights on 16-bit x, fp64, without 16-byte accesses, or
  // before sm_90; never in the backward.
  EXPECT_FALSE(reread_exact(make_plan(1 << 14, 8192, 2, 4, true, false, dev, 4), 8192));
  EXPECT_FALSE(make_plan(1 << 14, 2048, 8, 8, true, false, dev, 8).reread);
  EXPECT_FALSE(make_plan(1 << 14, 8192, 2, 4, false, false, dev, 2).reread);
  EXPECT_FALSE(make_plan(1 << 14, 8192, 2, 4, true, true, dev, 2).reread);
  dev.cc_major = 8;
  EXPECT_FALSE(make_plan(1 << 14, 8192, 2, 4, true, false, dev, 2).reread);
  // A grid of one CTA a row: not past 2^31 - 1 rows.
  dev.cc_major = 9;
  const Plan big = make_plan(int64_t(1) << 31, 8192, 2, 4, true, false, dev, 2);
  EXPECT_TRUE(big.reread);
  EXPECT_FALSE(reread_exact(big, 8192));
}

TEST(LaunchPlan, BenchmarkSizesUseRegistersOnHopper) {
  DeviceInfo dev;
  dev.cc_major = 9;
  for (int64_t cols : {256, 1024, 4096, 8192, 65536, 131072}) {
    EXPECT_TRUE(make_plan(1 << 20, cols, 2, 4, true, false, dev).registers) << cols;
    EXPECT_TRUE(make_plan(1 << 20, cols, 2, 4, true, true, dev).registers) << cols;
  }
  EXPECT_TRUE(make_plan(512, 262144, 2, 4, true, false, dev).registers);
  // The backward at 262144: row groups of 16 elements a thread, 16 KB of x
  // a CTA (bf16: 32 CTAs of 512 threads, fp32: 64 of 256); at 131072 bf16
  // takes a group of 16 such CTAs, fp32 a 16-CTA cluster.  The forward at
  // 262144: fp32 the same group as the backward's, bf16 a 16-CTA cluster.
  for (int elem : {2, 4}) {
    const Plan g = make_plan(512, 262144, elem, 4, true, true, dev);
    EXPECT_TRUE(g.registers && g.group);
    EXPECT_EQ(g.csize, elem == 2 ? 32 : 64);
    EXPECT_EQ(g.cta_threads, elem == 2 ? 512 : 256);
    EXPECT_EQ(g.nv * g.vec, 16);
    const Plan c = make_plan(1024, 131072, elem, 4, true, true, dev);
    EXPECT_EQ(c.group, elem == 2);
    EXPECT_EQ(c.csize, 16);
    const Plan f = make_plan(512, 262144, elem, 4, true, false, dev, elem);
    EXPECT_EQ(f.group, elem == 4);
    EXPECT_EQ(f.csize, elem == 2 ? 16 : 64);
  }
  EXPECT_FALSE(make_plan(512, 262144, 8, 8, true, true, dev).registers);  // fp64: split path
  dev.cc_major = 8;
  EXPECT_FALSE(make_plan(512, 262144, 2, 4, true, true, dev).registers);
}

TEST(LaunchPlan, ShortRowLanes) {
  DeviceInfo dev;
  dev.cc_major = 9;
  // RMSNorm: a lane an access up to 32 (bf16 256: 32 lanes of one access,
  // four rows a thread; 768: 32 lanes of three, one row); LayerNorm: as few
  // lanes as hold the row in four accesses (bf16 256: 8 lanes of four; 768:
  // 32 of three; 24: 1 lane of three).
  struct Case { int64_t cols; bool two_sums; int tpr, nv, rows; };
  for (const Case& c : {Case{256, false, 32, 1, 4}, Case{768, false, 32, 3, 1}, Case{64, false, 8, 1, 4},
                        Case{256, true, 8, 4, 1}, Case{768, true, 32, 3, 1}, Case{24, true, 1, 3, 1},
                        Case{512, true, 16, 4, 1}}) {
    const Plan p = make_plan(1000, c.cols, 2, 4, true, false, dev, 2, 2, c.two_sums);
    SCOPED_TRACE(testing::Message() << "cols=" << c.cols << " two_sums=" << c.two_sums);
    EXPECT_TRUE(p.short_rows);
    EXPECT_EQ(p.tpr, c.tpr);
    EXPECT_EQ(p.nv, c.nv);
    EXPECT_EQ(p.rows_per_thread, c.rows);
  }
}

TEST(LaunchPlan, RowsOf16To80KbAreRereadUnlessStaged) {
  DeviceInfo dev;
  dev.cc_major = 9;
  // bf16 12288 (24 KB): one CTA of 512 threads, 3 accesses each (four an
  // SM fill its 2048 thread slots, five of 384 threads fill 1920); 14336:
  // 448 threads of 4 (608 of 3 would pass kRereadFillMaxCta).
  const Plan a = make_plan(1 << 14, 12288, 2, 4, true, false, dev, 2);
  EXPECT_TRUE(a.reread);
  EXPECT_EQ(a.cta_threads, 512);
  EXPECT_EQ(a.nv, 3);
  const Plan a2 = make_plan(1 << 14, 14336, 2, 4, true, false, dev, 2);
  EXPECT_TRUE(a2.reread);
  EXPECT_EQ(a2.cta_threads, 448);
  EXPECT_EQ(a2.nv, 4);
  // bf16 24576 (48 KB): 768 threads, with weight and bias too; 32768 (64
  // KB, RMSNorm's or without any parameter): 1024.
  EXPECT_EQ(make_plan(1 << 12, 24576, 2, 4, true, false, dev, 2).cta_threads, 768);
  for (int w_arrays : {0, 1}) {
    const Plan b = make_plan(1 << 12, 32768, 2, 4, true, false, dev, 2, w_arrays);
    EXPECT_TRUE(b.reread);
    EXPECT_EQ(b.cta_threads, 1024);
    EXPECT_EQ(b.nv, 4);
  }
  // 40960 (80 KB) without a staged cluster (no weight and bias to cache):
  // 1024 threads of 5 accesses.
  const Plan c = make_plan(1 << 11, 40960, 2, 4, true, false, dev, 0, 0);
  EXPECT_TRUE(c.reread);
  EXPECT_EQ(c.cta_threads, 1024);
  EXPECT_EQ(c.nv, 5);
  // fp32 12288 (48 KB) with weight and bias, fp32 16384 with a weight only,
  // and 16-bit x with fp32 weight and bias, whose staged clusters lost
  // (40960) where the cache leaves room to stage at all.
  EXPECT_TRUE(make_plan(1 << 12, 12288, 4, 4, true, false, dev, 4).reread);
  EXPECT_TRUE(make_plan(1 << 12, 16384, 4, 4, true, false, dev, 4, 1).reread);
  for (int64_t cols : {24576, 32768, 40960}) EXPECT_TRUE(make_plan(1 << 12, cols, 2, 4, true, false, dev, 4, 2).reread);
  EXPECT_TRUE(register_plan(1 << 12, 40960, 2, 4, true, false, dev, 4, 2).stage_x);
  // Staged clusters instead (reread_max_row): past 48 KB where LayerNorm's
  // weight and bias outweigh the row (bf16 28672-40960, fp32 16384 and
  // 20480), past 64 KB otherwise (bf16 40960 RMSNorm's, fp32 20480).
  for (int64_t cols : {28672, 32768, 36864, 40960}) {
    const Plan s = make_plan(1 << 12, cols, 2, 4, true, false, dev, 2, 2);
    EXPECT_FALSE(s.reread);
    EXPECT_TRUE(s.stage_x);
    EXPECT_GT(s.csize, 1);
  }
  for (int64_t cols : {16384, 20480}) EXPECT_TRUE(make_plan(1 << 12, cols, 4, 4, true, false, dev, 4, 2).stage_x);
  EXPECT_TRUE(make_plan(1 << 12, 40960, 2, 4, true, false, dev, 2, 1).stage_x);
  EXPECT_TRUE(make_plan(1 << 12, 20480, 4, 4, true, false, dev, 4, 1).stage_x);
  EXPECT_TRUE(make_plan(1 << 12, 36864, 2, 4, true, false, dev, 2, 1).stage_x);
  // Kept in one CTA of registers, 64 KB in flight an SM, where the
  // straight-line pair plan does not take the row (it takes bf16 8192 and
  // fp32 4096 with weights of x's dtype or none; bf16 16384 and fp32 8192
  // would be 1024-thread CTAs, two an SM): fp32 8192 with weight and bias
  // or a weight, and RMSNorm's bf16 8192 with an fp32 weight; but not
  // 16-bit rows of 512 threads (reread_despite_inflight): bf16 16384,
  // RMSNorm's and without any parameter too.
  for (int w_arrays : {0, 1}) {
    const Plan r = make_plan(1 << 13, 16384, 2, 4, true, false, dev, w_arrays ? 2 : 0, w_arrays);
    EXPECT_TRUE(r.reread);
    EXPECT_EQ(r.cta_threads, 512);
  }
  for (int w_arrays : {1, 2}) {
    const Plan r = make_plan(1 << 13, 8192, 4, 4, true, false, dev, 4, w_arrays);
    EXPECT_FALSE(r.reread || r.x_smem);
    EXPECT_EQ(r.csize, 1);
  }
  const Plan rk = make_plan(1 << 13, 8192, 2, 4, true, false, dev, 4, 1);
  EXPECT_FALSE(rk.reread || rk.x_smem);
  EXPECT_EQ(rk.csize, 1);
  // LayerNorm's 16-bit 16384 with weight and bias, of x's dtype or
  // fp32 (two 512-thread CTAs an SM, 64-128 KB of parameters against 32 KB
  // of row), is re-read by the looped kernel (reread_despite_inflight); its
  // 8192 with fp32 ones (256-thread CTAs) is not.
  for (int w_bytes : {2, 4}) {
    const Plan lf = make_plan(1 << 13, 16384, 2, 4, true, false, dev, w_bytes, 2);
    EXPECT_TRUE(lf.reread);
    EXPECT_FALSE(reread_exact(lf, 16384));
    EXPECT_EQ(lf.cta_threads, 512);
  }
  EXPECT_FALSE(make_plan(1 << 14, 8192, 2, 4, true, false, dev, 4, 2).reread);
  // fp32 12288 and 16384 without weight and bias: one CTA of 128-byte
  // register threads keeps 96-128 KB in flight, so the row stays in one CTA
  // of shared memory (v18c).
  for (int64_t cols : {12288, 16384}) {
    const Plan n = make_plan(1 << 12, cols, 4, 4, true, false, dev, 0, 0);
    EXPECT_FALSE(n.reread);
    EXPECT_TRUE(n.x_smem);
    EXPECT_EQ(n.csize, 1);
  }
  // Rows under 16 KB that no pair plan takes (RMSNorm's bf16 7176,
  // LayerNorm's fp32 3080 and 3592), past 80 KB (bf16 49152: a staged
  // cluster; without weight and bias a 2-CTA shared-memory cluster), fp64,
  // unaligned rows, the backward, and sm_80.
  EXPECT_FALSE(make_plan(1 << 14, 7176, 2, 4, true, false, dev, 2, 1).reread);
  EXPECT_FALSE(make_plan(1 << 15, 3080, 4, 4, true, false, dev, 4).reread);
  EXPECT_FALSE(make_plan(1 << 15, 3592, 4, 4, true, false, dev, 4).reread);
  // ... except LayerNorm's 16-bit rows of 14-16 KB with weight and bias of
  // x's dtype (reread_min_row): bf16 7176 (256 threads), not 6152, not with
  // fp32 weight and bias, not on sm_80.
  const Plan e = make_plan(1 << 14, 7176, 2, 4, true, false, dev, 2, 2);
  EXPECT_TRUE(e.reread);
  EXPECT_EQ(e.cta_threads, 256);
  EXPECT_FALSE(make_plan(1 << 14, 6152, 2, 4, true, false, dev, 2, 2).reread);
  EXPECT_FALSE(make_plan(1 << 14, 7176, 2, 4, true, false, dev, 4, 2).reread);
  const Plan d = make_plan(1 << 11, 49152, 2, 4, true, false, dev, 2);
  EXPECT_FALSE(d.reread);
  EXPECT_TRUE(d.stage_x);
  EXPECT_EQ(d.csize, 4);
  const Plan d0 = make_plan(1 << 11, 49152, 2, 4, true, false, dev, 0, 0);
  EXPECT_TRUE(d0.x_smem);
  EXPECT_EQ(d0.csize, 2);
  EXPECT_FALSE(make_plan(1 << 12, 4096, 8, 8, true, false, dev, 8).reread);
  EXPECT_FALSE(make_plan(1 << 14, 12288, 2, 4, false, false, dev, 2).reread);
  EXPECT_FALSE(make_plan(1 << 14, 12288, 2, 4, true, true, dev, 2).reread);
  DeviceInfo a100;
  a100.cc_major = 8;
  EXPECT_FALSE(make_plan(1 << 14, 12288, 2, 4, true, false, a100, 2).reread);
  EXPECT_FALSE(make_plan(1 << 14, 7168, 2, 4, true, false, a100, 2, 2).reread);
  DeviceInfo sm100;
  sm100.cc_major = 10;
  EXPECT_FALSE(make_plan(1 << 14, 12288, 2, 4, true, false, sm100, 2).reread);
}

TEST(LaunchPlan, RowsInSharedMemoryWhereRegistersHoldTooLittle) {
  // sm_80 (no re-read plan, no clusters): bf16 12288 would run 384-thread
  // register CTAs, two per SM (48 KB in flight); shared memory holds the
  // row, 192 threads with 8 accesses each.
  DeviceInfo a100;
  a100.cc_major = 8;
  const Plan a = make_plan(1 << 14, 12288, 2, 4, true, false, a100, 2);
  EXPECT_TRUE(a.x_smem);
  EXPECT_EQ(a.csize, 1);
  EXPECT_EQ(a.cta_threads, 192);
  EXPECT_EQ(a.nv, 8);
  // Rows of 32-64 KB take one CTA there whatever the register plan: fp32 16384 (64 KB).
  const Plan c = make_plan(1 << 13, 16384, 4, 4, true, false, a100, 4);
  EXPECT_TRUE(c.x_smem);
  EXPECT_EQ(c.cta_threads, 512);
  EXPECT_FALSE(make_plan(1 << 11, 49152, 2, 4, true, false, a100, 2).x_smem);
  EXPECT_FALSE(make_plan(1 << 14, 7168, 2, 4, true, false, a100, 2).x_smem);
  EXPECT_FALSE(make_plan(1 << 14, 12288, 2, 4, true, true, a100, 2).x_smem);
}

TEST(LaunchPlan, LongRowsTakeFewerCtas) {
  DeviceInfo dev;
  dev.cc_major = 9;
  // fp32 12288: 64 bytes a thread in a 2-CTA cluster of 384 threads that
  // stages the next row, rather than one CTA of 128-byte threads; without
  // weights (no cache, no stage) the one CTA.
  const Plan f = register_plan(1 << 14, 12288, 4, 4, true, false, dev, 4);
  EXPECT_EQ(f.csize, 2);
  EXPECT_EQ(f.tpr, 384);
  EXPECT_TRUE(f.stage_x);
  const Plan f0 = register_plan(1 << 14, 12288, 4, 4, true, false, dev, 0);
  EXPECT_EQ(f0.csize, 1);
  EXPECT_EQ(f0.tpr, 384);
  // bf16 65536: 64 bytes a thread, a 4-CTA cluster with the weight cache.
  const Plan h = make_plan(1 << 11, 65536, 2, 4, true, false, dev, 2);
  EXPECT_EQ(h.csize, 4);
  EXPECT_EQ(h.nv * h.vec * 2, 64);
  EXPECT_TRUE(h.cache_wb);
  EXPECT_TRUE(h.stage_x);
  // fp32 rows whose 128-byte threads would span a cluster without the
  // weight cache keep 64 bytes and the cache: 32768 in 4 CTAs, not 2.
  const Plan g = make_plan(1 << 12, 32768, 4, 4, true, false, dev, 4);
  EXPECT_EQ(g.csize, 4);
  EXPECT_EQ(g.nv * g.vec * 4, 64);
  EXPECT_TRUE(g.cache_wb);
  // ... and 64 bytes where the 128-byte cluster's cache leaves no room for
  // the next row (20480: 2 CTAs of 320 with 80 KB of cache; 64 bytes: 4
  // CTAs that stage), but 128 bytes where no weight is read.
  const Plan k = register_plan(1 << 12, 20480, 4, 4, true, false, dev, 4);
  EXPECT_EQ(k.csize, 4);
  EXPECT_EQ(k.nv * k.vec * 4, 64);
  EXPECT_TRUE(k.stage_x);
  EXPECT_EQ(make_plan(1 << 12, 32768, 4, 4, true, false, dev, 0, 0).csize, 2);
  // The cache holds only the arrays the launch reads (v15b).  bf16 x with an
  // fp32 weight, 65536: RMSNorm's 4-CTA clusters keep the weight (64 KB) and
  // stage the next row, where LayerNorm's weight and bias (128 KB) do not fit.
  const Plan r1 = make_plan(512, 65536, 2, 4, true, false, dev, 4, 1);
  EXPECT_EQ(r1.csize, 4);
  EXPECT_TRUE(r1.cache_wb);
  EXPECT_TRUE(r1.stage_x);
  EXPECT_FALSE(make_plan(512, 65536, 2, 4, true, false, dev, 4, 2).cache_wb);
  // bf16 x with an fp32 weight, 24576: a 2-CTA cluster that caches the
  // weight and stages the next row.
  // (make_plan re-reads that row: RowsOf16To80KbAreRereadUnlessStaged.)
  const Plan r2 = register_plan(1 << 12, 24576, 2, 4, true, false, dev, 4, 1);
  EXPECT_EQ(r2.csize, 2);
  EXPECT_TRUE(r2.stage_x);
}

TEST(LaunchPlan, RowTicketsForStagedClustersWithManyRows) {
  DeviceInfo dev;
  dev.cc_major = 9;
  // bf16 65536 (a staged 4-CTA cluster), with 62 clusters resident: the
  // counter from 16 rows a cluster on.
  const Plan h = make_plan(2048, 65536, 2, 4, true, false, dev, 2);
  ASSERT_TRUE(h.stage_x);
  EXPECT_TRUE(use_row_tickets(h, 62));
  EXPECT_FALSE(use_row_tickets(make_plan(16 * 62 - 1, 65536, 2, 4, true, false, dev, 2), 62));
  EXPECT_TRUE(use_row_tickets(make_plan(16 * 62, 65536, 2, 4, true, false, dev, 2), 62));
  // Tickets are ints: not past INT32_MAX rows.
  EXPECT_FALSE(use_row_tickets(make_plan(int64_t(INT32_MAX) + 1, 65536, 2, 4, true, false, dev, 2), 62));
  // Clusters without the stage (bf16 x with fp32 weight and bias: no cache)
  // keep the static schedule, and so do plans of one CTA a row.
  const Plan m = make_plan(4096, 65536, 2, 4, true, false, dev, 4, 2);
  EXPECT_FALSE(m.stage_x);
  EXPECT_FALSE(use_row_tickets(m, 62));
  EXPECT_FALSE(use_row_tickets(make_plan(1 << 20, 4096, 2, 4, true, false, dev, 2), 132));
}

TEST(LaunchPlan, BackwardElementsPerThread) {
  DeviceInfo dev;
  dev.cc_major = 9;
  // (cols, element bytes) -> CTAs of a cluster, threads of a CTA (0: any),
  // elements a thread.
  struct Case {
    int64_t cols;
    int elem, csize, cta_threads, elems;
  };
  const Case cases[] = {
      // fp32 5120 and 8192: 16 elements a thread in one CTA (320 and 512
      // threads), where 8 elements would need a 2-CTA cluster.
      {5120, 4, 1, 320, 16},
      {8192, 4, 1, 512, 16},
      // fp32 4096 keeps 8 elements; fp32 clusters take 16 (12288: 2 CTAs,
      // not 4; 131072: 16 CTAs, where 8 elements would need 32).
      {4096, 4, 1, 512, 8},
      {12288, 4, 2, 384, 16},
      {131072, 4, 16, 512, 16},
      // 16-bit rows: 8 elements a thread up to 4096 (512 threads), then 16,
      // in one CTA up to 8192 and in clusters beyond.
      {4096, 2, 1, 512, 8},
      {5120, 2, 1, 320, 16},
      {12288, 2, 2, 384, 16},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "cols=" << c.cols << " elem=" << c.elem);
    const Plan p = make_plan(1 << 14, c.cols, c.elem, 4, true, true, dev, c.elem);
    EXPECT_EQ(p.csize, c.csize);
    if (c.cta_threads) EXPECT_EQ(p.cta_threads, c.cta_threads);
    EXPECT_EQ(p.nv * p.vec, c.elems);
  }
}
