/// @file prop_cpu_laws.cpp
/// @brief The laws of the ⊕ merge on the CPU backend, as RapidCheck properties (≥ 500 cases
///        each): commutativity, associativity, identity (bitwise), base invariance, mixed-base
///        exactness, stability near LSE ±1e4, empty states with NaN in o, all-empty input, NaN
///        propagation. Inputs come from the testing kit's generators; the expected values from
///        its double-precision reference.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>

#include "attnstate/testing/testing.hpp"
#include "cpu_state_ops.hpp"
#include "rc_defaults.hpp"

ATTNSTATE_RC_DEFAULT_PARAMS("max_success=500");

namespace {

using namespace attnstate::testing;  // NOLINT(google-build-using-namespace): test file
using attnstate::DType;
using attnstate::LseBase;
using attnstate::StackOrder;
using attnstate_prop::merge_pair;
using attnstate_prop::merge_ragged_one_token;
using attnstate_prop::merge_stack;

/// States of one random shape, dtype and base (a stack view has a single dtype and base).
rc::Gen<std::vector<HostState>> gen_uniform_states(int min_count, int max_count,
                                                   StateGenOptions opt = {}) {
  return rc::gen::exec([=] {
    StateGenOptions o = opt;
    o.dtypes = {*rc::gen::arbitrary<DType>()};
    o.bases = {*rc::gen::arbitrary<LseBase>()};
    return *gen_states(min_count, max_count, o);
  });
}

TEST(PropertyConfig, RunsAtLeast500CasesPerProperty) {
  const char* env = std::getenv("RC_PARAMS");
  if (env != nullptr && std::string(env).find("max_success=") != std::string::npos &&
      rc_max_success() < 500) {
    GTEST_SKIP() << "RC_PARAMS overrides max_success";
  }
  EXPECT_GE(rc_max_success(), 500);
  int calls = 0;
  const auto result = rc::detail::checkTestable([&calls] { ++calls; });
  ASSERT_TRUE(result.is<rc::detail::SuccessResult>());
  EXPECT_GE(result.get<rc::detail::SuccessResult>().numSuccess, 500);
  EXPECT_GE(calls, 500);
}

RC_GTEST_PROP(MergeLaws, IsCommutative, ()) {
  const auto ab = *gen_states(2, 2);
  const DType dt = *rc::gen::arbitrary<DType>();
  const LseBase base = *rc::gen::arbitrary<LseBase>();
  const HostState x = merge_pair(ab[0], ab[1], dt, base);
  const HostState y = merge_pair(ab[1], ab[0], dt, base);
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(x, y, merge_tolerance(dt, ab));
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(x, reference_merge(ab, base), merge_tolerance(dt, ab));
}

RC_GTEST_PROP(MergeLaws, IsAssociative, ()) {
  const auto s = *gen_states(3, 3);
  const DType dt = *rc::gen::arbitrary<DType>();
  const LseBase base = *rc::gen::arbitrary<LseBase>();
  // Intermediates in f32 (what a caller chaining merges should keep), final result in dt.
  const HostState left = merge_pair(merge_pair(s[0], s[1], DType::kF32, base), s[2], dt, base);
  const HostState right = merge_pair(s[0], merge_pair(s[1], s[2], DType::kF32, base), dt, base);
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(left, right, merge_tolerance(dt, s));
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(left, reference_merge(s, base), merge_tolerance(dt, s));
}

RC_GTEST_PROP(MergeLaws, NaryMergeMatchesReferenceInEveryLayout, ()) {
  const auto s = *gen_uniform_states(1, 8);
  const DType dt = *rc::gen::arbitrary<DType>();
  const LseBase base = *rc::gen::arbitrary<LseBase>();
  const ReferenceState want = reference_merge(s, base);
  const Tolerance tol = merge_tolerance(dt, s);
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(merge_stack(s, StackOrder::kTokensMajor, dt, base), want, tol);
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(merge_stack(s, StackOrder::kStatesMajor, dt, base), want, tol);
  if (s[0].tokens() == 1) {
    ATTNSTATE_RC_ASSERT_STATES_CLOSE(merge_ragged_one_token(s, dt, base), want, tol);
  }
}

RC_GTEST_PROP(MergeLaws, NaryMergeMatchesReferenceOnWideShapes, ()) {
  // Enough rows and head_dim that the backend splits the work across threads and chunks.
  StateGenOptions wide;
  wide.max_tokens = 40;
  wide.max_heads = 8;
  wide.max_head_dim = 128;
  const auto s = *gen_uniform_states(1, 8, wide);
  const DType dt = *rc::gen::arbitrary<DType>();
  const LseBase base = *rc::gen::arbitrary<LseBase>();
  const StackOrder order = *rc::gen::element(StackOrder::kTokensMajor, StackOrder::kStatesMajor);
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(merge_stack(s, order, dt, base), reference_merge(s, base),
                                   merge_tolerance(dt, s));
}

RC_GTEST_PROP(MergeLaws, EmptyStateIsIdentityBitwise, ()) {
  // x in canonical form: its own empty rows hold o = 0 (an output never carries garbage).
  StateGenOptions canonical;
  canonical.nan_in_empty_o = false;
  const HostState x = *gen_state(canonical);
  const HostState e = *gen_empty_state(StateShape{x.tokens(), x.heads(), x.head_dim()});
  // Output in x's own dtype and base: x comes back bit for bit, from either side.
  ATTNSTATE_RC_ASSERT_BITWISE_EQUAL(merge_pair(x, e, x.dtype(), x.base()), x);
  ATTNSTATE_RC_ASSERT_BITWISE_EQUAL(merge_pair(e, x, x.dtype(), x.base()), x);
  HostState acc = x;
  attnstate::cpu::merge_state_inplace(acc.view(), e.view());
  ATTNSTATE_RC_ASSERT_BITWISE_EQUAL(acc, x);
  // n-ary: x alone in a stack, padded with empties (converted to x's dtype and base).
  const HostState ex = e.converted(x.dtype(), x.base());
  ATTNSTATE_RC_ASSERT_BITWISE_EQUAL(
      merge_stack({ex, x, ex}, StackOrder::kTokensMajor, x.dtype(), x.base()), x);
  // Any other output dtype/base: exactly x converted once.
  const DType dt = *rc::gen::arbitrary<DType>();
  const LseBase base = *rc::gen::arbitrary<LseBase>();
  ATTNSTATE_RC_ASSERT_BITWISE_EQUAL(merge_pair(x, e, dt, base), x.converted(dt, base));
}

RC_GTEST_PROP(MergeLaws, EmptyStateWithNaNInOContributesNothing, ()) {
  StateGenOptions opt;
  opt.nan_in_empty_o = true;
  auto s = *gen_uniform_states(1, 5, opt);
  const LseBase base = s[0].base();
  const DType dt = s[0].dtype();
  const HostState without = merge_stack(s, StackOrder::kStatesMajor, DType::kF32, base);
  // Against the reference too: two merges that leave the same row unwritten (NaN) would
  // otherwise be bitwise equal.
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(without, reference_merge(s, base),
                                   merge_tolerance(DType::kF32, s));
  // Insert an empty state whose o is all NaN at a random position.
  HostState nan_empty(s[0].tokens(), s[0].heads(), s[0].head_dim(), dt, base);
  nan_empty.o_tensor().fill(NAN);
  const auto pos = *rc::gen::inRange<std::size_t>(0, s.size() + 1);
  s.insert(s.begin() + static_cast<std::ptrdiff_t>(pos), nan_empty);
  ATTNSTATE_RC_ASSERT_BITWISE_EQUAL(merge_stack(s, StackOrder::kStatesMajor, DType::kF32, base),
                                    without);
  ATTNSTATE_RC_ASSERT_BITWISE_EQUAL(merge_stack(s, StackOrder::kTokensMajor, DType::kF32, base),
                                    without);
}

RC_GTEST_PROP(MergeLaws, AllEmptyInputGivesIdentity, ()) {
  const StateShape shape = *gen_state_shape();
  const auto n = *rc::gen::inRange(1, 6);
  const DType in_dt = *rc::gen::arbitrary<DType>();
  const LseBase in_base = *rc::gen::arbitrary<LseBase>();
  StateGenOptions opt;
  opt.dtypes = {in_dt};
  opt.bases = {in_base};
  std::vector<HostState> empties;
  for (int i = 0; i < n; ++i) empties.push_back(*gen_empty_state(shape, opt));
  const DType dt = *rc::gen::arbitrary<DType>();
  const LseBase base = *rc::gen::arbitrary<LseBase>();
  const HostState identity(shape.tokens, shape.heads, shape.head_dim, dt, base);  // (0, -inf)
  const Tolerance exact{};
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(merge_pair(empties[0], empties.back(), dt, base), identity,
                                   exact);
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(merge_stack(empties, StackOrder::kTokensMajor, dt, base),
                                   identity, exact);
  if (shape.tokens == 1) {
    ATTNSTATE_RC_ASSERT_STATES_CLOSE(merge_ragged_one_token(empties, dt, base), identity, exact);
  }
  HostState acc = empties[0];
  attnstate::cpu::merge_state_inplace(acc.view(), empties.back().view());
  for (float lse : acc.lse_values()) RC_ASSERT(lse == -INFINITY);
}

RC_GTEST_PROP(MergeLaws, NaNInNonEmptyInputPropagates, ()) {
  StateGenOptions opt;
  opt.empty_rows = false;
  auto s = *gen_uniform_states(1, 4, opt);
  const auto which = *rc::gen::inRange<std::size_t>(0, s.size());
  const auto t = *rc::gen::inRange<std::int64_t>(0, s[which].tokens());
  const auto h = *rc::gen::inRange<std::int64_t>(0, s[which].heads());
  const auto d = *rc::gen::inRange<std::int64_t>(0, s[which].head_dim());
  const bool in_lse = *rc::gen::arbitrary<bool>();
  if (in_lse) {
    s[which].set_lse(t, h, NAN);
  } else {
    s[which].set_o(t, h, d, NAN);
  }
  const DType dt = *rc::gen::arbitrary<DType>();
  const LseBase base = *rc::gen::arbitrary<LseBase>();
  const HostState out = merge_stack(s, StackOrder::kTokensMajor, dt, base);
  RC_ASSERT(std::isnan(out.o(t, h, d)));
  if (in_lse) RC_ASSERT(std::isnan(out.lse(t, h)));
  if (s.size() >= 2) {
    const HostState pair = merge_pair(s[0], s[1], dt, base);
    if (which <= 1) RC_ASSERT(std::isnan(pair.o(t, h, d)));
  }
  // The reference agrees on every element (NaN where it must be, values elsewhere).
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(out, reference_merge(s, base), merge_tolerance(dt, s));
}

RC_GTEST_PROP(MergeLaws, BaseInvariance, ()) {
  const auto s = *gen_uniform_states(1, 6);
  const DType dt = *rc::gen::arbitrary<DType>();
  // Merge in base 2 then rebase to natural == merge in natural.
  const HostState in2 = merge_stack(s, StackOrder::kTokensMajor, dt, LseBase::kBase2);
  // A poisoned (NaN) output: every element must come from cpu::rebase.
  HostState rebased_out = attnstate_prop::output_like(in2, dt, LseBase::kNatural);
  attnstate::cpu::rebase(in2.view(), rebased_out.view());
  const HostState in_e = merge_stack(s, StackOrder::kTokensMajor, dt, LseBase::kNatural);
  RC_ASSERT(rebased_out.base() == LseBase::kNatural);
  const Tolerance tol = merge_tolerance(dt, s);
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(rebased_out, in_e, tol);
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(in_e, reference_merge(s, LseBase::kNatural), tol);
}

RC_GTEST_PROP(MergeLaws, MixedBaseInputsMergeExactly, ()) {
  const StateShape shape = *gen_state_shape();
  const HostState a = *gen_state(shape);
  const HostState b = *gen_state(shape);
  const DType dt = *rc::gen::arbitrary<DType>();
  const LseBase base = *rc::gen::arbitrary<LseBase>();
  // Whatever the two inputs' bases, the merge equals the double reference (converted on load).
  const Tolerance tol = merge_tolerance(dt, {a, b});
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(merge_pair(a, b, dt, base), reference_merge({a, b}, base), tol);
  // Converting an input to the other base first changes nothing beyond rounding.
  const LseBase other = b.base() == LseBase::kBase2 ? LseBase::kNatural : LseBase::kBase2;
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(merge_pair(a, b.converted(b.dtype(), other), dt, base),
                                   merge_pair(a, b, dt, base), tol);
}

RC_GTEST_PROP(MergeLaws, ExtremeLseNeverGivesInfOrNaN, ()) {
  StateGenOptions opt;
  opt.extreme_lse = true;
  opt.lse_magnitude = 1e4;
  const auto s = *gen_uniform_states(1, 6, opt);
  const DType dt = *rc::gen::arbitrary<DType>();
  const LseBase base = *rc::gen::arbitrary<LseBase>();
  const HostState out = merge_stack(s, StackOrder::kStatesMajor, dt, base);
  for (std::int64_t t = 0; t < out.tokens(); ++t) {
    for (std::int64_t h = 0; h < out.heads(); ++h) {
      bool all_empty = true;
      for (const HostState& x : s) all_empty = all_empty && x.is_empty_row(t, h);
      if (all_empty) {
        RC_ASSERT(out.lse(t, h) == -INFINITY);
        continue;
      }
      RC_ASSERT(std::isfinite(out.lse(t, h)));
      for (std::int64_t d = 0; d < out.head_dim(); ++d) RC_ASSERT(std::isfinite(out.o(t, h, d)));
    }
  }
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(out, reference_merge(s, base), merge_tolerance(dt, s));
}

}  // namespace
