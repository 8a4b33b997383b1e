/// @file test_testing_generators.cpp
/// @brief The kit's generators produce what they promise: valid partitions with empty and
///        one-key parts, states with empty/NaN/extreme rows in every dtype and base, GQA and
///        decode-shaped problems, large logits (their properties:
///        property_tests/testing/prop_testing_kit.cpp).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "attnstate/testing/conformance.hpp"
#include "attnstate/testing/generators.hpp"
#include "attnstate/testing/reference.hpp"
#include "kit_test_utils.hpp"

namespace {

using namespace attnstate::testing;  // NOLINT(google-build-using-namespace): test file

/// Draws `n` values of `gen` at growing sizes, from a fixed seed.
template <class T>
std::vector<T> sample(const rc::Gen<T>& gen, int n, std::uint64_t seed = 7) {
  return attnstate_test::sample_values(gen, n, seed);
}

TEST(KitGenerators, PartitionsSplitTheKeysFromTheFirstCases) {
  // As the split_merge law draws them: 200 cases at RapidCheck's growing sizes (0, 1, 2, ...),
  // default problems, up to 5 parts. The part count and owners are drawn at full size, so even
  // the small first cases split the keys; drawn at the test size, one part held every key in
  // about 62% of the cases (fn(all) compared with itself).
  int cases = 0, split = 0, trivial = 0;
  std::vector<int> nonempty_hist(6, 0);
  const auto result = run_property(
      "partition counts",
      [&] {
        const PartitionedProblem pp = *gen_partitioned_problem(ProblemGenOptions{}, 5);
        int nonempty = 0;
        for (const auto& part : pp.parts) nonempty += !part.empty();
        ++cases;
        ++nonempty_hist[static_cast<std::size_t>(nonempty)];
        if (pp.problem.num_keys() >= 2) (nonempty >= 2 ? split : trivial) += 1;
      },
      200, 4242, false);
  ASSERT_TRUE(result.passed) << result.message;
  ASSERT_EQ(cases, 200);
  EXPECT_GT(split, 3 * trivial) << "cases with one non-empty part: " << trivial;
  for (int k = 2; k <= 5; ++k) EXPECT_GT(nonempty_hist[static_cast<std::size_t>(k)], 10) << k;
}

TEST(KitGenerators, DisjointPairsAreBothNonEmptyAtSmallSizes) {
  int both = 0;
  for (int size = 0; size < 50; ++size) {
    const auto pair = gen_disjoint_pair(20)(rc::Random(1000u + size), size).value();
    both += !pair.first.empty() && !pair.second.empty();
  }
  EXPECT_GT(both, 45);
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
  int large = 0, gqa = 0, offset = 0, over_64 = 0, over_256 = 0, under_16 = 0;
  double max_score_large = 0, max_score_plain = 0;
  for (const AttentionProblem& p : sample(gen_attention_problem(), 300)) {
    ASSERT_EQ(p.heads_q() % p.heads_kv(), 0);
    ASSERT_EQ(p.k.shape(), p.v.shape());
    ASSERT_EQ(p.q.dim(2), p.k.dim(2));
    ASSERT_LE(p.num_keys(), 300);
    // Key counts are uniform over [0, 300] at every size: they cross 64- and 256-key tiles.
    over_64 += p.num_keys() > 64;
    over_256 += p.num_keys() > 256;
    under_16 += p.num_keys() < 16;
    for (float x : p.v.to_floats()) ASSERT_LE(std::fabs(x), 1.f);
    offset += p.offset_values;
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
  EXPECT_GT(over_64, 150);
  EXPECT_GT(over_256, 20);
  EXPECT_GT(under_16, 5);
  EXPECT_GT(offset, 100);
  EXPECT_LT(offset, 200);
  EXPECT_GT(max_score_large, 100.0);  // scores in the hundreds
  EXPECT_LT(max_score_plain, 40.0);
}

TEST(KitGenerators, OffsetValuesHaveNonZeroChannelMeans) {
  ProblemGenOptions o;
  o.min_keys = 200;
  double plain = 0, offset = 0;
  int n_plain = 0, n_offset = 0;
  for (const AttentionProblem& p : sample(gen_attention_problem(o), 60)) {
    // Mean over channels of |mean over keys|: about 0.45 with offsets, about 0.03 without.
    const std::vector<float> v = p.v.to_floats();
    const std::int64_t channels = p.heads_kv() * p.head_dim();
    double sum_abs_mean = 0;
    for (std::int64_t c = 0; c < channels; ++c) {
      double mean = 0;
      for (std::int64_t i = 0; i < p.num_keys(); ++i) {
        mean += v[static_cast<std::size_t>(i * channels + c)];
      }
      sum_abs_mean += std::fabs(mean / static_cast<double>(p.num_keys()));
    }
    (p.offset_values ? offset : plain) += sum_abs_mean / static_cast<double>(channels);
    (p.offset_values ? n_offset : n_plain) += 1;
  }
  ASSERT_GT(n_plain, 5);
  ASSERT_GT(n_offset, 5);
  EXPECT_LT(plain / n_plain, 0.1);
  EXPECT_GT(offset / n_offset, 0.25);
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
