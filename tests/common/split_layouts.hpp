/// @file split_layouts.hpp
/// @brief Split layouts the decode tests (CPU, MLA, plan) build: a fixed count and a fixed size
///        (split_layout_gen.hpp draws random ones).
#pragma once

#include <cstdint>

#include "attnstate/core/decode_split.hpp"

namespace attnstate_test {

/// `n` splits of equal size per request.
inline attnstate::SplitLayout fixed_count(int n) {
  attnstate::SplitLayout l;
  l.policy = attnstate::SplitPolicy::kFixedCount;
  l.num_splits = n;
  l.max_splits = n;
  return l;
}

/// Splits of `size` keys, at most `max_splits` per request.
inline attnstate::SplitLayout fixed_size(std::int32_t size, std::int32_t max_splits) {
  attnstate::SplitLayout l;
  l.policy = attnstate::SplitPolicy::kFixedSize;
  l.split_size = size;
  l.max_splits = max_splits;
  return l;
}

}  // namespace attnstate_test
