/// @file merge.hpp
/// @brief CPU backend: merging attention states (⊕), and rebasing them. Multi-threaded.
///
/// All functions take views of host memory (`MemorySpace::kHost`), validate every argument
/// before touching memory and throw `attnstate::Error` naming the offending argument. Inputs and
/// outputs may use different dtypes and different LSE bases: inputs are converted on load, the
/// result is written in the output view's dtype and base, rounded once.
///
/// fp8 `o` (e4m3, e5m2; docs/fp8.md): `merge_state`, `merge_state_inplace` and `merge_states`
/// take an fp8 `o` on any input and on the output, in any combination with the other dtypes. An
/// fp8 input is read as `stored × o_scale`; an fp8 output is written as the saturating
/// round-to-nearest-even of `value / o_scale`; LSEs stay fp32. The other functions take no fp8
/// `o` (`kNotSupported`, naming the dtype).
#pragma once

#include <cstdint>

#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace cpu {

/// `out = a ⊕ b` for every (token, head); with a mask, `out = a ⊕ b` for the tokens it selects
/// and `out = a` (converted to out's dtype and base; an empty row as `(0, -inf)`) for the others.
///
/// @param a     state `(tokens, heads, head_dim)`, any dtype and base, any head_dim ≥ 1.
/// @param b     state of the same shape, any dtype and base.
/// @param out   state of the same shape; written in its own dtype and base. May alias `a` or `b`
///              exactly (same pointers and strides), not partially. `out.lse` may be null: then
///              no LSE is written (vLLM's and SGLang's `output_lse=None`).
/// @param mask  optional per-token mask of any stride (0 broadcasts one flag); disjoint from
///              `out`.
/// @throws Error (`kInvalidArgument`) on a null pointer, a shape mismatch, a bad stride, a
///         non-host view, or an `o_scale` that is not 1 for a non-fp8 `o` or not finite and
///         positive for an fp8 one.
void merge_state(ConstStateView a, ConstStateView b, StateView out, TokenMask mask = {});

/// `acc = acc ⊕ other` for every (token, head) whose token the mask selects (all tokens
/// without a mask).
///
/// @param acc    state `(tokens, heads, head_dim)`, updated in place in its own dtype and base.
/// @param other  state of the same shape, any dtype and base.
/// @param mask   optional per-token mask of any stride (a pointer converts to a contiguous one;
///               stride 0 broadcasts one flag); tokens it leaves out are not written.
void merge_state_inplace(StateView acc, ConstStateView other, TokenMask mask = {});

/// `out[t, h] = ⊕_s states[t, s, h]`: merges `num_states` states per (token, head).
///
/// @param states  a stack `(tokens, S, heads, head_dim)` in either dense layout (see
///                `make_state_stack`) or any strides; S ≥ 0 (S = 0 gives the empty state
///                `(0, -inf)` in every row, as FlashInfer's merge of no states does).
/// @param out     state `(tokens, heads, head_dim)`; `out.lse` may be null (no LSE written).
void merge_states(ConstStateStackView states, StateView out);

/// Ragged merge: `out[t, h] = ⊕_{r ∈ [indptr[t], indptr[t+1])} rows[r, h]`. A token with no
/// rows gets the empty state `(0, -inf)`.
///
/// @param rows    states `(total_rows, heads, head_dim)`.
/// @param indptr  `(out.tokens + 1)` non-decreasing row offsets, `indptr[0] ≥ 0` and
///                `indptr[out.tokens] ≤ rows.tokens`.
/// @param out     state `(tokens, heads, head_dim)`; `out.lse` may be null (no LSE written).
void merge_states_ragged(ConstStateView rows, const std::int32_t* indptr, StateView out);

/// Copies `in` to `out`, converting the LSE to `out.base` and `o` to `out.dtype`. An empty row
/// (LSE `-inf`) is written as the empty state `(0, -inf)`, whatever its `o` held. `out` may be
/// `in` itself (same pointers and strides): then only the LSEs and the `o` of empty rows are
/// rewritten.
void rebase(ConstStateView in, StateView out);

/// Makes the rows whose LSE is `+inf` empty states: their LSE becomes `-inf` (their `o` is left
/// as it is; an empty state's `o` is never read). Other rows are unchanged. FlashAttention marks
/// a query row that saw no keys with `lse = +inf`, which the merges treat as invalid input (the
/// merged row is NaN): call this on such states before merging them.
///
/// @param state  host state, rewritten in place (only its LSEs are read and written; `o` may be
///               null).
void mark_empty_rows(StateView state);

/// Most threads `set_num_threads` accepts.
inline constexpr int kMaxThreads = 256;

/// Number of threads (the pool's workers plus the caller) the CPU backend uses: the last value
/// given to `set_num_threads`, else the hardware concurrency capped at `kMaxThreads`.
int num_threads();
/// Sets the number of threads, `1 ≤ n ≤ kMaxThreads`; `0` restores the default. The workers
/// start at the next call that runs in parallel; if the system cannot start them, that call
/// throws `Error` (`kResourceExhausted`) and leaves no thread behind.
/// @throws Error (`kInvalidArgument`) naming `n` when it is outside `[0, kMaxThreads]`.
void set_num_threads(int n);

}  // namespace cpu
}  // namespace attnstate
