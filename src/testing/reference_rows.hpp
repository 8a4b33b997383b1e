/// @file reference_rows.hpp
/// @brief The double-precision reference's row kernel, shared by the reference of attention
///        problems and of MLA problems (internal to the kit).
#pragma once

#include <cstdint>
#include <vector>

#include "attnstate/core/lse_base.hpp"
#include "attnstate/testing/reference.hpp"

namespace attnstate {
namespace testing {
namespace kit {

/// The values a reference reads, once per call: queries `(tokens, hq, k_dim)` as stored, keys
/// `(keys, hkv, k_dim)` and values `(keys, hkv, v_dim)` as real values (fp8 elements times their
/// scales, exact in double). Query head `h` reads KV head `h / group`.
struct RowValues {
  std::vector<float> q;          ///< Queries.
  std::vector<double> k, v;      ///< Real keys and values.
  std::int64_t hq = 0, hkv = 0;  ///< Query and KV heads.
  std::int64_t k_dim = 0;        ///< Width of a query and a key.
  std::int64_t v_dim = 0;        ///< Width of a value (and of the state's `o`).
  std::int64_t group = 1;        ///< `hq / hkv`.
  float scale = 1.f;             ///< Softmax scale.
  double cap = 0;                ///< Logits soft cap, 0: none.
};

/// The empty state `(0, -inf)` of the shape, with a zero `o_magnitude`.
ReferenceState empty_reference(std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                               LseBase base);

/// Row `(t, h)` of `r` (shaped `(tokens, hq, v_dim)`, zero-initialised) over `keys` (not
/// empty): scores (soft-capped when `cap`), max-subtracted weights, `o`, its magnitude and the
/// LSE in `r.base`; a NaN score makes the whole row NaN. `s` is scratch.
void attend_row(const RowValues& pv, const std::vector<std::int64_t>& keys, std::int64_t t,
                std::int64_t h, std::vector<double>& s, ReferenceState& r);

}  // namespace kit
}  // namespace testing
}  // namespace attnstate
