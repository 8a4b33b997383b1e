/// @file attention.hpp
/// @brief CPU backend: the one-pass attention producer `attention_state(q, k, v) -> state`.
#pragma once

#include "attnstate/core/state_view.hpp"
#include "attnstate/core/variant.hpp"

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

/// The same with a score variant: a logits soft cap (`variant.logits_soft_cap > 0`) turns each
/// scaled score into `cap · tanh(s / cap)` (fp32) before the softmax. A sliding window needs
/// key positions, which one segment does not have: `variant.window_left` must be `kNoWindow`
/// (restrict the keys passed instead, or use `decode` / `cascade_attention`).
/// @param q        queries (as above).
/// @param k        keys (as above).
/// @param v        values (as above).
/// @param scale    softmax scale (as above).
/// @param variant  `window_left == kNoWindow`; `logits_soft_cap` 0 (none) or finite and > 0.
/// @param out      state (as above).
/// @throws Error (`kInvalidArgument`) naming the argument on any violation, among them
///         `variant.window_left` (a window) and `variant.logits_soft_cap` (negative, NaN, inf).
void attention_state(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& v,
                     float scale, const AttentionVariant& variant, StateView out);

}  // namespace cpu
}  // namespace attnstate
