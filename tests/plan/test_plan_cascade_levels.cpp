/// @file test_plan_cascade_levels.cpp
/// @brief Levels from a page table (`build_cascade_levels`) taken by the CUDA backend's host
///        cascade planner (src/plan/cascade_plan.hpp): a batch with a prompt shared by all and
///        blocks shared by two groups plans the remainders on the split-KV decode, and the empty
///        segments of a level with gaps do not enlarge its row tiles. No CUDA, no GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "attnstate/core/cascade_levels.hpp"
#include "plan/cascade_plan.hpp"

namespace {

using namespace attnstate;
namespace plan = attnstate::plan;

constexpr std::int64_t kPage = 16, kBatch = 64, kGroup = 4;

/// 64 requests: a 64-page prompt for all, a 16-page block for requests 0..15 and another for
/// 16..31, then 1 to 40 tokens of their own; pages numbered in allocation order.
struct Batch {
  std::vector<std::int32_t> indptr{0}, ids, lens;
  std::int32_t pages = 0;

  Batch() {
    std::vector<std::int32_t> prompt, block_a, block_b;
    for (int i = 0; i < 64; ++i) prompt.push_back(pages++);
    for (int i = 0; i < 16; ++i) block_a.push_back(pages++);
    for (int i = 0; i < 16; ++i) block_b.push_back(pages++);
    for (std::int64_t b = 0; b < kBatch; ++b) {
      ids.insert(ids.end(), prompt.begin(), prompt.end());
      std::int32_t len = 64 * kPage;
      if (b < 32) {
        const auto& block = b < 16 ? block_a : block_b;
        ids.insert(ids.end(), block.begin(), block.end());
        len += 16 * kPage;
      }
      const std::int32_t own = 1 + static_cast<std::int32_t>(b * 7 % 40);
      for (std::int32_t p = 0; p < (own + kPage - 1) / kPage; ++p) ids.push_back(pages++);
      indptr.push_back(static_cast<std::int32_t>(ids.size()));
      lens.push_back(len + own);
    }
  }
  PagedKvCache table() const {
    PagedKvCache kv;
    kv.num_pages = pages;
    kv.page_size = kPage;
    kv.heads_kv = 2;
    kv.head_dim = 128;
    kv.page_indptr = indptr.data();
    kv.page_indices = ids.data();
    kv.seq_lens = lens.data();
    kv.batch = kBatch;
    return kv;
  }
};

/// A stand-in decode planner: one split per request, one row tile.
plan::CascadeDecodeLevel fake_decode(const DecodeProblem&, const std::int32_t*,
                                     const DecodeOptions&, int) {
  plan::CascadeDecodeLevel d;
  d.splits.policy = SplitPolicy::kFixedSize;
  d.splits.split_size = 4096;
  d.splits.max_splits = 1;
  return d;
}

TEST(PlanCascadeLevels, PlannerTakesTheLevelsOfAPageTable) {
  const Batch batch;
  for (const std::int64_t q_len : {1, 4}) {
    CascadeLevelsOptions o;
    o.q_len = q_len;
    const CascadeLevels lv = build_cascade_levels(batch.table(), o);
    ASSERT_EQ(lv.num_levels(), 3) << to_string(lv);
    EXPECT_TRUE(lv.identity_order());
    // the gap of 32 requests without a block: two empty segments of 16, like the blocks
    EXPECT_EQ(lv.arrays(1).request_indptr, (std::vector<std::int32_t>{0, 16, 32, 48, 64}));
    cuda::CascadeShape s;
    s.batch = kBatch;
    s.q_len = q_len;
    s.heads_kv = 2;
    s.heads_q = 2 * kGroup;
    s.head_dim = 128;
    s.page_size = kPage;
    s.num_pages = batch.pages;
    s.dtype = DType::kBF16;
    const cuda::CascadeChoice p = plan::plan_cascade(
        "test", s, lv.levels(), lv.num_levels(), CascadeOptions{}, 132, cuda::CascadeTuning{},
        plan::CascadeDeviceFacts{true, true}, fake_decode);
    ASSERT_EQ(p.num_levels(), 3);
    EXPECT_EQ(p.level(0).tile_rows, 128);  // 64 requests x q_len x group 4 rows
    // 16 requests x q_len x 4 rows (a single empty segment of 32 requests would make 128)
    EXPECT_EQ(p.level(1).tile_rows, q_len == 1 ? 64 : 128);
    EXPECT_EQ(p.level(1).max_tiles, q_len == 1 ? 1 : 2);
    EXPECT_TRUE(p.level(2).decode);  // the remainders run on the split-KV decode
    EXPECT_EQ(p.level(2).kernel, cuda::CascadeLevelKernel::kDecode);
  }
}

}  // namespace
