/// @file dtype.hpp
/// @brief Storage dtypes (f32, f16, bf16, fp8 e4m3 and e5m2) with bit-exact host and device
///        conversions.
///
/// `half_t` and `bfloat16_t` are 16-bit storage types, bit-compatible with CUDA's `__half` and
/// `__nv_bfloat16`; `float8_e4m3_t` and `float8_e5m2_t` are 8-bit storage types, bit-compatible
/// with `__nv_fp8_e4m3` and `__nv_fp8_e5m2`. On the host they convert with round-to-nearest-even
/// in portable C++; in device code the conversions use CUDA's intrinsics. Conversions to fp8
/// saturate to the largest finite value (`__NV_SATFINITE`). Arithmetic is always done in fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attnstate/core/config.hpp"
#include "attnstate/core/error.hpp"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace attnstate {

/// Element type of a stored tensor. Accumulation is always fp32 whatever the storage type.
enum class DType : std::uint8_t {
  kF32 = 0,   ///< IEEE binary32.
  kF16 = 1,   ///< IEEE binary16 (`__half`).
  kBF16 = 2,  ///< bfloat16 (`__nv_bfloat16`).
  kE4M3 = 3,  ///< OCP float8 e4m3fn (`__nv_fp8_e4m3`): no infinities, NaN 0x7F/0xFF, max 448.
  kE5M2 = 4,  ///< OCP float8 e5m2 (`__nv_fp8_e5m2`): IEEE-like with inf and NaN, max 57344.
};

/// True for the 8-bit dtypes (e4m3, e5m2), the only ones whose views carry a scale.
inline constexpr bool is_fp8(DType dt) { return dt == DType::kE4M3 || dt == DType::kE5M2; }

/// Size in bytes of one element of `dt`.
inline std::size_t size_of(DType dt) { return dt == DType::kF32 ? 4u : (is_fp8(dt) ? 1u : 2u); }

/// Name of a dtype ("f32", "f16", "bf16", "e4m3", "e5m2").
inline const char* to_string(DType dt) {
  switch (dt) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kE4M3:
      return "e4m3";
    case DType::kE5M2:
      return "e5m2";
  }
  return "unknown";
}

/// True for a dtype this library knows.
inline bool is_valid(DType dt) {
  return dt == DType::kF32 || dt == DType::kF16 || dt == DType::kBF16 || is_fp8(dt);
}

/// IEEE binary16 storage, bit-compatible with `__half`.
struct half_t {
  std::uint16_t bits;  ///< The binary16 bit pattern.
};
/// bfloat16 storage, bit-compatible with `__nv_bfloat16`.
struct bfloat16_t {
  std::uint16_t bits;  ///< The bfloat16 bit pattern (the high half of an fp32).
};
/// OCP float8 e4m3fn storage, bit-compatible with `__nv_fp8_e4m3`: sign, 4 exponent bits
/// (bias 7), 3 mantissa bits; no infinities; NaN is `0x7F`/`0xFF`; largest finite 448.
struct float8_e4m3_t {
  std::uint8_t bits;  ///< The e4m3 bit pattern.
};
/// OCP float8 e5m2 storage, bit-compatible with `__nv_fp8_e5m2`: sign, 5 exponent bits (bias
/// 15), 2 mantissa bits; infinities `0x7C`/`0xFC`; largest finite 57344.
struct float8_e5m2_t {
  std::uint8_t bits;  ///< The e5m2 bit pattern.
};
static_assert(sizeof(half_t) == 2 && alignof(half_t) == 2, "half_t must be 2 bytes");
static_assert(sizeof(bfloat16_t) == 2 && alignof(bfloat16_t) == 2, "bfloat16_t must be 2 bytes");
static_assert(sizeof(float8_e4m3_t) == 1 && sizeof(float8_e5m2_t) == 1, "fp8 types are 1 byte");

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

/// The float NaN every fp8 NaN converts to on the host (sign and payload dropped, as CUDA's
/// host conversions do; device conversions give a NaN whose bits are the hardware's).
constexpr std::uint32_t kFp8NanFloatBits = 0x7FFFFFFFu;

/// An fp8 format, described by its fields (1 sign bit, `kExpBits` exponent bits, `kMant`
/// mantissa bits; exponent bias `2^(kExpBits - 1) - 1`) and its special values: the encoding of
/// the largest finite magnitude, and whether the all-ones exponent holds infinities (mantissa
/// 0) and NaNs (else), IEEE-like, or only the NaN `S.1...1` (the "fn" formats, without
/// infinities). Conversions from fp32 give `kNanBits` for every NaN.
template <int kExpBitsV, int kMantV, std::uint32_t kMaxFiniteV, bool kHasInfV>
struct Fp8Format {
  static constexpr int kExpBits = kExpBitsV;
  static constexpr int kMant = kMantV;
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  static constexpr std::uint32_t kMaxFinite = kMaxFiniteV;
  static constexpr bool kHasInf = kHasInfV;
  static constexpr std::uint32_t kNanBits = 0x7Fu;
  static_assert(kExpBits + kMant == 7, "an fp8 format has 7 bits besides the sign");
};

/// The format of an fp8 storage type, and its `cuda_fp8.h` interpretation in CUDA builds.
template <class T>
struct Fp8FormatOf;
/// e4m3fn: bias 7, largest finite 0x7E (448), no infinities, NaN 0x7F/0xFF.
template <>
struct Fp8FormatOf<float8_e4m3_t> : Fp8Format<4, 3, 0x7Eu, false> {
#if defined(__CUDACC__)
  static constexpr __nv_fp8_interpretation_t kCuda = __NV_E4M3;
#endif
};
/// e5m2: bias 15, largest finite 0x7B (57344), infinities 0x7C/0xFC, NaN 0x7D..0x7F (either sign).
template <>
struct Fp8FormatOf<float8_e5m2_t> : Fp8Format<5, 2, 0x7Bu, true> {
#if defined(__CUDACC__)
  static constexpr __nv_fp8_interpretation_t kCuda = __NV_E5M2;
#endif
};

/// fp8 bits -> float (exact) in the format `F`. Normals rebias the exponent; subnormals are
/// `m · 2^(1 - kBias - kMant)`, computed exactly as `(2^(1-kBias) · (1 + m/2^kMant)) -
/// 2^(1-kBias)`; formats with infinities map the all-ones exponent with mantissa 0 to infinity;
/// every NaN becomes `kFp8NanFloatBits`.
template <class F>
ATTNSTATE_HOST_DEVICE float fp8_bits_to_float(std::uint8_t b) {
  const std::uint32_t v = b & 0x7Fu;
  const std::uint32_t u = v << (23 - F::kMant);
  const std::uint32_t e = v >> F::kMant;
  const std::uint32_t min_normal = static_cast<std::uint32_t>(127 - F::kBias + 1) << 23;
  const std::uint32_t normal = u + (static_cast<std::uint32_t>(127 - F::kBias) << 23);
  const std::uint32_t subnormal =
      float_bits(bits_float(u + min_normal) - bits_float(min_normal));  // exact
  const std::uint32_t mag = e == 0 ? subnormal : normal;
  const bool inf = F::kHasInf && v == (0x7Fu & ~((1u << F::kMant) - 1u));
  const bool nan = F::kHasInf ? (e == (0x7Fu >> F::kMant) && !inf) : v == 0x7Fu;
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  return bits_float(nan ? kFp8NanFloatBits : (inf ? sign | 0x7F800000u : sign | mag));
}

/// float -> fp8 bits in the format `F`, round to nearest even and saturating (`__NV_SATFINITE`):
/// magnitudes past the largest finite value, infinities included, give the largest finite
/// value; NaN gives `F::kNanBits`. The magnitude is first clamped to the largest finite value
/// (rounding is monotonic, so this is the saturation); subnormal results are rounded by one fp32
/// addition of a magic constant (which rounds to nearest even in hardware), normal results by an
/// integer rounding bias.
template <class F>
ATTNSTATE_HOST_DEVICE std::uint8_t float_to_fp8_bits(float f) {
  const std::uint32_t bits = float_bits(f);
  const std::uint32_t sign = (bits >> 24) & 0x80u;
  const std::uint32_t x0 = bits & 0x7FFFFFFFu;
  constexpr int kShift = 23 - F::kMant;
  const std::uint32_t max_float =
      (F::kMaxFinite << kShift) + (static_cast<std::uint32_t>(127 - F::kBias) << 23);
  const std::uint32_t x = x0 > max_float ? max_float : x0;  // NaN handled below
  // Subnormal results: one addition to 2^(kShift + 1 - kBias) (whose ulp is the fp8 subnormal
  // step), then the integer difference is the fp8 encoding (2^kMant is the smallest normal).
  const float magic = bits_float(static_cast<std::uint32_t>(127 + kShift + 1 - F::kBias) << 23);
  const std::uint32_t subnormal = float_bits(bits_float(x) + magic) - float_bits(magic);
  const std::uint32_t normal = (x - (static_cast<std::uint32_t>(127 - F::kBias) << 23) +
                                ((1u << (kShift - 1)) - 1u) + ((x >> kShift) & 1u)) >>
                               kShift;
  const bool is_sub = x < (static_cast<std::uint32_t>(127 - F::kBias + 1) << 23);
  const std::uint32_t r = is_sub ? subnormal : normal;
  return static_cast<std::uint8_t>(x0 > 0x7F800000u ? F::kNanBits : (sign | r));
}

/// An fp8 value of storage type `T` to fp32 (exact; NaN gives a NaN): CUDA's intrinsic in device
/// code, fp8_bits_to_float() on the host.
template <class T>
ATTNSTATE_HOST_DEVICE float fp8_to_float(T x) {
  using F = Fp8FormatOf<T>;
#if ATTNSTATE_DEVICE_PASS
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(x.bits, F::kCuda)));
#else
  return fp8_bits_to_float<F>(x.bits);
#endif
}

/// fp32 to the fp8 storage type `T`, round to nearest even, saturating, NaN staying NaN: CUDA's
/// intrinsic in device code, float_to_fp8_bits() on the host.
template <class T>
ATTNSTATE_HOST_DEVICE T fp8_from_float(float x) {
  using F = Fp8FormatOf<T>;
#if ATTNSTATE_DEVICE_PASS
  return T{__nv_cvt_float_to_fp8(x, __NV_SATFINITE, F::kCuda)};
#else
  return T{float_to_fp8_bits<F>(x)};
#endif
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

/// Converts an e4m3 value to fp32 (exact; NaN gives a NaN).
ATTNSTATE_HOST_DEVICE float to_float(float8_e4m3_t x) { return detail::fp8_to_float(x); }
/// Converts an e5m2 value to fp32 (exact; NaN gives a NaN).
ATTNSTATE_HOST_DEVICE float to_float(float8_e5m2_t x) { return detail::fp8_to_float(x); }

/// Rounds an fp32 value once to the storage type `T` (round to nearest even; for the fp8 types
/// saturating to the largest finite value, NaN staying NaN).
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
template <>
ATTNSTATE_HOST_DEVICE float8_e4m3_t from_float<float8_e4m3_t>(float x) {
  return detail::fp8_from_float<float8_e4m3_t>(x);
}
template <>
ATTNSTATE_HOST_DEVICE float8_e5m2_t from_float<float8_e5m2_t>(float x) {
  return detail::fp8_from_float<float8_e5m2_t>(x);
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
template <>
struct DTypeOf<float8_e4m3_t> {
  static constexpr DType value = DType::kE4M3;
};
template <>
struct DTypeOf<float8_e5m2_t> {
  static constexpr DType value = DType::kE5M2;
};
/// @endcond

/// True for the fp8 storage types (`float8_e4m3_t`, `float8_e5m2_t`).
template <class T>
constexpr bool kIsFp8 =
    std::is_same<T, float8_e4m3_t>::value || std::is_same<T, float8_e5m2_t>::value;

/// Calls `f(T{})` with `T` the storage type of `dt` (float, half_t or bfloat16_t): the one
/// place where a runtime dtype becomes a compile-time type. The fp8 dtypes are not dispatched
/// here (their `o` carries a scale that the caller must apply): they throw `kNotSupported`, so a
/// caller that did not reject them reads no element with the wrong size; callers that handle
/// fp8 use dispatch_dtype_with_fp8().
/// @throws Error (`kNotSupported`) for e4m3 and e5m2.
template <class F>
decltype(auto) dispatch_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::kF16:
      return f(half_t{});
    case DType::kBF16:
      return f(bfloat16_t{});
    case DType::kE4M3:
    case DType::kE5M2:
      detail::throw_argument("attnstate::dispatch_dtype", "dt", "f32, f16 or bf16", to_string(dt),
                             Status::kNotSupported);
    default:
      return f(float{});
  }
}

/// dispatch_dtype() over every dtype: `T` is also `float8_e4m3_t` or `float8_e5m2_t`.
template <class F>
decltype(auto) dispatch_dtype_with_fp8(DType dt, F&& f) {
  switch (dt) {
    case DType::kE4M3:
      return f(float8_e4m3_t{});
    case DType::kE5M2:
      return f(float8_e5m2_t{});
    default:
      return dispatch_dtype(dt, static_cast<F&&>(f));
  }
}

}  // namespace attnstate
