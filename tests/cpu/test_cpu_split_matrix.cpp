/// @file test_cpu_split_matrix.cpp
/// @brief The split-KV verification matrix on the CPU: KV split into S parts, each part's state
///        from attention_state, merged with merge_states / merge_states_ragged / merge_state,
///        compared with the one-pass state and a double reference. Splits {1, 2, 3, many},
///        lengths {0, 1, block-1, block, block+1, split edge +-1}, ragged batches with empty
///        splits, large logits (q x 40), and base 2 vs natural log.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/merge.hpp"
#include "cpu_test_utils.hpp"

namespace attnstate {
namespace {

using test::OwnedState;
using test::OwnedTensor;
using test::RefState;

constexpr std::int64_t kBlock = 16;
constexpr std::int64_t kTokens = 2, kHq = 8, kHkv = 2, kDim = 32;

/// Split boundaries as a split-KV decoder picks them: chunks of ceil(T/S) rounded up to the
/// block; trailing splits past T are empty.
std::vector<std::int64_t> split_bounds(std::int64_t keys, std::int64_t splits) {
  const std::int64_t per = (keys + splits - 1) / splits;
  const std::int64_t chunk = std::max<std::int64_t>(kBlock, (per + kBlock - 1) / kBlock * kBlock);
  std::vector<std::int64_t> b;
  for (std::int64_t s = 0; s <= splits; ++s) b.push_back(std::min(keys, s * chunk));
  return b;
}

/// A dense tokens-major stack of the states of the splits, in `base`.
struct SplitStates {
  std::vector<float> o, lse;
  ConstStateStackView view;
};

SplitStates split_states(const OwnedTensor& q, const OwnedTensor& k, const OwnedTensor& v,
                         float scale, const std::vector<std::int64_t>& bounds, LseBase base,
                         const std::vector<LseBase>* per_split_base = nullptr) {
  const std::int64_t splits = static_cast<std::int64_t>(bounds.size()) - 1;
  SplitStates st;
  st.o.assign(kTokens * splits * kHq * kDim, NAN);
  st.lse.assign(kTokens * splits * kHq, NAN);
  for (std::int64_t s = 0; s < splits; ++s) {
    StateView sv;
    sv.tokens = kTokens;
    sv.heads = kHq;
    sv.head_dim = kDim;
    sv.o_stride_head = kDim;
    sv.o_stride_token = splits * kHq * kDim;
    sv.lse_stride_head = 1;
    sv.lse_stride_token = splits * kHq;
    sv.o = st.o.data() + s * kHq * kDim;
    sv.lse = st.lse.data() + s * kHq;
    sv.base = per_split_base ? (*per_split_base)[s] : base;
    cpu::attention_state(q.view, test::slice_rows(k.view, bounds[s], bounds[s + 1]),
                         test::slice_rows(v.view, bounds[s], bounds[s + 1]), scale, sv);
  }
  st.view = make_state_stack(st.o.data(), DType::kF32, st.lse.data(), StackOrder::kTokensMajor,
                             kTokens, splits, kHq, kDim, base);
  return st;
}

struct Problem {
  OwnedTensor q, k, v;
  float scale;
};

Problem make_problem(std::int64_t keys, std::mt19937& rng, float q_mult = 1.f) {
  Problem p{test::make_tensor(kTokens, kHq, kDim, DType::kF32, rng, q_mult),
            test::make_tensor(keys, kHkv, kDim, DType::kBF16, rng),
            test::make_tensor(keys, kHkv, kDim, DType::kBF16, rng),
            1.f / std::sqrt(static_cast<float>(kDim))};
  return p;
}

void check_splits(std::int64_t keys, std::int64_t splits, std::mt19937& rng, float q_mult = 1.f,
                  double tol = 2e-5) {
  const std::string what = "T=" + std::to_string(keys) + " S=" + std::to_string(splits);
  Problem p = make_problem(keys, rng, q_mult);
  const std::vector<std::int64_t> bounds = split_bounds(keys, splits);
  ASSERT_EQ(bounds.back(), keys) << what;
  SplitStates st = split_states(p.q, p.k, p.v, p.scale, bounds, LseBase::kNatural);
  OwnedState merged = test::make_state(kTokens, kHq, kDim, DType::kF32, LseBase::kNatural);
  cpu::merge_states(st.view, merged.view());
  RefState ref = test::ref_attention(p.q, p.k, p.v, p.scale);
  test::expect_matches(merged, ref, tol, what + " vs double reference");
  OwnedState one = test::make_state(kTokens, kHq, kDim, DType::kF32, LseBase::kNatural);
  cpu::attention_state(p.q.view, p.k.view, p.v.view, p.scale, one.view());
  RefState one_ref = test::widened(one);
  if (keys == 0) one_ref = test::ref_attention(p.q, p.k, p.v, p.scale);
  test::expect_matches(merged, one_ref, tol, what + " vs one pass");
}

const std::int64_t kSplits[] = {1, 2, 3, 16};

TEST(SplitMatrix, LengthsAroundBlockAndSplitEdges) {
  std::mt19937 rng(301);
  for (std::int64_t splits : kSplits) {
    std::vector<std::int64_t> lengths = {0, 1, kBlock - 1, kBlock, kBlock + 1};
    // Split edges +-1: T at a multiple of the chunk a split count gives.
    for (std::int64_t edge : {2 * kBlock * splits, 3 * kBlock * splits})
      for (std::int64_t dt : {-1, 0, 1}) lengths.push_back(edge + dt);
    for (std::int64_t keys : lengths) check_splits(keys, splits, rng);
  }
}

TEST(SplitMatrix, ManySplitsOfOneKeyEach) {
  std::mt19937 rng(302);
  // 40 splits over 40 keys, each a separate one-key state (not block aligned).
  Problem p = make_problem(40, rng);
  std::vector<std::int64_t> bounds(41);
  std::iota(bounds.begin(), bounds.end(), 0);
  SplitStates st = split_states(p.q, p.k, p.v, p.scale, bounds, LseBase::kNatural);
  OwnedState merged = test::make_state(kTokens, kHq, kDim, DType::kBF16, LseBase::kBase2);
  cpu::merge_states(st.view, merged.view());
  RefState ref = test::ref_attention(p.q, p.k, p.v, p.scale);
  test::expect_matches(merged, ref, test::o_tolerance(DType::kBF16), "40 one-key splits");
}

TEST(SplitMatrix, LargeLogitsQTimes40) {
  std::mt19937 rng(303);
  for (std::int64_t splits : kSplits) check_splits(257, splits, rng, 40.f, 1e-4);
}

TEST(SplitMatrix, RaggedBatchWithEmptySplits) {
  std::mt19937 rng(304);
  // Requests of different lengths (one empty); each split into chunks of 2 blocks, with one
  // extra empty split appended per request, all rows stacked and merged by indptr.
  const std::vector<std::int64_t> lengths = {0, 1, 31, 32, 33, 100};
  const std::int64_t chunk = 2 * kBlock;
  std::vector<Problem> problems;
  std::vector<std::int32_t> indptr = {0};
  std::vector<std::vector<std::int64_t>> all_bounds;
  for (std::int64_t len : lengths) {
    problems.push_back(make_problem(len, rng));
    std::vector<std::int64_t> b = {0};
    while (b.back() < len) b.push_back(std::min(len, b.back() + chunk));
    b.push_back(len);  // an empty split
    all_bounds.push_back(b);
  }
  // Rows: (request r, token t) -> segment; row = one split's state of one query token.
  const std::int64_t segments = static_cast<std::int64_t>(lengths.size()) * kTokens;
  std::int64_t total = 0;
  for (std::size_t r = 0; r < lengths.size(); ++r) total += kTokens * (all_bounds[r].size() - 1);
  OwnedState rows = test::make_state(total, kHq, kDim, DType::kF32, LseBase::kBase2);
  std::int64_t row = 0;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    const Problem& p = problems[r];
    const auto& b = all_bounds[r];
    const std::int64_t splits = static_cast<std::int64_t>(b.size()) - 1;
    for (std::int64_t t = 0; t < kTokens; ++t) {
      ConstTensorView q1 = test::slice_rows(p.q.view, t, t + 1);
      for (std::int64_t s = 0; s < splits; ++s) {
        StateView sv = rows.view();
        sv.tokens = 1;
        sv.o = static_cast<float*>(sv.o) + row * sv.o_stride_token;
        sv.lse = sv.lse + row * sv.lse_stride_token;
        cpu::attention_state(q1, test::slice_rows(p.k.view, b[s], b[s + 1]),
                             test::slice_rows(p.v.view, b[s], b[s + 1]), p.scale, sv);
        ++row;
      }
      indptr.push_back(static_cast<std::int32_t>(row));
    }
  }
  ASSERT_EQ(row, total);
  OwnedState out = test::make_state(segments, kHq, kDim, DType::kF32, LseBase::kNatural);
  cpu::merge_states_ragged(rows.cview(), indptr.data(), out.view());
  RefState ref = test::make_ref(segments, kHq, kDim);
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    const RefState one =
        test::ref_attention(problems[r].q, problems[r].k, problems[r].v, problems[r].scale);
    const std::int64_t rt = static_cast<std::int64_t>(r) * kTokens;
    for (std::int64_t t = 0; t < kTokens; ++t)
      for (std::int64_t h = 0; h < kHq; ++h) {
        test::ref_lse(ref, rt + t, h) = one.lse_at(t, h);
        for (std::int64_t d = 0; d < kDim; ++d) test::ref_o(ref, rt + t, h, d) = one.o_at(t, h, d);
      }
  }
  test::expect_matches(out, ref, 2e-5, "ragged batch");
}

TEST(SplitMatrix, Base2MergeThenRebaseEqualsNaturalMerge) {
  std::mt19937 rng(305);
  for (std::int64_t splits : kSplits) {
    Problem p = make_problem(150, rng);
    const auto bounds = split_bounds(150, splits);
    SplitStates st2 = split_states(p.q, p.k, p.v, p.scale, bounds, LseBase::kBase2);
    OwnedState merged2 = test::make_state(kTokens, kHq, kDim, DType::kF32, LseBase::kBase2);
    cpu::merge_states(st2.view, merged2.view());
    OwnedState rebased = test::make_state(kTokens, kHq, kDim, DType::kF32, LseBase::kNatural);
    cpu::rebase(merged2.cview(), rebased.view());
    SplitStates stn = split_states(p.q, p.k, p.v, p.scale, bounds, LseBase::kNatural);
    OwnedState merged_n = test::make_state(kTokens, kHq, kDim, DType::kF32, LseBase::kNatural);
    cpu::merge_states(stn.view, merged_n.view());
    const RefState as_ref = test::widened(merged_n);
    test::expect_matches(rebased, as_ref, 1e-5, "S=" + std::to_string(splits));
    // And both agree with the double reference.
    RefState ref = test::ref_attention(p.q, p.k, p.v, p.scale);
    test::expect_matches(rebased, ref, 2e-5, "S=" + std::to_string(splits) + " vs reference");
  }
}

TEST(SplitMatrix, MixedBaseSplitsMergeExactly) {
  std::mt19937 rng(306);
  Problem p = make_problem(200, rng);
  const auto bounds = split_bounds(200, 3);
  // Splits alternate natural and base 2; the pairwise merge reads each with its own base.
  const std::vector<LseBase> bases = {LseBase::kNatural, LseBase::kBase2, LseBase::kNatural};
  SplitStates st = split_states(p.q, p.k, p.v, p.scale, bounds, LseBase::kNatural, &bases);
  OwnedState acc = test::make_state(kTokens, kHq, kDim, DType::kF32, LseBase::kBase2);
  cpu::merge_states(
      make_state_stack(st.o.data(), DType::kF32, st.lse.data(), StackOrder::kTokensMajor, kTokens,
                       3, kHq, kDim, LseBase::kNatural),
      acc.view());  // the stack claims natural: split 1 is wrongly weighted...
  RefState ref = test::ref_attention(p.q, p.k, p.v, p.scale);
  // ...so build views with the true bases and merge pairwise instead.
  std::vector<ConstStateView> views;
  for (std::int64_t s = 0; s < 3; ++s) {
    ConstStateView v;
    v.tokens = kTokens;
    v.heads = kHq;
    v.head_dim = kDim;
    v.o_stride_head = kDim;
    v.o_stride_token = 3 * kHq * kDim;
    v.lse_stride_head = 1;
    v.lse_stride_token = 3 * kHq;
    v.o = st.o.data() + s * kHq * kDim;
    v.lse = st.lse.data() + s * kHq;
    v.base = bases[s];
    views.push_back(v);
  }
  OwnedState out = test::make_state(kTokens, kHq, kDim, DType::kF32, LseBase::kBase2);
  cpu::merge_state(views[2], views[0], out.view());
  cpu::merge_state_inplace(out.view(), views[1]);
  test::expect_matches(out, ref, 2e-5, "mixed bases");
  // The mislabelled stack must differ from the reference: base tags matter.
  double max_diff = 0;
  for (std::int64_t t = 0; t < kTokens; ++t)
    for (std::int64_t h = 0; h < kHq; ++h)
      max_diff = std::max(max_diff, std::fabs(acc.lse_nat(t, h) - ref.lse_at(t, h)));
  EXPECT_GT(max_diff, 1e-3);
}

TEST(SplitMatrix, RandomMergeOrdersAgree) {
  std::mt19937 rng(307);
  Problem p = make_problem(333, rng);
  const auto bounds = split_bounds(333, 8);
  SplitStates st = split_states(p.q, p.k, p.v, p.scale, bounds, LseBase::kNatural);
  RefState ref = test::ref_attention(p.q, p.k, p.v, p.scale);
  std::vector<int> order(8);
  std::iota(order.begin(), order.end(), 0);
  for (int trial = 0; trial < 20; ++trial) {
    std::shuffle(order.begin(), order.end(), rng);
    OwnedState acc = test::make_state(kTokens, kHq, kDim, DType::kF32, LseBase::kNatural);
    for (std::int64_t t = 0; t < kTokens; ++t)  // start from the empty state
      for (std::int64_t h = 0; h < kHq; ++h) acc.set_lse(t, h, -INFINITY);
    for (int s : order) {
      ConstStateView v;
      static_cast<StateLayout&>(v) = st.view;
      v.o = st.o.data() + s * kHq * kDim;
      v.lse = st.lse.data() + s * kHq;
      cpu::merge_state_inplace(acc.view(), v);
    }
    test::expect_matches(acc, ref, 2e-5, "order trial " + std::to_string(trial));
  }
}

}  // namespace
}  // namespace attnstate
