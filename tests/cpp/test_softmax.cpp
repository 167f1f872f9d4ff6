// The softmax's building blocks without a GPU: the CPU kernel against double
// arithmetic (softmax and log-softmax, scale, causal rows, strided rows,
// rows of -inf, forward and backward, every dtype), and the launch rule's
// invariants.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/dtypes.h"
#include "kernels/softmax/cpu.h"
#include "kernels/softmax/cuda/plan.h"

namespace {

struct Serial {  // the parallel-for the kernels take, on one thread
  template <typename F>
  void operator()(int64_t n, F&& f) const {
    f(int64_t(0), n);
  }
};

struct Case {
  int64_t rows, cols, stride, q_len;
  double scale;
  bool log, causal;
};

// One row in double: y from x (forward) and dx from (y, dy) (backward) over the kept columns.
void reference(const std::vector<double>& x, const std::vector<double>& dy, int64_t kept, double scale, bool log,
               std::vector<double>& y, std::vector<double>& dx) {
  const int64_t n = int64_t(x.size());
  double m = -std::numeric_limits<double>::infinity(), s = 0;
  for (int64_t j = 0; j < kept; ++j) m = std::max(m, x[j] * scale);
  for (int64_t j = 0; j < kept; ++j) s += std::exp(x[j] * scale - m);
  y.assign(n, log ? -std::numeric_limits<double>::infinity() : 0.0);
  for (int64_t j = 0; j < kept; ++j) y[j] = log ? x[j] * scale - m - std::log(s) : std::exp(x[j] * scale - m) / s;
  double t = 0;
  for (int64_t j = 0; j < kept; ++j) t += log ? dy[j] : dy[j] * y[j];
  dx.assign(n, 0.0);
  for (int64_t j = 0; j < kept; ++j)
    dx[j] = log ? scale * (dy[j] - std::exp(y[j]) * t) : scale * y[j] * (dy[j] - t);
}

template <typename T>
void run_case(const Case& cs, double tol, double atol) {
  std::mt19937 rng(99);
  std::normal_distribution<double> nd;
  const int64_t r = cs.rows, n = cs.cols, st = cs.stride;
  std::vector<T> x(size_t(r * st)), dy(size_t(r * st)), y(size_t(r * n)), dx(size_t(r * n));
  for (auto& v : x) v = fln::store_as<T>(fln::acc_t<T>(3 * nd(rng)));
  for (auto& v : dy) v = fln::store_as<T>(fln::acc_t<T>(nd(rng)));
  fln::SoftmaxParams p;
  p.rows = r;
  p.cols = n;
  p.in = x.data();
  p.in_stride = st;
  p.out = y.data();
  p.out_stride = n;
  p.scale = cs.scale;
  p.log = cs.log;
  p.causal = cs.causal;
  p.q_len = cs.q_len;
  fln::cpu::softmax<T>(p, Serial{});
  // The backward on our y (so the check is of its arithmetic alone).
  fln::SoftmaxParams b = p;
  b.backward = true;
  b.in = y.data();
  b.in_stride = n;
  b.grad = dy.data();
  b.grad_stride = st;
  b.out = dx.data();
  fln::cpu::softmax<T>(b, Serial{});
  for (int64_t i = 0; i < r; ++i) {
    const size_t un = static_cast<size_t>(n);
    std::vector<double> xr(un), gr(un), ye, dxe, yo(un);
    for (int64_t j = 0; j < n; ++j) {
      xr[j] = fln::load_as<double>(x[i * st + j]);
      gr[j] = fln::load_as<double>(dy[i * st + j]);
      yo[j] = fln::load_as<double>(y[i * n + j]);
    }
    const int64_t kept = fln::softmax_kept(p, i);
    reference(xr, gr, kept, cs.scale, cs.log, ye, dxe);
    // dx's reference on the y the kernel was given.
    double t = 0;
    for (int64_t j = 0; j < kept; ++j) t += cs.log ? gr[j] : gr[j] * yo[j];
    for (int64_t j = 0; j < n; ++j) {
      const double got = fln::load_as<double>(y[i * n + j]);
      if (j >= kept) {
        EXPECT_EQ(got, cs.log ? -std::numeric_limits<double>::infinity() : 0.0) << "masked y, row " << i;
        EXPECT_EQ(fln::load_as<double>(dx[i * n + j]), 0.0) << "masked dx, row " << i;
        continue;
      }
      EXPECT_NEAR(got, ye[j], tol * (std::abs(ye[j]) + (cs.log ? 1 + std::abs(xr[j] * cs.scale) : 0)) + atol)
          << "y row " << i << " col " << j;
      const double want = cs.log ? cs.scale * (gr[j] - std::exp(yo[j]) * t) : cs.scale * yo[j] * (gr[j] - t);
      const double size = std::abs(cs.scale) * (std::abs(gr[j]) + std::abs(t)) * (cs.log ? 1 : std::abs(yo[j])) +
                          std::abs(cs.scale) * std::exp(yo[j]) * std::abs(t);
      EXPECT_NEAR(fln::load_as<double>(dx[i * n + j]), want, tol * size + atol) << "dx row " << i << " col " << j;
    }
  }
}

const Case kCases[] = {
    {3, 1, 1, 1, 1.0, false, false},     {4, 7, 9, 1, 1.0, false, false},   {4, 1000, 1000, 1, 0.5, false, false},
    {4, 257, 300, 1, 2.0, true, false},  {6, 6, 6, 6, 0.125, false, true},  {6, 6, 8, 3, 0.125, true, true},
    {8, 33, 33, 4, -1.5, false, true},   {8, 33, 40, 8, 1.0, true, true},
};

template <typename T>
void run_all(double tol, double atol) {  // atol: the dtype's smallest subnormal (outputs that underflow)
  for (const Case& c : kCases) run_case<T>(c, tol, atol);
}

}  // namespace

TEST(SoftmaxCpu, FloatAgainstDouble) { run_all<float>(1e-5, 1e-44); }
TEST(SoftmaxCpu, DoubleAgainstDouble) { run_all<double>(1e-12, 1e-300); }
TEST(SoftmaxCpu, BFloat16AgainstDouble) { run_all<fln::BFloat16>(1.0 / 128, 1e-40); }  // one rounding to bf16
TEST(SoftmaxCpu, HalfAgainstDouble) { run_all<fln::Half>(1.0 / 1024, 6e-8); }

// The vectorizable exponential of the CPU kernels, over its whole domain.
TEST(SoftmaxCpu, ExpApprox) {
  using fln::cpu::softmax_detail::exp_approx;
  double worst = 0;
  for (int i = 0; i <= 400000; ++i) {
    const float v = -87.f + 175.7f * float(i) / 400000;  // -87 .. 88.7: past them 0 and infinity
    const double ref = std::exp(double(v));
    worst = std::max(worst, std::fabs(exp_approx(v) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);  // about 2 ulp of float
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(exp_approx(0.f), 1.f);
  EXPECT_EQ(exp_approx(-100.f), 0.f);
  EXPECT_EQ(exp_approx(-inf), 0.f);
  EXPECT_EQ(exp_approx(89.f), inf);
  EXPECT_EQ(exp_approx(inf), inf);
  EXPECT_TRUE(std::isfinite(exp_approx(88.7f)));
  EXPECT_TRUE(std::isnan(exp_approx(std::numeric_limits<float>::quiet_NaN())));
}

TEST(SoftmaxCpu, RowOfMinusInfinityIsNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {-inf, -inf, -inf, -inf, -inf, -inf, -100.f}, y(7);
  for (bool log : {false, true}) {
    fln::SoftmaxParams p;
    p.rows = 2;
    p.cols = 3;
    p.in = x.data() + 1;
    p.in_stride = 3;  // rows {-inf, -inf, -inf} and {-inf, -inf, -100}
    p.out = y.data();
    p.out_stride = 3;
    p.log = log;
    fln::cpu::softmax<float>(p, Serial{});
    for (int j = 0; j < 3; ++j) EXPECT_TRUE(std::isnan(y[j]));
    EXPECT_EQ(y[3], log ? -inf : 0.f);
    EXPECT_EQ(y[5], log ? 0.f : 1.f);
  }
}

TEST(SoftmaxPlan, Invariants) {
  using namespace fln::cuda::softmax_kernels;
  for (int elem : {2, 4, 8})
    for (bool vec : {true, false})
      for (int cc : {8, 9})
        for (int64_t cols : {1, 3, 7, 127, 256, 1000, 1024, 4097, 8192, 32768, 65536, 100000, 131072, 262144,
                             300000, 1 << 22}) {
          const Plan p = make_plan(cols, elem, vec, cc);
          ASSERT_EQ(p.vec, vec ? 16 / elem : 1);
          ASSERT_EQ(p.accesses, accesses_per_thread(p.vec, elem));
          ASSERT_LE(p.cta_threads, kPlanMaxThreads);
          ASSERT_EQ(p.cta_threads % p.threads_per_row, 0);
          if (p.strategy == Strategy::kLoop) {
            ASSERT_EQ(p.cta_threads, kLoopThreads);
            continue;
          }
          // Every column is held by one access of one thread of the row.
          const int64_t held = int64_t(p.threads_per_row) * p.cluster * p.accesses * p.vec;
          ASSERT_GE(held, cols) << "cols " << cols;
          ASSERT_TRUE(p.threads_per_row <= 32 ? (p.threads_per_row & (p.threads_per_row - 1)) == 0
                                              : p.threads_per_row % 32 == 0);
          // place() shifts: a team is a power of two of lanes or the whole CTA,
          // and only clusters spread a row over CTAs.
          ASSERT_TRUE((p.threads_per_row & (p.threads_per_row - 1)) == 0 || p.threads_per_row == p.cta_threads);
          ASSERT_TRUE(p.threads_per_row <= 32 || p.threads_per_row == p.cta_threads);
          ASSERT_TRUE(p.strategy == Strategy::kCluster || p.cluster == 1);
          // The row kernels count columns in ints.
          ASSERT_LE(held, int64_t(INT32_MAX));
          if (p.strategy == Strategy::kCluster) {
            ASSERT_GE(cc, 9);
            ASSERT_LE(p.cluster, kPlanMaxCluster);
          }
        }
  // The bar's sizes: fp32 131072 and 16-bit 262144 rows fit a cluster; fp32 rows past it loop.
  EXPECT_EQ(make_plan(131072, 4, true, 9).strategy, Strategy::kCluster);
  EXPECT_EQ(make_plan(262144, 2, true, 9).strategy, Strategy::kCluster);
  EXPECT_EQ(make_plan(262144, 4, true, 9).strategy, Strategy::kLoop);
  EXPECT_EQ(make_plan(4096, 2, true, 9).strategy, Strategy::kRow);
}
