/// @file gen_choices.hpp
/// @brief Drawing helpers shared by the kit's RapidCheck generators (internal to the kit):
///        choices uniform whatever the test size, still shrinking towards the first.
#pragma once

#include <rapidcheck.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnstate/core/dtype.hpp"

namespace attnstate {
namespace testing {
namespace kit {

/// RapidCheck's nominal size: choices drawn at this size are uniform over their whole range
/// (instead of growing with the test's size), while still shrinking towards the minimum.
constexpr int kFullSize = 100;

/// A value in `[lo, hi)` drawn at full size: uniform whatever the test size (`rc::gen::inRange`
/// alone scales its range down with the size), still shrinking towards `lo`.
template <class T>
rc::Gen<T> in_full_range(T lo, T hi) {
  return rc::gen::resize(kFullSize, rc::gen::inRange<T>(lo, hi));
}

/// A 64-bit seed for bulk values, drawn uniformly whatever the test size (shrinks to 0).
inline rc::Gen<std::uint64_t> gen_seed() {
  return rc::gen::resize(kFullSize, rc::gen::arbitrary<std::uint64_t>());
}

/// One element of `choices` (non-empty: the public generators check their options first);
/// unlike `rc::gen::elementOf` it shrinks towards the first element, so list the simplest choice
/// first.
template <class T>
rc::Gen<T> pick(const std::vector<T>& choices) {
  if (choices.empty()) throw rc::GenerationFailure("empty list of choices");
  return rc::gen::map(in_full_range<std::size_t>(0, choices.size()),
                      [choices](std::size_t i) { return choices[i]; });
}

/// The largest finite value of the fp8 dtype `dt`.
inline float fp8_max(DType dt) { return dt == DType::kE4M3 ? 448.f : 57344.f; }

}  // namespace kit
}  // namespace testing
}  // namespace attnstate
