/// @file property_test_gtest.cpp
/// @brief The testing kit inside a GoogleTest suite, as docs/testing_kit.md and docs/usage.md
///        show it: the conformance test of a kernel adapter (all shapes; options narrowed to
///        decode shapes, one base or one dtype; problems with attention sinks), and a RapidCheck
///        property of one's own (a merge checked against the kit's double-precision reference).
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

#include "attnstate/core/sink.hpp"
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

// A kernel with attention sinks: the state of its keys computed in f32, each row merged once with
// the sink state (0, s_h) when there are sinks, then stored in the problem's dtype and base (one
// rounding).
HostState my_kernel(const AttentionProblem& p, attnstate::AttentionSinks sinks) {
  using attnstate::DType;
  using attnstate::LseBase;
  HostState f32(p.tokens(), p.heads_q(), p.head_dim(), DType::kF32, LseBase::kNatural);
  attnstate::cpu::attention_state(p.q.view(), p.k.view(), p.v.view(), p.scale, f32.view());
  if (!sinks.none()) {
    const std::vector<float> zeros(static_cast<std::size_t>(p.head_dim()), 0.f);
    attnstate::cpu::merge_state_inplace(
        f32.view(), attnstate::make_sink_state(sinks.logits, zeros.data(), DType::kF32, p.tokens(),
                                               p.heads_q(), p.head_dim(), LseBase::kNatural));
  }
  HostState out = make_output_state(p);
  attnstate::cpu::rebase(f32.view(), out.view());
  return out;
}

//! [gtest-conforms]
TEST(MyKernel, ObeysTheStateAlgebra) {
  KernelCheckOptions options;  // every law, 100 cases each
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(run_my_kernel_adapter, options);
}
//! [gtest-conforms]

TEST(MyKernel, DecodeShapesBase2Only) {
  //! [narrow-options]
  attnstate::testing::KernelCheckOptions options;
  options.problems = attnstate::testing::decode_problem_options();
  options.problems.head_dims = {128};
  options.problems.bases = {attnstate::LseBase::kBase2};  // a kernel that only writes log2
  options.num_tests = 500;
  //! [narrow-options]
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(run_my_kernel_adapter, options);
}

TEST(MyKernel, MergesItsSinksOnce) {
  //! [sink-options]
  attnstate::testing::KernelCheckOptions options;
  options.problems = attnstate::testing::sink_problem_options();  // half the problems with sinks
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(
      [](const attnstate::testing::AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        // p.sinks empty: no sinks (a partial the kit asks for); else merge them once, at the end
        return my_kernel(select_keys(p, keys), p.attention_sinks());
      },
      options);
  //! [sink-options]
}

TEST(MyKernel, Bf16DecodeShapes) {
  //! [tensor-core-options]
  attnstate::testing::KernelCheckOptions options;
  options.problems = attnstate::testing::decode_problem_options();
  options.problems.input_dtypes = {attnstate::DType::kBF16};  // a bf16-only kernel
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(run_my_kernel_adapter, options);
  //! [tensor-core-options]
}
