/// @file cascade_positions.hpp
/// @brief Where each request's keys lie in the concatenation of its segments over a cascade's
///        levels (host arrays): what the causal rule and the sliding window measure, shared by
///        the CPU cascade and the CUDA planner.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnstate/core/cascade.hpp"

namespace attnstate {
namespace detail {

/// The keys of each request before each level and over all of them.
struct CascadePositions {
  std::vector<std::int64_t> base;   ///< `(num_levels, batch)`: keys of the earlier levels.
  std::vector<std::int64_t> total;  ///< `(batch)`: keys over all the levels.

  /// Keys from level `l`'s segment of request `b` to the request's end (`total - base`).
  std::int64_t tail(int l, std::int64_t b, std::int64_t batch) const {
    return total[static_cast<std::size_t>(b)] - base[static_cast<std::size_t>(l * batch + b)];
  }
};

/// The positions of `batch` requests over `num_levels` checked host levels (each request in one
/// segment of each level).
inline CascadePositions cascade_positions(const CascadeLevel* levels, int num_levels,
                                          std::int64_t batch) {
  CascadePositions p;
  p.base.assign(static_cast<std::size_t>(num_levels * batch), 0);
  p.total.assign(static_cast<std::size_t>(batch), 0);
  for (int l = 0; l < num_levels; ++l)
    for (std::int64_t s = 0; s < levels[l].num_segments; ++s)
      for (std::int64_t b = levels[l].request_indptr[s]; b < levels[l].request_indptr[s + 1]; ++b) {
        p.base[static_cast<std::size_t>(l * batch + b)] = p.total[static_cast<std::size_t>(b)];
        p.total[static_cast<std::size_t>(b)] += levels[l].seg_lens[s];
      }
  return p;
}

}  // namespace detail
}  // namespace attnstate
