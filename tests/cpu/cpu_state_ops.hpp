/// @file cpu_state_ops.hpp
/// @brief Thin wrappers that run the CPU backend on `HostState`s for the property tests:
///        pairwise, stacked (both dense layouts) and ragged merges, and attention over a key
///        subset.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/merge.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/problem.hpp"

namespace attnstate_prop {

using attnstate::DType;
using attnstate::LseBase;
using attnstate::testing::AttentionProblem;
using attnstate::testing::HostState;

/// A poisoned (NaN) output state shaped like `like`, stored in `dtype` and `base`.
inline HostState output_like(const HostState& like, DType dtype, LseBase base) {
  HostState out(like.tokens(), like.heads(), like.head_dim(), dtype, base);
  out.poison();
  return out;
}

/// `a ⊕ b` with `cpu::merge_state`, written in `dtype` and `base`.
inline HostState merge_pair(const HostState& a, const HostState& b, DType dtype, LseBase base) {
  HostState out = output_like(a, dtype, base);
  attnstate::cpu::merge_state(a.view(), b.view(), out.view());
  return out;
}

/// `⊕ states` with `cpu::merge_states` over a dense stack in `order`. Every state must share one
/// shape, dtype and base (a stack view has one of each).
inline HostState merge_stack(const std::vector<HostState>& states, attnstate::StackOrder order,
                             DType dtype, LseBase base) {
  const HostState& s0 = states.front();
  const std::int64_t tokens = s0.tokens(), heads = s0.heads(), dim = s0.head_dim();
  const std::int64_t n = static_cast<std::int64_t>(states.size());
  attnstate::testing::HostTensor o(s0.dtype(), {n * tokens * heads * dim});
  std::vector<float> lse(static_cast<std::size_t>(n * tokens * heads));
  const std::size_t elem = attnstate::size_of(s0.dtype());
  for (std::int64_t s = 0; s < n; ++s) {
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t row = order == attnstate::StackOrder::kTokensMajor
                                     ? (t * n + s) * heads + h
                                     : (s * tokens + t) * heads + h;
        lse[static_cast<std::size_t>(row)] = states[s].lse(t, h);
        std::memcpy(static_cast<unsigned char*>(o.data()) + row * dim * elem,
                    static_cast<const unsigned char*>(states[s].o_tensor().data()) +
                        (t * heads + h) * dim * elem,
                    static_cast<std::size_t>(dim) * elem);
      }
    }
  }
  HostState out = output_like(s0, dtype, base);
  attnstate::cpu::merge_states(attnstate::make_state_stack(o.data(), s0.dtype(), lse.data(), order,
                                                           tokens, n, heads, dim, s0.base()),
                               out.view());
  return out;
}

/// `⊕ states` for a single-token shape with `cpu::merge_states_ragged` (one output token whose
/// rows are the states), checking the ragged path against the others.
inline HostState merge_ragged_one_token(const std::vector<HostState>& states, DType dtype,
                                        LseBase base) {
  const HostState& s0 = states.front();
  const std::int64_t n = static_cast<std::int64_t>(states.size());
  HostState rows(n, s0.heads(), s0.head_dim(), s0.dtype(), s0.base());
  const std::size_t row_bytes =
      static_cast<std::size_t>(s0.heads() * s0.head_dim()) * attnstate::size_of(s0.dtype());
  for (std::int64_t s = 0; s < n; ++s) {
    std::memcpy(static_cast<unsigned char*>(rows.o_tensor().data()) + s * row_bytes,
                states[s].o_tensor().data(), row_bytes);
    for (std::int64_t h = 0; h < s0.heads(); ++h) rows.set_lse(s, h, states[s].lse(0, h));
  }
  HostState out(1, s0.heads(), s0.head_dim(), dtype, base);
  out.poison();
  const std::int32_t indptr[2] = {0, static_cast<std::int32_t>(n)};
  attnstate::cpu::merge_states_ragged(rows.view(), indptr, out.view());
  return out;
}

/// `cpu::attention_state` of `problem` over `keys`, in the problem's output dtype and base.
inline HostState attention(const AttentionProblem& problem, const std::vector<std::int64_t>& keys) {
  const AttentionProblem sub = attnstate::testing::select_keys(problem, keys);
  HostState out = attnstate::testing::make_output_state(problem);
  attnstate::cpu::attention_state(sub.q.view(), sub.k.view(), sub.v.view(), problem.scale,
                                  out.view());
  return out;
}

}  // namespace attnstate_prop
