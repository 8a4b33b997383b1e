/// @file kernels/mla/mla_decode_ws.cuh
/// @brief The MLA decode kernel on Hopper `wgmma` (internal, sm_90a): one CTA per (request, tile
///        of 64 query rows, split), as `mla_decode_kernel` schedules them, 12 warps: consumer
///        warpgroups 0 (scores, softmax, `P V` over columns 0..255) and 1 (`P V` over columns
///        256..511), and a producer warpgroup filling a two-stage ring of 64-key tiles.
///
/// The kernel body is a composition of named parts:
/// - scheduler and prologue (`loader.cuh`): `mla_schedule`, `mla_length`, the split's keys, the
///   query tile's copies by every thread (`mla_load_queries` in the layout of
///   `ws_ring.cuh`);
/// - producer (`ws_ring.cuh`): `mla_ws_produce` (cp.async; fp8 bytes converted in the stage);
/// - consumers (`ws_consumer.cuh`): `mla_ws_scores_loop` (warpgroup 0), `mla_ws_pv_loop`
///   (warpgroup 1);
/// - epilogues (`epilogue.cuh`, the mma.sync kernel's, by the consumers' 256 threads): the row
///   statistics of warpgroup 0 handed to warpgroup 1, `mla_state_to_smem`, then `mla_store_rows`
///   (one split) or `mla_write_partial`, `mla_ticket` and `mla_merge_splits`, or, for the
///   stacked merge, `mla_write_split_stack` (also by a split past its request's).
///
/// Its balanced variant (`mla_decode_ws_balanced_kernel`, the same body with `kBalanced`) has
/// both consumer warpgroups compute the scores, each of half of every tile's keys, exchange
/// their rows' maxima and probabilities, then add `P V` over their columns
/// (`ws_balanced.cuh`: `mla_ws_balanced_loop`); its rows' sums are the two warpgroups' added in
/// the epilogue. The producer, the ring and the epilogues are the same.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/wgmma.cuh"
#include "cuda/kernels/mla/epilogue.cuh"
#include "cuda/kernels/mla/loader.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/kernels/mla/ws_balanced.cuh"
#include "cuda/kernels/mla/ws_consumer.cuh"
#include "cuda/kernels/mla/ws_ring.cuh"
#include "cuda/tile/fp8_kv.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// Warpgroup 0's running softmax statistics of its rows handed to warpgroup 1 (whose threads
/// hold the same rows) through shared memory `x` (the probabilities' buffer, free once both
/// warpgroups are past their loops): `os` of warpgroup 1 becomes warpgroup 0's. `kBalanced`:
/// both hold the same maxima, each the sum over its own keys; each adds the other's sums (in
/// either order the same bits).
template <bool kBalanced = false>
__device__ __forceinline__ void mla_ws_share_stats(int wg, int t, float* x,
                                                   math::OnlineSoftmax (&os)[2]) {
  arch::named_sync(kMlaWsBarEpilogue, kMlaThreads);  // both loops done (P read, wgmma waited)
  if constexpr (kBalanced) {
    float2* sums = reinterpret_cast<float2*>(x);
    sums[128 * wg + t] = make_float2(os[0].l, os[1].l);
    arch::named_sync(kMlaWsBarEpilogue, kMlaThreads);
    const float2 v = sums[128 * (1 - wg) + t];
    os[0].l += v.x;
    os[1].l += v.y;
    return;
  }
  float4* slot = reinterpret_cast<float4*>(x) + t;
  if (wg == 0) *slot = make_float4(os[0].m, os[0].l, os[1].m, os[1].l);
  arch::named_sync(kMlaWsBarEpilogue, kMlaThreads);
  if (wg == 1) {
    const float4 v = *slot;
    os[0].m = v.x;
    os[0].l = v.y;
    os[1].m = v.z;
    os[1].l = v.w;
  }
}

/// The body of the wgmma MLA decode kernels over a latent part of `kKv` (`tile::Fp8Kv`: bf16, or
/// an fp8 format converted to bf16 by the producer; `kBlock`: with the fp8 latent part's block
/// scales); `kBalanced`: the balanced consumers (`mla_ws_balanced_loop`).
template <int kKv, bool kBlock, bool kBalanced>
__device__ __forceinline__ void mla_decode_ws_body(const MlaParams& p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kFp8 = kKv != tile::kKvSame;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const MlaWsSmem sm(smem_raw);
  const int tid = threadIdx.x;
  // (the same in every thread of a warp as the compiler sees it: the warpgroups' branches are
  // not divergent, so their wgmma are not serialised)
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  const int lane = tid & 31;

  // ---- scheduler and prologue: the CTA's tile, split and keys ----
  int begin, n_tiles;
  {
    const MlaCta c = mla_schedule(p);
    const std::int32_t len = mla_length(p, c);
    // past the request's splits: no ticket either; with the stacked merge, no key tile, and the
    // epilogue writes the empty state to the split's slot (written from here, it made the fp8
    // instances spill)
    const bool past = c.s >= p.splits.splits_for(len);
    if (past && p.stack_rows == 0) return;
    const TokenRange range = past ? TokenRange{0, 0} : p.splits.range(len, c.s);
    begin = range.begin;
    n_tiles = (range.end - range.begin + kMlaWsTileKeys - 1) / kMlaWsTileKeys;
    if (tid == 0) sm.init_barriers();
    mla_load_queries<kMlaWsThreads, MlaWsLayout>(p, c, tid, arch::smem_addr(sm.q));
    arch::cp_async_commit();
    arch::cp_async_wait<0>();
    arch::fence_proxy_async();  // the query tile (cp.async) → read by wgmma
    __syncthreads();            // the query tile and the mbarriers for every warp
    if (warp >= 8) {
      // ---- producer warpgroup ----
      arch::setmaxnreg_dec<kMlaWsProducerRegs<kFp8>>();
      mla_ws_produce<kKv, kBlock>(p, c, sm, tid - kMlaThreads, lane, begin, range.end, n_tiles);
      return;
    }
  }

  // ---- consumer warpgroups ----
  arch::setmaxnreg_inc<kMlaWsConsumerRegs<kFp8>>();
  const int wg = warp >> 2;
  float acc[kMlaWarpCols / 8][4];
  tile::zero_frags(acc);
  std::uint32_t pf[kMlaWsTileKeys / 16][4];
  MlaWsWarp w{sm, wg, warp & 3, lane, acc, pf};
  math::OnlineSoftmax os[2];
  if constexpr (kBalanced) {
    if (n_tiles > 0) mla_ws_balanced_loop<kKv>(p, w, begin, n_tiles, os);
  } else if (wg == 0) {
    if (n_tiles > 0) mla_ws_scores_loop<kKv>(p, w, begin, n_tiles, os);
  } else {
    mla_ws_pv_loop(w, n_tiles);
  }

  // ---- epilogue: the normalised state (V's scale applied), by the consumers' 256 threads ----
  mla_ws_share_stats<kBalanced>(wg, tid & 127, reinterpret_cast<float*>(sm.p), os);
  const float v_scale = kFp8 ? p.ckv_scale.at(0) : 1.f;
  mla_state_to_smem(acc, os, warp, lane, v_scale, sm.o, sm.lse);
  arch::named_sync(kMlaWsBarEpilogue, kMlaThreads);
  mla_rows_out(p, tid, sm.o, sm.lse, sm.is_last, kMlaWsBarEpilogue);
#elif defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the run never launches it (DeviceFacts::wgmma())
#endif
}

/// The wgmma MLA decode kernel (`mla_decode_ws_body`: warpgroup 0 the scores).
template <int kKv, bool kBlock = false>
__global__ void __launch_bounds__(kMlaWsThreads, 1) mla_decode_ws_kernel(const MlaParams p) {
  mla_decode_ws_body<kKv, kBlock, false>(p);
}

/// The balanced wgmma MLA decode kernel (`mla_decode_ws_body`: both consumer warpgroups compute
/// the scores of half of every tile's keys).
template <int kKv, bool kBlock = false>
__global__ void __launch_bounds__(kMlaWsThreads, 1)
    mla_decode_ws_balanced_kernel(const MlaParams p) {
  mla_decode_ws_body<kKv, kBlock, true>(p);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
