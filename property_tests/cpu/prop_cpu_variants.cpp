/// @file prop_cpu_variants.cpp
/// @brief RapidCheck properties of the CPU decode and cascade with a sliding window and a soft
///        cap (≥ 500 cases each): on random paged problems, split layouts and level structures,
///        each equals the kit's double reference of every row over the keys of its window; and
///        a decode's result does not depend on the split layout, windows included.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attnstate/core/variant.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"
#include "attnstate/testing/rapidcheck_support.hpp"
#include "cascade_case.hpp"
#include "cascade_gen.hpp"
#include "decode_problem.hpp"
#include "rc_defaults.hpp"
#include "variant_reference.hpp"

ATTNSTATE_RC_DEFAULT_PARAMS("max_success=500");

namespace {

using namespace attnstate;       // NOLINT(google-build-using-namespace): test file
using namespace attnstate_test;  // NOLINT(google-build-using-namespace): test file

/// A random variant for keys up to `max_len`: no window, 0, a few keys, up to and beyond the
/// longest request; no cap or a cap of 5, 30 or 50.
AttentionVariant random_variant(int max_len) {
  AttentionVariant v;
  switch (*rc::gen::inRange(0, 5)) {
    case 1:
      v.window_left = 0;
      break;
    case 2:
      v.window_left = *rc::gen::inRange(1, 9);
      break;
    case 3:
      v.window_left = *rc::gen::inRange(0, max_len + 1);
      break;
    case 4:
      v.window_left = max_len + *rc::gen::inRange(1, 100);
      break;
    default:
      break;
  }
  v.logits_soft_cap = *rc::gen::element(0.f, 5.f, 30.f, 50.f);
  return v;
}

DecodeProblemHost random_decode_problem() {
  DecodeConfig cfg;
  cfg.q_len = *rc::gen::inRange<std::int64_t>(1, 5);
  cfg.heads_kv = *rc::gen::inRange<std::int64_t>(1, 3);
  cfg.heads_q = cfg.heads_kv * *rc::gen::inRange<std::int64_t>(1, 5);
  cfg.head_dim = *rc::gen::element<std::int64_t>(4, 8, 16, 24);
  cfg.page_size = *rc::gen::element<std::int64_t>(1, 3, 16, 32);
  cfg.layout = *rc::gen::element(KvLayout::kNHD, KvLayout::kHND);
  cfg.block_table = *rc::gen::arbitrary<bool>();
  cfg.q_dtype = *rc::gen::element(DType::kF32, DType::kF16, DType::kBF16);
  cfg.kv_dtype = *rc::gen::element(DType::kF32, DType::kF16, DType::kBF16);
  cfg.q_gain = *rc::gen::element(1.f, 8.f, 40.f);
  const int batch = *rc::gen::inRange(1, 5);
  for (int b = 0; b < batch; ++b) cfg.seq_lens.push_back(*rc::gen::inRange(0, 200));
  return make_decode_problem(cfg, *rc::gen::arbitrary<std::uint32_t>());
}

/// A random split layout for lengths below 200 (count or size), or none: the options' kAuto.
struct RandomSplits {
  bool use_layout = false;
  SplitLayout layout;
};
RandomSplits random_splits() {
  RandomSplits r;
  const int kind = *rc::gen::inRange(0, 3);
  if (kind == 0) return r;  // kAuto through DecodeOptions
  r.use_layout = true;
  if (kind == 1) {
    r.layout.policy = SplitPolicy::kFixedCount;
    r.layout.num_splits = r.layout.max_splits = *rc::gen::inRange(1, 12);
  } else {
    r.layout.policy = SplitPolicy::kFixedSize;
    r.layout.split_size = kSplitGranularity * *rc::gen::inRange(1, 6);
    r.layout.max_splits = (200 + r.layout.split_size - 1) / r.layout.split_size;
  }
  return r;
}

HostState run_decode(const DecodeProblemHost& p, const RandomSplits& s, const AttentionVariant& v,
                     float scale) {
  HostState out(p.tokens(), p.cfg.heads_q, p.cfg.head_dim, DType::kF32, LseBase::kNatural);
  if (s.use_layout) {
    cpu::decode(p.q_view(), p.kv_view(), s.layout, scale, v, out.view);
  } else {
    DecodeOptions o;
    o.scale = scale;
    o.variant = v;
    cpu::decode(p.q_view(), p.kv_view(), o, out.view);
  }
  return out;
}

double o_tolerance(const DecodeProblemHost& p) {
  return p.cfg.q_gain > 1.f ? 1e-4 * p.cfg.q_gain : 5e-5;
}

RC_GTEST_PROP(VariantProps, DecodeEqualsTheReferenceOverEachWindow, ()) {
  const DecodeProblemHost p = random_decode_problem();
  const RandomSplits s = random_splits();
  const AttentionVariant v = random_variant(200);
  RC_TAG(v.window_left == kNoWindow ? "no window" : "window");
  const float scale = 1.f / std::sqrt(static_cast<float>(p.cfg.head_dim));
  const HostState got = run_decode(p, s, v, scale);
  const std::string mismatch =
      compare_decode(decode_reference(p, scale, v), got.o.data(), DType::kF32, got.lse.data(),
                     LseBase::kNatural, decode_tolerance(o_tolerance(p), 1e-5));
  RC_ASSERT(mismatch.empty());
}

RC_GTEST_PROP(VariantProps, DecodeSplitsChangeOnlyRounding, ()) {
  const DecodeProblemHost p = random_decode_problem();
  const RandomSplits s = random_splits();
  const AttentionVariant v = random_variant(200);
  RandomSplits one;
  one.use_layout = true;
  one.layout.policy = SplitPolicy::kFixedCount;
  one.layout.num_splits = one.layout.max_splits = 1;
  const float scale = 1.f / std::sqrt(static_cast<float>(p.cfg.head_dim));
  const HostState a = run_decode(p, s, v, scale);
  const HostState b = run_decode(p, one, v, scale);
  const double tol_o = p.cfg.q_gain > 1.f ? 2e-5 * p.cfg.q_gain : 1e-5;
  RC_ASSERT(max_abs_diff(a.o.data(), b.o.data(), DType::kF32,
                         p.tokens() * p.cfg.heads_q * p.cfg.head_dim) <= tol_o);
  for (std::size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(b.lse[i])) {
      RC_ASSERT(a.lse[i] == b.lse[i]);  // rows that see no key are empty whatever the splits
    } else {
      RC_ASSERT(std::fabs(a.lse[i] - b.lse[i]) <= 1e-5 * std::max(1.f, std::fabs(b.lse[i])));
    }
  }
}

RC_GTEST_PROP(VariantProps, CascadeEqualsTheReferenceOverEachWindow, ()) {
  const CaseSpec spec = *gen_case_spec(/*max_batch=*/5, /*max_len=*/70);
  const CascadeCase c(spec);
  const AttentionVariant v = random_variant(3 * 70);
  const DType out_dt = *rc::gen::element(DType::kF32, DType::kF16, DType::kBF16);
  HostState out(c.tokens(), spec.heads_q, spec.head_dim, out_dt, LseBase::kBase2);
  CascadeOptions o = c.options();
  o.variant = v;
  const auto levels = c.host_levels();
  cpu::cascade_attention(c.query(c.q_raw.data(), MemorySpace::kHost),
                         c.pool(c.k_raw.data(), c.v_raw.data(), MemorySpace::kHost), levels.data(),
                         static_cast<int>(levels.size()), o, out.view);
  double tol = 5e-5 * spec.q_amp;
  if (out_dt == DType::kBF16) tol += 4e-3;
  if (out_dt == DType::kF16) tol += 5e-4;
  const std::string mismatch =
      compare_decode(cascade_reference(c, v), out.o.data(), out_dt, out.lse.data(), LseBase::kBase2,
                     decode_tolerance(tol, 2e-4));
  RC_ASSERT(mismatch.empty());
}

}  // namespace
