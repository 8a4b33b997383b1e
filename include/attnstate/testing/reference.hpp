/// @file reference.hpp
/// @brief The double-precision reference: attention states of a key subset and the ⊕ merge,
///        computed in double from the exact stored values (fp8 keys and values dequantised:
///        stored × scale, exact in double).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/problem.hpp"

namespace attnstate {
namespace testing {

/// A state in double precision: `o (tokens, heads, head_dim)` and `lse (tokens, heads)`,
/// row-major, LSEs in `base`. The empty row is `(0, -inf)`.
///
/// `o_magnitude`, when present, gives for every element of `o` the magnitude its rounding errors
/// scale with: for an attention state, `Σ_i w_i |v_i[d]|` over its keys (`w_i` the softmax
/// weights, so `|o[d]| ≤ o_magnitude[d] ≤ max |v|`). A kernel that rounds the probabilities `P`
/// (or any term of the sum `o = Σ_i w_i v_i`) with relative error `u` errs by at most
/// `u · o_magnitude`, however much the terms cancel in `o`. `compare_states` uses it with
/// `Tolerance::o_magnitude_rel`.
struct ReferenceState {
  std::int64_t tokens = 0;           ///< Number of tokens.
  std::int64_t heads = 0;            ///< Heads per token.
  std::int64_t head_dim = 0;         ///< Elements of `o` per (token, head).
  LseBase base = LseBase::kNatural;  ///< Base of `lse`.
  std::vector<double> o;             ///< `(tokens, heads, head_dim)`.
  std::vector<double> lse;           ///< `(tokens, heads)`.
  std::vector<double> o_magnitude;   ///< Same shape as `o`, or empty when unknown (a state
                                     ///< widened from storage by `to_reference`).

  /// `o[t, h, d]`.
  /// @param t  token; @param h  head; @param d  element.
  /// @return the value.
  /// @throws attnstate::Error (`kInvalidArgument`) naming the index out of range, or `this`
  ///         when `o` is shorter than the shape says.
  double o_at(std::int64_t t, std::int64_t h, std::int64_t d) const {
    return o[element(t, h, d, "attnstate::testing::ReferenceState::o_at")];
  }
  /// @return whether `o_magnitude` is present (one value per element of `o`).
  bool has_o_magnitude() const { return !o.empty() && o_magnitude.size() == o.size(); }
  /// `lse[t, h]`.
  /// @param t  token; @param h  head.
  /// @return the LSE, in `base`.
  /// @throws attnstate::Error (`kInvalidArgument`) as `o_at`.
  double lse_at(std::int64_t t, std::int64_t h) const {
    return lse[row_index(t, h, "attnstate::testing::ReferenceState::lse_at")];
  }

 private:
  // Bounds-checked flat indices (a ReferenceState may be built by hand, its vectors shorter than
  // its shape, its extents anything): each index in range, the flat index overflow-checked and
  // inside the vector.
  static void check_index(std::int64_t i, std::int64_t n, const char* func, const char* arg) {
    if (i < 0 || i >= n) {
      detail::throw_argument(func, arg, "an index in [0, " + std::to_string(n) + ")",
                             std::to_string(i));
    }
  }
  static std::size_t inside(std::int64_t i, std::size_t size, const char* func) {
    if (i < 0 || static_cast<std::size_t>(i) >= size) {
      detail::throw_argument(func, "this", "storage as large as the state's shape",
                             std::to_string(size) + " values");
    }
    return static_cast<std::size_t>(i);
  }
  std::int64_t row(std::int64_t t, std::int64_t h, const char* func) const {
    check_index(t, tokens, func, "t");
    check_index(h, heads, func, "h");
    std::int64_t r = -1;
    return checked_mul_add(t, heads, h, &r) ? r : -1;
  }
  std::size_t row_index(std::int64_t t, std::int64_t h, const char* func) const {
    return inside(row(t, h, func), lse.size(), func);
  }
  std::size_t element(std::int64_t t, std::int64_t h, std::int64_t d, const char* func) const {
    check_index(d, head_dim, func, "d");
    const std::int64_t r = row(t, h, func);
    std::int64_t e = -1;
    if (r < 0 || !checked_mul_add(r, head_dim, d, &e)) e = -1;
    return inside(e, o.size(), func);
  }
};

/// The exact widening of a stored state to double (same base).
/// @param state  the stored state.
/// @return its values in double, same shape and base, without `o_magnitude`.
ReferenceState to_reference(const HostState& state);

/// The same state with its LSEs converted to `base` (in double; ±inf and NaN preserved).
/// @param state  the state.
/// @param base   the base wanted.
/// @return the state with `lse` in `base` (`o` unchanged).
ReferenceState rebased(const ReferenceState& state, LseBase base);

/// The attention state of `problem`'s queries over the keys `keys`, in double: the state a
/// kernel should return for `problem` and `keys`, its sinks included.
///
/// For each query token `t` and head `h` (KV head `g = h / group_size`): scores
/// `s_i = scale · Σ_d q[t,h,d] k[i,g,d]` over the keys `i ∈ keys` the row sees, `k` and `v` the
/// real values (`real_keys`, `real_values`: an fp8 element times its KV head's scale)
/// (`visible_keys`: all of them unless the problem has positions), soft-capped to
/// `cap · tanh(s_i / cap)` when `problem.variant.logits_soft_cap = cap > 0`, `m = max s_i`,
/// `o = Σ e^{s_i - m} v[i,g] / Σ e^{s_i - m}`, `lse = m + ln Σ e^{s_i - m}` (converted to
/// `base`), and `o_magnitude = Σ e^{s_i - m} |v[i,g]| / Σ e^{s_i - m}`. An empty `keys` gives
/// `(0, -inf)` (magnitude 0), as does a row that sees none of `keys`. Then, when the problem has
/// sinks, every row is merged once with its head's sink state `(0, problem.sinks[h])`
/// (`apply_sinks`: `lse' = log(e^lse + e^s)`, `o` and `o_magnitude` scaled by
/// `e^lse / (e^lse + e^s)`; an empty row becomes `(0, s)`). The state of a partial key set (a
/// split, a level) is sink-free: take it for `without_sinks(problem)`. Cost
/// `O(tokens · H_q · |keys| · head_dim)`.
///
/// @param problem  the queries, keys, values and scale.
/// @param keys     indices into `[0, problem.num_keys())` (any order; may be empty).
/// @param base     the base of the returned LSEs.
/// @return the `(tokens, H_q, head_dim)` state in double.
/// @throws attnstate::Error (`kInvalidArgument`) for a key index out of range.
ReferenceState reference_state(const AttentionProblem& problem,
                               const std::vector<std::int64_t>& keys, LseBase base);
/// As above, in the problem's requested base `problem.base`.
/// @param problem  the queries, keys, values, scale and requested base.
/// @param keys     indices into `[0, problem.num_keys())` (any order; may be empty).
/// @return the state in double, LSEs in `problem.base`.
/// @throws attnstate::Error (`kInvalidArgument`) for a key index out of range.
ReferenceState reference_state(const AttentionProblem& problem,
                               const std::vector<std::int64_t>& keys);

/// The attention state of each query token over keys of its own, in double: row `t` is the row
/// `t` of `reference_state(problem, keys_per_token[t], base)` (same values, NaN propagation,
/// variant, sinks and `o_magnitude`; with positions, the row sees only those of its keys inside its
/// window; with sinks, each row merged once with its head's sink after its keys, as
/// `reference_state`). This is the reference of kernels whose rows see different keys: a causal
/// mask (query `i` of a request sees its first `len - q_len + i + 1` keys), a paged decode (each
/// request's tokens over that request's keys, `k`/`v` holding every request's keys or a whole
/// pool's slots), the concatenated levels of a cascade request. Cost
/// `O(Σ_t H_q · |keys_per_token[t]| · head_dim)`.
///
/// @param problem         the queries, keys, values and scale (`k`/`v` may hold keys no token
///                        sees, e.g. unused pool slots; they are never read).
/// @param keys_per_token  `problem.tokens()` lists of indices into `[0, problem.num_keys())`
///                        (any order; an empty list gives that token's rows `(0, -inf)`).
/// @param base            the base of the returned LSEs.
/// @return the `(tokens, H_q, head_dim)` state in double.
/// @throws attnstate::Error (`kInvalidArgument`) naming `keys_per_token` when it does not have
///         one list per token, `keys_per_token[t][i]` for a key index out of range.
ReferenceState reference_state_per_token(
    const AttentionProblem& problem, const std::vector<std::vector<std::int64_t>>& keys_per_token,
    LseBase base);

/// `⊕_i states[i]` in double, written in `base`, with the library's contract (and nothing else:
/// no sinks are applied; merge the sink state once at the end, `apply_sinks`): max-subtracted
/// weights, an empty input row contributes nothing (its `o` is never read, even if NaN),
/// all-empty rows give `(0, -inf)`, NaN in a non-empty input propagates. Inputs may have
/// different bases. When every input has `o_magnitude`, the result's is the same weighted mean
/// of theirs (so the merge of the states of the parts of a key set has the magnitude of the
/// state of the whole); otherwise the result has none.
/// @param states  the states to merge (at least one, one shape).
/// @param base    the base of the result's LSEs.
/// @return the merged state in double.
/// @throws attnstate::Error (`kInvalidArgument`) when the shapes differ or `states` is empty.
ReferenceState reference_merge(const std::vector<ReferenceState>& states, LseBase base);
/// `⊕_i states[i]` of stored states (each widened exactly to double first), in `base`.
/// @param states  the states to merge (at least one, one shape; any dtypes and bases).
/// @param base    the base of the result's LSEs.
/// @return the merged state in double.
/// @throws attnstate::Error (`kInvalidArgument`) when the shapes differ or `states` is empty.
ReferenceState reference_merge(const std::vector<HostState>& states, LseBase base);

/// The state of attention sinks, in double: row `(t, h)` is `(o = 0, lse = sinks[h])` (the
/// logits natural base, as `AttentionProblem::sinks`, converted to `base`), `o_magnitude` 0.
/// Merged once with a state of the same shape (`reference_merge`) it applies the sinks.
/// @param sinks     one logit per head (at least one), each finite or -inf (a head without a sink).
/// @param tokens    rows of the state.
/// @param head_dim  elements of `o` per row.
/// @param base      the base of the returned LSEs.
/// @return the `(tokens, sinks.size(), head_dim)` sink state.
/// @throws attnstate::Error (`kInvalidArgument`) naming `sinks` (empty), `sinks[h]` (NaN or +inf),
///         `tokens` or `head_dim` (negative, or a state of more than 2^62 elements).
ReferenceState reference_sink_state(const std::vector<float>& sinks, std::int64_t tokens,
                                    std::int64_t head_dim, LseBase base);

/// `state` with the sinks applied: every row `(t, h)` merged once with `(0, sinks[h])` (natural
/// base), in double, in `state.base`: `lse' = log(e^lse + e^s)`, `o` (and `o_magnitude`, when
/// present) scaled by `e^lse / (e^lse + e^s)`; an empty row becomes `(0, s)`, a NaN row stays
/// NaN, a sink of -inf leaves its rows as they are. This is the one final merge of an expression
/// with sinks: `apply_sinks(reference_merge(partials, base), sinks)` is the state of the
/// partials' keys plus the sink (applying it to each partial instead counts it once per partial).
/// @param state  a sink-free state (e.g. `reference_state(without_sinks(problem), keys)` or a
///               merge of partials).
/// @param sinks  `state.heads` logits, natural base, each finite or -inf; empty: no sinks (`state`
///               is returned unchanged).
/// @return the state with the sinks.
/// @throws attnstate::Error (`kInvalidArgument`) naming `sinks` (a size other than 0 or
///         `state.heads`), `sinks[h]` (NaN or +inf) or `state`'s inconsistent field.
ReferenceState apply_sinks(const ReferenceState& state, const std::vector<float>& sinks);

/// The largest `|scale| · Σ_d |q[t,h,d] k[i,g,d]|` over all (token, head, key) of the
/// problem (`k` its real values, `real_keys`): it bounds the magnitude of every score (before a
/// soft cap, which only shrinks a score and its error) and scales the fp32 rounding error a kernel
/// can make in computing them. Sinks are no scores: they do not count.
/// @param problem  the problem.
/// @return that bound (0 for a problem without keys).
double max_abs_score(const AttentionProblem& problem);

}  // namespace testing
}  // namespace attnstate
