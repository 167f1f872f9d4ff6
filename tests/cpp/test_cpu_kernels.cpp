// The framework-free CPU kernels against a double-precision host reference,
// over odd sizes, strided rows, every dtype and weight dtype, LayerNorm and
// RMSNorm.  Outputs are poisoned with NaN first, so an unwritten element fails.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/norm_cpu.h"

using namespace fln;

namespace {

template <typename T> T poison() {
  if constexpr (std::is_same_v<T, Half>) return Half{0x7e00};
  else if constexpr (std::is_same_v<T, BFloat16>) return BFloat16{0x7fc0};
  else return std::numeric_limits<T>::quiet_NaN();
}
template <typename T> double to_d(T v) { return double(load_as<double>(v)); }
template <typename T> T from_d(double v) { return store_as<T>(acc_t<T>(v)); }

template <typename T> double tol() {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  else if constexpr (std::is_same_v<T, float>) return 2e-5;
  else if constexpr (std::is_same_v<T, Half>) return 4e-3;
  else return 3e-2;
}

struct Ref {
  std::vector<double> y, mean, rstd, dx, dw, db;
};

// Double-precision reference on the values as stored (after rounding to T / W).
Ref reference(const std::vector<double>& x, const std::vector<double>& dy, const std::vector<double>& w,
              const std::vector<double>& b, int64_t rows, int64_t cols, int64_t stride, double eps, bool rms) {
  Ref r;
  r.y.resize(rows * cols);
  r.dx.resize(rows * cols);
  r.dw.assign(cols, 0);
  r.db.assign(cols, 0);
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = &x[i * stride];
    double mean = 0, var = 0;
    if (!rms) {
      for (int64_t j = 0; j < cols; ++j) mean += xr[j];
      mean /= cols;
    }
    for (int64_t j = 0; j < cols; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    const double rstd = 1 / std::sqrt(var / cols + eps);
    r.mean.push_back(mean);
    r.rstd.push_back(rstd);
    double s_gx = 0, s_g = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double xh = (xr[j] - mean) * rstd, d = dy[i * stride + j], g = d * w[j];
      r.y[i * cols + j] = xh * w[j] + b[j];
      r.dw[j] += d * xh;
      r.db[j] += d;
      s_gx += g * xh;
      s_g += g;
    }
    for (int64_t j = 0; j < cols; ++j) {
      const double xh = (xr[j] - mean) * rstd, g = dy[i * stride + j] * w[j];
      r.dx[i * cols + j] = rstd * (g - (rms ? 0 : s_g / cols) - xh * s_gx / cols);
    }
  }
  return r;
}

template <typename T>
double max_scaled_err(const std::vector<T>& got, const std::vector<double>& want, double scale) {
  double e = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = to_d(got[i]);
    if (!std::isfinite(g)) return std::numeric_limits<double>::infinity();
    e = std::max(e, std::abs(g - want[i]) / scale);
  }
  return e;
}

template <typename T, typename W>
void run_case(int64_t rows, int64_t cols, int64_t pad, bool rms, bool affine, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  const int64_t stride = cols + pad;
  std::vector<T> x(rows * stride), dy(rows * stride);
  std::vector<W> w(cols), b(cols);
  std::vector<double> xd(x.size()), dyd(x.size()), wd(cols, 1), bd(cols, 0);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = from_d<T>(3 * nd(gen) + 1.5);
    xd[i] = to_d(x[i]);
    dy[i] = from_d<T>(nd(gen));
    dyd[i] = to_d(dy[i]);
  }
  for (int64_t j = 0; j < cols; ++j) {
    w[j] = from_d<W>(1 + 0.5 * nd(gen));
    b[j] = from_d<W>(nd(gen));
    if (affine) {
      wd[j] = to_d(w[j]);
      if (!rms) bd[j] = to_d(b[j]);
    }
  }
  const double eps = 1e-5;
  const Ref ref = reference(xd, dyd, wd, bd, rows, cols, stride, eps, rms);
  using A = acc_t<T>;

  std::vector<T> y(rows * cols, poison<T>()), dx(rows * cols, poison<T>());
  std::vector<A> mean(rows, A(NAN)), rstd(rows, A(NAN));
  std::vector<W> dw(cols, poison<W>()), db(cols, poison<W>());
  FwdParams fp;
  fp.rows = rows; fp.cols = cols; fp.x_stride = stride; fp.x = x.data();
  fp.w = affine ? w.data() : nullptr;
  fp.b = affine && !rms ? b.data() : nullptr;
  fp.y = y.data(); fp.mean = rms ? nullptr : mean.data(); fp.rstd = rstd.data(); fp.eps = eps; fp.rms = rms;
  cpu::norm_fwd<T, W>(fp, cpu::serial_for());
  EXPECT_LE(max_scaled_err(y, ref.y, 1.0 + 0.0), tol<T>() * 8) << "y rows=" << rows << " cols=" << cols;
  for (int64_t i = 0; i < rows; ++i) {
    EXPECT_NEAR(double(rstd[i]), ref.rstd[i], 1e-5 * ref.rstd[i]);
    if (!rms) EXPECT_NEAR(double(mean[i]), ref.mean[i], 1e-5 * (1 + std::abs(ref.mean[i])));
  }

  BwdParams bp;
  bp.rows = rows; bp.cols = cols; bp.x_stride = stride; bp.dy_stride = stride; bp.x = x.data(); bp.dy = dy.data();
  bp.mean = rms ? nullptr : mean.data(); bp.rstd = rstd.data(); bp.w = fp.w; bp.dx = dx.data();
  bp.dw = affine ? dw.data() : nullptr; bp.db = affine && !rms ? db.data() : nullptr; bp.rms = rms;
  cpu::norm_bwd<T, W>(bp, cpu::serial_for());
  EXPECT_LE(max_scaled_err(dx, ref.dx, 1.0), tol<T>() * 16) << "dx rows=" << rows << " cols=" << cols;
  const double wscale = std::sqrt(double(rows)) + 1;  // sums over rows grow like sqrt(rows)
  if (bp.dw) EXPECT_LE(max_scaled_err(dw, ref.dw, wscale), tol<W>() * 8) << "dw";
  if (bp.db) EXPECT_LE(max_scaled_err(db, ref.db, wscale), tol<W>() * 8) << "db";

  // Same inputs, same bits.
  std::vector<W> dw2(cols, poison<W>());
  if (bp.dw) {
    bp.dw = dw2.data();
    cpu::norm_bwd<T, W>(bp, cpu::serial_for());
    EXPECT_EQ(0, std::memcmp(dw.data(), dw2.data(), cols * sizeof(W)));
  }
}

template <typename T, typename W>
void sweep() {
  uint32_t seed = 1;
  for (int64_t cols : {1, 2, 3, 127, 128, 1000, 4096})
    for (int64_t rows : {1, 7, 33})
      for (bool rms : {false, true})
        for (bool affine : {false, true}) run_case<T, W>(rows, cols, cols % 3, rms, affine, seed++);
}

}  // namespace

TEST(CpuKernels, Float64) { sweep<double, double>(); }
TEST(CpuKernels, Float64WithFloatWeights) { sweep<double, float>(); }
TEST(CpuKernels, Float32) { sweep<float, float>(); }
TEST(CpuKernels, Float16) { sweep<Half, Half>(); }
TEST(CpuKernels, Float16WithFloatWeights) { sweep<Half, float>(); }
TEST(CpuKernels, BFloat16) { sweep<BFloat16, BFloat16>(); }
TEST(CpuKernels, BFloat16WithFloatWeights) { sweep<BFloat16, float>(); }

TEST(CpuKernels, ManyRowsAcrossChunks) { run_case<float, float>(3000, 64, 0, false, true, 99); }

TEST(CpuKernels, LargeOffsetStaysAccurate) {
  // |mean| >> std: a one-pass sum of squares would lose every digit here.
  const int64_t cols = 1024;
  std::vector<float> x(cols), y(cols);
  std::mt19937 gen(5);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = 1e4f + nd(gen);
  float mean = 0, rstd = 0;
  FwdParams p;
  p.rows = 1; p.cols = cols; p.x_stride = cols; p.x = x.data(); p.y = y.data(); p.mean = &mean; p.rstd = &rstd;
  cpu::norm_fwd<float, float>(p, cpu::serial_for());
  double m = 0, v = 0;
  for (float e : x) m += e;
  m /= cols;
  for (float e : x) v += (e - m) * (e - m);
  const double want_rstd = 1 / std::sqrt(v / cols + 1e-5);
  EXPECT_NEAR(rstd, want_rstd, 1e-4 * want_rstd);
  for (int64_t j = 0; j < cols; ++j) EXPECT_NEAR(y[j], (x[j] - m) * want_rstd, 2e-3);
}

TEST(Dtypes, HalfRoundTripsEveryValue) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const Half h{uint16_t(b)};
    const float f = to_float(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(half_from_float(f).bits, h.bits) << b;
  }
}

// The branch-free conversions against a plain reference: the value of each
// half, and round-to-nearest-even of floats on both sides of every half's
// rounding boundary, plus a sweep of all float bit patterns.
namespace {
double half_value(uint16_t b) {
  const int exp = (b >> 10) & 0x1f, mant = b & 0x3ff;
  const double sign = (b & 0x8000) ? -1 : 1;
  if (exp == 31) return mant ? std::nan("") : sign * INFINITY;
  return sign * (exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25));
}
uint16_t half_rne(float f) {  // nearest half by search over magnitudes, ties to even
  if (std::isnan(f)) return uint16_t((std::signbit(f) ? 0x8000 : 0) | 0x7e00);
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(double(f));
  if (a >= 65520.0) return sign | 0x7c00;  // 65504 + half an ulp rounds to infinity
  uint16_t lo = 0, hi = 0x7bff;
  while (lo < hi) {  // the largest half <= a
    const uint16_t mid = uint16_t((lo + hi + 1) / 2);
    if (half_value(mid) <= a) lo = mid; else hi = uint16_t(mid - 1);
  }
  if (half_value(lo) == a) return sign | lo;
  const double below = a - half_value(lo), above = half_value(uint16_t(lo + 1)) - a;
  const bool up = above < below || (above == below && (lo & 1));
  return sign | uint16_t(up ? lo + 1 : lo);
}
}  // namespace

TEST(Dtypes, HalfToFloatIsExact) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const double want = half_value(uint16_t(b));
    const float got = to_float(Half{uint16_t(b)});
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << b;
    else EXPECT_EQ(double(got), want) << b;
    if (want == 0) EXPECT_EQ(std::signbit(got), bool(b & 0x8000)) << b;
  }
}

TEST(Dtypes, FloatToHalfRoundsLikeTheReference) {
  auto check = [](float f) { EXPECT_EQ(half_from_float(f).bits, half_rne(f)) << f << " bits " << float_to_bits(f); };
  for (uint32_t b = 0; b < 0x7c00; ++b) {  // around each boundary between neighbouring halves
    const double mid = (half_value(uint16_t(b)) + half_value(uint16_t(b + 1))) / 2;
    const float m = float(mid);  // exact: a half has 11 significant bits
    for (float f : {m, std::nextafter(m, 0.f), std::nextafter(m, INFINITY), float(half_value(uint16_t(b)))}) {
      check(f);
      check(-f);
    }
  }
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 65521) check(bits_to_float(uint32_t(b)));
  for (float f : {0.f, -0.f, 1e-30f, 1e-45f, 65504.f, 65519.99f, 65520.f, 1e10f, INFINITY, -INFINITY, NAN})
    check(f);
}

TEST(Dtypes, HalfRoundsToNearestEven) {
  EXPECT_EQ(half_from_float(1.0f + 1.0f / 2048).bits, 0x3c00);      // tie -> even (down)
  EXPECT_EQ(half_from_float(1.0f + 3.0f / 2048).bits, 0x3c02);      // tie -> even (up)
  EXPECT_EQ(half_from_float(65520.0f).bits, 0x7c00);                // overflow -> inf
  EXPECT_EQ(half_from_float(65504.0f).bits, 0x7bff);
  EXPECT_EQ(half_from_float(5.9604645e-8f).bits, 0x0001);           // smallest subnormal
  EXPECT_TRUE(std::isnan(to_float(half_from_float(NAN))));
}

TEST(Dtypes, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(bf16_from_float(1.0f).bits, 0x3f80);
  EXPECT_EQ(bf16_from_float(bits_to_float(0x3f808000u)).bits, 0x3f80);  // tie -> even (down)
  EXPECT_EQ(bf16_from_float(bits_to_float(0x3f818000u)).bits, 0x3f82);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(to_float(bf16_from_float(NAN))));
}
