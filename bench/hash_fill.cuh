/// @file hash_fill.cuh
/// @brief The counter hash the GPU benchmarks fill their inputs with: element `i` of a fill with
///        seed `seed` is a fixed value in [-1, 1), so two executables (a benchmark and its peer
///        harness) that fill with the same seeds time the same data. CUDA only (no attnstate
///        header).
#pragma once

#include <cstddef>
#include <cstdint>

namespace bench_hash {

/// A uniform value in [-1, 1) (multiples of 2^-15) from a hash of (i, seed).
__device__ inline float unit(std::size_t i, std::uint32_t seed) {
  std::uint32_t x = static_cast<std::uint32_t>(i) * 2654435761u ^ seed ^
                    static_cast<std::uint32_t>(i >> 32) * 40503u;
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  return (static_cast<float>(x & 0xFFFFu) / 32768.f) - 1.f;
}

}  // namespace bench_hash
