/// @file prop_cpu_decode.cpp
/// @brief RapidCheck properties of the CPU split-KV decode (≥ 500 cases each): on random paged
///        problems it equals the one-pass state `cpu::attention_state` of each row's keys,
///        splitting anywhere (any count, any size) equals not splitting, to rounding, and over
///        random fp8 caches it equals the reference over the dequantised cache.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/decode.hpp"
#include "attnstate/testing/rapidcheck_support.hpp"
#include "decode_problem.hpp"
#include "rc_defaults.hpp"
#include "split_layout_gen.hpp"

ATTNSTATE_RC_DEFAULT_PARAMS("max_success=500");

namespace {

using namespace attnstate;
using namespace attnstate_test;

/// A random small problem (any head_dim works on the CPU).
DecodeProblemHost random_problem() {
  DecodeConfig cfg;
  cfg.q_len = *rc::gen::inRange<std::int64_t>(1, 5);
  cfg.heads_kv = *rc::gen::inRange<std::int64_t>(1, 3);
  cfg.heads_q = cfg.heads_kv * *rc::gen::inRange<std::int64_t>(1, 5);
  cfg.head_dim = *rc::gen::element<std::int64_t>(4, 8, 16, 24);
  cfg.page_size = *rc::gen::element<std::int64_t>(1, 3, 16, 32);
  cfg.layout = *rc::gen::element(KvLayout::kNHD, KvLayout::kHND);
  cfg.block_table = *rc::gen::arbitrary<bool>();
  cfg.q_dtype = *rc::gen::element(DType::kF32, DType::kBF16);
  cfg.kv_dtype = *rc::gen::element(DType::kF32, DType::kF16);
  cfg.q_gain = *rc::gen::element(1.f, 8.f, 40.f);
  const int batch = *rc::gen::inRange(1, 4);
  for (int b = 0; b < batch; ++b) cfg.seq_lens.push_back(*rc::gen::inRange(0, 150));
  return make_decode_problem(cfg, *rc::gen::arbitrary<std::uint32_t>());
}

HostState run(const DecodeProblemHost& p, const SplitLayout& l, float scale) {
  HostState out(p.tokens(), p.cfg.heads_q, p.cfg.head_dim, DType::kF32, LseBase::kNatural);
  cpu::decode(p.q_view(), p.kv_view(), l, scale, out.view);
  return out;
}

float f32_at(const HostState& s, std::size_t i) {
  float x;
  std::memcpy(&x, s.o.data() + 4 * i, 4);
  return x;
}

/// Fails the case unless `got` (f32, natural) matches the double-precision reference decode of
/// `p` (a NaN, e.g. an unwritten element, counts as an infinite error).
void assert_matches_reference(const DecodeProblemHost& p, const HostState& got, float scale) {
  const double tol_o = p.cfg.q_gain > 1.f ? 1e-4 * p.cfg.q_gain : 5e-5;
  const std::string mismatch =
      compare_decode(reference_decode(p, scale), got.o.data(), DType::kF32, got.lse.data(),
                     LseBase::kNatural, decode_tolerance(tol_o, 1e-5));
  RC_ASSERT(mismatch.empty());
}

// Decode of a random paged problem equals, row by row, the one-pass state of the keys that row
// sees (gathered into a contiguous segment).
RC_GTEST_PROP(DecodeProps, EqualsOnePassAttentionState, ()) {
  const DecodeProblemHost p = random_problem();
  const SplitLayout l = attnstate_test::random_split_layout(150);
  const auto& c = p.cfg;
  const float scale = 1.f / std::sqrt(static_cast<float>(c.head_dim));
  const HostState got = run(p, l, scale);
  // The decode also against the double-precision reference (cpu::attention_state below is a
  // second producer, not the reference).
  assert_matches_reference(p, got, scale);
  const double tol_o = c.q_gain > 1.f ? 1e-4 * c.q_gain : 5e-5;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t qi = 0; qi < c.q_len; ++qi) {
      const std::int64_t n = std::max<std::int64_t>(0, p.seq_lens[b] - c.q_len + qi + 1);
      std::vector<float> k(std::max<std::int64_t>(1, n * c.heads_kv * c.head_dim));
      std::vector<float> v(k.size());
      for (std::int64_t t = 0; t < n; ++t)
        for (std::int64_t h = 0; h < c.heads_kv; ++h)
          for (std::int64_t d = 0; d < c.head_dim; ++d) {
            const std::int64_t src = p.kv_offset(b, t, h) + d;
            k[(t * c.heads_kv + h) * c.head_dim + d] =
                static_cast<float>(get(p.k.data(), c.kv_dtype, src));
            v[(t * c.heads_kv + h) * c.head_dim + d] =
                static_cast<float>(get(p.v.data(), c.kv_dtype, src));
          }
      const std::int64_t token = b * c.q_len + qi;
      const std::int64_t qrow = c.heads_q * c.head_dim;
      const ConstTensorView qv = make_tensor_view(p.q.data() + token * qrow * size_of(c.q_dtype),
                                                  c.q_dtype, {1, c.heads_q, c.head_dim});
      const ConstTensorView kv =
          make_tensor_view(k.data(), DType::kF32, {n, c.heads_kv, c.head_dim});
      const ConstTensorView vv =
          make_tensor_view(v.data(), DType::kF32, {n, c.heads_kv, c.head_dim});
      HostState one(1, c.heads_q, c.head_dim, DType::kF32, LseBase::kNatural);
      cpu::attention_state(qv, kv, vv, scale, one.view);
      for (std::int64_t h = 0; h < c.heads_q; ++h) {
        const float la = got.lse[token * c.heads_q + h];
        const float lb = one.lse[h];
        if (std::isinf(lb)) {
          RC_ASSERT(std::isinf(la) && la < 0);
        } else {
          RC_ASSERT(std::fabs(la - lb) <= 1e-5 * std::max(1.f, std::fabs(lb)));
        }
        for (std::int64_t d = 0; d < c.head_dim; ++d) {
          const float a = f32_at(got, (token * c.heads_q + h) * c.head_dim + d);
          const float e = f32_at(one, h * c.head_dim + d);
          RC_ASSERT(std::fabs(a - e) <= tol_o);
        }
      }
    }
}

// Any split layout gives the same states as a single split, to rounding.
RC_GTEST_PROP(DecodeProps, SplittingAnywhereEqualsNotSplitting, ()) {
  const DecodeProblemHost p = random_problem();
  const SplitLayout l = attnstate_test::random_split_layout(150);
  SplitLayout one;
  one.policy = SplitPolicy::kFixedCount;
  one.num_splits = 1;
  one.max_splits = 1;
  const float scale = 1.f / std::sqrt(static_cast<float>(p.cfg.head_dim));
  const HostState a = run(p, l, scale);
  const HostState b = run(p, one, scale);
  // Both against the reference: two runs compared only with each other could share an error.
  assert_matches_reference(p, a, scale);
  assert_matches_reference(p, b, scale);
  const double tol_o = p.cfg.q_gain > 1.f ? 2e-5 * p.cfg.q_gain : 1e-5;
  for (std::size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(b.lse[i])) {
      RC_ASSERT(a.lse[i] == b.lse[i]);
    } else {
      RC_ASSERT(std::fabs(a.lse[i] - b.lse[i]) <= 1e-5 * std::max(1.f, std::fabs(b.lse[i])));
    }
  }
  for (std::size_t i = 0; i < a.o.size() / 4; ++i)
    RC_ASSERT(std::fabs(f32_at(a, i) - f32_at(b, i)) <= tol_o);
}

/// A random small problem over an fp8 cache: e4m3 or e5m2, its scales (1, 2^-10, 2^8 or 0.37
/// for K and for V) given as a host value, a pointer or per KV head, stored values near 1 or
/// near the format's largest, queries scaled to the real keys.
DecodeProblemHost random_fp8_problem() {
  DecodeProblemHost base = random_problem();
  DecodeConfig cfg = base.cfg;
  cfg.kv_dtype = *rc::gen::element(DType::kE4M3, DType::kE5M2);
  cfg.scale_kind =
      *rc::gen::element(KvScaleKind::kValue, KvScaleKind::kPointer, KvScaleKind::kPerHead);
  const std::size_t n = cfg.scale_kind == KvScaleKind::kPerHead ? cfg.heads_kv : 1;
  const auto scale = rc::gen::element(1.f, 0x1p-10f, 0x1p8f, 0.37f);
  cfg.k_scales = *rc::gen::container<std::vector<float>>(n, scale);
  cfg.v_scales = *rc::gen::container<std::vector<float>>(n, scale);
  cfg.kv_amp = *rc::gen::element(1.f, cfg.kv_dtype == DType::kE4M3 ? 224.f : 28672.f);
  const float k_max = cfg.kv_amp * *std::max_element(cfg.k_scales.begin(), cfg.k_scales.end());
  cfg.q_gain = std::min(256.f, *rc::gen::element(1.f, 8.f) / k_max);
  cfg.q_dtype = *rc::gen::element(DType::kF32, DType::kBF16);
  return make_decode_problem(cfg, *rc::gen::arbitrary<std::uint32_t>());
}

// Decode over a random fp8 cache equals the double-precision reference over the dequantised cache
// (stored × scale of the KV head) within the kit's tolerance for fp32 probabilities, for any
// split layout.
RC_GTEST_PROP(DecodeProps, Fp8CacheMatchesTheDequantisedReference, ()) {
  const DecodeProblemHost p = random_fp8_problem();
  const SplitLayout l = attnstate_test::random_split_layout(150);
  const float scale = 1.f / std::sqrt(static_cast<float>(p.cfg.head_dim));
  const HostState got = run(p, l, scale);
  const attnstate::testing::AttentionProblem problem = decode_as_problem(p, scale);
  const std::string mismatch = compare_decode(
      attnstate::testing::reference_state_per_token(problem, decode_keys(p), LseBase::kNatural),
      got.o.data(), DType::kF32, got.lse.data(), LseBase::kNatural,
      attnstate::testing::tolerance_for(problem, false));
  RC_ASSERT(mismatch.empty());
}

}  // namespace
