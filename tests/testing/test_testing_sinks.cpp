/// @file test_testing_sinks.cpp
/// @brief The kit's attention sinks: the double reference merges each row once with its head's
///        sink after the keys (partials stay sink-free), problems keep and print their sinks,
///        the generators draw sinks only when asked, and the conformance check tells a kernel
///        merging the sink once from kernels that merge it into every split or partial, ignore
///        it, drop it from empty rows or merge it without max subtraction.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "attnstate/core/sink.hpp"
#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/merge.hpp"
#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"
#include "kit_test_utils.hpp"
#include "sample_kernels.hpp"

namespace {

using namespace attnstate::testing;  // NOLINT(google-build-using-namespace): test file
using attnstate::DType;
using attnstate::LseBase;
using attnstate_test::FlashConfig;
using attnstate_test::invalid_argument_message;
using attnstate_test::SinkMode;

constexpr double kInf = std::numeric_limits<double>::infinity();

/// One query row, `heads` heads (one KV head), head_dim 1, keys `k` with values `v` (f32).
AttentionProblem scalar_problem(float q, const std::vector<float>& k, const std::vector<float>& v,
                                std::int64_t heads = 1) {
  const auto n = static_cast<std::int64_t>(k.size());
  return make_problem(1, heads, 1, 1, n, DType::kF32, std::vector<float>(heads, q), k, v, 1.f,
                      DType::kF32, LseBase::kNatural);
}

TEST(KitSinks, ReferenceAddsTheSinkToTheDenominatorOnly) {
  const std::vector<float> k = {0.5f, -1.f, 2.f}, v = {1.f, -3.f, 0.5f};
  AttentionProblem p = scalar_problem(1.f, k, v);
  p.sinks = {1.5f};
  double num = 0, mag = 0, den = std::exp(1.5);
  for (std::size_t i = 0; i < k.size(); ++i) {
    num += std::exp(static_cast<double>(k[i])) * v[i];
    mag += std::exp(static_cast<double>(k[i])) * std::fabs(v[i]);
    den += std::exp(static_cast<double>(k[i]));
  }
  for (LseBase base : {LseBase::kNatural, LseBase::kBase2}) {
    const ReferenceState r = reference_state(p, all_keys(3), base);
    const double to_base = base == LseBase::kBase2 ? 1 / std::log(2.0) : 1.0;
    EXPECT_NEAR(r.o_at(0, 0, 0), num / den, 1e-14);
    EXPECT_NEAR(r.lse_at(0, 0), std::log(den) * to_base, 1e-13);
    ASSERT_TRUE(r.has_o_magnitude());
    EXPECT_NEAR(r.o_magnitude[0], mag / den, 1e-14);  // scaled with o
  }
  // the sink-free problem is the state of the keys alone; applying the sinks to it gives the same
  const ReferenceState free = reference_state(without_sinks(p), all_keys(3));
  EXPECT_NEAR(free.lse_at(0, 0), std::log(den - std::exp(1.5)), 1e-13);
  const ReferenceState applied = apply_sinks(free, p.sinks);
  EXPECT_NEAR(applied.o_at(0, 0, 0), num / den, 1e-14);
  EXPECT_NEAR(applied.lse_at(0, 0), std::log(den), 1e-13);
}

TEST(KitSinks, AnEmptyRowBecomesTheSinkState) {
  AttentionProblem p = scalar_problem(1.f, {0.5f, 1.f}, {1.f, 2.f}, 2);
  p.sinks = {3.f, -std::numeric_limits<float>::infinity()};  // head 1 has no sink
  const ReferenceState none = reference_state(p, {}, LseBase::kBase2);
  EXPECT_EQ(none.o_at(0, 0, 0), 0.0);
  EXPECT_NEAR(none.lse_at(0, 0), 3.0 / std::log(2.0), 1e-14);
  EXPECT_EQ(none.lse_at(0, 1), -kInf);  // (0, -inf) merged with (0, -inf)
  EXPECT_EQ(none.o_at(0, 1, 0), 0.0);
  // a row whose window holds none of the keys, likewise
  p.positions = {-1};
  const ReferenceState windowed = reference_state(p, all_keys(2));
  EXPECT_EQ(windowed.o_at(0, 0, 0), 0.0);
  EXPECT_EQ(windowed.lse_at(0, 0), 3.0);
  // a -inf sink leaves its rows as they are
  p.positions.clear();
  const ReferenceState free = reference_state(without_sinks(p), all_keys(2));
  const ReferenceState sunk = reference_state(p, all_keys(2));
  EXPECT_NEAR(sunk.lse_at(0, 1), free.lse_at(0, 1), 1e-15);
  EXPECT_NEAR(sunk.o_at(0, 1, 0), free.o_at(0, 1, 0), 1e-15);
  EXPECT_LT(sunk.o_at(0, 0, 0), free.o_at(0, 0, 0));  // head 0's o is scaled down
}

TEST(KitSinks, ASinkStateIsAStateAndNaNRowsStayNaN) {
  const ReferenceState s = reference_sink_state({1.f, -2.f}, 3, 4, LseBase::kNatural);
  EXPECT_EQ(s.tokens, 3);
  EXPECT_EQ(s.heads, 2);
  EXPECT_EQ(s.lse_at(2, 1), -2.0);
  EXPECT_EQ(s.o_at(1, 0, 3), 0.0);
  ASSERT_TRUE(s.has_o_magnitude());
  EXPECT_EQ(s.o_magnitude[5], 0.0);
  ReferenceState nan_row = reference_sink_state({0.f}, 1, 1, LseBase::kNatural);
  nan_row.o_magnitude.clear();  // a state without magnitudes keeps none
  nan_row.lse[0] = std::numeric_limits<double>::quiet_NaN();
  const ReferenceState r = apply_sinks(nan_row, {1.f});
  EXPECT_TRUE(std::isnan(r.lse[0]));
  EXPECT_TRUE(std::isnan(r.o[0]));
  EXPECT_FALSE(r.has_o_magnitude());
  // no sinks: the state unchanged
  EXPECT_EQ(apply_sinks(s, {}).lse, s.lse);
}

TEST(KitSinks, ProblemsKeepPrintAndCheckTheirSinks) {
  AttentionProblem p = scalar_problem(1.f, {1.f, 2.f, 3.f}, {1.f, 2.f, 3.f}, 2);
  p.sinks = {0.25f, 7.5f};
  EXPECT_TRUE(p.has_sinks());
  EXPECT_EQ(p.attention_sinks().logits, p.sinks.data());
  EXPECT_TRUE(without_sinks(p).attention_sinks().none());
  EXPECT_EQ(select_keys(p, {2}).sinks, p.sinks);
  EXPECT_EQ(quantize_kv(p, DType::kE4M3, {}, {}).sinks, p.sinks);
  const AttentionProblem free = without_sinks(p);
  EXPECT_FALSE(free.has_sinks());
  EXPECT_EQ(free.num_keys(), 3);
  std::ostringstream ss;
  ss << p;
  EXPECT_NE(ss.str().find("sinks {0.25, 7.5}"), std::string::npos) << ss.str();

  AttentionProblem bad = p;
  bad.sinks = {1.f};  // one per query head
  std::string msg = invalid_argument_message([&] { reference_state(bad, {0}); });
  EXPECT_NE(msg.find("'problem.sinks'"), std::string::npos) << msg;
  for (float s :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    bad.sinks = {0.f, s};
    msg = invalid_argument_message([&] { select_keys(bad, {0}); });
    EXPECT_NE(msg.find("'problem.sinks[1]'"), std::string::npos) << msg;
  }
  const ReferenceState r = reference_state(free, all_keys(3));
  msg = invalid_argument_message([&] { apply_sinks(r, {1.f, 2.f, 3.f}); });
  EXPECT_NE(msg.find("'sinks'"), std::string::npos) << msg;
  msg = invalid_argument_message([&] {
    apply_sinks(r, {1.f, std::numeric_limits<float>::quiet_NaN()});
  });
  EXPECT_NE(msg.find("'sinks[1]'"), std::string::npos) << msg;
  msg = invalid_argument_message([&] { reference_sink_state({}, 1, 1, LseBase::kNatural); });
  EXPECT_NE(msg.find("'sinks'"), std::string::npos) << msg;
  msg = invalid_argument_message([&] { reference_sink_state({1.f}, -1, 1, LseBase::kNatural); });
  EXPECT_NE(msg.find("'tokens'"), std::string::npos) << msg;
}

TEST(KitSinks, GeneratorOptionsOfSinksAreChecked) {
  ProblemGenOptions o;
  o.sink_percent = 101;
  EXPECT_NE(
      invalid_argument_message([&] { gen_attention_problem(o); }).find("'options.sink_percent'"),
      std::string::npos);
  o = sink_problem_options();
  o.sink_min = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(invalid_argument_message([&] { gen_attention_problem(o); }).find("'options.sink_min'"),
            std::string::npos);
  o = sink_problem_options();
  o.sink_max = -5.f;  // below sink_min
  const std::string msg = invalid_argument_message([&] { gen_attention_problem(o); });
  EXPECT_NE(msg.find("'options.sink_max'"), std::string::npos) << msg;
  KernelCheckOptions k;
  k.problems.sink_percent = -1;
  EXPECT_NE(invalid_argument_message([&] {
              check_state_kernel(
                  [](const AttentionProblem& p, const std::vector<std::int64_t>&) {
                    return make_output_state(p);
                  },
                  k);
            }).find("'options.problems.sink_percent'"),
            std::string::npos);
}

TEST(KitSinks, DefaultOptionsDrawNoSinks) {
  for (const ProblemGenOptions& o : {ProblemGenOptions{}, variant_problem_options(),
                                     decode_problem_options(), fp8_kv_problem_options()}) {
    for (const AttentionProblem& p :
         attnstate_test::sample_values(gen_attention_problem(o), 100, 5)) {
      EXPECT_FALSE(p.has_sinks());
    }
  }
}

TEST(KitSinks, SinksAreDrawnLastSoTheRestOfTheProblemIsUnchanged) {
  ProblemGenOptions with = sink_problem_options();
  with.sink_percent = 100;
  const auto a = attnstate_test::sample_values(gen_attention_problem(ProblemGenOptions{}), 80, 9);
  const auto b = attnstate_test::sample_values(gen_attention_problem(with), 80, 9);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].value_seed, b[i].value_seed);
    EXPECT_EQ(a[i].q.to_floats(), b[i].q.to_floats());
    EXPECT_EQ(a[i].k.to_floats(), b[i].k.to_floats());
    EXPECT_EQ(static_cast<std::int64_t>(b[i].sinks.size()), b[i].heads_q());
  }
}

TEST(KitSinks, GeneratorsDrawSinksThatDominateAndSinksThatBarelyCount) {
  const auto problems =
      attnstate_test::sample_values(gen_attention_problem(sink_problem_options()), 400, 13);
  int with = 0, dominant = 0, negligible = 0, comparable = 0;
  for (const AttentionProblem& p : problems) {
    if (!p.has_sinks()) continue;
    ++with;
    ASSERT_EQ(static_cast<std::int64_t>(p.sinks.size()), p.heads_q());
    const ReferenceState free = reference_state(without_sinks(p), all_keys(p.num_keys()));
    for (std::int64_t h = 0; h < p.heads_q(); ++h) {
      const double s = p.sinks[static_cast<std::size_t>(h)];
      EXPECT_GE(s, -4.0);
      EXPECT_LE(s, 12.0);
      const double lse = free.lse_at(0, h) * (p.base == LseBase::kBase2 ? std::log(2.0) : 1.0);
      dominant += s > lse + 3;
      negligible += s < lse - 3;
      comparable += std::fabs(s - lse) <= 3;
    }
  }
  EXPECT_GT(with, 140);
  EXPECT_LT(with, 260);
  EXPECT_GT(dominant, 50);
  EXPECT_GT(negligible, 50);
  EXPECT_GT(comparable, 50);
}

// --- Conformance: the laws with sinks -------------------------------------------------------

KernelCheckOptions check_options(int sink_percent = 100) {
  KernelCheckOptions o;
  o.problems.sink_percent = sink_percent;
  o.problems.max_keys = 120;
  o.num_tests = 60;
  o.seed = 20261204;
  return o;
}

StateKernel flash(SinkMode mode, int splits = 3) {
  FlashConfig c;
  c.block = 16;
  c.splits = splits;
  c.sinks = mode;
  return [c](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
    return attnstate_test::flash_kernel(p, keys, c);
  };
}

TEST(KitSinks, AKernelMergingTheSinkOncePassesEveryLaw) {
  const KernelCheckReport r = check_state_kernel(flash(SinkMode::kOnce), check_options(50));
  EXPECT_TRUE(r.passed()) << r.summary();
  KernelCheckOptions decode = check_options(50);
  decode.problems = sink_problem_options(decode_problem_options());
  decode.num_tests = 30;
  const KernelCheckReport d = check_state_kernel(flash(SinkMode::kOnce), decode);
  EXPECT_TRUE(d.passed()) << d.summary();
}

TEST(KitSinks, ASinkMergedIntoEverySplitIsCaught) {
  const KernelCheckReport r = check_state_kernel(flash(SinkMode::kPerSplit), check_options());
  EXPECT_TRUE(r.failed(Law::kSplitMerge)) << r.summary();
  EXPECT_TRUE(r.failed(Law::kExactness)) << r.summary();
  // (shrunk to two keys, hence two splits, or more)
  EXPECT_NE(r.summary().find("matches the reference with the sink merged"), std::string::npos)
      << r.summary();
  // one split: merging the sink into it is merging it once
  const KernelCheckReport one = check_state_kernel(flash(SinkMode::kPerSplit, 1), check_options());
  EXPECT_TRUE(one.passed()) << one.summary();
}

/// A kernel whose sinks are a layer parameter it applies to every state it computes: it remembers
/// the last sinks it was given and merges them into the states asked for without sinks too (the
/// parts of a split). Each call's own result is the sink-applied state of its keys.
struct SinkIntoEveryPartial {
  std::shared_ptr<std::vector<float>> layer = std::make_shared<std::vector<float>>();
  HostState operator()(const AttentionProblem& p, const std::vector<std::int64_t>& keys) const {
    if (p.has_sinks()) *layer = p.sinks;
    AttentionProblem q = p;
    if (static_cast<std::int64_t>(layer->size()) == p.heads_q()) q.sinks = *layer;
    return attnstate_test::flash_kernel(q, keys, FlashConfig{});
  }
};

TEST(KitSinks, ASinkMergedIntoEveryPartialFailsSplitMergeOnly) {
  KernelCheckOptions o = check_options();
  o.laws = {Law::kExactness, Law::kSplitMerge, Law::kLargeLogits};
  const KernelCheckReport r = check_state_kernel(SinkIntoEveryPartial{}, o);
  EXPECT_FALSE(r.failed(Law::kExactness)) << r.summary();  // each state alone looks right
  EXPECT_FALSE(r.failed(Law::kLargeLogits)) << r.summary();
  EXPECT_TRUE(r.failed(Law::kSplitMerge)) << r.summary();
  EXPECT_NE(r.summary().find("was asked for a partial state"), std::string::npos) << r.summary();
}

TEST(KitSinks, AKernelIgnoringTheSinksFailsExactness) {
  KernelCheckOptions o = check_options();
  o.laws = {Law::kExactness};
  const KernelCheckReport r = check_state_kernel(flash(SinkMode::kIgnore), o);
  EXPECT_TRUE(r.failed(Law::kExactness)) << r.summary();
  EXPECT_NE(r.summary().find("without the sinks"), std::string::npos) << r.summary();
}

TEST(KitSinks, AKernelDroppingTheSinkOfAnEmptyKeySetFailsIdentity) {
  KernelCheckOptions o = check_options();
  o.laws = {Law::kIdentity};
  const StateKernel once = flash(SinkMode::kOnce);
  const KernelCheckReport r = check_state_kernel(
      [once](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        if (!keys.empty()) return once(p, keys);
        HostState out = make_output_state(p);  // an early return for no keys: (0, -inf)
        for (std::int64_t t = 0; t < out.tokens(); ++t) {
          for (std::int64_t h = 0; h < out.heads(); ++h) {
            out.set_lse(t, h, -INFINITY);
            for (std::int64_t d = 0; d < out.head_dim(); ++d) out.set_o(t, h, d, 0.f);
          }
        }
        return out;
      },
      o);
  EXPECT_TRUE(r.failed(Law::kIdentity)) << r.summary();
  EXPECT_NE(r.summary().find("with sinks, fn(∅) must be the sink state"), std::string::npos)
      << r.summary();
}

TEST(KitSinks, ASinkMergeWithoutMaxSubtractionFailsLargeLogits) {
  // o · e^lse / (e^lse + e^s) in fp32: e^lse overflows once the scores reach ~88.
  KernelCheckOptions o = check_options();
  o.laws = {Law::kExactness, Law::kLargeLogits};
  o.problems.large_logits_percent = 0;  // the large_logits law draws its own
  const StateKernel plain = flash(SinkMode::kIgnore);
  const KernelCheckReport r = check_state_kernel(
      [plain](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        HostState out = plain(p, keys).converted(DType::kF32, LseBase::kNatural);
        for (std::int64_t t = 0; t < out.tokens(); ++t) {
          for (std::int64_t h = 0; h < out.heads(); ++h) {
            const float el = std::exp(out.lse(t, h));
            const float es = std::exp(p.sinks[static_cast<std::size_t>(h)]);
            for (std::int64_t d = 0; d < out.head_dim(); ++d) {
              out.set_o(t, h, d, out.o(t, h, d) * el / (el + es));
            }
            out.set_lse(t, h, std::log(el + es));
          }
        }
        return out.converted(p.out_dtype, p.base);
      },
      o);
  EXPECT_FALSE(r.failed(Law::kExactness)) << r.summary();  // ordinary logits: right
  EXPECT_TRUE(r.failed(Law::kLargeLogits)) << r.summary();
}

TEST(KitSinks, TheSinkAsASecondPassFitsTheDefaultTolerance) {
  // The library's producer writes the sink-free state in the output dtype, then one
  // merge_state_inplace with the sink state applies the sinks: o rounded twice, within the
  // tolerance model's factor 2, with P kept in fp32 (the strictest tolerance).
  KernelCheckOptions o = check_options(50);
  o.p_rounded_to_input = false;
  o.num_tests = 80;
  const KernelCheckReport r = check_state_kernel(
      [](const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
        const AttentionProblem sub = select_keys(p, keys);
        HostState out = make_output_state(sub);
        attnstate::cpu::attention_state(sub.q.view(), sub.k.view(), sub.v.view(), sub.scale,
                                        out.view());
        if (p.has_sinks()) {
          const std::vector<float> zeros(static_cast<std::size_t>(p.head_dim()), 0.f);
          attnstate::cpu::merge_state_inplace(
              out.view(),
              attnstate::make_sink_state(p.sinks.data(), zeros.data(), DType::kF32, p.tokens(),
                                         p.heads_q(), p.head_dim(), LseBase::kNatural));
        }
        return out;
      },
      o);
  EXPECT_TRUE(r.passed()) << r.summary();
}

}  // namespace
