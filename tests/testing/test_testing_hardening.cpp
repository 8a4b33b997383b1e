/// @file test_testing_hardening.cpp
/// @brief The testing kit under bad arguments: huge shapes are rejected before any size
///        overflows, out-of-range indices throw naming the index instead of reading out of
///        bounds, and every error names its function with the `attnstate::testing::` prefix;
///        and the conformance report: an LSE error that relabelling the base does not fix is
///        reported as an exactness failure, counterexample values are labelled, and the seed is
///        printed once.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/host_tensor.hpp"
#include "attnstate/testing/problem.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"
#include "kit_test_utils.hpp"
#include "sample_kernels.hpp"

namespace {

using attnstate_test::invalid_argument_message;

using attnstate::DType;
using attnstate::LseBase;
using attnstate::testing::AttentionProblem;
using attnstate::testing::HostState;
using attnstate::testing::HostTensor;
using attnstate::testing::KernelCheckOptions;
using attnstate::testing::KernelCheckReport;
using attnstate::testing::Law;

constexpr std::int64_t kHuge = std::int64_t{1} << 40;

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

TEST(KitHardening, HostTensorRejectsShapesWhoseSizeOverflows) {
  // 2^93 elements: the element count overflows 64 bits.
  const std::string msg = invalid_argument_message([] {
    HostTensor t(DType::kF32, {kHuge, kHuge, kHuge});
  });
  EXPECT_TRUE(starts_with(msg, "attnstate::testing::HostTensor: argument 'shape': expected"))
      << msg;
  EXPECT_NE(msg.find(", got "), std::string::npos) << msg;
  // 2^61 f32 elements fit in 64 bits but their 2^63 bytes do not.
  const std::string bytes =
      invalid_argument_message([] { HostTensor t(DType::kF32, {std::int64_t{1} << 61}); });
  EXPECT_TRUE(starts_with(bytes, "attnstate::testing::HostTensor: argument 'shape'")) << bytes;
  // from_floats checks the shape before comparing the value count.
  const std::string ff = invalid_argument_message([] {
    HostTensor::from_floats(DType::kF16, {kHuge, kHuge}, std::vector<float>(4));
  });
  EXPECT_TRUE(starts_with(ff, "attnstate::testing::HostTensor::from_floats: argument 'shape'"))
      << ff;
}

TEST(KitHardening, HostTensorNamesTheNegativeExtentAndTheBadDtype) {
  const std::string msg = invalid_argument_message([] { HostTensor t(DType::kF32, {2, -3}); });
  EXPECT_EQ(msg, "attnstate::testing::HostTensor: argument 'shape[1]': expected >= 0, got -3");
  const std::string dt = invalid_argument_message([] { HostTensor t(static_cast<DType>(9), {2}); });
  EXPECT_TRUE(starts_with(dt, "attnstate::testing::HostTensor: argument 'dtype'")) << dt;
}

TEST(KitHardening, HostTensorElementAccessIsBoundsChecked) {
  HostTensor t = HostTensor::from_floats(DType::kBF16, {2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(invalid_argument_message([&] { t.get(6); }),
            "attnstate::testing::HostTensor::get: argument 'i': expected an index in [0, 6), got "
            "6");
  EXPECT_EQ(invalid_argument_message([&] { t.set(-1, 0.f); }),
            "attnstate::testing::HostTensor::set: argument 'i': expected an index in [0, 6), got "
            "-1");
  EXPECT_EQ(invalid_argument_message([&] { t.dim(2); }),
            "attnstate::testing::HostTensor::dim: argument 'i': expected an index in [0, 2), got "
            "2");
  EXPECT_EQ(t.get(5), 6.f);  // in range still works
}

TEST(KitHardening, HostStateRejectsRowCountsThatOverflowEvenWithoutElements) {
  // head_dim 0 makes o empty, but tokens x heads = 2^80 LSEs.
  const std::string msg = invalid_argument_message(
      [] { HostState s(kHuge, kHuge, 0, DType::kF32, LseBase::kNatural); });
  EXPECT_TRUE(starts_with(msg, "attnstate::testing::HostState: argument 'heads': expected")) << msg;
  EXPECT_NE(msg.find("got " + std::to_string(kHuge) + " x " + std::to_string(kHuge)),
            std::string::npos)
      << msg;
  const std::string elems = invalid_argument_message(
      [] { HostState s(1 << 20, 1 << 20, kHuge, DType::kF16, LseBase::kNatural); });
  EXPECT_TRUE(starts_with(elems, "attnstate::testing::HostState: argument 'head_dim'")) << elems;
}

TEST(KitHardening, HostStateNamesEachBadArgument) {
  EXPECT_EQ(invalid_argument_message([] { HostState s(-1, 2, 2, DType::kF32, LseBase::kNatural); }),
            "attnstate::testing::HostState: argument 'tokens': expected an extent in [0, 2^62], "
            "got -1");
  EXPECT_EQ(invalid_argument_message([] { HostState s(1, 2, -4, DType::kF32, LseBase::kNatural); }),
            "attnstate::testing::HostState: argument 'head_dim': expected an extent in [0, 2^62], "
            "got -4");
  const std::string base =
      invalid_argument_message([] { HostState s(1, 1, 1, DType::kF32, static_cast<LseBase>(5)); });
  EXPECT_TRUE(starts_with(base, "attnstate::testing::HostState: argument 'base'")) << base;
  HostState s(1, 1, 1, DType::kF32, LseBase::kNatural);
  const std::string relabel =
      invalid_argument_message([&] { s.relabel_base(static_cast<LseBase>(3)); });
  EXPECT_TRUE(starts_with(relabel, "attnstate::testing::HostState::relabel_base: argument 'base'"))
      << relabel;
}

TEST(KitHardening, HostStateElementAccessNamesTheIndexOutOfRange) {
  HostState s(2, 3, 4, DType::kF16, LseBase::kBase2);
  // (0, 0, 4) and (0, 3) are inside the flat storage: only per-index checks catch them.
  EXPECT_EQ(invalid_argument_message([&] { s.o(0, 0, 4); }),
            "attnstate::testing::HostState::o: argument 'd': expected an index in [0, 4), got 4");
  EXPECT_EQ(invalid_argument_message([&] { s.set_o(0, 3, 0, 1.f); }),
            "attnstate::testing::HostState::set_o: argument 'h': expected an index in [0, 3), "
            "got 3");
  EXPECT_EQ(invalid_argument_message([&] { s.lse(2, 0); }),
            "attnstate::testing::HostState::lse: argument 't': expected an index in [0, 2), got 2");
  EXPECT_EQ(invalid_argument_message([&] { s.set_lse(0, 3, 0.f); }),
            "attnstate::testing::HostState::set_lse: argument 'h': expected an index in [0, 3), "
            "got 3");
  EXPECT_EQ(invalid_argument_message([&] { s.is_empty_row(-1, 0); }),
            "attnstate::testing::HostState::is_empty_row: argument 't': expected an index in [0, "
            "2), got -1");
  s.set_lse(1, 2, 0.5f);
  EXPECT_EQ(s.lse(1, 2), 0.5f);
}

TEST(KitHardening, HostStateWithResizedStorageIsAnErrorNotAWildRead) {
  HostState s(2, 2, 2, DType::kF32, LseBase::kNatural);
  s.lse_values().resize(1);
  const std::string msg = invalid_argument_message([&] { s.lse(1, 1); });
  EXPECT_TRUE(starts_with(msg, "attnstate::testing::HostState::lse: argument 'this'")) << msg;
  const std::string view = invalid_argument_message([&] { s.view(); });
  EXPECT_TRUE(starts_with(view, "attnstate::testing::HostState::view: argument 'this'")) << view;
}

TEST(KitHardening, FromViewRejectsStridesWhoseOffsetsOverflow) {
  std::vector<float> o(8), lse(4);
  attnstate::ConstStateView v = attnstate::make_const_state_view(o.data(), DType::kF32, lse.data(),
                                                                 2, 2, 2, LseBase::kNatural);
  v.o_stride_token = std::int64_t{1} << 62;  // token 1 at 2^62 elements: past every address
  const std::string msg = invalid_argument_message([&] { HostState::from_view(v); });
  EXPECT_TRUE(starts_with(msg,
                          "attnstate::testing::HostState::from_view: argument "
                          "'view.o_stride_token': expected"))
      << msg;
  v = attnstate::make_const_state_view(o.data(), DType::kF32, lse.data(), 2, 2, 2,
                                       LseBase::kNatural);
  v.lse_stride_head = -1;
  const std::string neg = invalid_argument_message([&] { HostState::from_view(v); });
  EXPECT_TRUE(
      starts_with(neg, "attnstate::testing::HostState::from_view: argument 'view.lse_stride_head'"))
      << neg;
}

TEST(KitHardening, EveryKitErrorCarriesTheNamespacePrefix) {
  const AttentionProblem p =
      attnstate::testing::make_problem(1, 1, 1, 1, 2, DType::kF32, {1.f}, {1.f, 2.f}, {3.f, 4.f},
                                       1.f, DType::kF32, LseBase::kNatural);
  const std::vector<std::function<void()>> calls = {
      [] {
        attnstate::testing::make_problem(1, 2, 1, 1, 1, DType::kF32, {1.f}, {1.f}, {1.f}, 1.f,
                                         DType::kF32, LseBase::kNatural);
      },
      [&] {
        attnstate::testing::select_keys(p, {0, 2});
      },
      [&] { attnstate::testing::reference_state(p, {-1}); },
      [] { attnstate::testing::reference_merge(std::vector<HostState>{}, LseBase::kNatural); },
      [] {
        attnstate::ConstStateView v;
        v.space = attnstate::MemorySpace::kDevice;
        HostState::from_view(v);
      },
      [] { attnstate::testing::gen_key_subset(-1); },
      [] { attnstate::testing::gen_partition(-5, 2); },
      [] {
        attnstate::testing::gen_state(attnstate::testing::StateShape{-1, 1, 1});
      },
  };
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const std::string msg = invalid_argument_message(calls[i]);
    EXPECT_TRUE(starts_with(msg, "attnstate::testing::")) << "call " << i << ": " << msg;
    EXPECT_NE(msg.find(": argument '"), std::string::npos) << "call " << i << ": " << msg;
    EXPECT_NE(msg.find(", got "), std::string::npos) << "call " << i << ": " << msg;
  }
  // The offending element is named.
  EXPECT_EQ(invalid_argument_message(calls[1]),
            "attnstate::testing::select_keys: argument 'keys[1]': expected a key index in [0, 2), "
            "got 2");
}

TEST(KitHardening, ReferenceStatesOfTheWrongSizeAreRejected) {
  attnstate::testing::ReferenceState r;
  r.tokens = 2;
  r.heads = 1;
  r.head_dim = 3;
  r.o.assign(6, 0.0);
  r.lse.assign(1, 0.0);  // one LSE short
  const std::string msg = invalid_argument_message(
      [&] { attnstate::testing::reference_merge({r}, LseBase::kNatural); });
  EXPECT_EQ(msg,
            "attnstate::testing::reference_merge: argument 'states[0].lse': expected 2 values "
            "(its shape's), got 1");
  HostState s(2, 1, 3, DType::kF32, LseBase::kNatural);
  const std::string cmp = invalid_argument_message(
      [&] { attnstate::testing::compare_states(s, r, attnstate::testing::Tolerance{}); });
  EXPECT_TRUE(starts_with(cmp, "attnstate::testing::compare_states: argument 'expected.lse'"))
      << cmp;
}

TEST(KitHardening, ReferenceStateAccessIsBoundsChecked) {
  attnstate::testing::ReferenceState r;
  r.tokens = 2;
  r.heads = 1;
  r.head_dim = 3;
  r.o.assign(6, 1.0);
  r.lse.assign(2, 0.0);
  // (0, 0, 3) is inside o (flat index 3): only the per-index check catches it.
  EXPECT_EQ(invalid_argument_message([&] { r.o_at(0, 0, 3); }),
            "attnstate::testing::ReferenceState::o_at: argument 'd': expected an index in [0, 3), "
            "got 3");
  EXPECT_EQ(invalid_argument_message([&] { r.lse_at(0, 1); }),
            "attnstate::testing::ReferenceState::lse_at: argument 'h': expected an index in [0, "
            "1), got 1");
  r.lse.resize(1);
  const std::string shrunk = invalid_argument_message([&] { r.lse_at(1, 0); });
  EXPECT_TRUE(starts_with(shrunk, "attnstate::testing::ReferenceState::lse_at: argument 'this'"))
      << shrunk;
  EXPECT_EQ(r.o_at(1, 0, 2), 1.0);
}

TEST(KitHardening, GeneratorOptionsWhoseLargestDrawOverflowsAreRejected) {
  attnstate::testing::ProblemGenOptions p;
  p.max_tokens = std::numeric_limits<std::int64_t>::max();  // max_tokens + 1 would overflow
  const std::string msg =
      invalid_argument_message([&] { attnstate::testing::gen_attention_problem(p); });
  EXPECT_TRUE(starts_with(msg,
                          "attnstate::testing::gen_attention_problem: argument "
                          "'options.max_tokens': expected"))
      << msg;
  attnstate::testing::ProblemGenOptions k;
  k.max_keys = std::int64_t{1} << 60;  // x 2 heads x 32 dims: 2^66 elements of k
  const std::string keys =
      invalid_argument_message([&] { attnstate::testing::gen_attention_problem(k); });
  EXPECT_TRUE(starts_with(keys,
                          "attnstate::testing::gen_attention_problem: argument "
                          "'options.head_dims': expected"))
      << keys;
  attnstate::testing::StateGenOptions st;
  st.max_head_dim = std::int64_t{1} << 62;  // 3 x 3 x 2^62
  const std::string state = invalid_argument_message([&] { attnstate::testing::gen_state(st); });
  EXPECT_TRUE(starts_with(
      state, "attnstate::testing::gen_state: argument 'options.max_head_dim': expected"))
      << state;
}

// --- The conformance report ---

/// The correct sample kernel with every non-empty LSE shifted by +0.5: wrong in either base, so
/// relabelling the base cannot explain it.
HostState lse_shifted_kernel(const AttentionProblem& p, const std::vector<std::int64_t>& keys) {
  HostState out = attnstate_test::sample_kernel(p, keys, attnstate_test::Defect::kNone);
  for (float& x : out.lse_values()) {
    if (x != -std::numeric_limits<float>::infinity()) x += 0.5f;
  }
  return out;
}

KernelCheckOptions options_for(std::vector<Law> laws, std::uint64_t seed) {
  KernelCheckOptions o;
  o.laws = std::move(laws);
  o.num_tests = 20;
  o.seed = seed;
  o.p_rounded_to_input = false;
  return o;
}

TEST(KitReport, DeclaredBaseCallsAnErrorThatRelabellingDoesNotFixAnExactnessFailure) {
  const KernelCheckReport report =
      check_state_kernel(lse_shifted_kernel, options_for({Law::kDeclaredBase}, 777));
  ASSERT_TRUE(report.failed(Law::kDeclaredBase)) << report.summary();
  const std::string text = report.summary();
  EXPECT_NE(text.find("declared_base: an exactness failure, not a base problem"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("do not match the declared base"), std::string::npos) << text;
  EXPECT_EQ(text.find("mixed-base"), std::string::npos) << text;
}

TEST(KitReport, CounterexampleValuesAreLabelled) {
  const KernelCheckReport report =
      check_state_kernel(lse_shifted_kernel, options_for({Law::kExactness}, 779));
  ASSERT_TRUE(report.failed(Law::kExactness)) << report.summary();
  const std::string text = report.summary();
  EXPECT_NE(text.find("\nproblem (attnstate::testing::AttentionProblem):\nAttentionProblem("),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\nkeys K, indices into the problem's keys ("), std::string::npos) << text;
}

TEST(KitReport, TheSeedIsPrintedOnce) {
  const std::uint64_t seed = 987654321;
  const KernelCheckReport report = check_state_kernel(
      lse_shifted_kernel, options_for({Law::kExactness, Law::kDeclaredBase}, seed));
  ASSERT_EQ(report.failed_laws(), "exactness, declared_base") << report.summary();
  const std::string text = report.summary();
  std::size_t count = 0;
  for (std::size_t pos = text.find("987654321"); pos != std::string::npos;
       pos = text.find("987654321", pos + 1)) {
    ++count;
  }
  EXPECT_EQ(count, 1u) << text;
  EXPECT_NE(text.find("reproduce with RC_PARAMS=\"seed=987654321\""), std::string::npos) << text;
}

}  // namespace
