/// @file merge.cu
/// @brief CUDA backend: the pairwise merges `merge_state` and `merge_state_inplace`.
#include <cstdint>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/merge.hpp"
#include "common/validate.hpp"
#include "cuda/kernels/merge/dispatch.cuh"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/kernels/merge/pair.cuh"
#include "cuda/merge_units.hpp"
#include "plan/tuning_sm90.hpp"

namespace attnstate {
namespace cuda {
namespace {

namespace v = attnstate::detail;

constexpr MemorySpace kDevice = MemorySpace::kDevice;

/// Chunks per thread of the whole-row pairwise kernel for `args` (`args.aligned` rows): the
/// first of `kernels::kWholeChunks` that splits a row into a power of two of threads, 0 when
/// none does (or its covering grid would exceed the grid limit): then the general kernel runs.
int whole_chunks(const kernels::PairArgs& args, std::int64_t rows) {
  if (!args.aligned) return 0;
  for (int c : kernels::kWholeChunks) {
    const kernels::RowSplit s = kernels::row_split(args.out.head_dim, c);
    if (s.group * c == s.per_row && rows * s.group / kernels::kMinBlock < 0x7fffffff) return c;
  }
  return 0;
}

/// `PairArgs::aligned` for these views.
bool pair_aligned(const ConstStateView& a, const ConstStateView& b, const StateView& out) {
  return kernels::rows_chunked(out.head_dim) &&
         kernels::chunk_aligned(a.o, size_of(a.dtype), {a.o_stride_token, a.o_stride_head}) &&
         kernels::chunk_aligned(b.o, size_of(b.dtype), {b.o_stride_token, b.o_stride_head}) &&
         kernels::chunk_aligned(out.o, size_of(out.dtype), {out.o_stride_token, out.o_stride_head});
}

void launch_pair(const char* func, const ConstStateView& a, const ConstStateView& b,
                 const StateView& out, const TokenMask& mask, bool in_place, cudaStream_t stream) {
  const std::int64_t rows = out.tokens * out.heads;
  if (rows == 0) return;
  kernels::PairArgs args;
  args.a = a;
  args.b = b;
  args.out = out;
  args.mask = mask;
  args.in_place = in_place;
  args.split = kernels::row_split(out.head_dim, tuning::kMergePairChunks);
  args.aligned = pair_aligned(a, b, out);
  const int whole = whole_chunks(args, rows);
  kernels::dispatch_pair(func, a.dtype, b.dtype, out.dtype, [&](auto ta, auto tb, auto to) {
    using TA = decltype(ta);
    using TB = decltype(tb);
    using TO = decltype(to);
    if (whole != 0) return detail::launch_pair_whole<TO>(func, args, whole, rows, stream);
    constexpr auto kernel = kernels::merge_pair_kernel<TA, TB, TO>;
    kernels::launch_grid_stride<kernel>(rows * args.split.group, stream, "merge_pair_kernel", args);
  });
}

}  // namespace

namespace detail {

bool merge_state_whole_path(const ConstStateView& a, const ConstStateView& b,
                            const StateView& out) {
  kernels::PairArgs args;
  args.a = a;
  args.b = b;
  args.out = out;
  args.aligned = pair_aligned(a, b, out);
  return whole_chunks(args, out.tokens * out.heads) != 0;
}

}  // namespace detail

void merge_state(ConstStateView a, ConstStateView b, StateView out, cudaStream_t stream) {
  merge_state(a, b, out, TokenMask{}, stream);
}

void merge_state(ConstStateView a, ConstStateView b, StateView out, TokenMask mask,
                 cudaStream_t stream) {
  static const char* const kFunc = "attnstate::cuda::merge_state";
  constexpr bool kFp8 = true;  // the dtypes compiled with fp8: kernels/merge/dispatch.cuh
  constexpr bool kLseOptional = true;
  v::check_state(kFunc, "a", a, kDevice, kFp8);
  v::check_state(kFunc, "b", b, kDevice, kFp8);
  v::check_output_state(kFunc, "out", out, kDevice, kFp8, kLseOptional);
  v::check_same_shape(kFunc, "a", a, "b", b);
  v::check_same_shape(kFunc, "a", a, "out", out);
  v::check_alias(kFunc, "out", out, "a", a);
  v::check_alias(kFunc, "out", out, "b", b);
  v::check_mask(kFunc, "mask", mask, "out", out);
  launch_pair(kFunc, a, b, out, mask, /*in_place=*/false, stream);
}

void merge_state_inplace(StateView acc, ConstStateView other, TokenMask mask, cudaStream_t stream) {
  static const char* const kFunc = "attnstate::cuda::merge_state_inplace";
  constexpr bool kFp8 = true;
  v::check_output_state(kFunc, "acc", acc, kDevice, kFp8);
  v::check_state(kFunc, "other", other, kDevice, kFp8);
  v::check_same_shape(kFunc, "acc", acc, "other", other);
  v::check_alias(kFunc, "acc", acc, "other", other);
  v::check_mask(kFunc, "mask", mask, "acc", acc);
  launch_pair(kFunc, acc, other, acc, mask, /*in_place=*/true, stream);
}

}  // namespace cuda
}  // namespace attnstate
