/// @file test_core_fp8.cpp
/// @brief The fp8 storage types (e4m3fn, e5m2): every encoding to fp32 against a decoding from
///        the format's definition and against a written table of all 256 results, and fp32 to
///        fp8 against a nearest-value search over the format's finite values (ties to even,
///        saturation, NaN) on edge cases and many floats, and against a plain rounding in double
///        over a sweep of every fp32 binade.
#include <gtest/gtest.h>

#include <algorithm>
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
  int mant;          // mantissa bits
  int bias;          // exponent bias
  bool has_inf;      // e5m2: all-ones exponent is inf (mantissa 0) or NaN; e4m3fn: only S.1111.111
  std::uint8_t max;  // the encoding of the largest finite value
};
constexpr Format kE4M3{3, 7, false, 0x7E};
constexpr Format kE5M2{2, 15, true, 0x7B};

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

// fp32 bit patterns of every encoding, in encoding order, as the conversions gave them before
// the two formats shared one implementation (checked against the definition in check_table: 0x01
// of e4m3 is 2^-9, 0x7E is 448, 0x7F/0xFF are NaN; 0x7C of e5m2 is inf); every NaN reads as
// kFp8NanFloatBits.
constexpr std::uint32_t kE4M3Floats[256] = {
    0x00000000, 0x3B000000, 0x3B800000, 0x3BC00000, 0x3C000000, 0x3C200000, 0x3C400000, 0x3C600000,
    0x3C800000, 0x3C900000, 0x3CA00000, 0x3CB00000, 0x3CC00000, 0x3CD00000, 0x3CE00000, 0x3CF00000,
    0x3D000000, 0x3D100000, 0x3D200000, 0x3D300000, 0x3D400000, 0x3D500000, 0x3D600000, 0x3D700000,
    0x3D800000, 0x3D900000, 0x3DA00000, 0x3DB00000, 0x3DC00000, 0x3DD00000, 0x3DE00000, 0x3DF00000,
    0x3E000000, 0x3E100000, 0x3E200000, 0x3E300000, 0x3E400000, 0x3E500000, 0x3E600000, 0x3E700000,
    0x3E800000, 0x3E900000, 0x3EA00000, 0x3EB00000, 0x3EC00000, 0x3ED00000, 0x3EE00000, 0x3EF00000,
    0x3F000000, 0x3F100000, 0x3F200000, 0x3F300000, 0x3F400000, 0x3F500000, 0x3F600000, 0x3F700000,
    0x3F800000, 0x3F900000, 0x3FA00000, 0x3FB00000, 0x3FC00000, 0x3FD00000, 0x3FE00000, 0x3FF00000,
    0x40000000, 0x40100000, 0x40200000, 0x40300000, 0x40400000, 0x40500000, 0x40600000, 0x40700000,
    0x40800000, 0x40900000, 0x40A00000, 0x40B00000, 0x40C00000, 0x40D00000, 0x40E00000, 0x40F00000,
    0x41000000, 0x41100000, 0x41200000, 0x41300000, 0x41400000, 0x41500000, 0x41600000, 0x41700000,
    0x41800000, 0x41900000, 0x41A00000, 0x41B00000, 0x41C00000, 0x41D00000, 0x41E00000, 0x41F00000,
    0x42000000, 0x42100000, 0x42200000, 0x42300000, 0x42400000, 0x42500000, 0x42600000, 0x42700000,
    0x42800000, 0x42900000, 0x42A00000, 0x42B00000, 0x42C00000, 0x42D00000, 0x42E00000, 0x42F00000,
    0x43000000, 0x43100000, 0x43200000, 0x43300000, 0x43400000, 0x43500000, 0x43600000, 0x43700000,
    0x43800000, 0x43900000, 0x43A00000, 0x43B00000, 0x43C00000, 0x43D00000, 0x43E00000, 0x7FFFFFFF,
    0x80000000, 0xBB000000, 0xBB800000, 0xBBC00000, 0xBC000000, 0xBC200000, 0xBC400000, 0xBC600000,
    0xBC800000, 0xBC900000, 0xBCA00000, 0xBCB00000, 0xBCC00000, 0xBCD00000, 0xBCE00000, 0xBCF00000,
    0xBD000000, 0xBD100000, 0xBD200000, 0xBD300000, 0xBD400000, 0xBD500000, 0xBD600000, 0xBD700000,
    0xBD800000, 0xBD900000, 0xBDA00000, 0xBDB00000, 0xBDC00000, 0xBDD00000, 0xBDE00000, 0xBDF00000,
    0xBE000000, 0xBE100000, 0xBE200000, 0xBE300000, 0xBE400000, 0xBE500000, 0xBE600000, 0xBE700000,
    0xBE800000, 0xBE900000, 0xBEA00000, 0xBEB00000, 0xBEC00000, 0xBED00000, 0xBEE00000, 0xBEF00000,
    0xBF000000, 0xBF100000, 0xBF200000, 0xBF300000, 0xBF400000, 0xBF500000, 0xBF600000, 0xBF700000,
    0xBF800000, 0xBF900000, 0xBFA00000, 0xBFB00000, 0xBFC00000, 0xBFD00000, 0xBFE00000, 0xBFF00000,
    0xC0000000, 0xC0100000, 0xC0200000, 0xC0300000, 0xC0400000, 0xC0500000, 0xC0600000, 0xC0700000,
    0xC0800000, 0xC0900000, 0xC0A00000, 0xC0B00000, 0xC0C00000, 0xC0D00000, 0xC0E00000, 0xC0F00000,
    0xC1000000, 0xC1100000, 0xC1200000, 0xC1300000, 0xC1400000, 0xC1500000, 0xC1600000, 0xC1700000,
    0xC1800000, 0xC1900000, 0xC1A00000, 0xC1B00000, 0xC1C00000, 0xC1D00000, 0xC1E00000, 0xC1F00000,
    0xC2000000, 0xC2100000, 0xC2200000, 0xC2300000, 0xC2400000, 0xC2500000, 0xC2600000, 0xC2700000,
    0xC2800000, 0xC2900000, 0xC2A00000, 0xC2B00000, 0xC2C00000, 0xC2D00000, 0xC2E00000, 0xC2F00000,
    0xC3000000, 0xC3100000, 0xC3200000, 0xC3300000, 0xC3400000, 0xC3500000, 0xC3600000, 0xC3700000,
    0xC3800000, 0xC3900000, 0xC3A00000, 0xC3B00000, 0xC3C00000, 0xC3D00000, 0xC3E00000, 0x7FFFFFFF,
};
constexpr std::uint32_t kE5M2Floats[256] = {
    0x00000000, 0x37800000, 0x38000000, 0x38400000, 0x38800000, 0x38A00000, 0x38C00000, 0x38E00000,
    0x39000000, 0x39200000, 0x39400000, 0x39600000, 0x39800000, 0x39A00000, 0x39C00000, 0x39E00000,
    0x3A000000, 0x3A200000, 0x3A400000, 0x3A600000, 0x3A800000, 0x3AA00000, 0x3AC00000, 0x3AE00000,
    0x3B000000, 0x3B200000, 0x3B400000, 0x3B600000, 0x3B800000, 0x3BA00000, 0x3BC00000, 0x3BE00000,
    0x3C000000, 0x3C200000, 0x3C400000, 0x3C600000, 0x3C800000, 0x3CA00000, 0x3CC00000, 0x3CE00000,
    0x3D000000, 0x3D200000, 0x3D400000, 0x3D600000, 0x3D800000, 0x3DA00000, 0x3DC00000, 0x3DE00000,
    0x3E000000, 0x3E200000, 0x3E400000, 0x3E600000, 0x3E800000, 0x3EA00000, 0x3EC00000, 0x3EE00000,
    0x3F000000, 0x3F200000, 0x3F400000, 0x3F600000, 0x3F800000, 0x3FA00000, 0x3FC00000, 0x3FE00000,
    0x40000000, 0x40200000, 0x40400000, 0x40600000, 0x40800000, 0x40A00000, 0x40C00000, 0x40E00000,
    0x41000000, 0x41200000, 0x41400000, 0x41600000, 0x41800000, 0x41A00000, 0x41C00000, 0x41E00000,
    0x42000000, 0x42200000, 0x42400000, 0x42600000, 0x42800000, 0x42A00000, 0x42C00000, 0x42E00000,
    0x43000000, 0x43200000, 0x43400000, 0x43600000, 0x43800000, 0x43A00000, 0x43C00000, 0x43E00000,
    0x44000000, 0x44200000, 0x44400000, 0x44600000, 0x44800000, 0x44A00000, 0x44C00000, 0x44E00000,
    0x45000000, 0x45200000, 0x45400000, 0x45600000, 0x45800000, 0x45A00000, 0x45C00000, 0x45E00000,
    0x46000000, 0x46200000, 0x46400000, 0x46600000, 0x46800000, 0x46A00000, 0x46C00000, 0x46E00000,
    0x47000000, 0x47200000, 0x47400000, 0x47600000, 0x7F800000, 0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF,
    0x80000000, 0xB7800000, 0xB8000000, 0xB8400000, 0xB8800000, 0xB8A00000, 0xB8C00000, 0xB8E00000,
    0xB9000000, 0xB9200000, 0xB9400000, 0xB9600000, 0xB9800000, 0xB9A00000, 0xB9C00000, 0xB9E00000,
    0xBA000000, 0xBA200000, 0xBA400000, 0xBA600000, 0xBA800000, 0xBAA00000, 0xBAC00000, 0xBAE00000,
    0xBB000000, 0xBB200000, 0xBB400000, 0xBB600000, 0xBB800000, 0xBBA00000, 0xBBC00000, 0xBBE00000,
    0xBC000000, 0xBC200000, 0xBC400000, 0xBC600000, 0xBC800000, 0xBCA00000, 0xBCC00000, 0xBCE00000,
    0xBD000000, 0xBD200000, 0xBD400000, 0xBD600000, 0xBD800000, 0xBDA00000, 0xBDC00000, 0xBDE00000,
    0xBE000000, 0xBE200000, 0xBE400000, 0xBE600000, 0xBE800000, 0xBEA00000, 0xBEC00000, 0xBEE00000,
    0xBF000000, 0xBF200000, 0xBF400000, 0xBF600000, 0xBF800000, 0xBFA00000, 0xBFC00000, 0xBFE00000,
    0xC0000000, 0xC0200000, 0xC0400000, 0xC0600000, 0xC0800000, 0xC0A00000, 0xC0C00000, 0xC0E00000,
    0xC1000000, 0xC1200000, 0xC1400000, 0xC1600000, 0xC1800000, 0xC1A00000, 0xC1C00000, 0xC1E00000,
    0xC2000000, 0xC2200000, 0xC2400000, 0xC2600000, 0xC2800000, 0xC2A00000, 0xC2C00000, 0xC2E00000,
    0xC3000000, 0xC3200000, 0xC3400000, 0xC3600000, 0xC3800000, 0xC3A00000, 0xC3C00000, 0xC3E00000,
    0xC4000000, 0xC4200000, 0xC4400000, 0xC4600000, 0xC4800000, 0xC4A00000, 0xC4C00000, 0xC4E00000,
    0xC5000000, 0xC5200000, 0xC5400000, 0xC5600000, 0xC5800000, 0xC5A00000, 0xC5C00000, 0xC5E00000,
    0xC6000000, 0xC6200000, 0xC6400000, 0xC6600000, 0xC6800000, 0xC6A00000, 0xC6C00000, 0xC6E00000,
    0xC7000000, 0xC7200000, 0xC7400000, 0xC7600000, 0xFF800000, 0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF,
};

template <class T>
void check_table(const Format& f, const std::uint32_t (&table)[256]) {
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(float_to_bits(convert_to_float<T>(static_cast<std::uint8_t>(b))), table[b])
        << "encoding " << b;
    // The table itself against the definition.
    const double want = decode(f, static_cast<std::uint8_t>(b));
    const float t = bits_to_float(table[b]);
    if (std::isnan(want)) {
      EXPECT_EQ(table[b], detail::kFp8NanFloatBits) << "encoding " << b;
    } else {
      EXPECT_EQ(static_cast<double>(t), want) << "encoding " << b;
      EXPECT_EQ(std::signbit(t), (b & 0x80) != 0) << "encoding " << b;
    }
  }
}

TEST(Fp8, EveryE4M3EncodingMatchesTheTable) { check_table<float8_e4m3_t>(kE4M3, kE4M3Floats); }
TEST(Fp8, EveryE5M2EncodingMatchesTheTable) { check_table<float8_e5m2_t>(kE5M2, kE5M2Floats); }

/// The encoding of `x` the plain way, in double: NaN gives 0x7F; the magnitude is clamped to the
/// largest finite value, divided by the quantum of its binade (the subnormal step below the
/// smallest normal), rounded half to even (`nearbyint`), and the exponent and mantissa are read
/// off the rounded value.
std::uint8_t plain_encode(const Format& f, float x) {
  if (std::isnan(x)) return 0x7F;
  const double a = std::min(std::fabs(static_cast<double>(x)), decode(f, f.max));
  int e = 0;
  std::frexp(a, &e);                            // a = m · 2^e, m in [0.5, 1) (e = 0 for 0)
  const int exp = std::max(e - 1, 1 - f.bias);  // the binade, at least the smallest normal's
  long q = std::lrint(std::nearbyint(std::ldexp(a, f.mant - exp)));  // exact scaling
  int field = exp + f.bias;
  if (q == (2L << f.mant)) {  // rounded up into the next binade
    q >>= 1;
    ++field;
  }
  if (q < (1L << f.mant)) field = 0;  // a subnormal (or zero)
  const long mantissa = q & ((1L << f.mant) - 1);
  const int sign = std::signbit(x) ? 0x80 : 0;
  return static_cast<std::uint8_t>(sign | (field << f.mant) | static_cast<int>(mantissa));
}

template <class T>
void check_plain_rounding(const Format& f) {
  // The two references agree on the edge cases (ties, subnormals, saturation, specials).
  for (float x : edge_floats(f))
    EXPECT_EQ(plain_encode(f, x), reference_encode(f, x)) << "x = " << x;
  // Every 4099th fp32 bit pattern (every binade, both signs, many low mantissa bits), and every
  // third fp32 of two binades: the one just below the smallest normal (subnormal results and
  // the rounding up into the normals) and the largest finite value's (the saturation).
  int bad = 0;
  const auto check = [&](std::uint32_t u) {
    const float x = bits_to_float(u);
    const std::uint8_t got = from_float<T>(x).bits, want = plain_encode(f, x);
    if (got != want && bad++ < 10) {
      ADD_FAILURE() << "x = " << x << " (bits 0x" << std::hex << u << "): got 0x" << int(got)
                    << " want 0x" << int(want);
    }
  };
  for (std::uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4099) check(static_cast<std::uint32_t>(u));
  int max_exp = 0;
  std::frexp(decode(f, f.max), &max_exp);
  for (const int e2 : {-f.bias, max_exp - 1}) {  // the binade [2^e2, 2^(e2 + 1))
    const std::uint32_t lo = static_cast<std::uint32_t>(127 + e2) << 23;
    for (std::uint32_t u = lo; u < lo + (1u << 23); u += 3) check(u);
  }
  EXPECT_EQ(bad, 0);
}

TEST(Fp8, FloatToE4M3MatchesAPlainRounding) { check_plain_rounding<float8_e4m3_t>(kE4M3); }
TEST(Fp8, FloatToE5M2MatchesAPlainRounding) { check_plain_rounding<float8_e5m2_t>(kE5M2); }

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
