/// @file kernels/mla/epilogue.cuh
/// @brief The epilogues of the MLA decode kernel (internal): each warp's normalised state into
///        shared memory (`mla_state_to_smem`), then either the output rows (`mla_store_rows`: one
///        split), or the split's partial state to the workspace (`mla_write_partial`), the
///        request's ticket (`mla_ticket`) and, in the CTA holding the last one, the merge of the
///        splits in split order (`mla_merge_splits`: the decode's prior-state fold); or, from
///        `plan::kMlaStackMergeSplits` splits, the partial state into its slot of a stack that
///        `merge_states` folds after the kernel (`mla_write_split_stack`). Every output row of
///        the kernel ends in `mla_store_columns`, which merges the head's sink last. Parts of the
///        MLA kernels, inlined there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/kernels/decode/split_merge.cuh"
#include "cuda/kernels/mla/loader.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/tile/split_merge.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// Float4 columns of an output row.
constexpr int kMlaD4 = kMlaLoraRank / 4;

/// The warp's state of its rows (`o_acc` over its 256 columns, unnormalised; `os`: row sums still
/// per thread) normalised and scaled by V's scale `v_scale` into `o` [64][512], the rows' base-2
/// LSEs into `lse` [64] (by the warps of the first half). An empty row is `(0, -inf)`.
__device__ __forceinline__ void mla_state_to_smem(float (&o_acc)[kMlaWarpCols / 8][4],
                                                  math::OnlineSoftmax (&os)[2], int warp, int lane,
                                                  float v_scale, float* o, float* lse) {
  const int rg = warp & 3;
  const int half = warp >> 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = os[h].l;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    os[h].l = l;
    const float f = os[h].inv_sum() * v_scale;
    const int r = 16 * rg + (lane >> 2) + 8 * h;
    float* row = o + r * kMlaLoraRank + half * kMlaWarpCols + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < kMlaWarpCols / 8; ++j)
      *reinterpret_cast<float2*>(row + 8 * j) =
          make_float2(o_acc[j][2 * h] * f, o_acc[j][2 * h + 1] * f);
    if (half == 0 && (lane & 3) == 0) lse[r] = os[h].lse(LseBase::kBase2);
  }
}

/// Stores four merged columns (from `4 · d4`) of request row `rg` of request `b` as the output
/// state, the head's sink merged in last when there are sinks.
__device__ __forceinline__ void mla_store_columns(const MlaParams& p, int b, int rg, int d4,
                                                  tile::MergedColumns mc) {
  const std::int64_t token = static_cast<std::int64_t>(b) * p.q_len + rg / p.group;
  const std::int64_t h = rg % p.group;
  if (p.sinks != nullptr) mc = tile::merge_sink(mc, p.sinks[h]);  // once, after everything else
  store4_as(p.out_o, p.out_dtype, token * p.o_stride_token + h * p.o_stride_head + 4 * d4, mc.o,
            p.out_vec4);
  if (d4 == 0)
    p.out_lse[token * p.lse_stride_token + h * p.lse_stride_head] =
        math::convert_lse(mc.lse, LseBase::kBase2, p.out_base);
}

/// One split: the CTA's rows from shared memory (`o`, `lse`) straight to the output.
__device__ __forceinline__ void mla_store_rows(const MlaParams& p, const MlaCta& c, int tid,
                                               const float* o, const float* lse) {
#pragma unroll 1
  for (int e = tid; e < c.rows_here * kMlaD4; e += kMlaThreads) {
    const int r = e / kMlaD4;
    const int d4 = e % kMlaD4;
    tile::MergedColumns mc;
    mc.o = *reinterpret_cast<const float4*>(o + r * kMlaLoraRank + 4 * d4);
    mc.lse = lse[r];
    mla_store_columns(p, c.b, c.row0 + r, d4, mc);
  }
}

/// The split's partial state (rows of the CTA, from shared memory) into its workspace slot:
/// split `s` of tile `tile_id` (`S` slots per tile), row `r` at `((tile_id · S + s) · 64 + r)`.
__device__ __forceinline__ void mla_write_partial(const MlaParams& p, const MlaCta& c, int tid,
                                                  std::int64_t tile_id, const float* o,
                                                  const float* lse) {
  const std::int64_t part0 = (tile_id * p.splits.max_splits + c.s) * kMlaTileRows;
#pragma unroll 1
  for (int e = tid; e < c.rows_here * kMlaD4; e += kMlaThreads) {
    const int r = e / kMlaD4;
    const int d4 = e % kMlaD4;
    *reinterpret_cast<float4*>(p.ws_o + (part0 + r) * kMlaLoraRank + 4 * d4) =
        *reinterpret_cast<const float4*>(o + r * kMlaLoraRank + 4 * d4);
    if (d4 == 0) p.ws_lse[part0 + r] = lse[r];
  }
}

/// The CTA's rows from shared memory (`o` [64][512], `lse` [64], the first `rows_here`) into rows
/// `first ..` of a dense fp32 stack of states (`stack_o` [row][512], `stack_lse` [row], base 2)
/// by the epilogue's `kMlaThreads` threads; with `o` null (a split past its request's), the
/// empty state `(0, -inf)`, so that `merge_states` over the stack reads a written state in every
/// slot. The stacked merge of the decode and the MLA cascade's levels.
__device__ __forceinline__ void mla_write_stack_rows(float* stack_o, float* stack_lse,
                                                     std::int64_t first, int rows_here, int tid,
                                                     const float* o, const float* lse) {
#pragma unroll 1
  for (int e = tid; e < rows_here * kMlaD4; e += kMlaThreads) {
    const int r = e / kMlaD4;
    const int d4 = e % kMlaD4;
    *reinterpret_cast<float4*>(stack_o + (first + r) * kMlaLoraRank + 4 * d4) =
        o != nullptr ? *reinterpret_cast<const float4*>(o + r * kMlaLoraRank + 4 * d4)
                     : make_float4(0.f, 0.f, 0.f, 0.f);
    if (d4 == 0) stack_lse[first + r] = o != nullptr ? lse[r] : math::neg_inf();
  }
}

/// The decode's stacked merge (`p.stack_rows > 0`): the CTA's rows into slot `c.s` of the stack
/// `[split][stack_rows][512]` (rows in the output's order, `b · rows + row0 + r`); `o` null: the
/// empty state.
__device__ __forceinline__ void mla_write_split_stack(const MlaParams& p, const MlaCta& c, int tid,
                                                      const float* o, const float* lse) {
  const std::int64_t first = c.s * p.stack_rows + static_cast<std::int64_t>(c.b) * p.rows + c.row0;
  mla_write_stack_rows(p.ws_o, p.ws_lse, first, c.rows_here, tid, o, lse);
}

/// The barrier of the epilogue's `kMlaThreads` threads: the CTA's (`bar_id` 0: they are all of
/// it), or named barrier `bar_id` (a kernel with other warps besides, which have left).
__device__ __forceinline__ void mla_sync(int bar_id) {
  if (bar_id == 0)
    __syncthreads();
  else
    arch::named_sync(bar_id, kMlaThreads);
}

/// The ticket of the CTA's split (acquire-release: its partial state is released with it, the
/// other splits' acquired): true in the CTA that takes the last of the request's `n_splits`,
/// which resets the counter for the next launch. `bar_id`: the threads' barrier (`mla_sync`).
__device__ __forceinline__ bool mla_ticket(const MlaParams& p, int tid, std::int64_t tile_id,
                                           int n_splits, int* is_last, int bar_id = 0) {
  mla_sync(bar_id);  // every thread's partial-state stores precede the release
  if (tid == 0) {
    const int ticket = arch::atomic_add_acq_rel_gpu(p.tickets + tile_id, 1);
    const int last = ticket == n_splits - 1;
    if (last) p.tickets[tile_id] = 0;  // the next launch is ordered after this kernel
    *is_last = last;
  }
  mla_sync(bar_id);
  return *is_last != 0;
}

/// The merge of the request's `n_splits` partial states of tile `tile_id`, in split order, into
/// the output rows: the decode's fold of prior states (`fold_prior`) over the workspace slots,
/// starting from the empty state.
__device__ __forceinline__ void mla_merge_splits(const MlaParams& p, const MlaCta& c, int tid,
                                                 std::int64_t tile_id, int n_splits) {
  const std::int64_t slot0 = tile_id * p.splits.max_splits * kMlaTileRows;
  tile::MergedColumns empty;
  empty.o = make_float4(0.f, 0.f, 0.f, 0.f);
  empty.lse = math::neg_inf();
#pragma unroll 1
  for (int e = tid; e < c.rows_here * kMlaD4; e += kMlaThreads) {
    const int r = e / kMlaD4;
    const int d4 = e % kMlaD4;
    const tile::MergedColumns mc = fold_prior<kMlaLoraRank>(
        p.ws_o + slot0 * kMlaLoraRank, p.ws_lse + slot0, n_splits, kMlaTileRows, r, d4, empty);
    mla_store_columns(p, c.b, c.row0 + r, d4, mc);
  }
}

/// The wgmma kernels' epilogue after the state is in shared memory (`o`, `lse`; every thread
/// past the barrier that published it): the CTA's coordinates read again (registers the loops
/// had to themselves), then the split's slot of the stack (`p.stack_rows` > 0), the output rows
/// (one split), or the partial state, the ticket (barrier `bar_id`, `is_last` its flag) and, in
/// the CTA holding the last one, the merge of the splits.
__device__ __forceinline__ void mla_rows_out(const MlaParams& p, int tid, const float* o,
                                             const float* lse, int* is_last, int bar_id) {
  const MlaCta c = mla_schedule(p);
  if (p.stack_rows > 0) {  // the stacked merge (merge_states after the kernel)
    mla_write_split_stack(p, c, tid, o, lse);
    return;
  }
  const int n_splits = p.splits.splits_for(mla_length(p, c));
  if (n_splits == 1) {
    mla_store_rows(p, c, tid, o, lse);
    return;
  }
  const std::int64_t tile_id = static_cast<std::int64_t>(c.b) * p.row_tiles + c.mt;
  mla_write_partial(p, c, tid, tile_id, o, lse);
  if (!mla_ticket(p, tid, tile_id, n_splits, is_last, bar_id)) return;
  mla_merge_splits(p, c, tid, tile_id, n_splits);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
