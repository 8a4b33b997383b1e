/// @file test_testing_variants.cpp
/// @brief The kit's variants: the double reference's soft cap (on the scaled score) and sliding
///        window (a window restricts the key set), positions kept by `select_keys`, the
///        generators' windows and caps, the conformance check telling windowed and soft-capped
///        kernels from broken ones, and the named errors of bad variants.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attnstate/core/variant.hpp"
#include "attnstate/cpu/attention.hpp"
#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"
#include "kit_test_utils.hpp"

namespace {

using namespace attnstate::testing;  // NOLINT(google-build-using-namespace): test file
using attnstate::AttentionVariant;
using attnstate::DType;
using attnstate::kNoWindow;
using attnstate::LseBase;

/// Draws `n` values of `gen` at growing sizes, from a fixed seed.
template <class T>
std::vector<T> sample(const rc::Gen<T>& gen, int n, std::uint64_t seed = 11) {
  return attnstate_test::sample_values(gen, n, seed);
}

/// One query row, one head, head_dim 1, keys `k` with values `v` (f32), scale `scale`.
AttentionProblem scalar_problem(float q, const std::vector<float>& k, const std::vector<float>& v,
                                float scale) {
  const auto n = static_cast<std::int64_t>(k.size());
  return make_problem(1, 1, 1, 1, n, DType::kF32, {q}, k, v, scale, DType::kF32, LseBase::kNatural);
}

/// The softmax of `logits` over `v` in double: (o, natural lse).
std::pair<double, double> softmax(const std::vector<double>& logits, const std::vector<float>& v) {
  double m = -std::numeric_limits<double>::infinity();
  for (double s : logits) m = std::max(m, s);
  double sum = 0, o = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double w = std::exp(logits[i] - m);
    sum += w;
    o += w * v[i];
  }
  return {o / sum, m + std::log(sum)};
}

TEST(KitVariants, ReferenceSoftCapActsOnTheScaledScore) {
  // Scale 0.25 and cap 2: capping the scaled score and scaling the capped raw score differ
  // widely for raw scores of 8 to 24.
  const std::vector<float> k = {8.f, 16.f, 24.f}, v = {1.f, -0.5f, 0.25f};
  const float scale = 0.25f, cap = 2.f;
  AttentionProblem p = scalar_problem(1.f, k, v, scale);
  p.variant.logits_soft_cap = cap;
  const ReferenceState r = reference_state(p, all_keys(3));
  std::vector<double> capped, wrong;
  for (float x : k) {
    const double s = static_cast<double>(scale) * x;
    capped.push_back(cap * std::tanh(s / cap));
    wrong.push_back(scale * cap * std::tanh(static_cast<double>(x) / cap));
  }
  const auto want = softmax(capped, v);
  EXPECT_NEAR(r.o_at(0, 0, 0), want.first, 1e-14);
  EXPECT_NEAR(r.lse_at(0, 0), want.second, 1e-14);
  const auto other = softmax(wrong, v);
  EXPECT_GT(std::fabs(r.lse_at(0, 0) - other.second), 0.1);  // the two rules are told apart
}

TEST(KitVariants, ReferenceWithAHugeCapIsPlainAttention) {
  AttentionProblem p = scalar_problem(0.7f, {1.f, -2.f, 3.f, 0.5f}, {1.f, 2.f, 3.f, 4.f}, 1.f);
  const ReferenceState plain = reference_state(p, all_keys(4));
  p.variant.logits_soft_cap = 1e6f;
  const ReferenceState capped = reference_state(p, all_keys(4));
  EXPECT_NEAR(capped.o_at(0, 0, 0), plain.o_at(0, 0, 0), 1e-9);
  EXPECT_NEAR(capped.lse_at(0, 0), plain.lse_at(0, 0), 1e-9);
  p.variant.logits_soft_cap = 1.f;  // a small cap does change the result
  EXPECT_GT(std::fabs(reference_state(p, all_keys(4)).lse_at(0, 0) - plain.lse_at(0, 0)), 0.1);
}

TEST(KitVariants, GeneratorsDrawEveryKindOfWindowAndCap) {
  const auto problems = sample(gen_attention_problem(variant_problem_options()), 600);
  int capped = 0, windowed = 0, causal_only = 0, window0 = 0, wider = 0, row_sees_none = 0,
      row_sees_some = 0;
  std::vector<float> caps;
  for (const AttentionProblem& p : problems) {
    if (p.variant.logits_soft_cap != 0.f) {
      ++capped;
      caps.push_back(p.variant.logits_soft_cap);
    }
    if (!p.has_positions()) {
      EXPECT_EQ(p.variant.window_left, kNoWindow);
      continue;
    }
    ++windowed;
    EXPECT_EQ(static_cast<std::int64_t>(p.positions.size()), p.tokens());
    const std::int64_t w = p.variant.window_left;
    causal_only += w == kNoWindow;
    window0 += w == 0;
    wider += w > p.num_keys();
    for (std::int64_t t = 0; t < p.tokens(); ++t) {
      const bool none = visible_keys(p, t, all_keys(p.num_keys())).empty();
      row_sees_none += none && p.num_keys() > 0;
      row_sees_some += !none;
    }
  }
  EXPECT_GT(capped, 150);
  EXPECT_LT(capped, 450);
  EXPECT_GT(windowed, 150);
  EXPECT_LT(windowed, 450);
  EXPECT_GT(causal_only, 10);
  EXPECT_GT(window0, 10);
  EXPECT_GT(wider, 10);
  EXPECT_GT(row_sees_none, 10);  // keys all outside the window
  EXPECT_GT(row_sees_some, 100);
  for (float c : {5.f, 30.f, 50.f}) {
    EXPECT_NE(std::find(caps.begin(), caps.end(), c), caps.end()) << "cap " << c;
  }
}

TEST(KitVariants, DefaultOptionsDrawPlainProblems) {
  for (const AttentionProblem& p : sample(gen_attention_problem(), 300)) {
    EXPECT_TRUE(p.variant.is_plain());
    EXPECT_FALSE(p.has_positions());
    EXPECT_TRUE(p.key_positions.empty());
  }
}

/// A user's kernel over one segment: `cpu::attention_state` with the problem's cap, called per
/// row over the keys the row sees (`shift` moves the window's lower edge: a broken kernel).
HostState windowed_kernel(const AttentionProblem& full, const std::vector<std::int64_t>& keys,
                          bool use_cap, bool use_window, std::int64_t shift) {
  HostState out = make_output_state(full);
  for (std::int64_t t = 0; t < full.tokens(); ++t) {
    std::vector<std::int64_t> row = keys;
    if (use_window && full.has_positions()) {
      row.clear();
      const std::int64_t p = full.positions[static_cast<std::size_t>(t)];
      const std::int64_t lo =
          full.variant.window_left == kNoWindow ? 0 : p - full.variant.window_left + shift;
      for (std::int64_t key : keys) {
        const std::int64_t at = key_position(full, key);
        if (at <= p && at >= lo) row.push_back(key);
      }
    }
    AttentionProblem one = select_keys(full, row);
    const std::vector<float> q = full.q.to_floats();
    const std::int64_t row_elems = full.heads_q() * full.head_dim();
    one.q = HostTensor::from_floats(
        full.q.dtype(), {1, full.heads_q(), full.head_dim()},
        std::vector<float>(q.begin() + t * row_elems, q.begin() + (t + 1) * row_elems));
    one.positions.clear();  // the rows' windows are applied above: one plain segment
    one.key_positions.clear();
    one.variant.window_left = kNoWindow;
    HostState s = make_output_state(one);
    AttentionVariant v;
    if (use_cap) v.logits_soft_cap = full.variant.logits_soft_cap;
    attnstate::cpu::attention_state(one.q.view(), one.k.view(), one.v.view(), one.scale, v,
                                    s.view());
    for (std::int64_t h = 0; h < full.heads_q(); ++h) {
      out.set_lse(t, h, s.lse(0, h));
      for (std::int64_t d = 0; d < full.head_dim(); ++d) out.set_o(t, h, d, s.o(0, h, d));
    }
  }
  return out;
}

KernelCheckOptions check_options() {
  KernelCheckOptions o;
  o.problems = variant_problem_options();
  o.problems.max_keys = 80;
  o.num_tests = 60;
  o.seed = 20261203;
  o.p_rounded_to_input = false;
  return o;
}

TEST(KitVariants, AWindowedSoftCappedKernelPassesEveryLaw) {
  const KernelCheckReport r = check_state_kernel(
      [](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        return windowed_kernel(p, keys, true, true, 0);
      },
      check_options());
  EXPECT_TRUE(r.passed()) << r.summary();
}

TEST(KitVariants, AKernelIgnoringTheCapFails) {
  KernelCheckOptions o = check_options();
  o.problems.window_percent = 0;
  o.problems.soft_cap_percent = 100;
  o.laws = {attnstate::testing::Law::kExactness};
  const KernelCheckReport r = check_state_kernel(
      [](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        return windowed_kernel(p, keys, false, true, 0);
      },
      o);
  EXPECT_TRUE(r.failed(attnstate::testing::Law::kExactness)) << r.summary();
}

TEST(KitVariants, AKernelIgnoringTheWindowFails) {
  KernelCheckOptions o = check_options();
  o.laws = {attnstate::testing::Law::kExactness};
  const KernelCheckReport r = check_state_kernel(
      [](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        return windowed_kernel(p, keys, true, false, 0);
      },
      o);
  EXPECT_TRUE(r.failed(attnstate::testing::Law::kExactness)) << r.summary();
}

TEST(KitVariants, AWindowOffByOneFails) {
  KernelCheckOptions o = check_options();
  o.laws = {attnstate::testing::Law::kExactness};
  for (std::int64_t shift : {-1, 1}) {
    const KernelCheckReport r = check_state_kernel(
        [shift](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
          return windowed_kernel(p, keys, true, true, shift);
        },
        o);
    EXPECT_TRUE(r.failed(attnstate::testing::Law::kExactness)) << "shift " << shift;
  }
}

TEST(KitVariants, BadVariantsAreNamed) {
  using attnstate_test::invalid_argument_message;
  AttentionProblem p = scalar_problem(1.f, {1.f, 2.f}, {1.f, 2.f}, 1.f);
  AttentionProblem bad = p;
  bad.variant.window_left = 3;  // a window needs positions
  EXPECT_NE(invalid_argument_message([&] {
              reference_state(bad, all_keys(2));
            }).find("'problem.positions'"),
            std::string::npos);
  bad.positions = {0, 1};  // one row, two positions
  EXPECT_NE(invalid_argument_message([&] {
              reference_state(bad, all_keys(2));
            }).find("'problem.positions'"),
            std::string::npos);
  bad = p;
  bad.positions = {1};
  bad.key_positions = {0};
  EXPECT_NE(
      invalid_argument_message([&] { select_keys(bad, {0}); }).find("'problem.key_positions'"),
      std::string::npos);
  bad = p;
  bad.variant.window_left = -2;
  bad.positions = {1};
  EXPECT_NE(invalid_argument_message([&] {
              reference_state(bad, {0});
            }).find("'problem.variant.window_left'"),
            std::string::npos);
  for (float cap :
       {-1.f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    bad = p;
    bad.variant.logits_soft_cap = cap;
    EXPECT_NE(invalid_argument_message([&] {
                reference_state(bad, {0});
              }).find("'problem.variant.logits_soft_cap'"),
              std::string::npos)
        << cap;
  }
  EXPECT_NE(invalid_argument_message([&] { visible_keys(p, 1, {0}); }).find("'token'"),
            std::string::npos);
  EXPECT_NE(invalid_argument_message([&] { key_position(p, 2); }).find("'key'"), std::string::npos);

  const char* gen = "attnstate::testing::gen_attention_problem";
  ProblemGenOptions o;
  o.soft_cap_percent = 101;
  EXPECT_NE(invalid_argument_message([&] {
              gen_attention_problem(o);
            }).find("'options.soft_cap_percent'"),
            std::string::npos);
  o = ProblemGenOptions{};
  o.window_percent = -1;
  EXPECT_NE(
      invalid_argument_message([&] { gen_attention_problem(o); }).find("'options.window_percent'"),
      std::string::npos);
  o = ProblemGenOptions{};
  o.soft_caps = {30.f, -5.f};
  const std::string msg = invalid_argument_message([&] { gen_attention_problem(o); });
  EXPECT_NE(msg.find("'options.soft_caps[1]'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(gen), std::string::npos) << msg;
  o = ProblemGenOptions{};
  o.soft_caps.clear();
  o.soft_cap_percent = 10;
  EXPECT_NE(invalid_argument_message([&] { gen_attention_problem(o); }).find("'options.soft_caps'"),
            std::string::npos);
  KernelCheckOptions k;
  k.problems.window_percent = 200;
  EXPECT_NE(invalid_argument_message([&] {
              check_state_kernel(
                  [](const AttentionProblem& p, const std::vector<std::int64_t>&) {
                    return make_output_state(p);
                  },
                  k);
            }).find("'options.problems.window_percent'"),
            std::string::npos);
}

}  // namespace
