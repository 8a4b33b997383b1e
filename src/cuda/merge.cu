/// @file merge.cu
/// @brief CUDA backend: the pairwise merges `merge_state` and `merge_state_inplace`.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/merge.hpp"
#include "catalog/catalog.hpp"
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

/// The run-time needs of the catalog's pairwise rows of `chunks` chunks a thread (0: none) that
/// the merge of `args` over `rows` rows meets: `args.aligned` rows, a row split into a power of
/// two of threads of `chunks` chunks whose covering grid stays within the grid limit, an output
/// whose memory no input shares.
catalog::Needs pair_needs_met(const kernels::PairArgs& args, std::int64_t rows, int chunks) {
  catalog::Needs met = catalog::kNeedsNothing;
  if (args.aligned) met |= catalog::kNeedsChunkedRows;
  if (args.out.o != args.a.o && args.out.o != args.b.o) met |= catalog::kNeedsDistinctOut;
  if (chunks > 0) {
    const kernels::RowSplit s = kernels::row_split(args.out.head_dim, chunks);
    if (s.group * chunks == s.per_row && rows * s.group / kernels::kMinBlock < 0x7fffffff) {
      met |= catalog::kNeedsWholeSplit;
    }
  }
  return met;
}

/// The catalog's query of a pairwise merge of these dtypes (family `f`).
constexpr catalog::Query pair_query(catalog::Family f, DType a, DType b, DType out) {
  catalog::Query q;
  q.family = f;
  q.q = catalog::mask(a);
  q.kv = catalog::mask(b);
  q.out = catalog::mask(out);
  return q;
}

constexpr int kDTypes = 5;  // DType's values, 0 to 4

/// The catalog's pairwise rows of one (a, b, out) dtype triple: the streamed, then the whole-row
/// rows (each family in its order of chunk counts), and the general kernel's (-1: none).
struct PairRows {
  catalog::Candidates<8> fast;
  int general = -1;
};

/// `PairRows` of every dtype triple (index `(a * kDTypes + b) * kDTypes + out`), listed at
/// compile time so that a call reads only its candidates.
constexpr std::array<PairRows, kDTypes * kDTypes * kDTypes> pair_rows() {
  using catalog::Family;
  std::array<PairRows, kDTypes * kDTypes * kDTypes> t{};
  for (int i = 0; i < kDTypes * kDTypes * kDTypes; ++i) {
    const auto a = static_cast<DType>(i / (kDTypes * kDTypes));
    const auto b = static_cast<DType>(i / kDTypes % kDTypes);
    const auto out = static_cast<DType>(i % kDTypes);
    PairRows& p = t[static_cast<std::size_t>(i)];
    p.fast = catalog::candidates(pair_query(Family::kMergePairStream, a, b, out), p.fast);
    p.fast = catalog::candidates(pair_query(Family::kMergePairWhole, a, b, out), p.fast);
    p.general = catalog::find_id(pair_query(Family::kMergePair, a, b, out));
  }
  return t;
}
constexpr std::array<PairRows, kDTypes* kDTypes* kDTypes> kPairRows = pair_rows();

const PairRows& pair_rows(DType a, DType b, DType out) {
  return kPairRows[static_cast<std::size_t>(
      (static_cast<int>(a) * kDTypes + static_cast<int>(b)) * kDTypes + static_cast<int>(out))];
}

/// The kernel of a pairwise merge, from the catalog: the first row of the streamed, then the
/// whole-row family for the dtypes of `args` (each in its order of chunk counts) whose run-time
/// needs the merge meets (`catalog::family_that_runs`), else the general kernel's row (null when
/// the catalog holds none for the dtypes).
const catalog::Row* pick_pair_kernel(const kernels::PairArgs& args, std::int64_t rows) {
  const PairRows& p = pair_rows(args.a.dtype, args.b.dtype, args.out.dtype);
  for (int i = 0; i < p.fast.count; ++i) {
    const catalog::Row& r = catalog::kRows[static_cast<std::size_t>(p.fast.ids[i])];
    if (catalog::family_that_runs(r, pair_needs_met(args, rows, r.chunks)) == r.family) return &r;
  }
  return p.general < 0 ? nullptr : &catalog::kRows[static_cast<std::size_t>(p.general)];
}

/// Throws `kNotSupported` when the catalog holds no pairwise kernel for these dtypes: a second
/// fp8 format named by `kernels::fp8_format` (one format per call), else `b` with, as expected,
/// what the catalog holds for `a`'s dtype.
void check_pair_compiled(const char* func, DType a, DType b, DType out) {
  if (pair_rows(a, b, out).general >= 0) return;
  const catalog::Query q = pair_query(catalog::Family::kMergePair, a, b, out);
  kernels::fp8_format(func, {{"out.dtype", out}, {"a.dtype", a}, {"b.dtype", b}});  // one format
  catalog::Query at_a = q;
  at_a.out = 0;
  std::string held;  // per dtype of b, the outputs compiled with a's dtype
  for (int d = 0; d < 5; ++d) {
    at_a.kv = catalog::mask(static_cast<DType>(d));
    catalog::DTypeMask outs = 0;
    for (const catalog::Row& r : catalog::kRows) {
      if (catalog::matches(r, at_a)) outs = static_cast<catalog::DTypeMask>(outs | r.out);
    }
    if (outs == 0) continue;
    held += std::string(held.empty() ? "" : "; ") + "b of " + to_string(static_cast<DType>(d)) +
            " into " + catalog::dtypes_string(outs);
  }
  attnstate::detail::throw_argument(func, "b.dtype",
                                    catalog::not_supported_message(q) + ": with a of " +
                                        to_string(a) + ", " +
                                        (held.empty() ? std::string("none") : held),
                                    to_string(b), Status::kNotSupported);
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
  check_pair_compiled(func, a.dtype, b.dtype, out.dtype);
  const catalog::Row* k = pick_pair_kernel(args, rows);
  const bool whole = k != nullptr && k->family != catalog::Family::kMergePair;
  const bool stream_in = whole && k->family == catalog::Family::kMergePairStream;
  kernels::dispatch_pair(func, a.dtype, b.dtype, out.dtype, [&](auto ta, auto tb, auto to) {
    using TA = decltype(ta);
    using TB = decltype(tb);
    using TO = decltype(to);
    if (whole) return detail::launch_pair_whole<TO>(func, args, k->chunks, stream_in, rows, stream);
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
  const catalog::Row* k = pick_pair_kernel(args, out.tokens * out.heads);
  return k != nullptr && k->family != catalog::Family::kMergePair;
}

}  // namespace detail

void merge_state(ConstStateView a, ConstStateView b, StateView out, cudaStream_t stream) {
  merge_state(a, b, out, TokenMask{}, stream);
}

void merge_state(ConstStateView a, ConstStateView b, StateView out, TokenMask mask,
                 cudaStream_t stream) {
  static const char* const kFunc = "attnstate::cuda::merge_state";
  constexpr bool kFp8 = catalog::takes_fp8(catalog::Family::kMergePair);
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
  constexpr bool kFp8 = catalog::takes_fp8(catalog::Family::kMergePair);
  v::check_output_state(kFunc, "acc", acc, kDevice, kFp8);
  v::check_state(kFunc, "other", other, kDevice, kFp8);
  v::check_same_shape(kFunc, "acc", acc, "other", other);
  v::check_alias(kFunc, "acc", acc, "other", other);
  v::check_mask(kFunc, "mask", mask, "acc", acc);
  launch_pair(kFunc, acc, other, acc, mask, /*in_place=*/true, stream);
}

}  // namespace cuda
}  // namespace attnstate
