/// @file merge_rows.cpp
/// @brief Row kernels of the CPU merges: portable loops plus AVX2/F16C versions for 16-bit
///        storage, selected once at run time (results are bitwise identical).
#include "cpu/merge_rows.hpp"

#include <vector>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define ATTNSTATE_X86_SIMD 1
#include <immintrin.h>
#else
#define ATTNSTATE_X86_SIMD 0
#endif

namespace attnstate {
namespace cpu {
namespace detail {
namespace {

template <class T>
void axpy_portable(float w, const T* x, float* acc, std::int64_t n, bool first) {
  if (first) {
    for (std::int64_t d = 0; d < n; ++d) acc[d] = w * to_float(x[d]);
  } else {
    for (std::int64_t d = 0; d < n; ++d) acc[d] += w * to_float(x[d]);
  }
}

template <class T>
void store_portable(const float* acc, float inv, T* out, std::int64_t n) {
  for (std::int64_t d = 0; d < n; ++d) out[d] = from_float<T>(acc[d] * inv);
}

#if ATTNSTATE_X86_SIMD
// 8 stored 16-bit elements -> 8 floats (exact).
__attribute__((target("avx2,f16c"))) inline __m256 load8(const half_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
__attribute__((target("avx2,f16c"))) inline __m256 load8(const bfloat16_t* p) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
// 8 floats -> 8 stored elements, round to nearest even (NaN stays a quiet NaN).
__attribute__((target("avx2,f16c"))) inline void store8(half_t* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("avx2,f16c"))) inline void store8(bfloat16_t* p, __m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)),
                                            _mm256_set1_epi32(0x7F800000));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, is_nan);
  // Pack the 8 low halves (each ≤ 0xFFFF) in order.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

template <class T>
__attribute__((target("avx2,f16c"))) void axpy_avx2(float w, const T* x, float* acc, std::int64_t n,
                                                    bool first) {
  const __m256 vw = _mm256_set1_ps(w);
  std::int64_t d = 0;
  if (first) {
    for (; d + 8 <= n; d += 8) _mm256_storeu_ps(acc + d, _mm256_mul_ps(vw, load8(x + d)));
    for (; d < n; ++d) acc[d] = w * to_float(x[d]);
  } else {
    for (; d + 8 <= n; d += 8) {
      const __m256 prod = _mm256_mul_ps(vw, load8(x + d));
      _mm256_storeu_ps(acc + d, _mm256_add_ps(_mm256_loadu_ps(acc + d), prod));
    }
    for (; d < n; ++d) acc[d] += w * to_float(x[d]);
  }
}

template <class T>
__attribute__((target("avx2,f16c"))) void store_avx2(const float* acc, float inv, T* out,
                                                     std::int64_t n) {
  const __m256 vi = _mm256_set1_ps(inv);
  std::int64_t d = 0;
  for (; d + 8 <= n; d += 8) store8(out + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), vi));
  for (; d < n; ++d) out[d] = from_float<T>(acc[d] * inv);
}

bool detect_simd() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}
#else
bool detect_simd() { return false; }
#endif

const bool kSimd = detect_simd();

}  // namespace

bool simd_rows_enabled() { return kSimd; }

template <class T>
void axpy_row_portable(float w, const T* x, float* acc, std::int64_t n, bool first) {
  axpy_portable(w, x, acc, n, first);
}
template <class T>
void scale_store_row_portable(const float* acc, float inv, T* out, std::int64_t n) {
  store_portable(acc, inv, out, n);
}
template void axpy_row_portable<half_t>(float, const half_t*, float*, std::int64_t, bool);
template void axpy_row_portable<bfloat16_t>(float, const bfloat16_t*, float*, std::int64_t, bool);
template void scale_store_row_portable<half_t>(const float*, float, half_t*, std::int64_t);
template void scale_store_row_portable<bfloat16_t>(const float*, float, bfloat16_t*, std::int64_t);

template <>
void axpy_row<float>(float w, const float* x, float* acc, std::int64_t n, bool first) {
  axpy_portable(w, x, acc, n, first);
}
template <>
void scale_store_row<float>(const float* acc, float inv, float* out, std::int64_t n) {
  store_portable(acc, inv, out, n);
}

/// The 16-bit kernels: AVX2/F16C where the processor has them, the portable loops otherwise.
template <class T>
void axpy_dispatch(float w, const T* x, float* acc, std::int64_t n, bool first) {
#if ATTNSTATE_X86_SIMD
  if (kSimd) return axpy_avx2(w, x, acc, n, first);
#endif
  axpy_portable(w, x, acc, n, first);
}
template <class T>
void store_dispatch(const float* acc, float inv, T* out, std::int64_t n) {
#if ATTNSTATE_X86_SIMD
  if (kSimd) return store_avx2(acc, inv, out, n);
#endif
  store_portable(acc, inv, out, n);
}

template <>
void axpy_row<half_t>(float w, const half_t* x, float* acc, std::int64_t n, bool first) {
  axpy_dispatch(w, x, acc, n, first);
}
template <>
void axpy_row<bfloat16_t>(float w, const bfloat16_t* x, float* acc, std::int64_t n, bool first) {
  axpy_dispatch(w, x, acc, n, first);
}
template <>
void scale_store_row<half_t>(const float* acc, float inv, half_t* out, std::int64_t n) {
  store_dispatch(acc, inv, out, n);
}
template <>
void scale_store_row<bfloat16_t>(const float* acc, float inv, bfloat16_t* out, std::int64_t n) {
  store_dispatch(acc, inv, out, n);
}

template <class T>
const float* fp8_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (std::uint32_t u = 0; u < 256; ++u) t[u] = to_float(T{static_cast<std::uint8_t>(u)});
    return t;
  }();
  return table.data();
}

template <class T>
void axpy_row_fp8(float w, const T* x, float scale, float* acc, std::int64_t n, bool first) {
  const float* table = fp8_table<T>();
  if (first) {
    for (std::int64_t d = 0; d < n; ++d) acc[d] = w * (table[x[d].bits] * scale);
  } else {
    for (std::int64_t d = 0; d < n; ++d) acc[d] += w * (table[x[d].bits] * scale);
  }
}

template <class T>
void scale_store_row_fp8(const float* acc, float inv, float scale, T* out, std::int64_t n) {
  for (std::int64_t d = 0; d < n; ++d) out[d] = from_float<T>((acc[d] * inv) / scale);
}

template const float* fp8_table<float8_e4m3_t>();
template const float* fp8_table<float8_e5m2_t>();
template void axpy_row_fp8<float8_e4m3_t>(float, const float8_e4m3_t*, float, float*, std::int64_t,
                                          bool);
template void axpy_row_fp8<float8_e5m2_t>(float, const float8_e5m2_t*, float, float*, std::int64_t,
                                          bool);
template void scale_store_row_fp8<float8_e4m3_t>(const float*, float, float, float8_e4m3_t*,
                                                 std::int64_t);
template void scale_store_row_fp8<float8_e5m2_t>(const float*, float, float, float8_e5m2_t*,
                                                 std::int64_t);

}  // namespace detail
}  // namespace cpu
}  // namespace attnstate
