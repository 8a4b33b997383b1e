/// @file split_layout_gen.hpp
/// @brief RapidCheck draw of a random split layout for the decode properties (CPU and MLA).
#pragma once

#include <rapidcheck.h>

#include <cstdint>

#include "split_layouts.hpp"

namespace attnstate_test {

/// A random split layout able to serve lengths up to `max_len`: 1..11 splits of equal size, or
/// splits of 1..5 granules.
inline attnstate::SplitLayout random_split_layout(int max_len) {
  if (*rc::gen::arbitrary<bool>()) return fixed_count(*rc::gen::inRange(1, 12));
  const std::int32_t size = attnstate::kSplitGranularity * *rc::gen::inRange(1, 6);
  return fixed_size(size, (max_len + size - 1) / size);
}

}  // namespace attnstate_test
