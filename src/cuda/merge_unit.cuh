/// @file merge_unit.cuh
/// @brief What each generated merge unit (cmake/merge_unit.cu.in, one per output dtype)
///        compiles: the definitions of cuda/merge_units.hpp, instantiated for its output's storage
///        type by `ATTNSTATE_MERGE_UNIT`. Included by those units only.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <type_traits>

#include "attnstate/core/dtype.hpp"
#include "catalog/catalog.hpp"
#include "cuda/kernels/merge/dispatch.cuh"
#include "cuda/kernels/merge/few.cuh"
#include "cuda/kernels/merge/launch.cuh"
#include "cuda/kernels/merge/odd.cuh"
#include "cuda/kernels/merge/pair.cuh"
#include "cuda/kernels/merge/ring.cuh"
#include "cuda/kernels/merge/stack.cuh"
#include "cuda/launch.hpp"
#include "cuda/merge_units.hpp"
#include "plan/tuning_sm90.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

/// Launches the whole-row pairwise kernel of `kC` chunks per thread for `args`, its instance
/// streaming the inputs past L1 where `stream` (the catalog's `kMergePairStream` rows: fp8
/// outputs only).
template <class TA, class TB, class TO, int kC>
void launch_pair_whole_chunks(const kernels::PairArgs& args, bool stream_in, std::int64_t rows,
                              cudaStream_t stream) {
  kernels::PairArgs w = args;
  w.split = kernels::row_split(args.out.head_dim, kC);
  const std::int64_t threads = rows * w.split.group;
  int block = kernels::kMergeBlock;
  while (block > kernels::kMinBlock && threads < kernels::sm_count() * std::int64_t{block}) {
    block /= 2;
  }
  LaunchConfig c;
  c.grid = dim3(static_cast<unsigned>((threads + block - 1) / block));
  c.block = dim3(static_cast<unsigned>(block));
  c.stream = stream;
  // Streaming the inputs past L1 pays for fp8 outputs and costs for the others (measured:
  // bench/RESULTS.md); it needs inputs the kernel does not write.
  if constexpr (kIsFp8<TO>) {
    if (stream_in) {
      return launch_kernel(c, kernels::merge_pair_whole_kernel<TA, TB, TO, kC, true>,
                           "merge_pair_whole_kernel", w);
    }
  }
  launch_kernel(c, kernels::merge_pair_whole_kernel<TA, TB, TO, kC, false>,
                "merge_pair_whole_kernel", w);
}

template <class TOut>
void launch_pair_whole(const char* func, const kernels::PairArgs& args, int chunks, bool stream_in,
                       std::int64_t rows, cudaStream_t stream) {
  kernels::dispatch_pair(
      func, args.a.dtype, args.b.dtype, args.out.dtype, [&](auto ta, auto tb, auto to) {
        using TA = decltype(ta);
        using TB = decltype(tb);
        using TO = decltype(to);
        if constexpr (std::is_same_v<TO, TOut>) {
          static_assert(std::size(kernels::kWholeChunks) == 2, "the chunk counts below");
          constexpr int kC0 = kernels::kWholeChunks[0];
          constexpr int kC1 = kernels::kWholeChunks[1];
          if (chunks == kC0) {
            launch_pair_whole_chunks<TA, TB, TO, kC0>(args, stream_in, rows, stream);
          } else if (chunks == kC1) {
            launch_pair_whole_chunks<TA, TB, TO, kC1>(args, stream_in, rows, stream);
          }
        }
      });
}

static_assert(tuning::kMergeFewStates >= 0 && tuning::kMergeFewStates <= kernels::kFewMaxStates,
              "the few-states kernel merges at most kFewMaxStates states");

/// The run-time needs of the catalog's row of family `f` (a fast kernel of `merge_states`) that
/// the merge of `args` meets: the rows' alignment and chunks, then the kernel's own grid and
/// shared-memory needs (the ring and odd-row kernels, which no fp8 dtype instantiates).
template <class TIn, class TO>
catalog::Needs stack_needs_met(catalog::Family f, const kernels::RowsArgs& args) {
  catalog::Needs met = catalog::kNeedsNothing;
  if (args.aligned) met |= catalog::kNeedsChunkedRows;
  if (args.row_shift >= 1) met |= catalog::kNeedsMultiChunk;
  if constexpr (!kIsFp8<TIn> && !kIsFp8<TO>) {
    if (f == catalog::Family::kMergeRing) {
      met |= kernels::ring_needs<TIn, TO, kernels::DefaultRingShape>(args, kernels::sm_count());
    } else if (f == catalog::Family::kMergeOdd) {
      met |= kernels::odd_needs<TIn, TO>(args, kernels::sm_count());
    }
  }
  return met;
}

constexpr int kStackDTypes = 5;  // DType's values, 0 to 4
/// The catalog's rows of the fast kernels of `merge_states` for one (in, out) dtype pair, in the
/// order it prefers them: few-states, ring, odd-row (each family in its row order).
using StackRows = catalog::Candidates<32>;

/// `StackRows` of every dtype pair (index `in * kStackDTypes + out`), listed at compile time so
/// that a call reads only its candidates.
constexpr std::array<StackRows, kStackDTypes * kStackDTypes> stack_rows() {
  std::array<StackRows, kStackDTypes * kStackDTypes> t{};
  for (int i = 0; i < kStackDTypes * kStackDTypes; ++i) {
    catalog::Query q;
    q.q = catalog::mask(static_cast<DType>(i / kStackDTypes));
    q.kv = q.q;
    q.out = catalog::mask(static_cast<DType>(i % kStackDTypes));
    StackRows& c = t[static_cast<std::size_t>(i)];
    for (const catalog::Family f :
         {catalog::Family::kMergeFew, catalog::Family::kMergeRing, catalog::Family::kMergeOdd}) {
      q.family = f;
      c = catalog::candidates(q, c);
    }
  }
  return t;
}
inline constexpr std::array<StackRows, kStackDTypes* kStackDTypes> kStackRows = stack_rows();

/// Picks the kernel of `merge_states` (a choice between kernels, all giving the same bits; the
/// dtypes and head dim become template arguments in the one dispatch) from the catalog: the
/// first of the few-states (at most `tuning::kMergeFewStates` states), ring and odd-row families
/// with a row for the stack's dtypes, head dim and state count whose run-time needs the stack
/// meets (`catalog::family_that_runs`), else the general kernel (`kMergeStack`, the rows'
/// fallback; the one kernel compiled with an fp8 `o`).
template <class TIn, class TO>
catalog::Family pick_stack_kernel(const kernels::RowsArgs& args) {
  using catalog::Family;
  if (args.in.num_states < 1) return Family::kMergeStack;
  catalog::Query q;
  q.head_dim = args.out.head_dim;
  q.q = catalog::mask(args.in.dtype);
  q.kv = q.q;
  q.out = catalog::mask(args.out.dtype);
  q.states = args.in.num_states;
  const StackRows& c = kStackRows[static_cast<std::size_t>(
      static_cast<int>(args.in.dtype) * kStackDTypes + static_cast<int>(args.out.dtype))];
  for (int i = 0; i < c.count; ++i) {
    const catalog::Row& r = catalog::kRows[static_cast<std::size_t>(c.ids[i])];
    q.family = r.family;
    if (!catalog::matches(r, q)) continue;
    if (r.family == Family::kMergeFew && args.in.num_states > tuning::kMergeFewStates) continue;
    if (catalog::family_that_runs(r, stack_needs_met<TIn, TO>(r.family, args)) == r.family) {
      return r.family;
    }
  }
  return Family::kMergeStack;
}

template <class TOut>
void launch_stack(const char* func, DType in, DType out, const kernels::RowsArgs& args,
                  cudaStream_t stream) {
  kernels::dispatch_stack(func, in, out, [&](auto ti, auto to) {
    using TI = decltype(ti);
    using TO = decltype(to);
    if constexpr (std::is_same_v<TO, TOut>) {
      if constexpr (!kIsFp8<TI> && !kIsFp8<TO>) {
        switch (pick_stack_kernel<TI, TO>(args)) {
          case catalog::Family::kMergeFew:
            return kernels::launch_few<TI, TO>(args, stream);
          case catalog::Family::kMergeRing:
            return kernels::launch_ring<TI, TO, kernels::DefaultRingShape>(args, stream);
          case catalog::Family::kMergeOdd:
            return kernels::launch_odd<TI, TO>(args, stream);
          default:
            break;
        }
      }
      constexpr auto kernel = kernels::merge_stack_kernel<TI, TO>;
      kernels::launch_grid_stride<kernel>((args.out.tokens * args.out.heads) << args.row_shift,
                                          stream, "merge_stack_kernel", args);
    }
  });
}

template <class TOut>
bool stack_fast_path(const char* func, DType in, DType out, const kernels::RowsArgs& args) {
  bool fast = false;
  kernels::dispatch_stack(func, in, out, [&](auto ti, auto to) {
    if constexpr (std::is_same_v<decltype(to), TOut>) {
      fast = pick_stack_kernel<decltype(ti), decltype(to)>(args) != catalog::Family::kMergeStack;
    }
  });
  return fast;
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate

/// The instances of one output storage type `T` (in namespace attnstate::cuda::detail).
#define ATTNSTATE_MERGE_UNIT(T)                                                        \
  template void launch_pair_whole<T>(const char*, const kernels::PairArgs&, int, bool, \
                                     std::int64_t, cudaStream_t);                      \
  template void launch_stack<T>(const char*, DType, DType, const kernels::RowsArgs&,   \
                                cudaStream_t);                                         \
  template bool stack_fast_path<T>(const char*, DType, DType, const kernels::RowsArgs&);
