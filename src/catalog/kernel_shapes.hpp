/// @file catalog/kernel_shapes.hpp
/// @brief The attention kernels' compile-time shapes (tiles, warps, pipeline depths, cluster
///        limits, shared-memory sizes), the one source read by the kernels, by the planners'
///        facts and by the tests. Plain C++ (no CUDA header); the functions run on the host and
///        in kernels.
///
/// The tuning constants (which shape a plan picks) live apart, in `plan/tuning_sm90.hpp`; what
/// is compiled and what each kernel takes is the catalog (`catalog/catalog.hpp`).
#pragma once

#include <cstdint>

#include "attnstate/core/config.hpp"
#include "attnstate/core/decode_split.hpp"

namespace attnstate {
namespace catalog {

// ---- split-KV decode (cuda/kernels/decode/split_kv.cuh) ----

/// Query rows of one CTA tile (the M of the tensor-core MMAs).
inline constexpr int kDecodeTileRows = 16;
/// Warps per CTA (each streams its own 16-token tiles of the split).
inline constexpr int kDecodeWarps = 4;
/// cp.async pipeline depth per warp.
inline constexpr int kDecodeStages = 3;
/// Pipeline depth of the short-split configuration (head dim `kDecodeShortHeadDim`): less shared
/// memory, so one more CTA per SM overlaps the fixed costs of CTAs that stream only a few tiles
/// (used when the grid exceeds one wave, or when only it keeps every cluster resident). The
/// warps take the same tiles in both configurations, so results are bitwise the same.
inline constexpr int kDecodeShortStages = 2;
/// The head dim of the short-split configuration's instances (the only one).
inline constexpr int kDecodeShortHeadDim = 128;
/// Splits of at most this many tokens run in the short-split configuration (0 disables it).
inline constexpr std::int32_t kDecodeShortTokens = 256;
/// Keys a warp takes per step in the paired configuration (fp8 caches): two of its 16-key tiles,
/// whose score and `P V` chains it runs side by side, with one online-softmax update for both.
/// An fp8 tile is half the bytes of a 16-bit one, so its dependent chain (copy wait, fragment
/// loads, conversions, MMAs, softmax) is twice as long per byte: two independent ones per warp
/// hide its latency. Only `DecodeOptions::split_stages` selects it (the automatic plan does not).
inline constexpr int kDecodePairKeys = 2 * kDecodeTileRows;
/// Ring depths (16-key tiles per warp, an even count: whole steps) of the paired configuration:
/// two steps (three CTAs per SM at its head dim), and three (two CTAs per SM).
inline constexpr int kDecodePairStages = 4;
inline constexpr int kDecodePairDeepStages = 6;
/// The head dim of the paired configuration's instances (the only one).
inline constexpr int kDecodePairHeadDim = 128;
/// Largest split count merged inside a thread-block cluster through distributed shared memory
/// (no workspace round trip, no ticket); more splits merge through the workspace. 1 disables the
/// cluster merge; at most 8 (the portable cluster size).
inline constexpr int kDecodeMaxCluster = 8;
static_assert(kDecodeMaxCluster >= 1 && kDecodeMaxCluster <= 8, "portable cluster sizes only");
/// Largest cluster group size the kernel supports (the portable cluster size).
inline constexpr int kDecodeMaxWsGroup = 8;
/// Largest group of consecutive splits that share a cluster in the workspace merge (more splits
/// than a cluster merges whole); 1 disables the groups; at most `kDecodeMaxWsGroup`.
inline constexpr int kDecodeWsGroup = 8;
static_assert(kDecodeWsGroup >= 1 && kDecodeWsGroup <= kDecodeMaxWsGroup, "portable sizes");
/// Shared memory of one SM available to resident CTAs (sm_90), bytes; and what the runtime
/// reserves per CTA.
inline constexpr std::int64_t kDecodeSmemPerSm = 228 * 1024;
inline constexpr std::int64_t kDecodeSmemReservedPerCta = 1024;

/// Row stride (floats) of the per-warp output scratch of the warp merge: padded so that the
/// fragment stores of 8 rows hit distinct banks.
ATTNSTATE_HOST_DEVICE constexpr int decode_ow_stride(int D) { return D + 8; }

/// Bytes of the region after the queries: the pipeline (K/V elements of `kv_bytes` bytes: 2, or
/// 1 for fp8), aliased after the main loop by the warp-merge scratch and the published split
/// state, or by the splits' LSEs (then weights) and the merged columns (at its end) of the
/// workspace merge.
ATTNSTATE_HOST_DEVICE constexpr std::int64_t decode_body_bytes(int D, int stages,
                                                               int kv_bytes = 2) {
  const std::int64_t pipe =
      std::int64_t{kDecodeWarps} * stages * 2 * kDecodeTileRows * D * kv_bytes;
  const std::int64_t merge =
      std::int64_t{kDecodeWarps} * kDecodeTileRows * decode_ow_stride(D) * 4 +
      2 * kDecodeWarps * kDecodeTileRows * 4 + std::int64_t{kDecodeTileRows} * (D + 1) * 4;
  // over fp8 the pipeline is smaller than the workspace merge's LSEs of every split and its
  // merged columns, which the body must hold too (16-bit pipelines are larger)
  const std::int64_t ws_merge = kv_bytes == 1 ? std::int64_t{kMaxSplits} * kDecodeTileRows * 4 +
                                                    kDecodeTileRows * (D / 4) * 24
                                              : 0;
  const std::int64_t body = pipe > merge ? pipe : merge;
  return body > ws_merge ? body : ws_merge;
}

/// Shared-memory bytes of the decode kernel for head dim `D`, pipeline depth `stages` and K/V
/// elements of `kv_bytes` bytes: queries, body, the merge flags (one per CTA of a cluster group),
/// then, over an fp8 cache, the query rows' score factors.
ATTNSTATE_HOST_DEVICE constexpr std::int64_t decode_smem_bytes(int D, int stages,
                                                               int kv_bytes = 2) {
  return std::int64_t{kDecodeTileRows} * D * 2 + decode_body_bytes(D, stages, kv_bytes) +
         4 * kDecodeMaxWsGroup + (kv_bytes == 1 ? 4 * kDecodeTileRows : 0);
}

/// Resident CTAs per SM of the decode kernel (shared memory bound; the kernel's launch bounds ask
/// the compiler to fit its registers to the same count).
ATTNSTATE_HOST_DEVICE constexpr int decode_ctas_per_sm(int D, int stages, int kv_bytes = 2) {
  const std::int64_t by_smem =
      kDecodeSmemPerSm / (decode_smem_bytes(D, stages, kv_bytes) + kDecodeSmemReservedPerCta);
  const std::int64_t by_threads = 2048 / (kDecodeWarps * 32);
  const std::int64_t n = by_smem < by_threads ? by_smem : by_threads;
  return n < 1 ? 1 : static_cast<int>(n);
}

// ---- streamed decode (cuda/kernels/decode/stream.cuh) ----

/// Warps per CTA (one CTA per SM) of the streamed kernel (chosen on the H200: bench/RESULTS.md).
inline constexpr int kDecodeStreamWarps = 8;
/// Ring depth (16-token K/V tiles per warp) of the streamed kernel.
inline constexpr int kDecodeStreamStages = 3;

/// Warps per CTA of the streamed kernel for head dim `D` (64 or 128).
ATTNSTATE_HOST_DEVICE constexpr int stream_warps(int D) { return D > 0 ? kDecodeStreamWarps : 0; }
/// Shared-memory bytes of one CTA of the streamed kernel: each warp's ring of K/V tiles.
ATTNSTATE_HOST_DEVICE constexpr std::int64_t stream_smem_bytes(int D) {
  return std::int64_t{stream_warps(D)} * kDecodeStreamStages * 2 * kDecodeTileRows * D * 2;
}

// ---- cascade levels (cuda/kernels/cascade/level*.cuh) ----

/// Keys per KV tile of the cp.async level kernels (`CascadeTile::BN`, `CascadeWgmmaTile::BN`):
/// the granule of a level's splits.
inline constexpr int kCascadeKvTile = 64;
/// Keys per KV tile of the warp-specialised kernel's default variant (the 64-key variants use
/// `kCascadeKvTile`).
inline constexpr int kCascadeWsKvTile = 128;
/// Warps of the mma.sync level tile of `rows` query rows that split each KV tile's keys: the
/// 16-row tile's four warps share its rows (16 keys each); a taller tile gives each warp 16 rows
/// of its own and every key.
ATTNSTATE_HOST_DEVICE constexpr int cascade_mma_key_warps(int rows) { return rows <= 16 ? 4 : 1; }
/// Warps of the cascade merge kernel's CTA (one row per warp).
inline constexpr int kCascadeMergeWarps = 4;

// ---- merges (cuda/kernels/merge/) ----

/// Elements of a chunk of a row of `o`, the unit every merge kernel loads and stores
/// (`cuda/tile/vec.cuh`: `kChunk`): 16 bytes of a 16-bit dtype.
inline constexpr int kMergeChunk = 8;
/// Threads per block of the grid-stride merge kernels (fewer when the problem does not fill the
/// GPU: halved down to `kMergeMinBlock`).
inline constexpr int kMergeBlock = 256;
/// Smallest block of the grid-stride merge kernels.
inline constexpr int kMergeMinBlock = 64;
/// Chunks per thread of the whole-row pairwise kernel's instances, in the order the pairwise
/// merge prefers them: rows of `2^k · 2` or `2^k · 3` chunks (head dims 16 · 2^k, 24 · 2^k).
inline constexpr int kMergeWholeChunks[] = {2, 3};
/// Threads per block of the few-states kernel, and the most states it merges (one instance per
/// state count).
inline constexpr int kMergeFewBlock = 256;
inline constexpr int kMergeFewMaxStates = 4;
/// Chunks per thread of the few-states instance of `states` states: two up to two states (half
/// the per-row work per byte), one above.
ATTNSTATE_HOST_DEVICE constexpr int merge_few_chunks(int states) { return states <= 2 ? 2 : 1; }
/// Threads per block of the ring kernel and its most chunks per thread (a row of fewer chunks
/// than the shape asks takes one a thread).
inline constexpr int kMergeRingThreads = 128;
inline constexpr int kMergeRingChunks = 2;
/// LSE slots per lane of a row's LSE work in the ring and odd-row kernels, and the most states
/// either merges.
inline constexpr int kMergeLsePerLane = 4;
inline constexpr int kMergeRingMaxStates = 64;
/// Most threads per block of the odd-row kernel (its launch picks 32, 64 or this) and its chunks
/// per thread (the head dims of `compiled::MergeOddHeadDims` are rows of 3 chunks a thread).
inline constexpr int kMergeOddThreads = 128;
inline constexpr int kMergeOddChunks = 3;

/// Lanes sharing a row's LSE work in the n-ary merges at head dim `head_dim` (>= 1): its chunks
/// rounded up to a power of two, at most a warp.
ATTNSTATE_HOST_DEVICE constexpr int merge_lanes(std::int64_t head_dim) {
  const std::int64_t per_row = (head_dim + kMergeChunk - 1) / kMergeChunk;
  int lanes = 1;
  while (lanes < per_row && lanes < 32) lanes *= 2;
  return lanes;
}
/// Most states the ring and odd-row kernels merge at head dim `head_dim`: the row's LSE slots,
/// at most `kMergeRingMaxStates`.
ATTNSTATE_HOST_DEVICE constexpr int merge_slot_states(std::int64_t head_dim) {
  const int slots = merge_lanes(head_dim) * kMergeLsePerLane;
  return slots < kMergeRingMaxStates ? slots : kMergeRingMaxStates;
}

// ---- MLA decode (cuda/kernels/mla/) ----

/// Query rows (heads × new tokens of one request) of one MLA CTA tile: four groups of 16 rows.
inline constexpr int kMlaTileRows = 64;
/// Latent tokens per K/V tile of the MLA decode (one cp.async stage).
inline constexpr int kMlaTileKeys = 32;
/// cp.async stages of the MLA decode (double buffer).
inline constexpr int kMlaStages = 2;
/// Warps per MLA CTA: 4 row groups × 2 halves of the latent columns.
inline constexpr int kMlaWarps = 8;
/// Latent width the MLA kernels are compiled for (values and the first part of the keys).
inline constexpr int kMlaLoraRank = 512;
/// Rotary width the MLA kernels are compiled for (the last part of the keys).
inline constexpr int kMlaRopeDim = 64;
/// The catalog's head dim of an MLA row: the key width `kMlaLoraRank + kMlaRopeDim`.
inline constexpr int kMlaHeadDim = kMlaLoraRank + kMlaRopeDim;
/// Bytes of the MLA kernel's dynamic shared memory: the query tile and the two K/V stages (bf16,
/// rows of `kMlaHeadDim`), over an fp8 cache two stages of the stored bytes besides, the score
/// exchange of the row groups (fp32) and the rows' LSEs; the epilogue's normalised `o` tile
/// (fp32, `kMlaTileRows × kMlaLoraRank`) reuses the query tile and the stages.
ATTNSTATE_HOST_DEVICE constexpr std::int64_t mla_smem_bytes(bool fp8) {
  return std::int64_t{kMlaTileRows} * kMlaHeadDim * 2 +
         std::int64_t{kMlaStages} * kMlaTileKeys * kMlaHeadDim * 2 +
         (fp8 ? std::int64_t{kMlaStages} * kMlaTileKeys * kMlaHeadDim : 0) +
         std::int64_t{kMlaTileRows} * kMlaTileKeys * 4 + kMlaTileRows * 4 + 16;
}
static_assert(std::int64_t{kMlaTileRows} * kMlaLoraRank * 4 <=
                  std::int64_t{kMlaTileRows} * kMlaHeadDim * 2 +
                      std::int64_t{kMlaStages} * kMlaTileKeys * kMlaHeadDim * 2,
              "the epilogue's o tile fits in the query tile and the stages");
static_assert(mla_smem_bytes(true) <= 227 * 1024, "within an sm_90 CTA's shared memory");

// ---- MLA decode on Hopper wgmma (cuda/kernels/mla/mla_decode_ws.cuh) ----

/// Latent tokens per K/V tile of the wgmma MLA decode (one stage of its ring).
inline constexpr int kMlaWsTileKeys = 64;
/// Stages of its K/V ring.
inline constexpr int kMlaWsStages = 2;
/// Warps per CTA: two consumer warpgroups (the scores and one half of the latent columns; the
/// other half) and one producer warpgroup (the copies, fp8 conversions).
inline constexpr int kMlaWsWarps = 12;
/// Bytes of its dynamic shared memory: 1 KiB of alignment slack (the 128-byte swizzle's atoms),
/// the query tile and the K/V stages (bf16, `kMlaHeadDim` columns), the probabilities (bf16,
/// `kMlaTileRows × kMlaWsTileKeys`), the rows' rescale factors and LSEs (fp32), the stages'
/// "full" and "empty" mbarriers and the ticket flag; the epilogue's normalised `o` tile reuses
/// the query tile and the stages. fp8 caches are converted by the producer on their way in
/// (no staging).
ATTNSTATE_HOST_DEVICE constexpr std::int64_t mla_ws_smem_bytes() {
  return 1024 + std::int64_t{kMlaTileRows} * kMlaHeadDim * 2 +
         std::int64_t{kMlaWsStages} * kMlaWsTileKeys * kMlaHeadDim * 2 +
         std::int64_t{kMlaTileRows} * kMlaWsTileKeys * 2 + 2 * kMlaTileRows * 4 +
         2 * kMlaWsStages * 8 + 16;
}
static_assert(mla_ws_smem_bytes() <= 232448, "within an sm_90 CTA's shared memory");
/// Bytes of the dynamic shared memory of the balanced wgmma MLA decode (both consumer warpgroups
/// compute scores, each of half of a tile's keys): the wgmma kernel's, then the rows' block maxima
/// the two exchange (fp32, 2 warpgroups × `kMlaTileRows`).
ATTNSTATE_HOST_DEVICE constexpr std::int64_t mla_ws_balanced_smem_bytes() {
  return mla_ws_smem_bytes() + 2 * kMlaTileRows * 4;
}
static_assert(mla_ws_balanced_smem_bytes() <= 232448, "within an sm_90 CTA's shared memory");

// ---- the narrow MLA decode on Hopper wgmma (cuda/kernels/mla/mla_decode_narrow.cuh) ----

/// Most query rows of a request the narrow MLA decode takes (`heads · q_len`): its products are
/// transposed (`Sᵀ = K Qᵀ`, `Oᵀ = Vᵀ Pᵀ`: 64 keys or 64 latent columns the wgmma's M, the rows
/// its N of 16 or 32).
inline constexpr int kMlaNarrowRows = 32;
/// Warps per CTA: one consumer warpgroup (scores, softmax, all 512 output columns) and the
/// producer warpgroup of the wgmma kernel (its ring of `kMlaWsTileKeys`-key tiles).
inline constexpr int kMlaNarrowWarps = 8;
/// Bytes of its dynamic shared memory: the wgmma kernel's (its probabilities' buffer holds the
/// `kMlaNarrowRows` rows'), then the rows' partial maxima and sums the consumer's four
/// warps exchange (fp32, 4 warps × `kMlaNarrowRows`).
ATTNSTATE_HOST_DEVICE constexpr std::int64_t mla_narrow_smem_bytes() {
  return mla_ws_smem_bytes() + 4 * kMlaNarrowRows * 4;
}
static_assert(mla_narrow_smem_bytes() <= 232448, "within an sm_90 CTA's shared memory");
static_assert(kMlaNarrowRows <= kMlaTileRows, "the probabilities within the wgmma kernel's buffer");

// ---- the two-CTA narrow MLA decode (cuda/kernels/mla/mla_decode_narrow2.cuh) ----

/// Stages of the two-CTA narrow configuration's ring of `kMlaWsTileKeys`-key tiles (the M of
/// `Sᵀ = K Qᵀ` is the 64 keys of a tile, so a stage cannot be smaller): one, so that two CTAs
/// fit an SM and one CTA's copies stream while the other computes or runs its fixed costs.
inline constexpr int kMlaNarrow2Stages = 1;
/// Resident CTAs per SM the two-CTA narrow configuration is sized for.
inline constexpr int kMlaNarrow2CtasPerSm = 2;
/// Bytes of its carve-up (1024-aligned base): the query tile of `kMlaNarrowRows` rows (bf16,
/// `kMlaHeadDim` columns), the ring, one probability tile (bf16, `kMlaNarrowRows` ×
/// `kMlaWsTileKeys`), the rows' exchange (fp32, 4 warps × `kMlaNarrowRows`) and LSEs, the
/// stages' "full" and "empty" mbarriers and the ticket flag; the epilogue's normalised `o`
/// (fp32, `kMlaNarrowRows × kMlaLoraRank`) reuses the query tile and the ring.
ATTNSTATE_HOST_DEVICE constexpr std::int64_t mla_narrow2_carve_bytes() {
  return std::int64_t{kMlaNarrowRows} * kMlaHeadDim * 2 +
         std::int64_t{kMlaNarrow2Stages} * kMlaWsTileKeys * kMlaHeadDim * 2 +
         std::int64_t{kMlaNarrowRows} * kMlaWsTileKeys * 2 + 4 * kMlaNarrowRows * 4 +
         kMlaNarrowRows * 4 + 2 * kMlaNarrow2Stages * 8 + 16;
}
/// Bytes of its dynamic shared memory: the carve-up rounded up to 1 KiB (the slack lets a base
/// that is not 1024-aligned be aligned up, where it is small enough; the kernel checks).
ATTNSTATE_HOST_DEVICE constexpr std::int64_t mla_narrow2_smem_bytes() {
  return (mla_narrow2_carve_bytes() + 1023) / 1024 * 1024;
}
static_assert(kMlaNarrow2CtasPerSm * (mla_narrow2_smem_bytes() + kDecodeSmemReservedPerCta) <=
                  kDecodeSmemPerSm,
              "two CTAs of the two-CTA narrow configuration per sm_90 SM");
static_assert(std::int64_t{kMlaNarrowRows} * kMlaLoraRank * 4 <=
                  std::int64_t{kMlaNarrowRows} * kMlaHeadDim * 2 +
                      std::int64_t{kMlaNarrow2Stages} * kMlaWsTileKeys * kMlaHeadDim * 2,
              "the epilogue's o rows fit in the query tile and the ring");

}  // namespace catalog
}  // namespace attnstate
