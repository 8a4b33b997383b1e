/// @file cascade_plan.hpp
/// @brief The cascade's host planner (no CUDA): per level the query tile, the KV split, the
///        kernel and its fallback, from the shapes, the host level arrays and the device facts;
///        the plan's own checks; the tensor-map layout of a KV pool for the warp-specialised
///        kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/cuda/cascade_plan.hpp"
#include "catalog/catalog.hpp"
#include "catalog/kernel_shapes.hpp"
#include "common/compiled.hpp"

namespace attnstate {
namespace plan {

using cuda::CascadeChoice;
using cuda::CascadeLevelKernel;
using cuda::CascadeLevelPlan;
using cuda::CascadeShape;
using cuda::CascadeTuning;

/// Keys per KV tile of the level kernels (`CascadeTile::BN`).
constexpr int kKvTile = catalog::kCascadeKvTile;
/// Largest GQA group (`heads_q / heads_kv`) of a cascade (`CascadeShape::heads_q`).
constexpr std::int64_t kMaxCascadeGroup = 64;

/// Head dims with compiled cascade level kernels (the catalog's mma.sync level rows).
inline bool cascade_head_dim_supported(std::int64_t d) {
  catalog::Query q;
  q.family = catalog::Family::kCascadeMma;
  q.head_dim = d;
  return d != 0 && catalog::compiled(q);
}
/// Row tiles with compiled cascade level kernels (the catalog's mma.sync level rows).
inline bool cascade_tile_supported(int rows) {
  catalog::Query q;
  q.family = catalog::Family::kCascadeMma;
  q.tile_rows = rows;
  return rows != 0 && catalog::compiled(q);
}

/// Warp-specialised level kernel variants (bf16, head_dim 128; tiles of 64 or 128 rows), the
/// values of `CascadeTuning::ws_variant` and `CascadeLevelPlan::ws_variant`.
enum class CascadeWsVariant : int {
  kKv128 = 1,       ///< KV tiles of 128 keys, 3 stages; warpgroups issue freely (the default).
  kKv128Turns = 2,  ///< kKv128 with the two warpgroups issuing in turns (ping-pong).
  kKv64 = 3,        ///< KV tiles of 64 keys, 4 stages; warpgroups issue freely.
  kKv64Turns = 4,   ///< kKv64 with the two warpgroups issuing in turns.
};

/// What `plan_cascade` needs to know of the device beyond the SM count (queried once per device
/// by the caller).
struct CascadeDeviceFacts {
  bool wgmma = false;        ///< The `wgmma` kernels run (sm_90 with sm_90a code loaded).
  bool tensor_maps = false;  ///< The driver encodes tensor maps (`cuTensorMapEncodeTiled`).
};

/// What the cascade planner needs of the decode plan of a unique last level.
struct CascadeDecodeLevel {
  SplitLayout splits;  ///< Its split layout.
  int row_tiles = 1;   ///< Its tiles of query rows per KV head.
};
/// Plans the decode of a unique last level (`cuda::plan_decode` in the library, which also keeps
/// the `DecodePlan`; a stand-in in the tests): the problem, the segments' lengths, the options and
/// the SM count. Empty: no level runs on the decode.
using PlanDecodeLevelFn = std::function<CascadeDecodeLevel(
    const DecodeProblem&, const std::int32_t*, const DecodeOptions&, int)>;

/// Keys per bulk-copy box of the warp-specialised kernel for a page size: a divisor of the
/// 64-key tile granule that never straddles a page (the page size itself when it divides 64,
/// 64 when 64 divides the page size); 0 when no such box exists (that level keeps the cp.async
/// kernels).
int tma_box_rows(std::int64_t page_size);
/// Keys per run box of the warp-specialised kernel for a page size (0: no run boxes): pages
/// shorter than 64 keys whose ids follow one another are copied 64 keys per box.
int tma_run_keys(std::int64_t page_size);
/// The warp-specialised variant a tuning asks for (-1, the default, is 1: 128-key tiles; at a
/// head dim above 128, 3: 64-key tiles, the only ones its rows have).
int resolve_ws_variant(int asked, std::int64_t head_dim);
/// Stages of the 16-row cp.async tile for a level whose splits hold `chunk` keys: 3 when a CTA
/// streams many KV tiles (a long unique suffix), else 2 (more CTAs per SM for short ones).
int small_stages(int chunk);

/// Chooses the KV split (tokens per split) of a level by wave efficiency: the fewest splits
/// whose CTAs fill the machine in the fewest, fullest waves (`ctas_per_sm` resident at once).
/// `tiles[s]` row tiles and `lens[s]` keys of segment `s`; splits are whole `granule`s.
int choose_chunk(const std::int64_t* tiles, const std::int32_t* lens, std::int64_t nseg,
                 std::int64_t max_len, std::int64_t heads_kv, int ctas_per_sm, int num_sms,
                 std::int64_t rows_total, std::int64_t head_dim, std::int64_t granule);

/// Where a last level `lv` runs (`CascadeChoice::last_level`): the decode, or why not.
cuda::CascadeLastLevel last_level_choice(const CascadeShape& shape, const CascadeLevel& lv,
                                         const CascadeOptions& options,
                                         const CascadeTuning& tuning);

/// True when level `l` of `num_levels` can run on the split-KV decode: the last level, every
/// segment owned by exactly one request in request order (segment `b` is request `b`), keys that
/// exist, and causal new tokens (the decode's masking) or a single one.
bool decode_eligible(const CascadeShape& shape, const CascadeLevel& lv, int l, int num_levels,
                     const CascadeOptions& options, const CascadeTuning& tuning);

/// Plans a cascade: `cuda::plan_cascade`'s checks and choices (see cascade.hpp) with the device
/// facts given; the decode of a unique last level through `plan_decode`. Errors name `func`'s
/// arguments.
CascadeChoice plan_cascade(const char* func, const CascadeShape& shape,
                           const CascadeLevel* host_levels, int num_levels,
                           const CascadeOptions& options, int num_sms, const CascadeTuning& tuning,
                           const CascadeDeviceFacts& facts, const PlanDecodeLevelFn& plan_decode);

/// The decode problem of a unique last level of `shape`.
DecodeProblem cascade_decode_problem(const CascadeShape& shape);

/// Bytes of the partial states `(num_slots, rows, head_dim)` in the workspace, the start of
/// their LSEs (256-byte aligned).
std::size_t partials_o_bytes(const CascadeChoice& plan);
/// Bytes of the partial states and their LSEs: the offset of the decode level's workspace.
std::size_t partials_bytes(const CascadeChoice& plan);
/// Bytes of a windowed plan's request tails (`(num_levels, batch)` int32, after the decode
/// level's workspace; `kernels::cascade_tails_kernel`), 0 without a window.
std::size_t window_tails_bytes(const CascadeChoice& plan);

/// Checks a plan before a run: one `plan_cascade` of this build made (the catalog's
/// fingerprint; a default-constructed plan has none). The plan cannot be edited, so nothing else
/// of it is checked again. Errors name `plan` as `func`'s argument.
void check_cascade_plan(const char* func, const CascadeChoice& plan);

/// How the warp-specialised kernel sees a KV pool: five dims (innermost first) with their byte
/// strides (dims 1-4) and the boxes of its tensor maps (`kernels::CascadeTmaMaps`).
struct CascadeTmaLayout {
  bool describable = false;  ///< False: no tensor map fits (the level runs its fallback).
  int coords = 0;            ///< 0 NHD, 1 unpadded HND (page and KV head one dim), 2 padded HND.
  int box = 0;               ///< Keys per page box (8 for a padded HND pool).
  int run = 0;               ///< Keys per run box (0: none; NHD pools only).
  std::int64_t dims[5] = {};
  std::int64_t strides[4] = {};
  std::int64_t page_box[5] = {};
  std::int64_t run_box[5] = {};
};

/// The tensor-map layout of `kv` (16-bit at head_dim 64 or 128, fp8 at 128) for a level planned
/// with boxes of `box` and runs of `run` keys (`CascadeLevelPlan::tma_box`, `tma_run`). Not
/// describable when the pool's dims or strides exceed what a tensor map holds (more than 2^31 - 1
/// pages, strides of 2^40 bytes or more, strides not multiples of 16 bytes) or the page size is not
/// a multiple of 8.
CascadeTmaLayout describe_cascade_kv_maps(const PagedKvCache& kv, int box, int run);

}  // namespace plan
}  // namespace attnstate
