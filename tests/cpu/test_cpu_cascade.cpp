/// @file test_cpu_cascade.cpp
/// @brief CPU cascade attention against plain attention over each request's concatenated KV
///        (double reference), and its argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"
#include "cascade_case.hpp"

namespace {

using attnstate::DType;
using attnstate::LseBase;
using attnstate::MemorySpace;
using attnstate_test::CascadeCase;
using attnstate_test::CaseSpec;
using attnstate_test::SegmentSpec;

/// Runs the CPU cascade on `c` into a NaN-poisoned output of dtype `out_dt` and base `base`,
/// and compares with the reference.
::testing::AssertionResult run_and_check(const CascadeCase& c, DType out_dt = DType::kF32,
                                         LseBase base = LseBase::kNatural) {
  std::vector<std::uint8_t> o_raw(c.out_elems() * attnstate::size_of(out_dt), 0xFF);
  std::vector<float> lse(c.lse_elems(), std::numeric_limits<float>::quiet_NaN());
  auto out = attnstate::make_state_view(o_raw.data(), out_dt, lse.data(), c.tokens(),
                                        c.spec.heads_q, c.spec.head_dim, base);
  const auto levels = c.host_levels();
  attnstate::cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                                    c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost),
                                    levels.data(), static_cast<int>(levels.size()), c.options(),
                                    out);
  const auto o = attnstate_test::decode(o_raw.data(), out_dt, c.out_elems());
  // The CPU path keeps probabilities in fp32: only the output rounding matters.
  double tol = 3e-5;
  if (out_dt == DType::kBF16) tol += 4e-3;
  if (out_dt == DType::kF16) tol += 5e-4;
  return attnstate_test::matches_reference(c, o, lse, base, tol, 2e-4);
}

TEST(CpuCascade, TwoLevelsSharedPrefixMatchesConcatenation) {
  EXPECT_TRUE(run_and_check(CascadeCase(attnstate_test::two_level_spec(6, 100, 37, 11))));
}

TEST(CpuCascade, NanQueryRowGivesANanRowOnly) {
  // NaN in one query row: that row's state is NaN at every level it has keys in (its scores
  // are), so the output row is NaN; every other row matches.
  CaseSpec s = attnstate_test::two_level_spec(6, 100, 37, 12);
  s.nan_query_row = 2 * s.heads_q + 5;
  for (int levels : {2, 1}) {  // 1: only the shared level
    s.levels.resize(static_cast<std::size_t>(levels));
    const CascadeCase c(s);
    ASSERT_TRUE(std::isnan(c.reference.lse[s.nan_query_row]));
    EXPECT_TRUE(run_and_check(c)) << levels << " levels";
  }
}

TEST(CpuCascade, NanKeyGivesNanRowsOnly) {
  // NaN in one shared key of KV head 0: the rows of that head's group NaN in every request that
  // shares it, every other row matches.
  CaseSpec s = attnstate_test::two_level_spec(6, 100, 37, 13);
  s.nan_key = 57;
  const CascadeCase c(s);
  ASSERT_TRUE(std::isnan(c.reference.lse[0]));
  ASSERT_FALSE(std::isnan(c.reference.lse[s.heads_q / s.heads_kv]));
  EXPECT_TRUE(run_and_check(c));
}

TEST(CpuCascade, OneLevelOfUniqueSegmentsMatchesAttention) {
  CaseSpec s;
  s.seed = 2;
  s.levels = {{{1, 40}, {1, 0}, {1, 77}, {1, 16}}};
  EXPECT_TRUE(run_and_check(CascadeCase(s)));
}

TEST(CpuCascade, ThreeLevelsOfNestedSharingMatchConcatenation) {
  CaseSpec s;
  s.seed = 3;
  s.levels = {
      {{7, 64}}, {{3, 33}, {4, 20}}, {{1, 5}, {1, 9}, {1, 1}, {1, 17}, {1, 30}, {1, 2}, {1, 8}}};
  EXPECT_TRUE(run_and_check(CascadeCase(s)));
}

TEST(CpuCascade, SegmentsSharedByOneToManyRequests) {
  CaseSpec s;
  s.seed = 4;
  s.levels = {{{1, 50}, {2, 31}, {5, 90}},
              {{1, 3}, {1, 4}, {1, 5}, {1, 6}, {1, 7}, {1, 8}, {1, 9}, {1, 10}}};
  EXPECT_TRUE(run_and_check(CascadeCase(s)));
}

TEST(CpuCascade, EmptySuffixesPassThePrefixState) {
  CaseSpec s;
  s.seed = 5;
  s.levels = {{{4, 48}}, {{1, 0}, {1, 12}, {1, 0}, {1, 0}}};
  EXPECT_TRUE(run_and_check(CascadeCase(s)));
}

TEST(CpuCascade, EmptyPrefixGivesSuffixAttention) {
  CaseSpec s;
  s.seed = 6;
  s.levels = {{{3, 0}}, {{1, 20}, {1, 1}, {1, 45}}};
  EXPECT_TRUE(run_and_check(CascadeCase(s)));
}

TEST(CpuCascade, AllLevelsEmptyGiveTheEmptyState) {
  CaseSpec s;
  s.seed = 7;
  s.causal = false;
  s.levels = {{{2, 0}}, {{1, 0}, {1, 0}}};
  CascadeCase c(s);
  ASSERT_TRUE(run_and_check(c));
  EXPECT_TRUE(std::isinf(c.reference.lse[0]));  // the reference agrees: nothing to attend to
}

TEST(CpuCascade, LengthsAtPageEdges) {
  for (int len : {1, 15, 16, 17, 31, 32, 33, 48}) {
    CaseSpec s;
    s.seed = 100 + len;
    s.levels = {{{3, len}}, {{1, len}, {1, 16 - len % 16}, {1, 16}}};
    EXPECT_TRUE(run_and_check(CascadeCase(s))) << "len " << len;
  }
}

TEST(CpuCascade, StorageDtypesAndOutputDtypes) {
  for (DType kv : {DType::kF32, DType::kF16, DType::kBF16})
    for (DType out : {DType::kF32, DType::kF16, DType::kBF16}) {
      CaseSpec s = attnstate_test::two_level_spec(3, 40, 9, 21);
      s.dtype = kv;
      EXPECT_TRUE(run_and_check(CascadeCase(s), out))
          << attnstate::to_string(kv) << " -> " << attnstate::to_string(out);
    }
}

TEST(CpuCascade, GqaGroupsOneFourEight) {
  for (int group : {1, 4, 8}) {
    CaseSpec s = attnstate_test::two_level_spec(3, 35, 10, 30 + group);
    s.heads_kv = 2;
    s.heads_q = 2 * group;
    EXPECT_TRUE(run_and_check(CascadeCase(s))) << "group " << group;
  }
}

TEST(CpuCascade, CausalMultiTokenQueriesMaskOnlyTheLastLevel) {
  for (int q_len : {2, 5, 8}) {
    CaseSpec s = attnstate_test::two_level_spec(3, 30, 12, 40 + q_len);
    s.q_len = q_len;
    EXPECT_TRUE(run_and_check(CascadeCase(s))) << "q_len " << q_len;
    s.causal = false;
    EXPECT_TRUE(run_and_check(CascadeCase(s))) << "q_len " << q_len << " non-causal";
  }
}

TEST(CpuCascade, HndLayoutPaddedPagesAndOtherPageSizes) {
  for (int ps : {1, 7, 16, 32}) {
    CaseSpec s = attnstate_test::two_level_spec(3, 50, 13, 50 + ps);
    s.layout = attnstate::KvLayout::kHND;
    s.page_size = ps;
    s.page_pad = 8;
    s.head_dim = 64;
    EXPECT_TRUE(run_and_check(CascadeCase(s))) << "page_size " << ps;
  }
}

TEST(CpuCascade, OutputWrittenInBase2) {
  CaseSpec s = attnstate_test::two_level_spec(4, 40, 8, 60);
  s.q_amp = 6.f;  // peaked softmax
  EXPECT_TRUE(run_and_check(CascadeCase(s), DType::kF32, LseBase::kBase2));
}

/// Calls the CPU cascade with one field broken and expects kInvalidArgument naming `arg`.
class CpuCascadeArgs : public ::testing::Test {
 protected:
  CpuCascadeArgs() : c_(attnstate_test::two_level_spec(3, 20, 5, 70)) {
    o_.assign(c_.out_elems(), 0.f);
    lse_.assign(c_.lse_elems(), 0.f);
    levels_ = c_.host_levels();
  }
  attnstate::StateView out() {
    return attnstate::make_state_view(o_.data(), DType::kF32, lse_.data(), c_.tokens(),
                                      c_.spec.heads_q, c_.spec.head_dim, LseBase::kNatural);
  }
  attnstate::PagedKvCache kv() const {
    return c_.pool(c_.k_raw.data(), c_.v_raw.data(), MemorySpace::kHost);
  }
  attnstate::ConstTensorView q() const { return c_.query(c_.q_raw.data(), MemorySpace::kHost); }
  template <class F>
  void expect_error(const char* arg, F&& call) {
    try {
      call();
      ADD_FAILURE() << "no error for " << arg;
    } catch (const attnstate::Error& e) {
      EXPECT_EQ(e.status(), attnstate::Status::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
    }
  }
  void call(const attnstate::ConstTensorView& q, const attnstate::PagedKvCache& kv,
            const attnstate::CascadeLevel* lv, int n, attnstate::StateView out,
            attnstate::CascadeOptions opt = {}) {
    attnstate::cpu::cascade_attention(q, kv, lv, n, opt, out);
  }
  CascadeCase c_;
  std::vector<float> o_, lse_;
  std::vector<attnstate::CascadeLevel> levels_;
};

TEST_F(CpuCascadeArgs, RejectsNullPointers) {
  auto bad_kv = kv();
  bad_kv.k = nullptr;
  expect_error("kv.k", [&] { call(q(), bad_kv, levels_.data(), 2, out()); });
  auto bad_q = q();
  bad_q.data = nullptr;
  expect_error("q.data", [&] { call(bad_q, kv(), levels_.data(), 2, out()); });
  auto bad_out = out();
  bad_out.lse = nullptr;
  expect_error("out.lse", [&] { call(q(), kv(), levels_.data(), 2, bad_out); });
  expect_error("levels", [&] { call(q(), kv(), nullptr, 2, out()); });
  auto lv = levels_;
  lv[1].seg_lens = nullptr;
  expect_error("levels[1].seg_lens", [&] { call(q(), kv(), lv.data(), 2, out()); });
}

TEST_F(CpuCascadeArgs, RejectsBadShapes) {
  expect_error("num_levels", [&] { call(q(), kv(), levels_.data(), 0, out()); });
  expect_error("num_levels", [&] { call(q(), kv(), levels_.data(), 9, out()); });
  auto bad_q = q();
  bad_q.shape[1] = 9;
  expect_error("q.shape[1]", [&] { call(bad_q, kv(), levels_.data(), 2, out()); });
  bad_q = q();
  bad_q.shape[2] = 7;
  expect_error("q.shape[2]", [&] { call(bad_q, kv(), levels_.data(), 2, out()); });
  auto bad_out = out();
  bad_out.tokens -= 1;
  expect_error("out.tokens", [&] { call(q(), kv(), levels_.data(), 2, bad_out); });
  auto bad_kv = kv();
  bad_kv.page_size = 0;
  expect_error("kv.page_size", [&] { call(q(), bad_kv, levels_.data(), 2, out()); });
  bad_kv = kv();
  bad_kv.space = MemorySpace::kDevice;
  expect_error("kv.space", [&] { call(q(), bad_kv, levels_.data(), 2, out()); });
  attnstate::CascadeOptions opt;
  opt.scale = std::numeric_limits<float>::infinity();
  expect_error("options.scale", [&] { call(q(), kv(), levels_.data(), 2, out(), opt); });
}

TEST_F(CpuCascadeArgs, RejectsBadIndptrsLengthsAndPages) {
  auto lvl = c_.levels;  // mutable copies of the host arrays
  auto views = [&] {
    std::vector<attnstate::CascadeLevel> v;
    for (auto& h : lvl) v.push_back(h.view());
    return v;
  };
  lvl[0].request_indptr.back() = 2;  // does not cover the batch
  expect_error("levels[0].request_indptr", [&] { call(q(), kv(), views().data(), 2, out()); });
  lvl = c_.levels;
  std::swap(lvl[1].request_indptr[1], lvl[1].request_indptr[2]);
  expect_error("levels[1].request_indptr", [&] { call(q(), kv(), views().data(), 2, out()); });
  lvl = c_.levels;
  lvl[1].seg_lens[0] = 1000;  // longer than its pages
  expect_error("levels[1].seg_lens", [&] { call(q(), kv(), views().data(), 2, out()); });
  lvl = c_.levels;
  lvl[0].page_indices[0] = static_cast<std::int32_t>(c_.num_pages);
  expect_error("levels[0].page_indices", [&] { call(q(), kv(), views().data(), 2, out()); });
  lvl = c_.levels;
  lvl[0].page_indptr[1] = -1;
  expect_error("levels[0].page_indptr", [&] { call(q(), kv(), views().data(), 2, out()); });
}

TEST_F(CpuCascadeArgs, RejectsOutputRowsThatOverlap) {
  // Two tokens written to the same row: rows of the output must be pairwise disjoint.
  auto bad_out = out();
  bad_out.o_stride_token = 0;
  expect_error("'out.o_stride_token'", [&] { call(q(), kv(), levels_.data(), 2, bad_out); });
  bad_out = out();
  bad_out.o_stride_head = c_.spec.head_dim - 1;
  expect_error("'out.o_stride_head'", [&] { call(q(), kv(), levels_.data(), 2, bad_out); });
  bad_out = out();
  bad_out.lse_stride_head = 0;
  expect_error("'out.lse_stride_head'", [&] { call(q(), kv(), levels_.data(), 2, bad_out); });
  // A stride whose span overflows is named, not multiplied out.
  bad_out = out();
  bad_out.lse_stride_token = std::int64_t{1} << 62;
  expect_error("'out.lse_stride_token'", [&] { call(q(), kv(), levels_.data(), 2, bad_out); });
}

TEST_F(CpuCascadeArgs, NamesTheExactOutputAndQueryStride) {
  auto bad_out = out();
  bad_out.o_stride_head = -1;
  expect_error("'out.o_stride_head'", [&] { call(q(), kv(), levels_.data(), 2, bad_out); });
  bad_out = out();
  bad_out.lse_stride_head = -1;
  expect_error("'out.lse_stride_head'", [&] { call(q(), kv(), levels_.data(), 2, bad_out); });
  bad_out = out();
  bad_out.base = static_cast<LseBase>(7);
  expect_error("'out.base'", [&] { call(q(), kv(), levels_.data(), 2, bad_out); });
  auto bad_q = q();
  bad_q.stride[1] = -8;
  expect_error("'q.stride[1]'", [&] { call(bad_q, kv(), levels_.data(), 2, out()); });
}

TEST_F(CpuCascadeArgs, NumSegmentsAboveTheLimitStatesTheLimit) {
  auto lv = levels_;
  lv[0].num_segments = (std::int64_t{1} << 30) + 1;
  expect_error("'levels[0].num_segments': expected 1..2^30",
               [&] { call(q(), kv(), lv.data(), 2, out()); });
}

TEST_F(CpuCascadeArgs, AcceptsAStridedOutputInsideALargerBuffer) {
  // Padded rows (a sub-view of a larger buffer) are a valid output; the result equals the
  // contiguous one and the padding is left alone.
  const std::int64_t T = c_.tokens(), H = c_.spec.heads_q, D = c_.spec.head_dim;
  std::vector<float> big_o(static_cast<std::size_t>(T * (H * (D + 3) + 5)), -7.f);
  std::vector<float> big_lse(static_cast<std::size_t>(T * 2 * H), -7.f);
  attnstate::StateView sub = out();
  sub.o = big_o.data();
  sub.lse = big_lse.data();
  sub.o_stride_head = D + 3;
  sub.o_stride_token = H * (D + 3) + 5;
  sub.lse_stride_head = 2;
  sub.lse_stride_token = 2 * H;
  ASSERT_NO_THROW(call(q(), kv(), levels_.data(), 2, out()));
  ASSERT_NO_THROW(call(q(), kv(), levels_.data(), 2, sub));
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t h = 0; h < H; ++h) {
      EXPECT_EQ(big_lse[sub.lse_offset(t, h)], lse_[t * H + h]);
      EXPECT_EQ(big_lse[sub.lse_offset(t, h) + 1], -7.f);
      for (std::int64_t d = 0; d < D; ++d)
        EXPECT_EQ(big_o[sub.o_offset(t, h) + d], o_[(t * H + h) * D + d]);
      EXPECT_EQ(big_o[sub.o_offset(t, h) + D], -7.f);
    }
}

/// A small valid problem for `cpu::decode` (its argument checks are shared with
/// `cuda::run_decode`): 2 requests of one new token over one page each, 2 query heads on one KV
/// head, head_dim 8, f32.
class CpuDecodeArgs : public ::testing::Test {
 protected:
  static constexpr std::int64_t kBatch = 2, kHeads = 2, kDim = 8, kPage = 16;
  CpuDecodeArgs() {
    for (std::size_t i = 0; i < k_.size(); ++i) {
      k_[i] = static_cast<float>((i * 7) % 11) / 11.f - 0.5f;
      v_[i] = static_cast<float>((i * 5) % 13) / 13.f - 0.5f;
    }
    for (std::size_t i = 0; i < q_.size(); ++i) q_[i] = static_cast<float>(i % 5) / 5.f - 0.4f;
  }
  attnstate::PagedKvCache kv() const {
    attnstate::PagedKvCache kv;
    kv.k = k_.data();
    kv.v = v_.data();
    kv.dtype = DType::kF32;
    kv.num_pages = kBatch;
    kv.page_size = kPage;
    kv.heads_kv = 1;
    kv.head_dim = kDim;
    kv.page_indptr = indptr_.data();
    kv.page_indices = indices_.data();
    kv.seq_lens = lens_.data();
    kv.batch = kBatch;
    return kv;
  }
  attnstate::ConstTensorView q() const {
    return attnstate::make_tensor_view(q_.data(), DType::kF32, {kBatch, 1, kHeads, kDim});
  }
  attnstate::StateView out() {
    return attnstate::make_state_view(o_.data(), DType::kF32, lse_.data(), kBatch, kHeads, kDim,
                                      LseBase::kNatural);
  }
  static attnstate::SplitLayout two_splits() {
    attnstate::SplitLayout l;
    l.policy = attnstate::SplitPolicy::kFixedCount;
    l.num_splits = 2;
    l.max_splits = 2;
    return l;
  }
  /// Expects kInvalidArgument whose message contains `text`, and `o_`, `lse_` untouched.
  template <class F>
  void expect_error(const std::string& text, F&& call) {
    const std::vector<float> o0 = o_, lse0 = lse_;
    try {
      call();
      ADD_FAILURE() << "no error for " << text;
    } catch (const attnstate::Error& e) {
      EXPECT_EQ(e.status(), attnstate::Status::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
    EXPECT_EQ(0, std::memcmp(o0.data(), o_.data(), o_.size() * 4)) << text;
    EXPECT_EQ(0, std::memcmp(lse0.data(), lse_.data(), lse_.size() * 4)) << text;
  }
  std::vector<float> k_ = std::vector<float>(kBatch * kPage * kDim);
  std::vector<float> v_ = std::vector<float>(kBatch * kPage * kDim);
  std::vector<float> q_ = std::vector<float>(kBatch * kHeads * kDim);
  std::vector<float> o_ = std::vector<float>(kBatch * kHeads * kDim, 3.f);
  std::vector<float> lse_ = std::vector<float>(kBatch * kHeads, 3.f);
  std::vector<std::int32_t> indptr_ = {0, 1, 2}, indices_ = {1, 0}, lens_ = {13, 16};
};

TEST_F(CpuDecodeArgs, RejectsOutputRowsThatOverlap) {
  // Both tokens would write the same row (a data race between the tasks of the two requests).
  auto bad = out();
  bad.o_stride_token = 0;
  expect_error("'out.o_stride_token'",
               [&] { attnstate::cpu::decode(q(), kv(), two_splits(), 0.3f, bad); });
  bad = out();
  bad.o_stride_head = kDim / 2;
  expect_error("'out.o_stride_head'",
               [&] { attnstate::cpu::decode(q(), kv(), two_splits(), 0.3f, bad); });
  bad = out();
  bad.lse_stride_token = 0;
  expect_error("'out.lse_stride_token'",
               [&] { attnstate::cpu::decode(q(), kv(), attnstate::DecodeOptions{}, bad); });
}

TEST_F(CpuDecodeArgs, RejectsOutputOverlappingTheQueries) {
  std::vector<float> shared(q_.size() + 4, 0.f);
  std::copy(q_.begin(), q_.end(), shared.begin());
  const auto qs =
      attnstate::make_tensor_view(shared.data(), DType::kF32, {kBatch, 1, kHeads, kDim});
  auto bad = out();
  bad.o = shared.data() + 1;  // o over q
  expect_error("'out.o'", [&] { attnstate::cpu::decode(qs, kv(), two_splits(), 0.3f, bad); });
  bad = out();
  bad.lse = shared.data() + q_.size() - 1;  // lse over the last element of q
  expect_error("'out.lse'", [&] { attnstate::cpu::decode(qs, kv(), two_splits(), 0.3f, bad); });
}

TEST_F(CpuDecodeArgs, NamesTheExactStride) {
  auto bad = out();
  bad.o_stride_head = -1;
  expect_error("'out.o_stride_head'",
               [&] { attnstate::cpu::decode(q(), kv(), two_splits(), 0.3f, bad); });
  bad = out();
  bad.lse_stride_head = -1;
  expect_error("'out.lse_stride_head'",
               [&] { attnstate::cpu::decode(q(), kv(), two_splits(), 0.3f, bad); });
  auto bad_q = q();
  bad_q.stride[2] = -8;
  expect_error("'q.stride[2]'",
               [&] { attnstate::cpu::decode(bad_q, kv(), two_splits(), 0.3f, out()); });
  bad_q = q();
  bad_q.stride[0] = std::int64_t{1} << 62;  // the span of q does not fit
  expect_error("'q.stride[0]'",
               [&] { attnstate::cpu::decode(bad_q, kv(), two_splits(), 0.3f, out()); });
}

TEST_F(CpuDecodeArgs, PolicyErrorsNameTheDecodeAndItsOptions) {
  attnstate::DecodeOptions opt;
  opt.policy = attnstate::SplitPolicy::kFixedSize;
  opt.split_size = 24;
  expect_error("attnstate::cpu::decode: argument 'options.split_size'",
               [&] { attnstate::cpu::decode(q(), kv(), opt, out()); });
  opt.policy = attnstate::SplitPolicy::kFixedCount;
  opt.num_splits = attnstate::kMaxSplits + 1;
  expect_error("attnstate::cpu::decode: argument 'options.num_splits'",
               [&] { attnstate::cpu::decode(q(), kv(), opt, out()); });
}

TEST_F(CpuDecodeArgs, AcceptsAStridedOutputInsideALargerBuffer) {
  // Like a cascade level's partial states: the decode writes a strided view of a larger buffer
  // (every other head slot, padded tokens); the rows it writes equal the contiguous result and
  // nothing else is touched.
  std::vector<float> big_o(static_cast<std::size_t>(kBatch * (2 * kHeads * kDim + 3)), -7.f);
  std::vector<float> big_lse(static_cast<std::size_t>(kBatch * 2 * kHeads + 1), -7.f);
  attnstate::StateView sub = out();
  sub.o = big_o.data() + 1;
  sub.lse = big_lse.data() + 1;
  sub.o_stride_head = 2 * kDim;
  sub.o_stride_token = 2 * kHeads * kDim + 3;
  sub.lse_stride_head = 2;
  sub.lse_stride_token = 2 * kHeads;
  ASSERT_NO_THROW(attnstate::cpu::decode(q(), kv(), two_splits(), 0.3f, out()));
  ASSERT_NO_THROW(attnstate::cpu::decode(q(), kv(), two_splits(), 0.3f, sub));
  std::int64_t written = 0;
  for (std::int64_t t = 0; t < kBatch; ++t)
    for (std::int64_t h = 0; h < kHeads; ++h) {
      EXPECT_EQ(big_lse[1 + sub.lse_offset(t, h)], lse_[t * kHeads + h]);
      for (std::int64_t d = 0; d < kDim; ++d)
        EXPECT_EQ(big_o[1 + sub.o_offset(t, h) + d], o_[(t * kHeads + h) * kDim + d]);
      written += kDim;
    }
  std::int64_t untouched = 0;
  for (float x : big_o) untouched += x == -7.f;
  EXPECT_EQ(untouched, static_cast<std::int64_t>(big_o.size()) - written);
}

TEST(CpuCascadeCausal, RejectsALastLevelShorterThanTheNewTokens) {
  CaseSpec s;
  s.q_len = 4;
  s.causal = false;
  s.levels = {{{2, 20}}, {{1, 2}, {1, 9}}};
  CascadeCase c(s);
  std::vector<float> o(c.out_elems()), lse(c.lse_elems());
  auto out = attnstate::make_state_view(o.data(), DType::kF32, lse.data(), c.tokens(),
                                        c.spec.heads_q, c.spec.head_dim, LseBase::kNatural);
  const auto levels = c.host_levels();
  attnstate::CascadeOptions opt;
  opt.causal = true;
  EXPECT_THROW(
      attnstate::cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                                        c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost),
                                        levels.data(), 2, opt, out),
      attnstate::Error);
  opt.causal = false;  // the same problem is valid without the mask
  EXPECT_NO_THROW(attnstate::cpu::cascade_attention(
      c.query(c.q_raw.data(), MemorySpace::kHost),
      c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost), levels.data(), 2, opt, out));
}

}  // namespace
