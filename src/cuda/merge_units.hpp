/// @file merge_units.hpp
/// @brief The merges' kernel instances by output dtype: each is compiled in its own translation
///        unit (generated from cmake/merge_unit.cu.in, `merge_<dtype>.cu`; definitions in
///        cuda/merge_unit.cuh), so no unit compiles every instance. `merge.cu` and
///        `merge_states.cu` keep the checks and call these with the output's storage type `TO`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "cuda/kernels/merge/pair.cuh"
#include "cuda/kernels/merge/stack.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// Launches the whole-row pairwise kernel of `chunks` chunks per thread for `args` (an output of
/// storage type `TO`; `a` and `b` of any dtype `dispatch_pair` takes) on `stream`: the catalog's
/// row the pairwise merge picked (`kMergePairWhole`, or `kMergePairStream` where `stream_in`).
template <class TO>
void launch_pair_whole(const char* func, const kernels::PairArgs& args, int chunks, bool stream_in,
                       std::int64_t rows, cudaStream_t stream);

/// Launches the kernel of `merge_states` that `args` takes (the few-states, ring, odd-row or
/// general kernel, all giving the same bits) for a stack of dtype `in` into an output of storage
/// type `TO` (of dtype `out`) on `stream`.
template <class TO>
void launch_stack(const char* func, DType in, DType out, const kernels::RowsArgs& args,
                  cudaStream_t stream);

/// True when `launch_stack` would take a kernel other than the general one (test hook).
template <class TO>
bool stack_fast_path(const char* func, DType in, DType out, const kernels::RowsArgs& args);

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
