/// @file merge.hpp
/// @brief CUDA backend: merging attention states (⊕) and rebasing them on the GPU.
///
/// Same operations, argument checks and numerics as `attnstate::cpu` (see cpu/merge.hpp), over
/// views of device memory (`MemorySpace::kDevice`). Every function launches on the caller's
/// stream, never allocates, never synchronises (unless built with `ATTNSTATE_DEBUG_SYNC`), and can
/// be captured in a CUDA graph. Calls run on the current device, which must be the device of the
/// stream and of every pointer; a null stream is the legacy default stream. Any head_dim ≥ 1
/// (16-byte vector access wherever the rows of every `o` allow it, element access otherwise); any
/// number of tokens and heads; o in f32, f16 or bf16, input and output dtypes and LSE bases may
/// differ. Masks, optional output LSEs and stacks of no states as in `cpu/merge.hpp`.
/// `merge_state`, `merge_state_inplace` and `merge_states` also take an fp8 `o` (e4m3, e5m2, with
/// the view's `o_scale`) in the combinations docs/fp8.md lists (one fp8 format per call; for the
/// pairwise merges `a` and `b` of one dtype, or `a` of the output's); others raise `kNotSupported`
/// naming the dtype.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace cuda {

/// `out = a ⊕ b` for every (token, head). `out` may alias `a` or `b` exactly.
/// @param a, b   device states `(tokens, heads, head_dim)`, any dtype and base.
/// @param out    device state of the same shape, written in its own dtype and base; `out.lse`
///               may be null (no LSE written).
/// @param stream the caller's stream.
void merge_state(ConstStateView a, ConstStateView b, StateView out, cudaStream_t stream = nullptr);

/// The masked form: `out = a ⊕ b` for the tokens `mask` selects, `out = a` (converted; an empty
/// row as `(0, -inf)`) for the others (see `cpu::merge_state`).
/// @param a, b   device states `(tokens, heads, head_dim)`, any dtype and base.
/// @param out    device state of the same shape, written in its own dtype and base; `out.lse`
///               may be null (no LSE written).
/// @param mask   device per-token mask of any stride (0 broadcasts one flag), disjoint from `out`.
/// @param stream the caller's stream.
void merge_state(ConstStateView a, ConstStateView b, StateView out, TokenMask mask,
                 cudaStream_t stream = nullptr);

/// `acc = acc ⊕ other` for the tokens the mask selects (every token without a mask).
/// @param acc    device state `(tokens, heads, head_dim)`, updated in its own dtype and base.
/// @param other  device state of the same shape, any dtype and base.
/// @param mask   optional device per-token mask of bytes, any stride (a pointer converts to a
///               contiguous mask; stride 0 broadcasts one flag).
/// @param stream the caller's stream.
void merge_state_inplace(StateView acc, ConstStateView other, TokenMask mask = {},
                         cudaStream_t stream = nullptr);

/// `out[t, h] = ⊕_s states[t, s, h]` for a dense stack `(tokens, S, heads, head_dim)` in either
/// layout (`make_state_stack`) or any strides; S = 0 gives `(0, -inf)`; `out.lse` may be null.
void merge_states(ConstStateStackView states, StateView out, cudaStream_t stream = nullptr);

/// Ragged merge: `out[t, h] = ⊕_{r ∈ [indptr[t], indptr[t+1])} rows[r, h]`.
/// @param rows    device states `(total_rows, heads, head_dim)`.
/// @param out     device state `(tokens, heads, head_dim)`.
/// @param stream  the caller's stream.
/// @param indptr  device array `(out.tokens + 1)`; read on the device, so a graph captured for a
///                maximum `out.tokens` replays for fewer tokens (empty ranges give `(0, -inf)`).
///                Offsets are clamped to `[0, rows.tokens]`, so a bad indptr never reads out of
///                bounds.
void merge_states_ragged(ConstStateView rows, const std::int32_t* indptr, StateView out,
                         cudaStream_t stream = nullptr);

/// Copies `in` to `out` converting the LSE base and the dtype of `o`; an empty row is written as
/// `(0, -inf)`; `out` may be `in` itself.
void rebase(ConstStateView in, StateView out, cudaStream_t stream = nullptr);

/// Makes the rows whose LSE is `+inf` (FlashAttention's mark of a query row without keys) empty
/// states, in place: their LSE becomes `-inf`; `o` and the other rows are not written. See
/// `cpu::mark_empty_rows`.
/// @param state   device state (only its LSEs are read and written).
/// @param stream  the caller's stream.
void mark_empty_rows(StateView state, cudaStream_t stream = nullptr);

}  // namespace cuda
}  // namespace attnstate
