/// @file test_testing_reference.cpp
/// @brief The kit's double reference, storage types and comparisons: the reference obeys the
///        algebra (properties: property_tests/testing/prop_testing_kit.cpp), `HostState`
///        round-trips through views, and comparisons flag what they must.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/gtest.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace {

using namespace attnstate::testing;  // NOLINT(google-build-using-namespace): test file
using attnstate::DType;
using attnstate::LseBase;

constexpr double kTight = 1e-12;

TEST(KitReference, EmptyKeySetGivesIdentity) {
  const AttentionProblem p = make_problem(1, 2, 1, 2, 1, DType::kF32, {1, 2, 3, 4}, {1, 1}, {5, 6},
                                          1.f, DType::kF32, LseBase::kNatural);
  const ReferenceState r = reference_state(p, {});
  for (double lse : r.lse) EXPECT_EQ(lse, -std::numeric_limits<double>::infinity());
  for (double o : r.o) EXPECT_EQ(o, 0.0);
}

TEST(KitReference, SingleKeyStateIsItsValueAndScore) {
  // One key: o = v, lse = scale·q·k.
  const AttentionProblem p = make_problem(1, 1, 1, 2, 1, DType::kF32, {0.5f, -1.f}, {2.f, 3.f},
                                          {0.25f, -0.75f}, 0.5f, DType::kF32, LseBase::kBase2);
  const ReferenceState r = reference_state(p, {0});
  EXPECT_DOUBLE_EQ(r.o_at(0, 0, 0), 0.25);
  EXPECT_DOUBLE_EQ(r.o_at(0, 0, 1), -0.75);
  EXPECT_NEAR(r.lse_at(0, 0), 0.5 * (1.0 - 3.0) * 1.4426950408889634, 1e-15);
}

TEST(KitReference, MergeSkipsEmptyNaNAndPropagatesRealNaN) {
  HostState a(1, 1, 2, DType::kF32, LseBase::kNatural);
  a.set_lse(0, 0, 0.5f);
  a.set_o(0, 0, 0, 1.f);
  a.set_o(0, 0, 1, 2.f);
  HostState empty(1, 1, 2, DType::kF32, LseBase::kBase2);
  empty.set_o(0, 0, 0, std::numeric_limits<float>::quiet_NaN());
  const ReferenceState m = reference_merge({a, empty}, LseBase::kNatural);
  EXPECT_DOUBLE_EQ(m.lse_at(0, 0), 0.5);
  EXPECT_DOUBLE_EQ(m.o_at(0, 0, 1), 2.0);
  HostState nan = a;
  nan.set_o(0, 0, 1, std::numeric_limits<float>::quiet_NaN());
  const ReferenceState n = reference_merge({a, nan}, LseBase::kNatural);
  EXPECT_TRUE(std::isnan(n.o_at(0, 0, 1)));
  EXPECT_FALSE(std::isnan(n.o_at(0, 0, 0)));
}

TEST(KitReference, PerTokenCausalRowsAndArgumentErrors) {
  // Two query tokens over three keys, causally: token 0 sees key 0, token 1 keys 0 and 1; key
  // 2 is never read (NaN).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const AttentionProblem p = make_problem(2, 1, 1, 1, 3, DType::kF32, {1.f, 2.f}, {1.f, 0.f, nan},
                                          {3.f, 5.f, nan}, 1.f, DType::kF32, LseBase::kNatural);
  const ReferenceState r = reference_state_per_token(p, {{0}, {0, 1}}, LseBase::kNatural);
  EXPECT_DOUBLE_EQ(r.o_at(0, 0, 0), 3.0);
  EXPECT_DOUBLE_EQ(r.lse_at(0, 0), 1.0);
  const double w0 = std::exp(2.0), w1 = 1.0;  // scores 2 and 0
  EXPECT_NEAR(r.o_at(1, 0, 0), (3.0 * w0 + 5.0 * w1) / (w0 + w1), 1e-15);
  EXPECT_NEAR(r.lse_at(1, 0), std::log(w0 + w1), 1e-15);
  // An empty list: that token's row is the identity.
  const ReferenceState e = reference_state_per_token(p, {{}, {1}}, LseBase::kBase2);
  EXPECT_EQ(e.lse_at(0, 0), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(e.o_at(0, 0, 0), 0.0);
  EXPECT_DOUBLE_EQ(e.o_at(1, 0, 0), 5.0);
  const auto message = [&](const std::vector<std::vector<std::int64_t>>& keys) {
    try {
      reference_state_per_token(p, keys, LseBase::kNatural);
    } catch (const attnstate::Error& err) {
      return std::string(err.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{0}}).find("argument 'keys_per_token': expected one key list per query "
                                "token (2), got 1 lists"),
            std::string::npos)
      << message({{0}});
  EXPECT_NE(message({{0}, {0, 3}}).find("argument 'keys_per_token[1][1]'"), std::string::npos)
      << message({{0}, {0, 3}});
}

TEST(KitHostState, FreshStateIsIdentityAndViewRoundTrips) {
  HostState s(2, 3, 4, DType::kBF16, LseBase::kBase2);
  for (float lse : s.lse_values()) EXPECT_EQ(lse, -INFINITY);
  s.set_o(1, 2, 3, 0.3f);
  s.set_lse(1, 2, 7.f);
  EXPECT_EQ(s.o(1, 2, 3), attnstate::to_float(attnstate::from_float<attnstate::bfloat16_t>(0.3f)));
  const HostState copy = HostState::from_view(s.view());
  EXPECT_TRUE(bitwise_equal(s, copy));
  EXPECT_EQ(compare_bitwise(s, copy), "");
  EXPECT_EQ(s.const_view().dtype, DType::kBF16);
  EXPECT_EQ(s.const_view().base, LseBase::kBase2);
}

TEST(KitHostState, ConvertedRebasesLseAndRoundsO) {
  HostState s(1, 1, 1, DType::kF32, LseBase::kNatural);
  s.set_lse(0, 0, 2.f);
  s.set_o(0, 0, 0, 0.1f);
  const HostState c = s.converted(DType::kF16, LseBase::kBase2);
  EXPECT_FLOAT_EQ(c.lse(0, 0), 2.f * attnstate::constants::kLog2e);
  EXPECT_EQ(c.o(0, 0, 0), attnstate::to_float(attnstate::from_float<attnstate::half_t>(0.1f)));
  ATTNSTATE_EXPECT_STATES_CLOSE(c, s, tolerance_for(DType::kF16));
}

TEST(KitTolerance, CompareFlagsEachKindOfMismatch) {
  HostState want(1, 1, 2, DType::kF32, LseBase::kNatural);
  want.set_lse(0, 0, 1.f);
  want.set_o(0, 0, 0, 0.5f);
  want.set_o(0, 0, 1, -0.5f);
  const Tolerance tol = tolerance_for(DType::kF32);
  EXPECT_EQ(compare_states(want, want, tol), "");

  HostState off = want;
  off.set_o(0, 0, 1, -0.5f + 1e-3f);
  EXPECT_NE(compare_states(off, want, tol).find("o[0,0,1]"), std::string::npos);

  HostState relabeled = want;  // same numbers, other base: the LSE is wrong
  relabeled.relabel_base(LseBase::kBase2);
  EXPECT_NE(compare_states(relabeled, want, tol).find("lse[0,0]"), std::string::npos);

  HostState inf = want;
  inf.set_lse(0, 0, INFINITY);
  EXPECT_NE(compare_states(inf, want, tol), "");

  HostState nan_o_in_empty(1, 1, 2, DType::kF32, LseBase::kNatural);
  HostState identity = nan_o_in_empty;
  nan_o_in_empty.set_o(0, 0, 0, std::numeric_limits<float>::quiet_NaN());
  EXPECT_NE(compare_states(nan_o_in_empty, identity, Tolerance{}).find("exactly 0"),
            std::string::npos);

  HostState nan_lse = want;
  nan_lse.set_lse(0, 0, std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(compare_states(nan_lse, nan_lse, tol), "");  // NaN expected, NaN got
  EXPECT_NE(compare_states(want, nan_lse, tol).find("expected NaN"), std::string::npos);
}

TEST(KitTolerance, StatesCloseTakesAHostStateOrAReferenceState) {
  HostState want(1, 1, 2, DType::kF32, LseBase::kNatural);
  want.set_lse(0, 0, 1.f);
  want.set_o(0, 0, 0, 0.5f);
  want.set_o(0, 0, 1, -0.5f);
  const Tolerance tol = tolerance_for(DType::kF32);
  HostState off = want;
  off.set_o(0, 0, 1, -0.5f + 1e-3f);

  // Expected as a stored state (the overload of compare_states / ATTNSTATE_EXPECT_STATES_CLOSE).
  EXPECT_TRUE(states_close(want, want, tol));
  EXPECT_FALSE(states_close(off, want, tol));
  EXPECT_TRUE(states_close(want.converted(DType::kF32, LseBase::kBase2), want, tol));
  // Expected in double.
  EXPECT_TRUE(states_close(want, to_reference(want), tol));
  EXPECT_FALSE(states_close(off, to_reference(want), tol));
  // Both forms agree with compare_states.
  EXPECT_EQ(states_close(off, want, tol), compare_states(off, want, tol).empty());
}

/// One query row, one head, head_dim 1, keys with score 0 (equal weights) and values `v`.
AttentionProblem equal_weight_problem(const std::vector<float>& v, DType dtype = DType::kF32,
                                      DType out = DType::kF32) {
  const std::vector<float> k(v.size(), 0.f);
  return make_problem(1, 1, 1, 1, static_cast<std::int64_t>(v.size()), dtype, {1.f}, k, v, 1.f, out,
                      LseBase::kNatural);
}

TEST(KitReference, StatesCarryTheMagnitudeOfTheirTerms) {
  // o = (0.5 - 0.5) / 2 = 0 but the terms are of magnitude 0.5: o_magnitude = Σ w_i |v_i|.
  const AttentionProblem p = equal_weight_problem({0.5f, -0.5f});
  const ReferenceState r = reference_state(p, all_keys(2));
  ASSERT_TRUE(r.has_o_magnitude());
  EXPECT_NEAR(r.o[0], 0.0, kTight);
  EXPECT_NEAR(r.o_magnitude[0], 0.5, kTight);
  const ReferenceState empty = reference_state(p, {});
  ASSERT_TRUE(empty.has_o_magnitude());
  EXPECT_EQ(empty.o_magnitude[0], 0.0);

  // A merge averages the inputs' magnitudes with the merge weights: the parts' states merge
  // into the magnitude of the whole ...
  const ReferenceState merged =
      reference_merge({reference_state(p, {0}), reference_state(p, {1})}, LseBase::kBase2);
  ASSERT_TRUE(merged.has_o_magnitude());
  EXPECT_NEAR(merged.o_magnitude[0], 0.5, kTight);
  // ... but has none when an input is a stored state (whose terms are unknown).
  HostState a(1, 1, 1, DType::kBF16, LseBase::kNatural), b = a;
  a.set_lse(0, 0, 0.f);
  a.set_o(0, 0, 0, 0.25f);
  b.set_lse(0, 0, 0.f);
  b.set_o(0, 0, 0, -0.75f);
  EXPECT_FALSE(to_reference(a).has_o_magnitude());
  const ReferenceState stored = reference_merge(std::vector<HostState>{a, b}, LseBase::kNatural);
  EXPECT_NEAR(stored.o[0], -0.25, kTight);
  EXPECT_FALSE(stored.has_o_magnitude());
  EXPECT_FALSE(reference_merge({merged, to_reference(a)}, LseBase::kNatural).has_o_magnitude());
}

TEST(KitTolerance, MagnitudeTermScalesWithTheTermsNotWithTheResult) {
  ReferenceState want = reference_state(equal_weight_problem({0.5f, -0.5f}), all_keys(2));
  Tolerance tol;
  tol.o_magnitude_rel = 0.01;  // allows 0.005 here, although o = 0
  tol.lse_abs = 1e-6;
  HostState got(1, 1, 1, DType::kF32, LseBase::kNatural);
  got.set_lse(0, 0, static_cast<float>(want.lse[0]));
  got.set_o(0, 0, 0, 0.004f);
  EXPECT_EQ(compare_states(got, want, tol), "");
  got.set_o(0, 0, 0, 0.006f);
  EXPECT_NE(compare_states(got, want, tol).find("o[0,0,0]"), std::string::npos);
  // Without magnitudes (a stored expected state) M = max(|e|, o_magnitude_default).
  got.set_o(0, 0, 0, 0.004f);
  want.o_magnitude.clear();
  EXPECT_NE(compare_states(got, want, tol), "");
  tol.o_magnitude_default = 0.5;
  EXPECT_EQ(compare_states(got, want, tol), "");
  // scaled() scales the tolerance, not the default magnitude.
  const Tolerance twice = tol.scaled(2.0);
  EXPECT_EQ(twice.o_magnitude_rel, 0.02);
  EXPECT_EQ(twice.o_magnitude_default, 0.5);
}

TEST(KitTolerance, ProducerToleranceIsOneRoundingOfPAndOneOfOTwice) {
  const double u_bf16 = std::ldexp(1.0, -8), u_f16 = std::ldexp(1.0, -11);
  const double u_f32 = std::ldexp(1.0, -24);
  const std::vector<float> v = {0.5f, -0.25f, 1.f};
  struct Case {
    DType in, out;
    double rel;
  };
  for (const Case& c :
       {Case{DType::kBF16, DType::kBF16, 2 * (u_bf16 + u_bf16)},
        Case{DType::kBF16, DType::kF32, 2 * (u_bf16 + u_f32)},
        Case{DType::kF16, DType::kF16, 2 * (u_f16 + u_f16)},
        Case{DType::kF16, DType::kBF16, 2 * (u_f16 + u_bf16)},
        Case{DType::kF32, DType::kBF16, 2 * u_bf16}, Case{DType::kF32, DType::kF32, 2 * u_f32}}) {
    const Tolerance tol = tolerance_for(equal_weight_problem(v, c.in, c.out));
    EXPECT_EQ(tol.o_magnitude_rel, c.rel) << to_string(c.in) << " -> " << to_string(c.out);
    EXPECT_EQ(tol.o_magnitude_default, 1.0);
    EXPECT_EQ(tol.o_rel, 1e-5);
    // No dtype-sized absolute term any more: fp32 terms only (and f16 subnormal P, 2^-25/key).
    EXPECT_LT(tol.o_abs, c.in == DType::kF16 ? 2e-5 : 1.2e-5);
    // A kernel declared to keep P in fp32 is allowed the final rounding of o only.
    const Tolerance fp32_p = tolerance_for(equal_weight_problem(v, c.in, c.out), false);
    const double u_out = c.out == DType::kBF16 ? u_bf16 : c.out == DType::kF16 ? u_f16 : u_f32;
    EXPECT_EQ(fp32_p.o_magnitude_rel, 2 * u_out);
    EXPECT_LT(fp32_p.o_abs, 1.2e-5);
  }
}

TEST(KitTolerance, MergeToleranceIsUnchanged) {
  // merge_tolerance has no magnitude term: a merge is held to its dtype table (widened only
  // for large LSEs), whatever magnitudes the expected state carries.
  HostState a(1, 1, 2, DType::kF32, LseBase::kNatural);
  a.set_lse(0, 0, 0.5f);
  a.set_o(0, 0, 0, 0.25f);
  a.set_o(0, 0, 1, -1.f);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const Tolerance m = merge_tolerance(dt, {a, a});
    const Tolerance t = tolerance_for(dt);
    EXPECT_EQ(m.o_magnitude_rel, 0.0);
    EXPECT_EQ(t.o_magnitude_rel, 0.0);
    EXPECT_EQ(m.o_rel, t.o_rel);
    EXPECT_NEAR(m.o_abs, t.o_abs, 1e-6);
  }
  EXPECT_EQ(tolerance_for(DType::kBF16).o_abs, 1.6e-2);
  EXPECT_EQ(tolerance_for(DType::kF16).o_abs, 2e-3);
  EXPECT_EQ(tolerance_for(DType::kF32).o_abs, 1e-5);
}

TEST(KitTolerance, AbsoluteBoundsAndTheLseRelativeFloor) {
  HostState want(1, 1, 1, DType::kF32, LseBase::kNatural);
  want.set_o(0, 0, 0, 0.5f);
  const auto with_lse = [](const HostState& s, float lse, float o) {
    HostState c = s;
    c.set_lse(0, 0, lse);
    c.set_o(0, 0, 0, o);
    return c;
  };
  // o: absolute only, whatever |e|.
  const Tolerance tol = Tolerance::absolute(1e-2, 0, 1e-3, 1);
  EXPECT_EQ(tol.o_rel, 0);
  EXPECT_EQ(tol.o_magnitude_rel, 0);
  EXPECT_EQ(compare_states(with_lse(want, 0.f, 0.509f), with_lse(want, 0.f, 0.5f), tol), "");
  EXPECT_NE(compare_states(with_lse(want, 0.f, 0.512f), with_lse(want, 0.f, 0.5f), tol), "");
  // LSE near 0: 1e-3 · max(|e|, 1) = 1e-3 allowed.
  EXPECT_EQ(compare_states(with_lse(want, 0.2009f, 0.5f), with_lse(want, 0.2f, 0.5f), tol), "");
  EXPECT_NE(compare_states(with_lse(want, 0.2012f, 0.5f), with_lse(want, 0.2f, 0.5f), tol), "");
  // LSE of 10: 1e-2 allowed.
  EXPECT_EQ(compare_states(with_lse(want, 10.009f, 0.5f), with_lse(want, 10.f, 0.5f), tol), "");
  EXPECT_NE(compare_states(with_lse(want, 10.012f, 0.5f), with_lse(want, 10.f, 0.5f), tol), "");
  // Without the floor the relative term is plain: 1e-3 · 0.2 near 0.
  Tolerance plain = tol;
  plain.lse_rel_floor = 0;
  EXPECT_NE(compare_states(with_lse(want, 0.2009f, 0.5f), with_lse(want, 0.2f, 0.5f), plain), "");
  // scaled() keeps the floor (a magnitude).
  EXPECT_EQ(tol.scaled(2).lse_rel_floor, 1);
  EXPECT_EQ(tol.scaled(2).lse_rel, 2e-3);
}

TEST(KitTolerance, DtypeTolerancesAreOrdered) {
  EXPECT_LT(tolerance_for(DType::kF32).o_rel, tolerance_for(DType::kF16).o_rel);
  EXPECT_LT(tolerance_for(DType::kF16).o_rel, tolerance_for(DType::kBF16).o_rel);
  // A single rounding to the dtype is well inside its tolerance.
  for (DType dt : {DType::kF16, DType::kBF16}) {
    HostState exact(1, 1, 1, DType::kF32, LseBase::kNatural);
    exact.set_lse(0, 0, 0.f);
    exact.set_o(0, 0, 0, 0.7071f);
    ATTNSTATE_EXPECT_STATES_CLOSE(exact.converted(dt, LseBase::kNatural), exact,
                                  tolerance_for(dt).scaled(0.5));
  }
}

}  // namespace
