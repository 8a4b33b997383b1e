/// @file test_testing_generators.cpp
/// @brief The kit's generators produce what they promise: valid partitions with empty and
///        one-key parts, states with empty/NaN/extreme rows in every dtype and base, GQA and
///        decode-shaped problems, large logits.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/reference.hpp"

namespace {

using namespace attnstate::testing;  // NOLINT(google-build-using-namespace): test file

/// Draws `n` values of `gen` at growing sizes, from a fixed seed.
template <class T>
std::vector<T> sample(const rc::Gen<T>& gen, int n, std::uint64_t seed = 7) {
  std::vector<T> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(
        gen(rc::Random(seed * 1000003u + static_cast<std::uint64_t>(i)), i % 101).value());
  }
  return out;
}

RC_GTEST_PROP(KitGenerators, PartitionIsDisjointAndCoversAllKeys, ()) {
  const auto n = *rc::gen::inRange<std::int64_t>(0, 60);
  const auto max_parts = *rc::gen::inRange(1, 8);
  const auto parts = *gen_partition(n, max_parts);
  RC_ASSERT(parts.size() >= 1u);
  RC_ASSERT(static_cast<int>(parts.size()) <= max_parts);
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  for (const auto& part : parts) {
    RC_ASSERT(std::is_sorted(part.begin(), part.end()));
    for (std::int64_t k : part) {
      RC_ASSERT(k >= 0 && k < n);
      ++seen[static_cast<std::size_t>(k)];
    }
  }
  for (int c : seen) RC_ASSERT(c == 1);
}

RC_GTEST_PROP(KitGenerators, DisjointPairIsDisjoint, ()) {
  const auto n = *rc::gen::inRange<std::int64_t>(0, 60);
  const auto pair = *gen_disjoint_pair(n);
  std::set<std::int64_t> a(pair.first.begin(), pair.first.end());
  for (std::int64_t k : pair.second) RC_ASSERT(a.count(k) == 0u);
  for (std::int64_t k : pair.first) RC_ASSERT(k >= 0 && k < n);
  for (std::int64_t k : pair.second) RC_ASSERT(k >= 0 && k < n);
}

TEST(KitGenerators, PartitionsIncludeEmptyAndOneKeyParts) {
  int with_empty = 0, with_single = 0, with_many_parts = 0;
  for (const auto& parts : sample(gen_partition(12, 6), 300)) {
    bool empty = false, single = false;
    for (const auto& p : parts) {
      empty = empty || p.empty();
      single = single || p.size() == 1;
    }
    with_empty += empty;
    with_single += single;
    with_many_parts += parts.size() >= 3;
  }
  EXPECT_GT(with_empty, 10);
  EXPECT_GT(with_single, 10);
  EXPECT_GT(with_many_parts, 10);
}

TEST(KitGenerators, StatesCoverEveryDtypeBaseAndRowKind) {
  std::set<attnstate::DType> dtypes;
  std::set<attnstate::LseBase> bases;
  int empty_rows = 0, nan_in_empty_o = 0, high = 0, low = 0, ordinary = 0;
  for (const HostState& s : sample(gen_state(), 400)) {
    dtypes.insert(s.dtype());
    bases.insert(s.base());
    for (std::int64_t t = 0; t < s.tokens(); ++t) {
      for (std::int64_t h = 0; h < s.heads(); ++h) {
        const float lse = s.lse(t, h);
        if (s.is_empty_row(t, h)) {
          ++empty_rows;
          nan_in_empty_o += std::isnan(s.o(t, h, 0));
        } else if (lse > 9000) {
          ++high;
        } else if (lse < -9000) {
          ++low;
        } else {
          ASSERT_TRUE(std::fabs(lse) <= 20.f) << lse;
          ++ordinary;
          for (std::int64_t d = 0; d < s.head_dim(); ++d) ASSERT_LE(std::fabs(s.o(t, h, d)), 1.f);
        }
      }
    }
  }
  EXPECT_EQ(dtypes.size(), 3u);
  EXPECT_EQ(bases.size(), 2u);
  EXPECT_GT(empty_rows, 20);
  EXPECT_GT(nan_in_empty_o, 5);
  EXPECT_GT(high, 10);
  EXPECT_GT(low, 10);
  EXPECT_GT(ordinary, 100);
}

TEST(KitGenerators, EmptyStatesAreAllEmpty) {
  for (const HostState& s : sample(gen_empty_state(StateShape{2, 3, 4}), 50)) {
    for (float lse : s.lse_values()) EXPECT_EQ(lse, -INFINITY);
  }
}

TEST(KitGenerators, StateListsShareOneShape) {
  for (const auto& states : sample(gen_states(2, 5), 100)) {
    ASSERT_GE(states.size(), 2u);
    ASSERT_LE(states.size(), 5u);
    for (const HostState& s : states) {
      EXPECT_EQ(s.tokens(), states[0].tokens());
      EXPECT_EQ(s.heads(), states[0].heads());
      EXPECT_EQ(s.head_dim(), states[0].head_dim());
    }
  }
}

TEST(KitGenerators, ProblemsHaveValidGqaShapesAndLargeLogits) {
  int large = 0, gqa = 0;
  double max_score_large = 0, max_score_plain = 0;
  for (const AttentionProblem& p : sample(gen_attention_problem(), 300)) {
    ASSERT_EQ(p.heads_q() % p.heads_kv(), 0);
    ASSERT_EQ(p.k.shape(), p.v.shape());
    ASSERT_EQ(p.q.dim(2), p.k.dim(2));
    ASSERT_LE(p.num_keys(), 40);
    gqa += p.group_size() > 1;
    const double s = max_abs_score(p);
    if (p.large_logits) {
      ++large;
      max_score_large = std::max(max_score_large, s);
    } else {
      max_score_plain = std::max(max_score_plain, s);
    }
  }
  EXPECT_GT(large, 20);
  EXPECT_GT(gqa, 50);
  EXPECT_GT(max_score_large, 100.0);  // scores in the hundreds
  EXPECT_LT(max_score_plain, 40.0);
}

TEST(KitGenerators, DecodeProblemsAreDecodeShaped) {
  for (const AttentionProblem& p : sample(gen_attention_problem(decode_problem_options()), 30)) {
    EXPECT_GE(p.tokens(), 1);
    EXPECT_LE(p.tokens(), 8);
    EXPECT_TRUE(p.group_size() == 4 || p.group_size() == 8);
    EXPECT_TRUE(p.head_dim() == 64 || p.head_dim() == 128);
    EXPECT_LE(p.num_keys(), 300);
    EXPECT_NE(p.q.dtype(), attnstate::DType::kF32);
  }
}

TEST(KitGenerators, SameSeedSameValues) {
  const auto a = sample(gen_attention_problem(), 5, 99);
  const auto b = sample(gen_attention_problem(), 5, 99);
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].q.to_floats(), b[i].q.to_floats());
    EXPECT_EQ(a[i].v.to_floats(), b[i].v.to_floats());
  }
}

}  // namespace
