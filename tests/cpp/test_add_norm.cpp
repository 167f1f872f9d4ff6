// The fused pre-norm op's building blocks without a GPU: the Philox generator
// against its published known-answer vectors, the dropout mask's keep rate,
// the launch rule's invariants, and the CPU kernels against a double-precision
// reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/add_norm/cpu.h"
#include "kernels/add_norm/cuda/plan.h"
#include "kernels/add_norm/philox.h"

namespace {

using fln::DropoutMask;

fln::Philox4 philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  return fln::philox4x32_10((uint64_t(c1) << 32) | c0, (uint64_t(c3) << 32) | c2, (uint64_t(k1) << 32) | k0);
}

// Random123's kat_vectors for philox4x32-10.
TEST(AddNormPhilox, KnownAnswers) {
  const fln::Philox4 a = philox(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(a.v[0], 0x6627e8d5u);
  EXPECT_EQ(a.v[1], 0xe169c58du);
  EXPECT_EQ(a.v[2], 0xbc57ac4cu);
  EXPECT_EQ(a.v[3], 0x9b00dbd8u);
  const fln::Philox4 b = philox(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(b.v[0], 0x408f276du);
  EXPECT_EQ(b.v[3], 0x6d5451fdu);
  const fln::Philox4 c = philox(0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0);
  EXPECT_EQ(c.v[0], 0xd16cfe09u);
  EXPECT_EQ(c.v[1], 0x94fdccebu);
  EXPECT_EQ(c.v[2], 0x5001e420u);
  EXPECT_EQ(c.v[3], 0x24126ea1u);
}

TEST(AddNormPhilox, KeepRateAndEdges) {
  const int64_t rows = 64, cols = 4099;  // a row length that is not a multiple of 4
  for (double p : {0.1, 0.5, 0.9}) {
    const DropoutMask m = DropoutMask::make(1234, 8, cols, p);
    int64_t kept = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) kept += m.keep(r, c);
    const double n = double(rows * cols), sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(kept / n, 1 - p, 6 * sigma) << "p = " << p;
    EXPECT_DOUBLE_EQ(m.scale, 1 / (1 - p));
  }
  const DropoutMask none = DropoutMask::make(1, 0, 16, 1.0);
  for (int c = 0; c < 16; ++c) EXPECT_FALSE(none.keep(0, c));
  EXPECT_EQ(none.scale, 0.0);
  // A new offset (the generator's next call) draws a different mask.
  const DropoutMask m0 = DropoutMask::make(7, 0, 64, 0.5), m1 = DropoutMask::make(7, 4, 64, 0.5);
  int differ = 0;
  for (int c = 0; c < 64; ++c) differ += m0.keep(0, c) != m1.keep(0, c);
  EXPECT_GT(differ, 8);
}

// Element c of a block reads the low (c even) or high half of word c / 2; the
// keep probability is 1 - p rounded to a multiple of 2^-16.
TEST(AddNormPhilox, SixteenBitDrawsAnElement) {
  const DropoutMask m = DropoutMask::make(1, 0, 8, 0.5);
  EXPECT_EQ(m.threshold, 32768u);
  const fln::Philox4 d{{0x7FFF8000u, 0x80007FFFu, 0x0000FFFFu, 0xFFFF0000u}};
  const bool expect[8] = {false, true, true, false, false, true, true, false};
  for (int c = 0; c < 8; ++c) EXPECT_EQ(m.keep(d, c), expect[c]) << "element " << c;
  for (int c = 8; c < 16; ++c) EXPECT_EQ(m.keep(d, c), expect[c - 8]) << "element " << c;
  EXPECT_EQ(DropoutMask::make(1, 0, 8, 0.1).threshold, 58982u);  // 0.9 * 65536 = 58982.4
  EXPECT_EQ(DropoutMask::make(1, 0, 8, 0.0).threshold, 65536u);  // every draw kept
  EXPECT_EQ(DropoutMask::make(1, 0, 8, 1.0).threshold, 0u);
  EXPECT_EQ(DropoutMask::make(1, 0, 9, 0.5).padded_cols, 16);
}

// Every column is covered, CTAs stay within the limits, and each strategy is
// taken only where it must be.
TEST(AddNormPlan, CoversEveryRowWithinLimits) {
  using namespace fln::cuda::add_norm;
  for (int elem : {2, 4, 8})
    for (bool vec_ok : {true, false})
      for (bool bwd : {false, true})
        for (int cc : {8, 9})
          for (int64_t cols : {1, 3, 8, 100, 127, 256, 896, 1000, 2304, 4096, 5120, 7168, 12288, 16384, 32768,
                               65536, 131072, 262144, 300000, 1 << 20}) {
            const Plan p = make_plan(cols, elem, vec_ok, bwd, cc);
            SCOPED_TRACE(::testing::Message() << "elem " << elem << " vec_ok " << vec_ok << " bwd " << bwd
                                              << " cc " << cc << " cols " << cols);
            EXPECT_EQ(p.vec, vec_ok ? 16 / elem : 1);
            EXPECT_TRUE(p.accesses == accesses_per_thread(bwd, p.vec, elem) ||
                        (bwd && p.accesses == accesses_per_thread(bwd, p.vec, elem, true)));
            const int64_t threads = int64_t(p.threads_per_row) * p.cluster * p.chunks;
            EXPECT_GE(threads * p.accesses * p.vec, cols);
            EXPECT_LE(p.cta_threads, kPlanMaxThreads);
            EXPECT_EQ(p.cta_threads % p.threads_per_row, 0);
            EXPECT_TRUE(p.threads_per_row <= 32 ? (p.threads_per_row & (p.threads_per_row - 1)) == 0
                                                : p.threads_per_row % 32 == 0);
            // The kernels' place() shifts: a team is the whole CTA or a power of two of lanes.
            EXPECT_TRUE(p.threads_per_row == p.cta_threads || (p.threads_per_row & (p.threads_per_row - 1)) == 0);
            EXPECT_LE(p.cluster, kPlanMaxCluster);
            if (p.strategy == Strategy::kCluster) EXPECT_GE(cc, 9);
            if (p.strategy != Strategy::kRow)  // only rows one CTA cannot hold
              EXPECT_GT((cols + p.vec - 1) / p.vec, int64_t(kPlanMaxThreads) * p.accesses);
          }
}

// Forward rows of one CTA that walk a persistent grid keep their team: a
// cluster of one CTA of the same threads and accesses.  Short rows (several
// a CTA) never walk.
TEST(AddNormPlan, WalkingRowsAreClustersOfOne) {
  using namespace fln::cuda::add_norm;
  for (int elem : {2, 4})
    for (int64_t cols : {2304, 4096, 7168, 8192, 12288, 16384}) {
      if (cols * elem > 32768) continue;  // past 512 threads of 64 bytes: a cluster of CTAs
      const Plan p = make_plan(cols, elem, true, false, 9);
      SCOPED_TRACE(::testing::Message() << "elem " << elem << " cols " << cols);
      ASSERT_TRUE(one_cta_row(p));
      const Plan w = walking_plan(p);
      EXPECT_EQ(w.strategy, Strategy::kCluster);
      EXPECT_EQ(w.cluster, 1);
      EXPECT_EQ(w.chunks, 1);
      EXPECT_EQ(w.threads_per_row, p.threads_per_row);
      EXPECT_EQ(w.cta_threads, p.cta_threads);
      EXPECT_EQ(w.accesses, p.accesses);
    }
  EXPECT_FALSE(one_cta_row(make_plan(1024, 2, true, false, 9)));
  EXPECT_FALSE(one_cta_row(make_plan(65536, 2, true, false, 9)));
}

// Rows a cluster cannot hold keep their split's CTAs as a row group (one read
// of the inputs): the same team and accesses, its chunks now the group.
TEST(AddNormPlan, RowGroupsAreSplitRowsReadOnce) {
  using namespace fln::cuda::add_norm;
  int groups = 0;
  for (int elem : {2, 4})
    for (bool bwd : {false, true})
      for (int cc : {8, 9})
        for (int64_t cols : {5120, 131072, 262144, 300000, 1 << 21}) {
          const Plan p = make_plan(cols, elem, true, bwd, cc);
          if (p.strategy != Strategy::kSplit) continue;
          SCOPED_TRACE(::testing::Message() << "elem " << elem << " bwd " << bwd << " cc " << cc << " cols " << cols);
          const Plan g = group_plan(p);
          ++groups;
          EXPECT_EQ(g.strategy, Strategy::kGroup);
          EXPECT_EQ(g.cluster, p.chunks);
          EXPECT_EQ(g.chunks, 1);
          EXPECT_EQ(g.threads_per_row, p.threads_per_row);
          EXPECT_EQ(g.cta_threads, p.cta_threads);
          EXPECT_EQ(g.accesses, p.accesses);
          EXPECT_GE(int64_t(g.threads_per_row) * g.cluster * g.accesses * g.vec, cols);
        }
  EXPECT_GT(groups, 8);
}

TEST(AddNormPlan, BackwardPrefetchWhereFewBytesAreInFlight) {
  using namespace fln::cuda::add_norm;
  fln::cuda::DeviceInfo h200, h100, unknown;
  h200.sm_count = h100.sm_count = unknown.sm_count = 132;
  h200.dram_bytes_per_us = 2 * 3201000LL * 6144 / 8 / 1000;  // 4.9 TB/s: 37 KB a microsecond an SM
  h100.dram_bytes_per_us = 2 * 2619000LL * 5120 / 8 / 1000;  // 3.35 TB/s: 25 KB
  // Two CTAs of 288 threads, 48 bytes a thread ahead (bf16 2304 with dh): 27 KB an SM.
  EXPECT_TRUE(bwd_prefetch(2, 288, 48, h200));
  EXPECT_FALSE(bwd_prefetch(2, 288, 48, h100));
  // One CTA of 512 threads, 96 bytes ahead (fp32 4096): 48 KB.
  EXPECT_FALSE(bwd_prefetch(1, 512, 96, h200));
  EXPECT_FALSE(bwd_prefetch(1, 64, 48, unknown));  // bandwidth not reported: never
}

TEST(AddNormPlan, ForwardPrefetchWhereFewBytesAreInFlight) {
  using namespace fln::cuda::add_norm;
  fln::cuda::DeviceInfo h200, h100, unknown;
  h200.sm_count = h100.sm_count = unknown.sm_count = 132;
  h200.dram_bytes_per_us = 2 * 3201000LL * 6144 / 8 / 1000;  // 93 KB an SM over 2.5 us
  h100.dram_bytes_per_us = 2 * 2619000LL * 5120 / 8 / 1000;  // 63 KB
  // Seven CTAs of one bf16 row of 3072 with its residual (86 KB an SM, the most an H200's
  // one-shot rows hold) and of 2304 (65 KB): the H200 prefetches both, the H100 neither.
  EXPECT_TRUE(fwd_prefetch(7, 3072 * 4, 96 * 16, h200));
  EXPECT_TRUE(fwd_prefetch(7, 2304 * 4, 96 * 16, h200));
  EXPECT_FALSE(fwd_prefetch(7, 2304 * 4, 96 * 16, h100));
  // Ten CTAs of a bf16 row of 1536 (61 KB): the H100 too.
  EXPECT_TRUE(fwd_prefetch(10, 1536 * 4, 64 * 16, h100));
  // Teams of 4 lanes of 16 bytes (bf16 128: 32 rows a CTA, 82 KB an SM): less than a line.
  EXPECT_FALSE(fwd_prefetch(5, 32 * 128 * 4, 4 * 16, h200));
  EXPECT_TRUE(fwd_prefetch(5, 32 * 128 * 4, 8 * 16, h200));
  EXPECT_FALSE(fwd_prefetch(1, 64, 128, unknown));  // bandwidth not reported: never
}

// The CPU kernels against double-precision arithmetic, with residual,
// dropout, weight offset and the gradient flowing into h.
TEST(AddNormCpu, ForwardBackwardMatchDouble) {
  const int64_t rows = 5, cols = 37;
  const double p = 0.3, offset = 0.5, eps = 1e-5;
  std::mt19937 gen(3);
  std::normal_distribution<double> nd;
  std::vector<double> x(rows * cols), r(rows * cols), w(cols), b(cols), dy(rows * cols), dh(rows * cols);
  for (auto* v : {&x, &r, &dy, &dh})
    for (double& e : *v) e = nd(gen);
  for (int64_t c = 0; c < cols; ++c) {
    w[c] = 1 + 0.3 * nd(gen);
    b[c] = 0.3 * nd(gen);
  }
  auto serial = [](int64_t n, auto&& fn) { fn(int64_t(0), n); };
  for (bool rms : {false, true}) {
    std::vector<double> y(rows * cols), h(rows * cols), mean(rows), rstd(rows);
    std::vector<uint8_t> mask(rows * cols);
    int64_t rng_out[2] = {0, 0};
    fln::AddNormFwdParams f;
    f.rows = rows;
    f.cols = cols;
    f.x = x.data();
    f.x_stride = cols;
    f.residual = r.data();
    f.residual_stride = cols;
    f.w = w.data();
    f.b = rms ? nullptr : b.data();
    f.y = y.data();
    f.h = h.data();
    f.mean = rms ? nullptr : mean.data();
    f.rstd = rstd.data();
    f.mask = mask.data();
    f.rng_out = rng_out;
    f.eps = eps;
    f.weight_offset = float(offset);
    f.dropout_p = p;
    f.rng.seed = 42;
    f.rng.offset = 8;
    f.rms = rms;
    fln::cpu::add_norm_fwd<double, double, double>(f, serial);
    EXPECT_EQ(rng_out[0], 42);
    EXPECT_EQ(rng_out[1], 8);
    std::vector<double> dx(rows * cols), dres(rows * cols), dw(cols), db(cols);
    fln::AddNormBwdParams g;
    g.rows = rows;
    g.cols = cols;
    g.h = h.data();
    g.h_stride = cols;
    g.dy = dy.data();
    g.dy_stride = cols;
    g.dh = dh.data();
    g.dh_stride = cols;
    g.mean = rms ? nullptr : mean.data();
    g.rstd = rstd.data();
    g.w = w.data();
    g.dx = dx.data();
    g.dresidual = dres.data();
    g.dw = dw.data();
    g.db = db.data();
    g.weight_offset = float(offset);
    g.dropout_p = p;
    g.rng.seed_ptr = rng_out;
    g.rng.offset_ptr = rng_out + 1;
    g.rms = rms;
    fln::cpu::add_norm_bwd<double, double, double>(g, serial);
    const DropoutMask m = DropoutMask::make(42, 8, cols, p);
    std::vector<double> dw_ref(cols, 0.0), db_ref(cols, 0.0);
    for (int64_t i = 0; i < rows; ++i) {
      std::vector<double> hv(cols), xh(cols), gg(cols);
      double mu = 0, var = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const bool keep = m.keep(i, c);
        EXPECT_EQ(mask[i * cols + c], keep);
        hv[c] = (keep ? x[i * cols + c] / (1 - p) : 0.0) + r[i * cols + c];
        EXPECT_NEAR(h[i * cols + c], hv[c], 1e-12);
        mu += hv[c] / cols;
      }
      if (rms) mu = 0;
      for (int64_t c = 0; c < cols; ++c) var += (hv[c] - mu) * (hv[c] - mu) / cols;
      const double rs = 1 / std::sqrt(var + eps);
      double sgx = 0, sg = 0;
      for (int64_t c = 0; c < cols; ++c) {
        xh[c] = (hv[c] - mu) * rs;
        const double ye = xh[c] * (w[c] + offset) + (rms ? 0.0 : b[c]);
        EXPECT_NEAR(y[i * cols + c], ye, 1e-10);
        gg[c] = dy[i * cols + c] * (w[c] + offset);
        sgx += gg[c] * xh[c] / cols;
        sg += gg[c] / cols;
        dw_ref[c] += dy[i * cols + c] * xh[c];
        db_ref[c] += dy[i * cols + c];
      }
      for (int64_t c = 0; c < cols; ++c) {
        const double d = rs * (gg[c] - (rms ? 0.0 : sg) - xh[c] * sgx) + dh[i * cols + c];
        EXPECT_NEAR(dres[i * cols + c], d, 1e-10);
        EXPECT_NEAR(dx[i * cols + c], m.keep(i, c) ? d / (1 - p) : 0.0, 1e-10);
      }
    }
    for (int64_t c = 0; c < cols; ++c) {
      EXPECT_NEAR(dw[c], dw_ref[c], 1e-10);
      if (!rms) EXPECT_NEAR(db[c], db_ref[c], 1e-10);
    }
  }
}

}  // namespace
