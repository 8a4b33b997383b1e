/// @file cascade_plan.cpp
/// @brief The cascade's host planner: tiles, splits, kernels and fallbacks per level, the decode
///        last level's SMs and fold, the plan's checks and the pools' tensor-map layouts.
#include "plan/cascade_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attnstate/core/error.hpp"
#include "catalog/catalog.hpp"
#include "common/cascade_positions.hpp"
#include "common/cascade_validate.hpp"
#include "plan/cascade_plan_access.hpp"
#include "plan/tuning_sm90.hpp"

namespace attnstate {
namespace plan {
namespace {

using ::attnstate::detail::cascade_str;
using ::attnstate::detail::throw_argument;
using cuda::CascadeKernel;
using Kernel = CascadeLevelKernel;
/// The recorded choices the planner writes (`CascadeChoice`'s data).
using Choice = cuda::detail::CascadeChoiceData;
using Access = cuda::detail::CascadePlanAccess;

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

/// The pool scalars of a shape, for the shared level checks.
PagedKvCache pool_of(const CascadeShape& s) {
  PagedKvCache kv;
  kv.page_size = s.page_size;
  kv.num_pages = s.num_pages;
  kv.heads_kv = s.heads_kv;
  kv.head_dim = s.head_dim;
  kv.dtype = s.pool_dtype();
  return kv;
}

/// The catalog's rows of `family` for a level of this shape (its head dim and dtypes) with tiles
/// of `tile_rows` rows (0: any) taking `variants`.
catalog::Query level_query(catalog::Family family, const CascadeShape& s, int tile_rows,
                           catalog::Variants variants = catalog::kPlain) {
  catalog::Query q;
  q.family = family;
  q.head_dim = s.head_dim;
  q.q = catalog::mask(s.dtype);
  q.kv = catalog::mask(s.pool_dtype());
  q.tile_rows = tile_rows;
  q.variants = variants;
  return q;
}

/// The kernel id of the row of `family` for a level of this shape with tiles of `tile_rows` rows
/// taking `variants`, with K/V tiles of `keys` keys and `stages` stages as far as the family's
/// rows hold them (the K/V tile before the depth; 0: any); -1 when the family holds no row.
int level_row(catalog::Family family, const CascadeShape& s, int tile_rows,
              catalog::Variants variants, int keys, int stages) {
  catalog::Query q = level_query(family, s, tile_rows, variants);
  for (const auto& [k, st] : {std::pair<int, int>{keys, stages}, {keys, 0}, {0, stages}, {0, 0}}) {
    q.tile_keys = k;
    q.stages = st;
    const int id = catalog::find_id(q);
    if (id >= 0) return id;
  }
  return -1;
}

/// The level tile for segments of at most `max_rows` query rows: the smallest tile of the
/// shape's mma.sync rows taking `variants` (every level can run on them) that holds them, else
/// their largest.
int level_tile_rows(const CascadeShape& s, std::int64_t max_rows, catalog::Variants variants) {
  const catalog::Query q = level_query(catalog::Family::kCascadeMma, s, 0, variants);
  int fits = 0, largest = 0;
  for (const catalog::Row& r : catalog::kRows) {
    if (!catalog::matches(r, q)) continue;
    largest = std::max(largest, r.tile_rows);
    if (r.tile_rows >= max_rows && (fits == 0 || r.tile_rows < fits)) fits = r.tile_rows;
  }
  return fits != 0 ? fits : largest;
}

/// Keys per K/V tile of the warp-specialised rows a resolved `ws_variant` asks for.
int ws_tile_keys(int ws_variant) {
  return ws_variant == static_cast<int>(CascadeWsVariant::kKv64) ||
                 ws_variant == static_cast<int>(CascadeWsVariant::kKv64Turns)
             ? catalog::kCascadeKvTile
             : catalog::kCascadeWsKvTile;
}

/// True when a level of this shape takes the warp-specialised kernel: the tuning takes the
/// sm_90a kernels (`wgmma_kernels`), a compiled row for its shape, tile, K/V tile and variants
/// (at a head dim without wgmma rows too), a page size with a bulk-copy box, the variant not 0.
bool ws_level(const CascadeShape& s, const CascadeLevelPlan& lp, int ws_variant,
              catalog::Variants variants, bool wgmma_kernels) {
  catalog::Query ws = level_query(catalog::Family::kCascadeWs, s, lp.tile_rows, variants);
  ws.tile_keys = ws_tile_keys(ws_variant);
  return wgmma_kernels && ws_variant != 0 && catalog::compiled(ws) && tma_box_rows(s.page_size) > 0;
}

/// The level kernel of a catalog family of cascade levels.
Kernel kernel_of(catalog::Family f) {
  return f == catalog::Family::kCascadeWs      ? Kernel::kWarpSpecialized
         : f == catalog::Family::kCascadeWgmma ? Kernel::kWgmma
                                               : Kernel::kMma;
}

/// The kernel id a level whose preferred row is `preferred` runs on a device of `facts`: the
/// catalog's fallback rule (`catalog::family_that_runs`) checking every need, with the device's
/// facts and the page size's bulk-copy box as the plan-time needs met (the run-time ones are
/// checked when the plan runs: `CascadeLevelPlan::fallback_id`), applied to each fallback row in
/// turn until the row runs (the warp-specialised row falls back to wgmma, which falls back to
/// mma.sync); each row of the level's tile and variants, at the preferred row's K/V tile and
/// depth `stages` where its family holds them. -1 when a family on the way holds no row.
int device_row(const CascadeShape& s, const catalog::Row& preferred, int stages,
               catalog::Variants variants, const CascadeDeviceFacts& facts) {
  const catalog::Needs met = static_cast<catalog::Needs>(
      catalog::kRunTimeNeeds | (facts.wgmma ? catalog::kNeedsWgmma : 0) |
      (facts.tensor_maps ? catalog::kNeedsTensorMaps : 0) |
      (tma_box_rows(s.page_size) > 0 ? catalog::kNeedsTmaBox : 0));
  constexpr catalog::Needs kEvery = catalog::kPlanTimeNeeds | catalog::kRunTimeNeeds;
  catalog::Family f = preferred.family;
  for (;;) {
    const int id = level_row(f, s, preferred.tile_rows, variants, preferred.tile_keys, stages);
    if (id < 0) return -1;
    const catalog::Family runs = catalog::family_that_runs(
        catalog::kRows[static_cast<std::size_t>(id)], met, variants, kEvery);
    if (runs == f) return id;
    f = runs;
  }
}

/// The decode's split rows that fold prior states (a decode last level folding the shared
/// levels) for this shape with its variants.
catalog::Query fold_query(const CascadeShape& s, catalog::Variants variants) {
  return level_query(catalog::Family::kDecodeSplit, s, 0, variants | catalog::kPriorStates);
}

/// The variants of a plan (its window and soft cap) as the catalog's bits.
catalog::Variants plan_variants(const Choice& plan) {
  return catalog::variants_of(plan.window_left, plan.logits_soft_cap);
}

/// Keys of each segment of level `l` that some row of it sees under the plan's window, counted
/// back from the segment's end and rounded up to whole KV tiles (`tile::LevelBlock::
/// narrow_to_window` drops the tiles before them); a request's position is that of its first row
/// (the least), from the keys from each level's segment to the request's end (`pos`, as
/// `kernels::cascade_tails_kernel` computes them on the device).
std::vector<std::int32_t> window_lens(const Choice& plan, const CascadeLevel& lv, int l,
                                      const ::attnstate::detail::CascadePositions& pos) {
  const CascadeShape& s = plan.shape;
  std::vector<std::int32_t> lens(static_cast<std::size_t>(lv.num_segments), 0);
  for (std::int64_t g = 0; g < lv.num_segments; ++g) {
    const std::int64_t len = lv.seg_lens[g];
    std::int64_t lo = len;
    for (std::int64_t b = lv.request_indptr[g]; b < lv.request_indptr[g + 1]; ++b) {
      const std::int64_t tail = pos.tail(l, b, s.batch);
      const std::int64_t p = plan.causal ? tail - s.q_len : tail - 1;
      lo = std::min(lo, std::max<std::int64_t>(0, p - plan.window_left));
    }
    lens[static_cast<std::size_t>(g)] = static_cast<std::int32_t>(len - lo / kKvTile * kKvTile);
  }
  return lens;
}

/// The row tiles of the catalog's mma.sync level rows (`cascade_tile_supported`), ascending, as
/// "16, 64 or 128".
std::string level_tiles_string() {
  std::vector<int> tiles;
  for (const catalog::Row& r : catalog::kRows)
    if (r.family == catalog::Family::kCascadeMma &&
        std::find(tiles.begin(), tiles.end(), r.tile_rows) == tiles.end())
      tiles.push_back(r.tile_rows);
  std::sort(tiles.begin(), tiles.end());
  std::string s;
  for (std::size_t i = 0; i < tiles.size(); ++i)
    s += (i == 0 ? "" : i + 1 == tiles.size() ? " or " : ", ") + std::to_string(tiles[i]);
  return s;
}

/// Checks `plan_cascade`'s scalar arguments (the shape, the SM count, the tuning).
void check_shape_and_tuning(const char* func, const CascadeShape& shape, int num_sms,
                            const CascadeTuning& tuning) {
  if (shape.batch < 1 || shape.batch > (std::int64_t{1} << 24))
    throw_argument(func, "shape.batch", "1..2^24", cascade_str(shape.batch));
  if (shape.q_len < 1 || shape.q_len > kMaxCascadeQueryLen)
    throw_argument(func, "shape.q_len", "1.." + cascade_str(kMaxCascadeQueryLen),
                   cascade_str(shape.q_len));
  if (shape.heads_kv < 1 || shape.heads_kv > 65535)
    throw_argument(func, "shape.heads_kv", "1..65535", cascade_str(shape.heads_kv));
  if (shape.heads_q < 1 || shape.heads_q % shape.heads_kv != 0 ||
      shape.heads_q / shape.heads_kv > kMaxCascadeGroup)
    throw_argument(func, "shape.heads_q",
                   "a positive multiple of heads_kv, at most " + cascade_str(kMaxCascadeGroup) +
                       " times it (the GQA group)",
                   cascade_str(shape.heads_q));
  // the kernels index query rows with 32-bit integers
  if (shape.batch * shape.q_len * shape.heads_q > 0x7FFFFFFF)
    throw_argument(func, "shape.batch", "batch * q_len * heads_q < 2^31",
                   cascade_str(shape.batch * shape.q_len * shape.heads_q));
  if (shape.page_size < 1 || shape.page_size > (1 << 20))
    throw_argument(func, "shape.page_size", "1..2^20", cascade_str(shape.page_size));
  if (shape.num_pages < 0)
    throw_argument(func, "shape.num_pages", ">= 0", cascade_str(shape.num_pages));
  // the dtype and head dim against the catalog's mma.sync level rows (every level runs on one)
  catalog::Query levels;
  levels.family = catalog::Family::kCascadeMma;
  const catalog::DTypeMask dtypes = catalog::dtypes(levels, false);
  if ((dtypes & catalog::mask(shape.dtype)) == 0)
    throw_argument(func, "shape.dtype", catalog::dtypes_string(dtypes), to_string(shape.dtype),
                   Status::kNotSupported);
  if (!cascade_head_dim_supported(shape.head_dim))
    throw_argument(func, "shape.head_dim", catalog::head_dims_string(levels),
                   cascade_str(shape.head_dim), Status::kNotSupported);
  // a K/V dtype of its own: one the catalog's mma.sync level rows take under the queries' dtype
  // at the head dim (every level can run on them)
  if (shape.kv_dtype.has_value() && *shape.kv_dtype != shape.dtype) {
    levels.q = catalog::mask(shape.dtype);
    levels.kv = catalog::kAnyDType;
    levels.head_dim = static_cast<int>(shape.head_dim);
    const catalog::DTypeMask kv = catalog::dtypes(levels, true);
    if (!is_valid(*shape.kv_dtype) || (kv & catalog::mask(*shape.kv_dtype)) == 0)
      throw_argument(
          func, "shape.kv_dtype",
          "unset, " + std::string(to_string(shape.dtype)) + " or " +
              catalog::dtypes_string(kv & ~catalog::mask(shape.dtype)) + " under " +
              to_string(shape.dtype) + " queries at head dim " + cascade_str(shape.head_dim),
          is_valid(*shape.kv_dtype) ? std::string(to_string(*shape.kv_dtype))
                                    : "value " + cascade_str(static_cast<int>(*shape.kv_dtype)),
          Status::kNotSupported);
  }
  if (num_sms < 1) throw_argument(func, "num_sms", ">= 1", cascade_str(num_sms));
  if (tuning.tile_rows != 0 && !cascade_tile_supported(tuning.tile_rows))
    throw_argument(func, "tuning.tile_rows", "0 (automatic), " + level_tiles_string(),
                   cascade_str(tuning.tile_rows));
  if (tuning.kernel != CascadeKernel::kAuto && tuning.kernel != CascadeKernel::kMma &&
      tuning.kernel != CascadeKernel::kWgmma)
    throw_argument(func, "tuning.kernel", "kAuto, kMma or kWgmma",
                   "value " + cascade_str(static_cast<int>(tuning.kernel)));
  if (tuning.chunk < 0 || tuning.chunk % kKvTile != 0)
    throw_argument(func, "tuning.chunk", "0 or a positive multiple of 64",
                   cascade_str(tuning.chunk));
  if (tuning.decode_sms < -1 || tuning.decode_sms >= num_sms)
    throw_argument(func, "tuning.decode_sms", "-1 (automatic) or 0..num_sms - 1",
                   cascade_str(tuning.decode_sms));
  if (tuning.ws_variant < -1 || tuning.ws_variant > 4)
    throw_argument(func, "tuning.ws_variant", "-1 (automatic) or 0..4",
                   cascade_str(tuning.ws_variant));
  if (tuning.decode_fold < -1 || tuning.decode_fold > 1)
    throw_argument(func, "tuning.decode_fold", "-1 (automatic), 0 or 1",
                   cascade_str(tuning.decode_fold));
  if (tuning.decode_kernel != DecodeKernel::kAuto && tuning.decode_kernel != DecodeKernel::kSplit &&
      tuning.decode_kernel != DecodeKernel::kStreamed)
    throw_argument(func, "tuning.decode_kernel", "kAuto, kSplit or kStreamed",
                   "value " + cascade_str(static_cast<int>(tuning.decode_kernel)));
  // a fixed split count of the decode level goes to plan_decode, which takes 1..kMaxSplits
  if (tuning.decode_splits < 0 || tuning.decode_splits > ::attnstate::kMaxSplits)
    throw_argument(func, "tuning.decode_splits",
                   "0 (automatic) or 1.." + cascade_str(::attnstate::kMaxSplits),
                   cascade_str(tuning.decode_splits));
}

/// Plans a unique last level on the split-KV decode (the level's plan).
void plan_decode_level(Choice& plan, const CascadeLevel& lv, const CascadeTuning& tuning,
                       int num_sms, const PlanDecodeLevelFn& plan_decode) {
  DecodeOptions dopt;
  dopt.scale = plan.scale;
  dopt.variant.logits_soft_cap = plan.logits_soft_cap;  // the decode's variant kernel
  dopt.variant.window_left = plan.window_left;
  if (tuning.decode_splits > 0) {
    dopt.policy = SplitPolicy::kFixedCount;
    dopt.num_splits = tuning.decode_splits;
  }
  dopt.kernel = tuning.decode_kernel;
  const CascadeDecodeLevel d =
      plan_decode(cascade_decode_problem(plan.shape), lv.seg_lens, dopt, num_sms);
  CascadeLevelPlan& lp = plan.levels[plan.num_levels - 1];
  lp.decode = true;
  lp.kernel = Kernel::kDecode;
  lp.fallback = Kernel::kDecode;
  lp.tile_rows = 16;
  lp.max_tiles = d.row_tiles;
  lp.chunk = d.splits.policy == SplitPolicy::kFixedSize ? d.splits.split_size : 0;
  lp.max_splits = d.splits.max_splits;
}

/// CTAs of the last level's decode (its row tiles and splits recorded in its level plan).
std::int64_t decode_ctas(const Choice& plan) {
  const CascadeLevelPlan& d = plan.levels[plan.num_levels - 1];
  return plan.shape.batch * plan.shape.heads_kv * d.max_tiles *
         std::max<std::int64_t>(1, d.max_splits);
}

/// SMs the shared levels leave to the decode of the last level (`CascadeTuning::decode_sms`):
/// automatically, enough for every decode CTA at once when they take at most half of the SMs
/// and every shared segment is short (a latency-bound level loses little to fewer SMs, and the
/// decode then runs entirely beside it instead of after it); else none.
int reserved_sms(const Choice& plan, const CascadeLevel* host_levels, const CascadeTuning& tuning,
                 int num_sms) {
  if (plan.num_levels < 2) return 0;  // no shared level to run beside
  if (tuning.decode_sms >= 0) return std::min(tuning.decode_sms, num_sms - 1);
  const std::int64_t need =
      ceil_div(decode_ctas(plan), cuda::tuning::kCascadeReserveDecodeCtasPerSm);
  if (need > num_sms / 2) return 0;
  for (int l = 0; l + 1 < plan.num_levels; ++l) {
    const CascadeLevel& lv = host_levels[l];
    for (std::int64_t s = 0; s < lv.num_segments; ++s)
      if (lv.seg_lens[s] > cuda::tuning::kCascadeReserveMaxSharedKeys) return 0;
  }
  return static_cast<int>(need);
}

/// Throws `Status::kNotSupported` for a level whose kernel (of `family`, for the shape, tile
/// and variants) the catalog does not hold.
[[noreturn]] void no_level_row(const char* func, int l, catalog::Family family,
                               const CascadeShape& s, int tile_rows, catalog::Variants variants) {
  throw_argument(
      func, ::attnstate::detail::cascade_level_arg(l, "num_segments").c_str(),
      catalog::not_supported_message(level_query(family, s, tile_rows, variants)),
      std::string(catalog::to_string(family)) + " with " + std::to_string(tile_rows) + "-row tiles",
      Status::kNotSupported);
}

/// Plans level `l` on a cascade level kernel: its tile, split, kernel and fallback (catalog
/// rows); `lens`: the keys of each segment the splits cover (its length, or the part a window
/// reaches).
void plan_kernel_level(const char* func, Choice& plan, int l, const CascadeLevel& lv,
                       const std::int32_t* lens, const CascadeTuning& tuning,
                       const CascadeDeviceFacts& facts) {
  const CascadeShape& shape = plan.shape;
  CascadeLevelPlan& lp = plan.levels[l];
  const std::int64_t rows_per_req = shape.q_len * (shape.heads_q / shape.heads_kv);
  std::int64_t max_rows = 0, max_len = 0;
  for (std::int64_t s = 0; s < lv.num_segments; ++s) {
    const std::int64_t rows = (lv.request_indptr[s + 1] - lv.request_indptr[s]) * rows_per_req;
    max_rows = std::max(max_rows, rows);
    if (rows > 0) max_len = std::max<std::int64_t>(max_len, lens[s]);
  }
  const catalog::Variants variants = plan_variants(plan);
  lp.tile_rows =
      tuning.tile_rows != 0 ? tuning.tile_rows : level_tile_rows(shape, max_rows, variants);
  if (tuning.tile_rows == 0 && shape.head_dim > cuda::tuning::kCascadeWsWideHeadDim &&
      lp.tile_rows > cuda::tuning::kCascadeWsWideTileRows) {
    // wide heads on the warp-specialised kernel: the smaller tile where its row exists
    CascadeLevelPlan narrow = lp;
    narrow.tile_rows = cuda::tuning::kCascadeWsWideTileRows;
    if (ws_level(shape, narrow, plan.ws_variant, variants, tuning.kernel != CascadeKernel::kMma))
      lp.tile_rows = narrow.tile_rows;
  }
  std::vector<std::int64_t> tiles(static_cast<std::size_t>(lv.num_segments));
  std::int64_t max_tiles = 1;
  for (std::int64_t s = 0; s < lv.num_segments; ++s) {
    tiles[s] =
        ceil_div((lv.request_indptr[s + 1] - lv.request_indptr[s]) * rows_per_req, lp.tile_rows);
    max_tiles = std::max(max_tiles, tiles[s]);
  }
  lp.max_tiles = static_cast<int>(max_tiles);
  // wgmma where the catalog holds a wgmma row for the shape, the tile and the variant; the
  // others run on mma.sync
  lp.wgmma =
      tuning.kernel != CascadeKernel::kMma &&
      catalog::compiled(level_query(catalog::Family::kCascadeWgmma, shape, lp.tile_rows, variants));
  // The preferred row: the kernel the shape takes on an sm_90a device, whatever the device (so
  // the splits, and the bits, of a plan do not depend on it). The split is sized for its CTAs
  // per SM, in whole KV tiles of it (128 keys for the warp-specialised 128-key tiles).
  const bool ws =
      ws_level(shape, lp, plan.ws_variant, variants, tuning.kernel != CascadeKernel::kMma);
  lp.wgmma = lp.wgmma || ws;
  const catalog::Family preferred_family = ws         ? catalog::Family::kCascadeWs
                                           : lp.wgmma ? catalog::Family::kCascadeWgmma
                                                      : catalog::Family::kCascadeMma;
  const int preferred_id = level_row(preferred_family, shape, lp.tile_rows, variants,
                                     ws ? ws_tile_keys(plan.ws_variant) : 0, 0);
  if (preferred_id < 0) no_level_row(func, l, preferred_family, shape, lp.tile_rows, variants);
  const catalog::Row& preferred = catalog::kRows[static_cast<std::size_t>(preferred_id)];
  lp.chunk = tuning.chunk != 0
                 ? tuning.chunk
                 : choose_chunk(tiles.data(), lens, lv.num_segments, max_len, shape.heads_kv,
                                preferred.ctas_per_sm, plan.num_sms - plan.decode_sms, plan.rows(),
                                shape.head_dim, preferred.tile_keys);
  lp.max_splits = static_cast<int>(std::max<std::int64_t>(1, ceil_div(max_len, lp.chunk)));
  // The kernel: the preferred row's, or the fallback the catalog's rule gives on this device, at
  // the depth the split asks for where its family holds it. The tensor map of a run's pool may
  // still not exist (its layout and page stride are known only then): that run takes the row's
  // fallback by the same rule, recorded here.
  const int stages = small_stages(lp.chunk);
  lp.kernel_id = device_row(shape, preferred, stages, variants, facts);
  if (lp.kernel_id < 0)
    no_level_row(func, l, catalog::Family::kCascadeMma, shape, lp.tile_rows, variants);
  const catalog::Row& row = catalog::kRows[static_cast<std::size_t>(lp.kernel_id)];
  const catalog::Family fallback = catalog::family_that_runs(row, catalog::kNeedsNothing, variants);
  lp.fallback_id = fallback == row.family
                       ? lp.kernel_id
                       : level_row(fallback, shape, row.tile_rows, variants, row.tile_keys, stages);
  if (lp.fallback_id < 0) no_level_row(func, l, fallback, shape, row.tile_rows, variants);
  lp.kernel = kernel_of(row.family);
  lp.fallback = kernel_of(catalog::kRows[static_cast<std::size_t>(lp.fallback_id)].family);
  lp.tile_rows = row.tile_rows;
  lp.stages = row.stages;
  if (lp.kernel == Kernel::kWarpSpecialized) {
    lp.ws_variant = plan.ws_variant;
    lp.tma_box = tma_box_rows(shape.page_size);
    lp.tma_run = tma_run_keys(shape.page_size);
  }
}

}  // namespace

int tma_box_rows(std::int64_t page_size) {
  if (page_size >= kKvTile) return page_size % kKvTile == 0 ? kKvTile : 0;
  return page_size >= 8 && kKvTile % page_size == 0 ? static_cast<int>(page_size) : 0;
}

int tma_run_keys(std::int64_t page_size) {
  // 64-key runs (see bench/RESULTS.md for runs of 32 and 64 keys against boxes of one page)
  const int keys = kKvTile;
  const int box = tma_box_rows(page_size);
  return box > 0 && box < keys && keys % box == 0 && kKvTile % keys == 0 ? keys : 0;
}

int resolve_ws_variant(int asked, std::int64_t head_dim) {
  if (asked >= 0) return asked;
  // the warp-specialised rows at head dim 256 have 64-key tiles only (catalog.hpp)
  return static_cast<int>(head_dim > 128 ? CascadeWsVariant::kKv64 : CascadeWsVariant::kKv128);
}

int small_stages(int chunk) {
  return chunk >= cuda::tuning::kCascadeDeepStagesTiles * kKvTile ? 3 : 2;
}

int choose_chunk(const std::int64_t* tiles, const std::int32_t* lens, std::int64_t nseg,
                 std::int64_t max_len, std::int64_t heads_kv, int ctas_per_sm, int num_sms,
                 std::int64_t rows_total, std::int64_t head_dim, std::int64_t granule) {
  if (max_len <= 0) return kKvTile;
  const std::int64_t slots = static_cast<std::int64_t>(num_sms) * ctas_per_sm;
  std::int64_t best_chunk = ceil_div(max_len, granule) * granule;
  double best_cost = std::numeric_limits<double>::infinity();
  std::int64_t prev = -1;
  for (int n = 1; n <= cuda::tuning::kCascadeMaxLevelSplits; ++n) {
    const std::int64_t chunk = ceil_div(ceil_div(max_len, n), granule) * granule;
    if (chunk == prev) continue;
    prev = chunk;
    const std::int64_t splits = ceil_div(max_len, chunk);
    // partial states beyond 1 GiB of workspace are not worth it
    if (splits > 1 && rows_total * splits * head_dim * 4 > (std::int64_t{1} << 30)) break;
    std::int64_t ctas = 0;
    for (std::int64_t s = 0; s < nseg; ++s)
      ctas += tiles[s] * std::max<std::int64_t>(1, ceil_div(lens[s], chunk));
    ctas *= heads_kv;
    const std::int64_t waves = ceil_div(ctas, slots);
    // a CTA costs its keys plus a fixed start-up; each split adds partial-state traffic
    const double cost = static_cast<double>(waves) * static_cast<double>(chunk + 2 * kKvTile) +
                        4.0 * static_cast<double>(splits);
    if (cost < best_cost) {
      best_cost = cost;
      best_chunk = chunk;
    }
    if (chunk == granule) break;
  }
  return static_cast<int>(best_chunk);
}

cuda::CascadeLastLevel last_level_choice(const CascadeShape& shape, const CascadeLevel& lv,
                                         const CascadeOptions& options,
                                         const CascadeTuning& tuning) {
  using W = cuda::CascadeLastLevel;
  if (!tuning.decode_last_level) return W::kTurnedOff;
  if (lv.num_segments != shape.batch) return W::kShared;
  for (std::int64_t s = 0; s <= lv.num_segments; ++s)
    if (lv.request_indptr[s] != s) return W::kShared;
  if (shape.q_len > 1 && !options.causal) return W::kNotCausal;
  if (lv.page_indptr[lv.num_segments] <= 0) return W::kNoPages;
  const catalog::Variants variants =
      catalog::variants_of(options.variant.window_left, options.variant.logits_soft_cap);
  if (!catalog::compiled(level_query(catalog::Family::kDecodeSplit, shape, 0, variants)))
    return W::kNoDecodeKernel;
  return W::kDecode;
}

bool decode_eligible(const CascadeShape& shape, const CascadeLevel& lv, int l, int num_levels,
                     const CascadeOptions& options, const CascadeTuning& tuning) {
  return l == num_levels - 1 &&
         last_level_choice(shape, lv, options, tuning) == cuda::CascadeLastLevel::kDecode;
}

DecodeProblem cascade_decode_problem(const CascadeShape& shape) {
  DecodeProblem dp;
  dp.batch = shape.batch;
  dp.q_len = shape.q_len;
  dp.heads_q = shape.heads_q;
  dp.heads_kv = shape.heads_kv;
  dp.head_dim = shape.head_dim;
  dp.q_dtype = shape.dtype;
  dp.kv_dtype = shape.pool_dtype();
  return dp;
}

CascadeChoice plan_cascade(const char* func, const CascadeShape& shape,
                           const CascadeLevel* host_levels, int num_levels,
                           const CascadeOptions& options, int num_sms, const CascadeTuning& tuning,
                           const CascadeDeviceFacts& facts, const PlanDecodeLevelFn& plan_decode) {
  ::attnstate::detail::check_variant(func, "options.variant", options.variant);
  check_shape_and_tuning(func, shape, num_sms, tuning);
  ::attnstate::detail::check_cascade_levels(func, host_levels, num_levels, shape.batch, shape.q_len,
                                            options.causal, pool_of(shape), true);
  CascadeChoice choice;
  Choice& plan = Access::data(choice);
  plan.catalog_fingerprint = catalog::kFingerprint;
  plan.overlap_levels = tuning.overlap_levels;
  plan.prefetch_pages = tuning.prefetch_pages;
  plan.shape = shape;
  plan.num_levels = num_levels;
  plan.scale = ::attnstate::detail::cascade_scale(func, options, shape.head_dim);
  plan.ws_variant = resolve_ws_variant(tuning.ws_variant, shape.head_dim);
  plan.causal = options.causal;
  plan.logits_soft_cap = options.variant.logits_soft_cap;
  plan.window_left = options.variant.window_left;
  plan.num_sms = num_sms;
  plan.wgmma_available = facts.wgmma;
  plan.tensor_maps = facts.tensor_maps;
  // A last level on the decode is planned first: the shared levels may leave it some SMs.
  const int last = num_levels - 1;
  plan.last_level = plan_decode ? last_level_choice(shape, host_levels[last], options, tuning)
                                : cuda::CascadeLastLevel::kOnlyShared;
  const bool decode_last = plan.last_level == cuda::CascadeLastLevel::kDecode;
  if (decode_last) plan_decode_level(plan, host_levels[last], tuning, num_sms, plan_decode);
  plan.decode_sms = decode_last ? reserved_sms(plan, host_levels, tuning, num_sms) : 0;
  // The decode folds the shared levels' states (no merge launch) when its CTAs wait beside them
  // on SMs of their own, or when it is a wave or two: then few CTAs hold their slots while they
  // wait. A larger decode runs ahead on whatever SMs the shared levels leave and a merge launch
  // follows (bench/RESULTS.md: the merge launch won at batch 128 and 256, the fold at 16 and 64).
  plan.decode_fold =
      !decode_last || num_levels == 1 || tuning.decode_fold == 1 ||
      (tuning.decode_fold == -1 &&
       (plan.decode_sms > 0 ||
        decode_ctas(plan) <= cuda::tuning::kCascadeFoldMaxDecodeWaves *
                                 cuda::tuning::kCascadeReserveDecodeCtasPerSm * num_sms));
  // no decode instance of the variant folds prior states (the catalog): the decode writes its
  // own slot
  const catalog::Query fold = fold_query(shape, plan_variants(plan));
  if (decode_last && num_levels > 1 && !catalog::compiled(fold)) {
    if (tuning.decode_fold == 1)
      throw_argument(func, "tuning.decode_fold",
                     "-1 or 0 with this variant (no decode kernel folds its prior states: " +
                         catalog::not_supported_message(fold) + ")",
                     "1", Status::kNotSupported);
    plan.decode_fold = false;
  }
  std::int64_t slots = 0;
  ::attnstate::detail::CascadePositions pos;  // (a window's: where the requests' keys lie)
  for (int l = 0; l < num_levels; ++l) {
    const CascadeLevel& lv = host_levels[l];
    CascadeLevelPlan& lp = plan.levels[l];
    lp.num_segments = lv.num_segments;
    lp.has_pages = lv.page_indptr[lv.num_segments] > 0;
    lp.slot_offset = static_cast<int>(slots);
    if (l == last && decode_last) {
      slots += 1;  // the decode merges its own splits: one state per row
      continue;
    }
    if (plan.window_left >= 0) {
      if (pos.total.empty())
        pos = ::attnstate::detail::cascade_positions(host_levels, num_levels, shape.batch);
      const std::vector<std::int32_t> lens = window_lens(plan, lv, l, pos);
      plan_kernel_level(func, plan, l, lv, lens.data(), tuning, facts);
    } else {
      plan_kernel_level(func, plan, l, lv, lv.seg_lens, tuning, facts);
    }
    slots += lp.max_splits;
    const std::int64_t grid = lv.num_segments * lp.max_tiles * lp.max_splits;
    if (grid >= (std::int64_t{1} << 31) || slots > (1 << 20))
      throw_argument(func, ::attnstate::detail::cascade_level_arg(l, "num_segments").c_str(),
                     "a level of fewer than 2^31 (segment, tile, split) blocks", cascade_str(grid),
                     Status::kNotSupported);
  }
  plan.num_slots = static_cast<int>(slots);
  return choice;
}

std::size_t partials_o_bytes(const CascadeChoice& choice) {
  const Choice& plan = Access::data(choice);
  return align_up(static_cast<std::size_t>(plan.num_slots) * static_cast<std::size_t>(plan.rows()) *
                  static_cast<std::size_t>(plan.shape.head_dim) * sizeof(float));
}

std::size_t partials_bytes(const CascadeChoice& choice) {
  const Choice& plan = Access::data(choice);
  const std::size_t slots_rows =
      static_cast<std::size_t>(plan.num_slots) * static_cast<std::size_t>(plan.rows());
  return partials_o_bytes(choice) + align_up(slots_rows * sizeof(float));
}

std::size_t window_tails_bytes(const CascadeChoice& choice) {
  const Choice& plan = Access::data(choice);
  return plan.window_left < 0
             ? 0
             : align_up(static_cast<std::size_t>(plan.num_levels) *
                        static_cast<std::size_t>(plan.shape.batch) * sizeof(std::int32_t));
}

void check_cascade_plan(const char* func, const CascadeChoice& choice) {
  const Choice& plan = Access::data(choice);
  if (plan.catalog_fingerprint == catalog::kFingerprint) return;
  char want[24], got[24];
  std::snprintf(want, sizeof want, "%016llx",
                static_cast<unsigned long long>(catalog::kFingerprint));
  std::snprintf(got, sizeof got, "%016llx",
                static_cast<unsigned long long>(plan.catalog_fingerprint));
  throw_argument(
      func, "plan",
      std::string("a plan from plan_cascade of this build (kernel catalog fingerprint ") + want +
          ")",
      plan.catalog_fingerprint == 0
          ? std::string("a plan no planner made (default-constructed)")
          : std::string("a plan of another kernel catalog (fingerprint ") + got + ")");
}

CascadeTmaLayout describe_cascade_kv_maps(const PagedKvCache& kv, int box, int run) {
  CascadeTmaLayout t;
  catalog::Query ws;
  ws.family = catalog::Family::kCascadeWs;
  ws.head_dim = kv.head_dim;
  if (!catalog::compiled(ws) || kv.page_size % 8 != 0 ||
      kv.num_pages > std::numeric_limits<std::int32_t>::max())
    return t;
  // bytes per element: 16-bit, or an fp8 pool's bytes (copied as they are; the kernel converts)
  const std::int64_t e = is_fp8(kv.dtype) ? 1 : 2;
  const std::int64_t S = kv.page_size, H = kv.heads_kv, D = kv.head_dim, P = kv.num_pages;
  const std::int64_t page_bytes = kv.page_elems() * e;
  const std::int64_t Hf = D / 64;  // the 64-wide parts of head_dim ("halves" at 128)
  t.box = box;
  t.run = run;
  const auto set = [&t](const std::int64_t(&d)[5], const std::int64_t(&st)[4]) {
    std::copy(d, d + 5, t.dims);
    std::copy(st, st + 4, t.strides);
  };
  if (kv.layout == KvLayout::kNHD) {
    t.coords = 0;  // (64 of head_dim, 8 slots, KV head · Hf + half, slot / 8, page)
    set({64, 8, Hf * H, S / 8, P}, {H * D * e, 64 * e, 8 * H * D * e, page_bytes});
  } else if (page_bytes == H * S * D * e && P * H <= std::numeric_limits<std::int32_t>::max()) {
    t.coords = 1;  // (64, 8 slots, half, slot / 8, page · heads_kv + KV head)
    t.run = 0;
    set({64, 8, Hf, S / 8, P * H}, {D * e, 64 * e, 8 * D * e, S * D * e});
  } else {
    t.coords = 2;  // (64, slot, half, KV head, page): boxes of 8 slots
    t.box = 8;
    t.run = 0;
    set({64, S, Hf, H, P}, {D * e, 64 * e, S * D * e, page_bytes});
  }
  for (const std::int64_t st : t.strides)
    if (st % 16 != 0 || st >= (std::int64_t{1} << 40)) return t;
  const std::int64_t G = t.box;
  const std::int64_t page_box[5] = {64, 8, Hf, t.coords == 2 ? 1 : G / 8, 1};
  const std::int64_t run_box[5] = {64, 8, Hf, G / 8, t.run / G};
  std::copy(page_box, page_box + 5, t.page_box);
  std::copy(run_box, run_box + 5, t.run_box);
  t.describable = true;
  return t;
}

}  // namespace plan

namespace cuda {

const CascadeLevelPlan& CascadeChoice::level(int l) const {
  if (l < 0 || l >= d_.num_levels)
    ::attnstate::detail::throw_argument("attnstate::cuda::CascadeChoice::level", "l",
                                        "0.." + std::to_string(d_.num_levels - 1),
                                        std::to_string(l));
  return d_.levels[l];
}

std::string to_string(const CascadeChoice& choice) {
  using K = CascadeLevelKernel;
  const detail::CascadeChoiceData& plan = ::attnstate::plan::Access::data(choice);
  const CascadeShape& s = plan.shape;
  std::string out =
      "cascade plan: batch " + std::to_string(s.batch) + ", " + std::to_string(s.heads_q) + "/" +
      std::to_string(s.heads_kv) + " heads, d " + std::to_string(s.head_dim) + ", " +
      attnstate::to_string(s.dtype) +
      (s.pool_dtype() != s.dtype ? std::string(", K/V ") + attnstate::to_string(s.pool_dtype())
                                 : std::string()) +
      (s.q_len > 1 ? ", q_len " + std::to_string(s.q_len) : std::string()) +
      (plan.logits_soft_cap != 0.f ? ", soft cap " + std::to_string(plan.logits_soft_cap)
                                   : std::string()) +
      (plan.window_left >= 0 ? ", window " + std::to_string(plan.window_left) : std::string()) +
      ", " + std::to_string(plan.num_levels) + " level" + (plan.num_levels > 1 ? "s" : "") + ", " +
      std::to_string(plan.num_sms) + " SMs";
  const auto splits = [](int n, int chunk) {
    return std::to_string(n) + (n == 1 ? " split" : " splits") +
           (chunk > 0 ? " of " + std::to_string(chunk) + " keys" : std::string());
  };
  for (int l = 0; l < plan.num_levels; ++l) {
    const CascadeLevelPlan& lp = plan.levels[l];
    const bool last = l == plan.num_levels - 1;
    out += "; level " + std::to_string(l) + (last ? " (last): " : ": ") +
           std::to_string(lp.num_segments) + (lp.num_segments == 1 ? " segment, " : " segments, ");
    if (lp.decode) {
      out += "split-KV decode (one segment per request), " + splits(lp.max_splits, lp.chunk) +
             (plan.num_levels == 1 ? ", writes the output"
              : plan.decode_fold   ? ", folds the other levels' states"
                                   : ", its own slot and a merge launch");
      if (plan.decode_sms > 0) out += ", " + std::to_string(plan.decode_sms) + " SMs beside them";
      continue;
    }
    out += lp.kernel == K::kWarpSpecialized ? "warp-specialised wgmma"
           : lp.kernel == K::kWgmma         ? "wgmma"
                                            : "mma.sync";
    if (lp.kernel == K::kMma && lp.wgmma) out += " (wgmma not on this device)";
    if (catalog::variants_of(plan.window_left, plan.logits_soft_cap) != catalog::kPlain)
      out += " (the variant kernel)";
    out += ", " + std::to_string(lp.tile_rows) + "-row tiles, " + splits(lp.max_splits, lp.chunk);
    if (last) {
      static const char* const why[] = {"",
                                        "not the decode: tuning.decode_last_level is off",
                                        "not the decode: a segment serves several requests",
                                        "not the decode: q_len > 1 without the causal mask",
                                        "not the decode: no pages",
                                        "not the decode: planned without one",
                                        "not the decode: no decode kernel for its dtypes and "
                                        "variant"};
      const int w = static_cast<int>(plan.last_level);
      if (w > 0 && w < static_cast<int>(std::size(why))) out += std::string(", ") + why[w];
    }
  }
  return out;
}

}  // namespace cuda
}  // namespace attnstate
