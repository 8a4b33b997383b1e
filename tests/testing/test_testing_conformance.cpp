/// @file test_testing_conformance.cpp
/// @brief `check_state_kernel` passes correct kernels (a user-style one and the library's own
///        `cpu::attention_state`) and catches deliberately broken kernels, naming the law and
///        the seed.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "attnstate/cpu/attention.hpp"
#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/gtest.hpp"
#include "attnstate/testing/rapidcheck_support.hpp"
#include "rc_defaults.hpp"
#include "sample_kernels.hpp"

namespace {

using attnstate::DType;
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

/// For kernels that keep P in fp32: held to fp32 precision before the final rounding of o.
KernelCheckOptions fp32_p_options() {
  KernelCheckOptions o = quick_options();
  o.p_rounded_to_input = false;
  return o;
}

TEST(KitConformance, PassesCorrectUserKernel) {
  const KernelCheckReport report = check_state_kernel(sample(Defect::kNone), fp32_p_options());
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
      fp32_p_options());
}

attnstate::testing::StateKernel flash(const attnstate_test::FlashConfig& config) {
  return [config](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
    return attnstate_test::flash_kernel(p, keys, config);
  };
}

/// Default problems (up to 300 keys, every output dtype, 20% large logits, half with offset
/// values) with 16-bit inputs.
KernelCheckOptions sixteen_bit_options(DType input, int num_tests) {
  KernelCheckOptions o;
  o.num_tests = num_tests;
  o.problems.input_dtypes = {input};
  return o;
}

// (a) A tensor-core flash kernel that rounds P to bf16/f16 for P·V (as FlashAttention and the
// library's CUDA decode/cascade do), with fp32 sums and accumulators and one final rounding,
// keeps the contract: it passes with the default tolerances, f32 outputs included (it uses at
// most about 0.45 of the allowed error on o).
TEST(KitConformance, PassesTensorCoreKernelRoundingP) {
  attnstate_test::FlashConfig b64;  // 64-key blocks, one pass
  attnstate_test::FlashConfig b16;  // 16-key tiles, 3 splits merged in fp32 (the CUDA decode)
  b16.block = 16;
  b16.splits = 3;
  for (DType in : {DType::kBF16, DType::kF16}) {
    for (const auto& config : {b64, b16}) {
      const KernelCheckReport report =
          check_state_kernel(flash(config), sixteen_bit_options(in, 150));
      EXPECT_TRUE(report.passed()) << to_string(in) << ", block " << config.block << "\n"
                                   << report.summary();
    }
  }
  KernelCheckOptions decode;
  decode.problems = attnstate::testing::decode_problem_options();
  decode.num_tests = 30;
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(flash(b16), decode);
}

// The allowance for the rounding of P is what a tensor-core kernel needs: declared as keeping P
// in fp32 (`p_rounded_to_input = false`), the same kernel fails on its f32 outputs.
TEST(KitConformance, RoundingPFailsWhenDeclaredFp32) {
  KernelCheckOptions o = sixteen_bit_options(DType::kBF16, 100);
  o.problems.output_dtypes = {DType::kF32};
  o.laws = {Law::kExactness};
  o.p_rounded_to_input = false;
  o.shrink = false;
  const KernelCheckReport report = check_state_kernel(flash(attnstate_test::FlashConfig{}), o);
  EXPECT_TRUE(report.failed(Law::kExactness)) << report.summary();
}

// (b) The same kernel with its P·V accumulator kept in the 16-bit input dtype (rounded after
// every key: the fp32-accumulation contract broken) errs by several times the tolerance over a
// few hundred keys, most of all on values with a non-zero mean.
TEST(KitConformance, CatchesSixteenBitAccumulator) {
  attnstate_test::FlashConfig bad;
  bad.acc_in_input_dtype = true;
  for (DType in : {DType::kBF16, DType::kF16}) {
    KernelCheckOptions o = sixteen_bit_options(in, 200);
    o.shrink = false;  // the failure is the point here, not its minimal case
    const KernelCheckReport report = check_state_kernel(flash(bad), o);
    EXPECT_FALSE(report.passed()) << to_string(in) << "\n" << report.summary();
    EXPECT_TRUE(report.failed(Law::kExactness) || report.failed(Law::kLargeLogits) ||
                report.failed(Law::kSplitMerge))
        << report.summary();
    EXPECT_FALSE(report.failed(Law::kIdentity)) << report.summary();
  }
}

// (c) A kernel that does not rescale its accumulator when a 64-key block raises the running max
// is caught with the default options (their key counts cross 64-key blocks).
TEST(KitConformance, CatchesMissedRescaleBetweenBlocks) {
  attnstate_test::FlashConfig bad;
  bad.forget_rescale = true;
  KernelCheckOptions o;  // the defaults, only without shrinking
  o.shrink = false;
  const KernelCheckReport report = check_state_kernel(flash(bad), o);
  EXPECT_FALSE(report.passed()) << report.summary();
  EXPECT_TRUE(report.failed(Law::kExactness)) << report.summary();
  // The same kernel without the defect (and with fp32 P) passes, even held to fp32 precision.
  attnstate_test::FlashConfig fp32_p;
  fp32_p.round_p = false;
  o.num_tests = 100;
  o.p_rounded_to_input = false;
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(flash(fp32_p), o);
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
