/// @file test_cpu_attention.cpp
/// @brief cpu/attention.hpp against a double-precision reference: dtypes, GQA groups, strided
///        q/k/v, segment lengths around the key block, empty segments and large logits.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attnstate/cpu/attention.hpp"
#include "cpu_test_utils.hpp"

namespace attnstate {
namespace {

using test::OwnedState;
using test::OwnedTensor;
using test::RefState;

const DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST(AttentionState, MatchesDoubleReferenceAcrossDtypesAndGqa) {
  std::mt19937 rng(201);
  struct Case {
    std::int64_t tokens, hq, hkv, dim, keys;
  };
  const Case cases[] = {{1, 1, 1, 1, 1},   {1, 4, 1, 16, 63},    {3, 8, 2, 64, 64},
                        {2, 6, 3, 40, 65}, {1, 128, 8, 64, 100}, {4, 4, 4, 128, 130}};
  for (const Case& c : cases)
    for (DType dq : kDTypes)
      for (DType dkv : kDTypes) {
        const DType dout = kDTypes[rng() % 3];
        const std::int64_t pad = rng() % 3;
        OwnedTensor q = test::make_tensor(c.tokens, c.hq, c.dim, dq, rng, 1.f, pad, rng() % 4);
        OwnedTensor k = test::make_tensor(c.keys, c.hkv, c.dim, dkv, rng, 1.f, pad, rng() % 4);
        OwnedTensor v = test::make_tensor(c.keys, c.hkv, c.dim, dkv, rng, 1.f, rng() % 3, 0);
        OwnedState out = test::make_state(c.tokens, c.hq, c.dim, dout, test::random_base(rng),
                                          test::random_padding(rng));
        const float scale = 1.f / std::sqrt(static_cast<float>(c.dim));
        cpu::attention_state(q.view, k.view, v.view, scale, out.view());
        // 0 stands for 1/sqrt(head_dim), as in every entry point
        RefState ref = test::ref_attention(q, k, v, scale == 0.f ? 1.f / std::sqrt(8.f) : scale);
        // o is a convex combination of |v| <~ 5: scale the tolerance accordingly.
        test::expect_matches(out, ref, 3 * test::o_tolerance(dout),
                             std::to_string(c.tokens) + "x" + std::to_string(c.hq) + "/" +
                                 std::to_string(c.hkv) + "x" + std::to_string(c.dim) +
                                 " T=" + std::to_string(c.keys) + " " + to_string(dq) + "/" +
                                 to_string(dkv) + "->" + to_string(dout));
      }
}

TEST(AttentionState, EmptySegmentGivesEmptyState) {
  std::mt19937 rng(202);
  for (DType dout : kDTypes) {
    OwnedTensor q = test::make_tensor(3, 4, 32, DType::kF32, rng);
    OwnedTensor k = test::make_tensor(0, 2, 32, DType::kBF16, rng);
    OwnedTensor v = test::make_tensor(0, 2, 32, DType::kBF16, rng);
    OwnedState out = test::make_state(3, 4, 32, dout, LseBase::kBase2);
    cpu::attention_state(q.view, k.view, v.view, 0.125f, out.view());
    for (std::int64_t t = 0; t < 3; ++t)
      for (std::int64_t h = 0; h < 4; ++h) {
        EXPECT_EQ(out.lse_at(t, h), -INFINITY);
        for (std::int64_t d = 0; d < 32; ++d) EXPECT_EQ(out.o_at(t, h, d), 0.0);
      }
    EXPECT_TRUE(out.padding_untouched());
  }
}

TEST(AttentionState, LargeLogitsStayFinite) {
  std::mt19937 rng(203);
  OwnedTensor q = test::make_tensor(2, 4, 64, DType::kF32, rng, 40.f);  // q x 40
  OwnedTensor k = test::make_tensor(300, 2, 64, DType::kF32, rng);
  OwnedTensor v = test::make_tensor(300, 2, 64, DType::kF32, rng);
  OwnedState out = test::make_state(2, 4, 64, DType::kF32, LseBase::kNatural);
  const float scale = 0.125f;
  cpu::attention_state(q.view, k.view, v.view, scale, out.view());
  RefState ref = test::ref_attention(q, k, v, scale);
  double max_lse = 0;
  for (double l : ref.lse) max_lse = std::max(max_lse, l);
  EXPECT_GT(max_lse, 88.8) << "scores must exceed the fp32 exp range for this test to bite";
  test::expect_matches(out, ref, 1e-4, "q x 40");
}

TEST(AttentionState, ScoreScaleIsApplied) {
  std::mt19937 rng(204);
  OwnedTensor q = test::make_tensor(1, 2, 8, DType::kF32, rng);
  OwnedTensor k = test::make_tensor(20, 2, 8, DType::kF32, rng);
  OwnedTensor v = test::make_tensor(20, 2, 8, DType::kF32, rng);
  for (float scale : {0.f, 0.5f, 3.f}) {
    OwnedState out = test::make_state(1, 2, 8, DType::kF32, LseBase::kNatural);
    cpu::attention_state(q.view, k.view, v.view, scale, out.view());
    // 0 stands for 1/sqrt(head_dim), as in every entry point
    RefState ref = test::ref_attention(q, k, v, scale == 0.f ? 1.f / std::sqrt(8.f) : scale);
    test::expect_matches(out, ref, 1e-5, "scale " + std::to_string(scale));
  }
}

}  // namespace
}  // namespace attnstate
