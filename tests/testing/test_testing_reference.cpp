/// @file test_testing_reference.cpp
/// @brief The kit's double reference, storage types and comparisons: the reference obeys the
///        algebra, `HostState` round-trips through views, and comparisons flag what they must.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <limits>

#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/gtest.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace {

using namespace attnstate::testing;  // NOLINT(google-build-using-namespace): test file
using attnstate::DType;
using attnstate::LseBase;

constexpr double kTight = 1e-12;

std::string compare_refs(const ReferenceState& a, const ReferenceState& b) {
  for (std::size_t i = 0; i < a.lse.size(); ++i) {
    if (!(std::fabs(a.lse[i] - b.lse[i]) <= kTight * (1 + std::fabs(b.lse[i]))) &&
        !(a.lse[i] == b.lse[i])) {
      return "lse[" + std::to_string(i) + "] " + std::to_string(a.lse[i]) + " vs " +
             std::to_string(b.lse[i]);
    }
  }
  for (std::size_t i = 0; i < a.o.size(); ++i) {
    if (!(std::fabs(a.o[i] - b.o[i]) <= kTight)) {
      return "o[" + std::to_string(i) + "] " + std::to_string(a.o[i]) + " vs " +
             std::to_string(b.o[i]);
    }
  }
  return {};
}

RC_GTEST_PROP(KitReference, MergeOfPartsEqualsStateOfWhole, ()) {
  const PartitionedProblem pp = *gen_partitioned_problem(ProblemGenOptions{}, 5);
  const AttentionProblem& p = pp.problem;
  std::vector<ReferenceState> parts;
  for (const auto& part : pp.parts) {
    parts.push_back(reference_state(p, part, *rc::gen::arbitrary<LseBase>()));
  }
  const ReferenceState whole = reference_state(p, all_keys(p.num_keys()));
  const std::string msg = compare_refs(reference_merge(parts, p.base), whole);
  RC_ASSERT(msg.empty());
}

RC_GTEST_PROP(KitReference, RebaseRoundTrips, ()) {
  const HostState s = *gen_state();
  const ReferenceState r = to_reference(s);
  const ReferenceState back = rebased(rebased(r, LseBase::kBase2), LseBase::kNatural);
  const ReferenceState want = rebased(r, LseBase::kNatural);
  for (std::size_t i = 0; i < r.lse.size(); ++i) {
    RC_ASSERT(back.lse[i] == want.lse[i] ||
              std::fabs(back.lse[i] - want.lse[i]) <= kTight * (1 + std::fabs(want.lse[i])));
  }
}

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
