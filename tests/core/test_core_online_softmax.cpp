/// @file test_core_online_softmax.cpp
/// @brief core/online_softmax.hpp: the empty accumulator, agreement with a double reference
///        over blocked streams, large scores, merging partial accumulators, NaN propagation.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "attnstate/core/online_softmax.hpp"

namespace attnstate {
namespace {

/// Runs the documented producer loop over `scores` (raw q.k) and scalar values `v` in blocks of
/// `block`, returning o and writing the LSE in `base`.
float run(const std::vector<float>& scores, const std::vector<float>& v, float scale,
          std::size_t block, LseBase base, float* lse) {
  math::OnlineSoftmax sm;
  float acc = 0.f;
  const float s2s = math::base2_score_scale(scale);
  for (std::size_t i0 = 0; i0 < scores.size(); i0 += block) {
    const std::size_t n = std::min(block, scores.size() - i0);
    float bmax = math::neg_inf();
    for (std::size_t i = 0; i < n; ++i) bmax = math::nan_max(bmax, scores[i0 + i] * s2s);
    acc *= sm.rescale(bmax);
    float psum = 0.f;
    for (std::size_t i = 0; i < n; ++i) {
      const float p = sm.prob(scores[i0 + i] * s2s);
      psum += p;
      acc += p * v[i0 + i];
    }
    sm.add(psum);
  }
  *lse = sm.lse(base);
  return acc * sm.inv_sum();
}

void reference(const std::vector<float>& scores, const std::vector<float>& v, double scale,
               double* o, double* lse_nat) {
  double m = -INFINITY;
  for (float s : scores) m = std::max(m, s * scale);
  double sum = 0, acc = 0;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    const double p = std::exp(scores[i] * scale - m);
    sum += p;
    acc += p * v[i];
  }
  *o = acc / sum;
  *lse_nat = m + std::log(sum);
}

TEST(OnlineSoftmax, NoScoresGivesEmptyState) {
  math::OnlineSoftmax sm;
  EXPECT_TRUE(sm.empty());
  EXPECT_EQ(sm.inv_sum(), 0.f);
  EXPECT_EQ(sm.lse(LseBase::kNatural), -INFINITY);
  EXPECT_EQ(sm.lse(LseBase::kBase2), -INFINITY);
  EXPECT_EQ(sm.rescale(-INFINITY), 1.f);  // a block of -inf scores changes nothing
  EXPECT_TRUE(sm.empty());
  float lse;
  EXPECT_EQ(run({}, {}, 1.f, 16, LseBase::kNatural, &lse), 0.f);
  EXPECT_EQ(lse, -INFINITY);
}

TEST(OnlineSoftmax, MatchesDoubleReferenceForAnyBlocking) {
  std::mt19937 rng(31);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::uniform_int_distribution<int> un(1, 300), ub(1, 70);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = un(rng);
    std::vector<float> s(n), v(n);
    for (int i = 0; i < n; ++i) {
      s[i] = nd(rng);
      v[i] = nd(rng);
    }
    const float scale = 0.3f;
    double o_ref, lse_ref;
    reference(s, v, scale, &o_ref, &lse_ref);
    for (LseBase base : {LseBase::kNatural, LseBase::kBase2}) {
      float lse;
      const float o = run(s, v, scale, static_cast<std::size_t>(ub(rng)), base, &lse);
      ASSERT_NEAR(o, o_ref, 2e-5 * 3);
      const double lse_nat = base == LseBase::kBase2 ? lse * 0.69314718055994530942 : lse;
      ASSERT_NEAR(lse_nat, lse_ref, 2e-6 * std::fabs(lse_ref) + 2e-6);
    }
  }
}

TEST(OnlineSoftmax, LargeScoresStayFinite) {
  std::mt19937 rng(32);
  std::uniform_real_distribution<float> us(200.f, 900.f), uv(-1.f, 1.f);
  std::vector<float> s(1000), v(1000);
  for (int i = 0; i < 1000; ++i) {
    s[i] = us(rng);
    v[i] = uv(rng);
  }
  double o_ref, lse_ref;
  reference(s, v, 1.0, &o_ref, &lse_ref);
  float lse;
  const float o = run(s, v, 1.f, 64, LseBase::kNatural, &lse);
  ASSERT_TRUE(std::isfinite(o) && std::isfinite(lse));
  EXPECT_NEAR(o, o_ref, 1e-4);
  EXPECT_NEAR(lse, lse_ref, 1e-4 * lse_ref);
}

TEST(OnlineSoftmax, MergingPartialAccumulatorsEqualsOneStream) {
  std::mt19937 rng(33);
  std::normal_distribution<float> nd(0.f, 4.f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> s(64), v(64);
    for (int i = 0; i < 64; ++i) {
      s[i] = nd(rng);
      v[i] = nd(rng);
    }
    const int cut = trial % 65;  // 0 and 64: one side empty
    auto partial = [&](int b, int e, float* acc) {
      math::OnlineSoftmax sm;
      *acc = 0.f;
      for (int i = b; i < e; ++i) {
        *acc *= sm.rescale(s[i]);
        const float p = sm.prob(s[i]);
        sm.add(p);
        *acc += p * v[i];
      }
      return sm;
    };
    float acc_a, acc_b, acc_all;
    math::OnlineSoftmax a = partial(0, cut, &acc_a);
    math::OnlineSoftmax b = partial(cut, 64, &acc_b);
    math::OnlineSoftmax all = partial(0, 64, &acc_all);
    const math::OnlineSoftmax::Factors f = a.merge(b);
    const float acc = acc_a * f.self + acc_b * f.other;
    EXPECT_NEAR(acc * a.inv_sum(), acc_all * all.inv_sum(), 1e-5);
    EXPECT_NEAR(a.lse(LseBase::kBase2), all.lse(LseBase::kBase2), 1e-5);
  }
  math::OnlineSoftmax e1, e2;
  const math::OnlineSoftmax::Factors f = e1.merge(e2);
  EXPECT_TRUE(e1.empty());
  EXPECT_EQ(f.other, 0.f);
}

TEST(OnlineSoftmax, NaNScorePropagates) {
  float lse;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float o = run({1.f, nan, 2.f}, {1.f, 1.f, 1.f}, 1.f, 2, LseBase::kNatural, &lse);
  EXPECT_TRUE(std::isnan(o));
  EXPECT_TRUE(std::isnan(lse));
}

TEST(OnlineSoftmax, ScoreScaleIsLog2e) {
  EXPECT_FLOAT_EQ(math::base2_score_scale(1.f), 1.4426950408889634f);
  EXPECT_FLOAT_EQ(math::base2_score_scale(0.125f), 0.125f * 1.4426950408889634f);
}

}  // namespace
}  // namespace attnstate
