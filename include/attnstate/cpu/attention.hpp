/// @file attention.hpp
/// @brief CPU backend: the one-pass attention producer `attention_state(q, k, v) -> state`.
#pragma once

#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace cpu {

/// The attention state of query rows over one KV segment, in one pass (fp32 accumulation).
///
/// For every query token `t` and query head `h` (KV head `h / (H_q / H_kv)`, GQA):
/// `s_i = scale · q[t,h]·k[i,g]`, `o = Σ softmax(s)_i v[i,g]`, `lse = log_b Σ e^{s_i}`.
/// An empty segment (`T == 0`) yields the empty state `(0, -inf)`.
///
/// @param q      queries `(tokens, H_q, head_dim)`, f32/f16/bf16, host, last dim contiguous.
/// @param k      keys `(T, H_kv, head_dim)`, same head_dim, `H_q % H_kv == 0`.
/// @param v      values, same shape and dtype as `k`.
/// @param scale  softmax scale, finite; 0 means `1/sqrt(head_dim)` (as in every options struct).
/// @param out    state `(tokens, H_q, head_dim)`; written in its own dtype and base; rows
///               pairwise disjoint, memory disjoint from `q`, `k` and `v`.
/// @throws Error (`kInvalidArgument`) naming the argument on any violation.
void attention_state(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                     float scale, StateView out);

}  // namespace cpu
}  // namespace attnstate
