/// @file merge_rows.hpp
/// @brief Row kernels of the CPU merges (internal): `acc (=|+=) w · x` over a row of stored
///        elements and `out = round(acc · inv)`, with AVX2/F16C versions chosen at run time, and
///        their fp8 forms with the `o` scale.
///
/// Every version computes the same fp32 products and sums in the same order (a multiply, then an
/// add; never a fused multiply-add) and rounds to nearest even once on store, so results are
/// bitwise identical whichever version the processor runs.
#pragma once

#include <cstdint>

#include "attnstate/core/dtype.hpp"

namespace attnstate {
namespace cpu {
namespace detail {

/// `acc[d] = w · x[d]` when `first`, else `acc[d] += w · x[d]`, for `d < n`.
template <class T>
void axpy_row(float w, const T* x, float* acc, std::int64_t n, bool first);

/// `out[d] = round_T(acc[d] · inv)` for `d < n`.
template <class T>
void scale_store_row(const float* acc, float inv, T* out, std::int64_t n);

/// The portable versions of `axpy_row` and `scale_store_row` (the reference the vector versions
/// must match bit for bit).
template <class T>
void axpy_row_portable(float w, const T* x, float* acc, std::int64_t n, bool first);
/// @copydoc axpy_row_portable
template <class T>
void scale_store_row_portable(const float* acc, float inv, T* out, std::int64_t n);

/// `to_float` of all 256 bit patterns of the fp8 type `T`, tabulated once.
template <class T>
const float* fp8_table();

/// `acc[d] = w · (x[d] · scale)` when `first`, else `acc[d] += w · (x[d] · scale)`, for `d < n`
/// and the fp8 type `T` (`x[d] · scale` is the real value of a scaled fp8 element, rounded once
/// to fp32, as the CUDA merges compute it).
template <class T>
void axpy_row_fp8(float w, const T* x, float scale, float* acc, std::int64_t n, bool first);

/// `out[d] = round_T((acc[d] · inv) / scale)` for `d < n` and the fp8 type `T` (round to nearest
/// even, saturating to the largest finite value; NaN stays NaN).
template <class T>
void scale_store_row_fp8(const float* acc, float inv, float scale, T* out, std::int64_t n);

/// True when the AVX2/F16C row kernels are in use on this processor.
bool simd_rows_enabled();

}  // namespace detail
}  // namespace cpu
}  // namespace attnstate
