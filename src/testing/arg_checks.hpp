/// @file arg_checks.hpp
/// @brief Argument checks shared by the testing kit's classes and functions (internal to the
///        kit): extents, overflow-checked sizes (through core/checked.hpp), indices and
///        allocations, each failure an `attnstate::Error` in the library's message form.
#pragma once

#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/testing/mla.hpp"
#include "attnstate/testing/problem.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace attnstate {
namespace testing {
namespace kit {

/// Throws unless `value` is in `[0, kMaxSize]` (an extent or count of elements).
inline void check_extent(std::int64_t value, const char* func, const char* arg) {
  if (value < 0 || value > kMaxSize) {
    detail::throw_argument(func, arg, "an extent in [0, 2^62]", std::to_string(value));
  }
}

/// `a * b`, or throws naming `arg` when the product passes `kMaxSize` (operands are checked
/// extents, so only the product can be out of range).
inline std::int64_t mul_or_throw(std::int64_t a, std::int64_t b, const char* func, const char* arg,
                                 const std::string& what) {
  std::int64_t r = 0;
  if (!checked_mul(a, b, &r)) {
    detail::throw_argument(func, arg, what + " of at most 2^62",
                           std::to_string(a) + " x " + std::to_string(b) + " (overflows)");
  }
  return r;
}

/// Throws unless `0 <= i < n`, naming the index.
inline void check_index(std::int64_t i, std::int64_t n, const char* func, const char* arg) {
  if (i < 0 || i >= n) {
    detail::throw_argument(func, arg, "an index in [0, " + std::to_string(n) + ")",
                           std::to_string(i));
  }
}

/// Throws naming `arg` unless `dtype` is f32, f16 or bf16, or, where `fp8` (the storage of a
/// `HostTensor`, e.g. a problem's fp8 keys and values), e4m3 or e5m2: `kInvalidArgument` for a
/// value that is no dtype, `kNotSupported` for fp8 elsewhere (a state's `o`, a problem's
/// queries: the kit holds no scale for them).
inline void check_dtype(DType dtype, const char* func, const char* arg, bool fp8 = false) {
  if (!is_valid(dtype)) {
    detail::throw_argument(func, arg, fp8 ? "f32, f16, bf16, e4m3 or e5m2" : "f32, f16 or bf16",
                           "value " + std::to_string(static_cast<int>(dtype)));
  }
  if (is_fp8(dtype) && !fp8) {
    detail::throw_argument(func, arg, "f32, f16 or bf16 (fp8 is for a problem's k and v only)",
                           to_string(dtype), Status::kNotSupported);
  }
}

inline void check_base(LseBase base, const char* func, const char* arg) {
  if (base != LseBase::kNatural && base != LseBase::kBase2) {
    detail::throw_argument(func, arg, "natural or base2",
                           "value " + std::to_string(static_cast<int>(base)));
  }
}

/// `v.assign(n, x)`; a request the host cannot satisfy (a valid but huge size) becomes an
/// `attnstate::Error` (`kResourceExhausted`) instead of `std::bad_alloc` / `std::length_error`.
template <class T>
void assign_or_throw(std::vector<T>& v, std::int64_t n, const T& x, const char* func,
                     const char* arg) {
  try {
    v.assign(static_cast<std::size_t>(n), x);
  } catch (const std::bad_alloc&) {
    detail::throw_argument(
        func, arg, "a size the host can allocate",
        std::to_string(n) + " elements of " + std::to_string(sizeof(T)) + " bytes",
        Status::kResourceExhausted);
  } catch (const std::length_error&) {
    detail::throw_argument(
        func, arg, "a size the host can allocate",
        std::to_string(n) + " elements of " + std::to_string(sizeof(T)) + " bytes",
        Status::kResourceExhausted);
  }
}

/// Throws unless `problem` is consistent (a hand-built `AttentionProblem` may not be): `q`, `k`
/// rank 3, `v` of `k`'s shape and dtype, `H_q` a multiple of `H_kv >= 1`, one head_dim, `q` not
/// fp8, valid fp8 scales (`check_kv_scales`), valid output dtype and base, a valid variant,
/// `positions` empty or one per row (not empty with a window), `key_positions` empty or one per
/// key, `sinks` empty or one per query head, each finite or -inf. Names the field as
/// `<arg>.<field>`.
void check_problem(const AttentionProblem& problem, const char* func, const char* arg);

/// Throws naming `name` (or `name[i]`) unless `scales` holds 0, 1 or `heads_kv` values, each
/// finite and > 0.
void check_scales(const std::vector<float>& scales, std::int64_t heads_kv, const char* func,
                  const std::string& name);

/// Throws naming `<arg>.k_scale` / `<arg>.v_scale` unless the scales of `problem` are valid:
/// empty for keys and values that are not fp8, `check_scales` for fp8 ones.
void check_kv_scales(const AttentionProblem& problem, const char* func, const char* arg);

/// The real values of a checked problem's `(num_keys, H_kv, head_dim)` tensor `t` (its `k` or
/// `v`) with the scales `scales` (empty, one or one per KV head): `stored × scale`, in double.
std::vector<double> dequantized(const HostTensor& t, const std::vector<float>& scales,
                                const char* func);

/// Whether query row `token` of a checked `problem` sees key `key` (both in range): always
/// without positions, else the key's position inside `[window_begin(p), p]` of the row's `p`.
bool sees(const AttentionProblem& problem, std::int64_t token, std::int64_t key);

/// Throws unless `state`'s vectors have the sizes of its shape (a hand-built `ReferenceState`
/// may not): `o` and `lse` (and `o_magnitude` when present) against the overflow-checked counts.
void check_reference(const ReferenceState& state, const char* func, const char* arg);

/// Throws unless every key is in `[0, num_keys)`, naming `<arg>[i]`.
void check_keys(const std::vector<std::int64_t>& keys, std::int64_t num_keys, const char* func,
                const char* arg);

/// Throws naming `keys_per_token` unless it holds `tokens` lists, or `keys_per_token[t][i]` for
/// a key outside `[0, num_keys)`.
inline void check_keys_per_token(const std::vector<std::vector<std::int64_t>>& keys,
                                 std::int64_t tokens, std::int64_t num_keys, const char* func) {
  if (static_cast<std::int64_t>(keys.size()) != tokens) {
    detail::throw_argument(func, "keys_per_token",
                           "one key list per query token (" + std::to_string(tokens) + ")",
                           std::to_string(keys.size()) + " lists");
  }
  for (std::size_t t = 0; t < keys.size(); ++t) {
    const std::string name = "keys_per_token[" + std::to_string(t) + "]";
    check_keys(keys[t], num_keys, func, name.c_str());
  }
}

/// Throws naming `<arg>.<field>` unless the MLA generator options `options` are valid: limits
/// in range, every list non-empty and its entries valid (dtypes, bases, widths, scales),
/// percentages in 0..100, finite factors and sink range.
void check_mla_gen_options(const MlaGenOptions& options, const char* func, const char* arg);

/// The tolerance model of `tolerance_for(const AttentionProblem&, bool)` from its inputs: `in`
/// the dtype `P` may be rounded to, `keys` the key count, `dim` the width of the scores' dot
/// products, `max_score` the bound of `max_abs_score`, `v_max` the largest real `|v|` (≥ 1).
Tolerance attention_tolerance(DType in, DType out_dtype, LseBase base, double keys, double dim,
                              double max_score, double v_max, bool p_rounded_to_input);

}  // namespace kit
}  // namespace testing
}  // namespace attnstate
