/// @file test_cuda_cascade.cu
/// @brief CUDA cascade attention against plain attention over each request's concatenated KV
///        (double reference), on fresh random inputs with the output poisoned (NaN) first; graph
///        capture and replay; bitwise repeatability; argument checks.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cuda/cascade.hpp"
#include "cascade_case.hpp"
#include "catalog/catalog.hpp"
#include "compiled_dims.hpp"
#include "cuda_cascade_runner.hpp"
#include "cuda_test_utils.hpp"
#include "plan/cascade_plan.hpp"
#include "plan/cascade_plan_access.hpp"
#include "random_sinks.hpp"

namespace {

using attnstate::DType;
using attnstate::LseBase;
using attnstate::MemorySpace;
using attnstate::cuda::CascadeTuning;
using attnstate_test::CascadeCase;
using attnstate_test::CaseSpec;
using attnstate_test::GpuCascade;
using attnstate_test::SegmentSpec;

/// Runs the case with the automatic plan (a unique last level on the split-KV decode) and again
/// with every level on the `mma.sync` level kernel, both against the reference.
::testing::AssertionResult gpu_matches(const CaseSpec& s, DType out = DType::kF32,
                                       LseBase base = LseBase::kNatural,
                                       CascadeTuning tuning = {}) {
  CascadeCase c(s);
  const attnstate::cuda::CascadeKernel kernels[2] = {tuning.kernel,
                                                     attnstate::cuda::CascadeKernel::kMma};
  for (int i = 0; i < (tuning.kernel == attnstate::cuda::CascadeKernel::kMma ? 1 : 2); ++i) {
    tuning.kernel = kernels[i];
    if (i == 1) tuning.decode_last_level = false;
    GpuCascade g(c, out, base, tuning);
    g.run();
    const ::testing::AssertionResult r = g.check(c);
    if (!r)
      return ::testing::AssertionFailure()
             << (i == 0 ? "automatic/wgmma kernel: " : "mma.sync kernel: ") << r.message();
  }
  return ::testing::AssertionSuccess();
}

/// Random attention sinks of a case (device logits) and the case with them merged into its
/// reference.
struct CaseSinks {
  std::vector<float> logits;
  attnstate_test::DeviceBuffer<float> dev;
  CascadeCase with;
  CaseSinks(const CascadeCase& c, std::uint64_t seed)
      : logits(attnstate_test::random_sinks(c.spec.heads_q, -2.f, 9.f, seed)),
        dev(logits),
        with(c) {
    with.reference = attnstate::testing::apply_sinks(with.reference, logits);
  }
};

TEST(CudaCascade, TwoLevelsSharedPrefixMatchesConcatenation) {
  ATTNSTATE_REQUIRE_GPU();
  EXPECT_TRUE(gpu_matches(attnstate_test::two_level_spec(6, 100, 37, 11)));
}

TEST(CudaCascade, UniqueLastLevelRunsOnTheDecodeAndMatches) {
  // The unique suffixes run on the split-KV decode (one split and several, f16 and bf16, q_len 1
  // and causal q_len 3, group 1 and 8) and give the same answer as the level kernels (both
  // against the reference); a last level shared by two requests, or non-causal new tokens, keeps
  // the level kernel.
  ATTNSTATE_REQUIRE_GPU();
  struct Shape {
    int q_len, heads_q, heads_kv;
    DType dtype;
    int suffix;
  };
  for (const Shape& sh : {Shape{1, 32, 4, DType::kBF16, 37}, Shape{3, 8, 1, DType::kF16, 900},
                          Shape{1, 8, 8, DType::kBF16, 3000}, Shape{2, 16, 2, DType::kBF16, 16}}) {
    CaseSpec s = attnstate_test::two_level_spec(5, 200, sh.suffix, 91 + sh.suffix);
    s.q_len = sh.q_len;
    s.heads_q = sh.heads_q;
    s.heads_kv = sh.heads_kv;
    s.dtype = sh.dtype;
    CascadeCase c(s);
    for (bool on : {true, false}) {
      CascadeTuning t;
      t.decode_last_level = on;
      GpuCascade g(c, DType::kF32, LseBase::kNatural, t);
      EXPECT_EQ(g.plan.level(1).decode, on) << "suffix " << sh.suffix;
      EXPECT_FALSE(g.plan.level(0).decode);
      g.run();
      EXPECT_TRUE(g.check(c)) << "decode " << on << " q_len " << sh.q_len << " suffix "
                              << sh.suffix;
    }
  }
  CaseSpec shared;
  shared.seed = 5;
  shared.levels = {{{4, 64}}, {{2, 33}, {2, 40}}};
  CascadeCase c(shared);
  GpuCascade g(c, DType::kF32, LseBase::kNatural);
  EXPECT_FALSE(g.plan.level(1).decode);
  CaseSpec acausal = attnstate_test::two_level_spec(3, 64, 20, 6);
  acausal.q_len = 2;
  acausal.causal = false;
  CascadeCase ca(acausal);
  GpuCascade ga(ca, DType::kF32, LseBase::kNatural);
  EXPECT_FALSE(ga.plan.level(1).decode);
  ga.run();
  EXPECT_TRUE(ga.check(ca));
}

TEST(CudaCascade, DecodeLevelMeetsEarlierLevelsThroughEveryMergePath) {
  // The last level's decode either merges the shared levels' states into its output (fold) or
  // runs beside them into its workspace slot with a merge launch after: both, with one split
  // (direct store), a few (cluster merge) and many (workspace merge), after one or two shared
  // levels, with empty suffixes and an empty prefix, the workspace poisoned with NaN first (an
  // empty state's o is never read); with one split both on the split kernel and on the streamed
  // one. The stage-by-stage API (each level into its workspace slot, then the merge launch) gives
  // the same answer.
  ATTNSTATE_REQUIRE_GPU();
  std::vector<CaseSpec> specs;
  CaseSpec two = attnstate_test::two_level_spec(4, 300, 700, 41);
  two.heads_q = 16;
  two.heads_kv = 2;
  specs.push_back(two);
  CaseSpec three;
  three.seed = 42;
  three.q_len = 2;
  three.levels = {
      {{6, 130}}, {{2, 64}, {4, 17}}, {{1, 400}, {1, 1}, {1, 333}, {1, 2}, {1, 90}, {1, 257}}};
  specs.push_back(three);
  CaseSpec empty_prefix;
  empty_prefix.seed = 43;
  empty_prefix.levels = {{{3, 0}}, {{1, 500}, {1, 0}, {1, 64}}};
  specs.push_back(empty_prefix);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CascadeCase c(specs[i]);
    for (int splits : {1, 4, 24})
      for (int fold : {0, 1})
        for (bool streamed : {false, true}) {
          if (streamed && splits != 1) continue;  // one split: either decode kernel
          CascadeTuning t;
          t.decode_splits = splits;
          t.decode_sms = splits == 4 ? 40 : (splits == 1 ? 0 : -1);  // decode beside the prefix
          t.decode_fold = fold;
          t.decode_kernel =
              streamed ? attnstate::DecodeKernel::kStreamed : attnstate::DecodeKernel::kSplit;
          GpuCascade g(c, DType::kBF16, LseBase::kBase2, t);
          const int last = g.plan.num_levels() - 1;
          ASSERT_TRUE(g.plan.level(last).decode);
          EXPECT_EQ(g.plan.last_decode().splits().max_splits, splits);
          EXPECT_EQ(g.plan.last_decode().kernel(), t.decode_kernel);
          EXPECT_EQ(g.plan.decode_fold(), fold == 1);
          if (t.decode_sms >= 0) EXPECT_EQ(g.plan.decode_sms(), t.decode_sms);
          g.workspace.poison();
          g.run();
          EXPECT_TRUE(g.check(c)) << "case " << i << " decode splits " << splits << " fold " << fold
                                  << " streamed " << streamed;
          g.run_stages();
          EXPECT_TRUE(g.check(c)) << "stages: case " << i << " decode splits " << splits
                                  << " streamed " << streamed;
        }
  }
}

TEST(CudaCascade, SinksAreMergedOnceAfterEveryLevelAndMergePath) {
  // Attention sinks fused into the cascade's final merge: every output row is the state of the
  // request's keys over all its levels merged once with (0, s_h), whichever kernel writes it (the
  // merge kernel after level kernels only; the decode level folding the shared levels, with one,
  // a few or many splits; the decode beside them with the merge after; the stage-by-stage API,
  // where the levels' partial states stay sink-free and only the merge applies the sinks).
  // Against the double reference with the sinks merged in double: a sink counted per level or per
  // split, or not at all, fails.
  ATTNSTATE_REQUIRE_GPU();
  std::uint64_t seed = 6300;
  for (const CaseSpec& spec : attnstate_test::sink_cascade_specs()) {
    CascadeCase c(spec);
    const CaseSinks sinks(c, seed++);
    struct Path {
      bool decode;
      int splits, fold;
    };
    for (const Path& path : {Path{false, 0, 0}, Path{true, 1, 1}, Path{true, 4, 1},
                             Path{true, 24, 1}, Path{true, 4, 0}, Path{true, 24, 0}}) {
      CascadeTuning t;
      t.decode_last_level = path.decode;
      if (path.decode) {
        t.decode_splits = path.splits;
        t.decode_fold = path.fold;
      }
      GpuCascade g(c, DType::kBF16, LseBase::kBase2, t);
      ASSERT_EQ(g.plan.level(g.plan.num_levels() - 1).decode, path.decode);
      g.sinks.logits = sinks.dev.get();
      g.run();
      EXPECT_TRUE(g.check(sinks.with))
          << "decode " << path.decode << " splits " << path.splits << " fold " << path.fold;
      g.run_stages();
      EXPECT_TRUE(g.check(sinks.with))
          << "stages: decode " << path.decode << " splits " << path.splits;
      g.sinks = attnstate::AttentionSinks{};  // and without: the sink-free result
      g.run();
      EXPECT_TRUE(g.check(c)) << "no sinks: decode " << path.decode << " splits " << path.splits;
    }
  }
}

TEST(CudaCascade, SoftCapMatchesTheReferenceOnEveryPath) {
  // A logits soft cap in every level: the shared levels on a level kernel's variant instance, a
  // decode last level on the decode's variant kernel (one split or five) folding the shared
  // levels' states or writing its own slot, or every level on level kernels; whole
  // runs and the stage-by-stage API, with and without sinks; caps that bite (5) and that barely do
  // (30); bf16 and f16, head dim 128 and the build's first cascade head dim (64 by default), q_len
  // 1 and 2. Against the double reference with the cap on the scaled scores.
  ATTNSTATE_REQUIRE_GPU();
  CaseSpec two = attnstate_test::two_level_spec(4, 300, 700, 81);
  two.heads_q = 16;
  two.heads_kv = 2;
  two.q_amp = 3.f;  // large scores: the cap changes them
  CaseSpec three;
  three.seed = 82;
  three.q_len = 2;
  three.dtype = DType::kF16;
  three.head_dim = static_cast<int>(attnstate_test::cascade_head_dims().front());
  three.q_amp = 3.f;
  three.levels = {
      {{6, 130}}, {{2, 64}, {4, 17}}, {{1, 400}, {1, 3}, {1, 333}, {1, 2}, {1, 90}, {1, 5}}};
  std::uint64_t seed = 8300;
  for (const CaseSpec& base_spec : {two, three})
    for (float cap : {5.f, 30.f}) {
      CaseSpec spec = base_spec;
      spec.soft_cap = cap;
      CascadeCase c(spec);
      const CaseSinks sinks(c, seed++);
      for (int path = 0; path < 4; ++path) {
        // 0: the last level on a level kernel; 1: on the decode, folding the shared levels'
        // states; 2, 3: on a decode of 5 splits, folding them in its split merge or not
        CascadeTuning t;
        t.decode_last_level = path != 0;
        if (path >= 2) t.decode_splits = 5;
        if (path != 0) t.decode_fold = path == 3 ? 0 : 1;
        GpuCascade g(c, DType::kBF16, LseBase::kBase2, t);
        const std::string at = "cap " + std::to_string(cap) + " levels " +
                               std::to_string(g.plan.num_levels()) + " path " +
                               std::to_string(path);
        EXPECT_EQ(g.plan.logits_soft_cap(), cap) << at;
        const int last = g.plan.num_levels() - 1;
        EXPECT_EQ(g.plan.level(last).decode, path != 0) << at;
        if (path != 0) {
          EXPECT_EQ(g.plan.decode_fold(), path != 3) << at;
          EXPECT_EQ(g.plan.last_decode().variant().logits_soft_cap, cap) << at;
        }
        g.run();
        EXPECT_TRUE(g.check(c)) << at;
        g.run_stages();
        EXPECT_TRUE(g.check(c)) << "stages: " << at;
        g.sinks.logits = sinks.dev.get();
        g.run();
        EXPECT_TRUE(g.check(sinks.with)) << "sinks: " << at;
      }
    }
}

TEST(CudaCascade, WindowMatchesTheReferenceOnEveryPathAndKernel) {
  // A sliding window over the concatenated levels: a row at position p sees [p - w, p], so a
  // shared segment contributes only its last keys (or nothing) and each level's splits cover
  // only the keys some row sees. Windows of 0, 1, a few tiles and past every key; with a soft
  // cap; the shared levels on the planned kernel (warp-specialised or wgmma) and on mma.sync (16,
  // 64 and 128 rows, forced),
  // the last level on the decode (folding the shared levels' states or not) or a level kernel;
  // q_len 1 and 2, causal or not; bf16 and f16 at
  // the build's head dims; with sinks. Against the double reference over the windowed keys.
  ATTNSTATE_REQUIRE_GPU();
  CaseSpec two = attnstate_test::two_level_spec(6, 700, 90, 91);
  two.heads_q = 16;
  two.heads_kv = 2;
  CaseSpec three;
  three.seed = 92;
  three.q_len = 2;
  three.dtype = DType::kF16;
  three.head_dim = static_cast<int>(attnstate_test::cascade_head_dims().front());
  three.levels = {
      {{6, 530}}, {{2, 64}, {4, 17}}, {{1, 400}, {1, 3}, {1, 333}, {1, 2}, {1, 90}, {1, 5}}};
  CaseSpec acausal = two;
  acausal.seed = 93;
  acausal.q_len = 3;
  acausal.causal = false;
  std::uint64_t seed = 9300;
  using attnstate::cuda::CascadeKernel;
  for (const CaseSpec& base_spec : {two, three, acausal})
    for (std::int64_t w : {std::int64_t{0}, std::int64_t{1}, std::int64_t{150}, std::int64_t{333},
                           std::int64_t{100000}})
      for (float cap : {0.f, 20.f}) {
        if (cap != 0.f && w != 150) continue;
        CaseSpec spec = base_spec;
        spec.window_left = w;
        spec.soft_cap = cap;
        CascadeCase c(spec);
        const CaseSinks sinks(c, seed++);
        for (int path = 0; path < 6; ++path) {
          CascadeTuning t;
          t.decode_last_level = path % 2 == 1;
          // a decode last level folding the shared levels' states (path 3) or not (1, 5)
          if (t.decode_last_level) t.decode_fold = path == 3 ? 1 : 0;
          if (path >= 2) {  // mma.sync at each row tile
            t.kernel = CascadeKernel::kMma;
            t.tile_rows = path < 4 ? 16 : 64 + 64 * (path - 4);
          }
          GpuCascade g(c, DType::kBF16, LseBase::kBase2, t);
          const std::string at = "window " + std::to_string(w) + " cap " + std::to_string(cap) +
                                 " levels " + std::to_string(g.plan.num_levels()) + " path " +
                                 std::to_string(path) + " d " + std::to_string(spec.head_dim);
          EXPECT_EQ(g.plan.window_left(), w) << at;
          const int last = g.plan.num_levels() - 1;
          if (g.plan.level(last).decode) {
            EXPECT_EQ(g.plan.decode_fold(), path == 3) << at;
            EXPECT_EQ(g.plan.last_decode().variant().window_left, w) << at;
          }
          g.run();
          EXPECT_TRUE(g.check(c)) << at;
          g.sinks.logits = sinks.dev.get();
          g.run();
          EXPECT_TRUE(g.check(sinks.with)) << "sinks: " << at;
        }
      }
}

TEST(CudaCascade, EveryLevelKernelMatchesAtEveryHeadDimAndDtype) {
  // Each level kernel family forced (mma.sync, wgmma; the warp-specialised kernel where the
  // catalog holds it) at every build head dim, f16 and bf16, 64- and 128-row tiles, plain and
  // with a soft cap and a window; large and small scores. Against the double reference.
  ATTNSTATE_REQUIRE_GPU();
  using attnstate::cuda::CascadeKernel;
  using attnstate::cuda::CascadeLevelKernel;
  std::uint64_t seed = 9500;
  for (std::int64_t d : attnstate_test::cascade_head_dims())
    for (DType dt : {DType::kBF16, DType::kF16})
      for (int rows : {64, 128})
        for (CascadeKernel k : {CascadeKernel::kMma, CascadeKernel::kWgmma})
          for (int variant = 0; variant < 3; ++variant) {
            CaseSpec spec = attnstate_test::two_level_spec(rows == 64 ? 12 : 24, 611, 40, seed++);
            spec.heads_q = 8;
            spec.heads_kv = 2;
            spec.head_dim = static_cast<int>(d);
            spec.dtype = dt;
            spec.q_amp = variant == 1 ? 3.f : 1.f;
            if (variant == 1) spec.soft_cap = 20.f;
            if (variant == 2) spec.window_left = 200;
            CascadeCase c(spec);
            CascadeTuning t;
            t.kernel = k;
            t.tile_rows = rows;
            t.decode_last_level = false;
            GpuCascade g(c, DType::kF32, LseBase::kNatural, t);
            const std::string at =
                "d " + std::to_string(d) + " " + attnstate::to_string(dt) + " rows " +
                std::to_string(rows) + " kernel " + std::to_string(static_cast<int>(k)) +
                " variant " + std::to_string(variant) + ": " + attnstate::cuda::to_string(g.plan);
            attnstate::catalog::Query wq;
            wq.family = attnstate::catalog::Family::kCascadeWgmma;
            wq.head_dim = d;
            wq.q = wq.kv = attnstate::catalog::mask(dt);
            attnstate::catalog::Query sq = wq;  // (the warp-specialised rows: d 64 has no wgmma)
            sq.family = attnstate::catalog::Family::kCascadeWs;
            if (k == CascadeKernel::kMma ||
                (!attnstate::catalog::compiled(wq) && !attnstate::catalog::compiled(sq)))
              EXPECT_EQ(g.plan.level(0).kernel, CascadeLevelKernel::kMma) << at;
            else
              EXPECT_NE(g.plan.level(0).kernel, CascadeLevelKernel::kMma) << at;
            g.run();
            EXPECT_TRUE(g.check(c)) << at;
          }
}

TEST(CudaCascade, Fp8PoolsMatchTheDequantisedReferenceOnEveryTile) {
  // fp8 K/V (e4m3, e5m2) under bf16 and f16 queries at every head dim the catalog's fp8 level
  // rows hold: the 16-, 64- and 128-row tiles on mma.sync, and on wgmma (or its warp-specialised
  // kernel where the page size has a bulk-copy box) where the catalog holds it; scales per tensor
  // and per KV head (not powers of two); plain (its last level on the decode's fp8 kernel where the
  // catalog holds one, else on a level kernel), with a soft cap and with a window; also level by
  // level. Against the double reference over the dequantised cache, the output poisoned first.
  ATTNSTATE_REQUIRE_GPU();
  namespace catalog = attnstate::catalog;
  using attnstate::cuda::CascadeKernel;
  std::uint64_t seed = 9900;
  int ran = 0;
  for (std::int64_t d : attnstate_test::cascade_head_dims())
    for (DType kv : {DType::kE4M3, DType::kE5M2})
      for (DType dt : {DType::kBF16, DType::kF16}) {
        catalog::Query fq;
        fq.family = catalog::Family::kCascadeMma;
        fq.head_dim = d;
        fq.q = catalog::mask(dt);
        fq.kv = catalog::mask(kv);
        if (!catalog::compiled(fq)) continue;
        for (int rows : {16, 64, 128})
          for (int variant = 0; variant < 3; ++variant)
            for (CascadeKernel k : {CascadeKernel::kMma, CascadeKernel::kWgmma}) {
              if (rows == 16 && k == CascadeKernel::kWgmma) continue;
              CaseSpec spec = attnstate_test::two_level_spec(rows / 4 + 2, 611, 40, seed++);
              spec.heads_q = 8;
              spec.heads_kv = 2;
              spec.head_dim = static_cast<int>(d);
              spec.dtype = dt;
              spec.kv_dtype = kv;
              spec.k_scale =
                  variant == 1 ? std::vector<float>{0.3f} : std::vector<float>{0.7f, 1.9f};
              spec.v_scale =
                  variant == 1 ? std::vector<float>{1.6f} : std::vector<float>{0.45f, 1.3f};
              spec.q_amp = variant == 1 ? 3.f : 1.f;
              if (variant == 1) spec.soft_cap = 20.f;
              if (variant == 2) spec.window_left = 200;
              CascadeCase c(spec);
              CascadeTuning t;
              t.tile_rows = rows;
              t.kernel = k;
              GpuCascade g(c, DType::kF32, LseBase::kNatural, t);
              const std::string at =
                  "d " + std::to_string(d) + " " + attnstate::to_string(dt) + "/" +
                  attnstate::to_string(kv) + " rows " + std::to_string(rows) + " kernel " +
                  std::to_string(static_cast<int>(k)) + " variant " + std::to_string(variant) +
                  ": " + attnstate::cuda::to_string(g.plan);
              const catalog::Row& row =
                  catalog::kRows[static_cast<std::size_t>(g.plan.level(0).kernel_id)];
              EXPECT_EQ(row.kv, kv) << at;
              EXPECT_EQ(row.tile_rows, rows) << at;
              catalog::Query wq = fq;
              wq.family = catalog::Family::kCascadeWgmma;
              wq.tile_rows = rows;
              const bool wgmma = k == CascadeKernel::kWgmma && catalog::compiled(wq);
              catalog::Query sq = wq;
              sq.family = catalog::Family::kCascadeWs;
              sq.tile_keys = catalog::kCascadeKvTile;
              const bool ws = wgmma && catalog::compiled(sq) &&
                              attnstate::plan::tma_box_rows(spec.page_size) > 0;
              EXPECT_EQ(row.family, ws      ? catalog::Family::kCascadeWs
                                    : wgmma ? catalog::Family::kCascadeWgmma
                                            : catalog::Family::kCascadeMma)
                  << at;
              g.run();
              EXPECT_TRUE(g.check(c)) << at;
              if (variant == 0) {
                g.run_stages();
                EXPECT_TRUE(g.check(c)) << "stage by stage, " << at;
              }
              ++ran;
            }
      }
  if (ran == 0) GTEST_SKIP() << "no fp8 cascade level rows in this build";
}

TEST(CudaCascade, EveryCatalogLevelRowMatches) {
  // Every cascade level row of the catalog (family, head dim, query and K/V dtype, tile, stages,
  // KV tile, variant instance), planned onto that very row for the shared level by the tuning
  // that names it (PlanCascade.TuningReachesEveryLevelRowOfTheCatalog checks the planning on the
  // CPU), then run: against the double reference, a soft cap and a window on the variant rows,
  // scales per KV head on the fp8 rows, the output poisoned first.
  ATTNSTATE_REQUIRE_GPU();
  namespace catalog = attnstate::catalog;
  std::uint64_t seed = 12100;
  int ran = 0, rows = 0;
  for (std::size_t i = 0; i < catalog::kRows.size(); ++i) {
    const catalog::Row& r = catalog::kRows[i];
    if (!attnstate_test::is_cascade_level(r)) continue;
    ++rows;
    const bool variant = (r.variants & (catalog::kSoftCap | catalog::kWindow)) != 0;
    CaseSpec spec = attnstate_test::two_level_spec(r.tile_rows / 4 + 2, 1500, 40, seed++);
    spec.heads_q = 8;
    spec.heads_kv = 2;
    spec.head_dim = r.head_dim;
    spec.dtype = r.q;
    if (r.kv != r.q) {
      spec.kv_dtype = r.kv;
      spec.k_scale = {0.7f, 1.9f};
      spec.v_scale = {0.45f, 1.3f};
    }
    if (variant) {
      spec.q_amp = 3.f;
      spec.soft_cap = 20.f;
      spec.window_left = 1200;
    }
    CascadeCase c(spec);
    GpuCascade g(c, DType::kF32, LseBase::kNatural, attnstate_test::tuning_for_level_row(r));
    const std::string at = "row " + std::to_string(i) + " (" + catalog::to_string(r.family) + " d" +
                           std::to_string(r.head_dim) + " " + attnstate::to_string(r.q) + "/" +
                           attnstate::to_string(r.kv) + " " + std::to_string(r.tile_rows) +
                           " rows, " + std::to_string(r.tile_keys) + " keys, " +
                           std::to_string(r.stages) + " stages" + (variant ? ", variant" : "") +
                           "): " + attnstate::cuda::to_string(g.plan);
    ASSERT_EQ(g.plan.level(0).kernel_id, static_cast<int>(i)) << at;
    g.run();
    EXPECT_TRUE(g.check(c)) << at;
    ++ran;
  }
  EXPECT_EQ(ran, rows);
  EXPECT_GT(rows, 0);
}

TEST(CudaCascade, ShortSegmentsOfHndPagesInAWideTileMatchOnEveryKernel) {
  // One level of short segments (some shorter than a KV tile, one serving no request) over HND
  // pages of 32 with broken runs, few rows in a 128-row tile, splits of 192 keys: every kernel
  // family, both layouts, both 16-bit dtypes, at every build head dim.
  ATTNSTATE_REQUIRE_GPU();
  using attnstate::cuda::CascadeKernel;
  for (std::int64_t d : attnstate_test::cascade_head_dims())
    for (DType dt : {DType::kF16, DType::kBF16})
      for (attnstate::KvLayout layout : {attnstate::KvLayout::kHND, attnstate::KvLayout::kNHD})
        for (CascadeKernel k : {CascadeKernel::kMma, CascadeKernel::kWgmma})
          for (int rows : {64, 128}) {
            CaseSpec spec;
            spec.seed = 9700;
            spec.heads_q = 4;
            spec.heads_kv = 1;
            spec.head_dim = static_cast<int>(d);
            spec.page_size = 32;
            spec.dtype = dt;
            spec.layout = layout;
            spec.causal = false;
            spec.q_amp = 0.5f;
            spec.placement = 2;
            spec.levels = {{{3, 34}, {2, 35}, {1, 22}, {0, 7}, {2, 17}, {1, 4}, {1, 65}}};
            CascadeCase c(spec);
            CascadeTuning t;
            t.kernel = k;
            t.tile_rows = rows;
            t.chunk = 192;
            for (DType out : {DType::kF32, DType::kBF16}) {
              GpuCascade g(c, out, LseBase::kNatural, t, 3);
              g.run();
              EXPECT_TRUE(g.check(c))
                  << "d " << d << " " << attnstate::to_string(dt) << " layout "
                  << static_cast<int>(layout) << " out " << attnstate::to_string(out) << ": "
                  << attnstate::cuda::to_string(g.plan);
            }
          }
}

TEST(CudaCascade, EveryWarpSpecialisedVariantTakesTheCapAndTheWindowAtEitherSign) {
  // The warp-specialised kernel's variant instances at every ws_variant (128- and 64-key tiles,
  // with and without turns) and every head dim the catalog holds them at, f16 and bf16, a soft
  // cap or a window, a positive or a negative softmax scale (negated queries with the
  // magnitude). Against the double reference.
  ATTNSTATE_REQUIRE_GPU();
  using attnstate::cuda::CascadeLevelKernel;
  std::uint64_t seed = 9900;
  int ran = 0;
  for (const std::int64_t d : attnstate_test::cascade_head_dims()) {
    attnstate::catalog::Query wsq;
    wsq.family = attnstate::catalog::Family::kCascadeWs;
    wsq.head_dim = d;
    wsq.variants = attnstate::catalog::kSoftCap | attnstate::catalog::kWindow;
    if (!attnstate::catalog::compiled(wsq)) continue;
    for (int ws = 1; ws <= 4; ++ws) {
      // the K/V tile of the variant (head dim 256 has 64-key tiles only)
      wsq.tile_keys =
          ws >= 3 ? attnstate::catalog::kCascadeKvTile : attnstate::catalog::kCascadeWsKvTile;
      if (!attnstate::catalog::compiled(wsq)) continue;
      for (DType dt : {DType::kBF16, DType::kF16})
        for (int variant = 0; variant < 2; ++variant)
          for (float sign : {1.f, -1.f}) {
            CaseSpec spec = attnstate_test::two_level_spec(24, 700, 40, seed++);
            spec.heads_q = 8;
            spec.heads_kv = 2;
            spec.head_dim = static_cast<int>(d);
            spec.dtype = dt;
            spec.scale = sign * 0.0884f;
            if (variant == 0) {
              spec.soft_cap = 20.f;
              spec.q_amp = 3.f;
            } else {
              spec.window_left = 300;
            }
            CascadeCase c(spec);
            CascadeTuning t;
            t.ws_variant = ws;
            t.decode_last_level = false;
            GpuCascade g(c, DType::kF32, LseBase::kNatural, t);
            const std::string at = "d " + std::to_string(d) + " ws " + std::to_string(ws) + " " +
                                   attnstate::to_string(dt) + " variant " +
                                   std::to_string(variant) + " sign " + std::to_string(sign) +
                                   ": " + attnstate::cuda::to_string(g.plan);
            EXPECT_EQ(g.plan.level(0).kernel, CascadeLevelKernel::kWarpSpecialized) << at;
            g.run();
            EXPECT_TRUE(g.check(c)) << at;
            ++ran;
          }
    }
  }
  if (ran == 0) GTEST_SKIP() << "no warp-specialised variant rows in this build";
}

TEST(CudaCascade, EveryRowTileAndSplitSizeMatches) {
  ATTNSTATE_REQUIRE_GPU();
  for (int tile : {16, 64, 128})
    for (int chunk : {64, 128, 0})
      for (auto kernel :
           {attnstate::cuda::CascadeKernel::kWgmma, attnstate::cuda::CascadeKernel::kMma}) {
        CaseSpec s = attnstate_test::two_level_spec(37, 300, 70, 12 + tile + chunk);
        CascadeTuning t;
        t.tile_rows = tile;
        t.chunk = chunk;
        t.kernel = kernel;
        EXPECT_TRUE(gpu_matches(s, DType::kF32, LseBase::kNatural, t))
            << "tile " << tile << " chunk " << chunk << " kernel " << static_cast<int>(kernel);
      }
}

TEST(CudaCascade, ThreeLevelsOfNestedSharingMatchConcatenation) {
  ATTNSTATE_REQUIRE_GPU();
  CaseSpec s;
  s.seed = 3;
  s.levels = {
      {{7, 64}}, {{3, 33}, {4, 200}}, {{1, 5}, {1, 9}, {1, 1}, {1, 17}, {1, 30}, {1, 2}, {1, 8}}};
  EXPECT_TRUE(gpu_matches(s));
  s.heads_q = 32;
  s.heads_kv = 4;
  EXPECT_TRUE(gpu_matches(s));
}

TEST(CudaCascade, SegmentsSharedByOneToManyRequests) {
  ATTNSTATE_REQUIRE_GPU();
  CaseSpec s;
  s.seed = 4;
  s.levels = {{{1, 50}, {2, 31}, {5, 90}, {0, 40}, {40, 129}}, {{48, 0}}};
  EXPECT_TRUE(gpu_matches(s));
}

TEST(CudaCascade, EmptySuffixesAndEmptyPrefix) {
  ATTNSTATE_REQUIRE_GPU();
  CaseSpec s;
  s.seed = 5;
  s.levels = {{{4, 48}}, {{1, 0}, {1, 12}, {1, 0}, {1, 0}}};
  EXPECT_TRUE(gpu_matches(s)) << "empty suffixes";
  s.levels = {{{3, 0}}, {{1, 20}, {1, 1}, {1, 45}}};
  EXPECT_TRUE(gpu_matches(s)) << "empty prefix";
}

TEST(CudaCascade, AllLevelsEmptyGiveTheEmptyState) {
  ATTNSTATE_REQUIRE_GPU();
  CaseSpec s;
  s.seed = 7;
  s.causal = false;
  s.levels = {{{2, 0}}, {{1, 0}, {1, 0}}};
  CascadeCase c(s);
  GpuCascade g(c, DType::kF32, LseBase::kNatural);
  g.run();
  const auto o = g.o_host();
  const auto lse = g.lse_host();
  for (float x : o) ASSERT_EQ(x, 0.f);
  for (float x : lse) ASSERT_TRUE(std::isinf(x) && x < 0);
}

TEST(CudaCascade, LengthsAtPageEdges) {
  ATTNSTATE_REQUIRE_GPU();
  for (int len : {1, 15, 16, 17, 63, 64, 65, 127, 128, 129}) {
    CaseSpec s;
    s.seed = 100 + len;
    s.levels = {{{3, len}}, {{1, len}, {1, 16 - len % 16}, {1, 16}}};
    EXPECT_TRUE(gpu_matches(s)) << "len " << len;
  }
}

TEST(CudaCascade, F16AndBf16WithEveryOutputDtypeAndBase) {
  ATTNSTATE_REQUIRE_GPU();
  for (DType kv : {DType::kF16, DType::kBF16})
    for (DType out : {DType::kF32, DType::kF16, DType::kBF16})
      for (LseBase base : {LseBase::kNatural, LseBase::kBase2}) {
        CaseSpec s = attnstate_test::two_level_spec(5, 90, 20, 21);
        s.dtype = kv;
        s.q_amp = 3.f;
        EXPECT_TRUE(gpu_matches(s, out, base))
            << attnstate::to_string(kv) << " -> " << attnstate::to_string(out) << " "
            << attnstate::to_string(base);
      }
}

TEST(CudaCascade, GqaGroupsOneFourEight) {
  ATTNSTATE_REQUIRE_GPU();
  for (int group : {1, 4, 8}) {
    CaseSpec s = attnstate_test::two_level_spec(9, 150, 30, 30 + group);
    s.heads_kv = 2;
    s.heads_q = 2 * group;
    EXPECT_TRUE(gpu_matches(s)) << "group " << group;
  }
}

TEST(CudaCascade, CausalMultiTokenQueriesMaskOnlyTheLastLevel) {
  ATTNSTATE_REQUIRE_GPU();
  for (int q_len : {2, 3, 5, 8}) {
    CaseSpec s = attnstate_test::two_level_spec(5, 80, 12, 40 + q_len);
    s.q_len = q_len;
    EXPECT_TRUE(gpu_matches(s)) << "q_len " << q_len;
    s.causal = false;
    EXPECT_TRUE(gpu_matches(s)) << "q_len " << q_len << " non-causal";
  }
}

TEST(CudaCascade, FirstHeadDimHndLayoutPaddedPagesAndOtherPageSizes) {
  // HND padded pages at the build's first cascade head dim (64 by default), NHD at 128
  ATTNSTATE_REQUIRE_GPU();
  for (int ps : {1, 7, 16, 32}) {
    CaseSpec s = attnstate_test::two_level_spec(6, 150, 13, 50 + ps);
    s.layout = attnstate::KvLayout::kHND;
    s.page_size = ps;
    s.page_pad = 8;
    s.head_dim = static_cast<int>(attnstate_test::cascade_head_dims().front());
    EXPECT_TRUE(gpu_matches(s)) << "page_size " << ps;
    s.layout = attnstate::KvLayout::kNHD;
    s.head_dim = 128;
    EXPECT_TRUE(gpu_matches(s)) << "page_size " << ps << " NHD 128";
  }
}

TEST(CudaCascade, F16FirstHeadDimCausalGroup8InA128RowTile) {
  // A case a property run once found failing on the wgmma path (f16, head_dim 64, two
  // warpgroups); such levels now run on mma.sync. At the build's first cascade head dim (64 by
  // default).
  ATTNSTATE_REQUIRE_GPU();
  CaseSpec s;
  s.q_len = 2;
  s.heads_q = 8;
  s.heads_kv = 1;
  s.head_dim = static_cast<int>(attnstate_test::cascade_head_dims().front());
  s.dtype = DType::kF16;
  s.layout = attnstate::KvLayout::kHND;
  s.seed = 7211;
  s.levels = {{{1, 17}}, {{1, 97}}};
  CascadeTuning t;
  t.tile_rows = 128;
  t.chunk = 192;
  EXPECT_TRUE(gpu_matches(s, DType::kBF16, LseBase::kNatural, t));
}

TEST(CudaCascade, KeysPastSegmentEndsAreNeverRead) {
  // NaN in every pool element that is no key of the problem (slots past a segment's end in its
  // last page, the padding between pages, unused pages): whole-page bulk copies must never let
  // one into a result. Page sizes with and without a bulk-copy box, NHD and padded HND, tiles
  // of 64 and 128 rows, splits of many KV tiles (the stage ring wraps) and of one.
  ATTNSTATE_REQUIRE_GPU();
  for (int ps : {16, 32, 64, 128, 7})
    for (auto layout : {attnstate::KvLayout::kNHD, attnstate::KvLayout::kHND})
      for (int batch : {40, 13}) {
        CaseSpec s = attnstate_test::two_level_spec(batch, 1000 + 3 * ps, 23, 300 + ps + batch);
        s.page_size = ps;
        s.layout = layout;
        s.page_pad = layout == attnstate::KvLayout::kHND ? 8 : 0;
        s.nan_outside = true;
        for (int chunk : {0, 2048}) {
          CascadeTuning t;
          t.chunk = chunk;
          EXPECT_TRUE(gpu_matches(s, DType::kF32, LseBase::kNatural, t))
              << "page_size " << ps << " layout " << static_cast<int>(layout) << " batch " << batch
              << " chunk " << chunk;
        }
      }
}

TEST(CudaCascade, KvTilesOfConsecutivePagesMatch) {
  // Pages shorter than 64 keys whose ids follow one another in the pool are copied several per
  // box (boxes of whole pages). Pools in allocation order (every granule a run) and with random
  // breaks (runs and single pages mixed), page sizes below and above 64, NHD and HND unpadded
  // and padded (each a different description of the pool), tiles of 64 and 128 rows, splits whose
  // tiles start inside a page (chunk 192), NaN in every element that is no key of the problem.
  ATTNSTATE_REQUIRE_GPU();
  for (int ps : {8, 16, 64, 128, 256})
    for (auto layout : {attnstate::KvLayout::kNHD, attnstate::KvLayout::kHND})
      for (int placement : {1, 2}) {
        CaseSpec s = attnstate_test::two_level_spec(40, 1300 + 3 * ps, 23, 500 + ps + placement);
        s.page_size = ps;
        s.layout = layout;
        s.page_pad = placement == 2 ? 8 : 0;
        s.nan_outside = true;
        s.placement = placement;
        for (int tile : {64, 128})
          for (int chunk : {0, 192}) {
            CascadeTuning t;
            t.tile_rows = tile;
            t.chunk = chunk;
            t.kernel = attnstate::cuda::CascadeKernel::kWgmma;
            EXPECT_TRUE(gpu_matches(s, DType::kF32, LseBase::kNatural, t))
                << "page_size " << ps << " layout " << static_cast<int>(layout) << " placement "
                << placement << " tile " << tile << " chunk " << chunk;
          }
      }
}

TEST(CudaCascade, NanQueryRowGivesANanRowOnly) {
  // NaN in one query row makes all its scores NaN: the row's state must come out NaN from every
  // level kernel and from the decode (a row maximum that skipped NaN would leave it looking
  // empty). Levels: a shared prefix + unique suffixes (decode or level kernel for the suffixes),
  // the shared level alone, the unique level alone; every other row matches.
  ATTNSTATE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int shape : {0, 1, 2})  // 0: prefix + suffixes; 1: prefix only; 2: suffixes only
      for (int tile : {16, 64, 128})
        for (bool decode : {true, false}) {
          if (shape == 1 && decode) continue;  // no unique level to decode
          CaseSpec s = attnstate_test::two_level_spec(40, 700, 37, 900 + tile + shape);
          s.dtype = dt;
          s.nan_query_row = 5 * s.heads_q + 6;
          if (shape == 1) s.levels.pop_back();
          if (shape == 2) s.levels.erase(s.levels.begin());
          CascadeCase c(s);
          ASSERT_TRUE(std::isnan(c.reference.lse[s.nan_query_row]));
          CascadeTuning t;
          t.tile_rows = tile;
          t.kernel = tile == 16 ? attnstate::cuda::CascadeKernel::kMma
                                : attnstate::cuda::CascadeKernel::kWgmma;
          t.decode_last_level = decode;
          GpuCascade g(c, DType::kF32, LseBase::kNatural, t);
          g.run();
          EXPECT_TRUE(g.check(c)) << "dtype " << static_cast<int>(dt) << " shape " << shape
                                  << " tile " << tile << " decode " << decode;
        }
}

TEST(CudaCascade, NanKeyGivesNanRowsOnly) {
  // NaN in one shared key of KV head 0 (in the middle of a KV tile, a split and a page): the
  // rows of that head's group NaN in every request, every other row matches; every level kernel.
  ATTNSTATE_REQUIRE_GPU();
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int tile : {16, 64, 128}) {
      CaseSpec s = attnstate_test::two_level_spec(40, 1000, 37, 950 + tile);
      s.dtype = dt;
      s.nan_key = 517;
      CascadeCase c(s);
      ASSERT_TRUE(std::isnan(c.reference.lse[0]));
      ASSERT_FALSE(std::isnan(c.reference.lse[s.heads_q / s.heads_kv]));
      CascadeTuning t;
      t.tile_rows = tile;
      t.kernel = tile == 16 ? attnstate::cuda::CascadeKernel::kMma
                            : attnstate::cuda::CascadeKernel::kWgmma;
      GpuCascade g(c, DType::kF32, LseBase::kNatural, t);
      g.run();
      EXPECT_TRUE(g.check(c)) << "dtype " << static_cast<int>(dt) << " tile " << tile;
    }
}

TEST(CudaCascade, AgreesWithTheCpuCascade) {
  ATTNSTATE_REQUIRE_GPU();
  CaseSpec s = attnstate_test::two_level_spec(8, 200, 40, 77);
  s.dtype = DType::kF16;
  CascadeCase c(s);
  GpuCascade g(c, DType::kF32, LseBase::kBase2);
  g.run();
  // Each side against the reference as well (the CPU output poisoned with NaN first): the two
  // backends alone could agree on rows neither wrote.
  EXPECT_TRUE(g.check(c));
  std::vector<float> o(c.out_elems(), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> lse(c.lse_elems(), std::numeric_limits<float>::quiet_NaN());
  auto out = attnstate::make_state_view(o.data(), DType::kF32, lse.data(), c.tokens(), s.heads_q,
                                        s.head_dim, LseBase::kBase2);
  const auto levels = c.host_levels();
  attnstate::cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                                    c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost),
                                    levels.data(), 2, c.options(), out);
  // The CPU keeps probabilities in fp32: only fp32 rounding (as in test_cpu_cascade.cpp).
  EXPECT_TRUE(attnstate_test::matches_reference(c, o, lse, LseBase::kBase2, 3e-5, 2e-4));
  const auto go = g.o_host();
  const auto gl = g.lse_host();
  for (std::size_t i = 0; i < o.size(); ++i) ASSERT_NEAR(go[i], o[i], 2e-3) << i;
  for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(gl[i], lse[i], 1e-3) << i;
}

TEST(CudaCascade, LargeSharedPrefixAtBenchmarkHeads) {
  ATTNSTATE_REQUIRE_GPU();
  CaseSpec s = attnstate_test::two_level_spec(24, 4100, 200, 99);
  s.heads_q = 32;
  s.heads_kv = 8;
  EXPECT_TRUE(gpu_matches(s, DType::kBF16));
}

TEST(CudaCascade, RepeatedRunsAreBitwiseIdentical) {
  ATTNSTATE_REQUIRE_GPU();
  CascadeCase c(attnstate_test::two_level_spec(20, 700, 90, 5));
  GpuCascade g(c, DType::kF32, LseBase::kNatural);
  g.run();
  const auto o1 = g.o_host();
  const auto l1 = g.lse_host();
  g.run();
  const auto o2 = g.o_host();
  const auto l2 = g.lse_host();
  EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)));
  EXPECT_TRUE(g.check(c));
  // levels launched one after the other instead of overlapped, page ids fetched just before
  // their copies instead of a tile ahead (planned with those tunings): the same bits
  const auto host = c.host_levels();
  const auto replan = [&](const CascadeTuning& t) {
    g.plan = attnstate::cuda::plan_cascade(g.shape(), host.data(), static_cast<int>(host.size()),
                                           c.options(), attnstate_test::device_sms(), t);
    ASSERT_LE(g.plan.workspace_bytes(), g.workspace.bytes());
  };
  for (int variant = 0; variant < 2; ++variant) {
    CascadeTuning t;
    t.overlap_levels = variant != 0;
    t.prefetch_pages = variant == 0;
    replan(t);
    ASSERT_EQ(g.plan.overlap_levels(), variant != 0);
    ASSERT_EQ(g.plan.prefetch_pages(), variant == 0);
    g.run();
    const auto o3 = g.o_host();
    const auto l3 = g.lse_host();
    EXPECT_EQ(0, std::memcmp(o1.data(), o3.data(), o1.size() * sizeof(float))) << variant;
    EXPECT_EQ(0, std::memcmp(l1.data(), l3.data(), l1.size() * sizeof(float))) << variant;
  }
  // the other way for the decode level to meet the shared ones (fold or merge launch): its own
  // bits, the same on every run
  ASSERT_TRUE(g.plan.level(1).decode);
  CascadeTuning other;
  other.decode_fold = g.plan.decode_fold() ? 0 : 1;
  replan(other);
  ASSERT_EQ(g.plan.decode_fold(), other.decode_fold == 1);
  g.run();
  const auto o4 = g.o_host();
  const auto l4 = g.lse_host();
  EXPECT_TRUE(g.check(c));
  g.run();
  EXPECT_EQ(0, std::memcmp(o4.data(), g.o_host().data(), o4.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(l4.data(), g.lse_host().data(), l4.size() * sizeof(float)));
}

/// Captures one cascade call in a graph, replays it, then replays it with new values, new page
/// placement and shorter suffixes in the same buffers; `fold`: CascadeTuning::decode_fold.
void replay_with_new_inputs(int fold, std::int64_t window = -1) {
  CaseSpec s = attnstate_test::two_level_spec(10, 300, 60, 8);
  s.window_left = window;
  CascadeCase c1(s);
  CascadeTuning t;
  t.decode_fold = fold;
  GpuCascade g(c1, DType::kBF16, LseBase::kBase2, t);
  ASSERT_TRUE(g.plan.level(1).decode);
  ASSERT_EQ(g.plan.decode_fold(), fold == 1);
  cudaStream_t stream;
  ATTNSTATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  g.launch(stream);
  ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  ATTNSTATE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  g.o.poison();
  g.lse.poison();
  ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(g.check(c1)) << "first replay";
  // new values, new page placement, shorter suffixes: same buffers, same graph
  CaseSpec s2 = s;
  s2.seed = 1234;
  for (auto& seg : s2.levels[1]) seg.len = seg.len / 2;
  // the same pool size: the halved suffixes need fewer pages, the rest stay unused
  s2.extra_pages = static_cast<int>(c1.num_pages - attnstate_test::needed_pages(s2));
  CascadeCase c2(s2);
  ASSERT_EQ(c2.num_pages * c2.page_elems, c1.num_pages * c1.page_elems);
  g.q.upload(c2.q_raw);
  g.k.upload(c2.k_raw);
  g.v.upload(c2.v_raw);
  for (std::size_t l = 0; l < c2.levels.size(); ++l) {
    g.arrays[4 * l + 1].upload(c2.levels[l].page_indptr);
    // page ids: same count of slots in the device buffer (pad with valid ids)
    std::vector<std::int32_t> ids = c2.levels[l].page_indices;
    ids.resize(c1.levels[l].page_indices.size(), 0);
    g.arrays[4 * l + 2].upload(ids);
    g.arrays[4 * l + 3].upload(c2.levels[l].seg_lens);
  }
  g.o.poison();
  g.lse.poison();
  ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(g.check(c2)) << "replay with new inputs";
  ATTNSTATE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  ATTNSTATE_CUDA_CHECK(cudaGraphDestroy(graph));
  ATTNSTATE_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(CudaCascade, GraphCaptureReplaysWithNewInputsAndShorterSuffixes) {
  // (the decode level beside the prefix, both ways of meeting it: fold and merge launch)
  ATTNSTATE_REQUIRE_GPU();
  for (int fold : {0, 1}) {
    SCOPED_TRACE(fold);
    replay_with_new_inputs(fold);
  }
  // a window: the halved suffixes move every row's window further into the prefix, past the
  // keys the plan's splits were sized for (its last split takes the rest)
  for (std::int64_t w : {100, 250}) {
    SCOPED_TRACE(w);
    replay_with_new_inputs(0, w);
  }
}

/// Expects `call` to throw attnstate::Error with `status` and a message naming `arg`.
template <class F>
void expect_error(attnstate::Status status, const char* arg, F&& call) {
  try {
    call();
    ADD_FAILURE() << "no error for " << arg;
  } catch (const attnstate::Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
  }
}

/// Host levels of a shared prefix of `prefix` keys over `batch` requests plus a unique suffix of
/// `suffix` keys each, pages of 16 (the arrays a `plan_cascade` call reads; no device data).
struct PlanOnlyLevels {
  std::vector<std::int32_t> r0, p0, i0, l0, r1, p1, i1, l1;
  attnstate::cuda::CascadeShape shape;
  attnstate::CascadeLevel levels[2];
  PlanOnlyLevels(int prefix, int suffix, int batch) {
    const int pp = (prefix + 15) / 16, sp = (suffix + 15) / 16;
    r0 = {0, batch};
    p0 = {0, pp};
    l0 = {prefix};
    for (int i = 0; i < pp; ++i) i0.push_back(i);
    for (int b = 0; b <= batch; ++b) {
      r1.push_back(b);
      p1.push_back(b * sp);
    }
    for (int b = 0; b < batch; ++b) l1.push_back(suffix);
    for (int i = 0; i < batch * sp; ++i) i1.push_back(pp + i);
    shape.batch = batch;
    shape.q_len = 1;
    shape.heads_q = 32;
    shape.heads_kv = 8;
    shape.head_dim = 128;
    shape.page_size = 16;
    shape.num_pages = pp + batch * sp;
    shape.dtype = DType::kBF16;
    levels[0] = {1, r0.data(), p0.data(), i0.data(), l0.data()};
    levels[1] = {batch, r1.data(), p1.data(), i1.data(), l1.data()};
  }
  attnstate::cuda::CascadePlan plan(CascadeTuning t = {}, int num_levels = 2) const {
    return attnstate::cuda::plan_cascade(shape, levels + (2 - num_levels), num_levels, {}, 132, t);
  }
};

TEST(CudaCascadePlan, LeavesSmsToASmallDecodeLevelBesideShortSharedLevels) {
  ATTNSTATE_REQUIRE_GPU();  // plan_cascade queries the device
  // plan_cascade reads the device's facts (its host-only rules: tests/plan). A small decode level
  // after a short shared prefix gets SMs of its own and the prefix's splits fit the rest; a long
  // prefix, a large decode, an explicit count, a single level and a last level off the decode
  // follow their rules.
  const PlanOnlyLevels small(4096, 64, 16);
  const auto p = small.plan();
  ASSERT_TRUE(p.level(1).decode);
  EXPECT_GT(p.decode_sms(), 0);
  EXPECT_LE(p.decode_sms(), 132 / 2);
  EXPECT_GE(2 * p.decode_sms(), 16 * 8);  // room for every decode CTA, two per SM
  EXPECT_LE(p.level(0).max_tiles * p.level(0).max_splits * 8, 132 - p.decode_sms());
  EXPECT_EQ(PlanOnlyLevels(32768, 64, 16).plan().decode_sms(), 0);  // long shared prefix
  EXPECT_EQ(PlanOnlyLevels(4096, 64, 256).plan().decode_sms(), 0);  // decode needs > half
  CascadeTuning t;
  t.decode_sms = 10;
  EXPECT_EQ(small.plan(t).decode_sms(), 10);
  t.decode_sms = 0;
  EXPECT_EQ(small.plan(t).decode_sms(), 0);
  EXPECT_EQ(small.plan({}, 1).decode_sms(), 0);  // the unique level alone: nothing to run beside
  t = {};
  t.decode_last_level = false;
  EXPECT_EQ(small.plan(t).decode_sms(), 0);
}

TEST(CudaCascadePlan, DecodeLevelFoldsOnlyWhenFewOfItsCtasWaitForTheSharedLevels) {
  ATTNSTATE_REQUIRE_GPU();  // plan_cascade queries the device
  // (plan_cascade reads the device's facts.) Automatically the decode folds the shared levels'
  // states when SMs are left for all its CTAs or it is at most two waves of CTAs (two per SM), else
  // it runs ahead into its workspace slot and a merge launch follows; an explicit choice holds; the
  // unique level alone writes the output itself.
  const PlanOnlyLevels small(4096, 64, 16), long_prefix(32768, 256, 128);
  EXPECT_GT(small.plan().decode_sms(), 0);
  EXPECT_TRUE(small.plan().decode_fold());
  const auto few = PlanOnlyLevels(32768, 64, 16).plan();  // 128 decode CTAs, no SMs left
  EXPECT_EQ(few.decode_sms(), 0);
  EXPECT_TRUE(few.decode_fold());
  EXPECT_EQ(long_prefix.plan().decode_sms(), 0);  // 1024 decode CTAs: about four waves
  EXPECT_FALSE(long_prefix.plan().decode_fold());
  EXPECT_FALSE(PlanOnlyLevels(4096, 64, 256).plan().decode_fold());
  CascadeTuning t;
  t.decode_fold = 1;
  EXPECT_TRUE(long_prefix.plan(t).decode_fold());
  t.decode_fold = 0;
  EXPECT_FALSE(small.plan(t).decode_fold());
  EXPECT_TRUE(small.plan(t, 1).decode_fold());  // nothing to merge with
}

/// The plan shape of `c` (one query row per request, bf16).
attnstate::cuda::CascadeShape bf16_shape(const CascadeCase& c) {
  attnstate::cuda::CascadeShape sh;
  sh.batch = c.batch;
  sh.q_len = 1;
  sh.heads_q = c.spec.heads_q;
  sh.heads_kv = c.spec.heads_kv;
  sh.head_dim = c.spec.head_dim;
  sh.page_size = c.spec.page_size;
  sh.num_pages = c.num_pages;
  sh.dtype = DType::kBF16;
  return sh;
}

TEST(CudaCascadeArgs, PlanRejectsUnsupportedAndInvalidShapes) {
  ATTNSTATE_REQUIRE_GPU();  // plan_cascade queries the device
  CascadeCase c(attnstate_test::two_level_spec(3, 20, 5, 70));
  const auto host = c.host_levels();
  const attnstate::cuda::CascadeShape sh = bf16_shape(c);
  auto plan = [&](attnstate::cuda::CascadeShape s, CascadeTuning t = {}) {
    return attnstate::cuda::plan_cascade(s, host.data(), 2, c.options(), 132, t);
  };
  EXPECT_NO_THROW(plan(sh));
  auto bad = sh;
  bad.head_dim = 96;
  expect_error(attnstate::Status::kNotSupported, "head_dim", [&] { plan(bad); });
  bad = sh;
  bad.dtype = DType::kF32;
  expect_error(attnstate::Status::kNotSupported, "dtype", [&] { plan(bad); });
  bad = sh;
  bad.batch = 4;  // request_indptr covers 3
  expect_error(attnstate::Status::kInvalidArgument, "request_indptr", [&] { plan(bad); });
  bad = sh;
  bad.q_len = 0;
  expect_error(attnstate::Status::kInvalidArgument, "q_len", [&] { plan(bad); });
  CascadeTuning t;
  t.tile_rows = 32;
  expect_error(attnstate::Status::kInvalidArgument, "tile_rows", [&] { plan(sh, t); });
  t = {};
  t.kernel = static_cast<attnstate::cuda::CascadeKernel>(7);
  expect_error(attnstate::Status::kInvalidArgument, "kernel", [&] { plan(sh, t); });
  t = {};
  t.chunk = 100;
  expect_error(attnstate::Status::kInvalidArgument, "chunk", [&] { plan(sh, t); });
  t = {};
  t.decode_splits = -1;
  expect_error(attnstate::Status::kInvalidArgument, "decode_splits", [&] { plan(sh, t); });
  t.decode_splits = attnstate::kMaxSplits + 1;
  expect_error(attnstate::Status::kInvalidArgument, "decode_splits", [&] { plan(sh, t); });
  t = {};
  t.decode_fold = 2;
  expect_error(attnstate::Status::kInvalidArgument, "decode_fold", [&] { plan(sh, t); });
  t.decode_fold = -2;
  expect_error(attnstate::Status::kInvalidArgument, "decode_fold", [&] { plan(sh, t); });
  t = {};
  t.decode_sms = -2;
  expect_error(attnstate::Status::kInvalidArgument, "decode_sms", [&] { plan(sh, t); });
  t.decode_sms = 132;
  expect_error(attnstate::Status::kInvalidArgument, "decode_sms", [&] { plan(sh, t); });
  expect_error(attnstate::Status::kInvalidArgument, "num_sms",
               [&] { attnstate::cuda::plan_cascade(sh, host.data(), 2, c.options(), 0); });
  attnstate::cuda::CascadeShape wide = sh;
  wide.heads_q = sh.heads_kv * 65;  // a GQA group above 64
  expect_error(attnstate::Status::kInvalidArgument, "shape.heads_q",
               [&] { attnstate::cuda::plan_cascade(wide, host.data(), 2, c.options(), 132); });
  wide.heads_q = sh.heads_kv * 64;
  EXPECT_NO_THROW(attnstate::cuda::plan_cascade(wide, host.data(), 2, c.options(), 132));
}

TEST(CudaCascadeArgs, PlanTakesEveryDecodeSplitCountThatPlanDecodeTakes) {
  ATTNSTATE_REQUIRE_GPU();  // plan_cascade queries the device
  // `decode_splits` is documented as 1..kMaxSplits (the range of plan_decode), not the 64 splits
  // the level kernels' heuristic may choose.
  CascadeCase c(attnstate_test::two_level_spec(3, 20, 5, 70));
  const auto host = c.host_levels();
  const attnstate::cuda::CascadeShape sh = bf16_shape(c);
  for (int splits : {1, 33, 64, 65, 200, attnstate::kMaxSplits}) {
    CascadeTuning t;
    t.decode_splits = splits;
    attnstate::cuda::CascadePlan plan;
    ASSERT_NO_THROW(plan = attnstate::cuda::plan_cascade(sh, host.data(), 2, c.options(), 132, t))
        << splits;
    ASSERT_TRUE(plan.level(plan.num_levels() - 1).decode) << splits;
    EXPECT_EQ(plan.last_decode().splits().max_splits, splits);
  }
  CascadeTuning t;
  t.decode_splits = attnstate::kMaxSplits + 1;
  try {
    attnstate::cuda::plan_cascade(sh, host.data(), 2, c.options(), 132, t);
    ADD_FAILURE() << "no error";
  } catch (const attnstate::Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("'tuning.decode_splits': expected 0 (automatic) or 1..512"),
        std::string::npos)
        << e.what();
  }
}

TEST(CudaCascade, DecodeLevelOfMoreThan64SplitsMatches) {
  // Fixed decode split counts past the level kernels' 64 (many of them empty for these lengths)
  // through both ways the decode's state meets the prefix's.
  ATTNSTATE_REQUIRE_GPU();
  CaseSpec s = attnstate_test::two_level_spec(3, 300, 1500, 44);
  CascadeCase c(s);
  for (int splits : {65, attnstate::kMaxSplits})
    for (int fold : {0, 1}) {
      CascadeTuning t;
      t.decode_splits = splits;
      t.decode_fold = fold;
      GpuCascade g(c, DType::kF32, LseBase::kNatural, t);
      ASSERT_TRUE(g.plan.level(g.plan.num_levels() - 1).decode);
      EXPECT_EQ(g.plan.last_decode().splits().max_splits, splits);
      g.workspace.poison();
      g.run();
      EXPECT_TRUE(g.check(c)) << "decode splits " << splits << " fold " << fold;
      g.run_stages();
      EXPECT_TRUE(g.check(c)) << "stages: decode splits " << splits;
    }
}

TEST(CudaCascadeArgs, RunRejectsBadArgumentsBeforeTouchingMemory) {
  ATTNSTATE_REQUIRE_GPU();
  CascadeCase c(attnstate_test::two_level_spec(3, 20, 5, 71));
  GpuCascade g(c, DType::kF32, LseBase::kNatural);
  auto run = [&](attnstate::ConstTensorView q, attnstate::PagedKvCache kv,
                 std::vector<attnstate::CascadeLevel> lv, attnstate::StateView out,
                 std::size_t ws_bytes) {
    attnstate::cuda::run_cascade(g.plan, q, kv, lv.data(), static_cast<int>(lv.size()), out,
                                 g.workspace.get(), ws_bytes, nullptr);
  };
  const std::size_t ws = g.workspace.bytes();
  expect_error(attnstate::Status::kWorkspaceTooSmall, "workspace_bytes",
               [&] { run(g.qv(), g.kv(), g.levels, g.out(), ws - 1); });
  auto kv = g.kv();
  kv.space = MemorySpace::kHost;
  expect_error(attnstate::Status::kInvalidArgument, "kv.space",
               [&] { run(g.qv(), kv, g.levels, g.out(), ws); });
  kv = g.kv();  // a pool smaller than the planned one
  kv.num_pages = g.plan.shape().num_pages - 1;
  expect_error(attnstate::Status::kInvalidArgument, "kv.num_pages",
               [&] { run(g.qv(), kv, g.levels, g.out(), ws); });
  auto q = g.qv();
  q.data = static_cast<const char*>(q.data) + 2;
  expect_error(attnstate::Status::kInvalidArgument, "q",
               [&] { run(q, g.kv(), g.levels, g.out(), ws); });
  auto lv = g.levels;
  lv[1].num_segments -= 1;
  expect_error(attnstate::Status::kInvalidArgument, "levels[1].num_segments",
               [&] { run(g.qv(), g.kv(), lv, g.out(), ws); });
  lv = g.levels;
  lv[0].seg_lens = nullptr;
  expect_error(attnstate::Status::kInvalidArgument, "levels[0].seg_lens",
               [&] { run(g.qv(), g.kv(), lv, g.out(), ws); });
  lv = g.levels;
  lv.pop_back();
  expect_error(attnstate::Status::kInvalidArgument, "num_levels",
               [&] { run(g.qv(), g.kv(), lv, g.out(), ws); });
  auto out = g.out();
  out.heads += 1;
  expect_error(attnstate::Status::kInvalidArgument, "out.heads",
               [&] { run(g.qv(), g.kv(), g.levels, out, ws); });
  out = g.out();
  out.o_stride_token = 0;  // every token's rows on the same memory
  expect_error(attnstate::Status::kInvalidArgument, "'out.o_stride_token'",
               [&] { run(g.qv(), g.kv(), g.levels, out, ws); });
  out = g.out();
  out.lse_stride_head = -1;
  expect_error(attnstate::Status::kInvalidArgument, "'out.lse_stride_head'",
               [&] { run(g.qv(), g.kv(), g.levels, out, ws); });
  out = g.out();
  out.o = static_cast<char*>(out.o) + 2;  // f32 output
  expect_error(attnstate::Status::kInvalidArgument,
               "'out.o': expected a pointer aligned to 4 bytes",
               [&] { run(g.qv(), g.kv(), g.levels, out, ws); });
  // the output inside the workspace (read by the merge while out is written)
  out = g.out();
  out.lse = reinterpret_cast<float*>(g.workspace.get()) + 4;
  expect_error(attnstate::Status::kInvalidArgument, "'out.lse'",
               [&] { run(g.qv(), g.kv(), g.levels, out, ws); });
  // a plan no planner made, and one of another kernel catalog (another build): refused by name
  const attnstate::cuda::CascadePlan good = g.plan;
  g.plan = attnstate::cuda::CascadePlan{};
  expect_error(attnstate::Status::kInvalidArgument, "default-constructed",
               [&] { run(g.qv(), g.kv(), g.levels, g.out(), ws); });
  g.plan = good;
  attnstate::cuda::detail::CascadePlanAccess::data(g.plan).catalog_fingerprint ^= 1;
  expect_error(attnstate::Status::kInvalidArgument, "another kernel catalog",
               [&] { run(g.qv(), g.kv(), g.levels, g.out(), ws); });
  g.plan = good;
  // an argument only the decode level checks (its lengths misaligned): found before the shared
  // level is queued, so the workspace keeps its pattern
  if (g.plan.level(1).decode) {
    std::vector<std::uint8_t> pattern(ws, 0xA5);
    g.workspace.upload(pattern);
    attnstate_test::DeviceBuffer<std::int32_t> lens(8);
    lv = g.levels;
    lv[1].seg_lens =
        reinterpret_cast<const std::int32_t*>(reinterpret_cast<const char*>(lens.get()) + 2);
    expect_error(attnstate::Status::kInvalidArgument, "'kv.seq_lens'",
                 [&] { run(g.qv(), g.kv(), lv, g.out(), ws); });
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(g.workspace.download(), pattern);
  } else {
    ADD_FAILURE() << "the two-level case was expected to run its last level on the decode";
  }
}

TEST(CudaCascadeArgs, BadSinksAreNamed) {
  ATTNSTATE_REQUIRE_GPU();
  CascadeCase c(attnstate_test::two_level_spec(3, 20, 5, 72));
  GpuCascade g(c, DType::kF32, LseBase::kNatural);
  const std::vector<float> host(static_cast<std::size_t>(c.spec.heads_q), 0.5f);
  attnstate::AttentionSinks s;
  s.logits = host.data();
  expect_error(attnstate::Status::kInvalidArgument, "sinks.logits", [&] {
    attnstate::cuda::run_cascade(g.plan, g.qv(), g.kv(), g.levels.data(),
                                 static_cast<int>(g.levels.size()), s, g.out(), g.workspace.get(),
                                 g.workspace.bytes());
  });
  expect_error(attnstate::Status::kInvalidArgument, "sinks.logits", [&] {
    attnstate::cuda::run_cascade_merge(g.plan, s, g.out(), g.workspace.get(), g.workspace.bytes());
  });
  s.logits = g.lse.get();  // the output's own LSEs
  expect_error(attnstate::Status::kInvalidArgument, "out.lse", [&] {
    attnstate::cuda::run_cascade(g.plan, g.qv(), g.kv(), g.levels.data(),
                                 static_cast<int>(g.levels.size()), s, g.out(), g.workspace.get(),
                                 g.workspace.bytes());
  });
}

TEST(CudaCascadeArgs, VariantsThePlanRefusesAndTheCapItRecords) {
  ATTNSTATE_REQUIRE_GPU();
  CaseSpec spec = attnstate_test::two_level_spec(3, 40, 9, 73);
  CascadeCase c(spec);
  GpuCascade g(c, DType::kF32, LseBase::kNatural);
  const auto host = c.host_levels();
  auto plan = [&](attnstate::CascadeOptions o, CascadeTuning t) {
    return attnstate::cuda::plan_cascade(g.shape(), host.data(), static_cast<int>(host.size()), o,
                                         attnstate_test::device_sms(), t);
  };
  attnstate::CascadeOptions o = c.options();
  o.variant.window_left = -2;
  expect_error(attnstate::Status::kInvalidArgument, "options.variant.window_left",
               [&] { plan(o, {}); });
  // a window: the levels place their rows by every level's lengths, so a shared level of a
  // windowed plan runs only through run_cascade (refused by name stage by stage)
  o.variant.window_left = 100;
  {
    CascadeTuning levels_only;
    levels_only.decode_last_level = false;
    const attnstate::cuda::CascadePlan w = plan(o, levels_only);
    EXPECT_EQ(w.window_left(), 100);
    EXPECT_GT(w.workspace_bytes(), 0u);
    attnstate_test::DeviceBuffer<std::uint8_t> ws(w.workspace_bytes());
    expect_error(attnstate::Status::kNotSupported, "plan", [&] {
      attnstate::cuda::run_cascade_level(w, 0, g.qv(), g.kv(), g.levels[0], ws.get(),
                                         w.workspace_bytes());
    });
  }
  o = c.options();
  o.variant.logits_soft_cap = -2.f;
  expect_error(attnstate::Status::kInvalidArgument, "options.variant.logits_soft_cap",
               [&] { plan(o, {}); });
  o.variant.logits_soft_cap = 20.f;
  // the plan records the cap for its decode level, which folds the shared levels' states as the
  // plain plan does; the tuning's fold, asked for or refused, is honoured
  const attnstate::cuda::CascadePlan p = plan(o, {});
  ASSERT_TRUE(p.level(p.num_levels() - 1).decode);
  EXPECT_EQ(p.logits_soft_cap(), 20.f);
  EXPECT_EQ(p.last_decode().variant().logits_soft_cap, 20.f);
  EXPECT_EQ(p.decode_fold(), plan(c.options(), {}).decode_fold());
  for (const int f : {0, 1}) {
    CascadeTuning fold;
    fold.decode_fold = f;
    const attnstate::cuda::CascadePlan q = plan(o, fold);
    EXPECT_EQ(q.decode_fold(), f == 1) << "decode_fold " << f;
    EXPECT_EQ(q.last_decode().variant().logits_soft_cap, 20.f);
  }
}

}  // namespace
