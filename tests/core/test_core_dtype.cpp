/// @file test_core_dtype.cpp
/// @brief core/dtype.hpp: f16 and bf16 conversions against independent references (every bit
///        pattern, ties to even, overflow, NaN, subnormals) and the dtype helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "attnstate/core/dtype.hpp"

namespace attnstate {
namespace {

float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Independent decoding of binary16 bits (ldexp of the fields).
double half_value(std::uint16_t h) {
  const int sign = (h >> 15) & 1, e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v;
  if (e == 0) {
    v = std::ldexp(static_cast<double>(m), -24);
  } else if (e == 31) {
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(1.0 + m / 1024.0, e - 15);
  }
  return sign ? -v : v;
}

bool half_is_nan(std::uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7F80) == 0x7F80 && (b & 0x7F) != 0; }

TEST(HalfConversion, EveryBitPatternDecodesExactlyAndRoundTrips) {
  for (std::uint32_t u = 0; u < 65536; ++u) {
    const auto h = static_cast<std::uint16_t>(u);
    const float f = to_float(half_t{h});
    if (half_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << u;
      const std::uint16_t back = from_float<half_t>(f).bits;
      ASSERT_TRUE(half_is_nan(back)) << std::hex << u;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << "NaN sign kept";
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), half_value(h)) << std::hex << u;
    ASSERT_EQ(from_float<half_t>(f).bits, h) << std::hex << u;
  }
}

TEST(HalfConversion, MidpointsRoundToNearestEven) {
  // Every pair of adjacent non-negative finite halves (subnormals included): the midpoint is
  // exact in float and must round to the even one; one float ulp either side rounds to nearest.
  for (std::uint32_t lo = 0; lo < 0x7BFF; ++lo) {
    const auto hl = static_cast<std::uint16_t>(lo), hh = static_cast<std::uint16_t>(lo + 1);
    const float mid = static_cast<float>((half_value(hl) + half_value(hh)) / 2);
    ASSERT_EQ(static_cast<double>(mid), (half_value(hl) + half_value(hh)) / 2);
    const std::uint16_t even = (lo & 1) ? hh : hl;
    ASSERT_EQ(from_float<half_t>(mid).bits, even) << std::hex << lo;
    ASSERT_EQ(from_float<half_t>(-mid).bits, even | 0x8000) << std::hex << lo;
    ASSERT_EQ(from_float<half_t>(std::nextafter(mid, 0.f)).bits, hl) << std::hex << lo;
    ASSERT_EQ(from_float<half_t>(std::nextafter(mid, INFINITY)).bits, hh) << std::hex << lo;
  }
}

TEST(HalfConversion, OverflowGivesInfinity) {
  // 65504 is the largest half; the midpoint to 65536 (65520) ties to even = overflow.
  EXPECT_EQ(from_float<half_t>(65504.f).bits, 0x7BFF);
  EXPECT_EQ(from_float<half_t>(std::nextafter(65520.f, 0.f)).bits, 0x7BFF);
  EXPECT_EQ(from_float<half_t>(65520.f).bits, 0x7C00);
  EXPECT_EQ(from_float<half_t>(1e6f).bits, 0x7C00);
  EXPECT_EQ(from_float<half_t>(-1e30f).bits, 0xFC00);
  EXPECT_EQ(from_float<half_t>(std::numeric_limits<float>::infinity()).bits, 0x7C00);
  EXPECT_EQ(from_float<half_t>(-std::numeric_limits<float>::infinity()).bits, 0xFC00);
}

TEST(HalfConversion, NaNStaysNaN) {
  for (std::uint32_t payload : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0x7F802000u}) {
    const std::uint16_t h = from_float<half_t>(bits_to_float(payload)).bits;
    EXPECT_TRUE(half_is_nan(h)) << std::hex << payload << " -> " << h;
  }
}

TEST(HalfConversion, SubnormalsAndUnderflow) {
  const float min_sub = std::ldexp(1.f, -24);
  EXPECT_EQ(from_float<half_t>(min_sub).bits, 0x0001);
  EXPECT_EQ(from_float<half_t>(std::ldexp(1.f, -25)).bits, 0x0000);  // tie -> even (0)
  EXPECT_EQ(from_float<half_t>(std::nextafter(std::ldexp(1.f, -25), 1.f)).bits, 0x0001);
  EXPECT_EQ(from_float<half_t>(1.5f * min_sub).bits, 0x0002);  // tie -> even (2)
  EXPECT_EQ(from_float<half_t>(std::ldexp(1.f, -30)).bits, 0x0000);
  EXPECT_EQ(from_float<half_t>(-std::ldexp(1.f, -30)).bits, 0x8000);    // signed zero
  EXPECT_EQ(from_float<half_t>(std::ldexp(1023.f, -24)).bits, 0x03FF);  // largest subnormal
  EXPECT_EQ(from_float<half_t>(std::ldexp(1.f, -14)).bits, 0x0400);     // smallest normal
  EXPECT_EQ(from_float<half_t>(std::numeric_limits<float>::denorm_min()).bits, 0x0000);
}

TEST(HalfConversion, RandomFloatsMatchNearestHalf) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x477FEFFFu);  // finite, below overflow
  for (int i = 0; i < 200000; ++i) {
    const float f = bits_to_float(bits(rng));
    const std::uint16_t h = from_float<half_t>(f).bits;
    const double err = std::fabs(half_value(h) - static_cast<double>(f));
    // No other half is closer: compare with the neighbours.
    for (int n : {-1, 1}) {
      const int other = static_cast<int>(h & 0x7FFF) + n;
      if (other < 0 || other > 0x7BFF) continue;
      const double e2 = std::fabs(half_value(static_cast<std::uint16_t>(other)) - f);
      ASSERT_LE(err, e2) << f;
    }
  }
}

TEST(Bf16Conversion, EveryBitPatternRoundTrips) {
  for (std::uint32_t u = 0; u < 65536; ++u) {
    const auto b = static_cast<std::uint16_t>(u);
    const float f = to_float(bfloat16_t{b});
    std::uint32_t fb;
    std::memcpy(&fb, &f, 4);
    ASSERT_EQ(fb, u << 16) << std::hex << u;  // decoding is the top half of a float
    const std::uint16_t back = from_float<bfloat16_t>(f).bits;
    if (bf16_is_nan(b)) {
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << u;
    } else {
      ASSERT_EQ(back, b) << std::hex << u;
    }
  }
}

TEST(Bf16Conversion, MidpointsRoundToNearestEven) {
  for (std::uint32_t lo = 0; lo < 0x7F7F; ++lo) {
    const float fl = bits_to_float(lo << 16), fh = bits_to_float((lo + 1) << 16);
    const float mid = bits_to_float((lo << 16) | 0x8000u);
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(fl) + fh) / 2);
    const std::uint16_t even = static_cast<std::uint16_t>((lo & 1) ? lo + 1 : lo);
    ASSERT_EQ(from_float<bfloat16_t>(mid).bits, even) << std::hex << lo;
    ASSERT_EQ(from_float<bfloat16_t>(-mid).bits, even | 0x8000) << std::hex << lo;
    ASSERT_EQ(from_float<bfloat16_t>(std::nextafter(mid, 0.f)).bits, lo) << std::hex << lo;
    ASSERT_EQ(from_float<bfloat16_t>(std::nextafter(mid, INFINITY)).bits, lo + 1) << std::hex << lo;
  }
}

TEST(Bf16Conversion, OverflowNaNAndSubnormals) {
  const float max_bf16 = bits_to_float(0x7F7F0000u);
  EXPECT_EQ(from_float<bfloat16_t>(max_bf16).bits, 0x7F7F);
  EXPECT_EQ(from_float<bfloat16_t>(bits_to_float(0x7F7F8000u)).bits, 0x7F80);  // tie -> inf
  EXPECT_EQ(from_float<bfloat16_t>(std::numeric_limits<float>::max()).bits, 0x7F80);
  EXPECT_EQ(from_float<bfloat16_t>(-std::numeric_limits<float>::infinity()).bits, 0xFF80);
  // A NaN whose payload lives only in the low bits must not truncate to infinity.
  for (std::uint32_t payload : {0x7F800001u, 0xFF800001u, 0x7FC00000u, 0x7FFFFFFFu}) {
    EXPECT_TRUE(bf16_is_nan(from_float<bfloat16_t>(bits_to_float(payload)).bits))
        << std::hex << payload;
  }
  // Subnormal floats round like any other value.
  EXPECT_EQ(from_float<bfloat16_t>(bits_to_float(0x00018000u)).bits, 0x0002);  // tie -> even
  EXPECT_EQ(from_float<bfloat16_t>(bits_to_float(0x00008000u)).bits, 0x0000);  // tie -> even
  EXPECT_EQ(from_float<bfloat16_t>(bits_to_float(0x00008001u)).bits, 0x0001);
}

TEST(DTypeHelpers, SizesNamesValidityAndDispatch) {
  EXPECT_EQ(size_of(DType::kF32), 4u);
  EXPECT_EQ(size_of(DType::kF16), 2u);
  EXPECT_EQ(size_of(DType::kBF16), 2u);
  EXPECT_STREQ(to_string(DType::kBF16), "bf16");
  EXPECT_STREQ(to_string(DType::kF16), "f16");
  EXPECT_STREQ(to_string(DType::kF32), "f32");
  EXPECT_TRUE(is_valid(DType::kF16));
  EXPECT_FALSE(is_valid(static_cast<DType>(5)));
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const DType seen = dispatch_dtype(dt, [](auto tag) { return DTypeOf<decltype(tag)>::value; });
    EXPECT_EQ(seen, dt);
    const std::size_t sz = dispatch_dtype(dt, [](auto tag) { return sizeof(tag); });
    EXPECT_EQ(sz, size_of(dt));
  }
}

}  // namespace
}  // namespace attnstate
