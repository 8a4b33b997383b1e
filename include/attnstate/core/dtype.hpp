/// @file dtype.hpp
/// @brief Storage dtypes (f32, f16, bf16) with bit-exact host and device conversions.
///
/// `half_t` and `bfloat16_t` are 16-bit storage types, bit-compatible with CUDA's `__half` and
/// `__nv_bfloat16`. On the host they convert with round-to-nearest-even in portable C++; in
/// device code the conversions use CUDA's intrinsics. Arithmetic is always done in fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "attnstate/core/config.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace attnstate {

/// Element type of a stored tensor. Accumulation is always fp32 whatever the storage type.
enum class DType : std::uint8_t {
  kF32 = 0,   ///< IEEE binary32.
  kF16 = 1,   ///< IEEE binary16 (`__half`).
  kBF16 = 2,  ///< bfloat16 (`__nv_bfloat16`).
};

/// Size in bytes of one element of `dt`.
inline std::size_t size_of(DType dt) { return dt == DType::kF32 ? 4u : 2u; }

/// Name of a dtype ("f32", "f16", "bf16").
inline const char* to_string(DType dt) {
  switch (dt) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

/// True for a dtype this library knows.
inline bool is_valid(DType dt) {
  return dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16;
}

/// IEEE binary16 storage, bit-compatible with `__half`.
struct half_t {
  std::uint16_t bits;  ///< The binary16 bit pattern.
};
/// bfloat16 storage, bit-compatible with `__nv_bfloat16`.
struct bfloat16_t {
  std::uint16_t bits;  ///< The bfloat16 bit pattern (the high half of an fp32).
};
static_assert(sizeof(half_t) == 2 && alignof(half_t) == 2, "half_t must be 2 bytes");
static_assert(sizeof(bfloat16_t) == 2 && alignof(bfloat16_t) == 2, "bfloat16_t must be 2 bytes");

namespace detail {

ATTNSTATE_HOST_DEVICE std::uint32_t float_bits(float f) {
#if ATTNSTATE_DEVICE_PASS
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

ATTNSTATE_HOST_DEVICE float bits_float(std::uint32_t u) {
#if ATTNSTATE_DEVICE_PASS
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

/// binary16 bits -> float (exact). Every case is computed and one is selected, so host loops
/// over arrays vectorise: normals rebias the exponent, inf/NaN get the all-ones exponent, and
/// subnormals are renormalised by one exact fp32 subtraction.
ATTNSTATE_HOST_DEVICE float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h & 0x7FFFu) << 13;
  const std::uint32_t e = u & 0x0F800000u;        // the exponent field, in place
  const std::uint32_t normal = u + 0x38000000u;   // exponent + (127 - 15)
  const std::uint32_t inf_nan = u + 0x70000000u;  // exponent + (127 - 15) + (128 - 16)
  const std::uint32_t subnormal =
      float_bits(bits_float(u + 0x38800000u) - bits_float(0x38800000u));  // m·2^-24, exact
  // Branch-free selection with masks (keeps host loops free of control flow).
  const std::uint32_t is_special = 0u - static_cast<std::uint32_t>(e == 0x0F800000u);
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(e == 0u);
  const std::uint32_t r =
      (inf_nan & is_special) | (subnormal & is_sub) | (normal & ~(is_special | is_sub));
  return bits_float(r | (static_cast<std::uint32_t>(h & 0x8000u) << 16));
}

/// float -> binary16 bits, round to nearest even; NaN stays NaN, overflow gives inf.
/// Subnormal results are rounded by one fp32 addition of a magic constant (which rounds to
/// nearest even in hardware), normal results by an integer rounding bias; every case is computed
/// and one selected, so host loops over arrays vectorise.
ATTNSTATE_HOST_DEVICE std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t bits = float_bits(f);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t x = bits & 0x7FFFFFFFu;
  const std::uint32_t inf_nan = x > 0x7F800000u ? 0x7E00u : 0x7C00u;
  const float denorm_magic = bits_float(((127u - 15u) + (23u - 10u) + 1u) << 23);
  const std::uint32_t subnormal =
      float_bits(bits_float(x) + denorm_magic) - float_bits(denorm_magic);
  const std::uint32_t normal = (x - 0x38000000u + 0xFFFu + ((x >> 13) & 1u)) >> 13;
  // Branch-free selection with masks (keeps host loops free of control flow).
  const std::uint32_t is_big = 0u - static_cast<std::uint32_t>(x >= 0x47800000u);
  const std::uint32_t is_sub = 0u - static_cast<std::uint32_t>(x < 0x38800000u);
  const std::uint32_t h = (inf_nan & is_big) | (subnormal & is_sub) | (normal & ~(is_big | is_sub));
  return static_cast<std::uint16_t>(sign | h);
}

/// bfloat16 bits -> float (exact).
ATTNSTATE_HOST_DEVICE float bf16_bits_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

/// float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
ATTNSTATE_HOST_DEVICE std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (x >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((x & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

}  // namespace detail

/// Converts a stored element to fp32 (the identity for fp32).
ATTNSTATE_HOST_DEVICE float to_float(float x) { return x; }
/// Converts a binary16 value to fp32 (exact).
ATTNSTATE_HOST_DEVICE float to_float(half_t x) {
#if ATTNSTATE_DEVICE_PASS
  return __half2float(__ushort_as_half(x.bits));
#else
  return detail::half_bits_to_float(x.bits);
#endif
}
/// Converts a bfloat16 value to fp32 (exact).
ATTNSTATE_HOST_DEVICE float to_float(bfloat16_t x) {
#if ATTNSTATE_DEVICE_PASS
  return __bfloat162float(__ushort_as_bfloat16(x.bits));
#else
  return detail::bf16_bits_to_float(x.bits);
#endif
}

/// Rounds an fp32 value once to the storage type `T` (round to nearest even).
template <class T>
ATTNSTATE_HOST_DEVICE T from_float(float x);

/// @cond INTERNAL
template <>
ATTNSTATE_HOST_DEVICE float from_float<float>(float x) {
  return x;
}
template <>
ATTNSTATE_HOST_DEVICE half_t from_float<half_t>(float x) {
#if ATTNSTATE_DEVICE_PASS
  return half_t{__half_as_ushort(__float2half_rn(x))};
#else
  return half_t{detail::float_to_half_bits(x)};
#endif
}
template <>
ATTNSTATE_HOST_DEVICE bfloat16_t from_float<bfloat16_t>(float x) {
#if ATTNSTATE_DEVICE_PASS
  return bfloat16_t{__bfloat16_as_ushort(__float2bfloat16_rn(x))};
#else
  return bfloat16_t{detail::float_to_bf16_bits(x)};
#endif
}
/// @endcond

/// Maps a storage type to its `DType` tag: `DTypeOf<half_t>::value == DType::kF16`.
template <class T>
struct DTypeOf;
/// @cond INTERNAL
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<half_t> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<bfloat16_t> {
  static constexpr DType value = DType::kBF16;
};
/// @endcond

/// Calls `f(T{})` with `T` the storage type of `dt` (float, half_t or bfloat16_t): the one
/// place where a runtime dtype becomes a compile-time type.
template <class F>
decltype(auto) dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::kF16:
      return f(half_t{});
    case DType::kBF16:
      return f(bfloat16_t{});
    default:
      return f(float{});
  }
}

}  // namespace attnstate
