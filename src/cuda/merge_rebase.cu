/// @file merge_rebase.cu
/// @brief CUDA backend: `rebase`, converting a state's LSE base and `o` dtype.
#include <cstdint>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/merge.hpp"
#include "catalog/catalog.hpp"
#include "common/validate.hpp"
#include "cuda/kernels/merge/dispatch.cuh"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/kernels/merge/rebase.cuh"

namespace attnstate {
namespace cuda {

void rebase(ConstStateView in, StateView out, cudaStream_t stream) {
  static const char* const kFunc = "attnstate::cuda::rebase";
  namespace v = attnstate::detail;
  constexpr bool kFp8 = catalog::takes_fp8(catalog::Family::kMergeRebase);
  v::check_state(kFunc, "in", in, MemorySpace::kDevice, kFp8);
  v::check_output_state(kFunc, "out", out, MemorySpace::kDevice, kFp8);
  v::check_same_shape(kFunc, "in", in, "out", out);
  v::check_alias(kFunc, "out", out, "in", in);
  const std::int64_t rows = out.tokens * out.heads;
  if (rows == 0) return;
  kernels::RebaseArgs args;
  args.in = in;
  args.out = out;
  args.split = kernels::row_split(out.head_dim);
  args.copy_o = out.o != in.o;  // an exact alias (checked above): o is in place but for empty rows
  args.aligned =
      kernels::rows_chunked(out.head_dim) &&
      kernels::vec_aligned(in.o, size_of(in.dtype), {in.o_stride_token, in.o_stride_head}) &&
      kernels::vec_aligned(out.o, size_of(out.dtype), {out.o_stride_token, out.o_stride_head});
  kernels::dispatch_in_out(kFunc, in.dtype, out.dtype, [&](auto ti, auto to) {
    constexpr auto kernel = kernels::rebase_kernel<decltype(ti), decltype(to)>;
    kernels::launch_grid_stride<kernel>(rows << args.split.shift, stream, "rebase_kernel", args);
  });
}

void mark_empty_rows(StateView state, cudaStream_t stream) {
  static const char* const kFunc = "attnstate::cuda::mark_empty_rows";
  attnstate::detail::check_output_lse(kFunc, "state", state, MemorySpace::kDevice);
  const std::int64_t rows = state.tokens * state.heads;
  if (rows == 0) return;
  kernels::launch_grid_stride<kernels::mark_empty_rows_kernel>(rows, stream,
                                                               "mark_empty_rows_kernel", state);
}

}  // namespace cuda
}  // namespace attnstate
