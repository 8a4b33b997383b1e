/// @file test_core_cascade_decision.cpp
/// @brief `decide_cascade`: the cascade where sharing pays (the benchmark's shapes, whose
///        recorded times the estimates must bracket), the plain decode where little or nothing
///        is shared, a shallower cascade where a deep level saves less than it costs, stable
///        choices as sharing grows, determinism and named errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/cascade_decision.hpp"
#include "attnstate/core/cascade_levels.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/paged_kv.hpp"

namespace {

using attnstate::CascadeCostModel;
using attnstate::CascadeCostShape;
using attnstate::CascadeDecision;
using attnstate::CascadeLevels;
using attnstate::decide_cascade;
using attnstate::DType;

/// A CSR page table (host, pools unset: the level finder reads only the table).
struct Table {
  std::int64_t page_size = 16;
  std::int64_t pages = 0;
  std::vector<std::int32_t> indptr{0}, indices, lens;

  /// Appends a request: `shared` page ids, then `own` fresh pages, `tokens` tokens.
  void add(const std::vector<std::int32_t>& shared, std::int64_t own, std::int64_t tokens) {
    indices.insert(indices.end(), shared.begin(), shared.end());
    for (std::int64_t i = 0; i < own; ++i) indices.push_back(static_cast<std::int32_t>(pages++));
    indptr.push_back(static_cast<std::int32_t>(indices.size()));
    lens.push_back(static_cast<std::int32_t>(tokens));
  }
  /// `n` fresh page ids (a shared run).
  std::vector<std::int32_t> run(std::int64_t n) {
    std::vector<std::int32_t> r;
    for (std::int64_t i = 0; i < n; ++i) r.push_back(static_cast<std::int32_t>(pages++));
    return r;
  }
  CascadeLevels levels() const {
    attnstate::PagedKvCache kv;
    kv.page_size = page_size;
    kv.num_pages = pages;
    kv.batch = static_cast<std::int64_t>(lens.size());
    kv.seq_lens = lens.data();
    kv.page_indptr = indptr.data();
    kv.page_indices = indices.empty() ? indptr.data() : indices.data();
    kv.space = attnstate::MemorySpace::kHost;
    return attnstate::build_cascade_levels(kv);
  }
};

/// `batch` requests sharing a `prefix`-token prompt (whole pages), each with its own `suffix`.
Table shared_prefix(std::int64_t batch, std::int64_t prefix, std::int64_t suffix) {
  Table t;
  const std::vector<std::int32_t> p = t.run(prefix / 16);
  for (std::int64_t b = 0; b < batch; ++b) t.add(p, (suffix + 15) / 16, prefix + suffix);
  return t;
}

/// The benchmark's heads: 32 query heads, 8 KV heads, head dim 128, bf16.
CascadeCostShape bench_shape() {
  CascadeCostShape s;
  s.heads_q = 32;
  s.heads_kv = 8;
  s.head_dim = 128;
  s.kv_dtype = DType::kBF16;
  return s;
}

TEST(CascadeDecision, BenchmarkShapesPickTheCascadeWithEstimatesBracketingTheRecordedTimes) {
  // bench_cascade's shapes with the times recorded in bench/RESULTS.md (commit dbdd026): the
  // cascade is chosen, its estimate is at least its measured time (the model is pessimistic for
  // the cascade) and the plain decode's estimate at most the decode's measured time.
  struct Row {
    std::int64_t prefix, suffix, batch;
    double cascade_us, decode_us;
  };
  const Row rows[] = {{4096, 64, 16, 23.4, 64.9},       {4096, 256, 128, 73.7, 476.9},
                      {32768, 64, 16, 58.0, 439.2},     {32768, 256, 64, 98.0, 1752.1},
                      {32768, 256, 128, 156.8, 3479.6}, {32768, 64, 256, 241.2, 6908.4},
                      {32768, 1024, 256, 464.8, 7111.5}};
  for (const Row& r : rows) {
    const CascadeDecision d =
        decide_cascade(shared_prefix(r.batch, r.prefix, r.suffix).levels(), bench_shape());
    const std::string at = std::to_string(r.prefix) + " x " + std::to_string(r.suffix) + " x " +
                           std::to_string(r.batch) + ": " + d.reason;
    EXPECT_TRUE(d.use_cascade) << at;
    EXPECT_EQ(d.shared_levels, 1) << at;
    EXPECT_GE(d.cascade_us, r.cascade_us) << at;
    EXPECT_LE(d.decode_us, r.decode_us) << at;
    EXPECT_LT(d.cascade_bytes, d.decode_bytes) << at;
    EXPECT_NE(d.reason.find("cascade with 1 shared level"), std::string::npos) << at;
  }
}

TEST(CascadeDecision, LittleOrNothingSharedPicksThePlainDecode) {
  // a short prompt under long suffixes, a long prompt shared by two requests, no sharing at all
  struct Case {
    std::int64_t batch, prefix, suffix;
  };
  for (const Case& c : {Case{8, 256, 2000}, Case{2, 32768, 100}, Case{64, 16, 4096}}) {
    const CascadeDecision d =
        decide_cascade(shared_prefix(c.batch, c.prefix, c.suffix).levels(), bench_shape());
    EXPECT_FALSE(d.use_cascade) << d.reason;
    EXPECT_EQ(d.shared_levels, 0) << d.reason;
    EXPECT_GT(d.cascade_us, d.decode_us) << d.reason;
    EXPECT_EQ(d.reason.rfind("plain decode: est", 0), 0u) << d.reason;
  }
  Table none;
  for (int b = 0; b < 5; ++b) none.add({}, 20, 300);
  const CascadeLevels lv = none.levels();
  ASSERT_EQ(lv.num_levels(), 1);
  const CascadeDecision d = decide_cascade(lv, bench_shape());
  EXPECT_FALSE(d.use_cascade);
  EXPECT_EQ(d.cascade_us, 0);
  EXPECT_EQ(d.reason.rfind("plain decode: nothing is shared", 0), 0u) << d.reason;
  EXPECT_EQ(d.cascade_bytes, 0);
  EXPECT_DOUBLE_EQ(d.decode_bytes, 5.0 * 300 * 2 * 8 * 128 * 2);
}

TEST(CascadeDecision, ADeepLevelThatSavesLessThanItCostsIsFoldedAway) {
  // a 32k prompt shared by 64 requests, under it pairs of requests sharing 32 more tokens: the
  // pairs' level saves 32 tokens per pair and costs a launch, so one shared level is kept
  Table t;
  const std::vector<std::int32_t> prompt = t.run(2048);
  for (int pair = 0; pair < 32; ++pair) {
    std::vector<std::int32_t> p = prompt;
    const std::vector<std::int32_t> block = t.run(2);
    p.insert(p.end(), block.begin(), block.end());
    for (int i = 0; i < 2; ++i) t.add(p, 4, 32768 + 32 + 64);
  }
  const CascadeLevels lv = t.levels();
  ASSERT_EQ(lv.num_levels(), 3);
  const CascadeDecision d = decide_cascade(lv, bench_shape());
  EXPECT_TRUE(d.use_cascade) << d.reason;
  EXPECT_EQ(d.shared_levels, 1) << d.reason;
  // blocks of 8k tokens shared by groups of 16 pay for their level: both are kept
  Table deep;
  const std::vector<std::int32_t> sys = deep.run(256);
  for (int g = 0; g < 4; ++g) {
    std::vector<std::int32_t> p = sys;
    const std::vector<std::int32_t> block = deep.run(512);
    p.insert(p.end(), block.begin(), block.end());
    for (int i = 0; i < 16; ++i) deep.add(p, 8, 4096 + 8192 + 128);
  }
  const CascadeDecision dd = decide_cascade(deep.levels(), bench_shape());
  EXPECT_TRUE(dd.use_cascade) << dd.reason;
  EXPECT_EQ(dd.shared_levels, 2) << dd.reason;
  EXPECT_NE(dd.reason.find("2 shared levels"), std::string::npos) << dd.reason;
}

TEST(CascadeDecision, MoreRequestsOnTheSamePromptNeverTurnTheCascadeOff) {
  for (std::int64_t prefix : {1024, 8192, 65536}) {
    bool on = false;
    for (std::int64_t batch = 1; batch <= 96; ++batch) {
      const CascadeDecision d =
          decide_cascade(shared_prefix(batch, prefix, 512).levels(), bench_shape());
      if (on) {
        EXPECT_TRUE(d.use_cascade) << prefix << " x " << batch << ": " << d.reason;
      }
      on = on || d.use_cascade;
    }
    EXPECT_TRUE(on) << "prefix " << prefix << " never chose the cascade";
  }
}

TEST(CascadeDecision, SameInputsSameDecisionAndTheModelIsRead) {
  const CascadeLevels lv = shared_prefix(16, 4096, 256).levels();
  const CascadeDecision a = decide_cascade(lv, bench_shape());
  const CascadeDecision b = decide_cascade(lv, bench_shape());
  EXPECT_EQ(a.use_cascade, b.use_cascade);
  EXPECT_EQ(a.cascade_us, b.cascade_us);
  EXPECT_EQ(a.reason, b.reason);
  // a device with ten times the fixed costs per level: the same batch runs the plain decode
  CascadeCostModel slow;
  slow.level_fixed_us = 500;
  const CascadeDecision c = decide_cascade(lv, bench_shape(), slow);
  EXPECT_TRUE(a.use_cascade);
  EXPECT_FALSE(c.use_cascade) << c.reason;
  // fp8 pools read half the bytes of bf16 ones
  CascadeCostShape fp8 = bench_shape();
  fp8.kv_dtype = DType::kE4M3;
  EXPECT_DOUBLE_EQ(decide_cascade(lv, fp8).decode_bytes * 2, a.decode_bytes);
}

TEST(CascadeDecision, BadArgumentsAreNamed) {
  const CascadeLevels lv = shared_prefix(4, 256, 16).levels();
  auto expect = [&](const CascadeCostShape& s, const CascadeCostModel& m, const char* name) {
    try {
      decide_cascade(lv, s, m);
      ADD_FAILURE() << "no error for " << name;
    } catch (const attnstate::Error& e) {
      EXPECT_EQ(e.status(), attnstate::Status::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("'") + name + "'"), std::string::npos)
          << e.what();
    }
  };
  CascadeCostShape s = bench_shape();
  s.q_len = 0;
  expect(s, {}, "shape.q_len");
  s.q_len = 9;
  expect(s, {}, "shape.q_len");
  s = bench_shape();
  s.heads_q = 12;
  expect(s, {}, "shape.heads_q");
  s = bench_shape();
  s.heads_kv = 0;
  expect(s, {}, "shape.heads_kv");
  s = bench_shape();
  s.head_dim = -1;
  expect(s, {}, "shape.head_dim");
  s = bench_shape();
  s.kv_dtype = static_cast<DType>(9);
  expect(s, {}, "shape.kv_dtype");
  CascadeCostModel m;
  m.copy_gbps = 0;
  expect(bench_shape(), m, "model.copy_gbps");
  m = CascadeCostModel{};
  m.level_flop_efficiency = std::nan("");
  expect(bench_shape(), m, "model.level_flop_efficiency");
  m = CascadeCostModel{};
  m.margin = 1.5;
  expect(bench_shape(), m, "model.margin");
}

}  // namespace
