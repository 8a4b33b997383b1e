/// @file test_plan_mla.cpp
/// @brief The host-only MLA split chooser (src/plan/mla_plan.hpp): the merge's per-split cost in
///        the decode planner's model, the layouts the MLA decode plans for uniform lengths, and
///        the fixed policies passed through. No CUDA, no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "plan/decode_plan.hpp"
#include "plan/mla_plan.hpp"

namespace {

using attnstate::DecodeOptions;
using attnstate::DecodeProblem;
using attnstate::DType;
using attnstate::kSplitGranularity;
using attnstate::SplitLayout;
using attnstate::SplitPolicy;
namespace plan = attnstate::plan;
namespace catalog = attnstate::catalog;

constexpr const char* kFn = "test";
constexpr int kSms = 132;  // an H100 SXM

/// The problem the MLA decode's planner sees: one latent head of 576 columns, `heads` query heads.
DecodeProblem mla_problem(std::int64_t batch, std::int64_t heads) {
  DecodeProblem p;
  p.batch = batch;
  p.q_len = 1;
  p.heads_kv = 1;
  p.heads_q = heads;
  p.head_dim = 576;
  p.q_dtype = DType::kBF16;
  p.kv_dtype = DType::kBF16;
  return p;
}

int row_tiles(std::int64_t heads) { return static_cast<int>((heads + 63) / 64); }

double cost(const std::vector<std::int32_t>& lens, int tiles, const SplitLayout& l,
            const plan::DecodeFacts& f) {
  return plan::layout_cost(lens.data(), static_cast<std::int64_t>(lens.size()), tiles, l.split_size,
                           l.max_splits, kSms, f);
}

TEST(PlanMla, TheMergePerSplitAddsToTheCostOfASplitLayoutOnly) {
  const std::vector<std::int32_t> lens = {4096, 1000, 0, 4096};
  plan::DecodeFacts with = plan::mla_facts();
  with.merge_split_tokens = 100;
  const plan::DecodeFacts without = plan::mla_facts();
  for (std::int64_t chunk : {64, 512, 1024, 4096}) {
    const std::int64_t n = (4096 + chunk - 1) / chunk;
    const double a = plan::layout_cost(lens.data(), 4, 2, chunk, n, kSms, with);
    const double b = plan::layout_cost(lens.data(), 4, 2, chunk, n, kSms, without);
    EXPECT_DOUBLE_EQ(a - b, n > 1 ? 100.0 * static_cast<double>(n) : 0.0) << chunk;
  }
}

TEST(PlanMla, FromTheStackThresholdTheMergeIsSpreadOverTheSlots) {
  const std::vector<std::int32_t> lens = {4096, 1000, 0, 4096};
  plan::DecodeFacts stack = plan::mla_facts();
  stack.merge_split_tokens = 100;
  stack.stack_merge_splits = 4;
  stack.stack_merge_tokens = 300;
  const plan::DecodeFacts none = plan::mla_facts();
  for (std::int64_t n : {2, 3, 4, 8, 64}) {
    const std::int64_t chunk = (4096 + n - 1) / n;
    const double a = plan::layout_cost(lens.data(), 4, 2, chunk, n, kSms, stack);
    const double b = plan::layout_cost(lens.data(), 4, 2, chunk, n, kSms, none);
    // below the threshold the ticket's terms; from it, the stack's: every request's and CTA's
    // partial state written and read, over the slots, in place of the ticket's fixed cost
    const double want = n < 4 ? 100.0 * static_cast<double>(n)
                              : 300.0 - none.merge_cost_tokens +
                                    2.0 * 100.0 * static_cast<double>(4 * 2 * n) / kSms;
    EXPECT_NEAR(a - b, want, 1e-9) << n;
  }
}

TEST(PlanMla, TheGqaDecodeFactsKeepTheirModel) {
  // the defaults the GQA decode plans with: no per-split merge cost, the wave heuristic for
  // uniform lengths (its layouts are those of test_plan_decode, unchanged)
  const plan::DecodeFacts f = plan::decode_kernel_facts(128, 2);
  EXPECT_EQ(f.merge_split_tokens, 0);
  EXPECT_FALSE(f.balance_uniform);
  EXPECT_EQ(f.stack_merge_splits, 0);
  EXPECT_EQ(plan::DecodeFacts{}.merge_split_tokens, 0);
  EXPECT_EQ(plan::DecodeFacts{}.stack_merge_splits, 0);
  EXPECT_FALSE(plan::DecodeFacts{}.balance_uniform);
  // the cascade's levels merge through merge_states: no per-split cost either
  EXPECT_EQ(plan::mla_facts().merge_split_tokens, 0);
  EXPECT_EQ(plan::mla_facts().stack_merge_splits, 0);
  EXPECT_FALSE(plan::mla_facts().balance_uniform);
}

TEST(PlanMla, TheDecodeCountsTheTicketMergeFromItsBytes) {
  // one split's partial state ((512 + 1) fp32 a used row of the tile) in keys of 576 bf16
  // columns, rounded up
  for (std::int64_t rows : {16, 48, 64}) {
    const std::int64_t partial = rows * (512 + 1) * 4;
    EXPECT_EQ(plan::mla_decode_facts(rows).merge_split_tokens, (partial + 576 * 2 - 1) / (576 * 2))
        << rows;
  }
  const plan::DecodeFacts f = plan::mla_decode_facts();
  EXPECT_EQ(f.merge_split_tokens, plan::mla_decode_facts(64).merge_split_tokens);
  EXPECT_TRUE(f.balance_uniform);
  EXPECT_EQ(f.stack_merge_splits, plan::kMlaStackMergeSplits);
  EXPECT_TRUE(plan::mla_stack_merge(plan::kMlaStackMergeSplits));
  EXPECT_FALSE(plan::mla_stack_merge(plan::kMlaStackMergeSplits - 1));
}

struct Case {
  std::int64_t batch, heads;
  std::int32_t len;
  std::int32_t splits;  // the pinned split count
};

// The split counts the model gives on 132 SMs. At batch 1 the splits merge through the stack
// (its per-split cost spread over the SMs), so a lone request still fills the SMs, in splits of
// at least two 64-key tiles (`kMlaMinSplitTokens`: 32 splits of 4k keys); with 128 heads
// (two CTAs a split) fewer, as each split's partial states double; from batch 32 the requests
// fill the wave, the ticket merge of 2 or 4 splits is the cheaper, and the layouts are those of
// the wave heuristic (4 splits of 32 CTAs, 2 of 64, 1 from 128 CTAs a split).
const Case kCases[] = {
    {1, 16, 4096, 32},  {1, 128, 4096, 32},  {1, 16, 65536, 128}, {1, 128, 65536, 61},
    {32, 16, 4096, 4},  {32, 128, 4096, 2},  {32, 16, 65536, 4},  {32, 128, 65536, 2},
    {128, 16, 4096, 1}, {128, 128, 4096, 1}, {128, 16, 65536, 1}, {128, 128, 65536, 1},
};

TEST(PlanMla, UniformLengthsTakeTheLayoutOfTheModel) {
  for (const Case& c : kCases) {
    SCOPED_TRACE("batch " + std::to_string(c.batch) + ", heads " + std::to_string(c.heads) +
                 ", length " + std::to_string(c.len));
    const DecodeProblem p = mla_problem(c.batch, c.heads);
    const std::vector<std::int32_t> lens(static_cast<std::size_t>(c.batch), c.len);
    const int tiles = row_tiles(c.heads);
    const SplitLayout l =
        plan::mla_decode_layout(kFn, p, lens.data(), DecodeOptions{}, kSms, tiles);
    EXPECT_EQ(l.policy, SplitPolicy::kFixedSize);
    EXPECT_EQ(l.max_splits, c.splits);
    EXPECT_EQ(l.split_size % kSplitGranularity, 0);
    EXPECT_EQ((c.len + l.split_size - 1) / l.split_size, l.max_splits);
    // no split count costs 5% less in the model (each count's smallest split size): the chooser
    // keeps the wave heuristic's layout unless the balanced one is 3% cheaper, and its search
    // visits every count up to 16, then steps of about 1/8
    const plan::DecodeFacts f = plan::mla_decode_facts(std::min<std::int64_t>(64, c.heads));
    const double chosen = cost(lens, tiles, l, f);
    for (std::int32_t s = 1; s <= std::min(4 * c.splits + 8, attnstate::kMaxSplits); ++s) {
      SplitLayout o;
      o.policy = SplitPolicy::kFixedSize;
      o.split_size = (c.len + s - 1) / s;
      o.split_size = (o.split_size + kSplitGranularity - 1) / kSplitGranularity * kSplitGranularity;
      if (s > 1 && o.split_size < f.min_split_tokens) break;
      o.max_splits = (c.len + o.split_size - 1) / o.split_size;
      EXPECT_LE(0.95 * chosen, cost(lens, tiles, o, f)) << s << " splits";
    }
    // the wave heuristic's layout (what uniform lengths took without the merge's cost) is never
    // cheaper in the model
    const SplitLayout wave =
        plan::auto_layout(kFn, p, lens.data(), DecodeOptions{}, kSms, tiles, plan::mla_facts());
    EXPECT_LE(chosen, cost(lens, tiles, wave, f));
  }
}

TEST(PlanMla, TheFixedPoliciesAreTheDecodes) {
  const DecodeProblem p = mla_problem(2, 128);
  const std::vector<std::int32_t> lens = {4096, 300};
  DecodeOptions o;
  o.policy = SplitPolicy::kFixedCount;
  o.num_splits = 40;
  SplitLayout a = plan::mla_decode_layout(kFn, p, lens.data(), o, kSms, 2);
  SplitLayout b = attnstate::plan_split_layout(p, lens.data(), o, kSms, 2);
  EXPECT_EQ(a.policy, b.policy);
  EXPECT_EQ(a.max_splits, b.max_splits);
  EXPECT_EQ(a.num_splits, b.num_splits);
  o.policy = SplitPolicy::kFixedSize;
  o.split_size = 256;
  a = plan::mla_decode_layout(kFn, p, lens.data(), o, kSms, 2);
  b = attnstate::plan_split_layout(p, lens.data(), o, kSms, 2);
  EXPECT_EQ(a.max_splits, 16);
  EXPECT_EQ(a.split_size, b.split_size);
  EXPECT_EQ(a.max_splits, b.max_splits);
}

TEST(PlanMla, TheTwoCtaNarrowKernelPlansTwiceTheSlots) {
  // the automatic layout over two resident CTAs per SM (the two-CTA narrow kernel): the model's
  // layout on twice the slots; a short batch takes at least the one-CTA layout's splits
  for (const std::int64_t batch : {1, 8, 128}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    const DecodeProblem p = mla_problem(batch, 16);
    const std::vector<std::int32_t> lens(static_cast<std::size_t>(batch), 65536);
    const SplitLayout two = plan::mla_decode_layout(kFn, p, lens.data(), DecodeOptions{}, kSms, 1,
                                                    catalog::kMlaNarrow2CtasPerSm);
    plan::DecodeFacts f = plan::mla_decode_facts(16);
    f.ctas_per_sm = catalog::kMlaNarrow2CtasPerSm;
    const SplitLayout ref =
        plan::auto_layout(kFn, p, lens.data(), DecodeOptions{}, 2 * std::int64_t{kSms}, 1, f);
    EXPECT_EQ(two.policy, ref.policy);
    EXPECT_EQ(two.split_size, ref.split_size);
    EXPECT_EQ(two.max_splits, ref.max_splits);
    const SplitLayout one = plan::mla_decode_layout(kFn, p, lens.data(), DecodeOptions{}, kSms, 1);
    if (batch == 1) {
      EXPECT_GE(two.max_splits, one.max_splits);
    }
  }
  // the fixed policies do not depend on the slots
  const DecodeProblem p = mla_problem(2, 16);
  const std::vector<std::int32_t> lens = {4096, 300};
  DecodeOptions o;
  o.policy = SplitPolicy::kFixedCount;
  o.num_splits = 7;
  const SplitLayout a = plan::mla_decode_layout(kFn, p, lens.data(), o, kSms, 1);
  const SplitLayout b =
      plan::mla_decode_layout(kFn, p, lens.data(), o, kSms, 1, catalog::kMlaNarrow2CtasPerSm);
  EXPECT_EQ(a.max_splits, b.max_splits);
  EXPECT_EQ(a.num_splits, b.num_splits);
}

TEST(PlanMla, TheTwoCtaKernelIsAutomaticWhereItsSplitsStayLong) {
  // `kAuto`'s rule for the two-CTA narrow kernel: its automatic layout must keep every request
  // whole or in splits of at least `kMlaNarrow2MinSplitKeys` keys. 16 heads at q_len 1 (one row
  // tile) on 132 SMs: a lone request of 64k keys would be cut into about 256 splits of 256
  // keys (refused), 32 requests of 4k into splits of 512 (taken), a lone request of 4k into
  // splits of 128 (refused), many short requests stay whole (taken).
  struct Case {
    std::int64_t batch;
    std::int32_t len;
    bool ok;
  };
  for (const Case& c : {Case{1, 65536, false}, Case{32, 4096, true}, Case{32, 65536, true},
                        Case{128, 4096, true}, Case{1, 4096, false}, Case{256, 300, true}}) {
    SCOPED_TRACE("batch " + std::to_string(c.batch) + " × " + std::to_string(c.len));
    const DecodeProblem p = mla_problem(c.batch, 16);
    const std::vector<std::int32_t> lens(static_cast<std::size_t>(c.batch), c.len);
    const SplitLayout two = plan::mla_decode_layout(kFn, p, lens.data(), DecodeOptions{}, kSms, 1,
                                                    catalog::kMlaNarrow2CtasPerSm);
    const bool ok = plan::mla_narrow2_layout_ok(two, lens.data(), c.batch);
    EXPECT_EQ(ok, c.ok) << two.max_splits << " splits of " << two.chunk_for(c.len);
    EXPECT_EQ(ok,
              two.splits_for(c.len) == 1 || two.chunk_for(c.len) >= plan::kMlaNarrow2MinSplitKeys);
  }
  // the longest request decides: a short request beside it does not
  const std::vector<std::int32_t> lens = {300, 65536};
  SplitLayout l;
  l.policy = SplitPolicy::kFixedSize;
  l.split_size = 256;
  l.max_splits = 256;
  EXPECT_FALSE(plan::mla_narrow2_layout_ok(l, lens.data(), 2));
  l.split_size = 512;
  l.max_splits = 128;
  EXPECT_TRUE(plan::mla_narrow2_layout_ok(l, lens.data(), 2));
  EXPECT_TRUE(plan::mla_narrow2_layout_ok(l, lens.data(), 1));  // 300 keys: one split
}

}  // namespace
