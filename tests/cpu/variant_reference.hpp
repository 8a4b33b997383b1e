/// @file variant_reference.hpp
/// @brief The testing kit's double reference of windowed and soft-capped decodes and cascades,
///        for the CPU variant tests: each row over the last `window_left + 1` of its causal keys
///        (its keys are the positions 0..p in order), the problem soft-capped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/variant.hpp"
#include "attnstate/testing/problem.hpp"
#include "attnstate/testing/reference.hpp"
#include "cascade_case.hpp"
#include "decode_problem.hpp"

namespace attnstate_test {

/// A variant of `window` keys back and soft cap `cap`.
inline attnstate::AttentionVariant variant(std::int64_t window, float cap) {
  attnstate::AttentionVariant v;
  v.window_left = window;
  v.logits_soft_cap = cap;
  return v;
}

inline std::string show(const attnstate::AttentionVariant& v) {
  return "window " + std::to_string(v.window_left) + " cap " + std::to_string(v.logits_soft_cap);
}

/// Keeps the last `window + 1` keys of every row (all of them for kNoWindow).
inline std::vector<std::vector<std::int64_t>> windowed(std::vector<std::vector<std::int64_t>> keys,
                                                       std::int64_t window) {
  if (window == attnstate::kNoWindow) return keys;
  for (auto& row : keys) {
    const auto n = static_cast<std::int64_t>(row.size());
    if (n > window + 1) row.erase(row.begin(), row.begin() + (n - window - 1));
  }
  return keys;
}

/// The reference of `p`'s decode with `v` (natural-log LSEs).
inline attnstate::testing::ReferenceState decode_reference(const DecodeProblemHost& p, float scale,
                                                           const attnstate::AttentionVariant& v) {
  attnstate::testing::AttentionProblem pr = decode_as_problem(p, scale);
  pr.variant.logits_soft_cap = v.logits_soft_cap;
  return attnstate::testing::reference_state_per_token(pr, windowed(decode_keys(p), v.window_left),
                                                       attnstate::LseBase::kNatural);
}

/// The reference of a cascade case with `v`: positions count the request's concatenated
/// segments; without `causal` every row is at the last key (natural-log LSEs).
inline attnstate::testing::ReferenceState cascade_reference(const CascadeCase& c,
                                                            const attnstate::AttentionVariant& v) {
  attnstate::testing::AttentionProblem pr = c.pool_problem();
  pr.variant.logits_soft_cap = v.logits_soft_cap;
  return attnstate::testing::reference_state_per_token(
      pr, windowed(c.keys_per_token(), v.window_left), attnstate::LseBase::kNatural);
}

}  // namespace attnstate_test
