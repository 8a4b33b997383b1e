/// @file test_testing_conformance.cpp
/// @brief `check_state_kernel` passes correct kernels (a user-style one and the library's own
///        `cpu::attention_state`) and catches deliberately broken kernels, naming the law and
///        the seed.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "attnstate/cpu/attention.hpp"
#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/gtest.hpp"
#include "attnstate/testing/rapidcheck_support.hpp"
#include "sample_kernels.hpp"

namespace {

using attnstate::testing::AttentionProblem;
using attnstate::testing::check_state_kernel;
using attnstate::testing::HostState;
using attnstate::testing::KernelCheckOptions;
using attnstate::testing::KernelCheckReport;
using attnstate::testing::Law;
using attnstate_test::Defect;

attnstate::testing::StateKernel sample(Defect defect) {
  return [defect](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
    return attnstate_test::sample_kernel(p, keys, defect);
  };
}

KernelCheckOptions quick_options(std::uint64_t seed = 0) {
  KernelCheckOptions o;
  o.num_tests = 100;
  o.seed = seed;
  return o;
}

TEST(KitConformance, PassesCorrectUserKernel) {
  const KernelCheckReport report = check_state_kernel(sample(Defect::kNone), quick_options());
  EXPECT_TRUE(report.passed()) << report.summary();
  ASSERT_EQ(report.laws.size(), attnstate::testing::all_laws().size());
  for (const auto& law : report.laws) EXPECT_EQ(law.num_tests, 100) << law.name;
}

TEST(KitConformance, PassesLibraryCpuAttentionState) {
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(
      [](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        const AttentionProblem sub = attnstate::testing::select_keys(p, keys);
        HostState out = attnstate::testing::make_output_state(p);
        attnstate::cpu::attention_state(sub.q.view(), sub.k.view(), sub.v.view(), p.scale,
                                        out.view());
        return out;
      },
      quick_options());
}

TEST(KitConformance, CatchesMissingMaxSubtraction) {
  const KernelCheckReport report =
      check_state_kernel(sample(Defect::kNoMaxSubtraction), quick_options());
  EXPECT_FALSE(report.passed());
  EXPECT_TRUE(report.failed(Law::kLargeLogits)) << report.summary();
  EXPECT_NE(report.summary().find("large_logits"), std::string::npos);
  EXPECT_FALSE(report.failed(Law::kIdentity)) << report.summary();
}

TEST(KitConformance, CatchesEmptySplitWritingZeroOverZero) {
  const KernelCheckReport report =
      check_state_kernel(sample(Defect::kEmptyZeroOverZero), quick_options());
  EXPECT_TRUE(report.failed(Law::kIdentity)) << report.summary();
  EXPECT_NE(report.summary().find("fn(∅) must be exactly the empty state"), std::string::npos)
      << report.summary();
  EXPECT_FALSE(report.failed(Law::kLargeLogits)) << report.summary();
}

TEST(KitConformance, CatchesBase2LseDeclaredNatural) {
  const KernelCheckReport report =
      check_state_kernel(sample(Defect::kBase2DeclaredNatural), quick_options());
  EXPECT_TRUE(report.failed(Law::kDeclaredBase)) << report.summary();
  EXPECT_NE(report.summary().find("base2 LSEs declared natural"), std::string::npos)
      << report.summary();
  EXPECT_TRUE(report.failed(Law::kExactness)) << report.summary();
}

TEST(KitConformance, CatchesBrokenKernelWhenOnlyNaturalIsRequested) {
  KernelCheckOptions o = quick_options();
  o.problems.bases = {attnstate::LseBase::kNatural};
  o.laws = {Law::kDeclaredBase};
  const KernelCheckReport report = check_state_kernel(sample(Defect::kBase2DeclaredNatural), o);
  EXPECT_TRUE(report.failed(Law::kDeclaredBase)) << report.summary();
}

TEST(KitConformance, FailureReportNamesLawShrunkCaseAndSeed) {
  const KernelCheckReport report =
      check_state_kernel(sample(Defect::kEmptyZeroOverZero), quick_options(12345));
  const std::string text = report.summary();
  EXPECT_EQ(report.seed, 12345u);
  EXPECT_NE(text.find("FAIL identity"), std::string::npos) << text;
  EXPECT_NE(text.find("law 'identity' broke"), std::string::npos) << text;
  EXPECT_NE(text.find("seed=12345"), std::string::npos) << text;
  EXPECT_NE(text.find("Falsifiable"), std::string::npos) << text;
  // Shrinking reaches the smallest problem: one token, one KV head, group 1, head_dim 1.
  EXPECT_NE(text.find("AttentionProblem(tokens=1, H_q=1, H_kv=1, head_dim=1"), std::string::npos)
      << text;
  EXPECT_NE(report.failed_laws().find("identity"), std::string::npos);
  EXPECT_FALSE(report.failed(Law::kLargeLogits));
  // The law's own description, without the kit's source location or macro text.
  EXPECT_NE(text.find("\n\nidentity: fn(∅) must be exactly the empty state"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("RC_FAIL"), std::string::npos) << text;
  EXPECT_EQ(text.find("conformance.cpp"), std::string::npos) << text;
}

TEST(KitConformance, KernelThrowingIsReportedWithItsMessageOnly) {
  KernelCheckOptions o = quick_options(4242);
  o.laws = {Law::kIdentity};
  const KernelCheckReport report = check_state_kernel(
      [](const AttentionProblem&, const std::vector<std::int64_t>&) -> HostState {
        throw std::runtime_error("out of registers");
      },
      o);
  const std::string text = report.summary();
  EXPECT_NE(text.find("identity: the kernel threw for keys {}: out of registers"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("RC_FAIL"), std::string::npos) << text;
}

TEST(KitConformance, NumTestsNotMaxSuccessSetsTheCaseCount) {
  // RC_PARAMS' max_success (e.g. from ATTNSTATE_RC_DEFAULT_PARAMS) is not used by the kit.
  KernelCheckOptions o = quick_options();
  o.num_tests = attnstate::testing::rc_max_success() + 3;
  o.laws = {Law::kIdentity};
  const KernelCheckReport report = check_state_kernel(sample(Defect::kNone), o);
  ASSERT_EQ(report.laws.size(), 1u);
  EXPECT_EQ(report.laws[0].num_tests, o.num_tests);
}

TEST(KitConformance, SameSeedReproducesTheSameReport) {
  const KernelCheckOptions o = quick_options(987654321);
  const KernelCheckReport a = check_state_kernel(sample(Defect::kNoMaxSubtraction), o);
  const KernelCheckReport b = check_state_kernel(sample(Defect::kNoMaxSubtraction), o);
  EXPECT_FALSE(a.passed());
  EXPECT_EQ(a.summary(), b.summary());
}

TEST(KitConformance, KernelExceptionsFailTheLaw) {
  KernelCheckOptions o = quick_options();
  o.laws = {Law::kExactness};
  const KernelCheckReport report = check_state_kernel(
      [](const AttentionProblem&, const std::vector<std::int64_t>&) -> HostState {
        throw std::runtime_error("kernel not implemented");
      },
      o);
  EXPECT_TRUE(report.failed(Law::kExactness));
  EXPECT_NE(report.summary().find("kernel not implemented"), std::string::npos) << report.summary();
}

TEST(KitConformance, CatchesNondeterministicKernel) {
  KernelCheckOptions o = quick_options();
  o.laws = {Law::kDeterminism};
  int calls = 0;
  const KernelCheckReport report = check_state_kernel(
      [&calls](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        HostState s = attnstate_test::sample_kernel(p, keys, Defect::kNone);
        if (!keys.empty() && (++calls % 2 == 0)) s.set_o(0, 0, 0, s.o(0, 0, 0) + 0.25f);
        return s;
      },
      o);
  EXPECT_TRUE(report.failed(Law::kDeterminism)) << report.summary();
}

TEST(KitConformance, CatchesWrongOutputForSplitMerge) {
  // A kernel that drops the last key of every non-trivial set: fn(I ∪ J) ≠ fn(I) ⊕ fn(J).
  KernelCheckOptions o = quick_options();
  o.laws = {Law::kSplitMerge};
  const KernelCheckReport report = check_state_kernel(
      [](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        std::vector<std::int64_t> k = keys;
        if (k.size() > 1) k.pop_back();
        return attnstate_test::sample_kernel(p, k, Defect::kNone);
      },
      o);
  EXPECT_TRUE(report.failed(Law::kSplitMerge)) << report.summary();
}

}  // namespace
