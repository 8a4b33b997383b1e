/// @file reference.cpp
/// @brief The double-precision reference: attention over a key subset and the ⊕ merge.
#include "attnstate/testing/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "arg_checks.hpp"
#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"
#include "reference_rows.hpp"

namespace attnstate {
namespace testing {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kLn2 = 0.69314718055994530942;
constexpr double kLog2e = 1.44269504088896340736;

double convert(double lse, LseBase from, LseBase to) {
  if (from == to) return lse;
  return from == LseBase::kNatural ? lse * kLog2e : lse * kLn2;
}

ReferenceState make_empty(std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                          LseBase base) {
  ReferenceState r;
  r.tokens = tokens;
  r.heads = heads;
  r.head_dim = head_dim;
  r.base = base;
  r.o.assign(static_cast<std::size_t>(tokens * heads * head_dim), 0.0);
  r.lse.assign(static_cast<std::size_t>(tokens * heads), kNegInf);
  r.o_magnitude.assign(r.o.size(), 0.0);
  return r;
}

}  // namespace

namespace kit {

void check_reference(const ReferenceState& r, const char* func, const char* arg) {
  const std::string a(arg);
  check_extent(r.tokens, func, (a + ".tokens").c_str());
  check_extent(r.heads, func, (a + ".heads").c_str());
  check_extent(r.head_dim, func, (a + ".head_dim").c_str());
  check_base(r.base, func, (a + ".base").c_str());
  const std::int64_t extents[3] = {r.tokens, r.heads, r.head_dim};
  const std::int64_t rows = checked_product(extents, 2), elems = checked_product(extents, 3);
  if (rows < 0 || elems < 0) {
    detail::throw_argument(func, (a + ".head_dim").c_str(), "a shape of at most 2^62 elements",
                           std::to_string(r.tokens) + " x " + std::to_string(r.heads) + " x " +
                               std::to_string(r.head_dim) + " (overflows)");
  }
  const auto check_size = [&](std::size_t size, std::int64_t want, const char* field) {
    if (static_cast<std::int64_t>(size) != want) {
      detail::throw_argument(func, (a + "." + field).c_str(),
                             std::to_string(want) + " values (its shape's)", std::to_string(size));
    }
  };
  check_size(r.o.size(), elems, "o");
  check_size(r.lse.size(), rows, "lse");
  if (!r.o_magnitude.empty()) check_size(r.o_magnitude.size(), elems, "o_magnitude");
}

}  // namespace kit

ReferenceState to_reference(const HostState& s) {
  ReferenceState r = make_empty(s.tokens(), s.heads(), s.head_dim(), s.base());
  r.o_magnitude.clear();  // unknown: a stored value says nothing about how it was computed
  for (std::int64_t i = 0; i < s.o_tensor().numel(); ++i) {
    r.o[static_cast<std::size_t>(i)] = s.o_tensor().get(i);
  }
  for (std::size_t i = 0; i < s.lse_values().size(); ++i) r.lse[i] = s.lse_values()[i];
  return r;
}

ReferenceState rebased(const ReferenceState& state, LseBase base) {
  kit::check_base(state.base, "attnstate::testing::rebased", "state.base");
  kit::check_base(base, "attnstate::testing::rebased", "base");
  ReferenceState r = state;
  for (double& x : r.lse) x = convert(x, state.base, base);
  r.base = base;
  return r;
}

namespace {

/// The problem's values, read once per reference: `q` as stored, `k` and `v` as real values
/// (fp8 elements times their scales, exact in double).
kit::RowValues problem_values(const AttentionProblem& p) {
  kit::RowValues pv;
  pv.q = p.q.to_floats();
  pv.k = kit::dequantized(p.k, p.k_scale, "attnstate::testing::reference_state");
  pv.v = kit::dequantized(p.v, p.v_scale, "attnstate::testing::reference_state");
  pv.hq = p.heads_q();
  pv.hkv = p.heads_kv();
  pv.k_dim = p.head_dim();
  pv.v_dim = p.head_dim();
  pv.group = p.group_size();
  pv.scale = p.scale;
  pv.cap = p.variant.logits_soft_cap;
  return pv;
}

}  // namespace

namespace kit {

ReferenceState empty_reference(std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                               LseBase base) {
  return make_empty(tokens, heads, head_dim, base);
}

void attend_row(const RowValues& pv, const std::vector<std::int64_t>& keys, std::int64_t t,
                std::int64_t h, std::vector<double>& s, ReferenceState& r) {
  const std::int64_t k_dim = pv.k_dim, dim = pv.v_dim, g = h / pv.group;
  s.resize(keys.size());
  const float* qr = &pv.q[static_cast<std::size_t>((t * pv.hq + h) * k_dim)];
  double m = kNegInf;
  bool nan = false;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const double* kr = &pv.k[static_cast<std::size_t>((keys[i] * pv.hkv + g) * k_dim)];
    double dot = 0;
    for (std::int64_t d = 0; d < k_dim; ++d) dot += static_cast<double>(qr[d]) * kr[d];
    s[i] = static_cast<double>(pv.scale) * dot;
    if (pv.cap != 0) s[i] = pv.cap * std::tanh(s[i] / pv.cap);  // on the scaled score
    if (std::isnan(s[i])) nan = true;
    m = std::max(m, s[i]);
  }
  double* o = &r.o[static_cast<std::size_t>((t * pv.hq + h) * dim)];
  double* mag = &r.o_magnitude[static_cast<std::size_t>((t * pv.hq + h) * dim)];
  double& lse = r.lse[static_cast<std::size_t>(t * pv.hq + h)];
  if (nan) {
    std::fill(o, o + dim, std::numeric_limits<double>::quiet_NaN());
    std::fill(mag, mag + dim, std::numeric_limits<double>::quiet_NaN());
    lse = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  double sum = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const double w = std::exp(s[i] - m);
    sum += w;
    const double* vr = &pv.v[static_cast<std::size_t>((keys[i] * pv.hkv + g) * dim)];
    for (std::int64_t d = 0; d < dim; ++d) {
      o[d] += w * vr[d];
      mag[d] += w * std::fabs(vr[d]);
    }
  }
  for (std::int64_t d = 0; d < dim; ++d) {
    o[d] /= sum;
    mag[d] /= sum;
  }
  lse = convert(m + std::log(sum), LseBase::kNatural, r.base);
}

}  // namespace kit

ReferenceState reference_state(const AttentionProblem& p, const std::vector<std::int64_t>& keys,
                               LseBase base) {
  const char* fn = "attnstate::testing::reference_state";
  kit::check_problem(p, fn, "problem");
  kit::check_keys(keys, p.num_keys(), fn, "keys");
  kit::check_base(base, fn, "base");
  ReferenceState r = make_empty(p.tokens(), p.heads_q(), p.head_dim(), base);
  if (keys.empty()) return apply_sinks(r, p.sinks);
  const kit::RowValues pv = problem_values(p);
  std::vector<double> s;
  std::vector<std::int64_t> row_keys;
  for (std::int64_t t = 0; t < p.tokens(); ++t) {
    const std::vector<std::int64_t>* seen = &keys;
    if (p.has_positions()) {  // the row's window of keys
      row_keys.clear();
      for (std::int64_t key : keys) {
        if (kit::sees(p, t, key)) row_keys.push_back(key);
      }
      if (row_keys.empty()) continue;  // (0, -inf)
      seen = &row_keys;
    }
    for (std::int64_t h = 0; h < pv.hq; ++h) kit::attend_row(pv, *seen, t, h, s, r);
  }
  return apply_sinks(r, p.sinks);  // once, after every key (none: r unchanged)
}

ReferenceState reference_state_per_token(const AttentionProblem& p,
                                         const std::vector<std::vector<std::int64_t>>& keys,
                                         LseBase base) {
  const char* fn = "attnstate::testing::reference_state_per_token";
  kit::check_problem(p, fn, "problem");
  kit::check_keys_per_token(keys, p.tokens(), p.num_keys(), fn);
  kit::check_base(base, fn, "base");
  ReferenceState r = make_empty(p.tokens(), p.heads_q(), p.head_dim(), base);
  const kit::RowValues pv = problem_values(p);
  std::vector<double> s;
  std::vector<std::int64_t> visible;
  for (std::int64_t t = 0; t < p.tokens(); ++t) {
    const std::vector<std::int64_t>* row_keys = &keys[static_cast<std::size_t>(t)];
    if (p.has_positions()) {  // the row's window of its keys
      visible.clear();
      for (std::int64_t key : *row_keys) {
        if (kit::sees(p, t, key)) visible.push_back(key);
      }
      row_keys = &visible;
    }
    if (row_keys->empty()) continue;  // (0, -inf)
    for (std::int64_t h = 0; h < pv.hq; ++h) kit::attend_row(pv, *row_keys, t, h, s, r);
  }
  return apply_sinks(r, p.sinks);  // once, after every key of the row
}

ReferenceState reference_state(const AttentionProblem& problem,
                               const std::vector<std::int64_t>& keys) {
  kit::check_base(problem.base, "attnstate::testing::reference_state", "problem.base");
  return reference_state(problem, keys, problem.base);
}

ReferenceState reference_merge(const std::vector<ReferenceState>& states, LseBase base) {
  const char* fn = "attnstate::testing::reference_merge";
  if (states.empty()) detail::throw_argument(fn, "states", "at least one state", "an empty list");
  kit::check_base(base, fn, "base");
  const ReferenceState& first = states.front();
  for (std::size_t i = 0; i < states.size(); ++i) {
    const std::string name = "states[" + std::to_string(i) + "]";
    kit::check_reference(states[i], fn, name.c_str());
    const ReferenceState& s = states[i];
    if (s.tokens != first.tokens || s.heads != first.heads || s.head_dim != first.head_dim) {
      detail::throw_argument(fn, name.c_str(),
                             "the shape of states[0] (" + std::to_string(first.tokens) + ", " +
                                 std::to_string(first.heads) + ", " +
                                 std::to_string(first.head_dim) + ")",
                             "(" + std::to_string(s.tokens) + ", " + std::to_string(s.heads) +
                                 ", " + std::to_string(s.head_dim) + ")");
    }
  }
  ReferenceState r = make_empty(first.tokens, first.heads, first.head_dim, base);
  // Magnitudes only when every input has them (a stored input's says nothing about the terms
  // its o was computed from).
  const bool with_magnitude = std::all_of(
      states.begin(), states.end(), [](const ReferenceState& s) { return s.has_o_magnitude(); });
  if (!with_magnitude) r.o_magnitude.clear();
  const std::int64_t rows = first.tokens * first.heads, dim = first.head_dim;
  std::vector<double> lse(states.size());
  for (std::int64_t row = 0; row < rows; ++row) {
    double m = kNegInf;
    bool nan = false;
    for (std::size_t i = 0; i < states.size(); ++i) {
      // Work in natural log: the conversion is exact enough in double.
      lse[i] =
          convert(states[i].lse[static_cast<std::size_t>(row)], states[i].base, LseBase::kNatural);
      if (std::isnan(lse[i])) nan = true;
      m = std::max(m, lse[i]);
    }
    double* o = &r.o[static_cast<std::size_t>(row * dim)];
    double* mag = with_magnitude ? &r.o_magnitude[static_cast<std::size_t>(row * dim)] : nullptr;
    if (nan) {
      std::fill(o, o + dim, std::numeric_limits<double>::quiet_NaN());
      if (mag) std::fill(mag, mag + dim, std::numeric_limits<double>::quiet_NaN());
      r.lse[static_cast<std::size_t>(row)] = std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (m == kNegInf) continue;  // all empty: (0, -inf)
    double sum = 0;
    for (std::size_t i = 0; i < states.size(); ++i) {
      if (lse[i] == kNegInf) continue;  // an empty input's o is never read
      const double w = std::exp(lse[i] - m);
      sum += w;
      const std::size_t off = static_cast<std::size_t>(row * dim);
      const double* oi = &states[i].o[off];
      for (std::int64_t d = 0; d < dim; ++d) o[d] += w * oi[d];
      if (with_magnitude) {
        const double* mi = &states[i].o_magnitude[off];
        for (std::int64_t d = 0; d < dim; ++d) mag[d] += w * mi[d];
      }
    }
    for (std::int64_t d = 0; d < dim; ++d) o[d] /= sum;
    if (mag) {
      for (std::int64_t d = 0; d < dim; ++d) mag[d] /= sum;
    }
    r.lse[static_cast<std::size_t>(row)] = convert(m + std::log(sum), LseBase::kNatural, base);
  }
  return r;
}

ReferenceState reference_merge(const std::vector<HostState>& states, LseBase base) {
  std::vector<ReferenceState> refs;
  refs.reserve(states.size());
  for (const HostState& s : states) refs.push_back(to_reference(s));
  return reference_merge(refs, base);
}

namespace {

/// Throws naming `sinks[h]` unless every logit is finite or -inf (a head without a sink).
void check_sink_values(const std::vector<float>& sinks, const char* func) {
  for (std::size_t h = 0; h < sinks.size(); ++h) {
    if (std::isnan(sinks[h]) || sinks[h] == std::numeric_limits<float>::infinity()) {
      detail::throw_argument(func, ("sinks[" + std::to_string(h) + "]").c_str(),
                             "a finite sink logit (or -inf: none)", std::to_string(sinks[h]));
    }
  }
}

}  // namespace

ReferenceState reference_sink_state(const std::vector<float>& sinks, std::int64_t tokens,
                                    std::int64_t head_dim, LseBase base) {
  const char* fn = "attnstate::testing::reference_sink_state";
  if (sinks.empty()) detail::throw_argument(fn, "sinks", "one logit per head", "none");
  check_sink_values(sinks, fn);
  kit::check_extent(tokens, fn, "tokens");
  kit::check_extent(head_dim, fn, "head_dim");
  kit::check_base(base, fn, "base");
  const std::int64_t heads = static_cast<std::int64_t>(sinks.size());
  const std::int64_t extents[3] = {tokens, heads, head_dim};
  if (checked_product(extents, 3) < 0) {
    detail::throw_argument(fn, "head_dim", "a shape of at most 2^62 elements",
                           std::to_string(tokens) + " x " + std::to_string(heads) + " x " +
                               std::to_string(head_dim) + " (overflows)");
  }
  ReferenceState r = make_empty(tokens, heads, head_dim, base);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < heads; ++h) {
      r.lse[static_cast<std::size_t>(t * heads + h)] =
          convert(sinks[static_cast<std::size_t>(h)], LseBase::kNatural, base);
    }
  }
  return r;
}

ReferenceState apply_sinks(const ReferenceState& state, const std::vector<float>& sinks) {
  const char* fn = "attnstate::testing::apply_sinks";
  kit::check_reference(state, fn, "state");
  if (sinks.empty()) return state;
  if (static_cast<std::int64_t>(sinks.size()) != state.heads) {
    detail::throw_argument(
        fn, "sinks",
        "one logit per head of the state (" + std::to_string(state.heads) + ") or none",
        std::to_string(sinks.size()) + " logits");
  }
  check_sink_values(sinks, fn);
  // The sink is a state: applying it is one merge (its o_magnitude is 0, so the state's
  // magnitudes are scaled by the same weight as its o).
  return reference_merge(
      {state, reference_sink_state(sinks, state.tokens, state.head_dim, state.base)}, state.base);
}

double max_abs_score(const AttentionProblem& p) {
  kit::check_problem(p, "attnstate::testing::max_abs_score", "problem");
  const std::vector<float> q = p.q.to_floats();
  const std::vector<double> k =
      kit::dequantized(p.k, p.k_scale, "attnstate::testing::max_abs_score");
  const std::int64_t hq = p.heads_q(), hkv = p.heads_kv(), dim = p.head_dim();
  const std::int64_t group = p.group_size();
  double best = 0;
  for (std::int64_t t = 0; t < p.tokens(); ++t) {
    for (std::int64_t h = 0; h < hq; ++h) {
      const float* qr = &q[static_cast<std::size_t>((t * hq + h) * dim)];
      for (std::int64_t i = 0; i < p.num_keys(); ++i) {
        const double* kr = &k[static_cast<std::size_t>((i * hkv + h / group) * dim)];
        double acc = 0;
        for (std::int64_t d = 0; d < dim; ++d) acc += std::fabs(static_cast<double>(qr[d]) * kr[d]);
        best = std::max(best, std::fabs(static_cast<double>(p.scale)) * acc);
      }
    }
  }
  return best;
}

}  // namespace testing
}  // namespace attnstate
