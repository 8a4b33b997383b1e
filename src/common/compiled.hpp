/// @file compiled.hpp
/// @brief The one list of what the CUDA backend compiles per operation (head dims, dtypes), read
///        by the dispatch (`common/dispatch.hpp`), which instantiates the kernels of each entry
///        and no other, and by the catalog (`catalog/catalog.hpp`), whose rows the checks read.
///
/// Each operation compiles the head dims it supports that the build's `ATTNSTATE_CUDA_HEAD_DIMS`
/// (CMake, `docs/install.md`) lists: the generated `attnstate_compiled_config.hpp`, or every
/// supported head dim when a translation unit is compiled without the build's include path.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/dispatch.hpp"

#if __has_include("attnstate_compiled_config.hpp")
#include "attnstate_compiled_config.hpp"
#define ATTNSTATE_HAS_BUILD_HEAD_DIMS 1
#endif

namespace attnstate {
namespace compiled {

/// Every head dim some CUDA kernel compiles, ascending: the default and the accepted values of
/// `ATTNSTATE_CUDA_HEAD_DIMS` (the top-level CMakeLists.txt reads this line; each family's list
/// below must hold only these).
using SupportedHeadDims = IntList<64, 128, 256, 512>;

#if !defined(ATTNSTATE_HAS_BUILD_HEAD_DIMS)
/// A translation unit compiled alone (`scripts/cubin-diff.sh`): the default build's list.
using BuildHeadDims = SupportedHeadDims;
#endif

/// The entries of `In` also in `Keep`, in the order of `In` (`::type`).
template <class Keep, class In, class Out = IntList<>>
struct Intersect {
  using type = Out;
};
/// @cond INTERNAL
template <class Keep, int S0, int... S, int... O>
struct Intersect<Keep, IntList<S0, S...>, IntList<O...>>
    : Intersect<Keep, IntList<S...>,
                std::conditional_t<contains(Keep{}, S0), IntList<O..., S0>, IntList<O...>>> {};
/// @endcond

/// The list's entries as an array (a list is never empty here).
template <class List>
struct Values;
/// @cond INTERNAL
template <int... V>
struct Values<IntList<V...>> {
  static constexpr std::int64_t value[] = {V...};
};
template <DType... T>
struct Values<DTypeList<T...>> {
  static constexpr DType value[] = {T...};
};
/// @endcond

/// The head dims of `List` that the build compiles (`List` within `SupportedHeadDims`).
template <class List>
struct Built {
  static_assert(std::is_same_v<typename Intersect<SupportedHeadDims, List>::type, List>,
                "a family's head dim missing from compiled::SupportedHeadDims");
  using type = typename Intersect<BuildHeadDims, List>::type;
};

/// Head dims of the merge kernels specialised on the head dim (the ring kernel of
/// `merge_states`); the merges take every head dim >= 1 through their other kernels.
using MergeHeadDims = Built<IntList<64, 128, 256, 512>>::type;
/// Head dims of the `merge_states` kernel for rows whose chunks (of 8 elements) are not a power
/// of two in number (`merge_odd_kernel`, kernels/merge/odd.cuh: a power of two of threads per row,
/// an odd count of chunks each). Not cut to the build's list: no other family compiles them, and
/// at any other head dim the merges keep their general kernel. Only the rows of 3 chunks a thread
/// are listed: at 80, 112 and 160 (5 or 7 chunks a thread) and 48 the kernel was measured slower
/// than the general kernel (bench/RESULTS.md).
using MergeOddHeadDims = IntList<96, 192>;
/// Head dims of the split-KV decode kernels.
using DecodeHeadDims = Built<IntList<64, 128, 256>>::type;
/// Head dims of the cascade kernels (its levels, its merge; its last level runs the decode).
using CascadeHeadDims = Built<IntList<64, 128, 256>>::type;
/// Head dims of the cascade's mma.sync level tiles of 3 stages (16, 64 and 128 rows).
using CascadeMmaHeadDims = Intersect<CascadeHeadDims, IntList<64, 128>>::type;
/// Head dims of the cascade's wide mma.sync level tiles: 2 stages and one CTA per SM at every
/// tile (a 3-stage tile of 64 rows at 256 would exceed an SM's shared memory).
using CascadeMmaWideHeadDims = Intersect<CascadeHeadDims, IntList<256>>::type;
/// Head dims of the cascade's mma.sync level tiles over fp8 caches (the tiles of
/// `CascadeMmaHeadDims`).
using CascadeMmaFp8HeadDims = CascadeMmaHeadDims;

/// Dtypes of each `o` of the merges (inputs and output independently).
using MergeDTypes = DTypeList<DType::kF32, DType::kF16, DType::kBF16>;
/// The fp8 dtypes of `o` of `merge_state`, `merge_state_inplace` and `merge_states`, each
/// compiled with `MergeDTypes` in the combinations that `cuda/kernels/merge/dispatch.cuh` lists
/// (one fp8 format per call).
using MergeFp8DTypes = DTypeList<DType::kE4M3, DType::kE5M2>;
/// Dtypes of the decode's queries and KV (the same dtype).
using DecodeDTypes = DTypeList<DType::kF16, DType::kBF16>;
/// fp8 KV dtypes of the decode (queries of a `DecodeDTypes` dtype), and its head dims for them
/// (rows of at least 8 chunks of 16 bytes: the fp8 tile's swizzle).
using DecodeFp8DTypes = DTypeList<DType::kE4M3, DType::kE5M2>;
using DecodeFp8HeadDims = Built<IntList<128, 256>>::type;
/// Head dims of the split decode's variant instance over fp8 caches (window, soft cap).
using DecodeFp8VariantHeadDims = DecodeFp8HeadDims;
/// Head dims of the streamed decode kernel (`decode_stream_kernel`: 64 and 128), and over fp8
/// caches (128: rows of at least 8 chunks of 16 bytes).
using DecodeStreamHeadDims = Intersect<DecodeHeadDims, IntList<64, 128>>::type;
using DecodeStreamFp8HeadDims = Intersect<DecodeFp8HeadDims, IntList<128>>::type;
/// Head dims of the cascade's wgmma level kernels (f16 and bf16). Not 64: its tile compiles, but
/// levels of short segments came out beyond the tolerance on the GPU (bench/RESULTS.md), so that
/// head dim keeps the mma.sync kernel.
using CascadeWgmmaHeadDims = Intersect<CascadeHeadDims, IntList<128>>::type;
/// Head dims of the cascade's warp-specialised level kernels over 16-bit caches (f16 and bf16:
/// 64, 128 and 256, rows of whole 64-wide parts); those where the wgmma kernel is the fallback
/// (its head dims); 64, where the fallback is mma.sync; 256 ("wide": queries read from shared
/// memory, 64-key tiles only), whose fallback is mma.sync; over fp8 caches (128).
using CascadeWsHeadDims = Intersect<CascadeHeadDims, IntList<64, 128, 256>>::type;
using CascadeWsOverWgmmaHeadDims = Intersect<CascadeWsHeadDims, CascadeWgmmaHeadDims>::type;
using CascadeWsOverMmaHeadDims = Intersect<CascadeWsHeadDims, IntList<64>>::type;
using CascadeWsWideHeadDims = Intersect<CascadeWsHeadDims, IntList<256>>::type;
using CascadeWsFp8HeadDims = Intersect<CascadeHeadDims, IntList<128>>::type;
/// Dtypes of the cascade's queries and KV (the same dtype).
using CascadeDTypes = DTypeList<DType::kF16, DType::kBF16>;

static_assert(CascadeHeadDims::size() > 0 && MergeHeadDims::size() >= CascadeHeadDims::size() &&
                  DecodeHeadDims::size() >= CascadeHeadDims::size(),
              "every operation compiles a head dim (CMake checks ATTNSTATE_CUDA_HEAD_DIMS)");

}  // namespace compiled
}  // namespace attnstate
