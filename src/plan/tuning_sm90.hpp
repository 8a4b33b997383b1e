/// @file plan/tuning_sm90.hpp
/// @brief The host-side tuning constants of the CUDA backend, chosen on the H200 (sm_90): how
///        the plans and dispatchers pick kernels, splits and launch shapes. The measurements that
///        chose each value are in bench/RESULTS.md; changing one changes speed, never results.
///
/// The kernels' own compile-time shapes (tile sizes, pipeline depths) live beside the kernels in
/// `kernels/*/params.cuh`. Nothing here is a build-time or environment knob: a value a user may
/// choose goes through the options structs (`DecodeOptions`, `CascadeTuning`).
#pragma once

#include <cstdint>

namespace attnstate {
namespace cuda {
namespace tuning {

/// Pairwise merge: chunks of a row per thread, at least (two halve the per-row work per byte).
inline constexpr int kMergePairChunks = 2;
/// `merge_states`: stacks of at most this many states (with 16-byte access to `o`) run on the
/// few-states kernel (at most `kernels::kFewMaxStates`).
inline constexpr int kMergeFewStates = 4;

/// Decode, automatic policy: splits of at most this many tokens merge in a cluster (distributed
/// shared memory) rather than spreading over more CTAs merged through the workspace.
inline constexpr int kDecodeClusterTokens = 256;
/// Decode, automatic policy: the split count of a long request is rounded up to a multiple of
/// this when the grid stays within one wave, so that groups of splits can share a cluster.
inline constexpr int kDecodeSplitMultiple = 2;
/// Decode, automatic policy: the longest request that runs on the streamed kernel (one split per
/// request, enough items to fill every SM).
inline constexpr int kDecodeStreamMaxTokens = 2048;
/// Decode, automatic policy over requests of different lengths (`plan::balanced_layout`): the
/// fixed cost of a split CTA (its prologue, first loads and state store), in the keys one CTA
/// slot streams in that time.
inline constexpr int kDecodeCtaCostTokens = 64;
/// As `kDecodeCtaCostTokens` for a CTA of an empty split (it reads the length and exits).
inline constexpr int kDecodeEmptyCtaTokens = 64;
/// As `kDecodeCtaCostTokens` for the merge of a request's splits (once, at the end).
inline constexpr int kDecodeMergeCostTokens = 512;
/// Decode, automatic policy: splits shorter than this are never planned (fixed costs dominate).
inline constexpr int kDecodeMinSplitTokens = 64;
/// Decode, automatic policy: a request longer than a cluster's worth of splits
/// (`kDecodeMaxCluster` × `kDecodeClusterTokens`) is not split finer than this by the wave
/// heuristic: when few requests leave slots to fill, more splits than this size gives share an
/// SM's bandwidth and lengthen the merge (batch 1 at 4k–8k keys: bench/RESULTS.md). 16-bit
/// caches only (fp8 plans keep the heuristic's splits).
inline constexpr int kDecodeWaveMinSplitTokens = 256;
/// Decode, automatic policy: CTAs per SM whose slots the split layout fills (0: the split
/// kernel's occupancy at its default depth; more are never used). Fewer slots give a call of few
/// requests fewer, longer splits; `DecodeOptions::plan_ctas_per_sm` overrides it per plan
/// (`bench_decode --latency` times both).
inline constexpr int kDecodePlanCtasPerSm = 0;

/// Cascade: splits per segment the level heuristic (`plan::choose_chunk`) may choose, at most.
inline constexpr int kCascadeMaxLevelSplits = 64;
/// Cascade: a 16-row level tile runs 3 `cp.async` stages when its splits hold at least this many
/// 64-key tiles (a long unique suffix), else 2 (more CTAs per SM).
inline constexpr int kCascadeDeepStagesTiles = 8;
/// Cascade: above this head dim, a level the warp-specialised kernel runs takes row tiles of at
/// most `kCascadeWsWideTileRows` (its deeper ring of smaller tiles outruns the 128-row tile).
inline constexpr std::int64_t kCascadeWsWideHeadDim = 128;
inline constexpr int kCascadeWsWideTileRows = 64;
/// Cascade: shared levels this long or shorter (keys) are latency-bound: they leave SMs to a
/// decode last level (`CascadeTuning::decode_sms` automatic).
inline constexpr std::int64_t kCascadeReserveMaxSharedKeys = 8192;
/// Cascade: resident decode CTAs per SM assumed when reserving SMs for a decode last level.
inline constexpr std::int64_t kCascadeReserveDecodeCtasPerSm = 2;
/// Cascade: a decode last level of at most this many waves (of `kCascadeReserveDecodeCtasPerSm`
/// CTAs on every SM) folds the shared levels' states (`CascadeTuning::decode_fold` automatic).
inline constexpr std::int64_t kCascadeFoldMaxDecodeWaves = 2;

/// MLA decode, `MlaDecodeKernel::kAuto` on a wgmma device: requests of at most this many rows
/// (heads × q_len) take the one-CTA narrow kernel over a bf16 latent cache (since its consumer
/// runs in order, faster than the two-CTA kernel on every measured row but batch 1 × 4k:
/// bench/RESULTS.md, session 30), and over an fp8 cache the two-CTA narrow kernel where its
/// automatic layout cuts no request into splits shorter than `plan::kMlaNarrow2MinSplitKeys`
/// (two producers an SM: the fp8 conversion is the producer's); more rows (at 32 the narrow
/// kernels' tensor work per key doubles) and the other fp8 cases take the 64-row wgmma kernel.
inline constexpr std::int64_t kMlaNarrowAutoRows = 16;
/// MLA decode, `MlaDecodeKernel::kAuto` on a wgmma device: requests of at least this many rows
/// of a bf16 latent cache (a 64-row tile's tensor work does not depend on how many of its rows
/// are real, and the balanced kernel spreads it over both consumer warpgroups; measured from 32
/// rows) take the balanced wgmma kernel; fp8 caches keep the wgmma kernel (the balanced one
/// measured slower there: its two warpgroups' scores wait on the producer's conversion). See
/// bench/RESULTS.md, sessions 28 and 29.
inline constexpr std::int64_t kMlaBalancedAutoRows = 32;

}  // namespace tuning
}  // namespace cuda
}  // namespace attnstate
