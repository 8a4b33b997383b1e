/// @file mla.cpp
/// @brief MLA problems in the testing kit: construction, checks, the double reference (through
///        the reference's row kernel, keys `[ckv, kpe]` and values `ckv`), the tolerance and
///        the generator.
#include "attnstate/testing/mla.hpp"

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <string>

#include "arg_checks.hpp"
#include "attnstate/core/error.hpp"
#include "gen_choices.hpp"
#include "reference_rows.hpp"

namespace attnstate {
namespace testing {
namespace {

using kit::in_full_range;
using kit::pick;

/// `"<arg>.<field>"`.
std::string field(const char* arg, const char* f) { return std::string(arg) + "." + f; }

/// Throws naming `<arg>.<name>.shape` unless `t` has rank `rank` (after a default-constructed
/// tensor of rank 0).
void check_rank(const HostTensor& t, int rank, const char* func, const char* arg,
                const char* name) {
  if (t.rank() != rank)
    detail::throw_argument(func, field(arg, name).c_str(),
                           "a tensor of rank " + std::to_string(rank),
                           "rank " + std::to_string(t.rank()));
}

/// Throws naming `<arg>.<name>` unless `got == want`.
void check_extent_eq(std::int64_t got, std::int64_t want, const char* func, const char* arg,
                     const std::string& name, const std::string& what) {
  if (got != want)
    detail::throw_argument(func, (std::string(arg) + "." + name).c_str(),
                           std::to_string(want) + " (" + what + ")", std::to_string(got));
}

/// Throws naming `<arg>.<name>` unless the scale of a part of dtype `dt` is valid: finite and
/// > 0 for fp8, exactly 1 otherwise (a scale there would be ignored).
void check_part_scale(float s, DType dt, const char* func, const char* arg, const char* name) {
  if (is_fp8(dt)) {
    if (!(s > 0.f) || !std::isfinite(s))
      detail::throw_argument(func, field(arg, name).c_str(), "a finite value > 0",
                             std::to_string(s));
  } else if (s != 1.f) {
    detail::throw_argument(
        func, field(arg, name).c_str(),
        std::string("1 (a scale applies to an fp8 part only; this one is ") + to_string(dt) + ")",
        std::to_string(s));
  }
}

/// Throws unless `p` is consistent, naming `<arg>.<field>`.
void check_mla(const MlaProblem& p, const char* func, const char* arg) {
  check_rank(p.q_nope, 3, func, arg, "q_nope");
  check_rank(p.q_pe, 3, func, arg, "q_pe");
  check_rank(p.ckv, 2, func, arg, "ckv");
  check_rank(p.kpe, 2, func, arg, "kpe");
  kit::check_dtype(p.q_nope.dtype(), func, field(arg, "q_nope.dtype").c_str());
  if (p.q_pe.dtype() != p.q_nope.dtype())
    detail::throw_argument(func, field(arg, "q_pe.dtype").c_str(),
                           std::string("q_nope's dtype ") + to_string(p.q_nope.dtype()),
                           to_string(p.q_pe.dtype()));
  kit::check_dtype(p.ckv.dtype(), func, field(arg, "ckv.dtype").c_str(), true);
  kit::check_dtype(p.kpe.dtype(), func, field(arg, "kpe.dtype").c_str(), true);
  if (p.q_nope.dim(1) < 1)
    detail::throw_argument(func, field(arg, "q_nope.shape[1]").c_str(), "heads >= 1",
                           std::to_string(p.q_nope.dim(1)));
  if (p.q_nope.dim(2) < 1 || p.q_pe.dim(2) < 1)
    detail::throw_argument(
        func, field(arg, p.q_nope.dim(2) < 1 ? "q_nope.shape[2]" : "q_pe.shape[2]").c_str(),
        "a width >= 1", std::to_string(std::min(p.q_nope.dim(2), p.q_pe.dim(2))));
  check_extent_eq(p.q_pe.dim(0), p.q_nope.dim(0), func, arg, "q_pe.shape[0]", "q_nope's tokens");
  check_extent_eq(p.q_pe.dim(1), p.q_nope.dim(1), func, arg, "q_pe.shape[1]", "q_nope's heads");
  check_extent_eq(p.ckv.dim(1), p.q_nope.dim(2), func, arg, "ckv.shape[1]",
                  "q_nope's kv_lora_rank");
  check_extent_eq(p.kpe.dim(1), p.q_pe.dim(2), func, arg, "kpe.shape[1]", "q_pe's rope_dim");
  check_extent_eq(p.kpe.dim(0), p.ckv.dim(0), func, arg, "kpe.shape[0]", "ckv's num_keys");
  check_part_scale(p.ckv_scale, p.ckv.dtype(), func, arg, "ckv_scale");
  check_part_scale(p.kpe_scale, p.kpe.dtype(), func, arg, "kpe_scale");
  if (!p.ckv_block_scales.empty() || p.ckv_block_cols != 0) {
    if (!is_fp8(p.ckv.dtype()))
      detail::throw_argument(func, field(arg, "ckv_block_scales").c_str(),
                             std::string("empty (block scales apply to an fp8 ckv; this one is ") +
                                 to_string(p.ckv.dtype()) + ")",
                             std::to_string(p.ckv_block_scales.size()) + " values");
    if (p.ckv_scale != 1.f)
      detail::throw_argument(func, field(arg, "ckv_scale").c_str(),
                             "1 with ckv_block_scales (they are the whole scale)",
                             std::to_string(p.ckv_scale));
    if (p.ckv_block_cols < 1 || p.kv_lora_rank() % p.ckv_block_cols != 0)
      detail::throw_argument(func, field(arg, "ckv_block_cols").c_str(),
                             ">= 1 dividing kv_lora_rank = " + std::to_string(p.kv_lora_rank()),
                             std::to_string(p.ckv_block_cols));
    check_extent_eq(static_cast<std::int64_t>(p.ckv_block_scales.size()),
                    p.num_keys() * (p.kv_lora_rank() / p.ckv_block_cols), func, arg,
                    "ckv_block_scales.size()", "num_keys × kv_lora_rank / ckv_block_cols");
    for (std::size_t i = 0; i < p.ckv_block_scales.size(); ++i) {
      const float s = p.ckv_block_scales[i];
      if (!(s > 0.f) || !std::isfinite(s))
        detail::throw_argument(
            func, field(arg, ("ckv_block_scales[" + std::to_string(i) + "]").c_str()).c_str(),
            "a finite value > 0", std::to_string(s));
    }
  }
  kit::check_dtype(p.out_dtype, func, field(arg, "out_dtype").c_str());
  kit::check_base(p.base, func, field(arg, "base").c_str());
  if (!p.sinks.empty()) {
    check_extent_eq(static_cast<std::int64_t>(p.sinks.size()), p.heads(), func, arg, "sinks.size()",
                    "one logit per head");
    for (std::size_t h = 0; h < p.sinks.size(); ++h) {
      const float s = p.sinks[h];
      if (std::isnan(s) || s == INFINITY)
        detail::throw_argument(func,
                               field(arg, ("sinks[" + std::to_string(h) + "]").c_str()).c_str(),
                               "a finite logit or -inf", std::to_string(s));
    }
  }
}

/// The real values of a `(num_keys, width)` part: `stored × scale`, exact in double.
std::vector<double> real_part(const HostTensor& t, float scale) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    out[static_cast<std::size_t>(i)] = static_cast<double>(t.get(i)) * scale;
  return out;
}

/// The real latent values of a checked problem: `ckv × ckv_scale`, or × each token's block
/// scales.
std::vector<double> real_ckv(const MlaProblem& p) {
  std::vector<double> out = real_part(p.ckv, p.ckv_scale);
  if (p.ckv_block_scales.empty()) return out;
  const std::int64_t L = p.kv_lora_rank(), blocks = L / p.ckv_block_cols;
  for (std::int64_t i = 0; i < p.num_keys(); ++i)
    for (std::int64_t d = 0; d < L; ++d)
      out[static_cast<std::size_t>(i * L + d)] *=
          p.ckv_block_scales[static_cast<std::size_t>(i * blocks + d / p.ckv_block_cols)];
  return out;
}

/// The reference's values of a checked problem: queries `[q_nope, q_pe]` and keys `[ckv, kpe]`
/// per row, values `ckv`; one KV head for every query head.
kit::RowValues mla_values(const MlaProblem& p) {
  const std::int64_t L = p.kv_lora_rank(), R = p.rope_dim(), K = L + R;
  const std::int64_t rows = p.tokens() * p.heads(), keys = p.num_keys();
  kit::RowValues v;
  v.q.resize(static_cast<std::size_t>(rows * K));
  const std::vector<float> qn = p.q_nope.to_floats(), qp = p.q_pe.to_floats();
  for (std::int64_t r = 0; r < rows; ++r) {
    std::copy(qn.begin() + r * L, qn.begin() + (r + 1) * L, v.q.begin() + r * K);
    std::copy(qp.begin() + r * R, qp.begin() + (r + 1) * R, v.q.begin() + r * K + L);
  }
  const std::vector<double> ckv = real_ckv(p);
  const std::vector<double> kpe = real_part(p.kpe, p.kpe_scale);
  v.k.resize(static_cast<std::size_t>(keys * K));
  for (std::int64_t i = 0; i < keys; ++i) {
    std::copy(ckv.begin() + i * L, ckv.begin() + (i + 1) * L, v.k.begin() + i * K);
    std::copy(kpe.begin() + i * R, kpe.begin() + (i + 1) * R, v.k.begin() + i * K + L);
  }
  v.v = ckv;
  v.hq = p.heads();
  v.hkv = 1;
  v.k_dim = K;
  v.v_dim = L;
  v.group = p.heads();
  v.scale = p.scale;
  return v;
}

}  // namespace

MlaProblem make_mla_problem(std::int64_t tokens, std::int64_t heads, std::int64_t kv_lora_rank,
                            std::int64_t rope_dim, std::int64_t num_keys, DType q_dtype,
                            DType ckv_dtype, DType kpe_dtype, const std::vector<float>& q_nope,
                            const std::vector<float>& q_pe, const std::vector<float>& ckv,
                            const std::vector<float>& kpe, float scale, DType out_dtype,
                            LseBase base) {
  const char* fn = "attnstate::testing::make_mla_problem";
  kit::check_extent(tokens, fn, "tokens");
  kit::check_extent(num_keys, fn, "num_keys");
  if (heads < 1) detail::throw_argument(fn, "heads", ">= 1", std::to_string(heads));
  if (kv_lora_rank < 1)
    detail::throw_argument(fn, "kv_lora_rank", ">= 1", std::to_string(kv_lora_rank));
  if (rope_dim < 1) detail::throw_argument(fn, "rope_dim", ">= 1", std::to_string(rope_dim));
  kit::check_dtype(q_dtype, fn, "q_dtype");
  kit::check_dtype(ckv_dtype, fn, "ckv_dtype", true);
  kit::check_dtype(kpe_dtype, fn, "kpe_dtype", true);
  kit::check_dtype(out_dtype, fn, "out_dtype");
  kit::check_base(base, fn, "base");
  MlaProblem p;
  // from_floats checks each size against its shape, naming the values
  p.q_nope = HostTensor::from_floats(q_dtype, {tokens, heads, kv_lora_rank}, q_nope);
  p.q_pe = HostTensor::from_floats(q_dtype, {tokens, heads, rope_dim}, q_pe);
  p.ckv = HostTensor::from_floats(ckv_dtype, {num_keys, kv_lora_rank}, ckv);
  p.kpe = HostTensor::from_floats(kpe_dtype, {num_keys, rope_dim}, kpe);
  p.scale = scale;
  p.out_dtype = out_dtype;
  p.base = base;
  return p;
}

MlaProblem select_keys(const MlaProblem& problem, const std::vector<std::int64_t>& keys) {
  const char* fn = "attnstate::testing::select_keys";
  check_mla(problem, fn, "problem");
  kit::check_keys(keys, problem.num_keys(), fn, "keys");
  MlaProblem p = problem;
  const auto n = static_cast<std::int64_t>(keys.size());
  const std::int64_t L = problem.kv_lora_rank(), R = problem.rope_dim();
  p.ckv = HostTensor(problem.ckv.dtype(), {n, L});
  p.kpe = HostTensor(problem.kpe.dtype(), {n, R});
  // element by element through get/set: exact for every dtype (a stored value re-stored)
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t k = keys[static_cast<std::size_t>(i)];
    for (std::int64_t d = 0; d < L; ++d) p.ckv.set(i * L + d, problem.ckv.get(k * L + d));
    for (std::int64_t d = 0; d < R; ++d) p.kpe.set(i * R + d, problem.kpe.get(k * R + d));
  }
  if (!problem.ckv_block_scales.empty()) {
    const std::int64_t blocks = L / problem.ckv_block_cols;
    p.ckv_block_scales.resize(static_cast<std::size_t>(n * blocks));
    for (std::int64_t i = 0; i < n; ++i)
      std::copy_n(problem.ckv_block_scales.begin() + keys[static_cast<std::size_t>(i)] * blocks,
                  blocks, p.ckv_block_scales.begin() + i * blocks);
  }
  return p;
}

MlaProblem without_sinks(const MlaProblem& problem) {
  check_mla(problem, "attnstate::testing::without_sinks", "problem");
  MlaProblem p = problem;
  p.sinks.clear();
  return p;
}

HostState make_output_state(const MlaProblem& problem) {
  check_mla(problem, "attnstate::testing::make_output_state", "problem");
  HostState s(problem.tokens(), problem.heads(), problem.kv_lora_rank(), problem.out_dtype,
              problem.base);
  s.poison();
  return s;
}

ReferenceState reference_mla_state_per_token(const MlaProblem& p,
                                             const std::vector<std::vector<std::int64_t>>& keys,
                                             LseBase base) {
  const char* fn = "attnstate::testing::reference_mla_state_per_token";
  check_mla(p, fn, "problem");
  kit::check_keys_per_token(keys, p.tokens(), p.num_keys(), fn);
  kit::check_base(base, fn, "base");
  ReferenceState r = kit::empty_reference(p.tokens(), p.heads(), p.kv_lora_rank(), base);
  const kit::RowValues pv = mla_values(p);
  std::vector<double> s;
  for (std::int64_t t = 0; t < p.tokens(); ++t) {
    const std::vector<std::int64_t>& row_keys = keys[static_cast<std::size_t>(t)];
    if (row_keys.empty()) continue;  // (0, -inf)
    for (std::int64_t h = 0; h < pv.hq; ++h) kit::attend_row(pv, row_keys, t, h, s, r);
  }
  return apply_sinks(r, p.sinks);  // once, after every key of the row
}

ReferenceState reference_mla_state(const MlaProblem& problem, const std::vector<std::int64_t>& keys,
                                   LseBase base) {
  check_mla(problem, "attnstate::testing::reference_mla_state", "problem");
  kit::check_keys(keys, problem.num_keys(), "attnstate::testing::reference_mla_state", "keys");
  return reference_mla_state_per_token(
      problem,
      std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(problem.tokens()), keys),
      base);
}

double max_abs_score(const MlaProblem& p) {
  check_mla(p, "attnstate::testing::max_abs_score", "problem");
  const kit::RowValues pv = mla_values(p);
  const std::int64_t K = pv.k_dim;
  double best = 0;
  for (std::int64_t r = 0; r < p.tokens() * p.heads(); ++r)
    for (std::int64_t i = 0; i < p.num_keys(); ++i) {
      double s = 0;
      for (std::int64_t d = 0; d < K; ++d)
        s += std::fabs(static_cast<double>(pv.q[static_cast<std::size_t>(r * K + d)]) *
                       pv.k[static_cast<std::size_t>(i * K + d)]);
      best = std::max(best, std::fabs(static_cast<double>(p.scale)) * s);
    }
  return best;
}

Tolerance tolerance_for(const MlaProblem& problem, bool p_rounded_to_input) {
  check_mla(problem, "attnstate::testing::tolerance_for", "problem");
  // P is rounded to the queries' dtype against an fp8 cache (every fp8 value is exact there),
  // else to the latent values' dtype (as for an attention problem)
  const DType in = is_fp8(problem.ckv.dtype()) ? problem.q_nope.dtype() : problem.ckv.dtype();
  double v_max = 1.0;
  for (const double v : real_ckv(problem)) v_max = std::max(v_max, std::fabs(v));
  return kit::attention_tolerance(in, problem.out_dtype, problem.base,
                                  static_cast<double>(problem.num_keys()),
                                  static_cast<double>(problem.kv_lora_rank() + problem.rope_dim()),
                                  max_abs_score(problem), v_max, p_rounded_to_input);
}

namespace kit {

void check_mla_gen_options(const MlaGenOptions& o, const char* func, const char* arg) {
  const auto name = [arg](const std::string& f) { return std::string(arg) + "." + f; };
  const auto fail = [&](const std::string& f, const std::string& expected, const std::string& got) {
    detail::throw_argument(func, name(f).c_str(), expected, got);
  };
  if (o.max_tokens < 1 || o.max_tokens > 4096)
    fail("max_tokens", "1..4096", std::to_string(o.max_tokens));
  if (o.min_keys < 0 || o.min_keys > o.max_keys || o.max_keys > (std::int64_t{1} << 24))
    fail("min_keys", "0 <= min_keys <= max_keys <= 2^24",
         std::to_string(o.min_keys) + " and " + std::to_string(o.max_keys));
  const auto non_empty = [&](std::size_t n, const char* f) {
    if (n == 0) fail(f, "a non-empty list", "an empty one");
  };
  non_empty(o.heads.size(), "heads");
  non_empty(o.kv_lora_ranks.size(), "kv_lora_ranks");
  non_empty(o.rope_dims.size(), "rope_dims");
  non_empty(o.q_dtypes.size(), "q_dtypes");
  non_empty(o.ckv_dtypes.size(), "ckv_dtypes");
  non_empty(o.output_dtypes.size(), "output_dtypes");
  non_empty(o.bases.size(), "bases");
  non_empty(o.kv_scales.size(), "kv_scales");
  const auto in_range = [&](const std::vector<std::int64_t>& l, const char* f) {
    for (std::size_t i = 0; i < l.size(); ++i)
      if (l[i] < 1 || l[i] > 4096)
        fail(std::string(f) + "[" + std::to_string(i) + "]", "1..4096", std::to_string(l[i]));
  };
  in_range(o.heads, "heads");
  in_range(o.kv_lora_ranks, "kv_lora_ranks");
  in_range(o.rope_dims, "rope_dims");
  for (DType d : o.q_dtypes) check_dtype(d, func, name("q_dtypes").c_str());
  for (DType d : o.output_dtypes) check_dtype(d, func, name("output_dtypes").c_str());
  for (DType d : o.ckv_dtypes) check_dtype(d, func, name("ckv_dtypes").c_str(), true);
  for (DType d : o.kpe_dtypes) check_dtype(d, func, name("kpe_dtypes").c_str(), true);
  for (LseBase b : o.bases) check_base(b, func, name("bases").c_str());
  for (float s : o.kv_scales)
    if (!(s > 0.f) || !std::isfinite(s)) fail("kv_scales", "finite values > 0", std::to_string(s));
  if (o.large_logits_percent < 0 || o.large_logits_percent > 100)
    fail("large_logits_percent", "0..100", std::to_string(o.large_logits_percent));
  if (o.sink_percent < 0 || o.sink_percent > 100)
    fail("sink_percent", "0..100", std::to_string(o.sink_percent));
  if (o.block_scale_percent < 0 || o.block_scale_percent > 100)
    fail("block_scale_percent", "0..100", std::to_string(o.block_scale_percent));
  non_empty(o.block_cols.size(), "block_cols");
  in_range(o.block_cols, "block_cols");
  if (!std::isfinite(o.large_logit_factor))
    fail("large_logit_factor", "a finite value", std::to_string(o.large_logit_factor));
  if (!std::isfinite(o.sink_min) || !std::isfinite(o.sink_max) || o.sink_min > o.sink_max)
    fail("sink_min", "finite sink_min <= sink_max",
         std::to_string(o.sink_min) + " and " + std::to_string(o.sink_max));
}

}  // namespace kit

rc::Gen<MlaProblem> gen_mla_problem(const MlaGenOptions& options) {
  kit::check_mla_gen_options(options, "attnstate::testing::gen_mla_problem", "options");
  return rc::gen::exec([opt = options] {
    const std::int64_t tokens = *rc::gen::inRange<std::int64_t>(1, opt.max_tokens + 1);
    const std::int64_t heads = *pick(opt.heads);
    const std::int64_t L = *pick(opt.kv_lora_ranks);
    const std::int64_t R = *pick(opt.rope_dims);
    const std::int64_t keys = *in_full_range<std::int64_t>(opt.min_keys, opt.max_keys + 1);
    const DType q_dt = *pick(opt.q_dtypes);
    const DType ckv_dt = *pick(opt.ckv_dtypes);
    const DType kpe_dt = !opt.kpe_dtypes.empty() ? *pick(opt.kpe_dtypes)
                         : is_fp8(ckv_dt)        ? DType::kBF16
                                                 : ckv_dt;
    const DType out_dt = *pick(opt.output_dtypes);
    const LseBase base = *pick(opt.bases);
    const bool large = *in_full_range<int>(0, 100) >= 100 - opt.large_logits_percent;
    const auto seed = *kit::gen_seed();
    // an fp8 part: stored amplitude and scale drawn (1 for a part that is not fp8)
    const auto draw_part = [&](DType dt, float* amp, float* scale) {
      *amp = 1.f;
      *scale = 1.f;
      if (!is_fp8(dt)) return;
      *amp = *rc::gen::arbitrary<bool>() ? kit::fp8_max(dt) / 2 : 1.f;
      *scale = *pick(opt.kv_scales);
    };
    float ckv_amp, ckv_scale, kpe_amp, kpe_scale;
    draw_part(ckv_dt, &ckv_amp, &ckv_scale);
    draw_part(kpe_dt, &kpe_amp, &kpe_scale);

    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    std::vector<float> qn(static_cast<std::size_t>(tokens * heads * L));
    std::vector<float> qp(static_cast<std::size_t>(tokens * heads * R));
    std::vector<float> ckv(static_cast<std::size_t>(keys * L));
    std::vector<float> kpe(static_cast<std::size_t>(keys * R));
    for (float& x : ckv) x = uni(rng) * ckv_amp;
    for (float& x : kpe) x = uni(rng) * kpe_amp;
    // the queries scaled to the largest real key element (scores of the plain problems'
    // magnitude whatever the fp8 amplitude and scale), at most × 256; then the large logits
    const double k_max = std::max(static_cast<double>(ckv_amp) * ckv_scale,
                                  static_cast<double>(kpe_amp) * kpe_scale);
    const float f =
        static_cast<float>(std::min(1.0 / k_max, 256.0)) * (large ? opt.large_logit_factor : 1.f);
    for (float& x : qn) x = uni(rng) * f;
    for (float& x : qp) x = uni(rng) * f;
    const float scale = 1.f / std::sqrt(static_cast<float>(L + R));
    // an f16 output of a large fp8 latent value would overflow: f32 instead
    const DType out = out_dt == DType::kF16 && ckv_amp * ckv_scale > 65504.f ? DType::kF32 : out_dt;
    MlaProblem p = make_mla_problem(tokens, heads, L, R, keys, q_dt, ckv_dt, kpe_dt, qn, qp, ckv,
                                    kpe, scale, out, base);
    p.ckv_scale = ckv_scale;
    p.kpe_scale = kpe_scale;
    p.value_seed = seed;
    if (opt.sink_percent > 0 && *in_full_range<int>(0, 100) >= 100 - opt.sink_percent) {
      std::mt19937_64 sink_rng(seed ^ 0x51a4c0ffee5eedULL);
      std::uniform_real_distribution<float> in_range(opt.sink_min, opt.sink_max);
      p.sinks.resize(static_cast<std::size_t>(heads));
      for (float& s : p.sinks) s = opt.sink_min == opt.sink_max ? opt.sink_min : in_range(sink_rng);
    }
    // drawn last (the draws of problems without block scales unchanged)
    if (opt.block_scale_percent > 0 && is_fp8(ckv_dt) &&
        *in_full_range<int>(0, 100) >= 100 - opt.block_scale_percent) {
      const std::int64_t cols = *pick(opt.block_cols);
      p.ckv_block_cols = L % cols == 0 ? cols : L;
      std::mt19937_64 block_rng(seed ^ 0xb10c5ca1e5ULL);
      std::uniform_int_distribution<int> down(0, 3);
      p.ckv_block_scales.resize(static_cast<std::size_t>(keys * (L / p.ckv_block_cols)));
      // at most the drawn scale: the queries' normalisation above still holds
      for (float& s : p.ckv_block_scales) s = std::ldexp(ckv_scale, -down(block_rng));
      p.ckv_scale = 1.f;
    }
    return p;
  });
}

std::ostream& operator<<(std::ostream& os, const MlaProblem& p) {
  os << "MlaProblem{tokens=" << p.tokens() << " heads=" << p.heads()
     << " kv_lora_rank=" << p.kv_lora_rank() << " rope_dim=" << p.rope_dim()
     << " keys=" << p.num_keys() << " q=" << to_string(p.q_nope.dtype())
     << " ckv=" << to_string(p.ckv.dtype()) << " kpe=" << to_string(p.kpe.dtype());
  if (is_fp8(p.ckv.dtype()) && p.ckv_block_scales.empty()) os << " ckv_scale=" << p.ckv_scale;
  if (!p.ckv_block_scales.empty()) os << " ckv_block_cols=" << p.ckv_block_cols;
  if (is_fp8(p.kpe.dtype())) os << " kpe_scale=" << p.kpe_scale;
  os << " scale=" << p.scale << " out=" << to_string(p.out_dtype) << " base=" << to_string(p.base)
     << " value_seed=" << p.value_seed;
  if (!p.sinks.empty()) {
    os << " sinks={";
    for (std::size_t h = 0; h < p.sinks.size(); ++h) os << (h ? " " : "") << p.sinks[h];
    os << "}";
  }
  return os << "}";
}

void showValue(const MlaProblem& problem, std::ostream& os) { os << problem; }

}  // namespace testing
}  // namespace attnstate
