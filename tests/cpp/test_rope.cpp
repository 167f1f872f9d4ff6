// The rotary embedding's building blocks without a GPU: the CPU kernel
// against double arithmetic (both pairings, partial rotary, GQA, strided
// layouts, broadcast cos/sin, the backward as the transpose), and the launch
// rule's invariants.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/dtypes.h"
#include "kernels/rope/cpu.h"
#include "kernels/rope/cuda/plan.h"

namespace {

struct Serial {  // the parallel-for the kernels take, on one thread
  template <typename F>
  void operator()(int64_t n, F&& f) const {
    f(int64_t(0), n);
  }
};

// Forward (or backward) of one head in double: out[i] = x[i] c[i] + s x[j] sin[i]
// (backward: x[i] c[i] - s x[j] sin[j]).
std::vector<double> rotate(const std::vector<double>& x, const double* c, const double* sn, int64_t rot,
                           bool interleaved, bool backward) {
  std::vector<double> out(x);
  for (int64_t i = 0; i < rot; ++i) {
    const bool first = interleaved ? i % 2 == 0 : i < rot / 2;
    const int64_t j = interleaved ? (i ^ 1) : first ? i + rot / 2 : i - rot / 2;
    const double s = first ? -1 : 1;
    out[i] = x[i] * c[i] + (backward ? -s * x[j] * sn[j] : s * x[j] * sn[i]);
  }
  return out;
}

struct Case {
  int64_t batch, seq, hq, hk, dim, rot;
  bool interleaved, backward, bshd, shared_cos;
};

template <typename T>
void run_case(const Case& cs, double tol) {
  std::mt19937 rng(1234);
  std::normal_distribution<double> nd;
  const int64_t b = cs.batch, s = cs.seq, dim = cs.dim, rot = cs.rot;
  auto make = [&](int64_t heads) {
    std::vector<T> v(static_cast<size_t>(b * s * heads * dim));
    for (auto& e : v) e = fln::store_as<T>(fln::acc_t<T>(nd(rng)));
    return v;
  };
  // [b, h, s, d] (bhsd) or [b, s, h, d] (bshd) strides.
  auto strides = [&](int64_t heads) {
    return cs.bshd ? fln::RopeStrides{s * heads * dim, heads * dim, dim} : fln::RopeStrides{heads * s * dim, dim, s * dim};
  };
  std::vector<T> q = make(cs.hq), k = make(cs.hk), qo(q.size()), ko(k.size());
  const int64_t cb = cs.shared_cos ? 1 : b;
  std::vector<T> cos(static_cast<size_t>(cb * s * rot)), sin(cos.size());
  for (size_t i = 0; i < cos.size(); ++i) {
    cos[i] = fln::store_as<T>(fln::acc_t<T>(std::cos(nd(rng) * 3)));
    sin[i] = fln::store_as<T>(fln::acc_t<T>(std::sin(nd(rng) * 3)));
  }
  fln::RopeParams p;
  p.batch = b;
  p.seq = s;
  p.heads_q = cs.hq;
  p.heads_k = cs.hk;
  p.head_dim = dim;
  p.rotary_dim = rot;
  p.q = q.data();
  p.q_in = p.q_out_strides = strides(cs.hq);
  p.q_out = qo.data();
  p.k = k.data();
  p.k_in = p.k_out_strides = strides(cs.hk);
  p.k_out = ko.data();
  p.cos = cos.data();
  p.sin = sin.data();
  p.cs_batch = cs.shared_cos ? 0 : s * rot;
  p.cs_seq = rot;
  p.interleaved = cs.interleaved;
  p.backward = cs.backward;
  fln::cpu::rope<T, T>(p, Serial{});
  auto expect = [&](const std::vector<T>& in, const std::vector<T>& out, int64_t heads, const fln::RopeStrides& st) {
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t si = 0; si < s; ++si) {
        std::vector<double> c(static_cast<size_t>(rot)), sn(static_cast<size_t>(rot));
        for (int64_t i = 0; i < rot; ++i) {
          const int64_t o = (cs.shared_cos ? 0 : bi * s * rot) + si * rot + i;
          c[i] = fln::load_as<double>(cos[o]);
          sn[i] = fln::load_as<double>(sin[o]);
        }
        for (int64_t h = 0; h < heads; ++h) {
          const int64_t base = bi * st.batch + si * st.seq + h * st.head;
          std::vector<double> x(static_cast<size_t>(dim));
          for (int64_t i = 0; i < dim; ++i) x[i] = fln::load_as<double>(in[base + i]);
          const std::vector<double> e = rotate(x, c.data(), sn.data(), rot, cs.interleaved, cs.backward);
          for (int64_t i = 0; i < dim; ++i)
            ASSERT_NEAR(fln::load_as<double>(out[base + i]), e[i], tol * (1 + std::abs(e[i])))
                << "b " << bi << " s " << si << " head " << h << " i " << i;
        }
      }
  };
  expect(q, qo, cs.hq, strides(cs.hq));
  expect(k, ko, cs.hk, strides(cs.hk));
}

const Case kCases[] = {
    {2, 5, 4, 2, 64, 64, false, false, false, false}, {2, 5, 4, 2, 64, 64, true, false, false, false},
    {2, 5, 4, 2, 64, 64, false, true, true, false},   {2, 5, 4, 2, 64, 64, true, true, true, true},
    {1, 3, 3, 1, 80, 48, false, false, true, true},   {1, 3, 3, 1, 80, 48, true, true, false, false},
    {3, 1, 1, 1, 2, 2, false, true, false, false},    {2, 7, 2, 2, 6, 4, true, false, true, true},
};

TEST(RopeCpu, FloatAgainstDouble) {
  for (const Case& c : kCases) run_case<float>(c, 1e-6);
}
TEST(RopeCpu, DoubleAgainstDouble) {
  for (const Case& c : kCases) run_case<double>(c, 1e-14);
}
TEST(RopeCpu, BFloat16AgainstDouble) {  // one rounding of the fp32 result: half an ulp of bf16
  for (const Case& c : kCases) run_case<fln::BFloat16>(c, 1.0 / 128);
}
TEST(RopeCpu, HalfAgainstDouble) {
  for (const Case& c : kCases) run_case<fln::Half>(c, 1.0 / 1024);
}

// The launch rule: whole CTAs of at most kCtaThreads threads, every unit of a
// head covered, vec only where asked, and the grid covering every token.
TEST(RopePlan, Invariants) {
  using namespace fln::cuda::rotary;
  for (int eb : {2, 4, 8})
    for (bool vec_ok : {true, false})
      for (int64_t dim : {2, 6, 64, 80, 128, 256, 512, 4096})
        for (int64_t rows : {1, 2, 5, 40, 72, 1000})
          for (int64_t tokens : {1, 7, 100000}) {
            if (vec_ok && dim % (2 * (16 / eb)) != 0) continue;
            const Plan p = make_plan(tokens, rows, dim, eb, vec_ok);
            const int threads = p.threads_x * p.threads_y * p.threads_z;
            ASSERT_GE(threads, 1);
            ASSERT_LE(threads, kCtaThreads);
            ASSERT_EQ(p.vec, vec_ok ? 16 / eb : 1);
            ASSERT_LE(p.threads_x, dim / (2 * p.vec));
            ASSERT_LE(p.threads_y, (rows + kRowsInFlight - 1) / kRowsInFlight);
            ASSERT_GE(p.grid * p.threads_z, tokens < kMaxGrid ? tokens : kMaxGrid);
          }
}

}  // namespace
