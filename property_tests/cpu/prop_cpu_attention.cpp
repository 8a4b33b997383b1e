/// @file prop_cpu_attention.cpp
/// @brief The CPU producer `cpu::attention_state` against the algebra, as RapidCheck properties
///        (≥ 500 cases each): exactness of any partition of the keys merged with the CPU merges,
///        stability with scores in the hundreds, and the testing kit's full conformance check.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "attnstate/testing/gtest.hpp"
#include "attnstate/testing/testing.hpp"
#include "cpu_state_ops.hpp"
#include "rc_defaults.hpp"

ATTNSTATE_RC_DEFAULT_PARAMS("max_success=500");

namespace {

using namespace attnstate::testing;  // NOLINT(google-build-using-namespace): test file
using attnstate::DType;
using attnstate::LseBase;
using attnstate::StackOrder;
using attnstate_prop::attention;
using attnstate_prop::merge_stack;

// Exactness: for any partition of the keys into parts (some empty, some of one key), the ⊕ of
// the parts' states equals the one-pass state of the whole. Both sides carry the producer's
// fp32 error, hence twice `tolerance_for(problem)` (see docs/numerics.md).
RC_GTEST_PROP(AttentionLaws, PartsMergedEqualOnePassState, ()) {
  const PartitionedProblem pp = *gen_partitioned_problem(ProblemGenOptions{}, 6);
  const AttentionProblem& p = pp.problem;
  std::vector<HostState> parts;
  for (const auto& part : pp.parts) parts.push_back(attention(p, part));
  const HostState whole = attention(p, all_keys(p.num_keys()));
  const Tolerance tol = tolerance_for(p).scaled(2.0);
  const StackOrder order = *rc::gen::element(StackOrder::kTokensMajor, StackOrder::kStatesMajor);
  const HostState merged = merge_stack(parts, order, p.out_dtype, p.base);
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(merged, whole, tol);
  // Pairwise, in place, in a random order of the parts.
  std::vector<HostState> order_of_parts = parts;
  std::shuffle(order_of_parts.begin(), order_of_parts.end(),
               std::mt19937(*rc::gen::arbitrary<std::uint32_t>()));
  HostState acc(p.tokens(), p.heads_q(), p.head_dim(), DType::kF32, p.base);  // identity
  for (const HostState& part : order_of_parts) {
    attnstate::cpu::merge_state_inplace(acc.view(), part.view());
  }
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(acc, whole, tol);
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(whole, reference_state(p, all_keys(p.num_keys())),
                                   tolerance_for(p));
}

RC_GTEST_PROP(AttentionLaws, ScoresInTheHundredsStayFinite, ()) {
  ProblemGenOptions opt;
  opt.large_logits_percent = 100;
  opt.min_keys = 1;
  const AttentionProblem p = *gen_attention_problem(opt);
  const HostState out = attention(p, all_keys(p.num_keys()));
  for (float lse : out.lse_values()) RC_ASSERT(std::isfinite(lse));
  for (float o : out.o_tensor().to_floats()) RC_ASSERT(std::isfinite(o));
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(out, reference_state(p, all_keys(p.num_keys())),
                                   tolerance_for(p));
}

RC_GTEST_PROP(AttentionLaws, EmptyKeySetGivesIdentity, ()) {
  const AttentionProblem p = *gen_attention_problem();
  const HostState out = attention(p, {});
  ATTNSTATE_RC_ASSERT_STATES_CLOSE(out, reference_state(p, {}), Tolerance{});
}

/// The kit's adapter for the library's own producer.
HostState cpu_kernel(const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
  return attention(p, keys);
}

TEST(AttentionConformance, CpuAttentionStatePassesTheKit) {
  KernelCheckOptions options;
  options.num_tests = std::max(500, rc_max_success());
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(cpu_kernel, options);
}

TEST(AttentionConformance, CpuAttentionStatePassesTheKitOnDecodeShapes) {
  KernelCheckOptions options;
  options.problems = decode_problem_options();
  options.num_tests = 100;
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(cpu_kernel, options);
}

}  // namespace
