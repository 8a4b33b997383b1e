/// @file kernels/merge/dispatch.cuh
/// @brief The one place where the merge kernels' runtime choices (dtypes of `o`, head_dim)
///        become compile-time ones, and the device-side argument checks they share.
///
/// Kernels are templated on the storage dtypes only (f32, f16, bf16 for each input and the
/// output); head_dim is a runtime multiple of the chunk width, restricted to `kHeadDims`.
#pragma once

#include <cstdint>
#include <string>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Head dimensions the CUDA merge kernels accept.
constexpr std::int64_t kHeadDims[] = {64, 128, 256, 512};

/// Throws `Status::kNotSupported` naming `name` unless `head_dim` is one of `kHeadDims`.
inline void check_head_dim(const char* func, const char* name, std::int64_t head_dim) {
  for (std::int64_t d : kHeadDims) {
    if (d == head_dim) return;
  }
  attnstate::detail::throw_argument(func, name, "a supported head_dim (64, 128, 256 or 512)",
                                    std::to_string(head_dim), Status::kNotSupported);
}

/// Calls `f(TIn{}, TOut{})` with the storage types of `in` and `out`.
template <class F>
void dispatch_in_out(DType in, DType out, F&& f) {
  dispatch_dtype(in, [&](auto ti) { dispatch_dtype(out, [&](auto to) { f(ti, to); }); });
}

/// Calls `f(TA{}, TB{}, TOut{})` with the storage types of `a`, `b` and `out`.
template <class F>
void dispatch_pair(DType a, DType b, DType out, F&& f) {
  dispatch_dtype(
      a, [&](auto ta) { dispatch_in_out(b, out, [&](auto tb, auto to) { f(ta, tb, to); }); });
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
