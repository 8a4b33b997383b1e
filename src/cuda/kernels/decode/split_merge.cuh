/// @file kernels/decode/split_merge.cuh
/// @brief The output side of the decode's split merge (internal): the fold of prior states into
///        merged columns (`fold_prior`, `fold_prior_group`) and the stores of the result in the
///        output dtype. The merge of the splits is `tile/split_merge.cuh`.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/merge_math.hpp"
#include "cuda/arch/grid_dependency.cuh"
#include "cuda/tile/split_merge.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

// The split merge itself is the tile part (also the workspace and cluster merges' core).
using tile::MergedColumns;
using tile::split_finalize;
using tile::split_merge;

/// Prior states whose loads `fold_prior` keeps in flight together.
constexpr int kPriorBatch = 16;

/// Folds `count` ≥ 1 prior states of output row `row` into this kernel's merged columns `own`
/// (four columns from `4 · d4`): state i has base-2 LSE `prior_lse[i · rows + row]` and fp32
/// normalised `o` at `prior_o + (i · rows + row) · D`. A max-subtracted merge over `own`, then
/// the prior states in order, `kPriorBatch` states' loads in flight at a time (one memory round
/// trip per batch: the running max moves per batch, rescaling the sums by `2^(m_old − m_new)`);
/// an empty prior state's `o` is never read as a factor. First waits for the kernels this one
/// depends on (`griddepcontrol.wait`: a programmatic dependent launch may start before the
/// prior states are written; a no-op otherwise). Not inlined (scalar arguments: no copy of the
/// kernel's parameters to the stack): one copy serves every output path.
template <int D>
static __device__ __noinline__ MergedColumns fold_prior(const float* prior_o,
                                                        const float* prior_lse, int count,
                                                        std::int64_t rows, std::int64_t row, int d4,
                                                        MergedColumns own) {
  arch::wait_on_dependent_grids();
  const float* lse = prior_lse + row;
  const float* o = prior_o + row * D + 4 * d4;
  float m = math::neg_inf();
  float sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  auto add = [&](float l, const float4& v) {
    if (!math::is_empty_lse(l)) {
      const float w = math::merge_weight(LseBase::kBase2, l, m);
      sum += w;
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
  };
  for (int i0 = -1; i0 < count; i0 += kPriorBatch) {
    // a batch's LSEs and o columns loaded together (index -1 is `own`; an empty state's o is
    // loaded but never used)
    float l[kPriorBatch];
    float4 v[kPriorBatch];
#pragma unroll
    for (int u = 0; u < kPriorBatch; ++u) {
      const int i = min(i0 + u, count - 1);
      if (i < 0) {
        l[u] = own.lse;
        v[u] = own.o;
      } else {
        l[u] = i0 + u < count ? lse[i * rows] : math::neg_inf();
        v[u] = *reinterpret_cast<const float4*>(o + i * rows * D);
      }
    }
    float mb = m;
#pragma unroll
    for (int u = 0; u < kPriorBatch; ++u) mb = math::nan_max(mb, l[u]);
    if (mb != m && !math::is_empty_lse(m)) {
      // the max moved: rescale what was summed against the old max (NaN propagates)
      const float r = math::merge_weight(LseBase::kBase2, m, mb);
      sum *= r;
      acc.x *= r;
      acc.y *= r;
      acc.z *= r;
      acc.w *= r;
    }
    m = mb;
#pragma unroll
    for (int u = 0; u < kPriorBatch; ++u) add(l[u], v[u]);
  }
  return split_finalize(m, sum, acc);
}

/// `fold_prior` done by a group of `G` lanes (16 or 32, aligned in the warp, all active) that
/// hold consecutive column quads of the same output row: the per-row work is shared instead of
/// repeated by every lane. Lane `j` of the group loads the LSEs of states `j, j + G, ...`; the
/// max and the weights come from them, and each state's weight is broadcast with a shuffle
/// when its `o` columns are added (in state order, `own` first). Same arguments and result (up
/// to rounding) as `fold_prior`; one memory round trip for the LSEs, one per `G` states for `o`.
template <int D, int G>
static __device__ __noinline__ MergedColumns fold_prior_group(const float* prior_o,
                                                              const float* prior_lse, int count,
                                                              std::int64_t rows, std::int64_t row,
                                                              int d4, MergedColumns own) {
  static_assert(G == 16 || G == 32, "groups of 16 or 32 lanes");
  arch::wait_on_dependent_grids();
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int gl = lane & (G - 1);
  const unsigned mask = G == 32 ? 0xffffffffu : (0xffffu << (lane & 16));
  const float* lse = prior_lse + row;
  const float* o = prior_o + row * D + 4 * d4;
  // the max over `own` and every prior state
  float m = own.lse;
  for (int i = gl; i < count; i += G) m = math::nan_max(m, lse[i * rows]);
#pragma unroll
  for (int off = G / 2; off > 0; off >>= 1) m = math::nan_max(m, __shfl_xor_sync(mask, m, off, G));
  float sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (!math::is_empty_lse(own.lse)) {
    const float w = math::merge_weight(LseBase::kBase2, own.lse, m);
    sum = w;
    acc = make_float4(w * own.o.x, w * own.o.y, w * own.o.z, w * own.o.w);
  }
  float lane_sum = 0.f;  // this lane's states' weights
  for (int i0 = 0; i0 < count; i0 += G) {
    // this lane's state of the chunk: its weight, or -1 when empty (never applied)
    const float l = i0 + gl < count ? lse[(i0 + gl) * rows] : math::neg_inf();
    float w = -1.f;
    if (!math::is_empty_lse(l)) {
      w = math::merge_weight(LseBase::kBase2, l, m);
      lane_sum += w;
    }
    const int n = min(G, count - i0);
#pragma unroll 8
    for (int j = 0; j < n; ++j) {
      const float wj = __shfl_sync(mask, w, j, G);
      const float4 v = *reinterpret_cast<const float4*>(o + (i0 + j) * rows * D);
      if (wj != -1.f) {
        acc.x += wj * v.x;
        acc.y += wj * v.y;
        acc.z += wj * v.z;
        acc.w += wj * v.w;
      }
    }
  }
#pragma unroll
  for (int off = G / 2; off > 0; off >>= 1) lane_sum += __shfl_xor_sync(mask, lane_sum, off, G);
  return split_finalize(m, sum + lane_sum, acc);
}

/// Stores one fp32 value as `dt` at element `off` of `base`.
__device__ __forceinline__ void store_as(void* base, DType dt, std::int64_t off, float x) {
  switch (dt) {
    case DType::kF32:
      static_cast<float*>(base)[off] = x;
      break;
    case DType::kF16:
      static_cast<half_t*>(base)[off] = from_float<half_t>(x);
      break;
    default:
      static_cast<bfloat16_t*>(base)[off] = from_float<bfloat16_t>(x);
      break;
  }
}

/// Two values rounded to the 16-bit type `T` exactly as `store_as` does, `lo` in the low half.
template <class T>
__device__ __forceinline__ std::uint32_t bits2(float lo, float hi) {
  return static_cast<std::uint32_t>(from_float<T>(lo).bits) |
         (static_cast<std::uint32_t>(from_float<T>(hi).bits) << 16);
}

/// Stores four consecutive values as `dt` at element `off` of `base`: one aligned vector store
/// when `vec` (the caller checked the alignment), else four scalar stores. Rounds like
/// `store_as`. Not inlined: one copy of the dtype switch serves every call site.
static __device__ __noinline__ void store4_as(void* base, DType dt, std::int64_t off, float4 x,
                                              bool vec) {
  if (vec) {
    switch (dt) {
      case DType::kF32:
        *reinterpret_cast<float4*>(static_cast<float*>(base) + off) = x;
        return;
      case DType::kF16:
        *reinterpret_cast<uint2*>(static_cast<half_t*>(base) + off) =
            make_uint2(bits2<half_t>(x.x, x.y), bits2<half_t>(x.z, x.w));
        return;
      default:
        *reinterpret_cast<uint2*>(static_cast<bfloat16_t*>(base) + off) =
            make_uint2(bits2<bfloat16_t>(x.x, x.y), bits2<bfloat16_t>(x.z, x.w));
        return;
    }
  }
  store_as(base, dt, off + 0, x.x);
  store_as(base, dt, off + 1, x.y);
  store_as(base, dt, off + 2, x.z);
  store_as(base, dt, off + 3, x.w);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
