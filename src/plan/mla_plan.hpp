/// @file mla_plan.hpp
/// @brief Host-only facts and split chooser of the CUDA MLA kernels (plain C++, no CUDA header):
///        the decode planner's `DecodeFacts` with the MLA kernels' costs, and the MLA decode's
///        automatic layout. `src/cuda/mla.cu` and `src/cuda/mla_cascade.cu` plan with them;
///        tests/plan/test_plan_mla.cpp checks them without CUDA.
#pragma once

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
// The shortest planned split: two K/V tiles.
inline constexpr int kMlaMinSplitTokens = 2 * catalog::kMlaTileKeys;

/// Bytes of one cached key: 576 bf16 columns (an fp8 cache reads fewer; the model counts bf16).
inline constexpr int kMlaKeyBytes = catalog::kMlaHeadDim * 2;
/// Bytes of one split's partial state of a 64-row tile: fp32 `o` of 512 columns and an LSE a row.
inline constexpr int kMlaPartialBytes = catalog::kMlaTileRows * (catalog::kMlaLoraRank + 1) * 4;
/// The decode's merge per split: the CTA holding a request tile's last ticket reads every split's
/// partial state alone, one after the other (131,328 bytes each), at about the rate a CTA streams
/// keys of 1,152 bytes: 114 keys a split, on the request's critical path. (The splits' own writes
/// of their states run in parallel, one per CTA: the last one is in `kMlaMergeCostTokens`.)
inline constexpr int kMlaMergeSplitTokens = (kMlaPartialBytes + kMlaKeyBytes - 1) / kMlaKeyBytes;
static_assert(kMlaMergeSplitTokens == 114, "the per-split merge cost derived above");

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

/// The MLA decode's facts: `mla_facts` with the ticket merge's cost per split
/// (`kMlaMergeSplitTokens`), every layout chosen by the cost model (`balance_uniform`).
inline DecodeFacts mla_decode_facts() {
  DecodeFacts f = mla_facts();
  f.merge_split_tokens = kMlaMergeSplitTokens;
  f.balance_uniform = true;
  return f;
}

/// The MLA decode's split layout for `batch` requests of `q_len × heads` rows (`row_tiles` tiles
/// of 64 each) over one latent head of `head_dim` keys, on `num_sms` SMs: `auto_layout` with
/// `mla_decode_facts` for `SplitPolicy::kAuto`, else `plan_split_layout`. Errors name `fn`,
/// `seq_lens_host` and `options`.
inline SplitLayout mla_decode_layout(const char* fn, const DecodeProblem& problem,
                                     const std::int32_t* seq_lens_host,
                                     const DecodeOptions& options, int num_sms, int row_tiles) {
  const DecodeFacts facts = mla_decode_facts();
  const std::int64_t slots = static_cast<std::int64_t>(num_sms) * facts.ctas_per_sm;
  return options.policy == SplitPolicy::kAuto
             ? auto_layout(fn, problem, seq_lens_host, options, slots, row_tiles, facts)
             : plan_split_layout(problem, seq_lens_host, options, slots, row_tiles, fn,
                                 "seq_lens_host", "options");
}

}  // namespace plan
}  // namespace attnstate
