/// @file kernels/merge/dispatch.cuh
/// @brief The merges' use of the one dispatch (`common/dispatch.hpp`): the head-dim check against
///        `compiled::MergeHeadDims` and the dtypes of each `o` (`compiled::MergeDTypes`) as
///        storage types.
///
/// Kernels are templated on the storage dtypes only (f32, f16, bf16 for each input and the
/// output); head_dim is a runtime multiple of the chunk width, restricted to
/// `compiled::MergeHeadDims` (the ring kernel, templated on it, dispatches on that list).
#pragma once

#include <cstdint>
#include <string>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"
#include "common/compiled.hpp"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Throws `Status::kNotSupported` naming `name` unless `head_dim` is one of
/// `compiled::MergeHeadDims`.
inline void check_head_dim(const char* func, const char* name, std::int64_t head_dim) {
  if (!compiled::contains(compiled::MergeHeadDims{}, head_dim))
    attnstate::detail::throw_argument(func, name, compiled::list_string(compiled::MergeHeadDims{}),
                                      std::to_string(head_dim), Status::kNotSupported);
}

/// Calls `f(TIn{}, TOut{})` with the storage types of `in` and `out` (errors name `func`).
template <class F>
void dispatch_in_out(const char* func, DType in, DType out, F&& f) {
  compiled::dispatch_storage(func, "in.dtype", in, compiled::MergeDTypes{}, [&](auto ti) {
    compiled::dispatch_storage(func, "out.dtype", out, compiled::MergeDTypes{},
                               [&](auto to) { f(ti, to); });
  });
}

/// Calls `f(TA{}, TB{}, TOut{})` with the storage types of `a`, `b` and `out`.
template <class F>
void dispatch_pair(const char* func, DType a, DType b, DType out, F&& f) {
  compiled::dispatch_storage(func, "a.dtype", a, compiled::MergeDTypes{}, [&](auto ta) {
    dispatch_in_out(func, b, out, [&](auto tb, auto to) { f(ta, tb, to); });
  });
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
