/// @file test_core_merge_math.cpp
/// @brief core/merge_math.hpp: pairwise and n-ary merge against a double reference, the empty
///        state (bitwise identity, its o never read), NaN and +inf propagation, stability at
///        LSE +-1e4, and LSE base conversion.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attnstate/core/merge_math.hpp"

namespace attnstate {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const LseBase kBases[] = {LseBase::kNatural, LseBase::kBase2};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

/// Natural-log value of an LSE stored in `base`, in double.
double nat(float lse, LseBase base) {
  return base == LseBase::kBase2 ? lse * 0.69314718055994530942 : lse;
}

/// n-ary merge through the documented usage of merge_weight / merge_finalize.
float nary(LseBase base, const std::vector<float>& lse, const std::vector<float>& o,
           float* lse_out) {
  float m = math::neg_inf();
  for (float l : lse) m = math::nan_max(m, l);
  float sum = 0.f, acc = 0.f;
  for (std::size_t i = 0; i < lse.size(); ++i) {
    if (math::is_empty_lse(lse[i])) continue;
    const float w = math::merge_weight(base, lse[i], m);
    sum += w;
    acc += w * o[i];
  }
  const math::MergeResult r = math::merge_finalize(base, m, sum);
  *lse_out = r.lse;
  return acc * r.inv_sum;
}

TEST(PairMerge, MatchesDoubleReference) {
  std::mt19937 rng(21);
  std::uniform_real_distribution<float> ul(-30.f, 30.f), uo(-3.f, 3.f);
  for (LseBase base : kBases)
    for (int i = 0; i < 20000; ++i) {
      const float la = ul(rng), lb = ul(rng), oa = uo(rng), ob = uo(rng);
      const math::PairWeights p = math::pair_weights(base, la, lb);
      const float o = math::pair_combine(p, oa, ob);
      const double a = nat(la, base), b = nat(lb, base), m = std::max(a, b);
      const double wa = std::exp(a - m), wb = std::exp(b - m);
      const double o_ref = (wa * oa + wb * ob) / (wa + wb);
      const double lse_ref = m + std::log(wa + wb);
      ASSERT_NEAR(o, o_ref, 3e-6 * 3) << la << " " << lb;
      ASSERT_NEAR(nat(p.lse, base), lse_ref, 2e-6 * std::fabs(lse_ref) + 1e-6);
      EXPECT_FALSE(p.a_empty || p.b_empty);
    }
}

TEST(PairMerge, EmptySideIsBitwiseIdentityAndItsONeverRead) {
  std::mt19937 rng(22);
  std::uniform_real_distribution<float> ul(-1e4f, 1e4f), uo(-3.f, 3.f);
  for (LseBase base : kBases)
    for (int i = 0; i < 1000; ++i) {
      const float l = ul(rng), o = uo(rng);
      const math::PairWeights p1 = math::pair_weights(base, l, math::neg_inf());
      EXPECT_TRUE(same_bits(p1.lse, l));
      EXPECT_TRUE(p1.b_empty && !p1.a_empty);
      EXPECT_TRUE(same_bits(math::pair_combine(p1, o, kNaN), o));  // NaN o of the empty side
      const math::PairWeights p2 = math::pair_weights(base, math::neg_inf(), l);
      EXPECT_TRUE(same_bits(p2.lse, l));
      EXPECT_TRUE(same_bits(math::pair_combine(p2, kNaN, o), o));
    }
  EXPECT_TRUE(same_bits(
      math::pair_combine(math::pair_weights(LseBase::kNatural, 1.f, -INFINITY), -0.f, kNaN), -0.f));
}

TEST(PairMerge, BothEmptyGivesZeroAndNegInf) {
  for (LseBase base : kBases) {
    const math::PairWeights p = math::pair_weights(base, math::neg_inf(), math::neg_inf());
    EXPECT_EQ(p.lse, -INFINITY);
    EXPECT_TRUE(same_bits(math::pair_combine(p, kNaN, kNaN), 0.f));
  }
}

TEST(PairMerge, NaNInNonEmptyInputPropagates) {
  for (LseBase base : kBases) {
    const math::PairWeights p = math::pair_weights(base, kNaN, 1.f);
    EXPECT_TRUE(std::isnan(p.lse));
    EXPECT_TRUE(std::isnan(math::pair_combine(p, 1.f, 2.f)));
    const math::PairWeights q = math::pair_weights(base, 1.f, 2.f);
    EXPECT_TRUE(std::isnan(math::pair_combine(q, kNaN, 2.f)));
    EXPECT_TRUE(std::isnan(math::pair_combine(q, 1.f, kNaN)));
    // NaN lse against an empty side is still NaN, in o too (as in the n-ary merge).
    for (bool a_side : {true, false}) {
      const math::PairWeights e = a_side ? math::pair_weights(base, kNaN, -INFINITY)
                                         : math::pair_weights(base, -INFINITY, kNaN);
      EXPECT_TRUE(std::isnan(e.lse));
      EXPECT_TRUE(std::isnan(a_side ? math::pair_combine(e, 0.5f, kNaN)
                                    : math::pair_combine(e, kNaN, 0.5f)));
    }
  }
}

TEST(PairMerge, PositiveInfiniteLseGivesNaN) {
  for (LseBase base : kBases) {
    const math::PairWeights p = math::pair_weights(base, INFINITY, 0.f);
    EXPECT_TRUE(std::isnan(p.lse));
    EXPECT_TRUE(std::isnan(math::pair_combine(p, 1.f, 1.f)));
    float lse;
    EXPECT_TRUE(std::isnan(nary(base, {INFINITY, 3.f}, {1.f, 1.f}, &lse)));
    EXPECT_TRUE(std::isnan(lse));
    // against an empty side too: the pairwise and n-ary merges agree
    for (bool a_side : {true, false}) {
      const math::PairWeights e = a_side ? math::pair_weights(base, INFINITY, -INFINITY)
                                         : math::pair_weights(base, -INFINITY, INFINITY);
      EXPECT_TRUE(std::isnan(e.lse));
      EXPECT_TRUE(
          std::isnan(a_side ? math::pair_combine(e, 0.5f, 0.f) : math::pair_combine(e, 0.f, 0.5f)));
    }
    EXPECT_TRUE(std::isnan(nary(base, {INFINITY, -INFINITY}, {0.5f, 1.f}, &lse)));
    EXPECT_TRUE(std::isnan(lse));
  }
}

TEST(PairMerge, StableAtLseOfTenThousand) {
  for (LseBase base : kBases)
    for (float centre : {1e4f, -1e4f}) {
      const float la = centre, lb = centre - 2.5f;
      const math::PairWeights p = math::pair_weights(base, la, lb);
      const float o = math::pair_combine(p, 1.f, -1.f);
      ASSERT_TRUE(std::isfinite(p.lse) && std::isfinite(o));
      const double a = nat(la, base), b = nat(lb, base), m = std::max(a, b);
      const double wa = std::exp(a - m), wb = std::exp(b - m);
      EXPECT_NEAR(o, (wa - wb) / (wa + wb), 1e-6);
      EXPECT_NEAR(nat(p.lse, base), m + std::log(wa + wb), 2e-3);  // fp32 ulp at 1e4 is ~1e-3
    }
}

TEST(NaryMerge, MatchesDoubleReferenceWithEmptyInputs) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> ul(-40.f, 40.f), uo(-3.f, 3.f);
  std::uniform_int_distribution<int> un(1, 12), ue(0, 3);
  for (LseBase base : kBases)
    for (int i = 0; i < 5000; ++i) {
      const int n = un(rng);
      std::vector<float> lse(n), o(n);
      double m = -INFINITY;
      for (int k = 0; k < n; ++k) {
        const bool empty = ue(rng) == 0;
        lse[k] = empty ? -INFINITY : ul(rng);
        o[k] = empty ? kNaN : uo(rng);  // an empty input's o must never be read
        m = std::max(m, nat(lse[k], base));
      }
      float lse_out;
      const float got = nary(base, lse, o, &lse_out);
      if (m == -INFINITY) {
        EXPECT_EQ(lse_out, -INFINITY);
        EXPECT_TRUE(same_bits(got, 0.f));
        continue;
      }
      double sum = 0, acc = 0;
      for (int k = 0; k < n; ++k) {
        if (lse[k] == -INFINITY) continue;
        const double w = std::exp(nat(lse[k], base) - m);
        sum += w;
        acc += w * o[k];
      }
      ASSERT_NEAR(got, acc / sum, 1e-5);
      ASSERT_NEAR(nat(lse_out, base), m + std::log(sum), 2e-6 * std::fabs(m) + 2e-6);
    }
}

TEST(NaryMerge, SingleNonEmptyInputPassesThroughBitwise) {
  std::mt19937 rng(24);
  std::uniform_real_distribution<float> ul(-1e4f, 1e4f), uo(-3.f, 3.f);
  for (LseBase base : kBases)
    for (int i = 0; i < 1000; ++i) {
      const float l = ul(rng), o = uo(rng);
      float lse_out;
      const float got = nary(base, {-INFINITY, l, -INFINITY}, {kNaN, o, kNaN}, &lse_out);
      EXPECT_TRUE(same_bits(got, o));
      EXPECT_TRUE(same_bits(lse_out, l));
    }
}

TEST(NaryMerge, AllEmptyFinalizesToZeroAndNegInf) {
  for (LseBase base : kBases) {
    const math::MergeResult r = math::merge_finalize(base, math::neg_inf(), 0.f);
    EXPECT_EQ(r.lse, -INFINITY);
    EXPECT_EQ(r.inv_sum, 0.f);
  }
}

TEST(NanMax, PropagatesNaNFromEitherSide) {
  EXPECT_TRUE(std::isnan(math::nan_max(kNaN, 1.f)));
  EXPECT_TRUE(std::isnan(math::nan_max(1.f, kNaN)));
  EXPECT_TRUE(std::isnan(math::nan_max(-INFINITY, kNaN)));
  EXPECT_EQ(math::nan_max(-INFINITY, 2.f), 2.f);
  EXPECT_EQ(math::nan_max(3.f, 2.f), 3.f);
}

TEST(ConvertLse, RoundTripsAndPreservesSpecials) {
  std::mt19937 rng(25);
  std::uniform_real_distribution<float> ul(-1e4f, 1e4f);
  for (int i = 0; i < 10000; ++i) {
    const float l = ul(rng);
    EXPECT_TRUE(same_bits(math::convert_lse(l, LseBase::kBase2, LseBase::kBase2), l));
    EXPECT_TRUE(same_bits(math::convert_lse(l, LseBase::kNatural, LseBase::kNatural), l));
    const float b2 = math::convert_lse(l, LseBase::kNatural, LseBase::kBase2);
    EXPECT_NEAR(b2, l / 0.69314718055994530942, 1e-6 * std::fabs(b2) + 1e-30);
    const float back = math::convert_lse(b2, LseBase::kBase2, LseBase::kNatural);
    EXPECT_NEAR(back, l, 3e-7 * std::fabs(l) + 1e-30);
  }
  for (LseBase from : kBases)
    for (LseBase to : kBases) {
      EXPECT_EQ(math::convert_lse(-INFINITY, from, to), -INFINITY);
      EXPECT_EQ(math::convert_lse(INFINITY, from, to), INFINITY);
      EXPECT_TRUE(std::isnan(math::convert_lse(kNaN, from, to)));
    }
}

TEST(ConvertLse, MergeInEitherBaseDescribesTheSameState) {
  std::mt19937 rng(26);
  std::uniform_real_distribution<float> ul(-20.f, 20.f), uo(-1.f, 1.f);
  for (int i = 0; i < 5000; ++i) {
    const float la = ul(rng), lb = ul(rng), oa = uo(rng), ob = uo(rng);
    const math::PairWeights pn = math::pair_weights(LseBase::kNatural, la, lb);
    const math::PairWeights p2 = math::pair_weights(
        LseBase::kBase2, math::convert_lse(la, LseBase::kNatural, LseBase::kBase2),
        math::convert_lse(lb, LseBase::kNatural, LseBase::kBase2));
    EXPECT_NEAR(math::pair_combine(pn, oa, ob), math::pair_combine(p2, oa, ob), 5e-6);
    EXPECT_NEAR(math::convert_lse(p2.lse, LseBase::kBase2, LseBase::kNatural), pn.lse,
                1e-5 + 1e-6 * std::fabs(pn.lse));
  }
}

}  // namespace
}  // namespace attnstate
