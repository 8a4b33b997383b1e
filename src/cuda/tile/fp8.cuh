/// @file tile/fp8.cuh
/// @brief Chunks of an fp8 `o` (e4m3, e5m2): eight elements in one 8-byte word (vector access
///        when aligned to 8 bytes), converted in registers with the `cvt` of `e4m3x2`/`e5m2x2`
///        (cuda_fp8.h), and the scaled reads and writes of `o` that every merge kernel uses for
///        any dtype (the scale applies to fp8 only; other dtypes compile to what they did).
///
/// The generic chunk functions of `tile/vec.cuh` are specialised here for the fp8 types: include
/// this header before a kernel instantiates them.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "cuda/arch/memory.cuh"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Eight fp8 elements as loaded from memory: one 8-byte word.
template <>
union Chunk<float8_e4m3_t> {
  uint2 w;                  ///< The word, for vector loads and stores.
  float8_e4m3_t e[kChunk];  ///< The elements.
};
/// @copydoc Chunk<float8_e4m3_t>
template <>
union Chunk<float8_e5m2_t> {
  uint2 w;                  ///< The word, for vector loads and stores.
  float8_e5m2_t e[kChunk];  ///< The elements.
};

namespace fp8 {

/// The cuda_fp8.h interpretation of the fp8 type `T`.
template <class T>
constexpr __nv_fp8_interpretation_t kind() {
  return std::is_same<T, float8_e4m3_t>::value ? __NV_E4M3 : __NV_E5M2;
}

template <class T>
__device__ __forceinline__ void load(Chunk<T>& c, const T* p, bool aligned, int n) {
  if (aligned) {
    c.w = *reinterpret_cast<const uint2*>(p);
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) c.e[k] = k < n ? p[k] : T{};
  }
}

template <class T>
__device__ __forceinline__ void load_stream(Chunk<T>& c, const T* p, bool aligned, int n) {
  if (aligned) {
    c.w = __ldg(reinterpret_cast<const uint2*>(p));  // read-only input of the running kernel
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) c.e[k] = k < n ? p[k] : T{};
  }
}

/// Rounds eight fp32 values to `T` (two per `cvt.rn.satfinite`), as `from_float<T>` does.
template <class T>
__device__ __forceinline__ void store(T* p, const float (&v)[kChunk], bool aligned, int n) {
  Chunk<T> c;
  std::uint32_t half[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    half[k] =
        __nv_cvt_float2_to_fp8x2(make_float2(v[2 * k], v[2 * k + 1]), __NV_SATFINITE, kind<T>());
  }
  c.w = make_uint2(half[0] | (half[1] << 16), half[2] | (half[3] << 16));
  if (aligned) {
    *reinterpret_cast<uint2*>(p) = c.w;
  } else {
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (k < n) p[k] = c.e[k];
    }
  }
}

}  // namespace fp8

/// @cond INTERNAL
template <>
__device__ __forceinline__ void load_chunk<float8_e4m3_t>(Chunk<float8_e4m3_t>& c,
                                                          const float8_e4m3_t* p, bool aligned,
                                                          int n) {
  fp8::load(c, p, aligned, n);
}
template <>
__device__ __forceinline__ void load_chunk<float8_e5m2_t>(Chunk<float8_e5m2_t>& c,
                                                          const float8_e5m2_t* p, bool aligned,
                                                          int n) {
  fp8::load(c, p, aligned, n);
}
template <>
__device__ __forceinline__ void load_chunk_stream<float8_e4m3_t>(Chunk<float8_e4m3_t>& c,
                                                                 const float8_e4m3_t* p,
                                                                 bool aligned, int n) {
  fp8::load_stream(c, p, aligned, n);
}
template <>
__device__ __forceinline__ void load_chunk_stream<float8_e5m2_t>(Chunk<float8_e5m2_t>& c,
                                                                 const float8_e5m2_t* p,
                                                                 bool aligned, int n) {
  fp8::load_stream(c, p, aligned, n);
}
template <>
__device__ __forceinline__ void prefetch_chunk_l2<float8_e4m3_t>(const float8_e4m3_t* p) {
  arch::prefetch_global_l2(p);
}
template <>
__device__ __forceinline__ void prefetch_chunk_l2<float8_e5m2_t>(const float8_e5m2_t* p) {
  arch::prefetch_global_l2(p);
}
template <>
__device__ __forceinline__ void store_chunk<float8_e4m3_t>(float8_e4m3_t* p,
                                                           const float (&v)[kChunk], bool aligned,
                                                           int n) {
  fp8::store(p, v, aligned, n);
}
template <>
__device__ __forceinline__ void store_chunk<float8_e5m2_t>(float8_e5m2_t* p,
                                                           const float (&v)[kChunk], bool aligned,
                                                           int n) {
  fp8::store(p, v, aligned, n);
}
/// @endcond

/// The real value of element `k` of a loaded chunk: `chunk_at`, times `scale` for an fp8 `T`
/// (rounded once in fp32, as the CPU merges compute it). For the other dtypes `scale` is unused.
template <class T>
__device__ __forceinline__ float o_value(const Chunk<T>& c, int k, float scale) {
  if constexpr (kIsFp8<T>) {
    return chunk_at(c, k) * scale;
  } else {
    return chunk_at(c, k);
  }
}

/// Stores eight real values at `p` (the first `n` when not aligned): `store_chunk`, of `v / scale`
/// for an fp8 `T` (rounded once in fp32, then saturating to the largest finite fp8 value). For the
/// other dtypes `scale` is unused.
template <class T>
__device__ __forceinline__ void store_o_chunk(T* p, const float (&v)[kChunk], bool aligned,
                                              float scale, int n = kChunk) {
  if constexpr (kIsFp8<T>) {
    float q[kChunk];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) q[k] = v[k] / scale;
    store_chunk(p, q, aligned, n);
  } else {
    store_chunk(p, v, aligned, n);
  }
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
