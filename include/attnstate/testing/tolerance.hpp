/// @file tolerance.hpp
/// @brief Dtype-aware tolerances and state comparisons that describe the first mismatches.
///
/// A value `a` matches an expected `e` when `|a - e| ≤ abs + rel · |e|`, with `abs`/`rel` taken
/// from a `Tolerance` for `o` and for `lse` separately. Special values must match exactly: an
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
struct Tolerance {
  double o_abs = 0;    ///< Absolute tolerance on `o` (for values of magnitude about 1).
  double o_rel = 0;    ///< Relative tolerance on `o`.
  double lse_abs = 0;  ///< Absolute tolerance on the LSE (in the LSE's own base).
  double lse_rel = 0;  ///< Relative tolerance on the LSE (matters for LSEs near ±1e4).

  /// Every field multiplied by `factor` (e.g. 2 when both sides of a comparison carry error).
  /// @param factor  the multiplier.
  /// @return the scaled tolerance.
  Tolerance scaled(double factor) const {
    return Tolerance{o_abs * factor, o_rel * factor, lse_abs * factor, lse_rel * factor};
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

/// Tolerance of an attention state computed by an fp32 kernel for `problem` (all its keys),
/// stored in `problem.out_dtype`: `tolerance_for(out_dtype)` widened by the fp32 error of the
/// scores (`(head_dim + 8) · 2^-24 · max_abs_score(problem)`) and of the sums over the keys
/// (`(num_keys + head_dim + 8) · 2^-24`), with `o` terms scaled by the largest `|v|`.
/// @param problem  the problem (its output dtype, base, shapes and values).
/// @return the tolerance for comparing a kernel's state with `reference_state(problem, ...)`.
Tolerance tolerance_for(const AttentionProblem& problem);

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
