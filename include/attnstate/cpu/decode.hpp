/// @file decode.hpp
/// @brief CPU backend: split-KV decode over a paged KV cache in host memory (the reference of the
///        CUDA decode, and usable on its own). Multi-threaded over (request, KV head, split).
///
/// Same problem and split layouts as `attnstate::cuda` (see core/decode_split.hpp): every split is
/// an attention state computed with `math::OnlineSoftmax` in fp32 over blocks of 16 keys, and the
/// splits of a request are merged in split order with the max-subtracted merge. Queries may be
/// f32, f16 or bf16 and KV f32, f16, bf16 or fp8 (e4m3, e5m2), independently. An fp8 element of KV
/// head `h` is read as `to_float(stored) · kv.k_scale.at(h)` (`kv.v_scale` for V), rounded once to
/// fp32 (`KvScale`, docs/fp8.md); the scales are read on the host.
#pragma once

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/core/variant.hpp"

namespace attnstate {
namespace cpu {

/// Split-KV decode with an explicit split layout (e.g. the one of a CUDA `DecodePlan`).
///
/// Row `i` of request `b` (the `i`-th of its `q_len` new tokens, which are the last `q_len` of
/// its `seq_lens[b]` keys) attends to keys `[0, seq_lens[b] − q_len + i]`; when
/// `seq_lens[b] < q_len` the first `q_len − seq_lens[b]` rows see no key and get `(0, -inf)`.
///
/// @param q       host queries `(batch, q_len, heads_q, head_dim)`, last dim contiguous,
///                f32/f16/bf16; `q_len` 1..8, `heads_q % kv.heads_kv == 0`.
/// @param kv      host paged cache (`kv.space == kHost`), f32/f16/bf16/e4m3/e5m2, CSR or block
///                table, `seq_lens ≥ 0` within the pages of each request, page ids inside the
///                pool; `k_scale`, `v_scale` finite and > 0 for fp8 (pointed-to scales in host
///                memory), the default for other dtypes.
/// @param splits  the split layout (`max_splits ≥ 1`; `kFixedCount` or `kFixedSize`).
/// @param scale   softmax scale, finite; 0 means `1/sqrt(head_dim)`.
/// @param out     host state `(batch·q_len, heads_q, head_dim)` (token `b·q_len + i`), any dtype
///                and base.
/// @throws Error (`kInvalidArgument`) naming the argument on any violation (e.g.
///         `kv.k_scale.value`, `kv.v_scale.data[3]`); `kNotSupported` naming `q.dtype` for fp8
///         queries.
void decode(const ConstTensorView& q, const PagedKvCache& kv, const SplitLayout& splits,
            float scale, StateView out);

/// Split-KV decode with an explicit split layout and a score variant.
///
/// Row `i` of request `b` is at position `p = seq_lens[b] − q_len + i` and sees the keys
/// `[max(0, p − variant.window_left), p]` (all of `[0, p]` with `kNoWindow`); a row whose
/// window holds no key gets `(0, -inf)`. A split no row of its request sees is the empty state
/// and is not computed. A soft cap turns each scaled score `s` into `cap · tanh(s / cap)` (fp32)
/// before the softmax.
/// @param q        host queries (as above).
/// @param kv       host paged cache (as above).
/// @param splits   the split layout (as above).
/// @param scale    softmax scale, finite; 0 means `1/sqrt(head_dim)`.
/// @param variant  `window_left ≥ -1` (`kNoWindow`); `logits_soft_cap` 0 or finite and > 0.
/// @param out      host state (as above).
/// @throws Error (`kInvalidArgument`) naming the argument on any violation, among them
///         `variant.window_left` and `variant.logits_soft_cap`.
void decode(const ConstTensorView& q, const PagedKvCache& kv, const SplitLayout& splits,
            float scale, const AttentionVariant& variant, StateView out);

/// Split-KV decode with a split policy: the layout is planned with `plan_split_layout` from the
/// host `kv.seq_lens`, with the worker threads as the slots of `kAuto`.
/// @param q        host queries `(batch, q_len, heads_q, head_dim)` (as above).
/// @param kv       host paged cache (as above).
/// @param options  scale (0 → `1/sqrt(head_dim)`), split policy and variant (window and soft
///                 cap, as in the overload above).
/// @param out      host state `(batch·q_len, heads_q, head_dim)`, any dtype and base.
/// @throws Error (`kInvalidArgument`) naming the argument on any violation, among them
///         `options.variant.window_left` and `options.variant.logits_soft_cap`.
void decode(const ConstTensorView& q, const PagedKvCache& kv, const DecodeOptions& options,
            StateView out);

/// Split-KV decode with a split policy and attention sinks, fused into the final merge: after
/// the splits of a row `(token, h)` are merged, that row is merged once with the sink state
/// `(0, sinks.logits[h])` (fp32, in `out`'s base, as `merge_state_inplace` with
/// `make_sink_state` would), so `out` holds the state of the keys plus the sink, its LSE
/// included; no split's partial state carries the sink. A row that sees no key gets
/// `(0, sinks.logits[h])` (its LSE in `out`'s base). `sinks.none()`: exactly the overload above.
/// @param q        host queries `(batch, q_len, heads_q, head_dim)` (as above).
/// @param kv       host paged cache (as above).
/// @param options  scale, split policy and variant (as above).
/// @param sinks    `heads_q` fp32 natural-base logits in host memory (a raw pointer: the CPU
///                 backend reads it; device memory is not detected), 4-byte aligned, every one
///                 finite; or `none()` (a null pointer) for no sinks.
/// @param out      host state `(batch·q_len, heads_q, head_dim)`, any dtype and base; its memory
///                 must be disjoint from the logits (and from every input, as above).
/// @throws Error (`kInvalidArgument`) naming the argument on any violation (as above), among
///         them `sinks.logits` (misaligned), `sinks.logits[h]` (NaN, +inf or -inf: "expected a
///         finite logit") and `out.o` / `out.lse` over the logits.
void decode(const ConstTensorView& q, const PagedKvCache& kv, const DecodeOptions& options,
            const AttentionSinks& sinks, StateView out);

}  // namespace cpu
}  // namespace attnstate
