/// @file mla_plan.hpp
/// @brief Host-only facts and split chooser of the CUDA MLA kernels (plain C++, no CUDA header):
///        the decode planner's `DecodeFacts` with the MLA kernels' costs, and the MLA decode's
///        automatic layout. `src/cuda/mla.cu` and `src/cuda/mla_cascade.cu` plan with them;
///        tests/plan/test_plan_mla.cpp checks them without CUDA.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attnstate/core/decode_split.hpp"
#include "catalog/kernel_shapes.hpp"
#include "plan/decode_plan.hpp"

namespace attnstate {
namespace plan {

// The MLA kernels' costs for the split chooser, in keys one CTA streams in that time: a CTA's
// fixed cost (its 72 KiB query tile and the pipeline's fill), an empty split's CTA (it reads the
// length and exits) and the merge of a request's splits (the last split's partial state written,
// the ticket, the merging CTA's start).
inline constexpr int kMlaCtaCostTokens = 64;
inline constexpr int kMlaEmptyCtaTokens = 16;
inline constexpr int kMlaMergeCostTokens = 256;
// The shortest planned split: two of the wgmma kernels' 64-key tiles (four of the mma.sync
// kernel's). A split of one tile loads nothing while it computes and pays a CTA's fixed costs
// for 64 keys: a lone request of 4k keys at 16 heads ran faster in 32 splits than in 64
// (bench/RESULTS.md, session 34).
inline constexpr int kMlaMinSplitTokens = 2 * catalog::kMlaWsTileKeys;

/// Bytes of one cached key: 576 bf16 columns (an fp8 cache reads fewer; the model counts bf16).
inline constexpr int kMlaKeyBytes = catalog::kMlaHeadDim * 2;

/// Bytes of one split's partial state of a tile's `rows` used rows: fp32 `o` of 512 columns and
/// an LSE a row (131,328 for a full tile of 64 rows).
inline constexpr std::int64_t mla_partial_bytes(std::int64_t rows) {
  return rows * (catalog::kMlaLoraRank + 1) * 4;
}

/// The ticket merge's cost per split when a tile holds `rows` query rows: the CTA holding the
/// tile's last ticket reads every split's partial state alone, one after the other, on the
/// request's critical path; it reads them at about a streaming CTA's rate (the fold, 21-26 GB/s
/// on an H100: 64 splits of 16 rows in 99 µs, of 64 rows in 326 µs, bench/RESULTS.md), so a
/// split costs its bytes in keys of `kMlaKeyBytes`: 114 keys for 64 rows, 29 for 16. (The splits'
/// own writes of their states run in parallel, one per CTA: the last one is in
/// `kMlaMergeCostTokens`.)
inline constexpr int mla_merge_split_tokens(std::int64_t rows) {
  return static_cast<int>((mla_partial_bytes(rows) + kMlaKeyBytes - 1) / kMlaKeyBytes);
}
static_assert(mla_merge_split_tokens(64) == 114 && mla_merge_split_tokens(16) == 29,
              "the per-split merge costs derived above");

/// From this many splits the decode merges them in a second launch, `merge_states` over the
/// stacked partial states (the MLA cascade's merge), instead of the ticket's merging CTA: the
/// same bytes are written and read once either way, but the stacked merge reads them on every
/// SM, where the ticket's CTA reads its tile's alone, 1.5 µs (16 rows) to 5 µs (64 rows) a
/// split on an H100. Below 4 splits that serial read is about one kernel boundary (a few µs),
/// which the stacked merge adds.
inline constexpr int kMlaStackMergeSplits = 4;
/// The stacked merge's fixed cost: the ticket merge's, and as much again for the kernel boundary
/// (an estimate; `bench_mla` times both paths).
inline constexpr int kMlaStackMergeTokens = 2 * kMlaMergeCostTokens;

/// Whether the MLA decode merges `max_splits` splits per request through the stack.
inline constexpr bool mla_stack_merge(std::int64_t max_splits) {
  return max_splits >= kMlaStackMergeSplits;
}

/// The planner's facts for the MLA kernels (decode and cascade levels): one CTA per SM (their
/// shared memory), no cluster merge, no short-split configuration, the MLA costs; the merge's cost
/// does not grow with the split count (the cascade's `merge_states` over its stack).
inline DecodeFacts mla_facts() {
  DecodeFacts f;
  f.tile_rows = catalog::kMlaTileRows;
  f.stages = catalog::kMlaStages;
  f.short_stages = catalog::kMlaStages;
  f.short_tokens = 0;
  f.max_cluster = 1;
  f.ws_group = 1;
  f.ctas_per_sm = 1;
  f.stream_warps = 0;
  f.split_multiple = 1;
  f.cta_cost_tokens = kMlaCtaCostTokens;
  f.empty_cta_tokens = kMlaEmptyCtaTokens;
  f.merge_cost_tokens = kMlaMergeCostTokens;
  f.min_split_tokens = kMlaMinSplitTokens;
  return f;
}

/// The MLA decode's facts for tiles of `rows` used query rows (at most 64): `mla_facts` with
/// the merges' costs per split (`mla_merge_split_tokens`: the ticket's below
/// `kMlaStackMergeSplits` splits, the stacked merge's from there), every layout chosen by the
/// cost model (`balance_uniform`).
inline DecodeFacts mla_decode_facts(std::int64_t rows = catalog::kMlaTileRows) {
  DecodeFacts f = mla_facts();
  f.merge_split_tokens = mla_merge_split_tokens(rows);
  f.stack_merge_splits = kMlaStackMergeSplits;
  f.stack_merge_tokens = kMlaStackMergeTokens;
  f.balance_uniform = true;
  return f;
}

/// The MLA decode's split layout for `batch` requests of `q_len × heads` rows (`row_tiles` tiles
/// of 64 each) over one latent head of `head_dim` keys, on `num_sms` SMs of `ctas_per_sm`
/// resident CTAs each (the kernel's: 1, or `kMlaNarrow2CtasPerSm` for the two-CTA narrow
/// kernel): `auto_layout` with `mla_decode_facts` for `SplitPolicy::kAuto`, else
/// `plan_split_layout`. Errors name `fn`, `seq_lens_host` and `options`.
inline SplitLayout mla_decode_layout(const char* fn, const DecodeProblem& problem,
                                     const std::int32_t* seq_lens_host,
                                     const DecodeOptions& options, int num_sms, int row_tiles,
                                     int ctas_per_sm = 1) {
  // the fullest tile's rows: its merge is the longest
  DecodeFacts facts = mla_decode_facts(
      std::min<std::int64_t>(catalog::kMlaTileRows, problem.q_len * problem.heads_q));
  facts.ctas_per_sm = ctas_per_sm;
  const std::int64_t slots = static_cast<std::int64_t>(num_sms) * facts.ctas_per_sm;
  return options.policy == SplitPolicy::kAuto
             ? auto_layout(fn, problem, seq_lens_host, options, slots, row_tiles, facts)
             : plan_split_layout(problem, seq_lens_host, options, slots, row_tiles, fn,
                                 "seq_lens_host", "options");
}

/// The shortest split of a request, in keys, at which the two-CTA narrow kernel
/// (`MlaDecodeKernel::kWgmmaNarrow2`) is taken by `kAuto`: it needs two CTAs on each SM, so a few
/// requests are cut into twice the one-CTA kernel's splits, and splits this short pay their
/// fixed costs and the stacked merge of twice the partial states for no overlap gained.
inline constexpr std::int32_t kMlaNarrow2MinSplitKeys = 512;

/// Whether the two-CTA narrow kernel's automatic `layout` keeps every request of `seq_lens_host`
/// (`batch` lengths) whole or in splits of at least `kMlaNarrow2MinSplitKeys` keys (the longest
/// request has the most splits, so it alone decides).
inline bool mla_narrow2_layout_ok(const SplitLayout& layout, const std::int32_t* seq_lens_host,
                                  std::int64_t batch) {
  std::int32_t longest = 0;
  for (std::int64_t b = 0; b < batch; ++b) longest = std::max(longest, seq_lens_host[b]);
  return layout.splits_for(longest) == 1 || layout.chunk_for(longest) >= kMlaNarrow2MinSplitKeys;
}

}  // namespace plan
}  // namespace attnstate
