/// @file property_test_gtest.cpp
/// @brief The testing kit inside a GoogleTest suite, as docs/testing_kit.md shows it: the
///        one-line conformance test of a kernel adapter, and a RapidCheck property of one's own
///        (a merge checked against the kit's double-precision reference).
///
/// Built where GoogleTest is found; runs as the test `Example.property_test_gtest`.
//! [rc-property]
#include <gtest/gtest.h>  // first: rapidcheck/gtest.h uses GoogleTest without including it
#include <rapidcheck/gtest.h>

#include <vector>

#include "attnstate/testing/testing.hpp"
using namespace attnstate::testing;

HostState my_merge(const std::vector<HostState>& states, attnstate::LseBase base);  // yours

// run with RC_PARAMS="max_success=500" for more cases than RapidCheck's default 100
RC_GTEST_PROP(MyMerge, MatchesReference, ()) {
  const auto states = *gen_states(1, 8);  // one shape, random dtypes and bases
  const auto base = *rc::gen::arbitrary<attnstate::LseBase>();
  const HostState out = my_merge(states, base);  // your kernel
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(out, reference_merge(states, base),
                                   merge_tolerance(out.dtype(), states));
}
//! [rc-property]

#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/merge.hpp"
#include "attnstate/testing/gtest.hpp"

// The merge under test: the CPU merge folded over the states, starting from the empty state
// (0, -inf) that a new HostState holds.
HostState my_merge(const std::vector<HostState>& states, attnstate::LseBase base) {
  const HostState& first = states.front();
  HostState out(first.tokens(), first.heads(), first.head_dim(), attnstate::DType::kF32, base);
  for (const HostState& s : states) attnstate::cpu::merge_state_inplace(out.view(), s.view());
  return out;
}

// The kit's adapter for a kernel: here the library's CPU attention over the selected keys.
HostState run_my_kernel_adapter(const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
  const AttentionProblem sub = select_keys(p, keys);
  HostState out = make_output_state(p);  // the dtype and base the problem asks for
  attnstate::cpu::attention_state(sub.q.view(), sub.k.view(), sub.v.view(), p.scale, out.view());
  return out;
}

//! [gtest-conforms]
TEST(MyKernel, ObeysTheStateAlgebra) {
  KernelCheckOptions options;  // every law, 100 cases each
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(run_my_kernel_adapter, options);
}
//! [gtest-conforms]
