/// @file test_cpu_decode.cpp
/// @brief CPU split-KV decode against a double-precision reference: shapes, dtypes, layouts,
///        page sizes, split policies and edges, causal q_len > 1, empty requests, argument errors;
///        and the split layout itself.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/cpu/decode.hpp"
#include "decode_problem.hpp"
#include "split_layouts.hpp"

namespace {

using attnstate_test::fixed_count;
using attnstate_test::fixed_size;

using namespace attnstate;
using namespace attnstate_test;

/// Runs the CPU decode of `p` and compares it with the kit's reference within `o_abs` on `o`
/// and `1e-5 · max(1, |lse|)` on the LSE: "" when it matches, else the first mismatches.
std::string run_cpu(const DecodeProblemHost& p, const SplitLayout& layout, DType out_dtype,
                    LseBase base, double o_abs, HostState* keep = nullptr) {
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.cfg.head_dim)));
  HostState out(p.tokens(), p.cfg.heads_q, p.cfg.head_dim, out_dtype, base);
  cpu::decode(p.q_view(), p.kv_view(), layout, scale, out.view);
  if (keep) *keep = out;
  return compare_decode(reference_decode(p, scale), out.o.data(), out_dtype, out.lse.data(), base,
                        decode_tolerance(o_abs, 1e-5));
}

double o_tol(DType out_dtype, float gain) {
  const double base = out_dtype == DType::kBF16 ? 8e-3 : out_dtype == DType::kF16 ? 1e-3 : 2e-4;
  return base * (gain > 1.f ? 10.0 : 1.0);
}

TEST(DecodeSplits, RangesPartitionEveryLength) {
  const SplitLayout layouts[] = {fixed_count(1),    fixed_count(2),     fixed_count(3),
                                 fixed_count(7),    fixed_size(16, 64), fixed_size(48, 5),
                                 fixed_size(256, 2)};
  for (const SplitLayout& l : layouts) {
    for (std::int32_t len = 0; len < 700; ++len) {
      const std::int32_t n = l.splits_for(len);
      ASSERT_GE(n, 1);
      ASSERT_LE(n, l.max_splits);
      std::int32_t next = 0;
      for (std::int32_t s = 0; s < n; ++s) {
        const TokenRange r = l.range(len, s);
        ASSERT_EQ(r.begin, std::min(next, len)) << "len " << len << " split " << s;
        ASSERT_EQ(r.begin % kSplitGranularity == 0 || r.begin == len, true);
        ASSERT_GE(r.end, r.begin);
        next = r.end;
      }
      ASSERT_EQ(next, len) << "splits do not cover len " << len;
    }
  }
}

TEST(DecodeSplits, WaveHeuristicMatchesSeedTable) {
  // The seed's table: FlashAttention-2's heuristic with 2 × 132 slots and 128-token blocks.
  EXPECT_EQ(wave_efficiency_splits(8, 264, (128000 + 127) / 128), 29);
  EXPECT_EQ(wave_efficiency_splits(32, 264, (32000 + 127) / 128), 7);
  EXPECT_EQ(wave_efficiency_splits(32, 264, (8000 + 127) / 128), 7);
  EXPECT_EQ(wave_efficiency_splits(128, 264, (4000 + 127) / 128), 2);
  EXPECT_EQ(wave_efficiency_splits(2048, 264, (2000 + 127) / 128), 1);
  EXPECT_EQ(wave_efficiency_splits(8, 264, (300 + 127) / 128), 3);
}

TEST(DecodeSplits, PlanRejectsBadPolicies) {
  DecodeProblem pr;
  pr.batch = 1;
  pr.heads_q = 4;
  pr.heads_kv = 1;
  pr.head_dim = 64;
  const std::int32_t lens[1] = {100};
  DecodeOptions o;
  o.policy = SplitPolicy::kFixedCount;
  o.num_splits = 0;
  EXPECT_THROW(plan_split_layout(pr, lens, o, 100, 1), Error);
  o.policy = SplitPolicy::kFixedSize;
  o.split_size = 10;
  EXPECT_THROW(plan_split_layout(pr, lens, o, 100, 1), Error);
  o.split_size = 32;
  EXPECT_EQ(plan_split_layout(pr, lens, o, 100, 1).max_splits, 4);
  const std::int32_t neg[1] = {-1};
  o.policy = SplitPolicy::kAuto;
  EXPECT_THROW(plan_split_layout(pr, neg, o, 100, 1), Error);
}

TEST(DecodeCpu, MatchesReferenceAcrossShapesAndDtypes) {
  struct Case {
    std::int64_t q_len, hq, hkv, D, page;
    KvLayout layout;
    bool bt;
    DType qd, kvd, od;
  };
  const Case cases[] = {
      {1, 4, 4, 64, 16, KvLayout::kNHD, false, DType::kBF16, DType::kBF16, DType::kF32},
      {1, 8, 2, 128, 1, KvLayout::kHND, true, DType::kF16, DType::kF16, DType::kF16},
      {2, 16, 1, 64, 64, KvLayout::kNHD, true, DType::kF32, DType::kBF16, DType::kF32},
      {3, 8, 1, 256, 16, KvLayout::kHND, false, DType::kBF16, DType::kF16, DType::kBF16},
      {8, 32, 2, 64, 256, KvLayout::kNHD, false, DType::kF16, DType::kF16, DType::kF32},
      {1, 64, 8, 128, 16, KvLayout::kNHD, true, DType::kBF16, DType::kBF16, DType::kBF16},
      {4, 12, 3, 64, 7, KvLayout::kHND, false, DType::kF32, DType::kF32, DType::kF32},
  };
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    DecodeConfig cfg = shape_config(c.q_len, c.hq, c.hkv, c.D, c.page, c.layout, c.bt, c.qd, c.kvd);
    cfg.seq_lens = {static_cast<std::int32_t>(c.page + 1), 0, 77, 3};
    const DecodeProblemHost p = make_decode_problem(cfg, seed++);
    for (int n : {1, 3}) {
      EXPECT_EQ(run_cpu(p, fixed_count(n), c.od, LseBase::kNatural, o_tol(c.od, 1.f)), "")
          << cfg.name() << " splits " << n;
    }
  }
}

TEST(DecodeCpu, SplitCountsAndLengthEdges) {
  DecodeConfig cfg;
  cfg.heads_q = 8;
  cfg.heads_kv = 2;
  cfg.head_dim = 64;
  cfg.page_size = 16;
  // lengths 0, 1, page-1, page, page+1, and edges of 3 splits of 96 tokens (len 288) ± 1
  cfg.seq_lens = {0, 1, 15, 16, 17, 95, 96, 97, 191, 192, 193, 287, 288, 289};
  const DecodeProblemHost p = make_decode_problem(cfg, 7);
  for (int n : {1, 2, 3, kMaxSplits}) {
    EXPECT_EQ(run_cpu(p, fixed_count(n), DType::kF32, LseBase::kNatural, 2e-4), "")
        << "num_splits " << n;
  }
  for (int size : {16, 32, 96}) {
    EXPECT_EQ(
        run_cpu(p, fixed_size(size, (289 + size - 1) / size), DType::kF32, LseBase::kBase2, 2e-4),
        "")
        << "split_size " << size;
  }
}

TEST(DecodeCpu, LargeLogitsStayFinite) {
  DecodeConfig cfg;
  cfg.heads_q = 8;
  cfg.heads_kv = 1;
  cfg.head_dim = 128;
  cfg.q_gain = 40.f;
  cfg.kv_dtype = DType::kF32;
  cfg.q_dtype = DType::kF32;
  cfg.seq_lens = {500, 33};
  const DecodeProblemHost p = make_decode_problem(cfg, 11);
  for (int n : {1, 4, 31}) {
    EXPECT_EQ(run_cpu(p, fixed_count(n), DType::kF32, LseBase::kNatural, o_tol(DType::kF32, 40.f)),
              "")
        << n;
  }
}

TEST(DecodeCpu, CausalRowsAndShortRequests) {
  DecodeConfig cfg;
  cfg.q_len = 5;
  cfg.heads_q = 4;
  cfg.heads_kv = 2;
  cfg.head_dim = 64;
  cfg.page_size = 4;
  cfg.seq_lens = {0, 1, 3, 5, 6, 40};  // shorter than q_len: the first rows see no key
  const DecodeProblemHost p = make_decode_problem(cfg, 3);
  HostState out(1, 1, 1, DType::kF32, LseBase::kNatural);
  EXPECT_EQ(run_cpu(p, fixed_count(2), DType::kF32, LseBase::kNatural, 2e-4, &out), "");
  // Request 2 (len 3): rows 0 and 1 are empty, rows 2.. see 1, 2, 3 keys.
  const std::int64_t t0 = 2 * cfg.q_len;
  EXPECT_EQ(out.lse[(t0 + 0) * cfg.heads_q], -INFINITY);
  EXPECT_EQ(out.lse[(t0 + 1) * cfg.heads_q], -INFINITY);
  EXPECT_TRUE(std::isfinite(out.lse[(t0 + 2) * cfg.heads_q]));
  float o0;
  std::memcpy(&o0, out.o.data(), 4);
  EXPECT_EQ(o0, 0.f);  // request 0 is empty: o = 0
}

TEST(DecodeCpu, SplittingChangesOnlyRounding) {
  DecodeConfig cfg;
  cfg.heads_q = 16;
  cfg.heads_kv = 2;
  cfg.head_dim = 64;
  cfg.seq_lens = {1000, 517, 64};
  cfg.kv_dtype = DType::kF32;
  cfg.q_dtype = DType::kF32;
  const DecodeProblemHost p = make_decode_problem(cfg, 5);
  HostState a(1, 1, 1, DType::kF32, LseBase::kNatural), b = a;
  // Each run also against the reference: two runs that both leave a row unwritten (NaN) would
  // otherwise agree.
  EXPECT_EQ(run_cpu(p, fixed_count(1), DType::kF32, LseBase::kNatural, 2e-4, &a), "")
      << "one split";
  ASSERT_EQ(a.o.size(), static_cast<std::size_t>(4 * p.tokens() * cfg.heads_q * cfg.head_dim));
  for (int n : {2, 5, 63}) {
    EXPECT_EQ(run_cpu(p, fixed_count(n), DType::kF32, LseBase::kNatural, 2e-4, &b), "") << n;
    ASSERT_EQ(b.o.size(), a.o.size());
    // NaN-propagating: a NaN on either side makes `worst` infinite.
    const double worst = max_abs_diff(a.o.data(), b.o.data(), DType::kF32,
                                      static_cast<std::int64_t>(a.o.size() / 4));
    EXPECT_LE(worst, 2e-6) << n;
    for (std::size_t i = 0; i < a.lse.size(); ++i) EXPECT_NEAR(a.lse[i], b.lse[i], 1e-5);
  }
}

TEST(DecodeCpu, FixedSizeRowsIndependentOfBatch) {
  DecodeConfig cfg;
  cfg.heads_q = 4;
  cfg.heads_kv = 1;
  cfg.head_dim = 64;
  cfg.seq_lens = {300};
  const DecodeProblemHost alone = make_decode_problem(cfg, 9);
  // The same request (same keys and query) inside a bigger batch.
  DecodeConfig cfg2 = cfg;
  cfg2.seq_lens = {1200, 300, 5};
  DecodeProblemHost others = make_decode_problem(cfg2, 10);
  // Overwrite request 1 of `others` with `alone`'s keys and query.
  for (std::int64_t t = 0; t < 304; ++t)
    for (std::int64_t d = 0; d < 64; ++d) {
      const std::int64_t src = alone.kv_offset(0, t, 0) + d;
      const std::int64_t dst = others.kv_offset(1, t, 0) + d;
      std::memcpy(&others.k[2 * dst], &alone.k[2 * src], 2);
      std::memcpy(&others.v[2 * dst], &alone.v[2 * src], 2);
    }
  std::memcpy(&others.q[2 * 4 * 64], alone.q.data(), 2 * 4 * 64);
  HostState a(1, 1, 1, DType::kF32, LseBase::kNatural), b = a;
  // Both runs against the reference (of `others` as modified): the bitwise check alone would
  // pass a row both runs leave unwritten (NaN).
  EXPECT_EQ(run_cpu(alone, fixed_size(64, 5), DType::kF32, LseBase::kNatural, 2e-4, &a), "")
      << "alone";
  EXPECT_EQ(run_cpu(others, fixed_size(64, 19), DType::kF32, LseBase::kNatural, 2e-4, &b), "")
      << "in a batch";
  ASSERT_EQ(a.o.size(), static_cast<std::size_t>(4 * 4 * 64));
  ASSERT_EQ(b.o.size(), static_cast<std::size_t>(3 * 4 * 4 * 64));
  EXPECT_EQ(0, std::memcmp(a.o.data(), b.o.data() + 4 * 4 * 64, 4 * 4 * 64));
  EXPECT_EQ(0, std::memcmp(a.lse.data(), b.lse.data() + 4, 4 * 4));
}

TEST(DecodeCpu, PolicyOverloadPlansLikeTheLayout) {
  DecodeConfig cfg;
  cfg.seq_lens = {200, 50};
  const DecodeProblemHost p = make_decode_problem(cfg, 13);
  for (SplitPolicy pol : {SplitPolicy::kAuto, SplitPolicy::kFixedCount, SplitPolicy::kFixedSize}) {
    DecodeOptions o;
    o.policy = pol;
    o.num_splits = 3;
    o.split_size = 32;
    HostState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
    cpu::decode(p.q_view(), p.kv_view(), o, out.view);
    EXPECT_EQ(compare_decode(reference_decode(p, 1.f / std::sqrt(64.f)), out.o.data(), DType::kF32,
                             out.lse.data(), LseBase::kNatural, decode_tolerance(2e-4, 1e-5)),
              "");
  }
}

TEST(DecodeCpu, RejectsBadArguments) {
  DecodeConfig cfg;
  cfg.seq_lens = {40, 20};
  DecodeProblemHost p = make_decode_problem(cfg, 17);
  HostState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  const SplitLayout l = fixed_count(2);
  auto expect_arg = [&](const ConstTensorView& q, const PagedKvCache& kv, const SplitLayout& lay,
                        float scale, StateView o, const char* name) {
    try {
      cpu::decode(q, kv, lay, scale, o);
      ADD_FAILURE() << "no error for " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument) << name;
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  PagedKvCache kv = p.kv_view();
  ConstTensorView q = p.q_view();
  {
    auto k2 = kv;
    k2.k = nullptr;
    expect_arg(q, k2, l, 0.1f, out.view, "kv.k");
  }
  {
    auto k2 = kv;
    k2.seq_lens = nullptr;
    expect_arg(q, k2, l, 0.1f, out.view, "kv.seq_lens");
  }
  {
    auto k2 = kv;
    k2.block_table = p.block_table.data();
    expect_arg(q, k2, l, 0.1f, out.view, "kv.block_table");
  }
  {
    auto k2 = kv;
    k2.space = MemorySpace::kDevice;
    expect_arg(q, k2, l, 0.1f, out.view, "kv.space");
  }
  {
    auto q2 = q;
    q2.shape[1] = 9;
    expect_arg(q2, kv, l, 0.1f, out.view, "q.shape[1]");
  }
  {
    auto q2 = q;
    q2.shape[2] = 7;
    expect_arg(q2, kv, l, 0.1f, out.view, "q.shape[2]");
  }
  {
    auto q2 = q;
    q2.stride[3] = 2;
    expect_arg(q2, kv, l, 0.1f, out.view, "q.stride[3]");
  }
  {
    auto o2 = out.view;
    o2.tokens = 3;
    expect_arg(q, kv, l, 0.1f, o2, "out.tokens");
  }
  {
    auto o2 = out.view;
    o2.lse = nullptr;
    expect_arg(q, kv, l, 0.1f, o2, "out.lse");
  }
  expect_arg(q, kv, l, NAN, out.view, "scale");
  {
    auto l2 = l;
    l2.max_splits = 0;
    expect_arg(q, kv, l2, 0.1f, out.view, "splits.max_splits");
  }
  {
    std::vector<std::int32_t> lens = {1000, 20};
    auto k2 = kv;
    k2.seq_lens = lens.data();
    expect_arg(q, k2, l, 0.1f, out.view, "kv.seq_lens");
  }
  {
    std::vector<std::int32_t> idx = p.indices;
    idx[0] = static_cast<std::int32_t>(p.num_pages);
    auto k2 = kv;
    k2.page_indices = idx.data();
    expect_arg(q, k2, l, 0.1f, out.view, "kv.page_indices");
  }
  {
    std::vector<std::int32_t> ip = p.indptr;
    ip[1] = ip[2] + 1;
    auto k2 = kv;
    k2.page_indptr = ip.data();
    expect_arg(q, k2, l, 0.1f, out.view, "kv.page_indptr");
  }
}

}  // namespace
