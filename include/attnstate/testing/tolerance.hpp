/// @file tolerance.hpp
/// @brief Dtype-aware tolerances and state comparisons that describe the first mismatches.
///
/// A value `a` matches an expected `e` when `|a - e| ≤ abs + rel · |e|`, with `abs`/`rel` taken
/// from a `Tolerance` for `o` and for `lse` separately; `o` also allows
/// `o_magnitude_rel · M`, `M` the element's magnitude (`ReferenceState::o_magnitude`, e.g.
/// `Σ_i w_i |v_i|` for an attention state). Special values must match exactly: an
/// expected empty row `(lse = -inf)` needs `lse == -inf` and `o == 0` (the identity, never NaN);
/// an expected NaN needs a NaN; an expected finite value needs a finite value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/problem.hpp"
#include "attnstate/testing/reference.hpp"

namespace attnstate {
namespace testing {

/// Absolute and relative tolerances for the two parts of a state.
///
/// An element `o[t,h,d]` with expected value `e` may differ by
/// `o_abs + o_rel · |e| + o_magnitude_rel · M`, where `M` is the expected state's
/// `o_magnitude` for that element when it has one (`reference_state`, `reference_merge`), else
/// `max(|e|, o_magnitude_default)`. An LSE with expected value `e` may differ by
/// `lse_abs + lse_rel · max(|e|, lse_rel_floor)`.
struct Tolerance {
  double o_abs = 0;                ///< Absolute tolerance on `o` (for values of magnitude about 1).
  double o_rel = 0;                ///< Relative tolerance on `o`.
  double lse_abs = 0;              ///< Absolute tolerance on the LSE (in the LSE's own base).
  double lse_rel = 0;              ///< Relative tolerance on the LSE (matters for LSEs near ±1e4).
  double o_magnitude_rel = 0;      ///< Tolerance on `o` per unit of the element's magnitude `M`
                                   ///< (the unit roundoffs of the roundings a kernel may make).
  double o_magnitude_default = 0;  ///< `M` where the expected state has no `o_magnitude` (e.g.
                                   ///< a stored state): a bound such as the largest `|v|`.
  double lse_rel_floor = 0;        ///< The LSE's relative tolerance applies to
                                   ///< `max(|e|, lse_rel_floor)`: with 1, an error relative to
                                   ///< the LSE that never drops below `lse_rel` near 0.

  /// Every tolerance multiplied by `factor` (e.g. 2 when both sides of a comparison carry
  /// error); `o_magnitude_default` and `lse_rel_floor`, magnitudes and not tolerances, are kept.
  /// @param factor  the multiplier.
  /// @return the scaled tolerance.
  Tolerance scaled(double factor) const {
    return Tolerance{o_abs * factor,   o_rel * factor,           lse_abs * factor,
                     lse_rel * factor, o_magnitude_rel * factor, o_magnitude_default,
                     lse_rel_floor};
  }

  /// A tolerance of absolute bounds only: `|a - e| ≤ o_abs` on `o`, and on the LSE
  /// `lse_abs + lse_rel · max(|e|, lse_rel_floor)` (the bounds a test states in its own terms,
  /// e.g. from an error analysis of one kernel, compared by the same `compare_states`).
  /// @param o_abs          absolute tolerance on `o`.
  /// @param lse_abs        absolute tolerance on the LSE.
  /// @param lse_rel        relative tolerance on the LSE.
  /// @param lse_rel_floor  the least `|e|` the relative tolerance applies to.
  /// @return the tolerance.
  static Tolerance absolute(double o_abs, double lse_abs, double lse_rel = 0,
                            double lse_rel_floor = 0) {
    Tolerance t;
    t.o_abs = o_abs;
    t.lse_abs = lse_abs;
    t.lse_rel = lse_rel;
    t.lse_rel_floor = lse_rel_floor;
    return t;
  }
};

/// Tolerance of a merge whose output `o` is stored in `o_dtype` (inputs exact, fp32
/// arithmetic, output rounded once):
///
/// | dtype | o_abs  | o_rel  | lse_abs | lse_rel |
/// |-------|--------|--------|---------|---------|
/// | f32   | 1e-5   | 1e-5   | 1e-5    | 1e-6    |
/// | f16   | 2e-3   | 2e-3   | 1e-5    | 1e-6    |
/// | bf16  | 1.6e-2 | 1.6e-2 | 1e-5    | 1e-6    |
///
/// f16 and bf16 allow about four half-ulps at 1 (2^-11 and 2^-8 relative), covering the
/// rounding of the stored inputs of a chain of merges plus the final rounding; the LSE is
/// always fp32, so its tolerance does not depend on `o_dtype`. See docs/numerics.md.
/// @param o_dtype  storage dtype of the output `o`.
/// @return the tolerance of the table.
Tolerance tolerance_for(DType o_dtype);

/// Tolerance of an attention state computed for `problem` (any subset of its keys) by a kernel
/// that keeps the numerics contract — scores, sums and accumulators in fp32, `o` rounded once to
/// `problem.out_dtype` — and may, like a tensor-core flash kernel, round the probabilities `P`
/// to the 16-bit input dtype for the `P·V` product.
///
/// With `u_in` the unit roundoff of that rounding of `P` (`2^-8` for bf16 inputs, `2^-11` for
/// f16; 0 for f32 inputs or when `p_rounded_to_input` is false: no rounding; for fp8 keys and
/// values the queries' dtype is the input dtype), `u_out` that of the output dtype (`2^-8`,
/// `2^-11`, `2^-24`), `V` the largest real `|v|` (`real_values`, at least 1), `D` the head_dim,
/// `T` the key count and `S = max_abs_score(problem)`:
///
/// - `o_magnitude_rel = 2 · (u_in + u_out)`: rounding `P` errs by at most `u_in · M` and
///   rounding `o` (and, in a split, each part's `o`) by at most `u_out · M`, `M = Σ_i w_i |v_i|`
///   the element's `ReferenceState::o_magnitude` (`o_magnitude_default = V` where it is
///   unknown); the factor 2 is the margin (it also covers `P` rounded towards zero, or `o`
///   normalised by the sum of the rounded `P`);
/// - `o_abs = (1e-5 + 4 · (D + 8) · 2^-24 · S + 2 · (T + D + 8) · 2^-24) · V` (fp32 floor, the
///   fp32 error of the scores and of the sums over the keys), plus `2 · T · 2^-25 · V` for f16
///   inputs (probabilities below 2^-14 are f16 subnormals, with absolute error 2^-25) and
///   `2 · 2^-25` for an f16 output (the f16 term only when `P` may be rounded); `o_rel = 1e-5`;
/// - `lse_abs = 1e-5 + (2 · (D + 8) · 2^-24 · S + (T + D + 8) · 2^-24) · b` (`b` = log2(e) in
///   base 2, else 1), `lse_rel = 1e-6`.
///
/// A kernel that accumulates `P·V` in 16 bits (rounding `u_in · |acc|` per key) or loses a
/// rescale exceeds this over a few hundred keys. With fp8 keys and values the model adds no term
/// of its own: the reference is over the real values `stored × scale`, every fp8 value converts
/// exactly to f16, bf16 and f32, and a kernel that dequantises in fp32 (each element `to_float ×
/// scale`, one fp32 rounding, or the scales applied to the fp32 score and output) errs by fp32
/// roundings the terms above cover; one that rounds `stored × scale` to 16 bits does not pass.
///
/// Sinks add no term either. Merging a row with its sink `(0, s)` scales `o` by
/// `f = e^lse / (e^lse + e^s) ≤ 1`, and the reference scales `o_magnitude` by the same `f`, so the
/// kernel's errors on `o` (each at most a unit roundoff of `M`) shrink with the bound; an error
/// `δ` of the sink-free LSE moves `o' = f · o` by `|o| · f (1 - f) · δ ≤ M' · δ ≤ V · δ`, below
/// `o_abs` (whose score and sum terms are twice the LSE's), and the LSE by `(1 - f) · δ ≤ δ`; the
/// fp32 merge itself errs by a few roundings of `o'` and of `lse'` (`s` is exact: an fp32
/// logit). A kernel that stores its sink-free `o` in the output dtype and applies the sink in a
/// second pass (`merge_state_inplace` with `make_sink_state`) rounds `o` twice, which the
/// factor 2 of `o_magnitude_rel` covers. `max_abs_score` is that of the keys: a sink is no score.
/// See docs/testing_kit.md and docs/fp8.md.
/// @param problem             the problem (its dtypes, base, shapes and values).
/// @param p_rounded_to_input  whether the kernel may round `P` to the 16-bit input dtype (true:
///                            tensor-core kernels; false: a kernel with fp32 `P` is held to
///                            fp32 precision before the final rounding of `o`).
/// @return the tolerance for comparing a kernel's state with `reference_state(problem, ...)`
///         (which carries `o_magnitude`).
Tolerance tolerance_for(const AttentionProblem& problem, bool p_rounded_to_input = true);

/// Tolerance of a merge of `inputs` written in `out_dtype`: `tolerance_for(out_dtype)` widened
/// for large LSEs. An fp32 LSE of magnitude `L` is only known to about `L · 2^-24` (absolute),
/// and so is every merge weight derived from it (base conversions and stored intermediate
/// results round it again), so `o_abs` grows by `4 · 2^-24 · L · log2(e) · O` and `lse_abs` by
/// `4 · 2^-24 · L · log2(e)`, where `L` is the largest finite |LSE| of the inputs in natural-log
/// units (times log2(e): working in base 2 scales the LSEs by it) and `O` the largest finite |o|
/// of their non-empty rows (at least 1). At `L = 1e4` this is about `3.4e-3 · O` — the inherent
/// precision of fp32 LSEs there, not slack for a bug.
/// @param out_dtype  storage dtype of the merged `o`.
/// @param inputs     the merged states.
/// @return the tolerance for comparing the merge with `reference_merge(inputs, ...)`.
Tolerance merge_tolerance(DType out_dtype, const std::vector<HostState>& inputs);

/// Describes how `actual` differs from `expected` beyond `tol`: an empty string when they
/// match. `actual`'s LSEs are interpreted in `actual.base()` (its declared base) and
/// converted to `expected.base` before comparing. The text names the first mismatches as
/// `lse[t,h]` / `o[t,h,d]` with the values, the difference and the allowed error. The dtype
/// of `actual` is not compared (only its values).
/// @param actual    the state under test.
/// @param expected  the expected state (in double).
/// @param tol       the allowed error.
/// @return "" when they match, else a description of the mismatches.
std::string compare_states(const HostState& actual, const ReferenceState& expected,
                           const Tolerance& tol);
/// As above, with the expected state given as a stored state (widened exactly to double).
/// @param actual    the state under test.
/// @param expected  the expected state (any dtype and base).
/// @param tol       the allowed error.
/// @return "" when they match, else a description of the mismatches.
std::string compare_states(const HostState& actual, const HostState& expected,
                           const Tolerance& tol);

/// Describes how `a` and `b` differ bit for bit (shape, dtype, base, `o` or `lse` bits).
/// @param a  a state.
/// @param b  another state.
/// @return "" when they are bitwise identical, else a description of the differences.
std::string compare_bitwise(const HostState& a, const HostState& b);

/// True when `compare_states(actual, expected, tol)` finds no mismatch.
/// @param actual    the state under test.
/// @param expected  the expected state (in double).
/// @param tol       the allowed error.
/// @return whether `actual` matches `expected` within `tol`.
inline bool states_close(const HostState& actual, const ReferenceState& expected,
                         const Tolerance& tol) {
  return compare_states(actual, expected, tol).empty();
}
/// As above, with the expected state given as a stored state (widened exactly to double).
/// @param actual    the state under test.
/// @param expected  the expected state (any dtype and base).
/// @param tol       the allowed error.
/// @return whether `actual` matches `expected` within `tol`.
inline bool states_close(const HostState& actual, const HostState& expected, const Tolerance& tol) {
  return compare_states(actual, expected, tol).empty();
}

}  // namespace testing
}  // namespace attnstate
