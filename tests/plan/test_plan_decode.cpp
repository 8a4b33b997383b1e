/// @file test_plan_decode.cpp
/// @brief The host-only decode planner (src/plan/decode_plan.hpp) against its documented rules:
///        head dims, the automatic layout, the streamed kernel, the short-split depth, the
///        cluster from given occupancy and the recorded fallback. No CUDA, no GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "common/compiled.hpp"
#include "plan/decode_plan.hpp"
#include "split_layouts.hpp"

namespace {

using attnstate_test::fixed_size;

using attnstate::DecodeOptions;
using attnstate::DecodeProblem;
using attnstate::DType;
using attnstate::Error;
using attnstate::SplitLayout;
using attnstate::SplitPolicy;
using attnstate::Status;
namespace compiled = attnstate::compiled;
namespace plan = attnstate::plan;

constexpr const char* kFn = "test";

/// Facts of an sm_90-like device: the kernels' shape at head dim 128 (the one source the library
/// reads), 2 CTAs per SM at the default depth, every cluster size resident `resident` times at
/// both depths.
plan::DecodeFacts facts(int resident = 1000) {
  plan::DecodeFacts f = plan::decode_kernel_facts(128, 2);
  f.ctas_per_sm = 2;
  for (auto& row : f.resident_clusters)
    for (int c = 2; c <= plan::kMaxCluster; ++c) row[c] = resident;
  return f;
}

DecodeProblem problem(std::int64_t batch, std::int64_t heads_kv, std::int64_t head_dim,
                      std::int64_t group = 4, std::int64_t q_len = 1) {
  DecodeProblem p;
  p.batch = batch;
  p.q_len = q_len;
  p.heads_kv = heads_kv;
  p.heads_q = heads_kv * group;
  p.head_dim = head_dim;
  p.q_dtype = DType::kBF16;
  p.kv_dtype = DType::kBF16;
  return p;
}

/// Split rows of a plan (`DecodeChoice::split_ids`: the default and the short-split depth's; the
/// launch rules ask only whether a short-split row exists): with one, and without.
constexpr int kShortRow[2] = {0, 1};
constexpr int kNoShortRow[2] = {0, -1};

Status status_of(const DecodeProblem& p) {
  try {
    plan::check_decode_problem(kFn, p);
  } catch (const Error& e) {
    return e.status();
  }
  return Status::kSuccess;
}

TEST(PlanDecode, HeadDimsAreTheOneList) {
  for (std::int64_t d : plan::kDecodeHeadDims) {
    EXPECT_TRUE(plan::decode_head_dim_supported(d));
    EXPECT_EQ(status_of(problem(1, 1, d)), Status::kSuccess) << d;
  }
  for (std::int64_t d : {0, 32, 96, 192, 512}) {
    EXPECT_FALSE(plan::decode_head_dim_supported(d));
    EXPECT_EQ(status_of(problem(1, 1, d)), Status::kNotSupported) << d;
  }
  for (DType dt : plan::kDecodeDTypes) {
    DecodeProblem p = problem(1, 1, 128);
    p.q_dtype = p.kv_dtype = dt;
    EXPECT_TRUE(plan::decode_dtype_supported(dt));
    EXPECT_EQ(status_of(p), Status::kSuccess);
  }
  DecodeProblem f32 = problem(1, 1, 128);
  f32.q_dtype = f32.kv_dtype = DType::kF32;
  EXPECT_EQ(status_of(f32), Status::kNotSupported);
  // the messages list what is compiled
  try {
    plan::check_decode_problem(kFn, problem(1, 1, 96));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(compiled::list_string(compiled::DecodeHeadDims{})),
              std::string::npos)
        << e.what();
  }
  try {
    plan::check_decode_problem(kFn, f32);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f16 or bf16"), std::string::npos) << e.what();
  }
  DecodeProblem mixed = problem(1, 1, 128);
  mixed.q_dtype = DType::kF16;
  EXPECT_EQ(status_of(mixed), Status::kNotSupported);
  EXPECT_EQ(status_of(problem(1, 1, 128, 4, 9)), Status::kInvalidArgument);  // q_len > 8
}

TEST(PlanDecode, RowTilesAreSixteenRows) {
  EXPECT_EQ(plan::decode_row_tiles(problem(1, 8, 128, 4, 1), 16), 1);
  EXPECT_EQ(plan::decode_row_tiles(problem(1, 8, 128, 4, 4), 16), 1);
  EXPECT_EQ(plan::decode_row_tiles(problem(1, 8, 128, 4, 5), 16), 2);
  EXPECT_EQ(plan::decode_row_tiles(problem(1, 1, 128, 16, 8), 16), 8);
}

TEST(PlanDecode, ShortCandidateNeedsAShortRowAndFixedSizesUpTo256) {
  const plan::DecodeFacts f = facts();
  EXPECT_TRUE(plan::short_candidate(f, kShortRow, fixed_size(256, 4)));
  EXPECT_TRUE(plan::short_candidate(f, kShortRow, fixed_size(16, 1)));
  EXPECT_FALSE(plan::short_candidate(f, kShortRow, fixed_size(272, 4)));
  EXPECT_FALSE(plan::short_candidate(f, kNoShortRow, fixed_size(128, 4)));
  SplitLayout count;
  count.policy = SplitPolicy::kFixedCount;
  count.num_splits = 4;
  count.max_splits = 4;
  EXPECT_FALSE(plan::short_candidate(f, kShortRow, count));
  plan::DecodeFacts off = f;
  off.short_tokens = 0;  // the configuration off
  EXPECT_FALSE(plan::short_candidate(off, kShortRow, fixed_size(256, 4)));
}

TEST(PlanDecode, AutoLayoutOfAShortRequestFitsOneCluster) {
  // batch 1 × 8 KV heads × 1000 keys on 132 SMs × 2: the heuristic takes 16 splits of 64;
  // a cluster merges at most 8, so 8 splits of 128 (within the 256 cluster tokens)
  const std::vector<std::int32_t> lens = {1000};
  const SplitLayout l =
      plan::auto_layout(kFn, problem(1, 8, 128), lens.data(), DecodeOptions{}, 264, 1, facts());
  EXPECT_EQ(l.policy, SplitPolicy::kFixedSize);
  EXPECT_EQ(l.split_size, 128);
  EXPECT_EQ(l.max_splits, 8);
  // 3000 keys: 8 splits would be 384 tokens each, above the cluster tokens: unchanged
  const std::vector<std::int32_t> longer = {3000};
  const SplitLayout m =
      plan::auto_layout(kFn, problem(1, 8, 128), longer.data(), DecodeOptions{}, 264, 1, facts());
  EXPECT_GT(m.max_splits, 8);
}

TEST(PlanDecode, FewerCtasPerSmGiveFewerLongerSplits) {
  // batch 1 × 8 KV heads × 8192 keys, 132 SMs: at the kernel's 2 CTAs per SM the heuristic
  // fills 264 slots (32 splits of 256); asked for 1 CTA per SM it fills 132 (16 splits of 512)
  const std::vector<std::int32_t> lens = {8192};
  const plan::DecodeChoice a =
      plan::resolve_decode(kFn, problem(1, 8, 128), lens.data(), DecodeOptions{}, 132, facts());
  EXPECT_EQ(a.splits.max_splits, 32);
  EXPECT_EQ(a.splits.split_size, 256);
  DecodeOptions one;
  one.plan_ctas_per_sm = 1;
  const plan::DecodeChoice b =
      plan::resolve_decode(kFn, problem(1, 8, 128), lens.data(), one, 132, facts());
  EXPECT_EQ(b.splits.max_splits, 16);
  EXPECT_EQ(b.splits.split_size, 512);
  EXPECT_EQ(b.grid, 8 * 16);
  // the kernel's own occupancy asked for: the automatic plan
  DecodeOptions two;
  two.plan_ctas_per_sm = facts().ctas_per_sm;
  const plan::DecodeChoice c =
      plan::resolve_decode(kFn, problem(1, 8, 128), lens.data(), two, 132, facts());
  EXPECT_EQ(c.splits.max_splits, a.splits.max_splits);
  EXPECT_EQ(c.splits.split_size, a.splits.split_size);
  // the tuning fact does the same for every plan, the option first; more CTAs per SM than the
  // kernel keeps resident count as its occupancy
  plan::DecodeFacts f = facts();
  f.plan_ctas_per_sm = 1;
  const plan::DecodeChoice d =
      plan::resolve_decode(kFn, problem(1, 8, 128), lens.data(), DecodeOptions{}, 132, f);
  EXPECT_EQ(d.splits.max_splits, 16);
  EXPECT_EQ(
      plan::resolve_decode(kFn, problem(1, 8, 128), lens.data(), two, 132, f).splits.max_splits,
      32);
  f.plan_ctas_per_sm = 8;
  EXPECT_EQ(plan::resolve_decode(kFn, problem(1, 8, 128), lens.data(), DecodeOptions{}, 132, f)
                .splits.max_splits,
            32);
}

TEST(PlanDecode, FewRequestsKeepSplitsOfAtLeastTheWaveFloor) {
  // head dim 64 (4 CTAs per SM: 528 slots on 132 SMs), batch 1 × 8 KV heads: the heuristic
  // alone would fill the slots with 64 splits of 64 (4k) or 128 (8k) keys
  if (!plan::decode_head_dim_supported(64)) GTEST_SKIP() << "needs head dim 64 compiled";
  EXPECT_EQ(plan::decode_kernel_facts(64, 1).wave_min_split_tokens, 0) << "16-bit caches only";
  const plan::DecodeFacts f = plan::decode_kernel_facts(64, 2);
  ASSERT_EQ(f.ctas_per_sm, 4);
  const auto layout = [&](std::int32_t len, const plan::DecodeFacts& g) {
    const std::vector<std::int32_t> lens = {len};
    return plan::resolve_decode(kFn, problem(1, 8, 64), lens.data(), DecodeOptions{}, 132, g)
        .splits;
  };
  EXPECT_EQ(layout(4096, f).split_size, 256);
  EXPECT_EQ(layout(4096, f).max_splits, 16);
  EXPECT_EQ(layout(8192, f).split_size, 256);
  EXPECT_EQ(layout(8192, f).max_splits, 32);
  // within a cluster's worth of splits (8 × 256 keys) the cluster rule decides: unchanged
  EXPECT_EQ(layout(2048, f).split_size, 256);
  EXPECT_EQ(layout(2048, f).max_splits, 8);
  EXPECT_EQ(layout(1024, f).split_size, 128);
  // 4300 keys: 17 splits of 256; the rounding to a multiple of the cluster's split count (18
  // splits of 240) would go under the floor again, so it is not taken
  EXPECT_EQ(layout(4300, f).split_size, 256);
  EXPECT_EQ(layout(4300, f).max_splits, 17);
  // the floor off: the heuristic's layout
  plan::DecodeFacts off = f;
  off.wave_min_split_tokens = 0;
  // long requests: the heuristic's splits are longer than the floor already
  EXPECT_GT(layout(65536, off).split_size, 256);
  EXPECT_EQ(layout(65536, f).max_splits, layout(65536, off).max_splits);
  EXPECT_EQ(layout(4096, off).split_size, 64);
  EXPECT_EQ(layout(4096, off).max_splits, 64);
  // many requests: the heuristic does not split them that finely
  const std::vector<std::int32_t> many(16, 4096);
  const SplitLayout m =
      plan::resolve_decode(kFn, problem(16, 8, 64), many.data(), DecodeOptions{}, 132, off).splits;
  EXPECT_GE(m.split_size, 256);
  EXPECT_EQ(plan::resolve_decode(kFn, problem(16, 8, 64), many.data(), DecodeOptions{}, 132, f)
                .splits.split_size,
            m.split_size);
}

TEST(PlanDecode, AutoLayoutRoundsALongSplitCountToTheMultipleWithinOneWave) {
  // 1 KV head, 20 slots, 20480 keys: the heuristic takes 19 splits of 1088; rounded up to 20
  // splits of 1024 (the grid of 20 CTAs stays within the slots)
  const std::vector<std::int32_t> lens = {20480};
  const SplitLayout l =
      plan::auto_layout(kFn, problem(1, 1, 128), lens.data(), DecodeOptions{}, 20, 1, facts());
  EXPECT_EQ(l.max_splits, 20);
  EXPECT_EQ(l.split_size, 1024);
  // 19 slots: 20 CTAs would exceed one wave: 19 splits kept
  const SplitLayout m =
      plan::auto_layout(kFn, problem(1, 1, 128), lens.data(), DecodeOptions{}, 19, 1, facts());
  EXPECT_EQ(m.max_splits, 19);
  EXPECT_EQ(m.split_size, 1088);
}

TEST(PlanDecode, ClusterMergeWhenEveryClusterIsResident) {
  plan::DecodeFacts f = facts(0);
  f.resident_clusters[0][4] = 16;
  // 4 splits of 512 (not a short candidate), grid 64: 16 clusters of 4, all resident
  const plan::SplitLaunch a = plan::resolve_split_launch(f, kShortRow, fixed_size(512, 4), 132, 64);
  EXPECT_EQ(a.stages, f.stages);
  EXPECT_EQ(a.cluster, 4);
  // grid 80: 20 clusters, more than resident: the workspace merge; groups of 2 (3 does not
  // divide 4) need 40 resident clusters of 2
  f.resident_clusters[0][2] = 40;
  EXPECT_EQ(plan::resolve_split_launch(f, kShortRow, fixed_size(512, 4), 132, 80).cluster, 2);
  f.resident_clusters[0][2] = 39;
  EXPECT_EQ(plan::resolve_split_launch(f, kShortRow, fixed_size(512, 4), 132, 80).cluster, 1);
  // one split: never a cluster
  EXPECT_EQ(plan::resolve_split_launch(facts(), kShortRow, fixed_size(512, 1), 132, 64).cluster, 1);
}

TEST(PlanDecode, WorkspaceMergeGroupsOfManySplits) {
  plan::DecodeFacts f = facts(0);
  // 24 splits (more than a cluster merges): the largest group up to 8 dividing 24 with every
  // cluster resident: 8 when 24 clusters of 8 fit, else 6 ...
  f.resident_clusters[0][8] = 24;
  f.resident_clusters[0][6] = 32;
  EXPECT_EQ(plan::resolve_split_launch(f, kNoShortRow, fixed_size(1024, 24), 132, 192).cluster, 8);
  f.resident_clusters[0][8] = 23;
  EXPECT_EQ(plan::resolve_split_launch(f, kNoShortRow, fixed_size(1024, 24), 132, 192).cluster, 6);
  f.resident_clusters[0][6] = 31;
  EXPECT_EQ(plan::resolve_split_launch(f, kNoShortRow, fixed_size(1024, 24), 132, 192).cluster, 1);
  // 9 splits: 3 (the only divisor up to 8 besides 1)
  f.resident_clusters[0][3] = 100;
  EXPECT_EQ(plan::resolve_split_launch(f, kNoShortRow, fixed_size(1024, 9), 132, 72).cluster, 3);
}

TEST(PlanDecode, ShortSplitDepthWhenTheGridExceedsOneWave) {
  const plan::DecodeFacts f = facts();
  // 132 SMs × 2 CTAs = 264: a grid of 265 short splits takes the short-split depth
  EXPECT_EQ(
      plan::resolve_split_launch(f, kShortRow, fixed_size(f.short_tokens, 1), 132, 264).stages,
      f.stages);
  EXPECT_EQ(
      plan::resolve_split_launch(f, kShortRow, fixed_size(f.short_tokens, 1), 132, 265).stages,
      f.short_stages);
  // not a candidate: longer splits, or no short-split row
  EXPECT_EQ(
      plan::resolve_split_launch(f, kShortRow, fixed_size(f.short_tokens + 16, 1), 132, 265).stages,
      f.stages);
  EXPECT_EQ(
      plan::resolve_split_launch(f, kNoShortRow, fixed_size(f.short_tokens, 1), 132, 265).stages,
      f.stages);
}

TEST(PlanDecode, ShortSplitDepthWhenOnlyItKeepsEveryClusterResident) {
  plan::DecodeFacts f = facts(0);
  f.resident_clusters[0][8] = 4;
  f.resident_clusters[1][8] = 10;
  // 8 clusters of 8 (grid 64, one wave): resident only at the short-split depth
  plan::SplitLaunch l = plan::resolve_split_launch(f, kShortRow, fixed_size(128, 8), 132, 64);
  EXPECT_EQ(l.stages, f.short_stages);
  EXPECT_EQ(l.cluster, 8);
  // resident at neither depth: the default depth and the workspace merge (groups of 4 if
  // 16 clusters of 4 fit)
  f.resident_clusters[1][8] = 6;
  f.resident_clusters[0][4] = 16;
  l = plan::resolve_split_launch(f, kShortRow, fixed_size(128, 8), 132, 64);
  EXPECT_EQ(l.stages, f.stages);
  EXPECT_EQ(l.cluster, 4);
}

TEST(PlanDecode, StreamedKernelForManyShortUnsplitRequests) {
  const DecodeOptions automatic;
  // 200 requests × 8 KV heads × 200 keys: one split each, 1600 items ≥ 3/4 · 132 · 8
  const std::vector<std::int32_t> lens(200, 200);
  const plan::DecodeChoice c =
      plan::resolve_decode(kFn, problem(200, 8, 128), lens.data(), automatic, 132, facts());
  EXPECT_EQ(c.splits.max_splits, 1);
  EXPECT_TRUE(c.streamed);
  // the recorded fallback (q misaligned, prior states, page size): the split kernel, short
  // splits of 208 on a grid of 1600 > 264: the short-split depth, no cluster
  EXPECT_EQ(c.split.stages, facts().short_stages);
  EXPECT_EQ(c.split.cluster, 1);
  // head dim 256 (when compiled): no streamed kernel
  if (plan::decode_head_dim_supported(256)) {
    EXPECT_FALSE(
        plan::resolve_decode(kFn, problem(200, 8, 256), lens.data(), automatic, 132, facts())
            .streamed);
  }
  // a request longer than 2048 keys
  std::vector<std::int32_t> one_long = lens;
  one_long[7] = 2049;
  EXPECT_FALSE(
      plan::resolve_decode(kFn, problem(200, 8, 128), one_long.data(), automatic, 132, facts())
          .streamed);
  // 30 requests: one split each but 240 items < 3/4 · 132 · 8
  const plan::DecodeChoice few =
      plan::resolve_decode(kFn, problem(30, 8, 128), lens.data(), automatic, 132, facts());
  EXPECT_EQ(few.splits.max_splits, 1);
  EXPECT_FALSE(few.streamed);
  // a fixed policy never streams
  DecodeOptions count;
  count.policy = SplitPolicy::kFixedCount;
  count.num_splits = 1;
  EXPECT_FALSE(
      plan::resolve_decode(kFn, problem(200, 8, 128), lens.data(), count, 132, facts()).streamed);
}

/// The error `f` throws (fails the test when none).
template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error";
  return Error(Status::kSuccess, "none");
}

TEST(PlanDecode, Fp8CachesTakeTheStreamedKernelWhereTheCatalogHoldsIt) {
  // many short requests over an fp8 cache, plain or with a variant: the automatic policy's
  // streamed kernel (the catalog's fp8 streamed rows), else the split kernel, for its reason
  namespace catalog = attnstate::catalog;
  if (!plan::decode_head_dim_supported(128)) GTEST_SKIP() << "needs head dim 128 compiled";
  std::vector<std::int32_t> lens(128);
  for (std::size_t b = 0; b < lens.size(); ++b) lens[b] = static_cast<std::int32_t>(b * 5 % 701);
  for (const DType kv : {DType::kE4M3, DType::kE5M2})
    for (const float cap : {0.f, 30.f}) {
      DecodeProblem pr = problem(128, 8, 128, 4, 2);
      pr.kv_dtype = kv;
      DecodeOptions o;
      o.variant.logits_soft_cap = cap;
      plan::DecodeFacts f = plan::decode_kernel_facts(128, 1);
      f.ctas_per_sm = 1;
      const plan::DecodeChoice c = plan::resolve_decode(kFn, pr, lens.data(), o, 132, f);
      catalog::Query q;
      q.family = catalog::Family::kDecodeStream;
      q.head_dim = 128;
      q.q = catalog::mask(DType::kBF16);
      q.kv = catalog::mask(kv);
      q.variants = catalog::variants_of(attnstate::kNoWindow, cap);
      const bool compiled = catalog::compiled(q);
      EXPECT_EQ(c.streamed, compiled) << attnstate::to_string(kv) << " cap " << cap;
      EXPECT_EQ(c.reason, compiled ? plan::DecodeReason::kStreamedAuto
                                   : plan::DecodeReason::kSplitNoStreamed);
      if (compiled) {
        EXPECT_EQ(catalog::kRows[static_cast<std::size_t>(c.stream_id)].kv, kv);
      }
    }
}

TEST(PlanDecode, KernelChoiceAndItsReason) {
  if (!plan::decode_head_dim_supported(128)) GTEST_SKIP() << "needs head dim 128 compiled";
  namespace catalog = attnstate::catalog;
  const std::vector<std::int32_t> lens(200, 200);
  const auto resolve = [&](std::int64_t batch, const DecodeOptions& o,
                           const std::vector<std::int32_t>& l) {
    return plan::resolve_decode(kFn, problem(batch, 8, 128), l.data(), o, 132, facts());
  };
  // each rule of the automatic policy, as its reason
  const plan::DecodeChoice streamed = resolve(200, DecodeOptions{}, lens);
  EXPECT_TRUE(streamed.streamed);
  EXPECT_EQ(streamed.reason, plan::DecodeReason::kStreamedAuto);
  EXPECT_EQ(resolve(30, DecodeOptions{}, lens).reason, plan::DecodeReason::kSplitFewItems);
  const std::vector<std::int32_t> past_cap(200, 2049);  // one split each, past the cap
  EXPECT_EQ(resolve(200, DecodeOptions{}, past_cap).splits.max_splits, 1);
  EXPECT_EQ(resolve(200, DecodeOptions{}, past_cap).reason, plan::DecodeReason::kSplitLongRequest);
  const std::vector<std::int32_t> longer(2, 30000);
  EXPECT_EQ(resolve(2, DecodeOptions{}, longer).reason, plan::DecodeReason::kSplitRequests);
  DecodeOptions count;
  count.policy = SplitPolicy::kFixedCount;
  count.num_splits = 1;
  EXPECT_EQ(resolve(200, count, lens).reason, plan::DecodeReason::kSplitPolicy);
  if (plan::decode_head_dim_supported(256)) {  // no streamed kernel at head dim 256
    EXPECT_EQ(
        plan::resolve_decode(kFn, problem(200, 8, 256), lens.data(), DecodeOptions{}, 132, facts())
            .reason,
        plan::DecodeReason::kSplitNoStreamed);
  }
  DecodeOptions window;
  window.variant.window_left = 64;
  // asked for: the streamed kernel under a fixed single split, the split kernel where the rule
  // would stream
  DecodeOptions asked = count;
  asked.kernel = attnstate::DecodeKernel::kStreamed;
  const plan::DecodeChoice s = resolve(200, asked, lens);
  EXPECT_TRUE(s.streamed);
  EXPECT_EQ(s.reason, plan::DecodeReason::kStreamedAsked);
  DecodeOptions split;
  split.kernel = attnstate::DecodeKernel::kSplit;
  const plan::DecodeChoice k = resolve(200, split, lens);
  EXPECT_FALSE(k.streamed);
  EXPECT_EQ(k.reason, plan::DecodeReason::kSplitAsked);
  // the recorded kernel ids are the catalog's rows of the choice
  const catalog::Row& sr = catalog::kRows[static_cast<std::size_t>(s.kernel_id())];
  EXPECT_EQ(sr.family, catalog::Family::kDecodeStream);
  EXPECT_EQ(sr.head_dim, 128);
  const catalog::Row& kr = catalog::kRows[static_cast<std::size_t>(k.kernel_id())];
  EXPECT_EQ(kr.family, catalog::Family::kDecodeSplit);
  EXPECT_EQ(kr.stages, k.split.stages);
  EXPECT_EQ(kr.q, DType::kBF16);
  EXPECT_EQ(kr.kv, DType::kBF16);
  ASSERT_GE(k.split_ids[0], 0);
  EXPECT_EQ(catalog::kRows[static_cast<std::size_t>(k.split_ids[0])].stages, facts().stages);
  // the variant's plan names the variant instances: the streamed one (the rule streams a window
  // and a soft cap as it does plain attention), and the split one as its fallback
  for (int v = 0; v < 3; ++v) {
    DecodeOptions o;
    if (v != 1) o.variant.window_left = 64;
    if (v != 0) o.variant.logits_soft_cap = 30.f;
    const catalog::Variants want =
        catalog::variants_of(o.variant.window_left, o.variant.logits_soft_cap);
    const plan::DecodeChoice w = resolve(200, o, lens);
    EXPECT_TRUE(w.streamed) << "variant " << v;
    EXPECT_EQ(w.reason, plan::DecodeReason::kStreamedAuto) << "variant " << v;
    const catalog::Row& wr = catalog::kRows[static_cast<std::size_t>(w.kernel_id())];
    EXPECT_EQ(wr.family, catalog::Family::kDecodeStream) << "variant " << v;
    EXPECT_EQ(wr.variants & want, want) << "variant " << v;
    ASSERT_GE(w.split_ids[0], 0);
    const catalog::Row& fr = catalog::kRows[static_cast<std::size_t>(w.split_ids[0])];
    EXPECT_EQ(fr.family, catalog::Family::kDecodeSplit) << "variant " << v;
    EXPECT_EQ(fr.variants & want, want) << "variant " << v;
  }
  // plain attention keeps the plain streamed instance
  EXPECT_EQ(sr.variants & (catalog::kWindow | catalog::kSoftCap), 0);
  // every reason has its own words
  std::vector<std::string> words;
  for (int r = 0; r <= static_cast<int>(plan::DecodeReason::kSplitLongRequest); ++r) {
    const std::string t = plan::to_string(static_cast<plan::DecodeReason>(r));
    EXPECT_EQ(std::count(words.begin(), words.end(), t), 0) << t;
    words.push_back(t);
  }
}

TEST(PlanDecode, HandChoicesAreCheckedByName) {
  if (!plan::decode_head_dim_supported(128)) GTEST_SKIP() << "needs head dim 128 compiled";
  const std::vector<std::int32_t> lens = {4000, 4000};
  DecodeOptions eight;
  eight.policy = SplitPolicy::kFixedCount;
  eight.num_splits = 8;
  const auto refused = [&](const DecodeOptions& o, Status st, const char* name) {
    const Error e = error_of(
        [&] { plan::resolve_decode(kFn, problem(2, 8, 128), lens.data(), o, 132, facts()); });
    EXPECT_EQ(e.status(), st) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find(name), std::string::npos) << what;
    EXPECT_NE(what.find(kFn), std::string::npos) << what;
  };
  DecodeOptions o = eight;
  o.kernel = attnstate::DecodeKernel::kStreamed;  // eight splits per request
  refused(o, Status::kInvalidArgument, "options.kernel");
  o = DecodeOptions{};
  o.policy = SplitPolicy::kFixedCount;
  o.num_splits = 1;
  o.kernel = attnstate::DecodeKernel::kStreamed;
  o.variant.logits_soft_cap = 30.f;  // the streamed variant instance takes a soft cap
  EXPECT_TRUE(plan::resolve_decode(kFn, problem(2, 8, 128), lens.data(), o, 132, facts()).streamed);
  if (plan::decode_head_dim_supported(256)) {  // no streamed kernel at head dim 256
    const Error e = error_of(
        [&] { plan::resolve_decode(kFn, problem(2, 8, 256), lens.data(), o, 132, facts()); });
    EXPECT_EQ(e.status(), Status::kNotSupported) << e.what();
    EXPECT_NE(std::string(e.what()).find("options.kernel"), std::string::npos) << e.what();
  }
  o = eight;
  o.kernel = static_cast<attnstate::DecodeKernel>(7);
  refused(o, Status::kInvalidArgument, "options.kernel");
  o = DecodeOptions{};
  o.plan_ctas_per_sm = facts().ctas_per_sm + 1;  // more than the kernel keeps resident
  refused(o, Status::kInvalidArgument, "options.plan_ctas_per_sm");
  o.plan_ctas_per_sm = -1;
  refused(o, Status::kInvalidArgument, "options.plan_ctas_per_sm");
  o = eight;  // a fixed policy: the slots size only the automatic layout
  o.plan_ctas_per_sm = 1;
  refused(o, Status::kInvalidArgument, "options.plan_ctas_per_sm");
  o = eight;
  o.split_stages = 5;  // no such depth
  refused(o, Status::kInvalidArgument, "options.split_stages");
  o = eight;
  o.split_cluster = 3;  // not a divisor of 8
  refused(o, Status::kInvalidArgument, "options.split_cluster");
  o.split_cluster = 16;  // more than a cluster merges
  refused(o, Status::kInvalidArgument, "options.split_cluster");
  o.split_cluster = -1;
  refused(o, Status::kInvalidArgument, "options.split_cluster");
  if (plan::decode_head_dim_supported(64)) {  // the short-split depth exists at 128 only
    o = eight;
    o.split_stages = facts().short_stages;
    const Error e = error_of(
        [&] { plan::resolve_decode(kFn, problem(2, 8, 64), lens.data(), o, 132, facts()); });
    EXPECT_NE(std::string(e.what()).find("options.split_stages"), std::string::npos) << e.what();
  }
  // taken: the launch the options name, kept for a smaller grid (a smaller run batch)
  o = eight;
  o.split_stages = facts().short_stages;
  o.split_cluster = 4;
  const plan::DecodeChoice c =
      plan::resolve_decode(kFn, problem(2, 8, 128), lens.data(), o, 132, facts());
  EXPECT_EQ(c.split.stages, facts().short_stages);
  EXPECT_EQ(c.split.cluster, 4);
  EXPECT_EQ(c.kernel_id(), c.split_ids[1]);
  const plan::SplitLaunch smaller = plan::resolve_split_launch(
      facts(), c.split_ids, c.splits, 132, c.grid / 2, c.forced_stages, c.forced_cluster);
  EXPECT_EQ(smaller.stages, facts().short_stages);
  EXPECT_EQ(smaller.cluster, 4);
  // without them the rule picks the cluster merge of all eight splits
  EXPECT_EQ(
      plan::resolve_decode(kFn, problem(2, 8, 128), lens.data(), eight, 132, facts()).split.cluster,
      8);
}

TEST(PlanDecode, PairedFp8DepthsAreTakenOnlyByHand) {
  // the paired fp8 rows (32 keys a warp's step, rings of 4 and 6 tiles): never the automatic
  // plan's; `options.split_stages` takes them (plain or with a variant) and the automatic layout
  // then fills only the CTAs per SM they keep resident; a problem without them refuses the depth
  // by name, listing the depths it has
  namespace catalog = attnstate::catalog;
  if (!compiled::contains(compiled::DecodeFp8HeadDims{}, catalog::kDecodePairHeadDim))
    GTEST_SKIP() << "no fp8 decode at the paired head dim";
  const std::vector<std::int32_t> lens = {131072};
  DecodeProblem pr = problem(1, 8, catalog::kDecodePairHeadDim);
  pr.kv_dtype = DType::kE4M3;
  plan::DecodeFacts f = plan::decode_kernel_facts(catalog::kDecodePairHeadDim, 1);
  for (auto& row : f.resident_clusters)
    for (int c = 2; c <= plan::kMaxCluster; ++c) row[c] = 1000;
  const plan::DecodeChoice automatic =
      plan::resolve_decode(kFn, pr, lens.data(), DecodeOptions{}, 132, f);
  const catalog::Row& ar = catalog::kRows[static_cast<std::size_t>(automatic.kernel_id())];
  EXPECT_EQ(ar.tile_keys, f.tile_rows);
  EXPECT_EQ(automatic.split.stages, f.stages);
  for (const int depth : {catalog::kDecodePairStages, catalog::kDecodePairDeepStages})
    for (const float cap : {0.f, 30.f}) {
      SCOPED_TRACE("depth " + std::to_string(depth) + " cap " + std::to_string(cap));
      DecodeOptions o;
      o.split_stages = depth;
      o.variant.logits_soft_cap = cap;
      const plan::DecodeChoice c = plan::resolve_decode(kFn, pr, lens.data(), o, 132, f);
      ASSERT_GE(c.split_ids[1], 0);
      EXPECT_EQ(c.kernel_id(), c.split_ids[1]);
      const catalog::Row& r = catalog::kRows[static_cast<std::size_t>(c.kernel_id())];
      EXPECT_EQ(r.stages, depth);
      EXPECT_EQ(r.tile_keys, catalog::kDecodePairKeys);
      EXPECT_EQ(r.kv, DType::kE4M3);
      EXPECT_EQ(c.split.stages, depth);
      // a grid of at most the depth's resident CTAs (fewer than the default depth's)
      const int per_sm = catalog::decode_ctas_per_sm(catalog::kDecodePairHeadDim, depth, 1);
      EXPECT_LT(per_sm, f.ctas_per_sm);
      EXPECT_LE(c.grid, 132 * per_sm);
      if (cap == 0.f) {
        EXPECT_LT(c.grid, automatic.grid);
      }
      const char* why = nullptr;
      EXPECT_TRUE(plan::split_launch_valid(f, c.split_ids, c.splits, c.split, &why));
      // kept for a smaller grid (a smaller run batch)
      EXPECT_EQ(plan::resolve_split_launch(f, c.split_ids, c.splits, 132, c.grid / 2,
                                           c.forced_stages, c.forced_cluster)
                    .stages,
                depth);
    }
  // 16-bit caches have no paired rows
  DecodeOptions o;
  o.split_stages = catalog::kDecodePairStages;
  const Error e = error_of([&] {
    plan::resolve_decode(kFn, problem(1, 8, catalog::kDecodePairHeadDim), lens.data(), o, 132,
                         facts());
  });
  EXPECT_EQ(e.status(), Status::kInvalidArgument);
  const std::string what = e.what();
  EXPECT_NE(what.find("options.split_stages"), std::string::npos) << what;
  EXPECT_NE(what.find("3 or 2"), std::string::npos) << what;
  // the fp8 problem names its paired depths among its own
  o.split_stages = 5;
  const std::string fp8_what =
      error_of([&] { plan::resolve_decode(kFn, pr, lens.data(), o, 132, f); }).what();
  EXPECT_NE(fp8_what.find("3, 2, 4 or 6"), std::string::npos) << fp8_what;
}

TEST(PlanDecode, StreamedPlanFallsBackOnRunTimeConditions) {
  namespace catalog = attnstate::catalog;
  using catalog::Family;
  if (!plan::decode_head_dim_supported(128)) GTEST_SKIP() << "needs head dim 128 compiled";
  const auto row = [](Family family, std::int64_t d) {
    catalog::Query q;
    q.family = family;
    q.head_dim = d;
    q.q = q.kv = catalog::mask(DType::kBF16);
    return catalog::find_id(q);
  };
  const int stream = row(Family::kDecodeStream, 128);
  ASSERT_GE(stream, 0);
  const catalog::Row& r = catalog::kRows[static_cast<std::size_t>(stream)];
  ASSERT_NE(r.fallback, Family::kDecodeStream);
  const auto runs = [](int id, int prior, bool aligned, std::int64_t page,
                       catalog::Variants v = catalog::kPlain) {
    return plan::decode_run_family(id, v, prior, aligned, page);
  };
  EXPECT_EQ(runs(stream, 0, true, 16), Family::kDecodeStream);
  EXPECT_EQ(runs(stream, 0, true, 32), Family::kDecodeStream);
  EXPECT_EQ(runs(stream, 2, true, 16), r.fallback);                    // prior states folded
  EXPECT_EQ(runs(stream, 0, false, 16), r.fallback);                   // q rows misaligned
  EXPECT_EQ(runs(stream, 0, true, 24), r.fallback);                    // pages of 24 tokens
  EXPECT_EQ(runs(stream, 0, true, 16, catalog::kWindow), r.fallback);  // a variant
  // the variant instance: a window and a soft cap stream; the same run-time fallbacks
  catalog::Query vq;
  vq.family = Family::kDecodeStream;
  vq.head_dim = 128;
  vq.q = vq.kv = catalog::mask(DType::kBF16);
  vq.variants = catalog::kWindow | catalog::kSoftCap | catalog::kSinks;
  const int variant = catalog::find_id(vq);
  ASSERT_GE(variant, 0);
  EXPECT_NE(variant, stream);
  const catalog::Variants both = catalog::kWindow | catalog::kSoftCap;
  EXPECT_EQ(runs(variant, 0, true, 16, both), Family::kDecodeStream);
  EXPECT_EQ(runs(variant, 0, true, 32, catalog::kSoftCap), Family::kDecodeStream);
  EXPECT_EQ(runs(variant, 2, true, 16, both), r.fallback);   // prior states folded
  EXPECT_EQ(runs(variant, 0, false, 16, both), r.fallback);  // q rows misaligned
  EXPECT_EQ(runs(variant, 0, true, 24, both), r.fallback);   // pages of 24 tokens
  if (plan::decode_head_dim_supported(64)) {
    EXPECT_EQ(runs(row(Family::kDecodeStream, 64), 0, true, 32), Family::kDecodeStream);
  }
  // a split row has no fallback: it runs with prior states, misaligned rows, any page size
  const int split = row(Family::kDecodeSplit, 128);
  ASSERT_GE(split, 0);
  EXPECT_EQ(runs(split, 2, false, 24), Family::kDecodeSplit);
  EXPECT_THROW(runs(-1, 0, true, 16), Error);
  EXPECT_THROW(runs(catalog::kNumRows, 0, true, 16), Error);
}

TEST(PlanDecode, ResolvedLaunchIsTheRuleAtThePlannedGrid) {
  plan::DecodeFacts f = facts(0);
  f.resident_clusters[0][8] = 100;
  const std::vector<std::int32_t> lens = {1000, 600};
  const plan::DecodeChoice c =
      plan::resolve_decode(kFn, problem(2, 8, 128), lens.data(), DecodeOptions{}, 132, f);
  EXPECT_EQ(c.row_tiles, 1);
  const std::int64_t grid = 2 * 8 * c.splits.max_splits;
  const plan::SplitLaunch l = plan::resolve_split_launch(f, c.split_ids, c.splits, 132, grid);
  EXPECT_EQ(c.split.stages, l.stages);
  EXPECT_EQ(c.split.cluster, l.cluster);
  const char* why = nullptr;
  EXPECT_TRUE(plan::split_launch_valid(f, c.split_ids, c.splits, c.split, &why));
}

TEST(PlanDecode, RecordedLaunchIsChecked) {
  const plan::DecodeFacts f = facts();
  const char* why = nullptr;
  EXPECT_TRUE(plan::split_launch_valid(f, kShortRow, fixed_size(64, 8), {2, 8}, &why));
  EXPECT_TRUE(plan::split_launch_valid(f, kNoShortRow, fixed_size(64, 24), {3, 6}, &why));
  EXPECT_TRUE(plan::split_launch_valid(f, kNoShortRow, fixed_size(64, 1), {3, 1}, &why));
  EXPECT_FALSE(
      plan::split_launch_valid(f, kNoShortRow, fixed_size(64, 8), {2, 8}, &why));  // no depth 2
  EXPECT_FALSE(plan::split_launch_valid(f, kNoShortRow, fixed_size(64, 6), {3, 4}, &why));  // 4 ∤ 6
  EXPECT_FALSE(plan::split_launch_valid(f, kNoShortRow, fixed_size(64, 16), {3, 16}, &why));
  EXPECT_FALSE(plan::split_launch_valid(f, kNoShortRow, fixed_size(64, 1), {3, 2}, &why));
  EXPECT_FALSE(plan::split_launch_valid(f, kNoShortRow, fixed_size(64, 4), {3, 0}, &why));
}

TEST(PlanDecode, LayoutCostTakesWavesLongestFirst) {
  // lengths 64 and 32 in splits of 32 (at most 2): splits of 32, 32 and 32 keys, one empty
  plan::DecodeFacts f = facts();
  f.cta_cost_tokens = 64;
  f.empty_cta_tokens = 8;
  f.merge_cost_tokens = 64;
  const std::vector<std::int32_t> lens = {64, 32};
  // one slot: three waves of 32 + 64, the empty CTA, the merge
  EXPECT_DOUBLE_EQ(plan::layout_cost(lens.data(), 2, 1, 32, 2, 1, f), 3 * 96 + 8 + 64);
  // three slots: one wave; the empty CTA spread over the slots
  EXPECT_DOUBLE_EQ(plan::layout_cost(lens.data(), 2, 1, 32, 2, 3, f), 96 + 8.0 / 3 + 64);
  // no split: one wave as long as the longest request, no merge
  EXPECT_DOUBLE_EQ(plan::layout_cost(lens.data(), 2, 1, 64, 1, 3, f), 64 + 64);
  // every CTA counts: 2 CTAs per split double the waves on one slot
  EXPECT_DOUBLE_EQ(plan::layout_cost(lens.data(), 2, 2, 32, 2, 1, f), 6 * 96 + 16 + 64);
}

TEST(PlanDecode, RaggedBatchIsBalancedOverAllItsLengths) {
  // 4 requests, one 10x longer, 8 KV heads on 264 slots: sized from the longest alone, the
  // split count (from 4 x 8 work items) leaves its splits 4096 keys long while the short
  // requests' CTAs idle; balanced, the long request takes many short splits
  const std::vector<std::int32_t> lens = {3277, 32768, 3277, 3277};
  const DecodeProblem p = problem(4, 8, 128);
  const SplitLayout longest = attnstate::plan_split_layout(p, lens.data(), DecodeOptions{}, 264, 8);
  const SplitLayout l = plan::auto_layout(kFn, p, lens.data(), DecodeOptions{}, 264, 1, facts());
  EXPECT_EQ(l.policy, SplitPolicy::kFixedSize);
  EXPECT_GT(l.max_splits, 2 * longest.max_splits);
  EXPECT_LT(l.split_size, longest.split_size / 2);
  EXPECT_LT(plan::layout_cost(lens.data(), 4, 8, l.split_size, l.max_splits, 264, facts()),
            0.5 * plan::layout_cost(lens.data(), 4, 8, longest.split_size, longest.max_splits, 264,
                                    facts()));
  // every request served: its splits within the grid, its keys covered in order
  for (std::int32_t len : lens) {
    ASSERT_LE(l.splits_for(len), l.max_splits);
    std::int32_t next = 0;
    for (std::int32_t s = 0; s < l.splits_for(len); ++s) {
      EXPECT_EQ(l.range(len, s).begin, next);
      next = l.range(len, s).end;
    }
    EXPECT_EQ(next, len);
  }
  // the order of the requests does not matter
  const std::vector<std::int32_t> sorted = {32768, 3277, 3277, 3277};
  const SplitLayout m = plan::auto_layout(kFn, p, sorted.data(), DecodeOptions{}, 264, 1, facts());
  EXPECT_EQ(m.split_size, l.split_size);
  EXPECT_EQ(m.max_splits, l.max_splits);
}

TEST(PlanDecode, ManyRequestsUnsplitSplitTheLongOnes) {
  // 64 requests with lengths spread up to 64k, 8 KV heads: 512 work items already exceed the 264
  // slots (the wave heuristic does not split), but unsplit the longest CTAs run alone at the end
  std::vector<std::int32_t> lens;
  for (int i = 0; i < 64; ++i) lens.push_back(1024 * (i + 1));
  const DecodeProblem p = problem(64, 8, 128);
  const SplitLayout longest = attnstate::plan_split_layout(p, lens.data(), DecodeOptions{}, 264, 8);
  EXPECT_EQ(longest.max_splits, 1);
  const SplitLayout l = plan::auto_layout(kFn, p, lens.data(), DecodeOptions{}, 264, 1, facts());
  EXPECT_GT(l.max_splits, 4);
  EXPECT_LE(l.max_splits, attnstate::kMaxSplits);
  EXPECT_GE(l.split_size, facts().min_split_tokens);
}

TEST(PlanDecode, UniformLengthsKeepTheWaveHeuristic) {
  // all of one length: the wave-efficiency heuristic's split size (no rounding applies here)
  for (std::int32_t len : {8192, 32768, 131072}) {
    const std::vector<std::int32_t> lens(4, len);
    const DecodeProblem p = problem(4, 8, 128);
    const SplitLayout w = attnstate::plan_split_layout(p, lens.data(), DecodeOptions{}, 264, 8);
    const SplitLayout l = plan::auto_layout(kFn, p, lens.data(), DecodeOptions{}, 264, 1, facts());
    if (w.max_splits <= 8 || w.max_splits % 2 == 0) {
      EXPECT_EQ(l.split_size, w.split_size) << len;
      EXPECT_EQ(l.max_splits, w.max_splits) << len;
    }
  }
}

TEST(PlanDecode, BalancedLayoutEdges) {
  const plan::DecodeFacts f = facts();
  // every request empty: one (empty) split each
  const std::vector<std::int32_t> empty = {0, 0, 0};
  SplitLayout l =
      plan::auto_layout(kFn, problem(3, 8, 128), empty.data(), DecodeOptions{}, 264, 1, f);
  EXPECT_EQ(l.max_splits, 1);
  EXPECT_EQ(l.splits_for(0), 1);
  // one request of one token among long ones
  const std::vector<std::int32_t> one = {1, 50000, 49999};
  l = plan::auto_layout(kFn, problem(3, 8, 128), one.data(), DecodeOptions{}, 264, 1, f);
  EXPECT_EQ(l.splits_for(1), 1);
  EXPECT_EQ(l.range(1, 0).end, 1);
  EXPECT_LE(l.splits_for(50000), l.max_splits);
  // lengths at split edges: each request's splits cover its keys
  const std::vector<std::int32_t> edges = {2048, 2047, 2049, 16, 17, 15, 4096};
  l = plan::auto_layout(kFn, problem(7, 2, 128), edges.data(), DecodeOptions{}, 264, 1, f);
  for (std::int32_t len : edges) {
    ASSERT_LE(l.splits_for(len), l.max_splits) << len;
    EXPECT_EQ(l.range(len, l.splits_for(len) - 1).end, len) << len;
    EXPECT_GE(l.range(len, l.splits_for(len) - 1).end - l.range(len, l.splits_for(len) - 1).begin,
              len > 0 ? 1 : 0)
        << len;
  }
  // the 512-split cap and int32 split sizes at the largest lengths
  const std::vector<std::int32_t> huge = {0x7FFFFFFF, 1};
  const SplitLayout h = plan::balanced_layout(problem(2, 1, 128), huge.data(), 1 << 20, 1, f);
  EXPECT_GE(h.split_size, 16);
  EXPECT_EQ(h.split_size % 16, 0);
  EXPECT_LE(h.max_splits, attnstate::kMaxSplits);
  EXPECT_LE(h.splits_for(0x7FFFFFFF), h.max_splits);
  EXPECT_EQ(h.range(0x7FFFFFFF, h.splits_for(0x7FFFFFFF) - 1).end, 0x7FFFFFFF);
  const SplitLayout w =
      attnstate::plan_split_layout(problem(2, 1, 128), huge.data(), DecodeOptions{}, 1, 1);
  EXPECT_GT(w.split_size, 0);
  EXPECT_LE(w.splits_for(0x7FFFFFFF), w.max_splits);
}

TEST(PlanDecode, ErrorsNameTheArgument) {
  const std::vector<std::int32_t> lens = {16};
  try {
    plan::resolve_decode(kFn, problem(1, 1, 128), lens.data(), DecodeOptions{}, 0, facts());
    FAIL() << "num_sms 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_sms"), std::string::npos) << e.what();
  }
  // 2^22 requests × 512 splits: more than 2^31 - 1 CTAs
  const std::vector<std::int32_t> many(std::size_t{1} << 22, 16);
  DecodeOptions count;
  count.policy = SplitPolicy::kFixedCount;
  count.num_splits = 512;
  EXPECT_THROW(plan::resolve_decode(kFn, problem(std::int64_t{1} << 22, 1, 128, 1), many.data(),
                                    count, 132, facts()),
               Error);
}

}  // namespace
