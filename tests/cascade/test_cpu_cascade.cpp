/// @file test_cpu_cascade.cpp
/// @brief CPU cascade attention against plain attention over each request's concatenated KV
///        (double reference), and its argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cpu/cascade.hpp"
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
    ASSERT_TRUE(std::isnan(c.ref_lse[s.nan_query_row]));
    EXPECT_TRUE(run_and_check(c)) << levels << " levels";
  }
}

TEST(CpuCascade, NanKeyGivesNanRowsOnly) {
  // NaN in one shared key of KV head 0: the rows of that head's group NaN in every request that
  // shares it, every other row matches.
  CaseSpec s = attnstate_test::two_level_spec(6, 100, 37, 13);
  s.nan_key = 57;
  const CascadeCase c(s);
  ASSERT_TRUE(std::isnan(c.ref_lse[0]));
  ASSERT_FALSE(std::isnan(c.ref_lse[s.heads_q / s.heads_kv]));
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
  EXPECT_TRUE(std::isinf(c.ref_lse[0]));  // the reference agrees: nothing to attend to
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
