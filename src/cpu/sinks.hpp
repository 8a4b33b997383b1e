/// @file sinks.hpp
/// @brief Attention sinks in the CPU decode's and cascade's final merge (internal): the argument
///        check of `AttentionSinks` and the merge of one output row with its sink state `(0, s_h)`.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"
#include "common/validate.hpp"
#include "cpu/producer_rows.hpp"

namespace attnstate {
namespace cpu {
namespace detail {

/// A non-finite logit as an error message shows it.
inline std::string logit_str(float x) {
  if (std::isnan(x)) return "nan";
  return x > 0 ? "inf" : "-inf";
}

/// Checks the sinks of a call whose `out` (validated) has `heads_q` heads and returns a copy of
/// the logits (empty for `sinks.none()`): `heads_q` fp32 logits, 4-byte aligned, each finite
/// (-inf too is refused: `none()` is how to pass no sinks), the array disjoint from `out`. The
/// pointer must be host memory (the CPU backend reads it; a raw pointer's side is not known here).
/// @throws Error (`kInvalidArgument`) naming `sinks.logits`, `sinks.logits[h]` or `out.o` /
///         `out.lse` (an overlap).
inline std::vector<float> check_sinks(const char* fn, const AttentionSinks& sinks,
                                      std::int64_t heads_q, const StateView& out) {
  if (sinks.none()) return {};
  attnstate::detail::check_aligned(fn, "sinks.logits", sinks.logits, sizeof(float));
  std::vector<float> logits(sinks.logits, sinks.logits + heads_q);
  for (std::int64_t h = 0; h < heads_q; ++h) {
    const float x = logits[static_cast<std::size_t>(h)];
    if (std::isfinite(x)) continue;
    const std::string name = "sinks.logits[" + std::to_string(h) + "]";
    attnstate::detail::throw_argument(
        fn, name.c_str(),
        std::string("a finite logit (fp32, natural base)") +
            (x == -INFINITY ? "; for no sinks pass none() (AttentionSinks{}; sinks=None in Python)"
                            : ""),
        logit_str(x));
  }
  attnstate::detail::check_disjoint(fn, "out", out, "sinks.logits", sinks.logits, heads_q * 4,
                                    nullptr, 0);
  return logits;
}

/// Merges the sink state `(0, logit)` (`logit` natural-base) into one normalised output row:
/// `o` its `head_dim` fp32 values, `lse` its LSE in `base`. Returns the merged LSE (in `base`);
/// `o` is scaled by the row's weight. An empty row (`lse = -inf`) becomes `(0, logit)`; a NaN
/// row stays NaN. The same pairwise merge as `merge_state_inplace` (math::pair_weights).
inline float merge_sink(LseBase base, float lse, float logit, float* o, std::int64_t head_dim) {
  const math::PairWeights w =
      math::pair_weights(base, lse, math::convert_lse(logit, LseBase::kNatural, base));
  for (std::int64_t d = 0; d < head_dim; ++d) o[d] = math::pair_combine(w, o[d], 0.f);
  return w.lse;
}

/// Writes the final state of row `(token, h)` of `out`: `acc` (`out.head_dim` fp32 values,
/// normalised) and its base-2 LSE `lse2`, the LSE converted to `out.base`; when `sink` is not
/// empty (one natural-base logit per head), merged first with the sink state `(0, sink[h])`,
/// the one merge that carries the sink (after every split). `acc` is scaled in place.
inline void store_final_row(const StateView& out, std::int64_t token, std::int64_t h, float lse2,
                            const std::vector<float>& sink, float* acc) {
  float lse = math::convert_lse(lse2, LseBase::kBase2, out.base);
  if (!sink.empty())
    lse = merge_sink(out.base, lse, sink[static_cast<std::size_t>(h)], acc, out.head_dim);
  store_row(out.o, out.dtype, out.o_offset(token, h), out.head_dim, acc);
  out.lse[out.lse_offset(token, h)] = lse;
}

}  // namespace detail
}  // namespace cpu
}  // namespace attnstate
