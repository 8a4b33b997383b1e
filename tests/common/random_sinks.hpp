/// @file random_sinks.hpp
/// @brief Test support: random attention-sink logits (the reference applies them with the kit's
///        `attnstate::testing::apply_sinks`).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace attnstate_test {

/// `heads` random sink logits, uniform in `[lo, hi]` (a wide range: some heads' sinks dominate
/// their rows, some barely count).
inline std::vector<float> random_sinks(std::int64_t heads, float lo, float hi, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> s(static_cast<std::size_t>(heads));
  for (float& x : s) x = u(rng);
  return s;
}

}  // namespace attnstate_test
