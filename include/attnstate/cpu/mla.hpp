/// @file mla.hpp
/// @brief CPU backend: split-KV decode of multi-head latent attention (MLA, absorbed form) over
///        a paged latent cache in host memory (`MlaKvCache`, core/mla.hpp): the reference of the
///        CUDA MLA decode, and usable on its own. Multi-threaded over (request, split, row tile).
///
/// Each request has `heads` query heads; row `(token, h)` scores every token it sees as
/// `scale · (q_nope · ckv + q_pe · kpe)` and its state is `(o, lse)` with `o` the softmax-weighted
/// sum of the tokens' `ckv` (`kv_lora_rank` wide: 512 for DeepSeek-V3). It is `cpu::decode` with
/// one KV head shared by all query heads, keys `[ckv, kpe]` and values `ckv`, and the same split
/// layouts (core/decode_split.hpp): every split is an attention state computed with
/// `math::OnlineSoftmax` in fp32 over blocks of 16 keys, the splits of a request merged in split
/// order with the max-subtracted merge. Queries f32, f16 or bf16; each part of the cache f32,
/// f16, bf16 or fp8 (e4m3, e5m2; read as `to_float(stored) · scale`, rounded once to fp32).
///
/// The output is an ordinary state `(batch·q_len, heads, kv_lora_rank)` in any dtype and LSE
/// base, so it merges with `merge_states`, the cascade's levels and the context-parallel merge.
#pragma once

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace cpu {

/// MLA decode with an explicit split layout (e.g. the one of a CUDA plan).
///
/// Row `i` of request `b` (the `i`-th of its `q_len` new tokens, the last `q_len` of its
/// `seq_lens[b]` keys) attends to keys `[0, seq_lens[b] − q_len + i]`; when `seq_lens[b] < q_len`
/// the first `q_len − seq_lens[b]` rows see no key and get `(0, -inf)`.
///
/// @param q_nope  host latent queries `(batch, q_len, heads, kv.kv_lora_rank)`, last dim
///                contiguous, f32/f16/bf16; `q_len` 1..8, `heads ≥ 1`. Any other strides (≥ 0):
///                a FlashMLA query `(batch, q_len, heads, 576)` is the view of its first 512
///                columns.
/// @param q_pe    host rotary queries `(batch, q_len, heads, kv.rope_dim)`, the dtype of
///                `q_nope`, last dim contiguous (FlashMLA's: the view at column 512).
/// @param kv      host latent cache (`kv.space == kHost`): valid dtypes, strides and scales (fp8
///                per-tensor scales finite and > 0, pointed-to scales in host memory; the
///                default for other dtypes), CSR or block table, `seq_lens ≥ 0` within the pages
///                of each request, page ids inside the pool.
/// @param splits  the split layout (`max_splits ≥ 1`; `kFixedCount` or `kFixedSize`).
/// @param scale   softmax scale, finite; 0 means `1/sqrt(kv_lora_rank + rope_dim)` (1/24 at
///                576; DeepSeek-V3 passes its own, `mscale² / sqrt(192)`).
/// @param out     host state `(batch·q_len, heads, kv_lora_rank)` (token `b·q_len + i`), any
///                dtype and base, disjoint from every input.
/// @throws Error (`kInvalidArgument`) naming the argument on any violation (e.g.
///         `q_pe.shape[3]`, `kv.ckv_token_stride`, `kv.kpe_scale.value`, `out.head_dim`);
///         `kNotSupported` naming `q_nope.dtype` for fp8 queries.
void mla_decode(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                const SplitLayout& splits, float scale, StateView out);

/// MLA decode with a split policy: the layout is planned with `plan_split_layout` from the host
/// `kv.seq_lens`, with the worker threads as the slots of `kAuto`.
/// @param q_nope   host latent queries (as above).
/// @param q_pe     host rotary queries (as above).
/// @param kv       host latent cache (as above).
/// @param options  scale (0 → `1/sqrt(kv_lora_rank + rope_dim)`) and split policy; the variant
///                 must be plain attention (MLA takes no window or soft cap: `kNotSupported`
///                 naming `options.variant`); the CUDA-only fields are ignored.
/// @param out      host state `(batch·q_len, heads, kv_lora_rank)`, any dtype and base.
/// @throws Error (`kInvalidArgument`) naming the argument on any violation (as above).
void mla_decode(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                const DecodeOptions& options, StateView out);

/// MLA decode with a split policy and attention sinks, fused into the final merge as in
/// `cpu::decode`: after the splits of a row `(token, h)` are merged, the row is merged once
/// with the sink state `(0, sinks.logits[h])`, so `out` holds the state of the keys plus the
/// sink (its LSE included); no split's partial state carries the sink. A row that sees no key
/// gets `(0, sinks.logits[h])`. `sinks.none()`: exactly the overload above.
/// @param q_nope   host latent queries (as above).
/// @param q_pe     host rotary queries (as above).
/// @param kv       host latent cache (as above).
/// @param options  scale and split policy (as above).
/// @param sinks    `heads` fp32 natural-base logits in host memory, 4-byte aligned, every one
///                 finite; or `none()`.
/// @param out      host state (as above), disjoint from the logits too.
/// @throws Error (`kInvalidArgument`) naming the argument on any violation, among them
///         `sinks.logits[h]` ("expected a finite logit").
void mla_decode(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                const DecodeOptions& options, const AttentionSinks& sinks, StateView out);

/// MLA decode with an explicit split layout and attention sinks (as the overload above).
/// @param q_nope  host latent queries (as above).
/// @param q_pe    host rotary queries (as above).
/// @param kv      host latent cache (as above).
/// @param splits  the split layout (as above).
/// @param scale   softmax scale (as above).
/// @param sinks   the sinks (as above), or `none()`.
/// @param out     host state (as above).
/// @throws Error (`kInvalidArgument`) naming the argument on any violation (as above).
void mla_decode(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                const SplitLayout& splits, float scale, const AttentionSinks& sinks, StateView out);

/// MLA cascade (shared latent prefixes): the latent tokens of every request are cut into levels
/// of segments over one page pool (`CascadeLevel`, core/cascade.hpp, as the GQA cascade takes
/// them: each request uses one segment per level, many requests may share one), and each row's
/// state is the ⊕ of its states over its segments in level order, equal to `mla_decode` over
/// the concatenation of the request's segments to rounding. A shared segment is read once per
/// tile of 64 rows of the requests sharing it (its blocks of 16 tokens loaded once for them).
///
/// With `options.causal`, row `i` of a request (the `i`-th of its `q_len` new tokens, the last
/// `q_len` of its last-level segment) sees every token of its earlier levels and the last-level
/// tokens `[0, len − q_len + i]`, as `mla_decode` over the concatenated keys; without it every
/// row sees every token. Each level's state is fp32 with a base-2 LSE; the levels are merged in
/// level order with the max-subtracted merge, and the sinks once after them.
///
/// @param q_nope      host latent queries `(batch, q_len, heads, kv.kv_lora_rank)` (as
///                    `mla_decode`; `q_len` 1..8).
/// @param q_pe        host rotary queries `(batch, q_len, heads, kv.rope_dim)` (as `mla_decode`).
/// @param kv          host latent pool: its parts, dtypes, strides, scales, `num_pages` and
///                    `page_size` are read; its page-table fields (`page_indptr`,
///                    `page_indices`, `block_table`, `seq_lens`, `batch`) are ignored.
/// @param levels      `num_levels` levels of host arrays (see `CascadeLevel`), each
///                    `request_indptr` ending at `batch`, page ids inside the pool, segments
///                    within their pages; with `causal` and `q_len > 1`, every last-level
///                    segment in use holds at least `q_len − 1` tokens.
/// @param num_levels  1..`kMaxCascadeLevels`.
/// @param options     scale (0 → `1/sqrt(kv_lora_rank + rope_dim)`) and `causal`; the variant
///                    must be plain (`kNotSupported` naming `options.variant`).
/// @param sinks       `heads` fp32 natural-base logits in host memory, each finite, merged once
///                    into every row after all its levels; or `none()`.
/// @param out         host state `(batch·q_len, heads, kv_lora_rank)` (token `b·q_len + i`), any
///                    dtype and base, disjoint from every input and level array. A request with
///                    no keys gets `(0, -inf)` (`(0, sinks.logits[h])` with sinks). A batch of 0
///                    is a no-op (the levels are not read).
/// @throws Error (`kInvalidArgument`) naming the argument on any violation (e.g.
///         `levels[1].request_indptr`, `levels[0].page_indices`, `q_pe.shape[2]`,
///         `out.head_dim`, `sinks.logits[h]`); `kNotSupported` naming `q_nope.dtype` for fp8
///         queries or `options.variant` for a window or soft cap.
void mla_cascade(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                 const CascadeLevel* levels, int num_levels, const CascadeOptions& options,
                 const AttentionSinks& sinks, StateView out);

/// `mla_cascade` without sinks (exactly the overload above with `AttentionSinks{}`).
/// @param q_nope      host latent queries (as above).
/// @param q_pe        host rotary queries (as above).
/// @param kv          host latent pool (as above).
/// @param levels      the levels (as above).
/// @param num_levels  1..`kMaxCascadeLevels`.
/// @param options     scale and causal masking (as above).
/// @param out         host state (as above).
/// @throws Error as above.
void mla_cascade(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                 const CascadeLevel* levels, int num_levels, const CascadeOptions& options,
                 StateView out);

}  // namespace cpu
}  // namespace attnstate
