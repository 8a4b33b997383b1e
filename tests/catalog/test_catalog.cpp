/// @file test_catalog.cpp
/// @brief The kernel catalog (src/catalog/): its rows expand from the groups as the launchers
///        instantiate them, over the build's head dims only; its lookups, the NOT_SUPPORTED
///        errors of the checks that read it, the planner's facts against its rows (the table of
///        docs/catalog.md: catalog_table.cpp). No CUDA, no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <set>
#include <string>
#include <tuple>

#include "attnstate/core/error.hpp"
#include "catalog/catalog.hpp"
#include "catalog/kernel_shapes.hpp"
#include "common/compiled.hpp"
#include "cuda/kernels/merge/dispatch.cuh"
#include "plan/cascade_plan.hpp"
#include "plan/decode_plan.hpp"

namespace {

using attnstate::DecodeOptions;
using attnstate::DecodeProblem;
using attnstate::DType;
using attnstate::Error;
using attnstate::Status;
namespace catalog = attnstate::catalog;
namespace compiled = attnstate::compiled;
namespace plan = attnstate::plan;
using catalog::Family;

/// Row tiles of the cascade's mma.sync level kernels (the 16-row tile at two depths), each
/// instantiated by the launch table of `cuda/cascade_unit.cuh` from its row.
constexpr int kLaunchedTileRows[] = {16, 64, 128};

int rows_of(Family f) {
  int n = 0;
  for (const catalog::Row& r : catalog::kRows) n += r.family == f ? 1 : 0;
  return n;
}

catalog::Query query(Family f, std::int64_t head_dim = 0, DType q = DType::kBF16,
                     DType kv = DType::kBF16, catalog::Variants v = catalog::kPlain) {
  catalog::Query c;
  c.family = f;
  c.head_dim = head_dim;
  c.q = catalog::mask(q);
  c.kv = catalog::mask(kv);
  c.variants = v;
  return c;
}

/// The error `f` throws ("" and `kSuccess` when none).
template <class F>
std::string error_of(F&& f, Status* status) {
  try {
    f();
  } catch (const Error& e) {
    *status = e.status();
    return e.what();
  }
  *status = Status::kSuccess;
  return "";
}

DecodeProblem decode_problem(std::int64_t head_dim, DType q = DType::kBF16,
                             DType kv = DType::kBF16) {
  DecodeProblem p;
  p.batch = 1;
  p.q_len = 1;
  p.heads_kv = 1;
  p.heads_q = 4;
  p.head_dim = head_dim;
  p.q_dtype = q;
  p.kv_dtype = kv;
  return p;
}

// The rows are a compile-time table.
static_assert(catalog::kNumRows == static_cast<int>(catalog::kRows.size()));
static_assert(catalog::kNumRows > 0, "every build compiles a cascade head dim");

TEST(Catalog, RowsExpandAsTheLaunchersInstantiate) {
  // the instances of the decode units (cuda/decode_unit.cuh), the cascade level units
  // (cuda/cascade_unit.cuh) and cascade.cu's launch_merge, counted from the lists they read
  using Short = compiled::Intersect<compiled::DecodeHeadDims,
                                    compiled::IntList<catalog::kDecodeShortHeadDim>>::type;
  using ShortFp8 = compiled::Intersect<compiled::DecodeFp8HeadDims,
                                       compiled::IntList<catalog::kDecodeShortHeadDim>>::type;
  const int dtypes = static_cast<int>(std::size(compiled::Values<compiled::DecodeDTypes>::value));
  const int fp8 = static_cast<int>(std::size(compiled::Values<compiled::DecodeFp8DTypes>::value));
  const int split16 = static_cast<int>(compiled::DecodeHeadDims::size() + Short::size()) * dtypes;
  using ShortFp8Variant =
      compiled::Intersect<compiled::DecodeFp8VariantHeadDims,
                          compiled::IntList<catalog::kDecodeShortHeadDim>>::type;
  const int split8 =
      static_cast<int>(compiled::DecodeFp8HeadDims::size() + ShortFp8::size() +
                       compiled::DecodeFp8VariantHeadDims::size() + ShortFp8Variant::size()) *
      dtypes * fp8;
  // the paired configuration over fp8: plain and variant at its head dim, two ring depths
  using PairFp8 = compiled::Intersect<compiled::DecodeFp8HeadDims,
                                      compiled::IntList<catalog::kDecodePairHeadDim>>::type;
  using PairFp8Variant = compiled::Intersect<compiled::DecodeFp8VariantHeadDims,
                                             compiled::IntList<catalog::kDecodePairHeadDim>>::type;
  const int pair8 = static_cast<int>(PairFp8::size() + PairFp8Variant::size()) * 2 * dtypes * fp8;
  // plain and variant, each K/V
  EXPECT_EQ(rows_of(Family::kDecodeSplit), 2 * split16 + split8 + pair8);
  EXPECT_EQ(rows_of(Family::kDecodeStream),  // plain, variant; 16-bit and each fp8 K/V
            (static_cast<int>(compiled::DecodeStreamHeadDims::size()) +
             static_cast<int>(compiled::DecodeStreamFp8HeadDims::size()) * fp8) *
                dtypes * 2);
  const int cascade_dtypes =
      static_cast<int>(std::size(compiled::Values<compiled::CascadeDTypes>::value));
  const int tiles16 = 2;  // the 16-row tile at 3 and 2 stages
  const int tiles = tiles16 + static_cast<int>(std::size(kLaunchedTileRows)) - 1;
  const int wide_tiles = static_cast<int>(std::size(kLaunchedTileRows));  // each at 2 stages
  // mma.sync: plain and variant, every cascade dtype, with 16-bit K/V and with each fp8 K/V
  EXPECT_EQ(rows_of(Family::kCascadeMma),
            ((static_cast<int>(compiled::CascadeMmaHeadDims::size()) * tiles +
              static_cast<int>(compiled::CascadeMmaWideHeadDims::size()) * wide_tiles) +
             static_cast<int>(compiled::CascadeMmaFp8HeadDims::size()) * tiles * fp8) *
                cascade_dtypes * 2);
  // wgmma: 64 and 128 rows, plain and variant, every cascade dtype, 16-bit and each fp8 K/V;
  // warp-specialised: four tiles with 16-bit K/V (the two 64-key ones at head dim 256), four
  // with each fp8 K/V (128 keys at 2 stages, 64 keys at 4), plain and variant, every cascade dtype
  EXPECT_EQ(rows_of(Family::kCascadeWgmma),
            static_cast<int>(compiled::CascadeWgmmaHeadDims::size()) * cascade_dtypes * 2 * 2 *
                (1 + fp8));
  EXPECT_EQ(rows_of(Family::kCascadeWs),
            (static_cast<int>(compiled::CascadeWsHeadDims::size()) * 4 -
             static_cast<int>(compiled::CascadeWsWideHeadDims::size()) * 2 +
             static_cast<int>(compiled::CascadeWsFp8HeadDims::size()) * 4 * fp8) *
                cascade_dtypes * 2);
  EXPECT_EQ(rows_of(Family::kCascadeMerge),
            static_cast<int>(compiled::CascadeHeadDims::size() *
                             std::size(compiled::Values<compiled::MergeDTypes>::value)));
  // MLA decode: bf16 queries over a bf16 latent cache and over each fp8 one
  EXPECT_EQ(rows_of(Family::kMlaDecode), 1 + fp8);
  EXPECT_EQ(rows_of(Family::kMlaDecodeWs), 1 + fp8);
  EXPECT_EQ(rows_of(Family::kMlaDecodeNarrow), 1 + fp8);
  EXPECT_EQ(rows_of(Family::kMlaDecodeNarrow2), 1 + fp8);
  EXPECT_EQ(rows_of(Family::kMlaDecodeWsBalanced), 1 + fp8);
  EXPECT_EQ(rows_of(Family::kMlaCascade), 1 + fp8);
  int total = 0;
  for (int f = 0; f < catalog::kFamilies; ++f) total += rows_of(static_cast<Family>(f));
  EXPECT_EQ(total, catalog::kNumRows);
}

TEST(Catalog, EveryRowIsOneInstanceOfABuildHeadDim) {
  std::set<std::tuple<int, int, int, int, int, int, int, int, int, int, int>> seen;
  for (const catalog::Row& r : catalog::kRows) {
    // the merges: any head dim (0), or the head dims of the kernels specialised on it
    const bool merge_dim = r.head_dim == 0 ||
                           (r.family == Family::kMergeRing &&
                            compiled::contains(compiled::MergeHeadDims{}, r.head_dim)) ||
                           (r.family == Family::kMergeOdd &&
                            compiled::contains(compiled::MergeOddHeadDims{}, r.head_dim));
    // the MLA decode and cascade: one head dim, the key width (latent + rotary)
    EXPECT_TRUE(catalog::is_merge(r.family) ? merge_dim
                : r.family == Family::kMlaDecode || r.family == Family::kMlaCascade ||
                        r.family == Family::kMlaDecodeWs || r.family == Family::kMlaDecodeNarrow ||
                        r.family == Family::kMlaDecodeNarrow2 ||
                        r.family == Family::kMlaDecodeWsBalanced
                    ? r.head_dim == catalog::kMlaHeadDim
                    : compiled::contains(compiled::BuildHeadDims{}, r.head_dim))
        << catalog::to_string(r.family) << " at head dim " << r.head_dim;
    EXPECT_NE(r.out, 0);
    EXPECT_GT(r.tile_rows, 0);
    const bool fresh = seen.insert({static_cast<int>(r.family), r.head_dim, static_cast<int>(r.q),
                                    static_cast<int>(r.kv), r.out, r.variants, r.stages,
                                    r.tile_rows, r.tile_keys, r.chunks, r.states})
                           .second;
    EXPECT_TRUE(fresh) << "a row twice: " << catalog::to_string(r.family) << " " << r.head_dim;
    // a fallback is another family (or none), and never a kernel the catalog lacks
    if (r.fallback != r.family) {
      catalog::Query f = query(r.fallback, r.head_dim, r.q, r.kv);
      f.out = r.out;
      // (the narrow MLA decode's fallback runs its few rows in its own, larger tiles)
      f.tile_rows = r.family == Family::kDecodeStream || catalog::is_merge(r.family) ||
                            r.family == Family::kMlaDecodeNarrow ||
                            r.family == Family::kMlaDecodeNarrow2
                        ? 0
                        : r.tile_rows;
      EXPECT_TRUE(catalog::compiled(f)) << catalog::to_string(r.family) << " " << r.head_dim;
    }
  }
}

TEST(Catalog, TheFallbackRule) {
  // a row runs where the run meets its run-time needs and it takes the variants asked, else its
  // fallback; plan-time needs are never the run's to meet
  int with_run_needs = 0;
  for (const catalog::Row& r : catalog::kRows) {
    const bool run_needs = (r.needs & catalog::kRunTimeNeeds) != 0;
    with_run_needs += run_needs ? 1 : 0;
    EXPECT_EQ(catalog::family_that_runs(r, catalog::kRunTimeNeeds, r.variants), r.family);
    EXPECT_EQ(catalog::family_that_runs(r, catalog::kNeedsNothing, r.variants),
              run_needs ? r.fallback : r.family);
    for (catalog::Needs n = 1; n <= catalog::kRunTimeNeeds;
         n = static_cast<catalog::Needs>(n << 1)) {
      if ((n & catalog::kRunTimeNeeds) == 0) continue;
      EXPECT_EQ(catalog::family_that_runs(
                    r, static_cast<catalog::Needs>(catalog::kRunTimeNeeds & ~n), r.variants),
                (r.needs & n) != 0 ? r.fallback : r.family);
    }
    const auto missing = static_cast<catalog::Variants>(catalog::kAllVariants & ~r.variants);
    if (missing != 0) {
      EXPECT_EQ(catalog::family_that_runs(r, catalog::kRunTimeNeeds, missing), r.fallback);
    }
    // a row with run-time needs has a fallback: a run that lacks one still runs
    if (run_needs) {
      EXPECT_NE(r.fallback, r.family) << catalog::to_string(r.family);
    }
  }
  EXPECT_GT(with_run_needs, 0);
}

TEST(Catalog, FindPrefersThePlainInstanceAtTheDefaultDepth) {
  if (!plan::decode_head_dim_supported(128)) GTEST_SKIP() << "head dim 128 not compiled";
  const catalog::Row* plain = catalog::find(query(Family::kDecodeSplit, 128));
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->stages, catalog::kDecodeStages);
  EXPECT_TRUE((plain->variants & catalog::kPriorStates) != 0);
  const catalog::Row* window =
      catalog::find(query(Family::kDecodeSplit, 128, DType::kBF16, DType::kBF16, catalog::kWindow));
  ASSERT_NE(window, nullptr);
  EXPECT_NE(window, plain);
  EXPECT_TRUE((window->variants & catalog::kSoftCap) != 0);
  // the variant instance takes a window and prior states (a cascade's decode folding the shared
  // levels under a variant), over 16-bit and fp8 caches; over fp8 it takes the window and the
  // soft cap
  for (const DType kv : {DType::kBF16, DType::kE4M3}) {
    if (kv == DType::kE4M3 && !compiled::contains(compiled::DecodeFp8VariantHeadDims{}, 128))
      continue;
    const catalog::Row* r = catalog::find(query(Family::kDecodeSplit, 128, DType::kBF16, kv,
                                                catalog::kWindow | catalog::kPriorStates));
    ASSERT_NE(r, nullptr);
    EXPECT_NE(r->variants & catalog::kSoftCap, 0);
  }
  if (compiled::contains(compiled::DecodeFp8VariantHeadDims{}, 128)) {
    const catalog::Row* fp8_cap = catalog::find(
        query(Family::kDecodeSplit, 128, DType::kBF16, DType::kE4M3, catalog::kSoftCap));
    ASSERT_NE(fp8_cap, nullptr);
    EXPECT_EQ(fp8_cap->stages, catalog::kDecodeStages);
    EXPECT_NE(fp8_cap->variants & catalog::kWindow, 0);
    EXPECT_NE(fp8_cap->variants & catalog::kPriorStates, 0);
  }
  catalog::Query short_depth = query(Family::kDecodeSplit, 128);
  short_depth.stages = catalog::kDecodeShortStages;
  EXPECT_TRUE(catalog::compiled(short_depth));
  short_depth.head_dim = 64;
  EXPECT_FALSE(catalog::compiled(short_depth));
  // the cascade's wgmma rows: f16 and bf16, the plain instance first, then the variant one
  const catalog::Row* wg =
      catalog::find(query(Family::kCascadeWgmma, 128, DType::kF16, DType::kF16));
  ASSERT_NE(wg, nullptr);
  EXPECT_EQ(wg->variants, catalog::kPlain);
  const catalog::Row* wg_cap = catalog::find(
      query(Family::kCascadeWgmma, 128, DType::kBF16, DType::kBF16, catalog::kSoftCap));
  ASSERT_NE(wg_cap, nullptr);
  EXPECT_EQ(wg_cap->variants, catalog::kSoftCap | catalog::kWindow);
  // the warp-specialised rows: f16 and bf16, plain and variant
  EXPECT_TRUE(catalog::compiled(query(Family::kCascadeWs, 128, DType::kF16, DType::kF16)));
  EXPECT_TRUE(catalog::compiled(query(Family::kCascadeWs, 128, DType::kBF16, DType::kBF16,
                                      catalog::kSoftCap | catalog::kWindow)));
  EXPECT_TRUE(catalog::compiled(
      query(Family::kCascadeMma, 0, DType::kBF16, DType::kBF16, catalog::kWindow)));
}

TEST(Catalog, UncompiledHeadDimsAreRefusedNamingTheCatalog) {
  const std::string decode_dims = catalog::head_dims_string(query(Family::kDecodeSplit));
  for (std::int64_t d = 16; d <= 640; d += 16) {
    Status st = Status::kSuccess;
    const std::string what =
        error_of([&] { plan::check_decode_problem("fn", decode_problem(d)); }, &st);
    if (catalog::compiled(query(Family::kDecodeSplit, d))) {
      EXPECT_EQ(st, Status::kSuccess) << d << ": " << what;
      continue;
    }
    EXPECT_EQ(st, Status::kNotSupported) << d;
    EXPECT_NE(
        what.find("'problem.head_dim': expected " + decode_dims + ", got " + std::to_string(d)),
        std::string::npos)
        << what;
    EXPECT_FALSE(plan::cascade_head_dim_supported(d) && d > 0) << d;
  }
  // an fp8 cache at a head dim its kernels lack (64: rows of 4 chunks, no swizzle)
  if (plan::decode_head_dim_supported(64)) {
    Status st = Status::kSuccess;
    const std::string what = error_of(
        [&] { plan::check_decode_problem("fn", decode_problem(64, DType::kBF16, DType::kE4M3)); },
        &st);
    EXPECT_EQ(st, Status::kNotSupported);
    EXPECT_NE(what.find(catalog::head_dims_string(
                            query(Family::kDecodeSplit, 0, DType::kBF16, DType::kE4M3)) +
                        " over an e4m3 cache"),
              std::string::npos)
        << what;
  }
}

TEST(Catalog, UncompiledVariantsAreRefusedNamingTheCatalog) {
  // the decode with a soft cap, over each K/V dtype of its split rows: planned on the variant
  // instance where the catalog holds one, else refused by resolve_decode naming options.variant
  int refused = 0, planned = 0;
  for (const std::int64_t d : {64, 128, 256})
    for (const DType kv : {DType::kBF16, DType::kE4M3}) {
      if (!catalog::compiled(query(Family::kDecodeSplit, d, DType::kBF16, kv))) continue;
      const catalog::Query capped =
          query(Family::kDecodeSplit, d, DType::kBF16, kv, catalog::kSoftCap);
      DecodeOptions o;
      o.variant.logits_soft_cap = 30.f;
      const std::int32_t len = 100;
      plan::DecodeFacts f = plan::decode_kernel_facts(d, is_fp8(kv) ? 1 : 2);
      Status st = Status::kSuccess;
      const std::string what = error_of(
          [&] { plan::resolve_decode("fn", decode_problem(d, DType::kBF16, kv), &len, o, 132, f); },
          &st);
      if (catalog::compiled(capped)) {
        ++planned;
        EXPECT_EQ(st, Status::kSuccess) << what;
        continue;
      }
      ++refused;
      EXPECT_EQ(st, Status::kNotSupported);
      EXPECT_NE(what.find("'options.variant'"), std::string::npos) << what;
      EXPECT_NE(what.find(catalog::not_supported_message(capped)), std::string::npos) << what;
      EXPECT_NE(what.find("got soft cap"), std::string::npos) << what;
    }
  EXPECT_GT(planned + refused, 0);
  // the cascade's level kernels take a window on their variant instances, the plain instances
  // fall back for it (the warp-specialised one to wgmma, whose variant instance takes it; at a
  // head dim without wgmma rows, to mma.sync)
  EXPECT_TRUE(catalog::compiled(query(Family::kCascadeMma, 0, DType::kBF16, DType::kBF16,
                                      catalog::kWindow | catalog::kSoftCap)));
  for (const catalog::Row& r : catalog::kRows) {
    if (r.family == Family::kCascadeWs && (r.variants & catalog::kWindow) == 0) {
      EXPECT_EQ(catalog::family_that_runs(r, catalog::kRunTimeNeeds, catalog::kWindow),
                compiled::contains(compiled::CascadeWgmmaHeadDims{}, r.head_dim)
                    ? Family::kCascadeWgmma
                    : Family::kCascadeMma);
    }
  }
}

TEST(Catalog, CascadeLevelRowsStateTheirCtasPerSm) {
  // what the planner sizes a level's split by and the launch table builds the kernel for: at
  // least one CTA per SM, one for the warp-specialised kernel (its launch bounds), and no fewer
  // for a shallower pipeline of the same tile
  const auto level = [](Family f) {
    return f == Family::kCascadeMma || f == Family::kCascadeWgmma || f == Family::kCascadeWs;
  };
  int levels = 0;
  for (const catalog::Row& r : catalog::kRows) {
    if (r.family == Family::kMlaDecodeNarrow2) {
      // (the two-CTA narrow MLA decode states the CTAs its shared memory is sized for, which
      // its automatic split layout fills)
      EXPECT_EQ(r.ctas_per_sm, catalog::kMlaNarrow2CtasPerSm);
      EXPECT_LE(
          r.ctas_per_sm * (catalog::mla_narrow2_smem_bytes() + catalog::kDecodeSmemReservedPerCta),
          catalog::kDecodeSmemPerSm);
      continue;
    }
    if (!level(r.family)) {
      EXPECT_EQ(r.ctas_per_sm, 0) << catalog::to_string(r.family);
      continue;
    }
    ++levels;
    EXPECT_GE(r.ctas_per_sm, 1) << catalog::to_string(r.family) << " " << r.tile_rows;
    if (r.family == Family::kCascadeWs) {
      EXPECT_EQ(r.ctas_per_sm, 1) << r.tile_rows;
    }
    for (const catalog::Row& o : catalog::kRows) {
      if (o.family == r.family && o.head_dim == r.head_dim && o.q == r.q &&
          o.variants == r.variants && o.tile_rows == r.tile_rows && o.tile_keys == r.tile_keys &&
          o.stages < r.stages) {
        EXPECT_GE(o.ctas_per_sm, r.ctas_per_sm) << r.tile_rows << " at " << o.stages;
      }
    }
  }
  EXPECT_GT(levels, 0);
}

TEST(Catalog, TheMessageNamesWhatIsCompiledAtTheRequest) {
  if (!plan::decode_head_dim_supported(128)) GTEST_SKIP() << "head dim 128 not compiled";
  // the streamed decode folds no prior states
  const catalog::Query q = query(Family::kDecodeStream, 128, DType::kBF16, DType::kBF16,
                                 catalog::kWindow | catalog::kPriorStates);
  ASSERT_FALSE(catalog::compiled(q));
  const std::string m = catalog::not_supported_message(q);
  EXPECT_NE(m.find("a compiled streamed decode kernel (head dims " +
                   catalog::head_dims_string(query(Family::kDecodeStream))),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("at head dim 128: queries f16 or bf16, K/V f16, bf16"), std::string::npos) << m;
  EXPECT_NE(m.find("{sinks} or {window, soft cap, sinks}"), std::string::npos) << m;
  EXPECT_NE(m.find("asked: window, prior states"), std::string::npos) << m;
}

TEST(Catalog, PlannerFactsAgreeWithTheRows) {
  for (const catalog::Row& r : catalog::kRows) {
    if (r.family == Family::kDecodeSplit) {
      const int bytes = attnstate::is_fp8(r.kv) ? 1 : 2;
      const plan::DecodeFacts f = plan::decode_kernel_facts(r.head_dim, bytes);
      EXPECT_EQ(f.tile_rows, r.tile_rows);
      // 16-key steps at the default or the short-split depth; or the paired configuration (fp8,
      // its head dim, an even ring of tiles)
      const bool paired = r.tile_keys == catalog::kDecodePairKeys;
      if (paired) {
        EXPECT_TRUE(
            attnstate::is_fp8(r.kv) && r.head_dim == catalog::kDecodePairHeadDim &&
            (r.stages == catalog::kDecodePairStages || r.stages == catalog::kDecodePairDeepStages))
            << r.head_dim << " stages " << r.stages;
        // a depth of its own: `DecodeOptions::split_stages` names it
        EXPECT_TRUE(r.stages != f.stages && r.stages != f.short_stages) << r.stages;
      } else {
        EXPECT_EQ(r.tile_keys, f.tile_rows);
        EXPECT_TRUE(r.stages == f.stages ||
                    (r.stages == f.short_stages && r.head_dim == catalog::kDecodeShortHeadDim))
            << r.head_dim << " stages " << r.stages;
      }
      EXPECT_EQ(f.ctas_per_sm, catalog::decode_ctas_per_sm(r.head_dim, f.stages, bytes));
      EXPECT_TRUE(plan::decode_head_dim_supported(r.head_dim));
    } else if (r.family == Family::kDecodeStream) {
      EXPECT_GT(plan::decode_kernel_facts(r.head_dim, 2).stream_warps, 0);
      EXPECT_EQ(r.tile_keys, plan::decode_kernel_facts(r.head_dim, 2).tile_rows);
    } else if (r.family == Family::kCascadeMma) {
      EXPECT_EQ(r.tile_keys, plan::kKvTile);
      EXPECT_TRUE(plan::cascade_tile_supported(r.tile_rows));
      EXPECT_NE(std::find(std::begin(kLaunchedTileRows), std::end(kLaunchedTileRows), r.tile_rows),
                std::end(kLaunchedTileRows))
          << r.tile_rows;
      EXPECT_TRUE(plan::cascade_head_dim_supported(r.head_dim));
    }
  }
  for (int rows : kLaunchedTileRows) {
    catalog::Query q = query(Family::kCascadeMma);
    q.tile_rows = rows;
    EXPECT_TRUE(catalog::compiled(q)) << rows;
  }
  EXPECT_EQ(plan::kMaxCluster, catalog::kDecodeMaxWsGroup);
}

// ---- the merges ----

/// Entries of a compile-time list.
template <class List>
int count_of() {
  return static_cast<int>(std::size(compiled::Values<List>::value));
}

/// The query that names row `r` exactly (family, head dim, dtypes, chunks, states).
catalog::Query merge_query(const catalog::Row& r) {
  catalog::Query q = query(r.family, r.head_dim, r.q, r.kv);
  q.out = r.out;
  q.chunks = r.chunks;
  q.states = r.states;
  return q;
}

TEST(CatalogMerges, RowsExpandAsTheMergeDispatchInstantiates) {
  // counted from the lists of common/compiled.hpp and the combination rules of
  // kernels/merge/dispatch.cuh: every (a, b, out) of M = MergeDTypes; with each of the fp8
  // formats F, over L = M and F, (x, x, y) and, in place, (x, y, x) for x, y in L, less those
  // without F (already counted)
  const int m = count_of<compiled::MergeDTypes>();
  const int f = count_of<compiled::MergeFp8DTypes>();
  const int l = m + 1;
  const int pair = m * m * m + f * ((2 * l * l - l) - (2 * m * m - m));
  const int chunk_counts = static_cast<int>(std::size(catalog::kMergeWholeChunks));
  EXPECT_EQ(rows_of(Family::kMergePair), pair);
  EXPECT_EQ(rows_of(Family::kMergePairWhole), pair * chunk_counts);
  // the streamed instances: an fp8 output, (x, x, F) and (F, y, F) for x, y in L
  EXPECT_EQ(rows_of(Family::kMergePairStream), f * (2 * l - 1) * chunk_counts);
  // the n-ary merges: every (in, out) of M, and with each F every pair of L less those of M
  EXPECT_EQ(rows_of(Family::kMergeStack), m * m + f * (l * l - m * m));
  EXPECT_EQ(rows_of(Family::kMergeFew), m * m * catalog::kMergeFewMaxStates);
  EXPECT_EQ(rows_of(Family::kMergeRing), m * m * static_cast<int>(compiled::MergeHeadDims::size()));
  EXPECT_EQ(rows_of(Family::kMergeOdd),
            m * m * static_cast<int>(compiled::MergeOddHeadDims::size()));
  EXPECT_EQ(rows_of(Family::kMergeRagged), m * m);
  EXPECT_EQ(rows_of(Family::kMergeRebase), m * m);
  EXPECT_EQ(rows_of(Family::kMergeMarkEmpty), 1);
}

TEST(CatalogMerges, EachRowIsFoundByItsQuery) {
  int merges = 0;
  for (const catalog::Row& r : catalog::kRows) {
    if (!catalog::is_merge(r.family)) continue;
    ++merges;
    EXPECT_EQ(catalog::find(merge_query(r)), &r)
        << catalog::to_string(r.family) << " " << r.head_dim << " " << attnstate::to_string(r.q)
        << " " << attnstate::to_string(r.kv) << " " << catalog::dtypes_string(r.out);
    EXPECT_EQ(r.variants, catalog::kPlain);
    EXPECT_EQ(r.needs & ~catalog::kRunTimeNeeds, 0) << "a merge has no plan";
    // a head-dim-generic row answers every head dim, a specialised one only its own
    catalog::Query other = merge_query(r);
    other.head_dim = r.head_dim == 0 ? 200 : r.head_dim + 8;
    EXPECT_EQ(catalog::matches(r, other), r.head_dim == 0);
  }
  EXPECT_GT(merges, 0);
}

TEST(CatalogMerges, CandidatesListARequestsRowsInOrder) {
  // the launchers' compile-time lists: the rows find and find_next walk, in their order
  catalog::Query q = query(Family::kMergePairWhole, 0, DType::kBF16, DType::kBF16);
  q.out = catalog::mask(DType::kF16);
  constexpr catalog::Candidates<4> kNone{};
  const catalog::Candidates<4> c = catalog::candidates(q, kNone);
  int n = 0;
  for (const catalog::Row* r = catalog::find(q); r != nullptr; r = catalog::find_next(q, r), ++n) {
    ASSERT_LT(n, c.count);
    EXPECT_EQ(&catalog::kRows[static_cast<std::size_t>(c.ids[n])], r);
  }
  EXPECT_EQ(n, c.count);
  EXPECT_EQ(n, static_cast<int>(std::size(catalog::kMergeWholeChunks)));
  // appended: a second request's rows follow the first's
  q.family = Family::kMergePair;
  const catalog::Candidates<4> both = catalog::candidates(q, c);
  ASSERT_EQ(both.count, c.count + 1);
  EXPECT_EQ(both.ids[c.count], catalog::find_id(q));
}

TEST(CatalogMerges, FastKernelsFallBackOnTheGeneralOnes) {
  // streamed → whole rows → the general pairwise kernel; few, ring, odd → the general stack
  for (const catalog::Row& r : catalog::kRows) {
    switch (r.family) {
      case Family::kMergePairStream:
        EXPECT_EQ(r.fallback, Family::kMergePairWhole);
        EXPECT_TRUE(attnstate::is_fp8(static_cast<DType>(__builtin_ctz(r.out))));
        EXPECT_NE(r.needs & catalog::kNeedsDistinctOut, 0);
        break;
      case Family::kMergePairWhole:
        EXPECT_EQ(r.fallback, Family::kMergePair);
        EXPECT_NE(r.needs & catalog::kNeedsWholeSplit, 0);
        EXPECT_NE(std::find(std::begin(catalog::kMergeWholeChunks),
                            std::end(catalog::kMergeWholeChunks), r.chunks),
                  std::end(catalog::kMergeWholeChunks));
        break;
      case Family::kMergeFew:
      case Family::kMergeRing:
      case Family::kMergeOdd:
        EXPECT_EQ(r.fallback, Family::kMergeStack);
        EXPECT_NE(r.needs & catalog::kNeedsChunkedRows, 0);
        // no fp8 instance: their dtypes are those of the general kernel without fp8
        EXPECT_FALSE(attnstate::is_fp8(r.q) || attnstate::is_fp8(r.kv));
        EXPECT_FALSE((r.out & (catalog::mask(DType::kE4M3) | catalog::mask(DType::kE5M2))) != 0);
        EXPECT_GE(r.states, 1);
        break;
      case Family::kMergePair:
      case Family::kMergeStack:
      case Family::kMergeRagged:
      case Family::kMergeRebase:
      case Family::kMergeMarkEmpty:
        EXPECT_EQ(r.fallback, r.family);
        EXPECT_EQ(r.needs, catalog::kNeedsNothing);
        EXPECT_EQ(r.head_dim, 0);
        break;
      default:
        break;
    }
  }
}

TEST(CatalogMerges, StatesAndChunksOfTheFastRows) {
  for (const catalog::Row& r : catalog::kRows) {
    if (r.family == Family::kMergeFew) {
      EXPECT_EQ(r.chunks, catalog::merge_few_chunks(r.states));
      EXPECT_LE(r.states, catalog::kMergeFewMaxStates);
    } else if (r.family == Family::kMergeRing || r.family == Family::kMergeOdd) {
      // the row's LSE slots: a lane of a row's LSE work per chunk, at most a warp
      int lanes = 1;
      while (lanes < r.head_dim / catalog::kMergeChunk) lanes *= 2;
      lanes = std::min(lanes, 32);
      EXPECT_EQ(r.states, std::min(lanes * catalog::kMergeLsePerLane, catalog::kMergeRingMaxStates))
          << r.head_dim;
    }
  }
  // the few-states instance of S states is the first that takes S
  for (int s = 1; s <= catalog::kMergeFewMaxStates; ++s) {
    catalog::Query q = query(Family::kMergeFew, 128, DType::kF16, DType::kF16);
    q.out = catalog::mask(DType::kBF16);
    q.states = s;
    const catalog::Row* r = catalog::find(q);
    ASSERT_NE(r, nullptr) << s;
    EXPECT_EQ(r->states, s);
  }
  catalog::Query q = query(Family::kMergeFew, 128, DType::kF32, DType::kF32);
  q.states = catalog::kMergeFewMaxStates + 1;
  EXPECT_FALSE(catalog::compiled(q));
  // the ring at head dim 64 merges at most its 8 lanes' slots
  if (compiled::contains(compiled::MergeHeadDims{}, 64)) {
    catalog::Query ring = query(Family::kMergeRing, 64, DType::kF16, DType::kF16);
    ring.states = 8 * catalog::kMergeLsePerLane;
    EXPECT_TRUE(catalog::compiled(ring));
    ring.states += 1;
    EXPECT_FALSE(catalog::compiled(ring));
  }
  // the odd-row kernel only at its head dims; no fast n-ary kernel with an fp8 o
  for (std::int64_t d = 8; d <= 512; d += 8) {
    EXPECT_EQ(catalog::compiled(query(Family::kMergeOdd, d, DType::kF16, DType::kF16)),
              compiled::contains(compiled::MergeOddHeadDims{}, d))
        << d;
  }
  EXPECT_FALSE(catalog::compiled(query(Family::kMergeRing, 128, DType::kE4M3, DType::kE4M3)));
  EXPECT_TRUE(catalog::compiled(query(Family::kMergeStack, 128, DType::kE4M3, DType::kE4M3)));
}

TEST(CatalogMerges, PairwiseDTypeCombinations) {
  const auto pair = [](DType a, DType b, DType out) {
    catalog::Query q = query(Family::kMergePair, 0, a, b);
    q.out = catalog::mask(out);
    return catalog::compiled(q);
  };
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2};
  for (DType a : all)
    for (DType b : all)
      for (DType out : all) {
        // dispatch_pair: one fp8 format per call; with one, a and b of one dtype, or a of out's
        int formats = 0;
        DType fmt = DType::kF32;
        for (DType d : {a, b, out}) {
          if (attnstate::is_fp8(d) && d != fmt) {
            formats += 1;
            fmt = d;
          }
        }
        const bool fp8 = formats > 0;
        const bool expected = formats <= 1 && (!fp8 || a == b || a == out);
        EXPECT_EQ(pair(a, b, out), expected)
            << attnstate::to_string(a) << " " << attnstate::to_string(b) << " "
            << attnstate::to_string(out);
        // the whole-row kernel has an instance wherever the general one has
        catalog::Query whole = query(Family::kMergePairWhole, 0, a, b);
        whole.out = catalog::mask(out);
        EXPECT_EQ(catalog::compiled(whole), expected);
      }
  // the checks take fp8 views where a family's rows read or write fp8
  const bool fp8 = count_of<compiled::MergeFp8DTypes>() > 0;
  EXPECT_EQ(catalog::takes_fp8(Family::kMergePair), fp8);
  EXPECT_EQ(catalog::takes_fp8(Family::kMergeStack), fp8);
  EXPECT_FALSE(catalog::takes_fp8(Family::kMergeRagged));
  EXPECT_FALSE(catalog::takes_fp8(Family::kMergeRebase));
  // the not-supported message names the family
  catalog::Query q = query(Family::kMergePair, 0, DType::kBF16, DType::kF16);
  q.out = catalog::mask(DType::kE4M3);
  EXPECT_NE(catalog::not_supported_message(q).find("a compiled pairwise merge kernel (head dims "
                                                   "any"),
            std::string::npos)
      << catalog::not_supported_message(q);
}

TEST(CatalogMerges, TheRowsAreTheDtypesTheDispatchInstantiates) {
  // the pairwise and n-ary rows hold exactly the dtype combinations for which the merges'
  // dispatch (kernels/merge/dispatch.cuh, which instantiates the kernels) has an instance
  namespace mk = attnstate::cuda::kernels;
  const auto accepts = [](auto&& dispatch) {
    try {
      dispatch();
      return true;
    } catch (const attnstate::Error&) {
      return false;
    }
  };
  const DType all[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2};
  int instances = 0;
  for (DType a : all)
    for (DType out : all) {
      catalog::Query stack = query(Family::kMergeStack, 0, a, a);
      stack.out = catalog::mask(out);
      const bool n_ary =
          accepts([&] { mk::dispatch_stack("merge_states", a, out, [](auto, auto) {}); });
      EXPECT_EQ(catalog::compiled(stack), n_ary)
          << "merge_states " << attnstate::to_string(a) << " -> " << attnstate::to_string(out);
      for (DType b : all) {
        catalog::Query pair = query(Family::kMergePair, 0, a, b);
        pair.out = catalog::mask(out);
        const bool pairwise =
            accepts([&] { mk::dispatch_pair("merge_state", a, b, out, [](auto, auto, auto) {}); });
        instances += pairwise ? 1 : 0;
        EXPECT_EQ(catalog::compiled(pair), pairwise)
            << "merge_state " << attnstate::to_string(a) << " " << attnstate::to_string(b) << " -> "
            << attnstate::to_string(out);
      }
    }
  EXPECT_GT(instances, 0);
}

TEST(CatalogMerges, TheKernelShapesAgree) {
  EXPECT_EQ(catalog::merge_lanes(64), 8);
  EXPECT_EQ(catalog::merge_lanes(96), 16);
  EXPECT_EQ(catalog::merge_lanes(512), 32);
  EXPECT_EQ(catalog::merge_lanes(1), 1);
  EXPECT_EQ(catalog::merge_slot_states(64), 32);
  EXPECT_EQ(catalog::merge_slot_states(1024), catalog::kMergeRingMaxStates);
}

}  // namespace
