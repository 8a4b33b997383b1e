/// @file test_plan_cascade.cpp
/// @brief The host-only cascade planner (src/plan/cascade_plan.hpp) against its documented
///        rules: tile rows per level, the split choice, wgmma eligibility, the warp-specialised
///        kernel by page size, the decode last level (eligibility, SMs, fold), the kernel and the
///        fallback recorded from the device facts, the pools' tensor-map layouts and the plan's
///        checks. No CUDA, no GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "compiled_dims.hpp"
#include "plan/cascade_plan.hpp"
#include "plan/cascade_plan_access.hpp"

namespace {

using attnstate::CascadeLevel;
using attnstate::CascadeOptions;
using attnstate::DecodeOptions;
using attnstate::DecodeProblem;
using attnstate::DType;
using attnstate::Error;
using attnstate::KvLayout;
using attnstate::PagedKvCache;
using attnstate::SplitLayout;
using attnstate::SplitPolicy;
using attnstate::Status;
using attnstate::cuda::CascadeChoice;
using attnstate::cuda::CascadeKernel;
using attnstate::cuda::CascadeShape;
using attnstate::cuda::CascadeTuning;
using Kernel = attnstate::cuda::CascadeLevelKernel;
namespace plan = attnstate::plan;

constexpr const char* kFn = "test";

/// Host arrays of one level: `reqs[s]` requests and `lens[s]` keys in segment `s`, pages of
/// `page_size` keys numbered in order.
struct Level {
  std::vector<std::int32_t> req{0}, pip{0}, pix, lens;
  Level(const std::vector<std::int32_t>& reqs, const std::vector<std::int32_t>& seg_lens,
        std::int64_t page_size) {
    for (std::size_t s = 0; s < reqs.size(); ++s) {
      req.push_back(req.back() + reqs[s]);
      const auto pages = static_cast<std::int32_t>((seg_lens[s] + page_size - 1) / page_size);
      for (std::int32_t p = 0; p < pages; ++p) pix.push_back(static_cast<std::int32_t>(pix.size()));
      pip.push_back(pip.back() + pages);
      lens.push_back(seg_lens[s]);
    }
  }
  CascadeLevel view() const {
    CascadeLevel lv;
    lv.num_segments = static_cast<std::int64_t>(lens.size());
    lv.request_indptr = req.data();
    lv.page_indptr = pip.data();
    lv.page_indices = nullptr;  // a CUDA plan need not see the page ids
    lv.seg_lens = lens.data();
    return lv;
  }
};

CascadeShape shape(std::int64_t batch, std::int64_t heads_kv, std::int64_t group,
                   std::int64_t page_size, DType dt = DType::kBF16, std::int64_t head_dim = 128,
                   std::int64_t q_len = 1) {
  CascadeShape s;
  s.batch = batch;
  s.q_len = q_len;
  s.heads_kv = heads_kv;
  s.heads_q = heads_kv * group;
  s.head_dim = head_dim;
  s.page_size = page_size;
  s.num_pages = 1 << 20;
  s.dtype = dt;
  return s;
}

plan::CascadeDeviceFacts sm90a() { return {true, true}; }

/// A stand-in decode planner: one fixed-size split layout of `max_splits` splits of `split`
/// tokens and `row_tiles` row tiles; counts its calls.
struct FakeDecode {
  int calls = 0;
  std::int32_t max_splits = 1, split = 256;
  int row_tiles = 1;
  plan::PlanDecodeLevelFn fn() {
    return [this](const DecodeProblem&, const std::int32_t*, const DecodeOptions& o, int) {
      ++calls;
      plan::CascadeDecodeLevel d;
      d.splits.policy =
          o.policy == SplitPolicy::kFixedCount ? SplitPolicy::kFixedCount : SplitPolicy::kFixedSize;
      d.splits.split_size = split;
      d.splits.max_splits = o.policy == SplitPolicy::kFixedCount ? o.num_splits : max_splits;
      d.row_tiles = row_tiles;
      return d;
    };
  }
};

CascadeChoice plan_levels(const CascadeShape& s, const std::vector<Level>& levels,
                          const CascadeTuning& tuning = {},
                          plan::CascadeDeviceFacts facts = sm90a(), int num_sms = 132,
                          plan::PlanDecodeLevelFn decode = nullptr, bool causal = true) {
  std::vector<CascadeLevel> views;
  for (const Level& l : levels) views.push_back(l.view());
  CascadeOptions o;
  o.causal = causal;
  return plan::plan_cascade(kFn, s, views.data(), static_cast<int>(views.size()), o, num_sms,
                            tuning, facts, decode);
}

/// A decode last level's planner that records the options it is asked with in `*seen` and plans
/// one split of 256 keys per request.
plan::PlanDecodeLevelFn one_split_decode(DecodeOptions* seen) {
  return [seen](const DecodeProblem&, const std::int32_t*, const DecodeOptions& o, int) {
    *seen = o;
    plan::CascadeDecodeLevel d;
    d.splits.policy = SplitPolicy::kFixedSize;
    d.splits.split_size = 256;
    d.splits.max_splits = 1;
    d.row_tiles = 1;
    return d;
  };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(PlanCascade, TileRowsFollowTheRowsOfTheLargestSegment) {
  // group 4: a request is 4 query rows; one segment shared by the whole batch
  for (const auto& [batch, rows] : std::vector<std::pair<int, int>>{
           {1, 16}, {4, 16}, {5, 64}, {16, 64}, {17, 128}, {64, 128}}) {
    const CascadeChoice p = plan_levels(shape(batch, 2, 4, 16), {Level({batch}, {4096}, 16)});
    EXPECT_EQ(p.level(0).tile_rows, rows) << "batch " << batch;
    EXPECT_EQ(p.level(0).max_tiles, (batch * 4 + rows - 1) / rows) << "batch " << batch;
  }
  CascadeTuning t;
  t.tile_rows = 16;
  EXPECT_EQ(plan_levels(shape(64, 2, 4, 16), {Level({64}, {4096}, 16)}, t).level(0).tile_rows, 16);
}

TEST(PlanCascade, WideHeadsTakeTheNarrowWarpSpecialisedTile) {
  // Head dim 256, 128 requests of group 4 sharing one segment (512 rows): where the catalog holds
  // the warp-specialised 64-row row, the level takes it instead of the 128-row tile the rows
  // would ask for; a tile asked for by the tuning, or the mma.sync kernels, keep the rows' tile.
  namespace catalog = attnstate::catalog;
  const CascadeShape s = shape(128, 8, 4, 16, DType::kBF16, 256);
  catalog::Query ws;
  ws.family = catalog::Family::kCascadeWs;
  ws.head_dim = 256;
  ws.tile_rows = 64;
  if (!catalog::compiled(ws)) GTEST_SKIP() << "no warp-specialised rows at head dim 256";
  const std::vector<Level> one = {Level({128}, {32768}, 16)};
  const CascadeChoice p = plan_levels(s, one);
  EXPECT_EQ(p.level(0).kernel, Kernel::kWarpSpecialized);
  EXPECT_EQ(p.level(0).tile_rows, 64);
  EXPECT_EQ(p.level(0).max_tiles, 8);
  CascadeTuning t;
  t.tile_rows = 128;
  EXPECT_EQ(plan_levels(s, one, t).level(0).tile_rows, 128);
  t = {};
  t.kernel = CascadeKernel::kMma;
  EXPECT_EQ(plan_levels(s, one, t).level(0).tile_rows, 128);
  // head dim 128 keeps the 128-row tile
  EXPECT_EQ(plan_levels(shape(128, 8, 4, 16), one).level(0).tile_rows, 128);
}

TEST(PlanCascade, ChooseChunkPinsTheWaveHeuristic) {
  const std::int64_t one[] = {1}, two[] = {2, 2, 2, 2};
  const std::int32_t long_len[] = {32768}, short_len[] = {1024}, four[] = {1000, 1000, 1000, 1000};
  // 8 KV heads on 132 SMs, one CTA per SM, 128-key granules: 16 splits fill one wave
  EXPECT_EQ(plan::choose_chunk(one, long_len, 1, 32768, 8, 1, 132, 256, 128, 128), 2048);
  // two CTAs per SM, 64-key granules: 32 splits
  EXPECT_EQ(plan::choose_chunk(one, long_len, 1, 32768, 8, 2, 132, 256, 128, 64), 1024);
  // one CTA alone: the smallest split wins (start-up of 2 tiles vs 4 per split)
  EXPECT_EQ(plan::choose_chunk(one, short_len, 1, 1024, 1, 2, 132, 16, 128, 64), 64);
  // a full machine: unsplit (a second wave costs more than it saves)
  EXPECT_EQ(plan::choose_chunk(two, four, 4, 1000, 2, 2, 10, 64, 128, 64), 1024);
  // partial states past 1 GiB are not worth it: unsplit
  EXPECT_EQ(plan::choose_chunk(one, short_len, 1, 4096, 1, 2, 132, std::int64_t{1} << 22, 128, 64),
            4096);
  EXPECT_EQ(plan::choose_chunk(one, short_len, 1, 0, 1, 2, 132, 16, 128, 64), 64);
}

TEST(PlanCascade, PlannedSplitsUseTheKernelsGranule) {
  // bf16, head_dim 128, 256 rows (2 tiles of 128), 16-key pages: the warp-specialised kernel,
  // one CTA per SM: 8 splits × 2 tiles × 8 KV heads fill one wave of 132 SMs
  const CascadeChoice ws = plan_levels(shape(64, 8, 4, 16), {Level({64}, {32768}, 16)});
  EXPECT_EQ(ws.level(0).kernel, Kernel::kWarpSpecialized);
  EXPECT_EQ(ws.level(0).tile_rows, 128);
  EXPECT_EQ(ws.level(0).max_tiles, 2);
  EXPECT_EQ(ws.level(0).chunk, 4096);
  EXPECT_EQ(ws.level(0).max_splits, 8);
  EXPECT_EQ(ws.num_slots(), 8);
  // 1000 keys, one tile, one KV head: splits of whole 128-key tiles for the warp-specialised
  // kernel's 128-key variants, of 64 keys for its 64-key variants and the cp.async kernels
  const auto chunk = [](CascadeTuning t) {
    return plan_levels(shape(32, 1, 4, 16), {Level({32}, {1000}, 16)}, t).level(0).chunk;
  };
  EXPECT_EQ(chunk({}), 128);
  CascadeTuning t;
  t.ws_variant = 2;
  EXPECT_EQ(chunk(t), 128);
  t.ws_variant = 3;
  EXPECT_EQ(chunk(t), 64);
  t.ws_variant = 4;
  EXPECT_EQ(chunk(t), 64);
  t = {};
  t.kernel = CascadeKernel::kMma;
  EXPECT_EQ(chunk(t), 64);
  t = {};
  t.ws_variant = 3;
  EXPECT_EQ(plan_levels(shape(32, 1, 4, 16), {Level({32}, {1000}, 16)}, t).level(0).ws_variant, 3);
  // a fixed chunk
  t = {};
  t.chunk = 4096;
  const CascadeChoice fixed = plan_levels(shape(64, 8, 4, 16), {Level({64}, {32768}, 16)}, t);
  EXPECT_EQ(fixed.level(0).chunk, 4096);
  EXPECT_EQ(fixed.level(0).max_splits, 8);
  // the split does not depend on the device facts (so neither do the bits of a plan)
  for (const plan::CascadeDeviceFacts f :
       {plan::CascadeDeviceFacts{false, false}, plan::CascadeDeviceFacts{true, false}})
    EXPECT_EQ(plan_levels(shape(32, 1, 4, 16), {Level({32}, {1000}, 16)}, {}, f).level(0).chunk,
              128);
}

TEST(PlanCascade, StagesOfTheSmallTile) {
  EXPECT_EQ(plan::small_stages(448), 2);
  EXPECT_EQ(plan::small_stages(512), 3);
  CascadeTuning t;
  t.chunk = 512;
  EXPECT_EQ(plan_levels(shape(2, 2, 4, 16), {Level({2}, {4096}, 16)}, t).level(0).stages, 3);
  t.chunk = 256;
  EXPECT_EQ(plan_levels(shape(2, 2, 4, 16), {Level({2}, {4096}, 16)}, t).level(0).stages, 2);
}

TEST(PlanCascade, WgmmaEligibility) {
  const auto level0 = [](const CascadeShape& s, CascadeTuning t = {}) {
    return plan_levels(s, {Level({static_cast<std::int32_t>(s.batch)}, {4096}, s.page_size)}, t)
        .level(0);
  };
  EXPECT_TRUE(level0(shape(64, 2, 4, 16)).wgmma);
  EXPECT_TRUE(level0(shape(16, 2, 4, 16)).wgmma);               // 64 rows
  EXPECT_FALSE(level0(shape(4, 2, 4, 16)).wgmma);               // 16 rows
  EXPECT_TRUE(level0(shape(64, 2, 4, 16, DType::kF16)).wgmma);  // f16
  if (plan::cascade_head_dim_supported(64)) {                   // (a build may leave it out)
    // no wgmma row at head dim 64, but warp-specialised ones (falling back to mma.sync); the
    // 16-row tile and the tuning kMma run mma.sync
    EXPECT_TRUE(level0(shape(64, 2, 4, 16, DType::kBF16, 64)).wgmma);
    EXPECT_EQ(level0(shape(64, 2, 4, 16, DType::kF16, 64)).kernel, Kernel::kWarpSpecialized);
    EXPECT_EQ(level0(shape(64, 2, 4, 16, DType::kF16, 64)).fallback, Kernel::kMma);
    EXPECT_EQ(level0(shape(4, 2, 4, 16, DType::kBF16, 64)).kernel, Kernel::kMma);
    CascadeTuning no_wgmma;
    no_wgmma.kernel = CascadeKernel::kMma;
    EXPECT_EQ(level0(shape(64, 2, 4, 16, DType::kBF16, 64), no_wgmma).kernel, Kernel::kMma);
  }
  CascadeTuning mma;
  mma.kernel = CascadeKernel::kMma;
  EXPECT_FALSE(level0(shape(64, 2, 4, 16), mma).wgmma);
  EXPECT_EQ(level0(shape(64, 2, 4, 16), mma).kernel, Kernel::kMma);
  EXPECT_EQ(level0(shape(64, 2, 4, 16, DType::kF16), mma).kernel, Kernel::kMma);
  // f16 takes the warp-specialised kernel as bf16 does
  EXPECT_EQ(level0(shape(64, 2, 4, 16, DType::kF16)).kernel, Kernel::kWarpSpecialized);
}

TEST(PlanCascade, AWindowTakesTheVariantLevelsAndSplitsOnlyTheKeysItReaches) {
  // 64 requests share 8192 keys, then 100 keys each: with a window of 1000 a request's row (at
  // position 8291) sees the prefix from key 7291 on, so the prefix level's splits cover its last
  // 8192 - 7232 = 960 keys (whole 64-key tiles) instead of 8192; the level kernels' variant
  // instances (the warp-specialised one, wgmma as its fallback); the decode last level with the
  // window, writing its own slot (no decode kernel folds prior states under a window).
  const std::vector<Level> levels = {
      Level({64}, {8192}, 16),
      Level(std::vector<std::int32_t>(64, 1), std::vector<std::int32_t>(64, 100), 16)};
  std::vector<CascadeLevel> views;
  for (const Level& l : levels) views.push_back(l.view());
  DecodeOptions seen;
  const plan::PlanDecodeLevelFn decode = one_split_decode(&seen);
  CascadeOptions o;
  o.variant.window_left = 1000;
  CascadeTuning t;
  t.chunk = 256;
  const CascadeChoice p =
      plan::plan_cascade(kFn, shape(64, 2, 4, 16), views.data(), 2, o, 132, t, sm90a(), decode);
  EXPECT_EQ(p.window_left(), 1000);
  EXPECT_EQ(seen.variant.window_left, 1000);
  EXPECT_EQ(p.level(0).kernel, Kernel::kWarpSpecialized);
  EXPECT_EQ(p.level(0).fallback, Kernel::kWgmma);
  EXPECT_EQ(p.level(0).max_splits, 4);  // ceil(960 / 256), not 8192 / 256 = 32
  EXPECT_TRUE(p.level(1).decode);
  // the decode's variant instance folds the shared levels' states as the plain one does (a
  // one-split decode of 64 requests: the fold)
  EXPECT_TRUE(p.decode_fold());
  const std::string line = attnstate::cuda::to_string(p);
  EXPECT_NE(line.find("window 1000"), std::string::npos) << line;
  EXPECT_NE(line.find("warp-specialised wgmma (the variant kernel)"), std::string::npos) << line;
  // past every key: the whole prefix; a window of 0: one tile (the row's own position is past it)
  o.variant.window_left = 1 << 20;
  EXPECT_EQ(
      plan::plan_cascade(kFn, shape(64, 2, 4, 16), views.data(), 2, o, 132, t, sm90a(), decode)
          .level(0)
          .max_splits,
      32);
  o.variant.window_left = 0;
  EXPECT_EQ(
      plan::plan_cascade(kFn, shape(64, 2, 4, 16), views.data(), 2, o, 132, t, sm90a(), decode)
          .level(0)
          .max_splits,
      1);
  // without wgmma: the mma.sync variant instance
  const CascadeChoice old =
      plan::plan_cascade(kFn, shape(64, 2, 4, 16), views.data(), 2, o, 132, t, {}, decode);
  EXPECT_EQ(old.level(0).kernel, Kernel::kMma);
}

TEST(PlanCascade, BulkCopyBoxesByPageSize) {
  const std::vector<std::pair<int, int>> box = {{1, 0},   {4, 0},    {8, 8},   {12, 0},
                                                {16, 16}, {32, 32},  {48, 0},  {64, 64},
                                                {96, 0},  {128, 64}, {256, 64}};
  for (const auto& [page, rows] : box) EXPECT_EQ(plan::tma_box_rows(page), rows) << page;
  const std::vector<std::pair<int, int>> run = {{8, 64}, {16, 64}, {32, 64},
                                                {64, 0}, {128, 0}, {12, 0}};
  for (const auto& [page, keys] : run) EXPECT_EQ(plan::tma_run_keys(page), keys) << page;
}

TEST(PlanCascade, KernelAndFallbackFromTheDeviceFacts) {
  const auto level0 = [](std::int64_t page, plan::CascadeDeviceFacts f, CascadeTuning t = {}) {
    return plan_levels(shape(64, 2, 4, page), {Level({64}, {4096}, page)}, t, f).level(0);
  };
  // sm_90a with tensor maps, a page size with a box: warp-specialised, wgmma as the fallback
  auto lp = level0(16, sm90a());
  EXPECT_EQ(lp.kernel, Kernel::kWarpSpecialized);
  EXPECT_EQ(lp.fallback, Kernel::kWgmma);
  EXPECT_EQ(lp.ws_variant, 1);
  EXPECT_EQ(lp.tma_box, 16);
  EXPECT_EQ(lp.tma_run, 64);
  lp = level0(128, sm90a());
  EXPECT_EQ(lp.kernel, Kernel::kWarpSpecialized);
  EXPECT_EQ(lp.tma_box, 64);
  EXPECT_EQ(lp.tma_run, 0);
  // no bulk-copy box for 12-key pages: the cp.async wgmma kernel
  lp = level0(12, sm90a());
  EXPECT_EQ(lp.kernel, Kernel::kWgmma);
  EXPECT_EQ(lp.fallback, Kernel::kWgmma);
  EXPECT_EQ(lp.tma_box, 0);
  // the warp-specialised kernel turned off
  CascadeTuning off;
  off.ws_variant = 0;
  EXPECT_EQ(level0(16, sm90a(), off).kernel, Kernel::kWgmma);
  // no tensor maps from the driver: the fallback is chosen at planning
  lp = level0(16, {true, false});
  EXPECT_EQ(lp.kernel, Kernel::kWgmma);
  EXPECT_EQ(lp.ws_variant, 0);
  // no sm_90a code: mma.sync (the split still as for the warp-specialised kernel)
  lp = level0(16, {false, true});
  EXPECT_EQ(lp.kernel, Kernel::kMma);
  EXPECT_EQ(lp.fallback, Kernel::kMma);
  EXPECT_TRUE(lp.wgmma);
  EXPECT_EQ(lp.chunk, level0(16, sm90a()).chunk);
}

/// The level kernel of a catalog family of cascade levels.
Kernel kernel_of(attnstate::catalog::Family f) {
  using attnstate::catalog::Family;
  return f == Family::kCascadeWs      ? Kernel::kWarpSpecialized
         : f == Family::kCascadeWgmma ? Kernel::kWgmma
                                      : Kernel::kMma;
}

TEST(PlanCascade, DeviceWithoutANeedTakesTheCatalogsFallbackRow) {
  namespace catalog = attnstate::catalog;
  const CascadeShape s = shape(64, 2, 4, 16);
  const auto level0 = [&](plan::CascadeDeviceFacts f) {
    return plan_levels(s, {Level({64}, {4096}, 16)}, {}, f).level(0);
  };
  const auto row_of = [&](catalog::Family f, int tile_rows) {
    catalog::Query q;
    q.family = f;
    q.head_dim = s.head_dim;
    q.q = q.kv = catalog::mask(s.dtype);
    q.tile_rows = tile_rows;
    return catalog::find(q);
  };
  const int tile = level0(sm90a()).tile_rows;
  const catalog::Row* ws = row_of(catalog::Family::kCascadeWs, tile);
  if (ws == nullptr) GTEST_SKIP() << "no warp-specialised row in this build";
  ASSERT_EQ(level0(sm90a()).kernel, Kernel::kWarpSpecialized);
  // no tensor maps: the warp-specialised row's fallback, which needs no tensor map
  ASSERT_NE(ws->needs & catalog::kNeedsTensorMaps, 0);
  const catalog::Row* no_maps = row_of(ws->fallback, tile);
  ASSERT_NE(no_maps, nullptr);
  EXPECT_EQ(no_maps->needs & catalog::kNeedsTensorMaps, 0);
  EXPECT_EQ(level0({true, false}).kernel, kernel_of(no_maps->family));
  // no wgmma: the fallbacks followed to the first row that needs no wgmma
  const catalog::Row* r = ws;
  while (r != nullptr && (r->needs & catalog::kNeedsWgmma) != 0 && r->fallback != r->family)
    r = row_of(r->fallback, tile);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->needs & catalog::kNeedsWgmma, 0);
  EXPECT_EQ(level0({false, true}).kernel, kernel_of(r->family));
  EXPECT_EQ(level0({false, false}).kernel, kernel_of(r->family));
}

TEST(PlanCascade, TileRowsRefusedWithTheCatalogsTiles) {
  CascadeTuning t;
  t.tile_rows = 32;
  const std::string msg =
      error_of([&] { plan_levels(shape(4, 2, 4, 16), {Level({4}, {1024}, 16)}, t); });
  EXPECT_NE(msg.find("tuning.tile_rows"), std::string::npos) << msg;
  EXPECT_NE(msg.find("32"), std::string::npos) << msg;
  // every tile of the catalog's mma.sync level rows is named, and each is accepted
  for (const attnstate::catalog::Row& r : attnstate::catalog::kRows) {
    if (r.family != attnstate::catalog::Family::kCascadeMma) continue;
    EXPECT_NE(msg.find(std::to_string(r.tile_rows)), std::string::npos) << msg;
    t.tile_rows = r.tile_rows;
    EXPECT_EQ(plan_levels(shape(4, 2, 4, 16), {Level({4}, {1024}, 16)}, t).level(0).tile_rows,
              r.tile_rows);
  }
}

TEST(PlanCascade, DecodeLastLevelEligibility) {
  const CascadeShape s = shape(4, 2, 4, 16);
  const Level shared({4}, {1024}, 16), unique({1, 1, 1, 1}, {100, 200, 300, 400}, 16);
  std::vector<CascadeLevel> v = {shared.view(), unique.view()};
  CascadeOptions causal;
  CascadeTuning t;
  EXPECT_TRUE(plan::decode_eligible(s, v[1], 1, 2, causal, t));
  EXPECT_FALSE(plan::decode_eligible(s, v[0], 0, 2, causal, t));  // not the last level
  t.decode_last_level = false;
  EXPECT_FALSE(plan::decode_eligible(s, v[1], 1, 2, causal, t));
  t = {};
  CascadeOptions non_causal;
  non_causal.causal = false;
  EXPECT_TRUE(plan::decode_eligible(s, v[1], 1, 2, non_causal, t));  // q_len 1
  const CascadeShape s2 = shape(4, 2, 4, 16, DType::kBF16, 128, 2);
  EXPECT_FALSE(plan::decode_eligible(s2, v[1], 1, 2, non_causal, t));
  EXPECT_TRUE(plan::decode_eligible(s2, v[1], 1, 2, causal, t));
  // two requests on one segment
  const Level grouped({2, 1, 1}, {100, 200, 300}, 16);
  EXPECT_FALSE(plan::decode_eligible(s, grouped.view(), 1, 2, causal, t));
  // no keys at all
  const Level empty({1, 1, 1, 1}, {0, 0, 0, 0}, 16);
  EXPECT_FALSE(plan::decode_eligible(s, empty.view(), 1, 2, causal, t));
}

TEST(PlanCascade, DecodeLastLevelPlan) {
  FakeDecode d;
  d.max_splits = 2;
  d.split = 128;
  const CascadeChoice p = plan_levels(
      shape(4, 2, 4, 16), {Level({4}, {1024}, 16), Level({1, 1, 1, 1}, {100, 200, 300, 256}, 16)},
      {}, sm90a(), 132, d.fn());
  EXPECT_EQ(d.calls, 1);
  const auto& lp = p.level(1);
  EXPECT_TRUE(lp.decode);
  EXPECT_EQ(lp.kernel, Kernel::kDecode);
  EXPECT_EQ(lp.fallback, Kernel::kDecode);
  EXPECT_EQ(lp.tile_rows, 16);
  EXPECT_EQ(lp.chunk, 128);
  EXPECT_EQ(lp.max_splits, 2);
  EXPECT_EQ(lp.slot_offset, p.level(0).max_splits);
  EXPECT_EQ(p.num_slots(), p.level(0).max_splits + 1);  // one state per row: the decode merges
  // 4 · 2 · 1 · 2 = 16 CTAs, short shared segments: 8 SMs of their own, and the fold
  EXPECT_EQ(p.decode_sms(), 8);
  EXPECT_TRUE(p.decode_fold());
  // without a decode planner (or with decode_last_level off) a cascade level kernel runs it
  const CascadeChoice k = plan_levels(
      shape(4, 2, 4, 16), {Level({4}, {1024}, 16), Level({1, 1, 1, 1}, {100, 200, 300, 256}, 16)});
  EXPECT_FALSE(k.level(1).decode);
  EXPECT_EQ(k.decode_sms(), 0);
}

TEST(PlanCascade, DecodeSmsAndFold) {
  const auto plan_with = [](std::int64_t batch, std::int32_t shared_len, std::int32_t splits,
                            CascadeTuning t = {}) {
    FakeDecode d;
    d.max_splits = splits;
    std::vector<std::int32_t> ones(static_cast<std::size_t>(batch), 1),
        lens(static_cast<std::size_t>(batch), 512);
    return plan_levels(
        shape(batch, 8, 4, 16),
        {Level({static_cast<std::int32_t>(batch)}, {shared_len}, 16), Level(ones, lens, 16)}, t,
        sm90a(), 132, d.fn());
  };
  // a long shared segment: no SMs reserved; 4 · 8 = 32 CTAs are within two waves: fold
  CascadeChoice p = plan_with(4, 10000, 1);
  EXPECT_EQ(p.decode_sms(), 0);
  EXPECT_TRUE(p.decode_fold());
  // short shared segments: SMs for every decode CTA (2 per SM) while they are at most half of
  // the SMs: 8 · 8 · 2 = 128 CTAs take 64 SMs of 132, 16 · 8 · 2 = 256 would take 128
  p = plan_with(8, 1024, 2);
  EXPECT_EQ(p.decode_sms(), 64);
  EXPECT_TRUE(p.decode_fold());
  p = plan_with(16, 1024, 2);
  EXPECT_EQ(p.decode_sms(), 0);
  EXPECT_TRUE(p.decode_fold());  // 256 CTAs: within two waves
  // 256 · 8 · 4 = 8192 CTAs: more than half the SMs and more than two waves: a merge launch
  p = plan_with(256, 1024, 4);
  EXPECT_EQ(p.decode_sms(), 0);
  EXPECT_FALSE(p.decode_fold());
  // tuning overrides
  CascadeTuning t;
  t.decode_sms = 10;
  t.decode_fold = 1;
  p = plan_with(256, 1024, 4, t);
  EXPECT_EQ(p.decode_sms(), 10);
  EXPECT_TRUE(p.decode_fold());
  // decode_splits: a fixed split count for the decode
  t = {};
  t.decode_splits = 3;
  EXPECT_EQ(plan_with(4, 1024, 1, t).level(1).max_splits, 3);
}

TEST(PlanCascade, TensorMapLayouts) {
  PagedKvCache kv;
  kv.dtype = DType::kBF16;
  kv.page_size = 16;
  kv.heads_kv = 8;
  kv.head_dim = 128;
  kv.num_pages = 1000;
  kv.layout = KvLayout::kNHD;
  auto t = plan::describe_cascade_kv_maps(kv, 16, 64);
  EXPECT_TRUE(t.describable);
  EXPECT_EQ(t.coords, 0);
  EXPECT_EQ(t.box, 16);
  EXPECT_EQ(t.run, 64);
  EXPECT_EQ(t.dims[2], 16);                   // KV head · 2 + half
  EXPECT_EQ(t.strides[3], 16 * 8 * 128 * 2);  // page bytes
  EXPECT_EQ(t.page_box[3], 2);                // 16 keys in boxes of 8 slots
  EXPECT_EQ(t.run_box[4], 4);                 // 4 pages per 64-key run
  kv.layout = KvLayout::kHND;                 // unpadded: page and KV head one dim, no runs
  t = plan::describe_cascade_kv_maps(kv, 16, 64);
  EXPECT_TRUE(t.describable);
  EXPECT_EQ(t.coords, 1);
  EXPECT_EQ(t.run, 0);
  EXPECT_EQ(t.dims[4], 8000);
  kv.page_stride = 16 * 8 * 128 + 8;  // padded HND: boxes of 8 keys
  t = plan::describe_cascade_kv_maps(kv, 16, 64);
  EXPECT_TRUE(t.describable);
  EXPECT_EQ(t.coords, 2);
  EXPECT_EQ(t.box, 8);
  EXPECT_EQ(t.page_box[3], 1);
  // not describable: the recorded fallback runs
  PagedKvCache big = kv;
  big.num_pages = std::int64_t{std::numeric_limits<std::int32_t>::max()} + 1;
  EXPECT_FALSE(plan::describe_cascade_kv_maps(big, 16, 64).describable);
  big = kv;
  big.layout = KvLayout::kNHD;
  big.page_stride = std::int64_t{1} << 40;  // a page stride of 2^41 bytes
  EXPECT_FALSE(plan::describe_cascade_kv_maps(big, 16, 64).describable);
  // head dims 64 (one 64-wide part a key) and 256 (four) where the catalog holds their
  // warp-specialised rows
  PagedKvCache d64 = kv;
  d64.layout = KvLayout::kNHD;
  d64.page_stride = 0;
  d64.head_dim = 64;
  t = plan::describe_cascade_kv_maps(d64, 16, 64);
  EXPECT_EQ(t.describable, attnstate::compiled::contains(attnstate::compiled::CascadeWsHeadDims{},
                                                         std::int64_t{64}));
  if (t.describable) {
    EXPECT_EQ(t.dims[2], 8);  // KV head (one part)
    EXPECT_EQ(t.strides[0], 8 * 64 * 2);
    EXPECT_EQ(t.page_box[2], 1);
  }
  // head dim 256: four 64-wide parts
  big = kv;
  big.head_dim = 256;
  big.layout = KvLayout::kNHD;
  big.page_stride = 0;
  t = plan::describe_cascade_kv_maps(big, 16, 64);
  EXPECT_EQ(t.describable, attnstate::compiled::contains(attnstate::compiled::CascadeWsHeadDims{},
                                                         std::int64_t{256}));
  if (t.describable) {
    EXPECT_EQ(t.dims[2], 4 * big.heads_kv);  // KV head · 4 + part
    EXPECT_EQ(t.strides[0], big.heads_kv * 256 * 2);
    EXPECT_EQ(t.page_box[2], 4);
  }
}

TEST(PlanCascade, ChecksOfAPlan) {
  FakeDecode d;
  const CascadeChoice good =
      plan_levels(shape(64, 2, 4, 16),
                  {Level({64}, {4096}, 16),
                   Level(std::vector<std::int32_t>(64, 1), std::vector<std::int32_t>(64, 100), 16)},
                  {}, sm90a(), 132, d.fn());
  // a plan cannot be edited: a run checks only that this build's planner made it
  EXPECT_EQ(error_of([&] { plan::check_cascade_plan(kFn, good); }), "");
  ASSERT_EQ(good.level(0).kernel, Kernel::kWarpSpecialized);
  const auto fails = [&](const CascadeChoice& p, const char* got) {
    const std::string e = error_of([&] { plan::check_cascade_plan(kFn, p); });
    EXPECT_NE(e.find(kFn), std::string::npos) << e;
    EXPECT_NE(e.find("plan"), std::string::npos) << e;
    EXPECT_NE(e.find("kernel catalog fingerprint"), std::string::npos) << e;
    EXPECT_NE(e.find(got), std::string::npos) << "'" << e << "' does not say " << got;
  };
  CascadeChoice forged = good;
  attnstate::cuda::detail::CascadePlanAccess::data(forged).catalog_fingerprint ^= 0x100;
  fails(forged, "another kernel catalog");
  fails(CascadeChoice{}, "default-constructed");
  // the choices read back; a level past the plan's is refused by name
  EXPECT_EQ(good.num_levels(), 2);
  EXPECT_TRUE(good.level(1).decode);
  const std::string e = error_of([&] { good.level(2); });
  EXPECT_NE(e.find("CascadeChoice::level"), std::string::npos) << e;
  EXPECT_NE(e.find("0..1"), std::string::npos) << e;
}

TEST(PlanCascade, SoftCapTakesTheVariantLevelsAndTheDecodeFoldsAsWithout) {
  // A soft cap: the shared levels take the warp-specialised kernel's variant instance (wgmma's as
  // its fallback), a decode last level is planned with the cap (the decode's variant kernel) and
  // folds the shared levels' states where the plain plan does; the fold asked for or refused by
  // the tuning is honoured.
  const std::vector<Level> levels = {
      Level({64}, {4096}, 16),
      Level(std::vector<std::int32_t>(64, 1), std::vector<std::int32_t>(64, 100), 16)};
  std::vector<CascadeLevel> views;
  for (const Level& l : levels) views.push_back(l.view());
  DecodeOptions seen;
  seen.variant.logits_soft_cap = -1.f;
  const plan::PlanDecodeLevelFn decode = one_split_decode(&seen);
  CascadeOptions o;
  o.variant.logits_soft_cap = 30.f;
  const CascadeChoice p =
      plan::plan_cascade(kFn, shape(64, 2, 4, 16), views.data(), 2, o, 132, {}, sm90a(), decode);
  EXPECT_EQ(p.logits_soft_cap(), 30.f);
  EXPECT_EQ(seen.variant.logits_soft_cap, 30.f);
  EXPECT_EQ(p.level(0).kernel, Kernel::kWarpSpecialized);
  EXPECT_TRUE(p.level(0).wgmma);
  EXPECT_EQ(p.level(0).fallback, Kernel::kWgmma);
  EXPECT_TRUE(p.level(1).decode);
  EXPECT_TRUE(p.decode_fold());
  EXPECT_EQ(error_of([&] { plan::check_cascade_plan(kFn, p); }), "");
  // the same levels without the cap: wgmma (warp-specialised) and the fold
  const CascadeChoice plain =
      plan::plan_cascade(kFn, shape(64, 2, 4, 16), views.data(), 2, {}, 132, {}, sm90a(), decode);
  EXPECT_EQ(seen.variant.logits_soft_cap, 0.f);
  EXPECT_EQ(plain.level(0).kernel, Kernel::kWarpSpecialized);
  EXPECT_TRUE(plain.decode_fold());
  // the tuning's fold, asked for or refused, with a cap
  for (const int f : {0, 1}) {
    CascadeTuning fold;
    fold.decode_fold = f;
    const CascadeChoice c = plan::plan_cascade(kFn, shape(64, 2, 4, 16), views.data(), 2, o, 132,
                                               fold, sm90a(), decode);
    EXPECT_EQ(c.decode_fold(), f == 1);
    EXPECT_EQ(seen.variant.logits_soft_cap, 30.f);
  }
}

TEST(PlanCascade, LevelsRecordTheCatalogRowsTheyRun) {
  // Every level on a cascade level kernel records the catalog row it runs and the row its run
  // takes without the pool's tensor map; the plan's descriptions (kernel, fallback, tile,
  // stages) are those rows', which answer the shape, the variants and the tuning.
  namespace catalog = attnstate::catalog;
  catalog::Query mma;
  mma.family = catalog::Family::kCascadeMma;
  int checked = 0;
  for (const int head_dim : catalog::head_dims(mma))
    for (const DType dt : {DType::kBF16, DType::kF16})
      for (const int var : {0, 1, 2})
        for (const plan::CascadeDeviceFacts f : {sm90a(), plan::CascadeDeviceFacts{true, false},
                                                 plan::CascadeDeviceFacts{false, true}})
          for (const std::int64_t page : {16, 12})
            for (const int ws_variant : {-1, 0, 3})
              for (const std::int64_t group : {2, 8, 64})
                for (const int chunk : {0, 128, 1024}) {
                  CascadeOptions o;
                  if (var == 1) o.variant.logits_soft_cap = 30.f;
                  if (var == 2) o.variant.window_left = 500;
                  CascadeTuning t;
                  t.ws_variant = ws_variant;
                  t.chunk = chunk;
                  const CascadeShape s = shape(4, 2, group, page, dt, head_dim);
                  const std::vector<Level> levels = {Level({4}, {4096}, page),
                                                     Level({1, 1, 1, 1}, {300, 20, 700, 64}, page)};
                  std::vector<CascadeLevel> views;
                  for (const Level& l : levels) views.push_back(l.view());
                  DecodeOptions seen;
                  const CascadeChoice c = plan::plan_cascade(kFn, s, views.data(), 2, o, 132, t, f,
                                                             one_split_decode(&seen));
                  EXPECT_TRUE(c.level(1).decode);
                  EXPECT_EQ(c.level(1).kernel_id, -1);
                  EXPECT_EQ(c.level(1).fallback_id, -1);
                  const auto& lp = c.level(0);
                  const std::string at =
                      "d " + std::to_string(head_dim) + ", " + attnstate::to_string(dt) +
                      ", variant " + std::to_string(var) + ", facts " + std::to_string(f.wgmma) +
                      std::to_string(f.tensor_maps) + ", page " + std::to_string(page) + ", ws " +
                      std::to_string(ws_variant) + ", group " + std::to_string(group) + ", chunk " +
                      std::to_string(chunk);
                  ASSERT_GE(lp.kernel_id, 0) << at;
                  ASSERT_LT(lp.kernel_id, catalog::kNumRows) << at;
                  ASSERT_GE(lp.fallback_id, 0) << at;
                  ASSERT_LT(lp.fallback_id, catalog::kNumRows) << at;
                  const catalog::Row& row = catalog::kRows[lp.kernel_id];
                  const catalog::Row& fb = catalog::kRows[lp.fallback_id];
                  const catalog::Variants v =
                      catalog::variants_of(o.variant.window_left, o.variant.logits_soft_cap);
                  for (const catalog::Row* r : {&row, &fb}) {
                    EXPECT_EQ(r->head_dim, head_dim) << at;
                    EXPECT_EQ(r->q, dt) << at;
                    EXPECT_EQ(r->kv, dt) << at;
                    EXPECT_EQ(r->variants & v, v) << at;
                    EXPECT_EQ(r->tile_rows, lp.tile_rows) << at;
                  }
                  EXPECT_EQ(kernel_of(row.family), lp.kernel) << at;
                  EXPECT_EQ(kernel_of(fb.family), lp.fallback) << at;
                  EXPECT_EQ(row.stages, lp.stages) << at;
                  // the fallback is the row's by the catalog's rule with no run-time need met
                  EXPECT_EQ(catalog::family_that_runs(row, catalog::kNeedsNothing, v), fb.family)
                      << at;
                  // the preferred variant instance: the plain one without a variant
                  if (v == catalog::kPlain) {
                    EXPECT_EQ(row.variants & (catalog::kSoftCap | catalog::kWindow), 0) << at;
                  }
                  // the tile: the smallest mma.sync tile holding the level's 4 · group rows
                  int smallest = 0;
                  for (const catalog::Row& r : catalog::kRows)
                    if (r.family == catalog::Family::kCascadeMma && r.tile_rows >= 4 * group &&
                        (smallest == 0 || r.tile_rows < smallest))
                      smallest = r.tile_rows;
                  if (smallest != 0) {
                    EXPECT_EQ(lp.tile_rows, smallest) << at;
                  }
                  if (lp.kernel == Kernel::kWarpSpecialized) {
                    // the K/V tile of the resolved variant: 128 keys by default (64 at head
                    // dim 256), 64 for variant 3
                    EXPECT_EQ(row.tile_keys, ws_variant == 3 || head_dim > 128
                                                 ? catalog::kCascadeKvTile
                                                 : catalog::kCascadeWsKvTile)
                        << at;
                    EXPECT_NE(row.needs & catalog::kNeedsPoolMap, 0) << at;
                  } else {
                    EXPECT_EQ(lp.fallback_id, lp.kernel_id) << at;
                  }
                  // the 16-row mma.sync tile's depth follows the split where the head dim's
                  // rows hold that depth (the wide head dims hold 2 stages only)
                  catalog::Query depth;
                  depth.family = catalog::Family::kCascadeMma;
                  depth.head_dim = head_dim;
                  depth.tile_rows = 16;
                  depth.stages = plan::small_stages(lp.chunk);
                  if (lp.kernel == Kernel::kMma && lp.tile_rows == 16 && catalog::compiled(depth)) {
                    EXPECT_EQ(row.stages, plan::small_stages(lp.chunk)) << at;
                  }
                  ++checked;
                }
  EXPECT_GT(checked, 0);
}

TEST(PlanCascade, TheSplitIsSizedForThePreferredRowsCtasPerSm) {
  // The split of a level counts the preferred row's resident CTAs per SM: a row built for more
  // CTAs per SM fills a wave with more (segment, tile, split) blocks, so the same level takes
  // fewer or equal splits of at least as many keys.
  namespace catalog = attnstate::catalog;
  catalog::Query q16;
  q16.family = catalog::Family::kCascadeMma;
  q16.tile_rows = 16;
  catalog::Query q128 = q16;
  q128.tile_rows = 128;
  const catalog::Row* r16 = catalog::find(q16);
  const catalog::Row* r128 = catalog::find(q128);
  ASSERT_NE(r16, nullptr);
  ASSERT_NE(r128, nullptr);
  ASSERT_GT(r16->ctas_per_sm, 0);
  ASSERT_GT(r128->ctas_per_sm, 0);
  std::int64_t tiles[] = {1};
  std::int32_t lens[] = {8192};
  // (the split differs between one and two CTAs per SM at this level)
  ASSERT_NE(plan::choose_chunk(tiles, lens, 1, 8192, 8, 1, 132, 16, 128, 64),
            plan::choose_chunk(tiles, lens, 1, 8192, 8, 2, 132, 16, 128, 64));
  ASSERT_NE(r16->ctas_per_sm, r128->ctas_per_sm);
  for (const catalog::Row* r : {r16, r128}) {
    CascadeTuning t;
    t.tile_rows = r->tile_rows;
    t.kernel = CascadeKernel::kMma;
    // one segment of 8192 keys, one row tile per KV head, 8 KV heads on 132 SMs
    const CascadeChoice c = plan_levels(shape(1, 8, 2, 16), {Level({1}, {8192}, 16)}, t,
                                        plan::CascadeDeviceFacts{false, false});
    EXPECT_EQ(c.level(0).chunk, plan::choose_chunk(tiles, lens, 1, 8192, 8, r->ctas_per_sm, 132,
                                                   c.rows(), 128, r->tile_keys))
        << r->tile_rows;
  }
}

TEST(PlanCascade, ThePlanSaysWhereEachLevelRunsAndWhy) {
  FakeDecode d;
  d.max_splits = 2;
  d.split = 128;
  const std::vector<Level> two = {Level({4}, {1024}, 16),
                                  Level({1, 1, 1, 1}, {100, 200, 300, 256}, 16)};
  const CascadeChoice p = plan_levels(shape(4, 2, 4, 16), two, {}, sm90a(), 132, d.fn());
  EXPECT_EQ(p.last_level(), attnstate::cuda::CascadeLastLevel::kDecode);
  const std::string line = attnstate::cuda::to_string(p);
  EXPECT_EQ(line.rfind("cascade plan: batch 4, 8/2 heads, d 128, bf16, 2 levels, 132 SMs; ", 0), 0u)
      << line;
  EXPECT_NE(line.find("level 0: 1 segment, mma.sync, 16-row tiles, "), std::string::npos) << line;
  EXPECT_NE(line.find("level 1 (last): 4 segments, split-KV decode (one segment per request), 2 "
                      "splits of 128 keys, folds the other levels' states, 8 SMs beside them"),
            std::string::npos)
      << line;
  // the reasons a last level stays on a level kernel
  CascadeTuning off;
  off.decode_last_level = false;
  const CascadeChoice o = plan_levels(shape(4, 2, 4, 16), two, off, sm90a(), 132, d.fn());
  EXPECT_EQ(o.last_level(), attnstate::cuda::CascadeLastLevel::kTurnedOff);
  EXPECT_NE(attnstate::cuda::to_string(o).find("not the decode: tuning.decode_last_level is off"),
            std::string::npos);
  const CascadeChoice shared =
      plan_levels(shape(4, 2, 4, 16), {Level({4}, {1024}, 16), Level({2, 2}, {64, 80}, 16)}, {},
                  sm90a(), 132, d.fn());
  EXPECT_EQ(shared.last_level(), attnstate::cuda::CascadeLastLevel::kShared);
  EXPECT_NE(
      attnstate::cuda::to_string(shared).find("not the decode: a segment serves several requests"),
      std::string::npos);
  const CascadeChoice acausal =
      plan_levels(shape(4, 2, 4, 16, DType::kBF16, 128, 2), two, {}, sm90a(), 132, d.fn(), false);
  EXPECT_EQ(acausal.last_level(), attnstate::cuda::CascadeLastLevel::kNotCausal);
  EXPECT_NE(attnstate::cuda::to_string(acausal).find("q_len > 1 without the causal mask"),
            std::string::npos);
  const CascadeChoice none = plan_levels(shape(4, 2, 4, 16), two);
  EXPECT_EQ(none.last_level(), attnstate::cuda::CascadeLastLevel::kOnlyShared);
  // a wgmma level of a bf16 head-dim-128 64-row tile on a device without sm_90a code
  const CascadeChoice wide =
      plan_levels(shape(64, 2, 4, 16), {Level({64}, {4096}, 16)}, {}, {false, false}, 132);
  EXPECT_NE(attnstate::cuda::to_string(wide).find("mma.sync (wgmma not on this device)"),
            std::string::npos)
      << attnstate::cuda::to_string(wide);
}

TEST(PlanCascade, ACausalLastLevelSegmentNeedsQLenMinusOneKeysAsOnTheCpu) {
  // The shared level check of both backends: at causal q_len 2 a last-level segment serving a
  // request holds >= 1 key (cpu::cascade_attention refuses the same level with the same words);
  // 1 key (row 0 sees none of the level), an unused empty segment and a non-causal one plan.
  const CascadeShape s = shape(3, 2, 4, 16, DType::kBF16, 128, 2);
  const Level shared({3}, {130}, 16);
  const std::string err = error_of([&] {
    plan_levels(s, {shared, Level({1, 1, 1}, {5, 0, 9}, 16)});
  });
  EXPECT_NE(err.find("argument 'levels[1].seg_lens'"), std::string::npos) << err;
  EXPECT_NE(err.find("q_len - 1 = 1"), std::string::npos) << err;
  EXPECT_NO_THROW(plan_levels(s, {shared, Level({1, 1, 1}, {5, 1, 9}, 16)}));
  EXPECT_NO_THROW(plan_levels(s, {shared, Level({1, 1, 0, 1}, {5, 1, 0, 9}, 16)}));
  EXPECT_NO_THROW(
      plan_levels(s, {shared, Level({1, 1, 1}, {5, 0, 9}, 16)}, {}, sm90a(), 132, nullptr, false));
}

TEST(PlanCascade, ArgumentErrorsNameTheArgument) {
  const auto err = [](const CascadeShape& s, int num_sms, CascadeTuning t = {}) {
    return error_of([&] {
      plan_levels(s, {Level({static_cast<std::int32_t>(s.batch)}, {64}, 16)}, t, sm90a(), num_sms);
    });
  };
  EXPECT_NE(err(shape(4, 2, 4, 16), 0).find("num_sms"), std::string::npos);
  EXPECT_NE(err(shape(4, 2, 4, 16, DType::kBF16, 96), 132).find("shape.head_dim"),
            std::string::npos);
  CascadeTuning t;
  t.chunk = 100;
  EXPECT_NE(err(shape(4, 2, 4, 16), 132, t).find("tuning.chunk"), std::string::npos);
  t = {};
  t.ws_variant = 5;
  EXPECT_NE(err(shape(4, 2, 4, 16), 132, t).find("tuning.ws_variant"), std::string::npos);
}

}  // namespace

TEST(PlanCascade, Fp8PoolsRunEveryLevelOnTheFp8Rows) {
  // fp8 K/V under 16-bit queries: every level on the catalog's rows of that K/V dtype (the
  // warp-specialised 128-key tiles where it holds fp8 rows for the tile, else wgmma for the wide
  // tiles where it holds them, else mma.sync), the last level on the decode's fp8 kernel where it
  // has one (its variant instance with a window or a soft cap); at a head dim without fp8 decode
  // rows, the last level stays on a level kernel.
  for (const std::int64_t head_dim : {128, 64})
    for (const DType kv : {DType::kE4M3, DType::kE5M2})
      for (const DType q : {DType::kBF16, DType::kF16}) {
        if (!attnstate::compiled::contains(attnstate::compiled::CascadeMmaFp8HeadDims{}, head_dim))
          continue;
        const bool decode_fp8 =
            attnstate::compiled::contains(attnstate::compiled::DecodeFp8HeadDims{}, head_dim);
        const bool decode_fp8_variant = attnstate::compiled::contains(
            attnstate::compiled::DecodeFp8VariantHeadDims{}, head_dim);
        CascadeShape s = shape(64, 2, 4, 16, q, head_dim);
        s.kv_dtype = kv;
        const std::string at = std::string(attnstate::to_string(q)) + "/" +
                               attnstate::to_string(kv) + " d" + std::to_string(head_dim);
        FakeDecode d;
        const std::vector<Level> two = {
            Level({64}, {32768}, 16),
            Level(std::vector<std::int32_t>(64, 1), std::vector<std::int32_t>(64, 300), 16)};
        const CascadeChoice p = plan_levels(s, two, {}, sm90a(), 132, d.fn());
        EXPECT_EQ(p.last_level(), decode_fp8 ? attnstate::cuda::CascadeLastLevel::kDecode
                                             : attnstate::cuda::CascadeLastLevel::kNoDecodeKernel)
            << at;
        const auto& row = attnstate::catalog::kRows[static_cast<std::size_t>(p.level(0).kernel_id)];
        EXPECT_EQ(row.kv, kv) << at;
        // the kernel the catalog's rows for the level's tile give (`variants`)
        const auto expected = [&](int tile_rows, attnstate::catalog::Variants variants) {
          attnstate::catalog::Query wq;
          wq.family = attnstate::catalog::Family::kCascadeWgmma;
          wq.head_dim = s.head_dim;
          wq.q = attnstate::catalog::mask(q);
          wq.kv = attnstate::catalog::mask(kv);
          wq.tile_rows = tile_rows;
          wq.variants = variants;
          if (!attnstate::catalog::compiled(wq)) return Kernel::kMma;
          wq.family = attnstate::catalog::Family::kCascadeWs;
          wq.tile_keys = attnstate::catalog::kCascadeWsKvTile;
          return attnstate::catalog::compiled(wq) ? Kernel::kWarpSpecialized : Kernel::kWgmma;
        };
        EXPECT_EQ(p.level(0).kernel, expected(p.level(0).tile_rows, attnstate::catalog::kPlain))
            << at;
        if (p.level(0).kernel == Kernel::kWarpSpecialized) {
          EXPECT_EQ(row.tile_keys, attnstate::catalog::kCascadeWsKvTile) << at;
          // the 64-key tiles where the tuning asks for them
          CascadeTuning t64;
          t64.ws_variant = static_cast<int>(plan::CascadeWsVariant::kKv64);
          const CascadeChoice p64 = plan_levels(s, two, t64, sm90a(), 132, d.fn());
          EXPECT_EQ(p64.level(0).kernel, Kernel::kWarpSpecialized) << at;
          EXPECT_EQ(
              attnstate::catalog::kRows[static_cast<std::size_t>(p64.level(0).kernel_id)].tile_keys,
              attnstate::catalog::kCascadeKvTile)
              << at;
        }
        // the fallback of a warp-specialised row (a pool no tensor map describes): the fp8
        // wgmma row; of a wgmma row on a device without wgmma: the fp8 mma.sync row
        const auto& fb =
            attnstate::catalog::kRows[static_cast<std::size_t>(p.level(0).fallback_id)];
        EXPECT_EQ(fb.kv, kv) << at;
        EXPECT_EQ(row.q, q) << at;
        EXPECT_NE(
            attnstate::cuda::to_string(p).find(std::string(", K/V ") + attnstate::to_string(kv)),
            std::string::npos)
            << attnstate::cuda::to_string(p);
        // a soft cap: the fp8 variant rows, the last level on the decode's fp8 variant instance
        // where it has one
        std::vector<CascadeLevel> views;
        for (const Level& l : two) views.push_back(l.view());
        CascadeOptions capped;
        capped.variant.logits_soft_cap = 30.f;
        const CascadeChoice c =
            plan::plan_cascade(kFn, s, views.data(), 2, capped, 132, {}, sm90a(), d.fn());
        if (decode_fp8_variant) {
          EXPECT_EQ(c.last_level(), attnstate::cuda::CascadeLastLevel::kDecode) << at;
        } else {
          EXPECT_EQ(c.last_level(), attnstate::cuda::CascadeLastLevel::kNoDecodeKernel) << at;
          EXPECT_NE(
              attnstate::cuda::to_string(c).find("no decode kernel for its dtypes and variant"),
              std::string::npos);
        }
        for (int l = 0; l < (decode_fp8_variant ? 1 : 2); ++l) {
          const auto& r = attnstate::catalog::kRows[static_cast<std::size_t>(c.level(l).kernel_id)];
          EXPECT_EQ(r.kv, kv) << at << " level " << l;
          EXPECT_NE(r.variants & attnstate::catalog::kSoftCap, 0) << at << " level " << l;
          EXPECT_EQ(c.level(l).kernel, expected(c.level(l).tile_rows, attnstate::catalog::kSoftCap))
              << at << " level " << l;
        }
      }
}

TEST(PlanCascade, KvDtypesOutsideTheCatalogAreRefusedNamingIt) {
  // f32 K/V, fp8 K/V at a head dim without fp8 level rows, and a value that is no dtype: refused
  // naming shape.kv_dtype with what the catalog takes; the queries' own dtype is the default
  CascadeShape s = shape(4, 2, 4, 16);
  s.kv_dtype = DType::kBF16;
  EXPECT_NO_THROW(plan_levels(s, {Level({4}, {1024}, 16)}));
  for (const int bad : {static_cast<int>(DType::kF32), 17}) {
    s.kv_dtype = static_cast<DType>(bad);
    const std::string err = error_of([&] { plan_levels(s, {Level({4}, {1024}, 16)}); });
    EXPECT_NE(err.find("argument 'shape.kv_dtype'"), std::string::npos) << err;
    EXPECT_NE(err.find("e4m3"), std::string::npos) << err;
  }
  if (attnstate::compiled::contains(attnstate::compiled::CascadeHeadDims{}, 256)) {
    CascadeShape w = shape(4, 2, 4, 16, DType::kBF16, 256);
    w.kv_dtype = DType::kE4M3;
    const std::string err = error_of([&] { plan_levels(w, {Level({4}, {1024}, 16)}); });
    EXPECT_NE(err.find("argument 'shape.kv_dtype'"), std::string::npos) << err;
    EXPECT_NE(err.find("at head dim 256"), std::string::npos) << err;
  }
}

TEST(PlanCascade, TuningReachesEveryLevelRowOfTheCatalog) {
  // Every cascade level row (family, head dim, query and K/V dtype, tile, stages, KV tile,
  // variant instance) is the plan of a shared level under the tuning that names it: the kernel
  // family, the tile rows, a split size of the row's depth (the 16-row tile's 2 stages are those
  // of short splits), the warp-specialised KV tile; a soft cap and a window for the variant rows.
  // The GPU test of every row (CudaCascade.EveryCatalogLevelRowMatches) runs these plans.
  namespace catalog = attnstate::catalog;
  int reached = 0, rows = 0;
  for (std::size_t i = 0; i < catalog::kRows.size(); ++i) {
    const catalog::Row& r = catalog::kRows[i];
    if (!attnstate_test::is_cascade_level(r)) continue;
    ++rows;
    const int batch = r.tile_rows / 4 + 2;  // (the GPU test's shape: a 1500-key shared prefix)
    CascadeShape s = shape(batch, 2, 4, 16, r.q, r.head_dim);
    if (r.kv != r.q) s.kv_dtype = r.kv;
    const CascadeTuning t = attnstate_test::tuning_for_level_row(r);
    CascadeOptions o;
    if ((r.variants & (catalog::kSoftCap | catalog::kWindow)) != 0) {
      o.variant.logits_soft_cap = 20.f;
      o.variant.window_left = 1200;
    }
    const std::vector<Level> levels = {Level({batch}, {1500}, 16)};
    std::vector<CascadeLevel> views;
    for (const Level& l : levels) views.push_back(l.view());
    const std::string at =
        std::string(catalog::to_string(r.family)) + " d" + std::to_string(r.head_dim) + " " +
        attnstate::to_string(r.q) + "/" + attnstate::to_string(r.kv) + " " +
        std::to_string(r.tile_rows) + " rows, " + std::to_string(r.tile_keys) + " keys, " +
        std::to_string(r.stages) + " stages, variants " + std::to_string(r.variants);
    const CascadeChoice c =
        plan::plan_cascade(kFn, s, views.data(), 1, o, 132, t, sm90a(), nullptr);
    EXPECT_EQ(c.level(0).kernel_id, static_cast<int>(i))
        << at << ": " << attnstate::cuda::to_string(c);
    reached += c.level(0).kernel_id == static_cast<int>(i) ? 1 : 0;
  }
  EXPECT_EQ(reached, rows);
  EXPECT_GT(rows, 0);
}
