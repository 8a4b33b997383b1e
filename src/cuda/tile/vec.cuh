/// @file tile/vec.cuh
/// @brief Eight-element chunks of `o`: 16-byte vector loads and stores (scalar when a view is
///        not 16-byte aligned), converted to and from fp32. A row whose head_dim is not a
///        multiple of eight ends in a partial chunk of `n < 8` elements, always accessed
///        element by element (its views are never `aligned`).
#pragma once

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "cuda/arch/memory.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Elements of `o` one thread handles per chunk (16 bytes of a 16-bit dtype).
constexpr int kChunk = 8;

/// Eight raw elements of type `T` as loaded from memory (one or two 16-byte words).
template <class T>
union Chunk {
  static constexpr int kWords = static_cast<int>(sizeof(T)) * kChunk / 16;  ///< 16-byte words.
  uint4 w[kWords];  ///< The words, for vector loads and stores.
  T e[kChunk];      ///< The elements.
};

/// Loads the chunk starting at `p`: 16-byte loads when `aligned`, element loads otherwise (the
/// first `n` elements; the others read as 0 and are never stored). `aligned` implies `n == 8`.
template <class T>
__device__ __forceinline__ void load_chunk(Chunk<T>& c, const T* p, bool aligned, int n = kChunk) {
  if (aligned) {
    const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int k = 0; k < Chunk<T>::kWords; ++k) c.w[k] = q[k];
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) c.e[k] = k < n ? p[k] : T{};
  }
}

/// Loads a chunk of read-only input (not written by the running kernel) without allocating it in
/// L1: streamed data then does not evict the LSEs a row reuses.
template <class T>
__device__ __forceinline__ void load_chunk_stream(Chunk<T>& c, const T* p, bool aligned,
                                                  int n = kChunk) {
  if (aligned) {
#pragma unroll
    for (int k = 0; k < Chunk<T>::kWords; ++k) {
      c.w[k] = arch::ld_global_nc_no_allocate(reinterpret_cast<const uint4*>(p) + k);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) c.e[k] = k < n ? p[k] : T{};
  }
}

/// Asks L2 to fetch the chunk at `p` ahead of its load (no registers held while in flight).
template <class T>
__device__ __forceinline__ void prefetch_chunk_l2(const T* p) {
#pragma unroll
  for (int k = 0; k < Chunk<T>::kWords; ++k) {
    arch::prefetch_global_l2(reinterpret_cast<const char*>(p) + 16 * k);
  }
}

/// Element `k` of a loaded chunk, in fp32 (exact).
template <class T>
__device__ __forceinline__ float chunk_at(const Chunk<T>& c, int k) {
  return to_float(c.e[k]);
}

/// Rounds eight fp32 values once to `T` and stores them at `p` (the first `n` of them when not
/// `aligned`).
template <class T>
__device__ __forceinline__ void store_chunk(T* p, const float (&v)[kChunk], bool aligned,
                                            int n = kChunk) {
  Chunk<T> c;
#pragma unroll
  for (int k = 0; k < kChunk; ++k) c.e[k] = from_float<T>(v[k]);
  if (aligned) {
    uint4* q = reinterpret_cast<uint4*>(p);
#pragma unroll
    for (int k = 0; k < Chunk<T>::kWords; ++k) q[k] = c.w[k];
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (k < n) p[k] = c.e[k];
    }
  }
}

/// Elements of chunk `chunk` of a row of `head_dim` elements: 8, fewer for the last chunk of a
/// row whose head_dim is not a multiple of 8, 0 past the row's end.
__device__ __forceinline__ int chunk_elems(std::int64_t head_dim, int chunk) {
  const std::int64_t left = head_dim - static_cast<std::int64_t>(chunk) * kChunk;
  return left <= 0 ? 0 : (left >= kChunk ? kChunk : static_cast<int>(left));
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
