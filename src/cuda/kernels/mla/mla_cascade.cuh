/// @file kernels/mla/mla_cascade.cuh
/// @brief The MLA cascade's level kernel (internal): one CTA per (segment, tile of 64 rows of
///        the segment's requests, split), 8 warps, the MLA decode's mainloop unchanged; each
///        CTA's fp32 partial state goes to its slot of the workspace stack, which `merge_states`
///        folds over the levels and splits after the last level.
///
/// The kernel body is a composition of named parts:
/// - segment scheduler and prologue (`segment.cuh`): `mla_segment_schedule` (the decode's
///   `mla_schedule` with the level's tables, the tile over the segment's rows),
///   `mla_length` (the segment's length clamped to its pages), the split's keys
///   (`SplitLayout::range`), `mla_load_segment_queries`, `mla_segment_row_limits`;
/// - mainloop (`mainloop.cuh`): `mla_mainloop`, as in the decode;
/// - epilogue: `mla_state_to_smem` (`epilogue.cuh`), then `mla_write_level_rows`; a split past
///   the segment's writes the empty state (`mla_write_level_rows` without a state).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/online_softmax.hpp"
#include "cuda/kernels/mla/epilogue.cuh"
#include "cuda/kernels/mla/loader.cuh"
#include "cuda/kernels/mla/mainloop.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/kernels/mla/segment.cuh"
#include "cuda/tile/fp8_kv.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// One level of the MLA cascade over a latent part of `kKv` (`tile::Fp8Kv`: bf16, or an fp8
/// format converted to bf16 in shared memory; `kBlock`: with the fp8 latent part's block scales).
template <int kKv, bool kBlock = false>
__global__ void __launch_bounds__(kMlaThreads, 1)
    mla_cascade_level_kernel(const MlaSegmentParams sp) {
  extern __shared__ __align__(128) unsigned char smem[];
  const MlaParams& p = sp.mla;
  const MlaSmem sm = mla_smem<kKv, kBlock>(smem);
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;

  // ---- segment scheduler and prologue: the CTA's tile, split and keys ----
  int req0 = 0;
  const MlaCta c = mla_segment_schedule(sp, &req0);
  if (c.rows_here <= 0) return;  // past the segment's rows
  const std::int32_t len = mla_length(p, c);
  if (c.s >= p.splits.splits_for(len)) {  // past the segment's splits: an empty slot
    mla_write_level_rows(sp, c, req0, tid, nullptr, nullptr);
    return;
  }
  const TokenRange range = p.splits.range(len, c.s);
  mla_load_segment_queries(p, c, req0, tid, arch::smem_addr(sm.q));
  int lim[2];  // exclusive key ends of this thread's rows (its row group's 16 rows)
  mla_segment_row_limits(sp, c, lane, warp & 3, len, range.end, lim);

  // ---- mainloop ----
  float o_acc[kMlaWarpCols / 8][4];
  math::OnlineSoftmax os[2];
  mla_mainloop<kKv, kBlock>(p, c, sm, tid, warp, lane, range.begin, range.end, lim, o_acc, os);

  // ---- epilogue: the normalised state (V's scale applied) into the stack ----
  __syncthreads();  // every warp is done with the tiles the state overwrites
  const float v_scale = kKv != tile::kKvSame ? p.ckv_scale.at(0) : 1.f;
  mla_state_to_smem(o_acc, os, warp, lane, v_scale, sm.o, sm.lse);
  __syncthreads();
  mla_write_level_rows(sp, c, req0, tid, sm.o, sm.lse);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
