/// @file test_testing_options.cpp
/// @brief Invalid options of the testing kit are rejected up front with `attnstate::Error`
///        (`kInvalidArgument`) naming the field, never reported as a failure of the kernel under
///        test: `check_state_kernel`, `kernel_conforms`, the generators and `run_property`.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/gtest.hpp"
#include "kit_test_utils.hpp"
#include "sample_kernels.hpp"

namespace {

using attnstate_test::invalid_argument_message;

using attnstate::DType;
using attnstate::LseBase;
using attnstate::testing::AttentionProblem;
using attnstate::testing::check_state_kernel;
using attnstate::testing::HostState;
using attnstate::testing::KernelCheckOptions;
using attnstate::testing::Law;
using attnstate::testing::ProblemGenOptions;
using attnstate::testing::StateGenOptions;

/// A correct kernel that counts its calls.
struct CountingKernel {
  int* calls;
  HostState operator()(const AttentionProblem& p, const std::vector<std::int64_t>& keys) const {
    ++*calls;
    return attnstate_test::sample_kernel(p, keys, attnstate_test::Defect::kNone);
  }
};

KernelCheckOptions quick() {
  KernelCheckOptions o;
  o.num_tests = 5;
  o.seed = 7;
  return o;
}

/// `check_state_kernel(options)` is rejected before the kernel runs, with a message naming
/// `field` (and the function) and saying what was expected.
void expect_rejected(const KernelCheckOptions& options, const std::string& field,
                     const std::string& expected) {
  int calls = 0;
  const std::string msg =
      invalid_argument_message([&] { check_state_kernel(CountingKernel{&calls}, options); });
  EXPECT_EQ(calls, 0) << "the kernel ran before the options were checked";
  EXPECT_NE(msg.find("attnstate::testing::check_state_kernel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("argument '" + field + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected " + expected), std::string::npos) << msg;
}

TEST(KitOptions, RejectsEmptyChoiceListsOfTheProblems) {
  KernelCheckOptions o = quick();
  o.problems.bases = {};
  expect_rejected(o, "options.problems.bases", "a non-empty list of LSE bases");

  o = quick();
  o.problems.head_dims = {};
  expect_rejected(o, "options.problems.head_dims", "a non-empty list of head dims");

  o = quick();
  o.problems.group_sizes = {};
  expect_rejected(o, "options.problems.group_sizes", "a non-empty list of GQA group sizes");

  o = quick();
  o.problems.input_dtypes = {};
  expect_rejected(o, "options.problems.input_dtypes", "a non-empty list of dtypes");

  o = quick();
  o.problems.output_dtypes = {};
  expect_rejected(o, "options.problems.output_dtypes", "a non-empty list of dtypes");
}

TEST(KitOptions, RejectsMinKeysAboveMaxKeys) {
  KernelCheckOptions o = quick();
  o.problems.min_keys = 10;
  o.problems.max_keys = 6;
  expect_rejected(o, "options.problems.max_keys", ">= options.problems.min_keys = 10, got 6");

  o = quick();
  o.problems.min_keys = -1;
  expect_rejected(o, "options.problems.min_keys", ">= 0");
}

TEST(KitOptions, RejectsBadExtentsAndValuesOfTheProblems) {
  KernelCheckOptions o = quick();
  o.problems.max_tokens = 0;
  expect_rejected(o, "options.problems.max_tokens", ">= 1");

  o = quick();
  o.problems.max_heads_kv = 0;
  expect_rejected(o, "options.problems.max_heads_kv", ">= 1");

  o = quick();
  o.problems.head_dims = {64, 0};
  expect_rejected(o, "options.problems.head_dims[1]", ">= 1");

  o = quick();
  o.problems.group_sizes = {-2};
  expect_rejected(o, "options.problems.group_sizes[0]", ">= 1");

  o = quick();
  o.problems.output_dtypes = {DType::kF16, static_cast<DType>(42)};
  expect_rejected(o, "options.problems.output_dtypes[1]", "f32, f16 or bf16");

  o = quick();
  o.problems.bases = {static_cast<LseBase>(9)};
  expect_rejected(o, "options.problems.bases[0]", "natural or base2");

  o = quick();
  o.problems.large_logits_percent = 101;
  expect_rejected(o, "options.problems.large_logits_percent", "0 to 100");

  o = quick();
  o.problems.offset_values_percent = -1;
  expect_rejected(o, "options.problems.offset_values_percent", "0 to 100");

  o = quick();
  o.problems.large_logit_factor = std::numeric_limits<float>::infinity();
  expect_rejected(o, "options.problems.large_logit_factor", "a finite value > 0");
}

TEST(KitOptions, RejectsAnEmptyOrRepeatedLawList) {
  KernelCheckOptions o = quick();
  o.laws = {};
  expect_rejected(o, "options.laws", "at least one law");

  o = quick();
  o.laws = {Law::kIdentity, Law::kExactness, Law::kIdentity};
  expect_rejected(o, "options.laws[2]", "each law at most once");

  o = quick();
  o.laws = {static_cast<Law>(77)};
  expect_rejected(o, "options.laws[0]", "a Law");
}

TEST(KitOptions, RejectsBadCountsAndTolerances) {
  KernelCheckOptions o = quick();
  o.num_tests = 0;
  expect_rejected(o, "options.num_tests", ">= 1");

  o = quick();
  o.max_parts = 0;
  expect_rejected(o, "options.max_parts", ">= 1");

  for (double factor : {0.0, -1.0, std::nan("")}) {
    o = quick();
    o.tolerance_factor = factor;
    expect_rejected(o, "options.tolerance_factor", "a finite value > 0");
  }
}

TEST(KitOptions, RejectsAnEmptyKernel) {
  const std::string msg = invalid_argument_message([] { check_state_kernel(nullptr, quick()); });
  EXPECT_NE(msg.find("argument 'fn'"), std::string::npos) << msg;
}

TEST(KitOptions, KernelConformsRejectsInvalidOptionsToo) {
  KernelCheckOptions o = quick();
  o.problems.bases = {};
  int calls = 0;
  const std::string msg = invalid_argument_message(
      [&] { (void)attnstate::testing::kernel_conforms(CountingKernel{&calls}, o); });
  EXPECT_EQ(calls, 0);
  EXPECT_NE(msg.find("options.problems.bases"), std::string::npos) << msg;
}

TEST(KitOptions, AcceptsNarrowButValidOptions) {
  KernelCheckOptions o = quick();
  o.problems.min_keys = 6;
  o.problems.max_keys = 6;  // a single key count
  o.problems.head_dims = {4};
  o.problems.group_sizes = {2};
  o.problems.input_dtypes = {DType::kBF16};
  o.problems.output_dtypes = {DType::kF32};
  o.problems.bases = {LseBase::kBase2};
  o.laws = {Law::kExactness, Law::kSplitMerge};
  o.max_parts = 1;
  int calls = 0;
  const auto report = check_state_kernel(CountingKernel{&calls}, o);
  EXPECT_TRUE(report.passed()) << report.summary();
  EXPECT_EQ(report.laws.size(), 2u);
  EXPECT_GT(calls, 0);
}

TEST(KitOptions, GeneratorsRejectInvalidOptionsWhenBuilt) {
  ProblemGenOptions p;
  p.bases = {};
  std::string msg = invalid_argument_message([&] { attnstate::testing::gen_attention_problem(p); });
  EXPECT_NE(msg.find("attnstate::testing::gen_attention_problem: argument 'options.bases'"),
            std::string::npos)
      << msg;
  p = ProblemGenOptions{};
  p.min_keys = 3;
  p.max_keys = 2;
  msg = invalid_argument_message([&] { attnstate::testing::gen_partitioned_problem(p, 3); });
  EXPECT_NE(msg.find("argument 'options.max_keys'"), std::string::npos) << msg;

  StateGenOptions s;
  s.dtypes = {};
  msg = invalid_argument_message([&] { attnstate::testing::gen_state(s); });
  EXPECT_NE(msg.find("argument 'options.dtypes'"), std::string::npos) << msg;
  msg = invalid_argument_message([&] { attnstate::testing::gen_states(1, 3, s); });
  EXPECT_NE(msg.find("argument 'options.dtypes'"), std::string::npos) << msg;
  msg = invalid_argument_message(
      [&] { attnstate::testing::gen_empty_state(attnstate::testing::StateShape{}, s); });
  EXPECT_NE(msg.find("argument 'options.dtypes'"), std::string::npos) << msg;
  // Only the extents matter for a shape.
  EXPECT_NO_THROW(attnstate::testing::gen_state_shape(s));
  s = StateGenOptions{};
  s.max_heads = 0;
  msg = invalid_argument_message([&] { attnstate::testing::gen_state_shape(s); });
  EXPECT_NE(msg.find("argument 'options.max_heads'"), std::string::npos) << msg;
}

TEST(KitOptions, AGeneratorWithInvalidOptionsInsideAPropertyNamesTheField) {
  ProblemGenOptions p;
  p.head_dims = {};
  const auto result = attnstate::testing::run_property(
      "custom", [p] { (void)*attnstate::testing::gen_attention_problem(p); }, 10, 1);
  EXPECT_FALSE(result.passed);
  EXPECT_NE(result.message.find("options.head_dims"), std::string::npos) << result.message;
}

TEST(KitOptions, RunPropertyRejectsNoCasesAndAnEmptyProperty) {
  std::string msg = invalid_argument_message([] {
    attnstate::testing::run_property(
        "p", [] {}, 0, 1);
  });
  EXPECT_NE(msg.find("argument 'num_tests'"), std::string::npos) << msg;
  msg = invalid_argument_message([] { attnstate::testing::run_property("p", nullptr, 10, 1); });
  EXPECT_NE(msg.find("argument 'property'"), std::string::npos) << msg;
}

}  // namespace
