/// @file merge_states.cu
/// @brief CUDA backend: the n-ary merges `merge_states` (dense or strided stacks) and
///        `merge_states_ragged` (rows given by a device `indptr`).
#include <cstdint>
#include <limits>
#include <string>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/merge.hpp"
#include "catalog/catalog.hpp"
#include "common/validate.hpp"
#include "cuda/kernels/merge/dispatch.cuh"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/kernels/merge/ragged.cuh"
#include "cuda/kernels/merge/stack.cuh"
#include "cuda/merge_units.hpp"

namespace attnstate {
namespace cuda {
namespace {

namespace v = attnstate::detail;
constexpr MemorySpace kDevice = MemorySpace::kDevice;

/// Arguments common to both n-ary kernels.
kernels::RowsArgs rows_args(const ConstStateStackView& in, const StateView& out) {
  kernels::RowsArgs args;
  args.in = in;
  args.out = out;
  args.indptr = nullptr;
  const kernels::RowSplit split = kernels::row_split(out.head_dim);  // one chunk per thread
  args.row_shift = 0;
  while ((1 << args.row_shift) < split.per_row) ++args.row_shift;
  args.group = split.group;
  args.aligned =
      kernels::rows_chunked(out.head_dim) &&
      kernels::chunk_aligned(in.o, size_of(in.dtype),
                             {in.o_stride_token, in.o_stride_head, in.o_stride_state}) &&
      kernels::chunk_aligned(out.o, size_of(out.dtype), {out.o_stride_token, out.o_stride_head});
  return args;
}

}  // namespace

namespace detail {

/// Test hook (declared in tests/cuda/merge/merge_test_support.hpp): true when `merge_states(states,
/// out)` runs a fast kernel (not the general one) on the current device.
bool merge_states_fast_path(const ConstStateStackView& states, const StateView& out) {
  static const char* const kFunc = "attnstate::cuda::merge_states";
  bool fast = false;
  kernels::dispatch_stack(kFunc, states.dtype, out.dtype, [&](auto, auto to) {
    fast = stack_fast_path<decltype(to)>(kFunc, states.dtype, out.dtype, rows_args(states, out));
  });
  return fast;
}

}  // namespace detail

void merge_states(ConstStateStackView states, StateView out, cudaStream_t stream) {
  static const char* const kFunc = "attnstate::cuda::merge_states";
  constexpr bool kFp8 = catalog::takes_fp8(catalog::Family::kMergeStack);
  constexpr bool kLseOptional = true;
  v::check_stack(kFunc, "states", states, kDevice, kFp8, /*min_states=*/0);
  v::check_output_state(kFunc, "out", out, kDevice, kFp8, kLseOptional);
  v::check_same_shape(kFunc, "states", states, "out", out);
  v::check_disjoint(kFunc, "out", out, "states", states);
  if (states.num_states > std::numeric_limits<std::int32_t>::max()) {
    v::throw_argument(kFunc, "states.num_states", "at most 2^31 - 1 states",
                      std::to_string(states.num_states), Status::kNotSupported);
  }
  const std::int64_t rows = out.tokens * out.heads;
  if (rows == 0) return;
  const kernels::RowsArgs args = rows_args(states, out);
  kernels::dispatch_stack(kFunc, states.dtype, out.dtype, [&](auto, auto to) {
    detail::launch_stack<decltype(to)>(kFunc, states.dtype, out.dtype, args, stream);
  });
}

void merge_states_ragged(ConstStateView rows, const std::int32_t* indptr, StateView out,
                         cudaStream_t stream) {
  static const char* const kFunc = "attnstate::cuda::merge_states_ragged";
  constexpr bool kFp8 = catalog::takes_fp8(catalog::Family::kMergeRagged);
  v::check_state(kFunc, "rows", rows, kDevice, kFp8);
  v::check_output_state(kFunc, "out", out, kDevice, kFp8, /*lse_optional=*/true);
  if (rows.heads != out.heads) {
    v::throw_argument(kFunc, "rows.heads", std::to_string(out.heads) + " (as out.heads)",
                      std::to_string(rows.heads));
  }
  if (rows.head_dim != out.head_dim) {
    v::throw_argument(kFunc, "rows.head_dim", std::to_string(out.head_dim) + " (as out.head_dim)",
                      std::to_string(rows.head_dim));
  }
  v::check_not_null(kFunc, "indptr", indptr);
  v::check_aligned(kFunc, "indptr", indptr, sizeof(std::int32_t));
  v::check_disjoint(kFunc, "out", out, "rows", rows.o, v::o_bytes(rows), rows.lse,
                    v::lse_bytes(rows));
  v::check_disjoint(kFunc, "out", out, "indptr", indptr, (out.tokens + 1) * 4, nullptr, 0);
  const std::int64_t n = out.tokens * out.heads;
  if (n == 0) return;
  // The rows as a stack whose "states" are consecutive tokens; offsets come from indptr.
  ConstStateStackView in;
  static_cast<StateLayout&>(in) = rows;
  in.o = rows.o;
  in.lse = rows.lse;
  in.num_states = 0;
  in.o_stride_state = rows.o_stride_token;
  in.lse_stride_state = rows.lse_stride_token;
  kernels::RowsArgs args = rows_args(in, out);
  args.indptr = indptr;
  kernels::dispatch_in_out(kFunc, rows.dtype, out.dtype, [&](auto ti, auto to) {
    constexpr auto kernel = kernels::merge_ragged_kernel<decltype(ti), decltype(to)>;
    kernels::launch_grid_stride<kernel>(n << args.row_shift, stream, "merge_ragged_kernel", args);
  });
}

}  // namespace cuda
}  // namespace attnstate
