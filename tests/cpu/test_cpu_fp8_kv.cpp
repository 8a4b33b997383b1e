/// @file test_cpu_fp8_kv.cpp
/// @brief CPU decode and cascade over fp8 KV caches (e4m3, e5m2) against the testing kit's double
///        reference over the dequantised cache (`stored × scale`), within the kit's tolerance:
///        both formats, the three kinds of scale (a host value, a pointer to one scale, per KV
///        head), scales 1, 2^-10, 2^8 and 0.37, stored values near 1 and near the format's
///        largest, every finite encoding, split policies × page sizes × layouts × ragged lengths
///        together, NaN encodings propagating, a pointed-to scale read at each call; the outputs
///        poisoned first. A wrong scale must fail the same comparison.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"
#include "cascade_case.hpp"
#include "decode_problem.hpp"

namespace {

using namespace attnstate;
using namespace attnstate_test;
namespace kit = attnstate::testing;

constexpr DType kFormats[] = {DType::kE4M3, DType::kE5M2};
constexpr KvScaleKind kKinds[] = {KvScaleKind::kValue, KvScaleKind::kPointer,
                                  KvScaleKind::kPerHead};

float fp8_max(DType f) { return f == DType::kE4M3 ? 448.f : 57344.f; }

bool is_nan_code(DType f, std::uint8_t b) {
  return f == DType::kE4M3 ? (b & 0x7F) == 0x7F : (b & 0x7F) > 0x7C;
}
bool is_inf_code(DType f, std::uint8_t b) { return f == DType::kE5M2 && (b & 0x7F) == 0x7C; }

/// One scale per tensor (kValue, kPointer) or the per-head scales `s, s/8, 4s, ...`: a spread of
/// powers of two around `s`, and `s` itself first.
std::vector<float> scales_for(KvScaleKind kind, float s, std::int64_t heads) {
  if (kind != KvScaleKind::kPerHead) return {s};
  const float f[] = {1.f, 0.125f, 4.f, 0.5f};
  std::vector<float> out;
  for (std::int64_t h = 0; h < heads; ++h) out.push_back(s * f[h % 4]);
  return out;
}

float largest(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, x);
  return m;
}

/// The softmax scale of every case.
float softmax_scale(const DecodeProblemHost& p) {
  return 1.f / std::sqrt(static_cast<float>(p.cfg.head_dim));
}

/// The kit's problem of `p`'s decode, requesting `out_dtype` and `base`.
kit::AttentionProblem as_problem(const DecodeProblemHost& p, DType out_dtype, LseBase base) {
  kit::AttentionProblem prob = decode_as_problem(p, softmax_scale(p));
  prob.out_dtype = out_dtype;
  prob.base = base;
  return prob;
}

/// Runs `cpu::decode` of `p` (its own cache view, or `kv`) with `options` and compares it with the
/// kit's reference over the problem `ref` (default: `p`'s own) within the kit's tolerance for a
/// kernel with fp32 probabilities: "" when it matches.
std::string run_decode(const DecodeProblemHost& p, DecodeOptions options, DType out_dtype,
                       LseBase base, const PagedKvCache* kv = nullptr,
                       const DecodeProblemHost* ref = nullptr) {
  options.scale = softmax_scale(p);
  HostState out(p.tokens(), p.cfg.heads_q, p.cfg.head_dim, out_dtype, base);
  cpu::decode(p.q_view(), kv != nullptr ? *kv : p.kv_view(), options, out.view);
  const DecodeProblemHost& r = ref != nullptr ? *ref : p;
  const kit::AttentionProblem prob = as_problem(r, out_dtype, base);
  return compare_decode(kit::reference_state_per_token(prob, decode_keys(r), base), out.o.data(),
                        out_dtype, out.lse.data(), base, kit::tolerance_for(prob, false));
}

DecodeOptions policy(int which) {
  DecodeOptions o;
  if (which == 0) {
    o.policy = SplitPolicy::kFixedSize;
    o.split_size = 16;
  } else if (which == 1) {
    o.policy = SplitPolicy::kFixedCount;
    o.num_splits = 3;
  }
  return o;  // 2: kAuto
}

/// A ragged fp8 decode configuration: 5 requests (0, 1, 17, 64 and 200 keys), 8 query heads on
/// 2 KV heads, head_dim 64; the page size, layout, table and q_len rotate with `i`.
DecodeConfig fp8_config(DType fmt, KvScaleKind kind, float scale, float amp, int i) {
  const std::int64_t pages[] = {1, 5, 16};
  DecodeConfig c =
      shape_config(i % 2 == 0 ? 1 : 3, 8, 2, 64, pages[i % 3],
                   i % 2 == 0 ? KvLayout::kNHD : KvLayout::kHND, i % 4 >= 2, DType::kBF16, fmt);
  c.seq_lens = {0, 1, 17, 64, 200};
  c.kv_amp = amp;
  c.scale_kind = kind;
  c.k_scales = scales_for(kind, scale, c.heads_kv);
  c.v_scales = scales_for(kind, scale * 2.f, c.heads_kv);
  // scores of magnitude about 1 whatever the real keys' range (f16 queries where that is an
  // f16 normal value)
  c.q_gain = std::min(256.f, 1.f / (amp * largest(c.k_scales)));
  const DType q_dtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  c.q_dtype = q_dtypes[i % 3];
  return c;
}

TEST(Fp8KvDecode, MatchesTheDequantisedReferenceAcrossScalesSplitsPagesAndRaggedLengths) {
  const float scales[] = {1.f, 0x1p-10f, 0x1p8f, 0.37f};
  int i = 0;
  for (DType fmt : kFormats)
    for (KvScaleKind kind : kKinds)
      for (float s : scales)
        for (float amp : {1.f, fp8_max(fmt) / 2}) {
          const DecodeConfig cfg = fp8_config(fmt, kind, s, amp, i);
          const DecodeProblemHost p = make_decode_problem(cfg, 1000 + i);
          ++i;
          const double v_real = amp * largest(cfg.v_scales);
          for (int pol = 0; pol < 3; ++pol)
            for (DType od : {DType::kF32, DType::kBF16, DType::kF16}) {
              if (od == DType::kF16 && v_real > 65504) continue;  // o past f16's range
              const LseBase base = pol == 1 ? LseBase::kBase2 : LseBase::kNatural;
              EXPECT_EQ(run_decode(p, policy(pol), od, base), "")
                  << cfg.name() << " policy " << pol << " out " << to_string(od);
            }
        }
}

TEST(Fp8KvDecode, AWrongScaleFailsTheComparison) {
  // The comparison the other tests rely on sees a scale that is off by a factor 2, applied to
  // the wrong KV head, or left out.
  for (DType fmt : kFormats) {
    const DecodeConfig cfg = fp8_config(fmt, KvScaleKind::kPerHead, 0x1p-3f, 1.f, 0);
    const DecodeProblemHost p = make_decode_problem(cfg, 7);
    ASSERT_EQ(run_decode(p, policy(0), DType::kF32, LseBase::kNatural), "");
    DecodeProblemHost twice = p;
    twice.cfg.v_scales[1] *= 2.f;
    EXPECT_NE(run_decode(p, policy(0), DType::kF32, LseBase::kNatural, nullptr, &twice), "");
    DecodeProblemHost swapped = p;
    std::swap(swapped.cfg.k_scales[0], swapped.cfg.k_scales[1]);
    EXPECT_NE(run_decode(p, policy(0), DType::kF32, LseBase::kNatural, nullptr, &swapped), "");
    PagedKvCache unscaled = p.kv_view();
    unscaled.k_scale = KvScale{};
    unscaled.v_scale = KvScale{};
    EXPECT_NE(run_decode(p, policy(0), DType::kF32, LseBase::kNatural, &unscaled), "");
  }
}

/// Overwrites every element of every request's keys with a random finite encoding of `fmt` (the
/// whole range: the largest, normals, subnormals, ±0), NaN and infinite codes skipped.
void fill_with_every_encoding(DecodeProblemHost& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const DType fmt = p.cfg.kv_dtype;
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t t = 0; t < p.seq_lens[b]; ++t)
      for (std::int64_t h = 0; h < p.cfg.heads_kv; ++h)
        for (std::int64_t d = 0; d < p.cfg.head_dim; ++d)
          for (std::vector<unsigned char>* pool : {&p.k, &p.v}) {
            std::uint8_t code;
            do {
              code = static_cast<std::uint8_t>(rng() & 0xFF);
            } while (is_nan_code(fmt, code) || is_inf_code(fmt, code));
            (*pool)[static_cast<std::size_t>(p.kv_offset(b, t, h) + d)] = code;
          }
  // the extremes themselves, in key 0 of the last request: largest, smallest normal, smallest
  // subnormal, zero, each with both signs
  const std::uint8_t extremes_e4m3[] = {0x7E, 0xFE, 0x08, 0x88, 0x01, 0x81, 0x00, 0x80};
  const std::uint8_t extremes_e5m2[] = {0x7B, 0xFB, 0x04, 0x84, 0x01, 0x81, 0x00, 0x80};
  const std::uint8_t* ext = fmt == DType::kE4M3 ? extremes_e4m3 : extremes_e5m2;
  for (int j = 0; j < 8; ++j) {
    p.k[static_cast<std::size_t>(p.kv_offset(p.batch - 1, 0, 0) + j)] = ext[j];
    p.v[static_cast<std::size_t>(p.kv_offset(p.batch - 1, 0, 1) + j)] = ext[j];
  }
}

TEST(Fp8KvDecode, EveryFiniteEncodingAtTinyUnitAndLargeScales) {
  int i = 0;
  for (DType fmt : kFormats)
    for (KvScaleKind kind : kKinds)
      for (float s : {1.f, 0x1p-10f, 0x1p8f}) {
        DecodeConfig cfg = fp8_config(fmt, kind, s, 1.f, i);
        cfg.q_dtype = DType::kBF16;
        cfg.q_gain = 1.f / (fp8_max(fmt) * largest(cfg.k_scales));  // |q·k| ≤ about D
        cfg.seq_lens = {33, 3, 130};
        DecodeProblemHost p = make_decode_problem(cfg, 2000 + i);
        fill_with_every_encoding(p, 3000 + i);
        ++i;
        for (int pol = 0; pol < 3; ++pol)
          for (DType od : {DType::kF32, DType::kBF16})
            EXPECT_EQ(run_decode(p, policy(pol), od, LseBase::kBase2), "")
                << cfg.name() << " policy " << pol << " out " << to_string(od);
      }
}

TEST(Fp8KvDecode, NaNEncodingsPropagateToTheRowsThatSeeThem) {
  const std::vector<std::uint8_t> e4m3_nans = {0x7F, 0xFF};
  const std::vector<std::uint8_t> e5m2_nans = {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF};
  for (DType fmt : kFormats)
    for (std::uint8_t code : fmt == DType::kE4M3 ? e4m3_nans : e5m2_nans) {
      DecodeConfig cfg = fp8_config(fmt, KvScaleKind::kPerHead, 0.5f, 1.f, 1);
      cfg.q_len = 2;
      cfg.seq_lens = {40, 40, 40};
      DecodeProblemHost p = make_decode_problem(cfg, code);
      // K of request 1, key 10, KV head 0: every row of that request and head's group is NaN
      p.k[static_cast<std::size_t>(p.kv_offset(1, 10, 0) + 5)] = code;
      // V of request 2's last key, KV head 1, element 7: only its last row sees it
      p.v[static_cast<std::size_t>(p.kv_offset(2, 39, 1) + 7)] = code;
      HostState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
      DecodeOptions o = policy(0);
      o.scale = softmax_scale(p);
      cpu::decode(p.q_view(), p.kv_view(), o, out.view);
      const kit::AttentionProblem prob = as_problem(p, DType::kF32, LseBase::kNatural);
      EXPECT_EQ(
          compare_decode(kit::reference_state_per_token(prob, decode_keys(p), LseBase::kNatural),
                         out.o.data(), DType::kF32, out.lse.data(), LseBase::kNatural,
                         kit::tolerance_for(prob, false)),
          "")
          << "code 0x" << std::hex << int(code);
      const std::int64_t D = cfg.head_dim, group = cfg.heads_q / cfg.heads_kv;
      const auto o_at = [&](std::int64_t token, std::int64_t h, std::int64_t d) {
        return get(out.o.data(), DType::kF32, (token * cfg.heads_q + h) * D + d);
      };
      for (std::int64_t token = 0; token < p.tokens(); ++token)
        for (std::int64_t h = 0; h < cfg.heads_q; ++h) {
          const std::int64_t b = token / 2, row = token % 2, g = h / group;
          const bool k_nan = b == 1 && g == 0;
          const float lse = out.lse[static_cast<std::size_t>(token * cfg.heads_q + h)];
          EXPECT_EQ(std::isnan(lse), k_nan) << "token " << token << " head " << h;
          for (std::int64_t d = 0; d < D; ++d) {
            const bool v_nan = b == 2 && g == 1 && row == 1 && d == 7;
            EXPECT_EQ(std::isnan(o_at(token, h, d)), k_nan || v_nan)
                << "token " << token << " head " << h << " d " << d;
          }
        }
    }
}

TEST(Fp8KvDecode, APointedToScaleIsReadAtEachCall) {
  // As a captured graph replays: the same cache view, the scale buffer rewritten between calls.
  for (DType fmt : kFormats) {
    const DecodeConfig cfg = fp8_config(fmt, KvScaleKind::kPointer, 1.f, 1.f, 0);
    DecodeProblemHost p = make_decode_problem(cfg, 11);
    const PagedKvCache kv = p.kv_view();  // points into p.k_scale_mem and p.v_scale_mem
    ASSERT_EQ(run_decode(p, policy(2), DType::kF32, LseBase::kNatural, &kv), "");
    p.k_scale_mem[0] = 0.25f;
    p.v_scale_mem[0] = 8.f;
    DecodeProblemHost now = p;
    now.cfg.k_scales = {0.25f};
    now.cfg.v_scales = {8.f};
    EXPECT_EQ(run_decode(p, policy(2), DType::kF32, LseBase::kNatural, &kv, &now), "");
    EXPECT_NE(run_decode(p, policy(2), DType::kF32, LseBase::kNatural, &kv), "");  // old scales
  }
}

TEST(Fp8KvDecode, SplitPoliciesChangeOnlyRounding) {
  for (DType fmt : kFormats) {
    const DecodeProblemHost p =
        make_decode_problem(fp8_config(fmt, KvScaleKind::kPerHead, 0x1p-10f, 100.f, 0), 21);
    std::vector<HostState> outs;
    for (int pol = 0; pol < 3; ++pol) {
      outs.emplace_back(p.tokens(), p.cfg.heads_q, p.cfg.head_dim, DType::kF32, LseBase::kNatural);
      DecodeOptions o = policy(pol);
      o.scale = softmax_scale(p);
      cpu::decode(p.q_view(), p.kv_view(), o, outs.back().view);
    }
    const std::int64_t n = p.tokens() * p.cfg.heads_q * p.cfg.head_dim;
    for (int pol = 1; pol < 3; ++pol)
      EXPECT_LT(max_abs_diff(outs[0].o.data(), outs[pol].o.data(), DType::kF32, n), 1e-6)
          << to_string(fmt) << " policy " << pol;
  }
}

// ---- cascade -----------------------------------------------------------------------------------

/// A cascade case with its pools stored in `fmt`: the case's values times `amp`, rounded once to
/// fp8 (stored bytes), with the scales of `kind`.
struct Fp8Cascade {
  CascadeCase base;
  DType fmt;
  KvScaleKind kind;
  std::vector<float> k_scales, v_scales;
  std::vector<std::uint8_t> k, v;  // stored bytes, the case's pool layout

  Fp8Cascade(const CaseSpec& spec, DType f, KvScaleKind kd, float s, float amp)
      : base(spec), fmt(f), kind(kd) {
    k_scales = scales_for(kind, s, spec.heads_kv);
    v_scales = scales_for(kind, s * 0.5f, spec.heads_kv);
    const auto encode = [&](const std::vector<float>& vals, std::vector<std::uint8_t>& raw) {
      raw.resize(vals.size());
      for (std::size_t i = 0; i < vals.size(); ++i) {
        std::vector<unsigned char> one(1);
        put(one, fmt, 0, vals[i] * amp);  // NaN (unowned slots) stays a NaN code
        raw[i] = one[0];
      }
    };
    encode(base.k, k);
    encode(base.v, v);
  }
  PagedKvCache pool() const {
    PagedKvCache kv = base.pool(k.data(), v.data(), MemorySpace::kHost);
    kv.dtype = fmt;
    const auto view = [&](const std::vector<float>& s) {
      if (kind == KvScaleKind::kPointer) return KvScale::per_tensor_at(s.data());
      if (kind == KvScaleKind::kPerHead) return KvScale::per_head(s.data());
      return KvScale::per_tensor(s[0]);
    };
    kv.k_scale = view(k_scales);
    kv.v_scale = view(v_scales);
    return kv;
  }
  /// The kit's reference: the case's pool problem with the stored fp8 values and the scales.
  kit::ReferenceState reference(DType out_dtype, kit::Tolerance* tol) const {
    CascadeCase stored = base;
    for (std::size_t i = 0; i < k.size(); ++i) {
      stored.k[i] = static_cast<float>(get(k.data(), fmt, static_cast<std::int64_t>(i)));
      stored.v[i] = static_cast<float>(get(v.data(), fmt, static_cast<std::int64_t>(i)));
    }
    kit::AttentionProblem p = stored.pool_problem();  // stored fp8 values are bf16 values
    p.k = kit::HostTensor::from_floats(fmt, p.k.shape(), p.k.to_floats());
    p.v = kit::HostTensor::from_floats(fmt, p.v.shape(), p.v.to_floats());
    p.k_scale = k_scales;
    p.v_scale = v_scales;
    p.out_dtype = out_dtype;
    *tol = kit::tolerance_for(p, false);
    return kit::reference_state_per_token(p, base.keys_per_token(), LseBase::kNatural);
  }
};

TEST(Fp8KvCascade, MatchesTheDequantisedReference) {
  int i = 0;
  for (DType fmt : kFormats)
    for (KvScaleKind kind : kKinds)
      for (float s : {1.f, 0x1p-10f, 0x1p8f}) {
        CaseSpec spec;
        spec.q_len = i % 2 == 0 ? 1 : 2;
        spec.heads_q = 8;
        spec.heads_kv = 2;
        spec.head_dim = 64;
        spec.page_size = i % 3 == 0 ? 16 : (i % 3 == 1 ? 5 : 1);
        spec.layout = i % 2 == 0 ? KvLayout::kNHD : KvLayout::kHND;
        spec.dtype = DType::kBF16;
        spec.nan_outside = true;  // unowned slots hold NaN codes: never read
        spec.seed = 500 + i;
        const float amp = i % 2 == 0 ? 1.f : fp8_max(fmt) / 2;
        spec.q_amp = std::min(256.f, 1.f / (amp * s));
        // three levels: a prefix shared by all, one shared by pairs (one empty), own suffixes
        spec.levels = {{{4, 70}}, {{2, 33}, {2, 0}}, {{1, 5}, {1, 1}, {1, 17}, {1, 64}}};
        const Fp8Cascade c(spec, fmt, kind, s, amp);
        ++i;
        for (DType od : {DType::kF32, DType::kBF16}) {
          kit::Tolerance tol;
          const kit::ReferenceState ref = c.reference(od, &tol);
          kit::HostState out(c.base.tokens(), spec.heads_q, spec.head_dim, od, LseBase::kNatural);
          out.poison();
          const std::vector<CascadeLevel> levels = c.base.host_levels();
          cpu::cascade_attention(c.base.query(c.base.q_raw.data(), MemorySpace::kHost), c.pool(),
                                 levels.data(), static_cast<int>(levels.size()), c.base.options(),
                                 out.view());
          EXPECT_EQ(kit::compare_states(out, ref, tol), "")
              << to_string(fmt) << " kind " << static_cast<int>(kind) << " scale " << s << " amp "
              << amp << " out " << to_string(od);
        }
      }
}

TEST(Fp8KvCascade, AWrongScaleFailsTheComparison) {
  CaseSpec spec = two_level_spec(3, 40, 20, 9);
  spec.dtype = DType::kBF16;
  const Fp8Cascade c(spec, DType::kE4M3, KvScaleKind::kPerHead, 0.5f, 1.f);
  kit::Tolerance tol;
  const kit::ReferenceState ref = c.reference(DType::kF32, &tol);
  PagedKvCache kv = c.pool();
  std::vector<float> wrong = c.v_scales;
  wrong[0] *= 2.f;
  kv.v_scale = KvScale::per_head(wrong.data());
  kit::HostState out(c.base.tokens(), spec.heads_q, spec.head_dim, DType::kF32, LseBase::kNatural);
  const std::vector<CascadeLevel> levels = c.base.host_levels();
  cpu::cascade_attention(c.base.query(c.base.q_raw.data(), MemorySpace::kHost), kv, levels.data(),
                         static_cast<int>(levels.size()), c.base.options(), out.view());
  EXPECT_NE(kit::compare_states(out, ref, tol), "");
}

// ---- arguments ---------------------------------------------------------------------------------

/// Runs `f`, which must throw `attnstate::Error` with `status` naming `arg`.
void expect_named(const std::function<void()>& f, const std::string& arg,
                  Status status = Status::kInvalidArgument) {
  try {
    f();
    ADD_FAILURE() << "no error naming " << arg;
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find("argument '" + arg + "'"), std::string::npos) << e.what();
  }
}

TEST(Fp8KvArgs, BadScalesAndFp8QueriesAreNamedAndNothingIsWritten) {
  DecodeConfig cfg = fp8_config(DType::kE5M2, KvScaleKind::kPerHead, 1.f, 1.f, 0);
  cfg.seq_lens = {20, 3};
  DecodeProblemHost p = make_decode_problem(cfg, 5);
  HostState out(p.tokens(), cfg.heads_q, cfg.head_dim, DType::kF32, LseBase::kNatural);
  const std::vector<unsigned char> poison = out.o;
  const auto decode_with = [&](const PagedKvCache& kv, const ConstTensorView& q) {
    return [&, kv, q] { cpu::decode(q, kv, DecodeOptions{}, out.view); };
  };
  p.v_scale_mem[1] = -2.f;  // KV head 1's V scale
  expect_named(decode_with(p.kv_view(), p.q_view()), "kv.v_scale.data[1]");
  p.v_scale_mem[1] = 1.f;
  PagedKvCache kv = p.kv_view();
  kv.k_scale = KvScale::per_tensor(0.f);
  expect_named(decode_with(kv, p.q_view()), "kv.k_scale.value");
  kv = p.kv_view();
  kv.dtype = DType::kBF16;  // a scale on a bf16 cache
  expect_named(decode_with(kv, p.q_view()), "kv.k_scale");
  DecodeProblemHost q8 = p;
  q8.cfg.q_dtype = DType::kE4M3;
  expect_named(decode_with(p.kv_view(), q8.q_view()), "q.dtype", Status::kNotSupported);
  EXPECT_EQ(out.o, poison);
  EXPECT_TRUE(std::isnan(out.lse[0]));

  // the cascade takes the same checks
  CaseSpec spec = two_level_spec(2, 20, 5, 3);
  spec.dtype = DType::kBF16;
  const Fp8Cascade c(spec, DType::kE4M3, KvScaleKind::kValue, 1.f, 1.f);
  const std::vector<CascadeLevel> levels = c.base.host_levels();
  kit::HostState cascade_out(c.base.tokens(), spec.heads_q, spec.head_dim, DType::kF32,
                             LseBase::kNatural);
  const auto cascade_with = [&](const PagedKvCache& pool, const ConstTensorView& q) {
    return [&, pool, q] {
      cpu::cascade_attention(q, pool, levels.data(), static_cast<int>(levels.size()),
                             c.base.options(), cascade_out.view());
    };
  };
  const ConstTensorView q = c.base.query(c.base.q_raw.data(), MemorySpace::kHost);
  PagedKvCache pool = c.pool();
  pool.v_scale = KvScale::per_tensor(INFINITY);
  expect_named(cascade_with(pool, q), "kv.v_scale.value");
  ConstTensorView q_fp8 = q;
  q_fp8.dtype = DType::kE5M2;
  expect_named(cascade_with(c.pool(), q_fp8), "q.dtype", Status::kNotSupported);
}

TEST(Fp8KvArgs, AnEmptyBatchReadsNoKeyAndStoresNoScale) {
  // 2^40 KV heads, no page and no request: a valid call that reads and writes nothing (the
  // scales of 2^40 heads are never gathered).
  const std::int64_t heads = std::int64_t{1} << 40;
  PagedKvCache kv;
  kv.dtype = DType::kE4M3;
  kv.k_scale = KvScale::per_tensor(0.5f);
  kv.num_pages = 0;
  kv.page_size = 1;
  kv.heads_kv = heads;
  kv.head_dim = 1;
  kv.batch = 0;
  const ConstTensorView q = make_tensor_view(nullptr, DType::kBF16, {0, 1, heads, 1});
  float o = 0.f, lse = 0.f;
  StateView out = make_state_view(&o, DType::kF32, &lse, 0, heads, 1, LseBase::kNatural);
  EXPECT_NO_THROW(cpu::decode(q, kv, DecodeOptions{}, out));
}

}  // namespace
