/// @file decode_plan.hpp
/// @brief Host-only planner of the CUDA split-KV decode (plain C++, no CUDA header): from the
///        problem, the planned lengths, the options and the facts of the kernels and the device
///        to the recorded choice (split layout, streamed kernel, pipeline depth, cluster).
///
/// `src/cuda/decode.cu` gathers the facts (the kernels' compile-time shape, the device's
/// occupancy) and records the result in the opaque `cuda::DecodePlan` (through
/// `plan/decode_plan_access.hpp`); the unit tests in `tests/plan` give their own facts. Every rule
/// here changes speed only, never results: the configurations it chooses between give the same
/// bits.
#pragma once

#include <cstdint>

#include "attnstate/core/decode_split.hpp"
#include "catalog/catalog.hpp"
#include "catalog/kernel_shapes.hpp"
#include "common/compiled.hpp"
#include "plan/tuning_sm90.hpp"

namespace attnstate {
namespace plan {

/// Largest thread-block cluster the decode uses (the portable size); `DecodeFacts` records the
/// occupancy of cluster sizes 2..`kMaxCluster`.
inline constexpr int kMaxCluster = catalog::kDecodeMaxWsGroup;

/// The head dims with compiled decode kernels (`compiled::DecodeHeadDims`, the one list read by
/// the checks, `check_decode_problem`, and by the dispatch of `src/cuda/decode.cu`).
inline constexpr const auto& kDecodeHeadDims = compiled::Values<compiled::DecodeHeadDims>::value;
/// The dtypes with compiled decode kernels (queries and KV the same dtype;
/// `compiled::DecodeDTypes`).
inline constexpr const auto& kDecodeDTypes = compiled::Values<compiled::DecodeDTypes>::value;

/// True when `head_dim` is one of `kDecodeHeadDims`.
bool decode_head_dim_supported(std::int64_t head_dim);
/// True when `dt` is one of `kDecodeDTypes`.
bool decode_dtype_supported(DType dt);

/// The facts the decode planner needs: the kernels' compile-time shape for the problem's head
/// dim and what the device keeps resident. Plain values, so the planner is tested without CUDA.
struct DecodeFacts {
  int tile_rows = catalog::kDecodeTileRows;        ///< Query rows of a CTA tile.
  int stages = catalog::kDecodeStages;             ///< Default pipeline depth.
  int short_stages = catalog::kDecodeShortStages;  ///< Short-split depth (where a row has it).
  std::int32_t short_tokens = catalog::kDecodeShortTokens;  ///< Longest short split (0: none).
  int max_cluster = catalog::kDecodeMaxCluster;             ///< Most splits merged in one cluster.
  int ws_group = catalog::kDecodeWsGroup;                   ///< Largest workspace-merge group.
  int ctas_per_sm = 1;   ///< Resident CTAs per SM, default depth, this head dim.
  int stream_warps = 0;  ///< Warps per CTA of the streamed kernel, this head dim.
  int cluster_tokens = cuda::tuning::kDecodeClusterTokens;                ///< Cluster-merge splits.
  int split_multiple = cuda::tuning::kDecodeSplitMultiple;                ///< Split-count multiple.
  std::int64_t stream_max_tokens = cuda::tuning::kDecodeStreamMaxTokens;  ///< Streamed, at most.
  int cta_cost_tokens = cuda::tuning::kDecodeCtaCostTokens;      ///< A split CTA's fixed cost.
  int empty_cta_tokens = cuda::tuning::kDecodeEmptyCtaTokens;    ///< An empty split CTA's cost.
  int merge_cost_tokens = cuda::tuning::kDecodeMergeCostTokens;  ///< A request's merge cost.
  /// The merge's cost per split of a request, on top of `merge_cost_tokens` (0: the merge's cost
  /// does not grow with the split count, as the decode's cluster and group merges).
  int merge_split_tokens = 0;
  /// Split counts from which the splits merge in a launch of their own over every SM (0: never):
  /// its cost is then `stack_merge_tokens` plus twice `merge_split_tokens` (each partial state
  /// written and read, every CTA sharing the memory) for each split of every request and CTA,
  /// spread over the slots, instead of `merge_cost_tokens` plus `merge_split_tokens` per split.
  int stack_merge_splits = 0;
  int stack_merge_tokens = 0;  ///< The stacked merge's launch, in keys.
  /// Lengths all equal take the layout of least `layout_cost` too (`auto_layout`), not only the
  /// wave heuristic's.
  bool balance_uniform = false;
  int min_split_tokens = cuda::tuning::kDecodeMinSplitTokens;  ///< Shortest planned split.
  /// Shortest split the wave heuristic gives a request longer than `max_cluster` ×
  /// `cluster_tokens` keys (0: no floor).
  int wave_min_split_tokens = cuda::tuning::kDecodeWaveMinSplitTokens;
  /// CTAs per SM whose slots the automatic layout fills (0: `ctas_per_sm`; at most that many
  /// are used); `DecodeOptions::plan_ctas_per_sm` overrides it.
  int plan_ctas_per_sm = cuda::tuning::kDecodePlanCtasPerSm;
  /// Clusters of `c` CTAs (index `c`, 2..`kMaxCluster`) of the split kernel the device keeps
  /// resident at once: `[0]` at the default depth, `[1]` in the short-split configuration;
  /// 0 for sizes never used.
  int resident_clusters[2][kMaxCluster + 1] = {};
};

/// The kernels' compile-time shape for `head_dim` (K/V elements of `kv_bytes` bytes: 2, or 1
/// for fp8) and the tuning constants: the planner's facts without the device's occupancy
/// (`resident_clusters` all 0). `head_dim` is one `check_decode_problem` accepted.
DecodeFacts decode_kernel_facts(std::int64_t head_dim, int kv_bytes);

/// How the split-KV kernel launches on a grid.
struct SplitLaunch {
  int stages =
      catalog::kDecodeStages;  ///< Pipeline depth (`DecodeFacts::stages` or `short_stages`).
  int cluster = 1;  ///< CTAs per cluster: the split count (cluster merge), a divisor (groups), 1.
};

/// Why a plan runs its kernel (`cuda::DecodePlan::to_string`).
enum class DecodeReason : std::uint8_t {
  kStreamedAuto = 0,      ///< The automatic policy's rule for the streamed kernel held.
  kStreamedAsked = 1,     ///< `DecodeOptions::kernel = kStreamed`.
  kSplitAsked = 2,        ///< `DecodeOptions::kernel = kSplit`.
  kSplitPolicy = 3,       ///< A fixed split policy.
  kSplitRequests = 4,     ///< Some request is split.
  kSplitNoStreamed = 5,   ///< No streamed row in the catalog for the problem and variant.
  kSplitFewItems = 6,     ///< Too few items for the streamed kernel's warps.
  kSplitLongRequest = 7,  ///< A request longer than the streamed kernel's cap.
};

/// `r` in words.
const char* to_string(DecodeReason r);

/// The resolved decode: what `plan_decode` records.
struct DecodeChoice {
  SplitLayout splits;     ///< The split layout.
  int row_tiles = 1;      ///< Tiles of `tile_rows` query rows per KV head.
  bool streamed = false;  ///< The streamed kernel runs (else the split kernel).
  DecodeReason reason = DecodeReason::kSplitRequests;  ///< Why.
  SplitLaunch split;       ///< The split kernel's launch (the streamed kernel's fallback).
  std::int64_t grid = 0;   ///< CTAs of the split kernel for the planned batch.
  int forced_stages = 0;   ///< `DecodeOptions::split_stages` (checked; 0: the rule's).
  int forced_cluster = 0;  ///< `DecodeOptions::split_cluster` (checked; 0: the rule's).
  /// Catalog rows: the split kernel's at the default and the short-split depth (-1 where none
  /// is compiled) and the streamed kernel's (-1 unless `streamed`).
  int split_ids[2] = {-1, -1};
  int stream_id = -1;

  /// The catalog row that runs at the planned batch: the streamed row, or the split row at
  /// `split.stages`.
  int kernel_id() const;
};

/// Checks a decode problem's shape (`batch`, `q_len`, heads, the head dim against
/// `kDecodeHeadDims`, a dtype of `kDecodeDTypes` for both queries and KV, or an fp8 KV dtype
/// of `compiled::DecodeFp8DTypes` at a head dim of `compiled::DecodeFp8HeadDims` under queries
/// of a `kDecodeDTypes` dtype); throws naming `fn`.
void check_decode_problem(const char* fn, const DecodeProblem& problem);

/// `ceil(q_len · group / tile_rows)`.
int decode_row_tiles(const DecodeProblem& problem, int tile_rows);

/// Whether a layout may run in the short-split configuration: a split row compiled at its depth
/// (`split_ids[1] >= 0`: `DecodeChoice::split_ids`, the rows at the default and the short-split
/// depth, -1 where none), the configuration on (`short_tokens > 0`, a different depth) and
/// fixed-size splits of at most `short_tokens` tokens.
bool short_candidate(const DecodeFacts& facts, const int (&split_ids)[2],
                     const SplitLayout& splits);

/// Estimated time of the split kernel with fixed-size splits of `chunk` keys (at most
/// `max_splits` per request) over the lengths `seq_lens` (`batch` of them), `ctas` CTAs per
/// split (KV heads × row tiles), on `slots` concurrent CTAs, in the keys one CTA slot streams in
/// that time: the non-empty splits taken longest first in waves of `slots`, each wave as long as
/// its longest split plus `cta_cost_tokens`; the CTAs of empty splits at `empty_cta_tokens`
/// spread over the slots; when a request is split, one `merge_cost_tokens` plus
/// `merge_split_tokens` per split of the longest request (from `stack_merge_splits` splits, the
/// stacked merge: `stack_merge_tokens` plus twice `merge_split_tokens` per split of every request
/// and CTA, over the slots). A model, not a measurement: it ranks layouts of one problem.
double layout_cost(const std::int32_t* seq_lens, std::int64_t batch, std::int64_t ctas,
                   std::int64_t chunk, std::int64_t max_splits, std::int64_t slots,
                   const DecodeFacts& facts);

/// The split layout balanced over the real lengths of a batch: among split sizes
/// `ceil(max_len / s)` (rounded up to 16, at least `min_split_tokens` unless `s == 1`, at most
/// `kMaxSplits` splits for the longest request), the one of least `layout_cost` (the fewest
/// splits among equals).
SplitLayout balanced_layout(const DecodeProblem& problem, const std::int32_t* seq_lens,
                            std::int64_t slots, int row_tiles, const DecodeFacts& facts);

/// The automatic split layout for `slots` concurrent CTAs:
/// - requests all of one length: the wave-efficiency heuristic (`plan_split_layout`), or, with
///   `balance_uniform`, as for lengths that differ;
/// - lengths that differ: `balanced_layout`, when its `layout_cost` is below 97% of that of the
///   heuristic's layout (which sizes the splits from the longest request only), else the latter;
/// then, for short requests, at most as many splits as a cluster merges (`max_cluster`, when the
/// splits stay within `cluster_tokens`); for long ones, a split count rounded up to
/// `split_multiple` when the grid stays within the slots. Errors name `fn` and `seq_lens_host`.
SplitLayout auto_layout(const char* fn, const DecodeProblem& problem, const std::int32_t* seq_lens,
                        const DecodeOptions& options, std::int64_t slots, int row_tiles,
                        const DecodeFacts& facts);

/// The split kernel's launch on a grid of `grid` CTAs for `num_sms` SMs:
/// - depth: the short-split configuration when `short_candidate` and either the grid exceeds one
///   wave of the default depth (`num_sms · ctas_per_sm`) or, for a cluster merge, its clusters
///   are not all resident at the default depth but are in the short-split configuration;
/// - cluster: the split count when it is at most `max_cluster` and every cluster is resident at
///   once at that depth (the cluster merge); else, with several splits, the largest group size
///   up to `min(ws_group, splits − 1)` that divides the split count and keeps every cluster
///   resident (the workspace merge in groups); else 1.
///
/// `forced_stages` / `forced_cluster` (`DecodeOptions::split_stages` / `split_cluster`, checked
/// by `resolve_decode`), when not 0, replace the depth (the cluster is then resolved at that
/// depth) and the cluster.
SplitLaunch resolve_split_launch(const DecodeFacts& facts, const int (&split_ids)[2],
                                 const SplitLayout& splits, int num_sms, std::int64_t grid,
                                 int forced_stages = 0, int forced_cluster = 0);

/// Whether a recorded split launch is one the kernels support for `splits`: a compiled depth
/// (the default, or the short-split one where `split_ids[1] >= 0`), and a cluster of 1, of the
/// split count (at most `max_cluster`) or of a divisor of it up to `ws_group`. Says what is wrong
/// in `why` when not.
bool split_launch_valid(const DecodeFacts& facts, const int (&split_ids)[2],
                        const SplitLayout& splits, const SplitLaunch& launch, const char** why);

/// The family whose row a decode run launches, by the catalog's fallback rule
/// (`catalog::family_that_runs`) applied to the plan's row `kernel_id` (`DecodeChoice::kernel_id`)
/// with what only the run knows: its run-time needs met or not (query rows 16-byte aligned,
/// `q_aligned`; a page size of whole key tiles) and the run's variants (`variants`, prior states
/// folded in when `prior_count > 0`: a cascade's fold). A streamed row's fallback is the split
/// kernel: the run takes the plan's split row at its split launch's depth (`split_ids`). Throws
/// `kInvalidArgument` for an id outside the catalog.
catalog::Family decode_run_family(int kernel_id, catalog::Variants variants, int prior_count,
                                  bool q_aligned, std::int64_t page_size);

/// Resolves a decode plan (checks first, naming `fn`; `Status::kNotSupported` for a variant no
/// compiled split kernel of the problem's dtypes takes, naming `options.variant`): the split
/// layout (`kAuto`: `auto_layout` on `num_sms · ctas_per_sm` slots; `options.plan_ctas_per_sm`
/// per SM when not 0, else `facts.plan_ctas_per_sm` when not 0, at most `ctas_per_sm`), the
/// streamed kernel
/// (automatic policy, one split per request, a streamed row in the catalog for the problem and
/// the variant, requests up to `stream_max_tokens` keys, at least 3/4 of the
/// streamed kernel's warps busy on every SM), the split kernel's launch for the planned
/// batch (from `facts.resident_clusters`: a caller that queries the device only after the
/// argument checks resolves `split` again with `resolve_split_launch` on `grid` and the forced
/// parts) and the catalog rows. The hand choices of `options` are checked here, naming their
/// field: `options.kernel` (`kStreamed` only with one split per request and a streamed row for
/// the problem and variant, else `kInvalidArgument` / `kNotSupported`), `options.split_stages`
/// (a depth the catalog compiles for the problem) and `options.split_cluster` (1, the split
/// count up to `max_cluster`, or a smaller divisor of it up to `ws_group`) and
/// `options.plan_ctas_per_sm` (0, or 1..`ctas_per_sm` with the `kAuto` policy). Throws when the
/// grid exceeds 2^31 − 1 CTAs.
DecodeChoice resolve_decode(const char* fn, const DecodeProblem& problem,
                            const std::int32_t* seq_lens_host, const DecodeOptions& options,
                            int num_sms, const DecodeFacts& facts);

}  // namespace plan
}  // namespace attnstate
