/// @file prop_plan_decode.cpp
/// @brief RapidCheck properties of the automatic split layout (src/plan/decode_plan.hpp) over
///        random length vectors (≥ 200 cases each): the layout serves every request (its splits
///        within the grid, covering its keys in order, at most `kMaxSplits`), and the CPU decode
///        with it gives the state of one split, to rounding. No CUDA, no GPU.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnstate/cpu/decode.hpp"
#include "attnstate/testing/rapidcheck_support.hpp"
#include "decode_problem.hpp"
#include "plan/decode_plan.hpp"
#include "rc_defaults.hpp"

ATTNSTATE_RC_DEFAULT_PARAMS("max_success=200");

namespace {

using namespace attnstate;
using namespace attnstate_test;

/// Facts of an sm_90-like device (the planner's inputs besides the problem).
plan::DecodeFacts facts() {
  plan::DecodeFacts f = plan::decode_kernel_facts(128, 2);
  f.ctas_per_sm = 2;
  for (auto& row : f.resident_clusters)
    for (int c = 2; c <= plan::kMaxCluster; ++c) row[c] = 64;
  return f;
}

/// Random lengths: empty, one token, short, at split edges, long, and a mix with one request far
/// longer than the rest.
std::vector<std::int32_t> random_lengths(int batch, std::int32_t max_len) {
  std::vector<std::int32_t> lens;
  for (int b = 0; b < batch; ++b) {
    switch (*rc::gen::inRange(0, 5)) {
      case 0:
        lens.push_back(*rc::gen::element<std::int32_t>(0, 1, 15, 16, 17));
        break;
      case 1:
        lens.push_back(16 * *rc::gen::inRange(1, 1 + max_len / 16) +
                       *rc::gen::element<std::int32_t>(-1, 0, 1));
        break;
      case 2:
        lens.push_back(*rc::gen::inRange<std::int32_t>(0, max_len / 8 + 1));
        break;
      default:
        lens.push_back(*rc::gen::inRange<std::int32_t>(0, max_len + 1));
    }
    lens.back() = std::clamp<std::int32_t>(lens.back(), 0, max_len);
  }
  return lens;
}

DecodeProblem problem_of(const DecodeConfig& c, std::int64_t batch) {
  DecodeProblem p;
  p.batch = batch;
  p.q_len = c.q_len;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.head_dim = 128;  // the planner's shape; the CPU runs the problem's own head_dim
  return p;
}

// The automatic layout of any length vector serves every request: fixed-size splits (a
// multiple of 16 tokens), at most kMaxSplits, each request's splits within the grid and
// covering its keys [0, len) in order, without empty splits before its last.
RC_GTEST_PROP(PlanDecodeProps, AutomaticLayoutServesEveryRequest, ()) {
  const int batch = *rc::gen::inRange(1, 300);
  const std::int32_t max_len = *rc::gen::element<std::int32_t>(64, 4096, 70000, 2000000);
  const std::vector<std::int32_t> lens = random_lengths(batch, max_len);
  DecodeConfig cfg;
  cfg.heads_kv = *rc::gen::element<std::int64_t>(1, 2, 8);
  cfg.heads_q = cfg.heads_kv * *rc::gen::element<std::int64_t>(1, 4, 8, 16);
  cfg.q_len = *rc::gen::inRange<std::int64_t>(1, 4);
  const DecodeProblem p = problem_of(cfg, batch);
  const std::int64_t slots = *rc::gen::element<std::int64_t>(1, 8, 132, 264, 528);
  const plan::DecodeFacts f = facts();
  const int row_tiles = plan::decode_row_tiles(p, f.tile_rows);
  const SplitLayout l =
      plan::auto_layout("prop", p, lens.data(), DecodeOptions{}, slots, row_tiles, f);
  RC_ASSERT(l.policy == SplitPolicy::kFixedSize);
  RC_ASSERT(l.split_size > 0 && l.split_size % kSplitGranularity == 0);
  RC_ASSERT(l.max_splits >= 1 && l.max_splits <= kMaxSplits);
  for (std::int32_t len : lens) {
    const std::int32_t n = l.splits_for(len);
    RC_ASSERT(n >= 1 && n <= l.max_splits);
    std::int32_t next = 0;
    for (std::int32_t s = 0; s < n; ++s) {
      const TokenRange r = l.range(len, s);
      RC_ASSERT(r.begin == next);
      RC_ASSERT(r.end > r.begin || len == 0);
      next = r.end;
    }
    RC_ASSERT(next == len);
  }
}

// The CPU decode with the automatic layout of a random ragged batch gives the state of a
// single split (to rounding), and both match the double-precision reference.
RC_GTEST_PROP(PlanDecodeProps, AutomaticLayoutEqualsOneSplit, ()) {
  const int batch = *rc::gen::inRange(1, 7);
  DecodeConfig cfg;
  cfg.q_len = *rc::gen::inRange<std::int64_t>(1, 3);
  cfg.heads_kv = *rc::gen::inRange<std::int64_t>(1, 3);
  cfg.heads_q = cfg.heads_kv * *rc::gen::inRange<std::int64_t>(1, 3);
  cfg.head_dim = 8;
  cfg.page_size = *rc::gen::element<std::int64_t>(1, 16, 64);
  cfg.seq_lens = random_lengths(batch, *rc::gen::element<std::int32_t>(200, 3000));
  const DecodeProblemHost prob = make_decode_problem(cfg, *rc::gen::arbitrary<std::uint32_t>());
  const DecodeProblem p = problem_of(cfg, batch);
  const std::int64_t slots = *rc::gen::element<std::int64_t>(2, 16, 264);
  const plan::DecodeFacts f = facts();
  const SplitLayout l = plan::auto_layout("prop", p, cfg.seq_lens.data(), DecodeOptions{}, slots,
                                          plan::decode_row_tiles(p, f.tile_rows), f);
  SplitLayout one;
  one.num_splits = 1;
  one.max_splits = 1;
  const float scale = 1.f / std::sqrt(static_cast<float>(cfg.head_dim));
  HostState a(prob.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  HostState b(prob.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  cpu::decode(prob.q_view(), prob.kv_view(), l, scale, a.view);
  cpu::decode(prob.q_view(), prob.kv_view(), one, scale, b.view);
  const auto ref = reference_decode(prob, scale);
  const auto tol = decode_tolerance(5e-5, 1e-5);
  RC_ASSERT(
      compare_decode(ref, a.o.data(), DType::kF32, a.lse.data(), LseBase::kNatural, tol).empty());
  RC_ASSERT(
      compare_decode(ref, b.o.data(), DType::kF32, b.lse.data(), LseBase::kNatural, tol).empty());
  for (std::size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(b.lse[i])) {
      RC_ASSERT(a.lse[i] == b.lse[i]);
    } else {
      RC_ASSERT(std::fabs(a.lse[i] - b.lse[i]) <= 1e-5f * std::max(1.f, std::fabs(b.lse[i])));
    }
  }
}

}  // namespace
