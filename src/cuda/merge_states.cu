/// @file merge_states.cu
/// @brief CUDA backend: the n-ary merges `merge_states` (dense or strided stacks) and
///        `merge_states_ragged` (rows given by a device `indptr`).
#include <cstdint>
#include <limits>
#include <string>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/merge.hpp"
#include "common/validate.hpp"
#include "cuda/kernels/merge/dispatch.cuh"
#include "cuda/kernels/merge/few.cuh"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/kernels/merge/odd.cuh"
#include "cuda/kernels/merge/ragged.cuh"
#include "cuda/kernels/merge/ring.cuh"
#include "cuda/kernels/merge/stack.cuh"
#include "plan/tuning_sm90.hpp"

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

static_assert(tuning::kMergeFewStates >= 0 && tuning::kMergeFewStates <= kernels::kFewMaxStates,
              "the few-states kernel merges at most kFewMaxStates states");

/// The kernels of `merge_states`, all giving the same bits.
enum class StackKernel { kGeneral, kFew, kRing, kOdd };

/// Picks the kernel of `merge_states` (a choice between kernels, all giving the same bits; the
/// dtypes and head dim become template arguments in the one dispatch): stacks with 16-byte access
/// to `o` go to the few-states kernel (at most `tuning::kMergeFewStates` states, rows of more
/// than one chunk) or, with at least one block of work per SM, to the ring kernel at the head
/// dims it is compiled for (`compiled::MergeHeadDims`) or to the odd-row kernel at the head dims
/// whose rows are not a power of two of chunks (`compiled::MergeOddHeadDims`); everything else,
/// and every stack or output with an fp8 `o` (their one compiled kernel), to the general kernel.
template <class TIn, class TO>
StackKernel pick_kernel(const kernels::RowsArgs& args) {
  if constexpr (kIsFp8<TIn> || kIsFp8<TO>) {
    return StackKernel::kGeneral;  // the one kernel compiled with an fp8 o
  } else {
    if (args.aligned && args.row_shift >= 1 && args.in.num_states >= 1 &&
        args.in.num_states <= tuning::kMergeFewStates) {
      return StackKernel::kFew;
    }
    if (kernels::use_ring<TIn, TO, kernels::DefaultRingShape>(args, kernels::sm_count())) {
      return StackKernel::kRing;
    }
    return kernels::use_odd<TIn, TO>(args, kernels::sm_count()) ? StackKernel::kOdd
                                                                : StackKernel::kGeneral;
  }
}

}  // namespace

namespace detail {

/// Test hook (declared in tests/cuda/merge/merge_test_support.hpp): true when `merge_states(states,
/// out)` runs a fast kernel (not the general one) on the current device.
bool merge_states_fast_path(const ConstStateStackView& states, const StateView& out) {
  bool fast = false;
  kernels::dispatch_stack(
      "attnstate::cuda::merge_states", states.dtype, out.dtype, [&](auto ti, auto to) {
        fast = pick_kernel<decltype(ti), decltype(to)>(rows_args(states, out)) !=
               StackKernel::kGeneral;
      });
  return fast;
}

}  // namespace detail

void merge_states(ConstStateStackView states, StateView out, cudaStream_t stream) {
  static const char* const kFunc = "attnstate::cuda::merge_states";
  constexpr bool kFp8 = true;  // the dtypes compiled with fp8: kernels/merge/dispatch.cuh
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
  kernels::dispatch_stack(kFunc, states.dtype, out.dtype, [&](auto ti, auto to) {
    using TI = decltype(ti);
    using TO = decltype(to);
    if constexpr (!kIsFp8<TI> && !kIsFp8<TO>) {
      switch (pick_kernel<TI, TO>(args)) {
        case StackKernel::kFew:
          return kernels::launch_few<TI, TO>(args, stream);
        case StackKernel::kRing:
          return kernels::launch_ring<TI, TO, kernels::DefaultRingShape>(args, stream);
        case StackKernel::kOdd:
          return kernels::launch_odd<TI, TO>(args, stream);
        case StackKernel::kGeneral:
          break;
      }
    }
    constexpr auto kernel = kernels::merge_stack_kernel<decltype(ti), decltype(to)>;
    kernels::launch_grid_stride<kernel>(rows << args.row_shift, stream, "merge_stack_kernel", args);
  });
}

void merge_states_ragged(ConstStateView rows, const std::int32_t* indptr, StateView out,
                         cudaStream_t stream) {
  static const char* const kFunc = "attnstate::cuda::merge_states_ragged";
  v::check_state(kFunc, "rows", rows, kDevice);
  v::check_output_state(kFunc, "out", out, kDevice, /*fp8=*/false, /*lse_optional=*/true);
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
