/// @file problem.cpp
/// @brief `AttentionProblem` helpers: construction, key selection, output allocation, printing.
#include "attnstate/testing/problem.hpp"

#include <cmath>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>

#include "arg_checks.hpp"
#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"
#include "option_checks.hpp"

namespace attnstate {
namespace testing {

namespace kit {

void check_scales(const std::vector<float>& scales, std::int64_t heads_kv, const char* func,
                  const std::string& name) {
  if (scales.size() > 1 && static_cast<std::int64_t>(scales.size()) != heads_kv) {
    detail::throw_argument(func, name.c_str(),
                           "0, 1 or H_kv = " + std::to_string(heads_kv) + " scales",
                           std::to_string(scales.size()) + " scales");
  }
  for (std::size_t i = 0; i < scales.size(); ++i) {
    if (!(scales[i] > 0.f) || !std::isfinite(scales[i])) {
      detail::throw_argument(func, (name + "[" + std::to_string(i) + "]").c_str(),
                             "a finite scale > 0", show_number(scales[i]));
    }
  }
}

void check_kv_scales(const AttentionProblem& p, const char* func, const char* arg) {
  const std::string a(arg);
  if (!p.has_fp8_kv()) {
    for (const auto* s : {&p.k_scale, &p.v_scale}) {
      if (!s->empty()) {
        detail::throw_argument(
            func, (a + (s == &p.k_scale ? ".k_scale" : ".v_scale")).c_str(),
            std::string("no scales (k and v are ") + to_string(p.k.dtype()) + ", not fp8)",
            std::to_string(s->size()) + " scales");
      }
    }
    return;
  }
  check_scales(p.k_scale, p.k.dim(1), func, a + ".k_scale");
  check_scales(p.v_scale, p.k.dim(1), func, a + ".v_scale");
}

std::vector<double> dequantized(const HostTensor& t, const std::vector<float>& scales,
                                const char* func) {
  std::vector<double> out;
  assign_or_throw(out, t.numel(), 0.0, func, "problem");
  const std::vector<float> stored = t.to_floats();
  const std::int64_t heads = t.dim(1), dim = t.dim(2);
  for (std::size_t i = 0; i < stored.size(); ++i) {
    const std::size_t g = static_cast<std::size_t>((static_cast<std::int64_t>(i) / dim) % heads);
    const double scale = scales.empty() ? 1.0 : scales[scales.size() == 1 ? 0 : g];
    out[i] = static_cast<double>(stored[i]) * scale;
  }
  return out;
}

void check_problem(const AttentionProblem& p, const char* func, const char* arg) {
  const std::string a(arg);
  const auto fail = [&](const char* field, const std::string& what, const std::string& got) {
    detail::throw_argument(func, (a + "." + field).c_str(), what, got);
  };
  if (p.q.rank() != 3)
    fail("q", "a (tokens, H_q, head_dim) tensor", "rank " + std::to_string(p.q.rank()));
  if (p.k.rank() != 3)
    fail("k", "a (num_keys, H_kv, head_dim) tensor", "rank " + std::to_string(p.k.rank()));
  if (p.v.shape() != p.k.shape() || p.v.dtype() != p.k.dtype()) {
    fail("v", "the shape and dtype of k", "another shape or dtype");
  }
  if (p.k.dim(1) < 1) fail("k", "H_kv >= 1", std::to_string(p.k.dim(1)));
  if (p.q.dim(1) < 1 || p.q.dim(1) % p.k.dim(1) != 0) {
    fail("q", "H_q a positive multiple of H_kv = " + std::to_string(p.k.dim(1)),
         "H_q = " + std::to_string(p.q.dim(1)));
  }
  if (p.k.dim(2) != p.q.dim(2)) {
    fail("k", "head_dim " + std::to_string(p.q.dim(2)) + " (q's)",
         "head_dim " + std::to_string(p.k.dim(2)));
  }
  if (is_fp8(p.q.dtype()))
    fail("q", "f32, f16 or bf16 queries (fp8 is for k and v only)", to_string(p.q.dtype()));
  check_kv_scales(p, func, arg);
  check_dtype(p.out_dtype, func, (a + ".out_dtype").c_str());
  check_base(p.base, func, (a + ".base").c_str());
  detail::check_variant(func, (a + ".variant").c_str(), p.variant);
  if (!p.positions.empty() && static_cast<std::int64_t>(p.positions.size()) != p.q.dim(0)) {
    fail("positions", "one position per query row (" + std::to_string(p.q.dim(0)) + ") or none",
         std::to_string(p.positions.size()) + " positions");
  }
  if (p.positions.empty() && p.variant.window_left != kNoWindow) {
    fail("positions", "one position per query row (variant.window_left is set)", "none");
  }
  if (!p.key_positions.empty() && static_cast<std::int64_t>(p.key_positions.size()) != p.k.dim(0)) {
    fail("key_positions", "one position per key (" + std::to_string(p.k.dim(0)) + ") or none",
         std::to_string(p.key_positions.size()) + " positions");
  }
  if (!p.sinks.empty() && static_cast<std::int64_t>(p.sinks.size()) != p.q.dim(1)) {
    fail("sinks",
         "one sink logit per query head (H_q = " + std::to_string(p.q.dim(1)) + ") or none",
         std::to_string(p.sinks.size()) + " logits");
  }
  for (std::size_t h = 0; h < p.sinks.size(); ++h) {
    // -inf is a head without a sink (the identity); +inf and NaN are no state's LSE
    if (std::isnan(p.sinks[h]) || p.sinks[h] == INFINITY) {
      fail(("sinks[" + std::to_string(h) + "]").c_str(), "a finite sink logit (or -inf: none)",
           show_number(p.sinks[h]));
    }
  }
}

bool sees(const AttentionProblem& p, std::int64_t token, std::int64_t key) {
  if (p.positions.empty()) return true;
  const std::int64_t at = p.positions[static_cast<std::size_t>(token)];
  const std::int64_t kp =
      p.key_positions.empty() ? key : p.key_positions[static_cast<std::size_t>(key)];
  return kp <= at && kp >= window_begin(at, p.variant.window_left);
}

void check_keys(const std::vector<std::int64_t>& keys, std::int64_t num_keys, const char* func,
                const char* arg) {
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] < 0 || keys[i] >= num_keys) {
      detail::throw_argument(func, (std::string(arg) + "[" + std::to_string(i) + "]").c_str(),
                             "a key index in [0, " + std::to_string(num_keys) + ")",
                             std::to_string(keys[i]));
    }
  }
}

}  // namespace kit

namespace {

float scale_at(const AttentionProblem& p, const std::vector<float>& scales, std::int64_t g,
               const char* func, const char* name) {
  kit::check_index(g, p.heads_kv(), func, "g");
  kit::check_scales(scales, p.heads_kv(), func, name);
  return scales.empty() ? 1.f : scales[scales.size() == 1 ? 0 : static_cast<std::size_t>(g)];
}

}  // namespace

float AttentionProblem::k_scale_at(std::int64_t g) const {
  return scale_at(*this, k_scale, g, "attnstate::testing::AttentionProblem::k_scale_at", "k_scale");
}

float AttentionProblem::v_scale_at(std::int64_t g) const {
  return scale_at(*this, v_scale, g, "attnstate::testing::AttentionProblem::v_scale_at", "v_scale");
}

std::vector<double> real_keys(const AttentionProblem& problem) {
  const char* fn = "attnstate::testing::real_keys";
  kit::check_problem(problem, fn, "problem");
  return kit::dequantized(problem.k, problem.k_scale, fn);
}

std::vector<double> real_values(const AttentionProblem& problem) {
  const char* fn = "attnstate::testing::real_values";
  kit::check_problem(problem, fn, "problem");
  return kit::dequantized(problem.v, problem.v_scale, fn);
}

AttentionProblem quantize_kv(const AttentionProblem& problem, DType kv_dtype,
                             std::vector<float> k_scale, std::vector<float> v_scale) {
  const char* fn = "attnstate::testing::quantize_kv";
  kit::check_problem(problem, fn, "problem");
  if (!is_fp8(kv_dtype)) {
    detail::throw_argument(fn, "kv_dtype", "e4m3 or e5m2",
                           is_valid(kv_dtype)
                               ? std::string(to_string(kv_dtype))
                               : "value " + std::to_string(static_cast<int>(kv_dtype)));
  }
  kit::check_scales(k_scale, problem.heads_kv(), fn, "k_scale");
  kit::check_scales(v_scale, problem.heads_kv(), fn, "v_scale");
  const std::vector<double> k = kit::dequantized(problem.k, problem.k_scale, fn);
  const std::vector<double> v = kit::dequantized(problem.v, problem.v_scale, fn);
  AttentionProblem out = problem;
  out.k = HostTensor(kv_dtype, problem.k.shape());
  out.v = HostTensor(kv_dtype, problem.v.shape());
  const std::int64_t heads = problem.heads_kv(), dim = problem.head_dim();
  const auto scale = [heads, dim](const std::vector<float>& s, std::size_t i) {
    const std::size_t g = static_cast<std::size_t>((static_cast<std::int64_t>(i) / dim) % heads);
    return s.empty() ? 1.0 : static_cast<double>(s[s.size() == 1 ? 0 : g]);
  };
  for (std::size_t i = 0; i < k.size(); ++i) {
    out.k.set(static_cast<std::int64_t>(i), static_cast<float>(k[i] / scale(k_scale, i)));
    out.v.set(static_cast<std::int64_t>(i), static_cast<float>(v[i] / scale(v_scale, i)));
  }
  out.k_scale = std::move(k_scale);
  out.v_scale = std::move(v_scale);
  return out;
}

std::int64_t key_position(const AttentionProblem& problem, std::int64_t key) {
  const char* fn = "attnstate::testing::key_position";
  kit::check_problem(problem, fn, "problem");
  kit::check_index(key, problem.num_keys(), fn, "key");
  return problem.key_positions.empty() ? key : problem.key_positions[static_cast<std::size_t>(key)];
}

std::vector<std::int64_t> visible_keys(const AttentionProblem& problem, std::int64_t token,
                                       const std::vector<std::int64_t>& keys) {
  const char* fn = "attnstate::testing::visible_keys";
  kit::check_problem(problem, fn, "problem");
  kit::check_index(token, problem.tokens(), fn, "token");
  kit::check_keys(keys, problem.num_keys(), fn, "keys");
  std::vector<std::int64_t> out;
  for (std::int64_t key : keys) {
    if (kit::sees(problem, token, key)) out.push_back(key);
  }
  return out;
}

AttentionProblem make_problem(std::int64_t tokens, std::int64_t heads_q, std::int64_t heads_kv,
                              std::int64_t head_dim, std::int64_t num_keys, DType dtype,
                              const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, float scale, DType out_dtype,
                              LseBase base) {
  const char* fn = "attnstate::testing::make_problem";
  kit::check_extent(tokens, fn, "tokens");
  kit::check_extent(num_keys, fn, "num_keys");
  if (heads_kv <= 0) detail::throw_argument(fn, "heads_kv", ">= 1", std::to_string(heads_kv));
  if (heads_q <= 0 || heads_q % heads_kv != 0) {
    detail::throw_argument(
        fn, "heads_q", "a positive multiple of heads_kv",
        std::to_string(heads_q) + " (heads_kv " + std::to_string(heads_kv) + ")");
  }
  if (head_dim <= 0) detail::throw_argument(fn, "head_dim", ">= 1", std::to_string(head_dim));
  kit::check_dtype(dtype, fn, "dtype");
  kit::check_dtype(out_dtype, fn, "out_dtype");
  kit::check_base(base, fn, "base");
  // Each buffer's size against its shape, overflow-checked, naming the buffer.
  const auto check_values = [fn](const std::vector<float>& values, const char* name,
                                 std::int64_t rows, std::int64_t heads, std::int64_t dim) {
    const std::int64_t extents[3] = {rows, heads, dim};
    const std::int64_t n = checked_product(extents, 3);
    if (n < 0) {
      detail::throw_argument(fn, name, "a shape of at most 2^62 elements",
                             std::to_string(rows) + " x " + std::to_string(heads) + " x " +
                                 std::to_string(dim) + " (overflows)");
    }
    if (static_cast<std::int64_t>(values.size()) != n) {
      detail::throw_argument(fn, name,
                             std::to_string(n) + " values (" + std::to_string(rows) + " x " +
                                 std::to_string(heads) + " x " + std::to_string(dim) + ")",
                             std::to_string(values.size()));
    }
  };
  check_values(q, "q", tokens, heads_q, head_dim);
  check_values(k, "k", num_keys, heads_kv, head_dim);
  check_values(v, "v", num_keys, heads_kv, head_dim);
  AttentionProblem p;
  p.q = HostTensor::from_floats(dtype, {tokens, heads_q, head_dim}, q);
  p.k = HostTensor::from_floats(dtype, {num_keys, heads_kv, head_dim}, k);
  p.v = HostTensor::from_floats(dtype, {num_keys, heads_kv, head_dim}, v);
  p.scale = scale;
  p.out_dtype = out_dtype;
  p.base = base;
  return p;
}

AttentionProblem select_keys(const AttentionProblem& problem,
                             const std::vector<std::int64_t>& keys) {
  const char* fn = "attnstate::testing::select_keys";
  kit::check_problem(problem, fn, "problem");
  kit::check_keys(keys, problem.num_keys(), fn, "keys");
  const std::int64_t n = static_cast<std::int64_t>(keys.size());
  const std::int64_t row = problem.heads_kv() * problem.head_dim();  // within k: checked
  AttentionProblem out;
  out.q = problem.q;
  out.k = HostTensor(problem.k.dtype(), {n, problem.heads_kv(), problem.head_dim()});
  out.v = HostTensor(problem.v.dtype(), {n, problem.heads_kv(), problem.head_dim()});
  const std::size_t row_bytes = static_cast<std::size_t>(row) * size_of(problem.k.dtype());
  for (std::int64_t i = 0; i < n; ++i) {
    const std::size_t key = static_cast<std::size_t>(keys[static_cast<std::size_t>(i)]);
    const std::size_t dst = static_cast<std::size_t>(i) * row_bytes;
    const auto* ks = static_cast<const unsigned char*>(problem.k.data()) + key * row_bytes;
    const auto* vs = static_cast<const unsigned char*>(problem.v.data()) + key * row_bytes;
    std::copy(ks, ks + row_bytes, static_cast<unsigned char*>(out.k.data()) + dst);
    std::copy(vs, vs + row_bytes, static_cast<unsigned char*>(out.v.data()) + dst);
  }
  out.k_scale = problem.k_scale;
  out.v_scale = problem.v_scale;
  out.scale = problem.scale;
  out.out_dtype = problem.out_dtype;
  out.base = problem.base;
  out.large_logits = problem.large_logits;
  out.offset_values = problem.offset_values;
  out.value_seed = problem.value_seed;
  out.variant = problem.variant;
  out.sinks = problem.sinks;
  out.positions = problem.positions;
  if (!problem.positions.empty()) {
    // the selected keys keep their positions (the window is measured in the original keys)
    out.key_positions.resize(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      out.key_positions[i] = problem.key_positions.empty()
                                 ? keys[i]
                                 : problem.key_positions[static_cast<std::size_t>(keys[i])];
    }
  }
  return out;
}

AttentionProblem without_sinks(const AttentionProblem& problem) {
  kit::check_problem(problem, "attnstate::testing::without_sinks", "problem");
  AttentionProblem out = problem;
  out.sinks.clear();
  return out;
}

HostState make_output_state(const AttentionProblem& problem) {
  kit::check_problem(problem, "attnstate::testing::make_output_state", "problem");
  HostState s(problem.tokens(), problem.heads_q(), problem.head_dim(), problem.out_dtype,
              problem.base);
  s.poison();
  return s;
}

std::vector<std::int64_t> all_keys(std::int64_t n) {
  std::vector<std::int64_t> keys;
  kit::assign_or_throw<std::int64_t>(keys, n > 0 ? n : 0, 0, "attnstate::testing::all_keys", "n");
  for (std::int64_t i = 0; i < n; ++i) keys[static_cast<std::size_t>(i)] = i;
  return keys;
}

std::ostream& operator<<(std::ostream& os, const AttentionProblem& p) {
  os << "AttentionProblem(tokens=" << p.tokens() << ", H_q=" << p.heads_q()
     << ", H_kv=" << p.heads_kv() << ", head_dim=" << p.head_dim() << ", keys=" << p.num_keys();
  if (p.k.dtype() == p.q.dtype()) {
    os << ", qkv " << to_string(p.q.dtype());
  } else {
    os << ", q " << to_string(p.q.dtype()) << ", kv " << to_string(p.k.dtype());
  }
  const auto scales = [&os](const char* name, const std::vector<float>& s) {
    if (s.empty()) return;
    os << ", " << name << " {";
    for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
    os << "}";
  };
  scales("k_scale", p.k_scale);
  scales("v_scale", p.v_scale);
  os << ", out " << to_string(p.out_dtype) << ", base " << to_string(p.base)
     << ", scale=" << p.scale << (p.large_logits ? ", large logits" : "")
     << (p.offset_values ? ", offset values" : "") << ", value_seed=" << p.value_seed;
  if (p.variant.logits_soft_cap != 0.f) os << ", soft_cap=" << p.variant.logits_soft_cap;
  scales("sinks", p.sinks);
  if (!p.positions.empty()) {
    if (p.variant.window_left != kNoWindow) os << ", window_left=" << p.variant.window_left;
    os << ", positions {";
    for (std::size_t i = 0; i < p.positions.size(); ++i) os << (i ? ", " : "") << p.positions[i];
    os << "}";
    if (!p.key_positions.empty()) {
      os << ", key_positions {";
      for (std::size_t i = 0; i < p.key_positions.size(); ++i)
        os << (i ? ", " : "") << p.key_positions[i];
      os << "}";
    }
  }
  os << ")";
  return os;
}

void showValue(const AttentionProblem& problem, std::ostream& os) { os << problem; }

}  // namespace testing
}  // namespace attnstate
