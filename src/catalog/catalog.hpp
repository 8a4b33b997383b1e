/// @file catalog/catalog.hpp
/// @brief The catalog of compiled kernels: one row per kernel instance (family, head dim, dtypes,
///        the variants it takes, pipeline depth, tile, CTAs per SM, run-time needs, fallback),
///        expanded at compile time from a few groups over the build's head dims
///        (`common/compiled.hpp`, `ATTNSTATE_CUDA_HEAD_DIMS`): the attention kernels and the
///        merges (`merge_state`, `merge_states`, `rebase`, ...). Plain C++ (no CUDA header).
///
/// The planners and the checks ask it what is compiled (`find`, `compiled`) and name what it
/// holds when a request is outside it (`not_supported_message`); the tests and
/// `docs/catalog.md` read their lists from it. Each row is an instance the launchers of
/// `src/cuda/` compile from the same lists of `common/compiled.hpp` (the catalog tests check the
/// counts).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "catalog/kernel_shapes.hpp"
#include "common/compiled.hpp"

namespace attnstate {
namespace catalog {

/// A kernel family: one `__global__` template and its launcher.
enum class Family : std::uint8_t {
  kDecodeSplit = 0,   ///< `decode_split_kv_kernel`: one CTA per (request, KV head, tile, split).
  kDecodeStream = 1,  ///< `decode_stream_kernel`: single-split plans, warps stream whole items.
  kCascadeMma = 2,    ///< `cascade_level_kernel`: cp.async + mma.sync level tiles.
  kCascadeWgmma = 3,  ///< `cascade_level_wgmma_kernel`: cp.async + Hopper wgmma level tiles.
  kCascadeWs = 4,     ///< `cascade_level_ws_kernel`: bulk tensor copies + wgmma, warp-specialised.
  kCascadeMerge = 5,  ///< `cascade_merge_kernel`: every level's and split's state into `out`.
  // The merges (cuda/kernels/merge/). Head dim 0: the kernel is not specialised on the head dim
  // (it takes any head dim >= 1 that its needs allow). `q` and `kv` are the inputs' dtypes (the
  // pairwise merge: `a` and `b`; the others: the one input), `tile_rows` the threads of a CTA
  // (at most: the grid-stride launches halve it for small problems), `chunks` the chunks of 8
  // elements a thread merges (0: as many as the head dim asks), `states` the most states.
  kMergePair = 6,        ///< `merge_pair_kernel`: `merge_state(_inplace)`, any row.
  kMergePairWhole = 7,   ///< `merge_pair_whole_kernel`: rows of whole chunks, no idle lane.
  kMergePairStream = 8,  ///< `merge_pair_whole_kernel` streaming its inputs past L1 (fp8 out).
  kMergeStack = 9,       ///< `merge_stack_kernel`: `merge_states`, any stack.
  kMergeFew = 10,        ///< `merge_few_kernel`: `merge_states` of a few states.
  kMergeRing = 11,       ///< `merge_ring_kernel`: `merge_states` through shared-memory rings.
  kMergeOdd = 12,        ///< `merge_odd_kernel`: `merge_states`, rows not a power of two.
  kMergeRagged = 13,     ///< `merge_ragged_kernel`: `merge_states_ragged`.
  kMergeRebase = 14,     ///< `rebase_kernel`: `rebase`.
  kMergeMarkEmpty = 15,  ///< `mark_empty_rows_kernel`: `mark_empty_rows` (LSEs only).
  /// `mla_decode_kernel`: MLA decode, one CTA per (request, tile of 64 rows, split); head dim
  /// `kMlaHeadDim` (the key width), `kv` the latent part's dtype.
  kMlaDecode = 16,
  /// `mla_cascade_level_kernel`: one MLA cascade level, one CTA per (segment, tile of 64 rows of
  /// the segment's requests, split), fp32 partial states into the workspace (merged after by
  /// the n-ary merge); head dim `kMlaHeadDim`, `kv` the latent part's dtype, `out` fp32.
  kMlaCascade = 17,
  /// `mla_decode_ws_kernel`: the MLA decode on Hopper `wgmma`, warp-specialised (a producer
  /// warpgroup, two consumers), one CTA per (request, tile of 64 rows, split), 64-key tiles; head
  /// dim `kMlaHeadDim`, `kv` the latent part's dtype; on devices without `wgmma`, `kMlaDecode`.
  kMlaDecodeWs = 18,
  /// `mla_decode_narrow_kernel`: the MLA decode on Hopper `wgmma` for requests of at most
  /// `kMlaNarrowRows` query rows (`heads · q_len`), the products transposed (the keys the wgmma's
  /// M, the rows its N), one CTA per (request, split), 64-key tiles; head dim `kMlaHeadDim`, `kv`
  /// the latent part's dtype; on devices without `wgmma`, `kMlaDecode`.
  kMlaDecodeNarrow = 19,
  /// `mla_decode_narrow2_kernel`: the narrow MLA decode sized for two CTAs per SM (a query tile
  /// of `kMlaNarrowRows` rows, a ring of `kMlaNarrow2Stages` 64-key tile), so that one CTA's
  /// fixed costs and compute overlap the other's copies; the same requests, dtypes and
  /// variants as `kMlaDecodeNarrow`; on devices without `wgmma`, `kMlaDecode`.
  kMlaDecodeNarrow2 = 20,
  /// `mla_decode_ws_balanced_kernel`: `kMlaDecodeWs` with its two consumer warpgroups balanced
  /// (each computes the scores of half of every tile's keys, then `P V` over its columns); the
  /// same CTAs, tiles, dtypes and variants; on devices without `wgmma`, `kMlaDecode`.
  kMlaDecodeWsBalanced = 21,
};
/// Number of families.
inline constexpr int kFamilies = 22;

/// True for the merges' families.
constexpr bool is_merge(Family f) { return static_cast<int>(f) >= 6 && static_cast<int>(f) <= 15; }

/// Variants a kernel takes (a bit set).
using Variants = std::uint8_t;
inline constexpr Variants kPlain = 0;         ///< Plain attention (every kernel).
inline constexpr Variants kWindow = 1;        ///< A sliding window (`window_left`).
inline constexpr Variants kSoftCap = 2;       ///< A logits soft cap.
inline constexpr Variants kSinks = 4;         ///< Attention sinks merged into the output.
inline constexpr Variants kPriorStates = 8;   ///< Prior states folded in (a cascade's levels).
inline constexpr Variants kAllVariants = 15;  ///< Every variant bit.

/// What a kernel needs besides its arguments' shapes (a bit set). The plan-time needs decide
/// whether a plan takes the kernel; the run-time ones are checked when it runs, and a run that
/// lacks one takes the row's fallback.
using Needs = std::uint16_t;
inline constexpr Needs kNeedsNothing = 0;
inline constexpr Needs kNeedsWgmma = 1;          ///< Plan time: sm_90 running sm_90a code.
inline constexpr Needs kNeedsTensorMaps = 2;     ///< Plan time: the driver encodes tensor maps.
inline constexpr Needs kNeedsTmaBox = 4;         ///< Plan time: a page size with a bulk-copy box.
inline constexpr Needs kNeedsOneSplit = 8;       ///< Plan time: one split per request.
inline constexpr Needs kNeedsPoolMap = 16;       ///< Run time: the pool fits a tensor map.
inline constexpr Needs kNeedsAlignedQ = 32;      ///< Run time: 16-byte aligned query rows.
inline constexpr Needs kNeedsPageTileKeys = 64;  ///< Run time: page sizes of whole key tiles.
// The merges' needs, all checked at run time (a merge has no plan).
inline constexpr Needs kNeedsChunkedRows = 128;  ///< Rows of whole chunks, vector-aligned views.
inline constexpr Needs kNeedsWholeSplit = 256;   ///< Rows of 2^k threads of `chunks` chunks each.
inline constexpr Needs kNeedsDistinctOut = 512;  ///< An output that aliases no input.
inline constexpr Needs kNeedsFullGrid = 1024;    ///< At least a block of work per SM.
inline constexpr Needs kNeedsSmemFit = 2048;     ///< Its shared memory granted on the device.
inline constexpr Needs kNeedsMultiChunk = 4096;  ///< Rows of more than one chunk.

/// A set of dtypes (bit `1 << dtype`).
using DTypeMask = std::uint8_t;
/// The mask of one dtype (0 for a value that is no dtype).
constexpr DTypeMask mask(DType dt) {
  return static_cast<int>(dt) < 8 ? static_cast<DTypeMask>(1u << static_cast<int>(dt)) : 0;
}
/// Every dtype.
inline constexpr DTypeMask kAnyDType = 0x1F;
/// The 16-bit float dtypes and f32 (the outputs of the state stores).
inline constexpr DTypeMask kStateDTypes = 0x07;

/// One compiled kernel instance.
struct Row {
  Family family = Family::kDecodeSplit;
  int head_dim = 0;
  DType q = DType::kF32;   ///< The queries' dtype (the partial states' f32 for the merge).
  DType kv = DType::kF32;  ///< The K/V dtype (the partial states' f32 for the merge).
  DTypeMask out = 0;       ///< Output dtypes it writes (chosen at run time when several).
  Variants variants = 0;   ///< Variants it takes (beyond plain attention).
  int stages = 0;          ///< Pipeline depth (0: none).
  int tile_rows = 0;       ///< Query rows of a CTA tile (the merge: rows per CTA).
  int tile_keys = 0;       ///< Keys per K/V tile (the paired decode: a warp's step; 0: none).
  /// Resident CTAs per SM the kernel is built for (the register budget its launch bounds give
  /// each thread), which the planners size their grids by; 0: set by its shared memory (the
  /// decode: `decode_ctas_per_sm`) or none (the merge).
  int ctas_per_sm = 0;
  int kv_align = 0;  ///< Bytes the K/V pointers and page strides are multiples of.
  Needs needs = 0;   ///< What it needs at plan or run time.
  Family fallback = Family::kDecodeSplit;  ///< Taken when a need fails (itself: none).
  int chunks = 0;  ///< The merges: chunks of 8 elements a thread merges (0: as the row asks).
  int states = 0;  ///< The merges: most states it merges (0: any number).
};

/// One pipeline configuration of a group (a row per head dim × dtype combination).
struct Tile {
  int rows = 0, keys = 0, stages = 0;
  int ctas = 0;    ///< `Row::ctas_per_sm`.
  int chunks = 0;  ///< `Row::chunks`.
  int states = 0;  ///< `Row::states`.
};

/// A group of rows: the kernels of a family compiled for every head dim of a list × every dtype
/// combination × every tile, with the same variants, needs and fallback.
struct Group {
  Family family = Family::kDecodeSplit;
  int head_dims[8] = {};  ///< The family's compiled head dims (the build's list applied).
  int num_head_dims = 0;
  DTypeMask q = 0;   ///< Query dtypes.
  DTypeMask kv = 0;  ///< K/V dtypes; 0: the queries' dtype.
  DTypeMask out = 0;
  bool row_per_out = false;  ///< One instance per output dtype (else one writing any of `out`).
  Variants variants = 0;
  Tile tiles[4] = {};
  int num_tiles = 0;
  int kv_align = 16;
  Needs needs = 0;
  Family fallback = Family::kDecodeSplit;
  bool out_is_q = false;  ///< The output's dtype is the queries' (one row each; `out` unused).
  /// The most states are the row's LSE slots at its head dim (`merge_slot_states`) where fewer
  /// than the tile's.
  bool states_by_slots = false;
};

namespace detail {

/// A compile-time head-dim list as the group's array.
template <int... V>
constexpr Group with_dims(Group g, compiled::IntList<V...>) {
  const int dims[] = {0, V...};
  for (int i = 0; i < static_cast<int>(sizeof...(V)); ++i) g.head_dims[i] = dims[i + 1];
  g.num_head_dims = static_cast<int>(sizeof...(V));
  return g;
}

constexpr Group group(Family f, DTypeMask q, DTypeMask kv, DTypeMask out, bool row_per_out,
                      Variants v, Needs needs, Family fallback) {
  Group g;
  g.family = f;
  g.q = q;
  g.kv = kv;
  g.out = out;
  g.row_per_out = row_per_out;
  g.variants = v;
  g.needs = needs;
  g.fallback = fallback;
  return g;
}

constexpr Group tiles(Group g, Tile a, Tile b = {}, Tile c = {}, Tile d = {}) {
  const Tile all[4] = {a, b, c, d};
  g.num_tiles = 0;
  for (const Tile& t : all)
    if (t.rows > 0) g.tiles[g.num_tiles++] = t;
  return g;
}

inline constexpr DTypeMask k16Bit = mask(DType::kF16) | mask(DType::kBF16);
inline constexpr DTypeMask kFp8 = mask(DType::kE4M3) | mask(DType::kE5M2);
inline constexpr Tile kDecodeTile{kDecodeTileRows, kDecodeTileRows, kDecodeStages};
inline constexpr Tile kDecodeShortTile{kDecodeTileRows, kDecodeTileRows, kDecodeShortStages};
// The paired configuration (fp8): 32 keys a warp's step, rings of two and of three steps.
inline constexpr Tile kDecodePairTile{kDecodeTileRows, kDecodePairKeys, kDecodePairStages};
inline constexpr Tile kDecodePairDeepTile{kDecodeTileRows, kDecodePairKeys, kDecodePairDeepStages};
inline constexpr Tile kStreamTile{kDecodeTileRows, kDecodeTileRows, kDecodeStreamStages};
// The cascade level tiles (rows, keys, stages, CTAs per SM). mma.sync: 16 rows at 3 stages
// (two CTAs per SM) or 2 (four: more CTAs for short splits), 64 rows (two) and 128 (one);
// wgmma: 64 rows (two) and 128 (one, with room for a 16-row CTA beside it); warp-specialised:
// one CTA per SM, 128-key tiles at 3 stages or 64-key tiles at 4; at head dim 256 (K/V tiles
// of 32 KiB) 64-key tiles only, at 3 stages for 64 rows and 2 for 128.
inline constexpr Tile kMma16{16, kCascadeKvTile, 3, 2};
inline constexpr Tile kMma16Short{16, kCascadeKvTile, 2, 4};
inline constexpr Tile kMma64{64, kCascadeKvTile, 3, 2};
inline constexpr Tile kMma128{128, kCascadeKvTile, 3, 1};
inline constexpr Tile kMmaWide16{16, kCascadeKvTile, 2, 1};
inline constexpr Tile kMmaWide64{64, kCascadeKvTile, 2, 1};
inline constexpr Tile kMmaWide128{128, kCascadeKvTile, 2, 1};
inline constexpr Tile kWgmma64{64, kCascadeKvTile, 3, 2};
inline constexpr Tile kWgmma128{128, kCascadeKvTile, 3, 1};
inline constexpr Tile kWs64{64, kCascadeWsKvTile, 3, 1};
inline constexpr Tile kWs128{128, kCascadeWsKvTile, 3, 1};
inline constexpr Tile kWs64Kv64{64, kCascadeKvTile, 4, 1};
inline constexpr Tile kWs128Kv64{128, kCascadeKvTile, 4, 1};
inline constexpr Tile kWsWide64Kv64{64, kCascadeKvTile, 3, 1};
inline constexpr Tile kWsFp8x64{64, kCascadeWsKvTile, 2, 1};
inline constexpr Tile kWsFp8x128{128, kCascadeWsKvTile, 2, 1};
inline constexpr Tile kWsWide128Kv64{128, kCascadeKvTile, 2, 1};
// The MLA decode: 64 rows, 32-key tiles, double buffer (CTAs per SM set by its shared memory:
// one).
inline constexpr Tile kMlaTile{kMlaTileRows, kMlaTileKeys, kMlaStages, 0};
// The wgmma MLA decode: 64 rows, 64-key tiles, two stages (CTAs per SM set by its shared
// memory: one).
inline constexpr Tile kMlaWsTile{kMlaTileRows, kMlaWsTileKeys, kMlaWsStages, 0};
// The narrow wgmma MLA decode: at most 32 rows, the wgmma kernel's ring (one CTA per SM).
inline constexpr Tile kMlaNarrowTile{kMlaNarrowRows, kMlaWsTileKeys, kMlaWsStages, 0};
// The two-CTA narrow wgmma MLA decode: at most 32 rows, a one-stage ring (two CTAs per SM).
inline constexpr Tile kMlaNarrow2Tile{kMlaNarrowRows, kMlaWsTileKeys, kMlaNarrow2Stages,
                                      kMlaNarrow2CtasPerSm};
using ShortHeadDims =
    compiled::Intersect<compiled::DecodeHeadDims, compiled::IntList<kDecodeShortHeadDim>>::type;
using ShortFp8HeadDims =
    compiled::Intersect<compiled::DecodeFp8HeadDims, compiled::IntList<kDecodeShortHeadDim>>::type;
using ShortFp8VariantHeadDims = compiled::Intersect<compiled::DecodeFp8VariantHeadDims,
                                                    compiled::IntList<kDecodeShortHeadDim>>::type;
using PairFp8HeadDims =
    compiled::Intersect<compiled::DecodeFp8HeadDims, compiled::IntList<kDecodePairHeadDim>>::type;
using PairFp8VariantHeadDims = compiled::Intersect<compiled::DecodeFp8VariantHeadDims,
                                                   compiled::IntList<kDecodePairHeadDim>>::type;

}  // namespace detail

namespace detail {

// The merges' groups (kernels/merge/dispatch.cuh instantiates these dtypes): `kMergeIn` the
// dtypes of every `o` without fp8; `merge_group` the group of a merge family.
inline constexpr DTypeMask kMergeIn = mask(DType::kF32) | mask(DType::kF16) | mask(DType::kBF16);
constexpr Group merge_group(Family f, DTypeMask q, DTypeMask kv, DTypeMask out, bool out_is_q,
                            Tile tile, Needs needs, Family fallback) {
  Group g = tiles(group(f, q, kv, out, true, kPlain, needs, fallback), tile);
  g.out_is_q = out_is_q;
  g.head_dims[0] = 0;  // any head dim
  g.num_head_dims = 1;
  return g;
}
/// Of a group specialised on the head dims of `List` (the ring and odd-row kernels).
template <int... V>
constexpr Group merge_dims(Group g, compiled::IntList<V...> list) {
  g = with_dims(g, list);
  g.states_by_slots = true;
  return g;
}
// The pairwise merges' (a, b, out) dtypes (`dispatch_pair`): every combination without fp8,
// and with one fp8 format F: (F, F, any but the other format), (x, x, F) and, in place,
// (F, x, F) and (x, F, x) for x without fp8. Five groups (the fp8 ones over both formats: a
// group's row never mixes them). `kPairDTypes` lists their (q, kv, out, out_is_q).
struct PairDTypes {
  DTypeMask q, kv, out;
  bool out_is_q;
};
inline constexpr PairDTypes kPairDTypes[] = {{kMergeIn, kMergeIn, kMergeIn, false},
                                             {kFp8, 0, kMergeIn, false},
                                             {kFp8, 0, 0, true},
                                             {kMergeIn, 0, kFp8, false},
                                             {kFp8, kMergeIn, 0, true},
                                             {kMergeIn, kFp8, 0, true}};
// The n-ary merges' (in, out) dtypes (`dispatch_stack`): every combination without fp8, and
// with one fp8 format F: (F, any but the other format), (x, F).
inline constexpr PairDTypes kStackDTypes[] = {{kMergeIn, 0, kMergeIn, false},
                                              {kFp8, 0, kMergeIn, false},
                                              {kFp8, 0, 0, true},
                                              {kMergeIn, 0, kFp8, false}};
inline constexpr Tile kMergeTile{kMergeBlock, 0, 0, 0, 0, 0};
inline constexpr Tile kMergeRowTile{kMergeBlock, 0, 0, 0, 1, 0};  // one chunk a thread
constexpr Tile whole_tile(int chunks) { return Tile{kMergeBlock, 0, 0, 0, chunks, 0}; }
constexpr Tile few_tile(int states) {
  return Tile{kMergeFewBlock, 0, 0, 0, merge_few_chunks(states), states};
}
inline constexpr Tile kRingTile{kMergeRingThreads, 0, 0, 0, kMergeRingChunks, kMergeRingMaxStates};
inline constexpr Tile kOddTile{kMergeOddThreads, 0, 0, 0, kMergeOddChunks, kMergeRingMaxStates};
/// `mark_empty_rows_kernel`: one instance, the LSEs (f32) of a state of any dtype.
constexpr Group mark_empty_group() {
  Group g = merge_group(Family::kMergeMarkEmpty, mask(DType::kF32), 0, kAnyDType, false, kMergeTile,
                        kNeedsNothing, Family::kMergeMarkEmpty);
  g.row_per_out = false;
  return g;
}
inline constexpr Needs kWholeNeeds = kNeedsChunkedRows | kNeedsWholeSplit;
inline constexpr Needs kSlotNeeds = kNeedsChunkedRows | kNeedsFullGrid | kNeedsSmemFit;
/// The pairwise group `i` of `kPairDTypes`: the general kernel's rows (family `f`, tile `t`).
constexpr Group pair(int i, Family f = Family::kMergePair, Tile t = kMergeTile,
                     Needs n = kNeedsNothing, Family fallback = Family::kMergePair) {
  return merge_group(f, kPairDTypes[i].q, kPairDTypes[i].kv, kPairDTypes[i].out,
                     kPairDTypes[i].out_is_q, t, n, fallback);
}
/// The whole-row rows of pairwise group `i`, one per chunk count: those of the streamed
/// instance (`kMergePairStream`: an output no input shares, else the plain instance) or the
/// plain one (else the general kernel).
constexpr Group whole(int i, Family f = Family::kMergePairWhole) {
  const bool streamed = f == Family::kMergePairStream;
  return tiles(pair(i, f, {}, kWholeNeeds | (streamed ? kNeedsDistinctOut : kNeedsNothing),
                    streamed ? Family::kMergePairWhole : Family::kMergePair),
               whole_tile(kMergeWholeChunks[0]), whole_tile(kMergeWholeChunks[1]));
}
constexpr Group stack(int i, Family f, Tile t, Needs n = kNeedsNothing,
                      Family fallback = Family::kMergeStack) {
  return merge_group(f, kStackDTypes[i].q, kStackDTypes[i].kv, kStackDTypes[i].out,
                     kStackDTypes[i].out_is_q, t, n, fallback);
}

}  // namespace detail

/// The groups: what the decode's instantiation units (`cuda/decode_unit.cuh`, one per head dim ×
/// decode group), the cascade level units (`cuda/cascade_unit.cuh`, one per head dim × family)
/// and `cascade.cu` (`launch_merge`) instantiate, in the order `find` prefers (the default depth
/// before the short-split one, plain instances before the variant ones).
inline constexpr Group kGroups[] = {
    // split-KV decode, 16-bit caches: plain (sinks, prior states) at the default depth, then the
    // short-split depth at its head dim; then the variant instance (window, soft cap, sinks,
    // prior states)
    detail::with_dims(
        detail::tiles(detail::group(Family::kDecodeSplit, detail::k16Bit, 0, kStateDTypes, false,
                                    kSinks | kPriorStates, kNeedsNothing, Family::kDecodeSplit),
                      detail::kDecodeTile),
        compiled::DecodeHeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kDecodeSplit, detail::k16Bit, 0, kStateDTypes, false,
                                    kSinks | kPriorStates, kNeedsNothing, Family::kDecodeSplit),
                      detail::kDecodeShortTile),
        detail::ShortHeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kDecodeSplit, detail::k16Bit, 0, kStateDTypes, false,
                                    kWindow | kSoftCap | kSinks | kPriorStates, kNeedsNothing,
                                    Family::kDecodeSplit),
                      detail::kDecodeTile),
        compiled::DecodeHeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kDecodeSplit, detail::k16Bit, 0, kStateDTypes, false,
                                    kWindow | kSoftCap | kSinks | kPriorStates, kNeedsNothing,
                                    Family::kDecodeSplit),
                      detail::kDecodeShortTile),
        detail::ShortHeadDims{}),
    // split-KV decode over fp8 caches (16-bit queries): plain (sinks, prior states) at both
    // depths, then the variant instance (window, soft cap, sinks, prior states)
    detail::with_dims(
        detail::tiles(
            detail::group(Family::kDecodeSplit, detail::k16Bit, detail::kFp8, kStateDTypes, false,
                          kSinks | kPriorStates, kNeedsNothing, Family::kDecodeSplit),
            detail::kDecodeTile),
        compiled::DecodeFp8HeadDims{}),
    detail::with_dims(
        detail::tiles(
            detail::group(Family::kDecodeSplit, detail::k16Bit, detail::kFp8, kStateDTypes, false,
                          kSinks | kPriorStates, kNeedsNothing, Family::kDecodeSplit),
            detail::kDecodeShortTile),
        detail::ShortFp8HeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kDecodeSplit, detail::k16Bit, detail::kFp8,
                                    kStateDTypes, false, kWindow | kSoftCap | kSinks | kPriorStates,
                                    kNeedsNothing, Family::kDecodeSplit),
                      detail::kDecodeTile),
        compiled::DecodeFp8VariantHeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kDecodeSplit, detail::k16Bit, detail::kFp8,
                                    kStateDTypes, false, kWindow | kSoftCap | kSinks | kPriorStates,
                                    kNeedsNothing, Family::kDecodeSplit),
                      detail::kDecodeShortTile),
        detail::ShortFp8VariantHeadDims{}),
    // the paired configuration over fp8 caches (`kDecodePairKeys` keys a warp's step), at its
    // head dim, both ring depths: plain, then the variant instance. After every other split row:
    // only `DecodeOptions::split_stages` takes it, never the automatic plan.
    detail::with_dims(
        detail::tiles(
            detail::group(Family::kDecodeSplit, detail::k16Bit, detail::kFp8, kStateDTypes, false,
                          kSinks | kPriorStates, kNeedsNothing, Family::kDecodeSplit),
            detail::kDecodePairTile, detail::kDecodePairDeepTile),
        detail::PairFp8HeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kDecodeSplit, detail::k16Bit, detail::kFp8,
                                    kStateDTypes, false, kWindow | kSoftCap | kSinks | kPriorStates,
                                    kNeedsNothing, Family::kDecodeSplit),
                      detail::kDecodePairTile, detail::kDecodePairDeepTile),
        detail::PairFp8VariantHeadDims{}),
    // streamed decode: one split per request, aligned query rows, pages of whole 16-key tiles,
    // no prior states; else the plan's split launch; plain (sinks), then the variant instance
    // (window, soft cap, sinks)
    detail::with_dims(
        detail::tiles(detail::group(Family::kDecodeStream, detail::k16Bit, 0, kStateDTypes, false,
                                    kSinks, kNeedsOneSplit | kNeedsAlignedQ | kNeedsPageTileKeys,
                                    Family::kDecodeSplit),
                      detail::kStreamTile),
        compiled::DecodeStreamHeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kDecodeStream, detail::k16Bit, 0, kStateDTypes, false,
                                    kWindow | kSoftCap | kSinks,
                                    kNeedsOneSplit | kNeedsAlignedQ | kNeedsPageTileKeys,
                                    Family::kDecodeSplit),
                      detail::kStreamTile),
        compiled::DecodeStreamHeadDims{}),
    // the streamed decode over fp8 caches (16-bit queries): plain, then the variant instance
    detail::with_dims(
        detail::tiles(
            detail::group(Family::kDecodeStream, detail::k16Bit, detail::kFp8, kStateDTypes, false,
                          kSinks, kNeedsOneSplit | kNeedsAlignedQ | kNeedsPageTileKeys,
                          Family::kDecodeSplit),
            detail::kStreamTile),
        compiled::DecodeStreamFp8HeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kDecodeStream, detail::k16Bit, detail::kFp8,
                                    kStateDTypes, false, kWindow | kSoftCap | kSinks,
                                    kNeedsOneSplit | kNeedsAlignedQ | kNeedsPageTileKeys,
                                    Family::kDecodeSplit),
                      detail::kStreamTile),
        compiled::DecodeStreamFp8HeadDims{}),
    // cascade levels on mma.sync: tiles of 16 rows (3 or 2 stages), 64 and 128 rows; plain, then
    // the variant instance (soft cap, window); partial states in fp32
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeMma, detail::k16Bit, 0, mask(DType::kF32),
                                    false, kPlain, kNeedsNothing, Family::kCascadeMma),
                      detail::kMma16, detail::kMma16Short, detail::kMma64, detail::kMma128),
        compiled::CascadeMmaHeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeMma, detail::k16Bit, 0, mask(DType::kF32),
                                    false, kSoftCap | kWindow, kNeedsNothing, Family::kCascadeMma),
                      detail::kMma16, detail::kMma16Short, detail::kMma64, detail::kMma128),
        compiled::CascadeMmaHeadDims{}),
    // the wide head dims on mma.sync: every tile at 2 stages, one CTA per SM (the shared memory)
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeMma, detail::k16Bit, 0, mask(DType::kF32),
                                    false, kPlain, kNeedsNothing, Family::kCascadeMma),
                      detail::kMmaWide16, detail::kMmaWide64, detail::kMmaWide128),
        compiled::CascadeMmaWideHeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeMma, detail::k16Bit, 0, mask(DType::kF32),
                                    false, kSoftCap | kWindow, kNeedsNothing, Family::kCascadeMma),
                      detail::kMmaWide16, detail::kMmaWide64, detail::kMmaWide128),
        compiled::CascadeMmaWideHeadDims{}),
    // cascade levels on mma.sync over fp8 caches (e4m3, e5m2) under 16-bit queries: the 16-bit
    // tiles, each K/V tile converted to the queries' dtype in shared memory as it lands; plain,
    // then the variant instance
    detail::with_dims(
        detail::tiles(
            detail::group(Family::kCascadeMma, detail::k16Bit, detail::kFp8, mask(DType::kF32),
                          false, kPlain, kNeedsNothing, Family::kCascadeMma),
            detail::kMma16, detail::kMma16Short, detail::kMma64, detail::kMma128),
        compiled::CascadeMmaFp8HeadDims{}),
    detail::with_dims(
        detail::tiles(
            detail::group(Family::kCascadeMma, detail::k16Bit, detail::kFp8, mask(DType::kF32),
                          false, kSoftCap | kWindow, kNeedsNothing, Family::kCascadeMma),
            detail::kMma16, detail::kMma16Short, detail::kMma64, detail::kMma128),
        compiled::CascadeMmaFp8HeadDims{}),
    // cascade levels on wgmma: plain, then the variant instance (soft cap, window); on devices
    // without wgmma, the plan takes mma.sync
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeWgmma, detail::k16Bit, 0, mask(DType::kF32),
                                    false, kPlain, kNeedsWgmma, Family::kCascadeMma),
                      detail::kWgmma64, detail::kWgmma128),
        compiled::CascadeWgmmaHeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeWgmma, detail::k16Bit, 0, mask(DType::kF32),
                                    false, kSoftCap | kWindow, kNeedsWgmma, Family::kCascadeMma),
                      detail::kWgmma64, detail::kWgmma128),
        compiled::CascadeWgmmaHeadDims{}),
    // cascade levels on wgmma over fp8 caches (e4m3, e5m2) under 16-bit queries: each K/V tile
    // converted to the queries' dtype in shared memory as it lands; plain, then the variant
    // instance; on devices without wgmma, the fp8 mma.sync rows
    detail::with_dims(detail::tiles(detail::group(Family::kCascadeWgmma, detail::k16Bit,
                                                  detail::kFp8, mask(DType::kF32), false, kPlain,
                                                  kNeedsWgmma, Family::kCascadeMma),
                                    detail::kWgmma64, detail::kWgmma128),
                      compiled::CascadeWgmmaHeadDims{}),
    detail::with_dims(
        detail::tiles(
            detail::group(Family::kCascadeWgmma, detail::k16Bit, detail::kFp8, mask(DType::kF32),
                          false, kSoftCap | kWindow, kNeedsWgmma, Family::kCascadeMma),
            detail::kWgmma64, detail::kWgmma128),
        compiled::CascadeWgmmaHeadDims{}),
    // warp-specialised levels: 128-key tiles (3 stages) and 64-key tiles (4 stages); plain, then
    // the variant instance (soft cap, window); a pool no tensor map describes runs the wgmma
    // kernel, at a head dim without wgmma rows (64, 256) the mma.sync one
    detail::with_dims(
        detail::tiles(
            detail::group(Family::kCascadeWs, detail::k16Bit, 0, mask(DType::kF32), false, kPlain,
                          kNeedsWgmma | kNeedsTensorMaps | kNeedsTmaBox | kNeedsPoolMap,
                          Family::kCascadeWgmma),
            detail::kWs64, detail::kWs128, detail::kWs64Kv64, detail::kWs128Kv64),
        compiled::CascadeWsOverWgmmaHeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeWs, detail::k16Bit, 0, mask(DType::kF32), false,
                                    kSoftCap | kWindow,
                                    kNeedsWgmma | kNeedsTensorMaps | kNeedsTmaBox | kNeedsPoolMap,
                                    Family::kCascadeWgmma),
                      detail::kWs64, detail::kWs128, detail::kWs64Kv64, detail::kWs128Kv64),
        compiled::CascadeWsOverWgmmaHeadDims{}),
    detail::with_dims(
        detail::tiles(
            detail::group(Family::kCascadeWs, detail::k16Bit, 0, mask(DType::kF32), false, kPlain,
                          kNeedsWgmma | kNeedsTensorMaps | kNeedsTmaBox | kNeedsPoolMap,
                          Family::kCascadeMma),
            detail::kWs64, detail::kWs128, detail::kWs64Kv64, detail::kWs128Kv64),
        compiled::CascadeWsOverMmaHeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeWs, detail::k16Bit, 0, mask(DType::kF32), false,
                                    kSoftCap | kWindow,
                                    kNeedsWgmma | kNeedsTensorMaps | kNeedsTmaBox | kNeedsPoolMap,
                                    Family::kCascadeMma),
                      detail::kWs64, detail::kWs128, detail::kWs64Kv64, detail::kWs128Kv64),
        compiled::CascadeWsOverMmaHeadDims{}),
    // head dim 256: the queries read from shared memory, 64-key tiles
    detail::with_dims(
        detail::tiles(
            detail::group(Family::kCascadeWs, detail::k16Bit, 0, mask(DType::kF32), false, kPlain,
                          kNeedsWgmma | kNeedsTensorMaps | kNeedsTmaBox | kNeedsPoolMap,
                          Family::kCascadeMma),
            detail::kWsWide64Kv64, detail::kWsWide128Kv64),
        compiled::CascadeWsWideHeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeWs, detail::k16Bit, 0, mask(DType::kF32), false,
                                    kSoftCap | kWindow,
                                    kNeedsWgmma | kNeedsTensorMaps | kNeedsTmaBox | kNeedsPoolMap,
                                    Family::kCascadeMma),
                      detail::kWsWide64Kv64, detail::kWsWide128Kv64),
        compiled::CascadeWsWideHeadDims{}),
    // warp-specialised levels over fp8 caches (e4m3, e5m2) under 16-bit queries: the copies land
    // in a ring of stored tiles, the producer warpgroup converts each into the 16-bit ring; the
    // 128-key tiles at 2 stages (3 leave no room for the stored ring) and 64-key tiles at 4;
    // plain, then the variant instance; a pool no tensor map describes runs the fp8 wgmma kernel
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeWs, detail::k16Bit, detail::kFp8,
                                    mask(DType::kF32), false, kPlain,
                                    kNeedsWgmma | kNeedsTensorMaps | kNeedsTmaBox | kNeedsPoolMap,
                                    Family::kCascadeWgmma),
                      detail::kWsFp8x64, detail::kWsFp8x128, detail::kWs64Kv64, detail::kWs128Kv64),
        compiled::CascadeWsFp8HeadDims{}),
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeWs, detail::k16Bit, detail::kFp8,
                                    mask(DType::kF32), false, kSoftCap | kWindow,
                                    kNeedsWgmma | kNeedsTensorMaps | kNeedsTmaBox | kNeedsPoolMap,
                                    Family::kCascadeWgmma),
                      detail::kWsFp8x64, detail::kWsFp8x128, detail::kWs64Kv64, detail::kWs128Kv64),
        compiled::CascadeWsFp8HeadDims{}),
    // the cascade merge: fp32 partial states into an output of each state dtype, sinks last
    detail::with_dims(
        detail::tiles(detail::group(Family::kCascadeMerge, mask(DType::kF32), 0, kStateDTypes, true,
                                    kSinks, kNeedsNothing, Family::kCascadeMerge),
                      Tile{kCascadeMergeWarps, 0, 0}),
        compiled::CascadeHeadDims{}),
    // ---- the merges (cuda/merge*.cu, the generated merge units) ----
    // pairwise: the general kernel at every (a, b, out) of `dispatch_pair`; the whole-row kernel
    // at each chunk count (2, then 3) where the rows split into 2^k threads of them, else the
    // general one; with an fp8 output whose memory no input shares, the whole-row kernel's
    // instance streaming its inputs past L1
    detail::pair(0),
    detail::pair(1),
    detail::pair(2),
    detail::pair(3),
    detail::pair(4),
    detail::pair(5),
    detail::whole(0),
    detail::whole(1),
    detail::whole(2),
    detail::whole(3),
    detail::whole(4),
    detail::whole(5),
    // the streamed instances: an fp8 output (F, F, F), (x, x, F), (F, x, F)
    detail::whole(2, Family::kMergePairStream),
    detail::whole(3, Family::kMergePairStream),
    detail::whole(4, Family::kMergePairStream),
    // n-ary: the general kernel at every (in, out) of `dispatch_stack` (one chunk a thread); the
    // few-states kernel (one instance per state count), the ring kernel and the odd-row kernel
    // (specialised on the head dim) without fp8, where their needs hold, else the general one
    detail::stack(0, Family::kMergeStack, detail::kMergeRowTile, kNeedsNothing,
                  Family::kMergeStack),
    detail::stack(1, Family::kMergeStack, detail::kMergeRowTile, kNeedsNothing,
                  Family::kMergeStack),
    detail::stack(2, Family::kMergeStack, detail::kMergeRowTile, kNeedsNothing,
                  Family::kMergeStack),
    detail::stack(3, Family::kMergeStack, detail::kMergeRowTile, kNeedsNothing,
                  Family::kMergeStack),
    detail::tiles(detail::stack(0, Family::kMergeFew, {}, kNeedsChunkedRows | kNeedsMultiChunk),
                  detail::few_tile(1), detail::few_tile(2), detail::few_tile(3),
                  detail::few_tile(4)),
    detail::merge_dims(detail::stack(0, Family::kMergeRing, detail::kRingTile, detail::kSlotNeeds),
                       compiled::MergeHeadDims{}),
    detail::merge_dims(detail::stack(0, Family::kMergeOdd, detail::kOddTile, detail::kSlotNeeds),
                       compiled::MergeOddHeadDims{}),
    // ragged rows and rebase: every (in, out) without fp8; marking empty rows: the LSEs of a
    // state of any dtype
    detail::stack(0, Family::kMergeRagged, detail::kMergeRowTile, kNeedsNothing,
                  Family::kMergeRagged),
    detail::stack(0, Family::kMergeRebase, detail::kMergeTile, kNeedsNothing, Family::kMergeRebase),
    detail::mark_empty_group(),
    // MLA decode (cuda/kernels/mla/): bf16 queries over a bf16 latent cache, or an fp8 one (its
    // rotary part bf16 or of the same fp8 format), sinks; one head dim, the key width
    detail::with_dims(detail::tiles(detail::group(Family::kMlaDecode, mask(DType::kBF16),
                                                  mask(DType::kBF16) | detail::kFp8, kStateDTypes,
                                                  false, kSinks, kNeedsNothing, Family::kMlaDecode),
                                    detail::kMlaTile),
                      compiled::IntList<kMlaHeadDim>{}),
    // the MLA decode on wgmma (sm_90a), the same dtypes and variants; elsewhere the rows above
    detail::with_dims(detail::tiles(detail::group(Family::kMlaDecodeWs, mask(DType::kBF16),
                                                  mask(DType::kBF16) | detail::kFp8, kStateDTypes,
                                                  false, kSinks, kNeedsWgmma, Family::kMlaDecode),
                                    detail::kMlaWsTile),
                      compiled::IntList<kMlaHeadDim>{}),
    // MLA cascade levels (cuda/kernels/mla/): the decode's dtypes; fp32 partial states out (the
    // sinks are merged by the merge of the levels)
    detail::with_dims(
        detail::tiles(detail::group(Family::kMlaCascade, mask(DType::kBF16),
                                    mask(DType::kBF16) | detail::kFp8, mask(DType::kF32), false,
                                    kPlain, kNeedsNothing, Family::kMlaCascade),
                      detail::kMlaTile),
        compiled::IntList<kMlaHeadDim>{}),
    // the narrow MLA decode on wgmma (sm_90a; requests of at most 32 rows), the same dtypes and
    // variants; elsewhere the mma.sync rows (last: the other rows keep their ids)
    detail::with_dims(detail::tiles(detail::group(Family::kMlaDecodeNarrow, mask(DType::kBF16),
                                                  mask(DType::kBF16) | detail::kFp8, kStateDTypes,
                                                  false, kSinks, kNeedsWgmma, Family::kMlaDecode),
                                    detail::kMlaNarrowTile),
                      compiled::IntList<kMlaHeadDim>{}),
    // the two-CTA narrow MLA decode (sm_90a; the narrow row's requests, dtypes and variants;
    // last: the other rows keep their ids)
    detail::with_dims(detail::tiles(detail::group(Family::kMlaDecodeNarrow2, mask(DType::kBF16),
                                                  mask(DType::kBF16) | detail::kFp8, kStateDTypes,
                                                  false, kSinks, kNeedsWgmma, Family::kMlaDecode),
                                    detail::kMlaNarrow2Tile),
                      compiled::IntList<kMlaHeadDim>{}),
    // the balanced wgmma MLA decode (sm_90a; the wgmma row's requests, dtypes, variants and
    // tiles; last: the other rows keep their ids)
    detail::with_dims(detail::tiles(detail::group(Family::kMlaDecodeWsBalanced, mask(DType::kBF16),
                                                  mask(DType::kBF16) | detail::kFp8, kStateDTypes,
                                                  false, kSinks, kNeedsWgmma, Family::kMlaDecode),
                                    detail::kMlaWsTile),
                      compiled::IntList<kMlaHeadDim>{}),
};

namespace detail {

constexpr int popcount(unsigned m) {
  int n = 0;
  for (; m != 0; m &= m - 1) ++n;
  return n;
}

/// Rows of one group.
constexpr int group_rows(const Group& g) {
  const int kv = g.kv == 0 ? 1 : popcount(g.kv);
  const int out = g.row_per_out && !g.out_is_q ? popcount(g.out) : 1;
  return g.num_head_dims * popcount(g.q) * kv * out * g.num_tiles;
}

constexpr int count_rows() {
  int n = 0;
  for (const Group& g : kGroups) n += group_rows(g);
  return n;
}

}  // namespace detail

/// Number of compiled kernel instances.
inline constexpr int kNumRows = detail::count_rows();

namespace detail {

/// Every group expanded: head dim, then query dtype, K/V dtype, output dtype, tile.
constexpr std::array<Row, kNumRows> expand() {
  std::array<Row, kNumRows> rows{};
  int n = 0;
  for (const Group& g : kGroups)
    for (int h = 0; h < g.num_head_dims; ++h)
      for (int q = 0; q < 5; ++q) {
        if ((g.q & (1u << q)) == 0) continue;
        for (int kv = 0; kv < 5; ++kv) {
          const DTypeMask kv_set = g.kv == 0 ? static_cast<DTypeMask>(1u << q) : g.kv;
          if ((kv_set & (1u << kv)) == 0) continue;
          for (int o = 0; o < 5; ++o) {
            if (g.out_is_q ? o != q : g.row_per_out ? (g.out & (1u << o)) == 0 : o > 0) continue;
            for (int t = 0; t < g.num_tiles; ++t) {
              Row& r = rows[static_cast<std::size_t>(n++)];
              r.family = g.family;
              r.head_dim = g.head_dims[h];
              r.q = static_cast<DType>(q);
              r.kv = static_cast<DType>(kv);
              r.out = g.row_per_out || g.out_is_q ? static_cast<DTypeMask>(1u << o) : g.out;
              r.variants = g.variants;
              r.stages = g.tiles[t].stages;
              r.tile_rows = g.tiles[t].rows;
              r.tile_keys = g.tiles[t].keys;
              r.ctas_per_sm = g.tiles[t].ctas;
              r.kv_align = g.kv_align;
              r.needs = g.needs;
              r.fallback = g.fallback;
              r.chunks = g.tiles[t].chunks;
              r.states = g.tiles[t].states;
              if (g.states_by_slots && merge_slot_states(r.head_dim) < r.states)
                r.states = merge_slot_states(r.head_dim);
            }
          }
        }
      }
  return rows;
}

}  // namespace detail

/// The rows: every compiled attention kernel instance of this build.
inline constexpr std::array<Row, kNumRows> kRows = detail::expand();

namespace detail {

/// FNV-1a over the bytes of `v` (little-endian, 8 bytes).
constexpr std::uint64_t hash(std::uint64_t h, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xFF)) * 0x100000001B3ull;
  return h;
}

constexpr std::uint64_t fingerprint() {
  std::uint64_t h = 0xCBF29CE484222325ull;
  h = hash(h, static_cast<std::uint64_t>(kNumRows));
  for (const Row& r : kRows) {
    const std::uint64_t fields[] = {static_cast<std::uint64_t>(r.family),
                                    static_cast<std::uint64_t>(r.head_dim),
                                    static_cast<std::uint64_t>(r.q),
                                    static_cast<std::uint64_t>(r.kv),
                                    r.out,
                                    r.variants,
                                    static_cast<std::uint64_t>(r.stages),
                                    static_cast<std::uint64_t>(r.tile_rows),
                                    static_cast<std::uint64_t>(r.tile_keys),
                                    static_cast<std::uint64_t>(r.ctas_per_sm),
                                    static_cast<std::uint64_t>(r.kv_align),
                                    r.needs,
                                    static_cast<std::uint64_t>(r.fallback),
                                    static_cast<std::uint64_t>(r.chunks),
                                    static_cast<std::uint64_t>(r.states)};
    for (std::uint64_t f : fields) h = hash(h, f);
  }
  return h;
}

}  // namespace detail

/// The catalog's fingerprint: a hash of every row's fields, in order. A plan records it with the
/// kernel ids it holds (indices into `kRows`), and a run refuses a plan whose fingerprint differs
/// (one made by a build with another catalog, whose ids name other kernels).
inline constexpr std::uint64_t kFingerprint = detail::fingerprint();
static_assert(kFingerprint != 0, "0 marks a plan that no planner made");

/// A request: a family and what must hold (0 / `kAnyDType`: anything).
struct Query {
  Family family = Family::kDecodeSplit;
  std::int64_t head_dim = 0;   ///< 0: any.
  DTypeMask q = kAnyDType;     ///< Query dtypes accepted.
  DTypeMask kv = kAnyDType;    ///< K/V dtypes accepted.
  DTypeMask out = 0;           ///< Output dtypes the kernel must write (0: any).
  Variants variants = kPlain;  ///< Variants the kernel must take.
  int stages = 0;              ///< 0: any.
  int tile_rows = 0;           ///< 0: any.
  int tile_keys = 0;           ///< 0: any.
  std::int64_t states = 0;     ///< The merges: states to merge (0: any).
  int chunks = 0;              ///< The merges: chunks per thread (0: any).
};

/// True when `r` answers `q` (a row of head dim 0 answers every head dim).
constexpr bool matches(const Row& r, const Query& q) {
  return r.family == q.family && (q.head_dim == 0 || r.head_dim == 0 || r.head_dim == q.head_dim) &&
         (q.states == 0 || r.states == 0 || q.states <= r.states) &&
         (q.chunks == 0 || r.chunks == q.chunks) && (q.q & mask(r.q)) != 0 &&
         (q.kv & mask(r.kv)) != 0 && (r.out & q.out) == q.out &&
         (r.variants & q.variants) == q.variants && (q.stages == 0 || r.stages == q.stages) &&
         (q.tile_rows == 0 || r.tile_rows == q.tile_rows) &&
         (q.tile_keys == 0 || r.tile_keys == q.tile_keys);
}

namespace detail {

/// The rows' ids by family (each family's in row order), and where each family's start.
struct FamilyIndex {
  std::array<int, kNumRows> ids{};
  std::array<int, kFamilies + 1> begin{};
};

constexpr FamilyIndex index_families() {
  FamilyIndex x;
  for (const Row& r : kRows) ++x.begin[static_cast<std::size_t>(r.family) + 1];
  for (int f = 0; f < kFamilies; ++f) x.begin[f + 1] += x.begin[f];
  std::array<int, kFamilies> next{};
  for (int i = 0; i < kNumRows; ++i) {
    const auto f = static_cast<std::size_t>(kRows[static_cast<std::size_t>(i)].family);
    x.ids[static_cast<std::size_t>(x.begin[f] + next[f]++)] = i;
  }
  return x;
}

}  // namespace detail

/// The rows of each family (`kFamilyIndex.ids[begin[f], begin[f + 1])`), so a lookup reads only
/// its family's rows.
inline constexpr detail::FamilyIndex kFamilyIndex = detail::index_families();

/// The first row after `prev` (null: from the first; else a row `find` or this returned)
/// answering `q`, or null: the candidates of a request in the order its family prefers them.
constexpr const Row* find_next(const Query& q, const Row* prev) {
  const auto f = static_cast<std::size_t>(q.family);
  bool after = prev == nullptr;
  for (int i = kFamilyIndex.begin[f]; i < kFamilyIndex.begin[f + 1]; ++i) {
    const Row& r = kRows[static_cast<std::size_t>(kFamilyIndex.ids[static_cast<std::size_t>(i)])];
    if (after && matches(r, q)) return &r;
    after = after || &r == prev;
  }
  return nullptr;
}

/// The first row answering `q` (the preferred instance), or null when none is compiled.
constexpr const Row* find(const Query& q) { return find_next(q, nullptr); }

/// Up to `N` rows (their ids, in `find`'s order): a launcher's candidates for a request, listed
/// once (at compile time, per dtype combination) so a call reads only those.
template <int N>
struct Candidates {
  int ids[N] = {};
  int count = 0;
};

/// `c` followed by the rows answering `q` in `find`'s order; a compile error (in a constant
/// expression) when more than `N` in all.
template <int N>
constexpr Candidates<N> candidates(const Query& q, Candidates<N> c = {}) {
  for (const Row* r = find(q); r != nullptr; r = find_next(q, r)) {
    if (c.count == N) throw "catalog::candidates: more rows than the list holds";
    c.ids[c.count++] = static_cast<int>(r - kRows.data());
  }
  return c;
}

/// True when some row of family `f` reads or writes an fp8 dtype (the merges' argument checks
/// accept fp8 views by it).
constexpr bool takes_fp8(Family f) {
  constexpr DTypeMask fp8 = mask(DType::kE4M3) | mask(DType::kE5M2);
  for (const Row& r : kRows)
    if (r.family == f && ((mask(r.q) | mask(r.kv) | r.out) & fp8) != 0) return true;
  return false;
}

/// True when some compiled kernel answers `q`.
constexpr bool compiled(const Query& q) { return find(q) != nullptr; }

/// The kernel id of the first row answering `q`: its index in `kRows` (the key of the launch
/// tables), or -1 when none is compiled.
constexpr int find_id(const Query& q) {
  const Row* r = find(q);
  return r == nullptr ? -1 : static_cast<int>(r - kRows.data());
}

/// The needs checked when a plan runs (the others decided the plan), and when a merge runs.
inline constexpr Needs kRunTimeNeeds = kNeedsPoolMap | kNeedsAlignedQ | kNeedsPageTileKeys |
                                       kNeedsChunkedRows | kNeedsWholeSplit | kNeedsDistinctOut |
                                       kNeedsFullGrid | kNeedsSmemFit | kNeedsMultiChunk;

/// The needs a plan decides: the device's facts (wgmma, tensor maps) and the shape's (a page size
/// with a bulk-copy box, one split per request).
inline constexpr Needs kPlanTimeNeeds =
    kNeedsWgmma | kNeedsTensorMaps | kNeedsTmaBox | kNeedsOneSplit;

/// The fallback rule, the one for every family: the family whose row runs for a plan's row `r`,
/// given the needs met (`met`) among those `checked` and the variants asked (`asked`): `r`'s own
/// when it meets every checked need of `r` and `r` takes `asked`, else `r.fallback` (the plan
/// holds that family's row for the problem). A row whose fallback is its own family has none.
/// A run checks the run-time needs (the default); a planner checks every need, with the
/// device's facts and the shape's as the plan-time needs met and every run-time need counted as
/// met (a run checks those again), and applies the rule again to the fallback row until the row
/// runs.
constexpr Family family_that_runs(const Row& r, Needs met, Variants asked = kPlain,
                                  Needs checked = kRunTimeNeeds) {
  return (r.needs & checked & ~met) == 0 && (r.variants & asked) == asked ? r.family : r.fallback;
}

/// The variants of an attention variant (`window_left`, `logits_soft_cap`) as bits.
constexpr Variants variants_of(std::int64_t window_left, float logits_soft_cap) {
  return static_cast<Variants>((window_left >= 0 ? kWindow : 0) |
                               (logits_soft_cap != 0.f ? kSoftCap : 0));
}

/// The family's name ("split-KV decode", ...).
const char* to_string(Family f);
/// The variants as words ("plain", "window, soft cap").
std::string variants_string(Variants v);
/// The dtypes of a mask as "f16 or bf16" ("none" when empty).
std::string dtypes_string(DTypeMask m);

/// The head dims of the rows answering `q` (its `head_dim` ignored), ascending.
std::vector<int> head_dims(Query q);
/// `head_dims(q)` as "64, 128 or 256".
std::string head_dims_string(const Query& q);
/// The query (`kv == false`) or K/V (`kv == true`) dtypes of the rows answering `q`.
DTypeMask dtypes(const Query& q, bool kv);

/// What the catalog holds for `q`'s family and dims, for a `Status::kNotSupported` error's
/// `expected`: "a compiled split-KV decode kernel: head dims 64, 128 or 256, ... " naming, for
/// the family, the head dims, the dtypes at `q`'s head dim and the variants at its dtypes.
std::string not_supported_message(const Query& q);

/// The catalog as a Markdown table (`docs/catalog.md` holds it; a test checks they agree).
std::string markdown_table();

}  // namespace catalog
}  // namespace attnstate
