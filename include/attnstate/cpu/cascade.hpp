/// @file cascade.hpp
/// @brief Cascade (shared-prefix) attention on the CPU (the reference); the level types are in
///        `attnstate/core/cascade.hpp`.
#pragma once

#include <cstdint>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace cpu {

/// Cascade attention on the CPU: for every request `b`, new token `t` and query head `h`, the
/// state of `q[b, t, h]` over the concatenation of the request's segments at every level, each
/// level computed as its own state and the levels merged with ⊕ (fp32 accumulation).
///
/// @param q           queries `(batch, q_len, H_q, head_dim)`, f32/f16/bf16, host memory, last
///                    dim contiguous; `1 ≤ q_len ≤ kMaxCascadeQueryLen`, `H_q % H_kv == 0`.
/// @param kv          the paged pool: `k`, `v`, `dtype` (f32/f16/bf16, or fp8 e4m3/e5m2 read as
///                    `stored · k_scale.at(h)` / `v_scale.at(h)`, see `KvScale`), `k_scale`,
///                    `v_scale` (the default unless fp8), `layout`, `num_pages`, `page_size`,
///                    `heads_kv`, `head_dim`, `page_stride` are read; its page-table fields
///                    (`page_indptr`, `block_table`, `seq_lens`, `batch`) are ignored.
/// @param levels      `num_levels` level descriptions (host arrays), see `CascadeLevel`.
/// @param num_levels  `1 ≤ num_levels ≤ kMaxCascadeLevels`.
/// @param options     scale, causal masking and variant: a sliding window measured over the
///                    request's concatenated keys (`CascadeOptions::variant`; a segment no row
///                    of an item sees is not read) and a soft cap on the scaled scores.
/// @param out         state `(batch · q_len, H_q, head_dim)`, token `b · q_len + t`; written in
///                    its own dtype and base. A request with no keys gets `(0, -inf)`. Its
///                    memory must be disjoint from `q`, both KV pools and every level array.
///                    A batch of 0 requests is a no-op (the levels are not read).
/// @throws Error `kInvalidArgument` naming the argument on a null pointer, a shape or stride
///         mismatch, a non-monotone or out-of-range indptr, a page index outside the pool, a
///         segment longer than its pages, a non-host view, or a bad variant
///         (`options.variant.window_left < -1`, a negative or non-finite
///         `options.variant.logits_soft_cap`), a scale of `kv` that is not finite and > 0 or
///         set for a pool that is not fp8 (`kv.k_scale`, `kv.v_scale.value`, ...);
///         `kNotSupported` naming `q.dtype` for fp8 queries.
void cascade_attention(const ConstTensorView& q, const PagedKvCache& kv, const CascadeLevel* levels,
                       int num_levels, const CascadeOptions& options, StateView out);

/// Cascade attention with attention sinks, fused into the final merge: after the levels of a
/// row `(token, h)` are merged, that row is merged once with the sink state
/// `(0, sinks.logits[h])` (fp32, in `out`'s base, as `merge_state_inplace` with
/// `make_sink_state` would), so `out` holds the state of the keys of every level plus the sink,
/// its LSE included; no level's partial state carries the sink. A request with no keys gets
/// `(0, sinks.logits[h])`. `sinks.none()`: exactly the overload above.
/// @param q           queries (as above).
/// @param kv          the paged pool (as above).
/// @param levels      `num_levels` level descriptions (as above).
/// @param num_levels  `1 ≤ num_levels ≤ kMaxCascadeLevels`.
/// @param options     scale, causal masking and variant (as above).
/// @param sinks       `H_q` fp32 natural-base logits in host memory (a raw pointer: the CPU
///                    backend reads it; device memory is not detected), 4-byte aligned, every
///                    one finite; or `none()` (a null pointer) for no sinks.
/// @param out         state `(batch · q_len, H_q, head_dim)` (as above); its memory must also be
///                    disjoint from the logits. A batch of 0 requests is a no-op (the logits are
///                    still checked).
/// @throws Error `kInvalidArgument` naming the argument on any violation (as above), among them
///         `sinks.logits` (misaligned), `sinks.logits[h]` (NaN, +inf or -inf: "expected a finite
///         logit") and `out.o` / `out.lse` over the logits; `kNotSupported` as above.
void cascade_attention(const ConstTensorView& q, const PagedKvCache& kv, const CascadeLevel* levels,
                       int num_levels, const CascadeOptions& options, const AttentionSinks& sinks,
                       StateView out);

}  // namespace cpu
}  // namespace attnstate
