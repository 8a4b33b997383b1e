/// @file problem.cpp
/// @brief `AttentionProblem` helpers: construction, key selection, output allocation, printing.
#include "attnstate/testing/problem.hpp"

#include <ostream>
#include <string>

#include "arg_checks.hpp"
#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"

namespace attnstate {
namespace testing {

namespace kit {

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
  out.scale = problem.scale;
  out.out_dtype = problem.out_dtype;
  out.base = problem.base;
  out.large_logits = problem.large_logits;
  out.offset_values = problem.offset_values;
  out.value_seed = problem.value_seed;
  out.variant = problem.variant;
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
     << ", H_kv=" << p.heads_kv() << ", head_dim=" << p.head_dim() << ", keys=" << p.num_keys()
     << ", qkv " << to_string(p.q.dtype()) << ", out " << to_string(p.out_dtype) << ", base "
     << to_string(p.base) << ", scale=" << p.scale << (p.large_logits ? ", large logits" : "")
     << (p.offset_values ? ", offset values" : "") << ", value_seed=" << p.value_seed;
  if (p.variant.logits_soft_cap != 0.f) os << ", soft_cap=" << p.variant.logits_soft_cap;
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
