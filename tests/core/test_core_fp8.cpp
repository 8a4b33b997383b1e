/// @file test_core_fp8.cpp
/// @brief The fp8 storage types (e4m3fn, e5m2): every encoding to fp32 against a decoding from
///        the format's definition, and fp32 to fp8 against a nearest-value search over the
///        format's finite values (ties to even, saturation, NaN), on edge cases and many floats.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "attnstate/core/dtype.hpp"

namespace attnstate {
namespace {

float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

/// A format's parameters, from its definition.
struct Format {
  int mant;      // mantissa bits
  int bias;      // exponent bias
  bool has_inf;  // e5m2: all-ones exponent is inf (mantissa 0) or NaN; e4m3fn: only S.1111.111
};
constexpr Format kE4M3{3, 7, false};
constexpr Format kE5M2{2, 15, true};

/// Decodes `b` from the definition (sign, exponent, mantissa): the expected value.
double decode(const Format& f, std::uint8_t b) {
  const int exp_bits = 7 - f.mant;
  const int e = (b >> f.mant) & ((1 << exp_bits) - 1);
  const int m = b & ((1 << f.mant) - 1);
  const double sign = (b & 0x80) ? -1.0 : 1.0;
  const int all_ones = (1 << exp_bits) - 1;
  if (f.has_inf && e == all_ones) return m == 0 ? sign * INFINITY : NAN;
  if (!f.has_inf && e == all_ones && m == (1 << f.mant) - 1) return NAN;
  if (e == 0) return sign * std::ldexp(m, 1 - f.bias - f.mant);
  return sign * std::ldexp(1.0 + std::ldexp(m, -f.mant), e - f.bias);
}

template <class T>
float convert_to_float(std::uint8_t b) {
  return to_float(T{b});
}

/// The encoding a correct satfinite round-to-nearest-even conversion gives for `x`: NaN gives
/// 0x7F; otherwise the finite non-negative encoding nearest to min(|x|, max finite) (ties to the
/// even encoding), with the sign of `x`.
std::uint8_t reference_encode(const Format& f, float x) {
  if (std::isnan(x)) return 0x7F;
  std::vector<std::uint8_t> finite;  // non-negative finite encodings, ascending in value
  for (int b = 0; b < 0x80; ++b) {
    if (std::isfinite(decode(f, static_cast<std::uint8_t>(b))))
      finite.push_back(static_cast<std::uint8_t>(b));
  }
  const double max = decode(f, finite.back());
  const double a = std::min(std::fabs(static_cast<double>(x)), max);
  std::uint8_t best = finite[0];
  for (std::uint8_t b : finite) {
    const double d = std::fabs(decode(f, b) - a), db = std::fabs(decode(f, best) - a);
    if (d < db || (d == db && (b & 1) == 0)) best = b;
  }
  return static_cast<std::uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

template <class T>
void check_every_encoding(const Format& f) {
  int nans = 0;
  for (int b = 0; b < 256; ++b) {
    const float got = convert_to_float<T>(static_cast<std::uint8_t>(b));
    const double want = decode(f, static_cast<std::uint8_t>(b));
    if (std::isnan(want)) {
      ++nans;
      EXPECT_EQ(float_to_bits(got), detail::kFp8NanFloatBits) << "encoding " << b;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "encoding " << b;
      EXPECT_EQ(std::signbit(got), (b & 0x80) != 0) << "encoding " << b;  // -0 stays -0
      // The round trip gives a finite encoding back (every finite value is exact in fp32);
      // infinities saturate to the largest finite value of their sign.
      const int back = std::isinf(want) ? (b & 0x80) | 0x7B : b;
      EXPECT_EQ(from_float<T>(got).bits, back) << "encoding " << b;
    }
  }
  EXPECT_EQ(nans, f.has_inf ? 6 : 2);
}

TEST(Fp8, EveryE4M3EncodingConvertsExactly) { check_every_encoding<float8_e4m3_t>(kE4M3); }
TEST(Fp8, EveryE5M2EncodingConvertsExactly) { check_every_encoding<float8_e5m2_t>(kE5M2); }

/// Floats around every fp8 value: the value, its halfway points to the neighbours and one fp32
/// ulp either side of them, both signs; plus the specials.
std::vector<float> edge_floats(const Format& f) {
  std::vector<float> xs = {0.f,
                           -0.f,
                           INFINITY,
                           -INFINITY,
                           NAN,
                           -NAN,
                           bits_to_float(0x7F800001u),
                           bits_to_float(0xFFC00001u),
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::min(),
                           1e30f,
                           -1e30f};
  std::vector<double> values;
  for (int b = 0; b < 0x80; ++b) {
    const double v = decode(f, static_cast<std::uint8_t>(b));
    if (std::isfinite(v)) values.push_back(v);
  }
  values.push_back(2 * values.back());  // past the largest: the saturation side
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::vector<double> around = {values[i]};
    if (i + 1 < values.size()) around.push_back((values[i] + values[i + 1]) / 2);  // a tie
    for (double v : around) {
      const float c = static_cast<float>(v);  // exact: few significant bits
      for (float y : {c, std::nextafter(c, 0.f), std::nextafter(c, INFINITY)}) {
        xs.push_back(y);
        xs.push_back(-y);
      }
    }
  }
  return xs;
}

template <class T>
void check_rounding(const Format& f) {
  std::vector<float> xs = edge_floats(f);
  std::mt19937 gen(12345);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  // Random bit patterns (every exponent) and random floats in the format's range.
  for (int i = 0; i < 20000; ++i) xs.push_back(bits_to_float(any_bits(gen)));
  const double max = f.has_inf ? 57344.0 : 448.0;
  std::uniform_real_distribution<double> log_mag(std::log2(max) - 40, std::log2(max) + 2);
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>(std::exp2(log_mag(gen)));
    xs.push_back(i % 2 ? -x : x);
  }
  int bad = 0;
  for (float x : xs) {
    const std::uint8_t got = from_float<T>(x).bits, want = reference_encode(f, x);
    if (got != want && bad++ < 10) {
      ADD_FAILURE() << "x = " << x << " (bits 0x" << std::hex << float_to_bits(x) << "): got 0x"
                    << int(got) << " want 0x" << int(want);
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Fp8, FloatToE4M3RoundsToNearestEvenAndSaturates) { check_rounding<float8_e4m3_t>(kE4M3); }
TEST(Fp8, FloatToE5M2RoundsToNearestEvenAndSaturates) { check_rounding<float8_e5m2_t>(kE5M2); }

TEST(Fp8, NamedEdgeCases) {
  using E4 = float8_e4m3_t;
  using E5 = float8_e5m2_t;
  EXPECT_EQ(from_float<E4>(448.f).bits, 0x7E);
  EXPECT_EQ(from_float<E4>(464.f).bits, 0x7E);  // the tie past the largest: saturates
  EXPECT_EQ(from_float<E4>(1e9f).bits, 0x7E);
  EXPECT_EQ(from_float<E4>(-INFINITY).bits, 0xFE);
  EXPECT_EQ(from_float<E4>(NAN).bits, 0x7F);
  EXPECT_EQ(from_float<E4>(-NAN).bits, 0x7F);
  EXPECT_EQ(from_float<E4>(std::ldexp(1.f, -9)).bits, 0x01);    // smallest subnormal
  EXPECT_EQ(from_float<E4>(std::ldexp(1.f, -10)).bits, 0x00);   // its half: tie to even 0
  EXPECT_EQ(from_float<E4>(-std::ldexp(1.f, -10)).bits, 0x80);  // -0
  EXPECT_EQ(from_float<E4>(std::ldexp(3.f, -10)).bits, 0x02);   // 1.5 steps: tie to even 2
  EXPECT_EQ(from_float<E4>(1.0625f).bits, 0x38);                // 1 + half ulp: tie to 1
  EXPECT_EQ(from_float<E4>(1.1875f).bits, 0x3A);                // 1.125 + half ulp: to 1.25
  EXPECT_EQ(to_float(E4{0x7E}), 448.f);
  EXPECT_TRUE(std::isnan(to_float(E4{0xFF})));
  EXPECT_EQ(to_float(E4{0x01}), std::ldexp(1.f, -9));
  EXPECT_EQ(from_float<E5>(57344.f).bits, 0x7B);
  EXPECT_EQ(from_float<E5>(61440.f).bits, 0x7B);  // the tie towards inf: saturates
  EXPECT_EQ(from_float<E5>(INFINITY).bits, 0x7B);
  EXPECT_EQ(from_float<E5>(-INFINITY).bits, 0xFB);
  EXPECT_EQ(from_float<E5>(NAN).bits, 0x7F);
  EXPECT_EQ(from_float<E5>(std::ldexp(1.f, -16)).bits, 0x01);
  EXPECT_EQ(to_float(E5{0x7C}), INFINITY);
  EXPECT_EQ(to_float(E5{0xFC}), -INFINITY);
  EXPECT_TRUE(std::isnan(to_float(E5{0x7D})));
}

TEST(Fp8, SizesNamesValidityAndDispatch) {
  EXPECT_EQ(size_of(DType::kE4M3), 1u);
  EXPECT_EQ(size_of(DType::kE5M2), 1u);
  EXPECT_STREQ(to_string(DType::kE4M3), "e4m3");
  EXPECT_STREQ(to_string(DType::kE5M2), "e5m2");
  EXPECT_TRUE(is_valid(DType::kE4M3) && is_valid(DType::kE5M2));
  EXPECT_TRUE(is_fp8(DType::kE4M3) && is_fp8(DType::kE5M2));
  EXPECT_FALSE(is_fp8(DType::kF32) || is_fp8(DType::kF16) || is_fp8(DType::kBF16));
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2}) {
    const DType seen =
        dispatch_dtype_with_fp8(dt, [](auto tag) { return DTypeOf<decltype(tag)>::value; });
    EXPECT_EQ(seen, dt);
    EXPECT_EQ(dispatch_dtype_with_fp8(dt, [](auto tag) { return sizeof(tag); }), size_of(dt));
  }
  // The plain dispatch never treats an fp8 dtype as another type.
  for (DType dt : {DType::kE4M3, DType::kE5M2}) {
    try {
      dispatch_dtype(dt, [](auto) { return 0; });
      ADD_FAILURE() << "dispatch_dtype accepted " << to_string(dt);
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kNotSupported);
      EXPECT_NE(std::string(e.what()).find(to_string(dt)), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace attnstate
