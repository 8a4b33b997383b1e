/// @file problem.cpp
/// @brief `AttentionProblem` helpers: construction, key selection, output allocation, printing.
#include "attnstate/testing/problem.hpp"

#include <ostream>
#include <string>

#include "attnstate/core/error.hpp"

namespace attnstate {
namespace testing {

AttentionProblem make_problem(std::int64_t tokens, std::int64_t heads_q, std::int64_t heads_kv,
                              std::int64_t head_dim, std::int64_t num_keys, DType dtype,
                              const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, float scale, DType out_dtype,
                              LseBase base) {
  const char* fn = "make_problem";
  if (heads_kv <= 0 || heads_q <= 0 || heads_q % heads_kv != 0) {
    detail::throw_argument(
        fn, "heads_q", "a positive multiple of heads_kv",
        std::to_string(heads_q) + " (heads_kv " + std::to_string(heads_kv) + ")");
  }
  if (head_dim <= 0) detail::throw_argument(fn, "head_dim", ">= 1", std::to_string(head_dim));
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
  const std::int64_t n = static_cast<std::int64_t>(keys.size());
  const std::int64_t row = problem.heads_kv() * problem.head_dim();
  AttentionProblem out;
  out.q = problem.q;
  out.k = HostTensor(problem.k.dtype(), {n, problem.heads_kv(), problem.head_dim()});
  out.v = HostTensor(problem.v.dtype(), {n, problem.heads_kv(), problem.head_dim()});
  const std::size_t row_bytes = static_cast<std::size_t>(row) * size_of(problem.k.dtype());
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t key = keys[static_cast<std::size_t>(i)];
    if (key < 0 || key >= problem.num_keys()) {
      detail::throw_argument("select_keys", "keys",
                             "indices in [0, " + std::to_string(problem.num_keys()) + ")",
                             std::to_string(key));
    }
    const auto* ks = static_cast<const unsigned char*>(problem.k.data()) + key * row_bytes;
    const auto* vs = static_cast<const unsigned char*>(problem.v.data()) + key * row_bytes;
    std::copy(ks, ks + row_bytes, static_cast<unsigned char*>(out.k.data()) + i * row_bytes);
    std::copy(vs, vs + row_bytes, static_cast<unsigned char*>(out.v.data()) + i * row_bytes);
  }
  out.scale = problem.scale;
  out.out_dtype = problem.out_dtype;
  out.base = problem.base;
  out.large_logits = problem.large_logits;
  out.offset_values = problem.offset_values;
  out.value_seed = problem.value_seed;
  return out;
}

HostState make_output_state(const AttentionProblem& problem) {
  HostState s(problem.tokens(), problem.heads_q(), problem.head_dim(), problem.out_dtype,
              problem.base);
  s.poison();
  return s;
}

std::vector<std::int64_t> all_keys(std::int64_t n) {
  std::vector<std::int64_t> keys(static_cast<std::size_t>(n > 0 ? n : 0));
  for (std::int64_t i = 0; i < n; ++i) keys[static_cast<std::size_t>(i)] = i;
  return keys;
}

std::ostream& operator<<(std::ostream& os, const AttentionProblem& p) {
  os << "AttentionProblem(tokens=" << p.tokens() << ", H_q=" << p.heads_q()
     << ", H_kv=" << p.heads_kv() << ", head_dim=" << p.head_dim() << ", keys=" << p.num_keys()
     << ", qkv " << to_string(p.q.dtype()) << ", out " << to_string(p.out_dtype) << ", base "
     << to_string(p.base) << ", scale=" << p.scale << (p.large_logits ? ", large logits" : "")
     << (p.offset_values ? ", offset values" : "") << ", value_seed=" << p.value_seed << ")";
  return os;
}

void showValue(const AttentionProblem& problem, std::ostream& os) { os << problem; }

}  // namespace testing
}  // namespace attnstate
