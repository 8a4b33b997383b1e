/// @file kernels/mla/mla_decode.cuh
/// @brief The MLA decode kernel (internal): one CTA per (request, tile of 64 query rows,
///        split), 8 warps (4 row groups of 16 rows × 2 halves of the 512 latent columns).
///
/// The kernel body is a composition of named parts:
/// - scheduler and prologue (`loader.cuh`): `mla_schedule` (the CTA's `MlaCta`, with its
///   request's page range), `mla_length`, the split's keys (`SplitLayout::range`), the query
///   tile's copies (`mla_load_queries`);
/// - mainloop (`mainloop.cuh`): `mla_mainloop`, the 32-key tiles through a double-buffered
///   cp.async pipeline (`mla_load_tile`, `mla_convert_tile` over fp8), `mla_scores` and
///   `mla_softmax_pv`;
/// - epilogues (`epilogue.cuh`): `mla_state_to_smem`, then `mla_store_rows` (one split) or
///   `mla_write_partial`, `mla_ticket` and `mla_merge_splits` (the decode's prior-state fold
///   over the splits' partial states), the sinks merged once in `mla_store_columns`; or, for
///   the stacked merge, `mla_write_split_stack` (also by a split past its request's).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/online_softmax.hpp"
#include "cuda/kernels/mla/epilogue.cuh"
#include "cuda/kernels/mla/loader.cuh"
#include "cuda/kernels/mla/mainloop.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/tile/fp8_kv.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// The MLA decode kernel over a latent part of `kKv` (`tile::Fp8Kv`: bf16, or an fp8 format
/// converted to bf16 in shared memory; `kBlock`: with the fp8 latent part's block scales).
template <int kKv, bool kBlock = false>
__global__ void __launch_bounds__(kMlaThreads, 1) mla_decode_kernel(const MlaParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const MlaSmem sm = mla_smem<kKv, kBlock>(smem);
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  // ---- scheduler and prologue: the CTA's tile, split and keys ----
  const MlaCta c = mla_schedule(p);
  const std::int32_t len = mla_length(p, c);
  const int n_splits = p.splits.splits_for(len);
  if (c.s >= n_splits) {  // past the request's splits: no ticket, an empty slot of a stack
    if (p.stack_rows > 0) mla_write_split_stack(p, c, tid, nullptr, nullptr);
    return;
  }
  const TokenRange range = p.splits.range(len, c.s);
  const std::int64_t tile_id = static_cast<std::int64_t>(c.b) * p.row_tiles + c.mt;
  mla_load_queries(p, c, tid, arch::smem_addr(sm.q));
  int lim[2];  // exclusive key ends of this thread's rows (its row group's 16 rows)
  const int rg = warp & 3;
  tile::causal_row_limits(p, lane, c.rows_here - 16 * rg, c.row0 + 16 * rg, len, range.end, lim);

  // ---- mainloop ----
  float o_acc[kMlaWarpCols / 8][4];
  math::OnlineSoftmax os[2];
  mla_mainloop<kKv, kBlock>(p, c, sm, tid, warp, lane, range.begin, range.end, lim, o_acc, os);

  // ---- epilogue: the normalised state (V's scale applied) into shared memory ----
  __syncthreads();  // every warp is done with the tiles the state overwrites
  const float v_scale = kKv != tile::kKvSame ? p.ckv_scale.at(0) : 1.f;
  mla_state_to_smem(o_acc, os, warp, lane, v_scale, sm.o, sm.lse);
  __syncthreads();
  if (p.stack_rows > 0) {  // the stacked merge (merge_states after the kernel)
    mla_write_split_stack(p, c, tid, sm.o, sm.lse);
    return;
  }
  if (n_splits == 1) {
    mla_store_rows(p, c, tid, sm.o, sm.lse);
    return;
  }
  mla_write_partial(p, c, tid, tile_id, sm.o, sm.lse);
  if (!mla_ticket(p, tid, tile_id, n_splits, sm.is_last)) return;
  mla_merge_splits(p, c, tid, tile_id, n_splits);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
