/// @file generators.cpp
/// @brief RapidCheck generators for states, key subsets, partitions and attention problems.
#include "attnstate/testing/generators.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <utility>

#include "arg_checks.hpp"
#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"
#include "gen_choices.hpp"
#include "option_checks.hpp"

namespace attnstate {
namespace testing {

namespace {

using kit::fp8_max;
using kit::gen_seed;
using kit::in_full_range;
using kit::pick;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

/// Garbage for the `o` of an empty row: NaN, ±inf or a huge value (never read by a merge).
float garbage(std::mt19937_64& rng) {
  switch (rng() % 4) {
    case 0:
      return kNaN;
    case 1:
      return std::numeric_limits<float>::infinity();
    case 2:
      return -3.0e38f;
    default:
      return kNaN;
  }
}

/// Fills `o` from `seed`: uniform `[-1, 1]` for non-empty rows; garbage (or 0) for empty rows.
void fill_o(HostState& s, std::uint64_t seed, bool garbage_in_empty) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  for (std::int64_t t = 0; t < s.tokens(); ++t) {
    for (std::int64_t h = 0; h < s.heads(); ++h) {
      const bool empty = s.is_empty_row(t, h);
      for (std::int64_t d = 0; d < s.head_dim(); ++d) {
        float x = uni(rng);
        if (empty) x = garbage_in_empty ? garbage(rng) : 0.f;
        s.set_o(t, h, d, x);
      }
    }
  }
}

rc::Gen<float> gen_lse(const StateGenOptions& opt) {
  using Weighted = std::pair<std::size_t, rc::Gen<float>>;
  std::vector<Weighted> choices;
  choices.emplace_back(6, rc::gen::map(rc::gen::inRange(-2000, 2001),
                                       [](int i) { return static_cast<float>(i) / 100.f; }));
  if (opt.extreme_lse) {
    const double mag = opt.lse_magnitude;
    choices.emplace_back(1, rc::gen::map(rc::gen::inRange(-3000, 3001), [mag](int i) {
                           return static_cast<float>(mag + i / 100.0);
                         }));
    choices.emplace_back(1, rc::gen::map(rc::gen::inRange(-3000, 3001), [mag](int i) {
                           return static_cast<float>(-mag + i / 100.0);
                         }));
  }
  if (opt.empty_rows) choices.emplace_back(2, rc::gen::just(-INFINITY));
  if (opt.nan_rows) choices.emplace_back(1, rc::gen::just(kNaN));
  std::size_t total = 0;
  for (const Weighted& c : choices) total += c.first;
  return rc::gen::exec([choices, total] {
    std::size_t pick = *in_full_range<std::size_t>(0, total);
    for (const Weighted& c : choices) {
      if (pick < c.first) return *c.second;
      pick -= c.first;
    }
    return *choices.back().second;
  });
}

/// `<prefix>.<name>`.
std::string field(const std::string& prefix, const char* name) { return prefix + "." + name; }

/// `<prefix>.<name>[<i>]`.
std::string element(const std::string& prefix, const char* name, std::size_t i) {
  return field(prefix, name) + "[" + std::to_string(i) + "]";
}

void check_at_least(std::int64_t value, std::int64_t min, const char* func,
                    const std::string& name) {
  if (value < min) {
    detail::throw_argument(func, name.c_str(), ">= " + std::to_string(min), std::to_string(value));
  }
}

/// A non-empty list of values >= 1 (GQA group sizes, head dims).
void check_extents(const std::vector<std::int64_t>& values, const char* func,
                   const std::string& prefix, const char* name, const char* what) {
  if (values.empty()) {
    detail::throw_argument(func, field(prefix, name).c_str(),
                           std::string("a non-empty list of ") + what, "an empty list");
  }
  for (std::size_t i = 0; i < values.size(); ++i) {
    check_at_least(values[i], 1, func, element(prefix, name, i));
  }
}

/// A list of valid dtypes, non-empty unless `may_be_empty`; fp8 ones only where `fp8`.
void check_dtypes(const std::vector<DType>& dtypes, const char* func, const std::string& prefix,
                  const char* name, bool fp8 = false, bool may_be_empty = false) {
  if (dtypes.empty() && !may_be_empty) {
    detail::throw_argument(func, field(prefix, name).c_str(),
                           "a non-empty list of dtypes (e.g. {DType::kF32})", "an empty list");
  }
  for (std::size_t i = 0; i < dtypes.size(); ++i) {
    kit::check_dtype(dtypes[i], func, element(prefix, name, i).c_str(), fp8);
  }
}

/// A percentage in [0, 100].
void check_percent(int value, const char* func, const std::string& prefix, const char* name) {
  if (value < 0 || value > 100) {
    detail::throw_argument(func, field(prefix, name).c_str(), "0 to 100", std::to_string(value));
  }
}

/// A non-empty list of valid LSE bases.
void check_bases(const std::vector<LseBase>& bases, const char* func, const std::string& prefix) {
  if (bases.empty()) {
    detail::throw_argument(func, field(prefix, "bases").c_str(),
                           "a non-empty list of LSE bases (e.g. {LseBase::kNatural})",
                           "an empty list");
  }
  for (std::size_t i = 0; i < bases.size(); ++i) {
    if (bases[i] != LseBase::kNatural && bases[i] != LseBase::kBase2) {
      detail::throw_argument(func, element(prefix, "bases", i).c_str(), "natural or base2",
                             "value " + std::to_string(static_cast<int>(bases[i])));
    }
  }
}

/// The largest draw's element count, `fields[0].value x fields[1].value x ...`, at most 2^62
/// (so no size computed from a draw overflows, and every `max + 1` bound fits); names the field at
/// which the product passes it. The fields are checked >= 1 first.
void check_largest(const std::vector<std::pair<std::string, std::int64_t>>& fields,
                   const char* func, const char* what) {
  std::int64_t p = 1;
  std::string got;
  for (const auto& f : fields) {
    got += (got.empty() ? "" : " x ") + std::to_string(f.second);
    if (!checked_mul(p, f.second, &p)) {
      detail::throw_argument(
          func, f.first.c_str(),
          std::string("a value keeping the largest ") + what + " at most 2^62 elements",
          got + " (overflows)");
    }
  }
}

std::int64_t largest(const std::vector<std::int64_t>& values) {
  std::int64_t m = 0;
  for (std::int64_t v : values) m = v > m ? v : m;
  return m;
}

void check_state_extents(const StateGenOptions& o, const char* func, const std::string& prefix) {
  check_at_least(o.max_tokens, 1, func, field(prefix, "max_tokens"));
  check_at_least(o.max_heads, 1, func, field(prefix, "max_heads"));
  check_at_least(o.max_head_dim, 1, func, field(prefix, "max_head_dim"));
  check_largest({{field(prefix, "max_tokens"), o.max_tokens},
                 {field(prefix, "max_heads"), o.max_heads},
                 {field(prefix, "max_head_dim"), o.max_head_dim}},
                func, "state");
}

}  // namespace

void check_problem_gen_options(const ProblemGenOptions& o, const char* func,
                               const std::string& prefix) {
  check_at_least(o.max_tokens, 1, func, field(prefix, "max_tokens"));
  check_at_least(o.min_keys, 0, func, field(prefix, "min_keys"));
  if (o.max_keys < o.min_keys) {
    detail::throw_argument(func, field(prefix, "max_keys").c_str(),
                           ">= " + field(prefix, "min_keys") + " = " + std::to_string(o.min_keys),
                           std::to_string(o.max_keys));
  }
  check_at_least(o.max_heads_kv, 1, func, field(prefix, "max_heads_kv"));
  check_extents(o.group_sizes, func, prefix, "group_sizes", "GQA group sizes (H_q / H_kv)");
  check_extents(o.head_dims, func, prefix, "head_dims", "head dims");
  check_largest({{field(prefix, "max_tokens"), o.max_tokens},
                 {field(prefix, "max_heads_kv"), o.max_heads_kv},
                 {field(prefix, "group_sizes"), largest(o.group_sizes)},
                 {field(prefix, "head_dims"), largest(o.head_dims)}},
                func, "q");
  if (o.max_keys > 0) {
    check_largest({{field(prefix, "max_keys"), o.max_keys},
                   {field(prefix, "max_heads_kv"), o.max_heads_kv},
                   {field(prefix, "head_dims"), largest(o.head_dims)}},
                  func, "k and v");
  }
  check_dtypes(o.input_dtypes, func, prefix, "input_dtypes");
  check_dtypes(o.output_dtypes, func, prefix, "output_dtypes");
  check_dtypes(o.kv_dtypes, func, prefix, "kv_dtypes", /*fp8=*/true, /*may_be_empty=*/true);
  check_bases(o.bases, func, prefix);
  const bool fp8 = std::any_of(o.kv_dtypes.begin(), o.kv_dtypes.end(), is_fp8);
  if (fp8 && o.kv_scales.empty()) {
    detail::throw_argument(func, field(prefix, "kv_scales").c_str(),
                           "a non-empty list of scales (kv_dtypes lists an fp8 dtype)",
                           "an empty list");
  }
  for (std::size_t i = 0; i < o.kv_scales.size(); ++i) {
    if (!(std::isfinite(o.kv_scales[i]) && o.kv_scales[i] > 0.f)) {
      detail::throw_argument(func, element(prefix, "kv_scales", i).c_str(), "a finite scale > 0",
                             show_number(o.kv_scales[i]));
    }
  }
  check_percent(o.per_head_scale_percent, func, prefix, "per_head_scale_percent");
  check_percent(o.fp8_extremes_percent, func, prefix, "fp8_extremes_percent");
  if (o.large_logits_percent < 0 || o.large_logits_percent > 100) {
    detail::throw_argument(func, field(prefix, "large_logits_percent").c_str(), "0 to 100",
                           std::to_string(o.large_logits_percent));
  }
  if (o.offset_values_percent < 0 || o.offset_values_percent > 100) {
    detail::throw_argument(func, field(prefix, "offset_values_percent").c_str(), "0 to 100",
                           std::to_string(o.offset_values_percent));
  }
  if (!(std::isfinite(o.large_logit_factor) && o.large_logit_factor > 0.f)) {
    detail::throw_argument(func, field(prefix, "large_logit_factor").c_str(), "a finite value > 0",
                           show_number(o.large_logit_factor));
  }
  if (o.soft_cap_percent < 0 || o.soft_cap_percent > 100) {
    detail::throw_argument(func, field(prefix, "soft_cap_percent").c_str(), "0 to 100",
                           std::to_string(o.soft_cap_percent));
  }
  if (o.soft_cap_percent > 0 && o.soft_caps.empty()) {
    detail::throw_argument(func, field(prefix, "soft_caps").c_str(),
                           "a non-empty list of caps (soft_cap_percent > 0)", "an empty list");
  }
  for (std::size_t i = 0; i < o.soft_caps.size(); ++i) {
    if (!(std::isfinite(o.soft_caps[i]) && o.soft_caps[i] > 0.f)) {
      detail::throw_argument(func, element(prefix, "soft_caps", i).c_str(), "a finite cap > 0",
                             show_number(o.soft_caps[i]));
    }
  }
  if (o.window_percent < 0 || o.window_percent > 100) {
    detail::throw_argument(func, field(prefix, "window_percent").c_str(), "0 to 100",
                           std::to_string(o.window_percent));
  }
  check_percent(o.sink_percent, func, prefix, "sink_percent");
  if (!std::isfinite(o.sink_min)) {
    detail::throw_argument(func, field(prefix, "sink_min").c_str(), "a finite sink logit",
                           show_number(o.sink_min));
  }
  if (!(std::isfinite(o.sink_max) && o.sink_max >= o.sink_min)) {
    detail::throw_argument(
        func, field(prefix, "sink_max").c_str(),
        "a finite sink logit >= " + field(prefix, "sink_min") + " = " + show_number(o.sink_min),
        show_number(o.sink_max));
  }
}

void check_state_gen_options(const StateGenOptions& o, const char* func,
                             const std::string& prefix) {
  check_state_extents(o, func, prefix);
  check_dtypes(o.dtypes, func, prefix, "dtypes");
  check_bases(o.bases, func, prefix);
  if (!std::isfinite(o.lse_magnitude)) {
    detail::throw_argument(func, field(prefix, "lse_magnitude").c_str(), "a finite value",
                           show_number(o.lse_magnitude));
  }
}

rc::Gen<StateShape> gen_state_shape(const StateGenOptions& opt) {
  // Only the extents matter here (the dtype and base lists may be anything).
  const char* func = "attnstate::testing::gen_state_shape";
  check_state_extents(opt, func, "options");
  return rc::gen::exec([opt] {
    StateShape s;
    s.tokens = *rc::gen::inRange<std::int64_t>(1, opt.max_tokens + 1);
    s.heads = *rc::gen::inRange<std::int64_t>(1, opt.max_heads + 1);
    s.head_dim = *rc::gen::inRange<std::int64_t>(1, opt.max_head_dim + 1);
    return s;
  });
}

namespace {

/// A shape every state of which can be built: extents >= 0, sizes at most 2^62 (checked here, at
/// the call, rather than when the generator first runs).
void check_shape(const StateShape& shape, const char* func) {
  kit::check_extent(shape.tokens, func, "shape.tokens");
  kit::check_extent(shape.heads, func, "shape.heads");
  kit::check_extent(shape.head_dim, func, "shape.head_dim");
  const std::int64_t extents[3] = {shape.tokens, shape.heads, shape.head_dim};
  if (checked_product(extents, 3) < 0) {
    detail::throw_argument(func, "shape", "at most 2^62 elements",
                           std::to_string(shape.tokens) + " x " + std::to_string(shape.heads) +
                               " x " + std::to_string(shape.head_dim) + " (overflows)");
  }
}

}  // namespace

rc::Gen<HostState> gen_state(const StateShape& shape, const StateGenOptions& opt) {
  check_shape(shape, "attnstate::testing::gen_state");
  check_state_gen_options(opt, "attnstate::testing::gen_state", "options");
  return rc::gen::exec([shape, opt] {
    const DType dt = *pick(opt.dtypes);
    const LseBase base = *pick(opt.bases);
    const auto lses = *rc::gen::container<std::vector<float>>(
        static_cast<std::size_t>(shape.tokens * shape.heads), gen_lse(opt));
    const auto seed = *gen_seed();
    HostState s(shape.tokens, shape.heads, shape.head_dim, dt, base);
    s.lse_values() = lses;
    fill_o(s, seed, opt.nan_in_empty_o);
    return s;
  });
}

rc::Gen<HostState> gen_state(const StateGenOptions& opt) {
  check_state_gen_options(opt, "attnstate::testing::gen_state", "options");
  return rc::gen::mapcat(gen_state_shape(opt),
                         [opt](const StateShape& shape) { return gen_state(shape, opt); });
}

rc::Gen<HostState> gen_empty_state(const StateShape& shape, const StateGenOptions& opt) {
  check_shape(shape, "attnstate::testing::gen_empty_state");
  check_state_gen_options(opt, "attnstate::testing::gen_empty_state", "options");
  return rc::gen::exec([shape, opt] {
    const DType dt = *pick(opt.dtypes);
    const LseBase base = *pick(opt.bases);
    const auto seed = *gen_seed();
    HostState s(shape.tokens, shape.heads, shape.head_dim, dt, base);
    fill_o(s, seed, opt.nan_in_empty_o);
    return s;
  });
}

rc::Gen<std::vector<HostState>> gen_states(int min_count, int max_count,
                                           const StateGenOptions& opt) {
  check_state_gen_options(opt, "attnstate::testing::gen_states", "options");
  return rc::gen::exec([min_count, max_count, opt] {
    const StateShape shape = *gen_state_shape(opt);
    const int lo = min_count < 1 ? 1 : min_count;
    const int n = *rc::gen::inRange(lo, (max_count < lo ? lo : max_count) + 1);
    std::vector<HostState> states;
    states.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) states.push_back(*gen_state(shape, opt));
    return states;
  });
}

rc::Gen<std::vector<std::int64_t>> gen_key_subset(std::int64_t n_keys) {
  kit::check_extent(n_keys, "attnstate::testing::gen_key_subset", "n_keys");
  return rc::gen::map(rc::gen::container<std::vector<bool>>(static_cast<std::size_t>(n_keys),
                                                            rc::gen::arbitrary<bool>()),
                      [](const std::vector<bool>& in) {
                        std::vector<std::int64_t> keys;
                        for (std::size_t i = 0; i < in.size(); ++i) {
                          if (in[i]) keys.push_back(static_cast<std::int64_t>(i));
                        }
                        return keys;
                      });
}

rc::Gen<std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>> gen_disjoint_pair(
    std::int64_t n_keys) {
  kit::check_extent(n_keys, "attnstate::testing::gen_disjoint_pair", "n_keys");
  // Owners drawn at full size: `inRange` scaled by a small test size gives 0 (neither subset)
  // for every key, i.e. two empty subsets in most cases.
  return rc::gen::map(rc::gen::container<std::vector<int>>(static_cast<std::size_t>(n_keys),
                                                           in_full_range<int>(0, 3)),
                      [](const std::vector<int>& owner) {
                        std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> out;
                        for (std::size_t i = 0; i < owner.size(); ++i) {
                          if (owner[i] == 1) out.first.push_back(static_cast<std::int64_t>(i));
                          if (owner[i] == 2) out.second.push_back(static_cast<std::int64_t>(i));
                        }
                        return out;
                      });
}

rc::Gen<std::vector<std::vector<std::int64_t>>> gen_partition(std::int64_t n_keys, int max_parts) {
  kit::check_extent(n_keys, "attnstate::testing::gen_partition", "n_keys");
  const int top = max_parts < 1 ? 1 : max_parts;
  return rc::gen::exec([n_keys, top] {
    // The part count and every key's owner are drawn at full size (uniform whatever the test
    // size, still shrinking towards one part and towards part 0): `inRange` scales its range
    // with the size, so at the small sizes of a property's first cases it would give one part
    // holding every key, and `fn(all)` would be compared with itself.
    const int parts = *in_full_range<int>(1, top + 1);
    const auto owner = *rc::gen::container<std::vector<int>>(static_cast<std::size_t>(n_keys),
                                                             in_full_range<int>(0, parts));
    std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(parts));
    for (std::size_t i = 0; i < owner.size(); ++i) {
      out[static_cast<std::size_t>(owner[i])].push_back(static_cast<std::int64_t>(i));
    }
    return out;
  });
}

ProblemGenOptions variant_problem_options(ProblemGenOptions o) {
  o.soft_cap_percent = 50;
  o.window_percent = 50;
  return o;
}

ProblemGenOptions sink_problem_options(ProblemGenOptions o) {
  o.sink_percent = 50;
  return o;
}

namespace {

/// Draws the query positions and the window of a problem of `tokens` rows over `keys` keys.
void draw_window(AttentionProblem& p, std::int64_t tokens, std::int64_t keys) {
  // The window, shrinking towards none (a causal problem).
  std::int64_t w = kNoWindow;
  switch (*in_full_range<int>(0, 5)) {
    case 1:
      w = 0;  // only the key at the row's position
      break;
    case 2:
      w = *in_full_range<std::int64_t>(1, 9);
      break;
    case 3:
      w = *in_full_range<std::int64_t>(0, keys + 1);
      break;
    case 4:
      w = keys + *in_full_range<std::int64_t>(1, 17);  // larger than the context
      break;
    default:
      break;
  }
  p.variant.window_left = w;
  p.positions.resize(static_cast<std::size_t>(tokens));
  switch (*in_full_range<int>(0, 3)) {
    case 1:  // anywhere around the keys
      for (std::int64_t& x : p.positions) x = *in_full_range<std::int64_t>(-2, keys + 2);
      break;
    case 2:  // every key before the window (or, without a window, every row before them)
      for (std::int64_t& x : p.positions) {
        const std::int64_t r = *in_full_range<std::int64_t>(0, 4);
        x = w == kNoWindow ? -1 - r : keys + w + r;
      }
      break;
    default:  // decode's new tokens: the last `tokens` positions of the keys
      for (std::int64_t t = 0; t < tokens; ++t) {
        p.positions[static_cast<std::size_t>(t)] = keys - tokens + t;
      }
      break;
  }
}

}  // namespace

namespace {

/// The extreme encodings of the fp8 dtype `dt`, as floats: ±largest finite, ±smallest normal,
/// ±smallest subnormal, ±0.
std::vector<float> fp8_extremes(DType dt) {
  const float max = fp8_max(dt);
  const float min_normal = dt == DType::kE4M3 ? 0x1p-6f : 0x1p-14f;
  const float min_sub = dt == DType::kE4M3 ? 0x1p-9f : 0x1p-16f;
  return {max, -max, min_normal, -min_normal, min_sub, -min_sub, 0.f, -0.f};
}

/// Stores `k` and `v` of `p` (drawn in `[-1, 1]`, `k_unit` and `v_unit`) in the fp8 dtype `dt`
/// with scales, and rescales `q` by the largest real `|k|` (see `gen_attention_problem`). Draws
/// the stored amplitude, the extremes and the scales; `rng` gives the positions of the extremes.
void make_fp8_kv(AttentionProblem& p, DType dt, const std::vector<float>& k_unit,
                 const std::vector<float>& v_unit, const ProblemGenOptions& opt,
                 std::mt19937_64& rng) {
  const float amp = *rc::gen::arbitrary<bool>() ? fp8_max(dt) / 2 : 1.f;
  const bool extremes = *in_full_range<int>(0, 100) >= 100 - opt.fp8_extremes_percent;
  const bool per_head = *in_full_range<int>(0, 100) >= 100 - opt.per_head_scale_percent;
  const std::size_t n_scales = per_head ? static_cast<std::size_t>(p.heads_kv()) : 1;
  p.k_scale = *rc::gen::container<std::vector<float>>(n_scales, pick(opt.kv_scales));
  p.v_scale = *rc::gen::container<std::vector<float>>(n_scales, pick(opt.kv_scales));
  const std::vector<float> extreme = fp8_extremes(dt);
  const auto stored = [&](const std::vector<float>& unit) {
    std::vector<float> out(unit.size());
    for (std::size_t i = 0; i < unit.size(); ++i) {
      out[i] = unit[i] * amp;
      if (extremes && rng() % 8 == 0) out[i] = extreme[rng() % extreme.size()];
    }
    return HostTensor::from_floats(dt, p.k.shape(), out);
  };
  p.k = stored(k_unit);
  p.v = stored(v_unit);
  double k_max = 0;
  for (const double x : real_keys(p)) k_max = std::max(k_max, std::fabs(x));
  // scores of the plain problems' magnitude (|q_d k_d| <= 1), q finite in f16 (40 · 256)
  const float f = k_max > 0 ? static_cast<float>(std::min(1.0 / k_max, 256.0)) : 1.f;
  for (std::int64_t i = 0; i < p.q.numel(); ++i) p.q.set(i, p.q.get(i) * f);
  double v_max = 0;
  for (const double x : real_values(p)) v_max = std::max(v_max, std::fabs(x));
  if (p.out_dtype == DType::kF16 && v_max > 65504.0) p.out_dtype = DType::kF32;
}

}  // namespace

ProblemGenOptions fp8_kv_problem_options(ProblemGenOptions o) {
  o.kv_dtypes = {DType::kE4M3, DType::kE5M2};
  return o;
}

ProblemGenOptions decode_problem_options() {
  ProblemGenOptions o;
  o.max_tokens = 8;
  o.max_heads_kv = 2;
  o.group_sizes = {4, 8};
  o.head_dims = {64, 128};
  o.min_keys = 0;
  o.max_keys = 300;
  o.input_dtypes = {DType::kF16, DType::kBF16};
  return o;
}

rc::Gen<AttentionProblem> gen_attention_problem(const ProblemGenOptions& opt) {
  check_problem_gen_options(opt, "attnstate::testing::gen_attention_problem", "options");
  return rc::gen::exec([opt] {
    const std::int64_t tokens = *rc::gen::inRange<std::int64_t>(1, opt.max_tokens + 1);
    const std::int64_t hkv = *rc::gen::inRange<std::int64_t>(1, opt.max_heads_kv + 1);
    const std::int64_t group = *pick(opt.group_sizes);
    const std::int64_t dim = *pick(opt.head_dims);
    // Key counts uniform over the whole range (not growing with the test size): long and short
    // segments are equally interesting; failures still shrink towards min_keys.
    const std::int64_t keys = *in_full_range<std::int64_t>(opt.min_keys, opt.max_keys + 1);
    const DType in_dt = *pick(opt.input_dtypes);
    const DType out_dt = *pick(opt.output_dtypes);
    const LseBase base = *pick(opt.bases);
    // Shrinks towards 0, i.e. towards ordinary logits.
    const bool large = *in_full_range<int>(0, 100) >= 100 - opt.large_logits_percent;
    const bool unit_scale = *rc::gen::arbitrary<bool>();
    const auto seed = *gen_seed();
    // Shrinks towards 0, i.e. towards zero-mean values.
    const bool offset = *in_full_range<int>(0, 100) >= 100 - opt.offset_values_percent;

    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    const float amp = large ? opt.large_logit_factor : 1.f;
    std::vector<float> q(static_cast<std::size_t>(tokens * hkv * group * dim));
    std::vector<float> k(static_cast<std::size_t>(keys * hkv * dim));
    std::vector<float> v(k.size());
    for (float& x : q) x = uni(rng) * amp;
    for (float& x : k) x = uni(rng);
    for (float& x : v) x = uni(rng);
    if (offset) {
      // A mean c in [-0.9, 0.9] per (KV head, element), the spread shrunk to keep |v| <= 1.
      std::vector<float> mean(static_cast<std::size_t>(hkv * dim));
      for (float& c : mean) c = 0.9f * uni(rng);
      for (std::size_t i = 0; i < v.size(); ++i) {
        const float c = mean[i % mean.size()];
        v[i] = c + (1.f - std::fabs(c)) * v[i];
      }
    }
    const float scale = unit_scale ? 1.f : 1.f / std::sqrt(static_cast<float>(dim));
    AttentionProblem p =
        make_problem(tokens, hkv * group, hkv, dim, keys, in_dt, q, k, v, scale, out_dt, base);
    p.large_logits = large;
    p.offset_values = offset;
    p.value_seed = seed;
    // Variants draw only when asked for: a seed's plain problems stay what they were.
    if (opt.soft_cap_percent > 0 && *in_full_range<int>(0, 100) >= 100 - opt.soft_cap_percent) {
      p.variant.logits_soft_cap = *pick(opt.soft_caps);
    }
    if (opt.window_percent > 0 && *in_full_range<int>(0, 100) >= 100 - opt.window_percent) {
      draw_window(p, tokens, keys);
    }
    // Keys and values in their own dtype only when asked for (nothing drawn otherwise).
    if (!opt.kv_dtypes.empty()) {
      const DType kv_dt = *pick(opt.kv_dtypes);
      if (is_fp8(kv_dt)) {
        make_fp8_kv(p, kv_dt, k, v, opt, rng);
      } else if (kv_dt != in_dt) {
        p.k = HostTensor::from_floats(kv_dt, p.k.shape(), k);
        p.v = HostTensor::from_floats(kv_dt, p.v.shape(), v);
      }
    }
    // Sinks last, only when asked for (the rest of the problem is the one drawn without them),
    // from their own stream of the value seed.
    if (opt.sink_percent > 0 && *in_full_range<int>(0, 100) >= 100 - opt.sink_percent) {
      std::mt19937_64 sink_rng(seed ^ 0x51a4c0ffee5eedULL);
      std::uniform_real_distribution<float> in_range(opt.sink_min, opt.sink_max);
      p.sinks.resize(static_cast<std::size_t>(p.heads_q()));
      for (float& s : p.sinks) s = opt.sink_min == opt.sink_max ? opt.sink_min : in_range(sink_rng);
    }
    return p;
  });
}

rc::Gen<PartitionedProblem> gen_partitioned_problem(const ProblemGenOptions& opt, int max_parts) {
  check_problem_gen_options(opt, "attnstate::testing::gen_partitioned_problem", "options");
  return rc::gen::exec([opt, max_parts] {
    PartitionedProblem pp;
    pp.problem = *gen_attention_problem(opt);
    pp.parts = *gen_partition(pp.problem.num_keys(), max_parts);
    return pp;
  });
}

void showValue(const PartitionedProblem& value, std::ostream& os) {
  os << value.problem << ", parts ";
  rc::show(value.parts, os);
}

void showValue(const StateShape& shape, std::ostream& os) {
  os << "(" << shape.tokens << ", " << shape.heads << ", " << shape.head_dim << ")";
}

}  // namespace testing
}  // namespace attnstate
