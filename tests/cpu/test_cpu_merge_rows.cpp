/// @file test_cpu_merge_rows.cpp
/// @brief The vector (AVX2/F16C) row kernels of the CPU merges match the portable loops bit for
///        bit, including tails, NaN, infinities, subnormals and rounding ties.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/merge_rows.hpp"

namespace {

using namespace attnstate;
using attnstate::cpu::detail::axpy_row;
using attnstate::cpu::detail::axpy_row_portable;
using attnstate::cpu::detail::scale_store_row;
using attnstate::cpu::detail::scale_store_row_portable;

/// Random 16-bit patterns: every exponent, NaNs, infinities and subnormals included.
template <class T>
std::vector<T> random_bits(std::size_t n, std::mt19937& rng) {
  std::vector<T> v(n);
  for (auto& x : v) x.bits = static_cast<std::uint16_t>(rng());
  return v;
}

/// fp32 values that round to the 16-bit type's ties, overflow, subnormals, NaN and ±inf.
std::vector<float> adversarial_floats(std::size_t n, std::mt19937& rng) {
  std::vector<float> v(n);
  const float special[] = {std::numeric_limits<float>::quiet_NaN(),
                           INFINITY,
                           -INFINITY,
                           65504.f,
                           65520.f,
                           1e-8f,
                           6e-5f,
                           -0.f,
                           3.0e38f,
                           1.00048828125f};
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 7 == 3) {
      v[i] = special[rng() % (sizeof(special) / sizeof(special[0]))];
    } else if (i % 5 == 1) {
      std::uint32_t b = static_cast<std::uint32_t>(rng());
      b = (b & 0xFFFF0000u) | 0x8000u;  // an exact bf16 tie
      std::memcpy(&v[i], &b, 4);
    } else {
      v[i] = std::ldexp(u(rng), static_cast<int>(rng() % 40) - 20);
    }
  }
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// `got` is `want` bit for bit, or both are NaN (any payload).
bool same_value(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  return std::memcmp(&got, &want, sizeof(float)) == 0;
}

template <class T>
void check_axpy_matches_portable() {
  if (!cpu::detail::simd_rows_enabled()) GTEST_SKIP() << "no AVX2/F16C: only the portable rows run";
  std::mt19937 rng(20261129);
  for (std::int64_t n : {1, 7, 8, 9, 31, 64, 67, 128}) {
    const auto x = random_bits<T>(static_cast<std::size_t>(n), rng);
    std::vector<float> a(n), b(n);
    for (bool first : {true, false}) {
      // `first` overwrites: start from NaN, so an accumulate (or no write) shows.
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (std::int64_t i = 0; i < n; ++i)
        a[i] = b[i] = first ? nan : std::ldexp(1.f + float(i), -3);
      const std::vector<float> init = b;
      axpy_row(0.37f, x.data(), a.data(), n, first);
      axpy_row_portable(0.37f, x.data(), b.data(), n, first);
      // NaN results compare by bits too: both paths compute the same operations.
      EXPECT_TRUE(same_bits(a, b)) << "n=" << n << " first=" << first;
      // The portable row against its definition, one multiply then one add (kept unfused by
      // the volatile), so that both paths doing the same wrong thing (or nothing) fail.
      for (std::int64_t i = 0; i < n; ++i) {
        volatile float prod = 0.37f * to_float(x[i]);
        const float want = first ? prod : init[i] + prod;
        EXPECT_TRUE(same_value(b[i], want)) << "n=" << n << " first=" << first << " element " << i
                                            << ": " << b[i] << " vs " << want;
      }
    }
  }
}

template <class T>
void check_store_matches_portable() {
  if (!cpu::detail::simd_rows_enabled()) GTEST_SKIP() << "no AVX2/F16C: only the portable rows run";
  std::mt19937 rng(7);
  for (std::int64_t n : {1, 7, 8, 9, 31, 64, 67, 128, 1000}) {
    const auto acc = adversarial_floats(static_cast<std::size_t>(n), rng);
    std::vector<T> a(n), b(n);
    for (std::int64_t i = 0; i < n; ++i) a[i].bits = b[i].bits = 0xFFFF;  // NaN: unwritten shows
    scale_store_row(acc.data(), 1.f, a.data(), n);
    scale_store_row_portable(acc.data(), 1.f, b.data(), n);
    for (std::int64_t i = 0; i < n; ++i) {
      const bool a_nan = std::isnan(to_float(a[i])), b_nan = std::isnan(to_float(b[i]));
      if (a_nan || b_nan) {
        EXPECT_TRUE(a_nan && b_nan) << "element " << i << " of " << n;
      } else {
        EXPECT_EQ(a[i].bits, b[i].bits) << "element " << i << " of " << n << " value " << acc[i];
      }
      // The portable row against its definition (round to nearest even once), so that both
      // paths doing the same wrong thing (or nothing) fail.
      const T want = from_float<T>(acc[i] * 1.f);
      if (std::isnan(to_float(want))) {
        EXPECT_TRUE(b_nan) << "element " << i << " of " << n;
      } else {
        EXPECT_EQ(b[i].bits, want.bits) << "element " << i << " of " << n << " value " << acc[i];
      }
    }
  }
}

TEST(CpuMergeRows, HalfAxpyMatchesPortableBitwise) { check_axpy_matches_portable<half_t>(); }
TEST(CpuMergeRows, Bf16AxpyMatchesPortableBitwise) { check_axpy_matches_portable<bfloat16_t>(); }
TEST(CpuMergeRows, HalfStoreMatchesPortableBitwise) { check_store_matches_portable<half_t>(); }
TEST(CpuMergeRows, Bf16StoreMatchesPortableBitwise) { check_store_matches_portable<bfloat16_t>(); }

}  // namespace
