/// @file cascade_plan.hpp
/// @brief CUDA backend: the cascade's shape, tuning and per-level choices (host values, no
///        CUDA headers); `CascadePlan`, `plan_cascade` and `run_cascade` are in cascade.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/dtype.hpp"

namespace attnstate {
namespace cuda {

/// The shape of a cascade problem (everything but the tensors and the level arrays).
struct CascadeShape {
  std::int64_t batch = 0;      ///< Requests (≥ 1).
  std::int64_t q_len = 1;      ///< New tokens per request, 1..kMaxCascadeQueryLen.
  std::int64_t heads_q = 0;    ///< Query heads, a multiple of `heads_kv`, group ≤ 64.
  std::int64_t heads_kv = 0;   ///< KV heads.
  std::int64_t head_dim = 0;   ///< A head dim of the catalog's level rows (docs/catalog.md).
  std::int64_t page_size = 0;  ///< Tokens per page (any ≥ 1).
  std::int64_t num_pages = 0;  ///< Pages in the pool.
  DType dtype = DType::kBF16;  ///< Query dtype (and KV dtype unless `kv_dtype` is set): f16 or
                               ///< bf16 (others: `kNotSupported`).
  /// KV pool dtype when it differs from `dtype`: fp8 e4m3 or e5m2 (the pools' bytes, read as
  /// `stored · k_scale` / `v_scale`, `KvScale`), on the catalog's fp8 level rows
  /// (docs/catalog.md); unset: `dtype`.
  std::optional<DType> kv_dtype;

  /// The KV pools' dtype: `kv_dtype`, else `dtype`.
  DType pool_dtype() const { return kv_dtype.value_or(dtype); }
};

/// Which tensor-core instructions a level kernel uses.
enum class CascadeKernel : std::uint8_t {
  kAuto = 0,   ///< `wgmma` on sm_90 for the shapes and tiles the catalog compiles it for
               ///< (docs/catalog.md), else `mma.sync`.
  kMma = 1,    ///< `mma.sync` m16n8k16 (any tile; every architecture the library builds for).
  kWgmma = 2,  ///< Hopper `wgmma` where it applies (the catalog's wgmma rows,
               ///< docs/catalog.md); other levels use `mma.sync`.
};

/// Overrides of the plan's choices (0 = automatic); for tests and tuning. `tile_rows`, `chunk`
/// and `kernel` apply to the levels that run on cascade level kernels, not to a last level that
/// runs on the split-KV decode (which plans its own splits).
struct CascadeTuning {
  int tile_rows = 0;  ///< Query rows per CTA tile: a cascade level row's (docs/catalog.md).
  int chunk = 0;      ///< KV tokens per split, a positive multiple of 64.
  CascadeKernel kernel = CascadeKernel::kAuto;  ///< Tensor-core instruction family.
  /// Run a last level whose segments each belong to one request (segment `b` to request `b`)
  /// with the library's split-KV decode (`run_decode`) instead of a cascade level kernel; it
  /// applies when the new tokens are causal or `q_len == 1` (see `decode_fold` for how its
  /// state meets the other levels').
  bool decode_last_level = true;
  /// Splits of such a decode level: 0 = the decode's automatic policy, else a fixed count
  /// (`1..attnstate::kMaxSplits`, i.e. 1..512, the range `plan_decode` takes).
  int decode_splits = 0;
  /// The kernel of such a decode level (`DecodeOptions::kernel` of its plan): `kAuto`, `kSplit`,
  /// or `kStreamed` (refused by `plan_decode`'s checks unless the level has one split per
  /// request; a fold of the shared levels' states still runs the split kernel).
  DecodeKernel decode_kernel = DecodeKernel::kAuto;
  /// SMs the shared levels leave to such a decode level, which then runs beside them (it is a
  /// programmatic dependent launch that waits for them only before folding their states, if it
  /// folds them):
  /// -1 = automatic (enough for all the decode's CTAs when the shared segments are short and
  /// the decode needs at most half of the SMs, else 0), else `0..num_sms - 1`.
  int decode_sms = -1;
  /// How such a decode level's state meets the shared levels' states in `run_cascade`:
  /// 1 = the decode folds them into its own split merge (no merge launch; its CTAs wait for the
  /// shared levels before folding, holding their SM slots meanwhile); 0 = the decode never waits:
  /// it writes its state to its workspace slot while the shared levels still run, on whatever
  /// SMs they leave, and one merge launch follows (which waits for both); -1 = automatic (fold
  /// when `decode_sms` leaves SMs for every decode CTA at once or the decode is at most about
  /// two waves of CTAs, else the merge launch). With the unique level alone the decode always
  /// writes the output itself.
  int decode_fold = -1;
  /// The warp-specialised (bulk-copy, `wgmma`) kernel of the levels whose shape and tile the
  /// catalog compiles it for (docs/catalog.md): -1 = automatic (KV tiles of 128 keys; of 64 at
  /// head dim 256, the only ones its rows have), 0 = never (those levels run on
  /// the `cp.async` kernels), 1 = 128-key tiles, 2 = 128-key tiles with the warpgroups issuing in
  /// turns, 3 = 64-key tiles, 4 = 64-key tiles in turns (for comparisons; each is exact to
  /// rounding, and repeatable for a given plan).
  int ws_variant = -1;
  /// Launch every level after the first as a programmatic dependent launch, so a memory-bound
  /// level (unique suffixes) runs beside a compute-bound one (a long shared prefix)
  /// (`CascadeChoice::overlap_levels`).
  bool overlap_levels = true;
  /// Fetch each KV tile's page ids one tile ahead of its copies (hides the page-table latency;
  /// `CascadeChoice::prefetch_pages`).
  bool prefetch_pages = true;
};

/// The kernel that runs a level, resolved by `plan_cascade` (see docs/internals.md, "Cascade").
enum class CascadeLevelKernel : std::uint8_t {
  kMma = 0,              ///< `cp.async` + `mma.sync` m16n8k16 (any tile, any architecture).
  kWgmma = 1,            ///< `cp.async` + Hopper `wgmma` (the catalog's rows: docs/catalog.md).
  kWarpSpecialized = 2,  ///< Bulk tensor copies (TMA) + `wgmma`, warp-specialised (as kWgmma,
                         ///< and a page size with a bulk-copy box).
  kDecode = 3,           ///< The split-KV decode (`CascadePlan::last_decode`; the last level).
};

/// Why the last level runs where it runs (`CascadeChoice::last_level`): on the split-KV decode,
/// or on a cascade level kernel for the reason given.
enum class CascadeLastLevel : std::uint8_t {
  kDecode = 0,      ///< On the split-KV decode (one segment per request, segment b request b).
  kTurnedOff = 1,   ///< `CascadeTuning::decode_last_level` is false.
  kShared = 2,      ///< Some segment serves several requests (or not in request order).
  kNotCausal = 3,   ///< `q_len > 1` without the causal mask (the decode's rule is causal).
  kNoPages = 4,     ///< The level holds no page.
  kOnlyShared = 5,  ///< A planner without a decode (the host planner's tests).
  /// The catalog holds no split-KV decode kernel for the shape's head dim, dtypes and variant
  /// (fp8 K/V with a window or a soft cap).
  kNoDecodeKernel = 6,
};

/// What the plan chose for one level: a record a plan hands out read-only
/// (`CascadeChoice::level`). A level on a cascade level kernel runs the kernel of the catalog
/// row `kernel_id` (docs/catalog.md); `kernel`, `fallback`, `tile_rows` and `stages` describe
/// that row and its fallback's.
struct CascadeLevelPlan {
  std::int64_t num_segments = 0;  ///< Segments (must match the run's level).
  int tile_rows = 0;              ///< Query rows per CTA tile (the row's).
  int max_tiles = 0;              ///< Most row tiles of any segment.
  int chunk = 0;                  ///< KV tokens per split (a multiple of 64; a decode level:
                                  ///< the decode's split size, a multiple of 16).
  int max_splits = 0;             ///< Most splits of any segment (planned lengths).
  int slot_offset = 0;            ///< First workspace slot of this level's partial states.
  bool has_pages = false;         ///< The planned level uses pages (`page_indices` required).
  /// The shape and tuning take the `wgmma` kernels, the warp-specialised one included (a catalog
  /// row for the shape and tile, docs/catalog.md; not `CascadeKernel::kMma`); `kernel` says
  /// whether the planned device runs them.
  bool wgmma = false;
  bool decode = false;  ///< Runs on the split-KV decode (`CascadePlan::last_decode`).
  /// The kernel `run_cascade` launches for this level (the family of row `kernel_id`).
  CascadeLevelKernel kernel = CascadeLevelKernel::kMma;
  /// The kernel launched instead when the run's KV pool cannot be described as a tensor map
  /// (the family of row `fallback_id`: `kWgmma` for `kWarpSpecialized`, else `kernel`); see
  /// `CascadePlan::tensor_maps`.
  CascadeLevelKernel fallback = CascadeLevelKernel::kMma;
  /// Pipeline stages of the row (the 16-row `mma.sync` tile: 2, or 3 for splits of at least 512
  /// keys; the other tiles have one depth each). 0 on a decode level.
  int stages = 0;
  /// `kWarpSpecialized`: its variant (`CascadeTuning::ws_variant` resolved, 1..4), else 0.
  int ws_variant = 0;
  /// `kWarpSpecialized`: keys per bulk-copy box in an NHD pool (the page size when it divides
  /// 64, else 64; an HND pool whose pages are padded uses boxes of 8 keys), else 0.
  int tma_box = 0;
  /// `kWarpSpecialized`: keys per run box (consecutive whole pages of an NHD pool copied as one
  /// box; 64 for pages shorter than 64 keys), else 0.
  int tma_run = 0;
  /// The catalog row (kernel id: an index into the catalog of the build that made the plan) of
  /// the level kernel a run launches; -1 on a decode level (its own plan holds its kernel).
  int kernel_id = -1;
  /// The catalog row a run launches when it cannot meet a run-time need of row `kernel_id` (the
  /// pool's tensor map): that row's fallback, by the catalog's fallback rule (`kernel_id` when
  /// the row has no run-time need); -1 on a decode level.
  int fallback_id = -1;
};

class CascadeChoice;

namespace detail {

struct CascadePlanAccess;

/// What `plan_cascade` chose for every level and the run: the data behind `CascadeChoice`'s
/// accessors, written by the planner only and read by the runner (through `CascadePlanAccess`,
/// src/plan/cascade_plan_access.hpp).
struct CascadeChoiceData {
  CascadeShape shape;
  int num_levels = 0;
  CascadeLevelPlan levels[kMaxCascadeLevels] = {};
  int num_slots = 0;
  float scale = 0.f;
  bool causal = true;
  int num_sms = 0;
  bool overlap_levels = true;
  bool prefetch_pages = true;
  int ws_variant = 1;
  bool wgmma_available = false;
  bool tensor_maps = false;
  int decode_sms = 0;
  bool decode_fold = true;
  float logits_soft_cap = 0.f;
  std::int64_t window_left = -1;
  CascadeLastLevel last_level = CascadeLastLevel::kOnlyShared;
  /// The catalog's fingerprint of the build that made the plan (0: no planner made it).
  std::uint64_t catalog_fingerprint = 0;
  /// Query rows `batch · q_len · heads_q`.
  std::int64_t rows() const { return shape.batch * shape.q_len * shape.heads_q; }
};

}  // namespace detail

/// What `plan_cascade` chose for every level and the run: all of `CascadePlan` (cascade.hpp)
/// but the decode plan of a decode last level. Read-only: only the planner makes one (the
/// choices a caller may make go through `CascadeTuning`, checked when planning), so a run
/// checks only what can differ from the plan; a plan of another kernel catalog (another build)
/// or a default-constructed one is refused by name.
class CascadeChoice {
 public:
  const CascadeShape& shape() const { return d_.shape; }  ///< The planned shape.
  int num_levels() const { return d_.num_levels; }        ///< Levels (1..kMaxCascadeLevels).
  /// The choices of level `l` (`0 <= l < num_levels()`; others throw `kInvalidArgument`).
  const CascadeLevelPlan& level(int l) const;
  int num_slots() const { return d_.num_slots; }  ///< Partial states per query row.
  float scale() const { return d_.scale; }        ///< Softmax scale (resolved, never 0).
  bool causal() const { return d_.causal; }       ///< Causal mask on the last level.
  int num_sms() const { return d_.num_sms; }      ///< SMs planned for.
  /// Every level after the first launches as a programmatic dependent launch, so a memory-bound
  /// level (unique suffixes) runs beside a compute-bound one (`CascadeTuning::overlap_levels`).
  bool overlap_levels() const { return d_.overlap_levels; }
  /// Each KV tile's page ids are fetched one tile ahead of its copies
  /// (`CascadeTuning::prefetch_pages`).
  bool prefetch_pages() const { return d_.prefetch_pages; }
  /// The warp-specialised kernel variant of the levels that take it (`CascadeTuning::ws_variant`
  /// resolved: 0 none, 1..4).
  int ws_variant() const { return d_.ws_variant; }
  /// The device facts the plan was made with (those of the device current at planning; run the
  /// plan there): the `wgmma` kernels run on it (an sm_90 part running code built for sm_90a).
  bool wgmma_available() const { return d_.wgmma_available; }
  /// The driver encodes tensor maps (`cuTensorMapEncodeTiled`; see `wgmma_available`).
  bool tensor_maps() const { return d_.tensor_maps; }
  /// SMs the shared levels' splits leave free for a decode last level
  /// (`CascadeTuning::decode_sms`).
  int decode_sms() const { return d_.decode_sms; }
  /// That decode folds the shared levels' states into its output (`CascadeTuning::decode_fold`);
  /// false: it writes its workspace slot beside the shared levels and a merge launch follows.
  bool decode_fold() const { return d_.decode_fold; }
  /// Logits soft cap of every level (`CascadeOptions::variant`; 0: none). Its levels run on the
  /// level kernels' variant instances, and a decode last level on the decode's variant kernel
  /// into its own workspace slot (`decode_fold` false unless it is the only level).
  float logits_soft_cap() const { return d_.logits_soft_cap; }
  /// Sliding window of every level (`CascadeOptions::variant`; -1: none), on the same kernels as
  /// a soft cap. A level's splits cover the keys its rows' windows reach; the run places the rows
  /// by the lengths of every level (so only `run_cascade` runs a windowed plan's shared levels).
  std::int64_t window_left() const { return d_.window_left; }
  /// Where the last level runs, and why (`to_string(const CascadeChoice&)` says it in words).
  CascadeLastLevel last_level() const { return d_.last_level; }
  /// Query rows `batch · q_len · heads_q`.
  std::int64_t rows() const { return d_.rows(); }

 private:
  friend struct detail::CascadePlanAccess;
  detail::CascadeChoiceData d_;
};

/// One line describing `plan` for logs: its shape, then per level the kernel it takes and why
/// (the tile, the splits, a decode level's splits and how its state meets the others', or why
/// the last level is not on the decode), e.g. `"cascade plan: batch 4, 8/2 heads, d 128, bf16,
/// 2 levels, 132 SMs; level 0: 1 segment, mma.sync, 16-row tiles, 16 splits of 64 keys; level 1
/// (last): 4 segments, split-KV decode (one segment per request), 2 splits of 128 keys, folds the
/// other levels' states, 8 SMs beside them"`.
/// @param plan  a plan from `plan_cascade`.
/// @return the line.
std::string to_string(const CascadeChoice& plan);

}  // namespace cuda
}  // namespace attnstate
