/// @file tile/cascade_ws_consumer.cuh
/// @brief Device parts of the warp-specialised cascade level kernel (kernels/cascade/level_ws.cuh):
///        the consumer warpgroups' query copy, and a consumer warp's tile loop (`wgmma` products
///        on the K/V ring, the online-softmax step with its exp/max policy, the accumulator
///        rescale) up to its rows' final state.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/special.cuh"
#include "cuda/arch/wgmma.cuh"
#include "cuda/kernels/cascade/params.cuh"
#include "cuda/tile/cascade_level_block.cuh"
#include "cuda/tile/cascade_ws_ring.cuh"
#include "cuda/tile/warp_reduce.cuh"

namespace attnstate {
namespace cuda {
namespace tile {

/// The queries → shared memory at `q_smem`, in the 128-byte swizzled layout of the K tiles: each
/// consumer warpgroup (thread `tid` below `Tile::kConsumers`) copies its own 64 rows (zero past
/// the segment's rows), one cp.async commit group.
template <class Tile>
__device__ __forceinline__ void ws_load_q(const kernels::CascadeLevelParams& p,
                                          const LevelBlock& lb, int h_kv, std::uint32_t q_smem,
                                          int tid) {
  using T = typename Tile::T;
  constexpr int kChunks = Tile::D / 8;
  const T* q = static_cast<const T*>(p.q);
  const int wg = tid >> 7, t = tid & 127;
  for (int i = t; i < 64 * kChunks; i += 128) {
    const int r = wg * 64 + i / kChunks, c = i % kChunks;
    const int R = lb.row0 + r;
    const T* src = q;
    int bytes = 0;
    if (R < lb.nrows) {
      src = lb.q_src(p, q, h_kv, R, c);
      bytes = 16;
    }
    arch::cp_async_16_zfill(q_smem + 2 * swz128<Tile::BM>(r, c), src, bytes);
  }
  arch::cp_async_commit();
}

/// A consumer warp's rows (warp `wl` of warpgroup `wg`: rows lane/4 and lane/4 + 8 of its 16):
/// once this warpgroup's queries landed (`ws_load_q`), the query fragments `qf` (negated with
/// `negate_q`) and the rows' key limits (the split's end; causal on a last level). With
/// `Tile::kQSmem` the queries stay in shared memory for the tensor cores (negated there, each
/// thread its own chunks of `ws_load_q`) and `qf` is not set.
template <class Tile>
__device__ __forceinline__ void ws_consumer_rows(const kernels::CascadeLevelParams& p,
                                                 const LevelBlock& lb, std::uint32_t q_smem, int wg,
                                                 int wl, int lane, bool negate_q,
                                                 std::uint32_t (&qf)[Tile::kQFragSteps][4],
                                                 int (&limit)[2]) {
  arch::cp_async_wait<0>();
  if constexpr (Tile::kQSmem) {
    if (negate_q) {
      constexpr int kChunks = Tile::D / 8;
      for (int i = wl * 32 + lane; i < 64 * kChunks; i += 128) {
        const std::uint32_t a = q_smem + 2 * swz128<Tile::BM>(wg * 64 + i / kChunks, i % kChunks);
        uint4 v = arch::ld_shared_v4(a);
        v.x ^= 0x80008000u;
        v.y ^= 0x80008000u;
        v.z ^= 0x80008000u;
        v.w ^= 0x80008000u;
        arch::st_shared_v4(a, v);
      }
    }
    arch::fence_proxy_async();  // generic-proxy writes (cp.async, the negation) → wgmma
  }
  arch::named_sync(1 + wg, 128);  // this warpgroup's query rows are in shared memory
  if constexpr (!Tile::kQSmem) {
#pragma unroll
    for (int ks = 0; ks < Tile::D / 16; ++ks) {
      const int r = wg * 64 + wl * 16 + (lane & 15);
      const int c = ks * 2 + (lane >> 4);
      arch::ldmatrix_x4(qf[ks], q_smem + 2 * swz128<Tile::BM>(r, c));
      if (negate_q)
#pragma unroll
        for (int i = 0; i < 4; ++i) qf[ks][i] ^= 0x80008000u;
    }
  }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int R = lb.row0 + wg * 64 + wl * 16 + (lane >> 2) + rr * 8;
    limit[rr] = lb.kv_end;
    if (p.causal_tail && R < lb.nrows) {
      const int t = (R % lb.rows_per_req) / p.group;
      limit[rr] = min(lb.kv_end, lb.len - (p.q_len - 1 - t));
    }
  }
}

/// A consumer warp's tile loop over the K/V ring, on the warp's state (query fragments, key
/// limits, accumulator, softmax state, scores and probabilities: the kernel's locals, held by
/// reference as the loop's lambdas held them, which keeps the kernel's machine code). Each tile:
/// wait on the stage's "full", `QKᵀ` of tile t and `PV` of tile t-1 issued back to back, the
/// softmax of tile t while `PV` runs, the stage of tile t-1 released on its "empty".
template <class Tile>
struct WsConsumer {
  using T = typename Tile::T;
  using Wg = arch::Wgmma<T>;
  static constexpr int D = Tile::D, BN = Tile::BN, kStages = Tile::kStages;
  static constexpr std::uint32_t kTileBytes = Tile::kTileBytes;
  static constexpr bool kDescPre = Tile::kDescPre;
  static constexpr bool kFlat = Tile::kFastExp;  // the fast exponent: branch-free statistics
  static constexpr bool kLate = Tile::kRescaleLate;
  /// Descriptors (kWsDescPre): high words constant (groups of 8 keys 2048 bytes apart, 128-byte
  /// swizzle).
  static constexpr std::uint32_t kGroupBytes = kv_group_bytes<D>();  ///< One group of 8 keys.
  static constexpr std::uint32_t kDescHi = (kGroupBytes >> 4) | (1u << 30);

  const kernels::CascadeLevelParams& p;
  const LevelBlock& lb;
  const WsSmem<Tile>& sm;
  const int lane, wg;
  const float sc;  ///< The score scale (its magnitude with the fast exponent).
  const std::uint32_t (&qf)[Tile::kQFragSteps][4];
  const int (&limit)[2];
  const int limit_min;
  float (&acc)[D / 8][4];
  math::OnlineSoftmax (&os)[2];
  float (&alpha)[2];  ///< The rows' rescale factors of the last softmax step.
  float (&s)[BN / 8][4];
  std::uint32_t (&pf)[BN / 16][4];
  /// The variant's scores (kWsVariant: the cap, each row's window start; else unused).
  const VariantScores& var;
  /// Low descriptor words of stage 0 (kWsDescPre; + a stage's bytes >> 4 per stage, + the
  /// k-step's offset >> 4).
  const std::uint32_t kdesc0 = ((sm.k_smem & 0x3FFFFu) >> 4) | (1u << 16);
  const std::uint32_t vdesc0 = ((sm.v_smem & 0x3FFFFu) >> 4) | ((kKvHalfBytes >> 4) << 16);

  /// S = Q Kᵀ of the tile in stage `st` (64 rows × BN keys), committed as one wgmma group.
  __device__ __forceinline__ void issue_s(int st) {
    const std::uint32_t kb = sm.k_smem + st * kTileBytes;
    const std::uint32_t kd = kdesc0 + st * (kTileBytes >> 4);
    arch::fence_regs(s);
    arch::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      // k-step ks: 16 of head_dim, in half ks / 4 (the groups of 8 keys kGroupBytes apart)
      const std::uint32_t koff = (ks >> 2) * kKvHalfBytes + (ks & 3) * 32;
      const std::uint64_t desc = kDescPre ? arch::desc_join(kd + (koff >> 4), kDescHi)
                                          : arch::wgmma_desc(kb + koff, 16, kGroupBytes);
      if constexpr (Tile::kQSmem) {
        // the warpgroup's 64 query rows of part ks / 4: 8-row groups 1024 bytes apart
        const std::uint64_t qdesc = arch::wgmma_desc(
            sm.q_smem + (ks >> 2) * (Tile::BM * 128) + wg * (64 * 128) + (ks & 3) * 32, 16, 1024);
        if constexpr (BN == 64) {
          if (ks == 0)
            Wg::mma_s64_ss<0>(s, qdesc, desc);
          else
            Wg::mma_s64_ss<1>(s, qdesc, desc);
        } else {
          if (ks == 0)
            Wg::mma_s128_ss<0>(s, qdesc, desc);
          else
            Wg::mma_s128_ss<1>(s, qdesc, desc);
        }
      } else if constexpr (BN == 64) {
        if (ks == 0)
          Wg::mma_s64<0>(s, qf[ks], desc);
        else
          Wg::mma_s64<1>(s, qf[ks], desc);
      } else {
        if (ks == 0)
          Wg::mma_s128<0>(s, qf[ks], desc);
        else
          Wg::mma_s128<1>(s, qf[ks], desc);
      }
    }
    arch::wgmma_commit();
  }

  /// O += P V of the tile in stage `st`, committed as one wgmma group.
  __device__ __forceinline__ void issue_pv(int st) {
    const std::uint32_t vb = sm.v_smem + st * kTileBytes;
    const std::uint32_t vd = vdesc0 + st * (kTileBytes >> 4);
    arch::fence_regs(acc);
    arch::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      // k-step kk: keys 16 kk.. (two groups of 8), the halves kKvHalfBytes apart
      const std::uint64_t desc =
          kDescPre ? arch::desc_join(vd + kk * ((2 * kGroupBytes) >> 4), kDescHi)
                   : arch::wgmma_desc(vb + kk * 2 * kGroupBytes, kKvHalfBytes, kGroupBytes);
      if constexpr (D == 64)
        Wg::mma_o64<1>(acc, pf[kk], desc);
      else if constexpr (D == 128)
        Wg::mma_o128<1>(acc, pf[kk], desc);
      else
        Wg::mma_o256<1>(acc, pf[kk], desc);
    }
    arch::wgmma_commit();
  }

  /// The softmax step with the fast exponent (kWsFastExp, kWsFlatStats): both rows' maxima first
  /// (independent chains), then both rows' factors, no branches; a probability is
  /// `2^{fma(s, sc, -m)}` on `ex2.approx.ftz`. Sets `moved` when some row's max moved.
  __device__ __forceinline__ void softmax_flat(int jb, bool masked, bool& moved) {
    if (masked) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& sv = s[n][2 * rr + e];
            sv = jb + n * 8 + e < limit[rr] ? sv : math::neg_inf();
          }
    }
    float bmax[2];
    flat_block_max<BN>(s, bmax);
    float nm[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      alpha[rr] = flat_rescale(os[rr], bmax[rr] * sc, nm[rr]);
      moved |= alpha[rr] != 1.f;
    }
    flat_probs<BN, true>(s, os, nm, sc);
  }

  /// The softmax step on the core's accumulator (`math::OnlineSoftmax::rescale`) and `exp2f`.
  /// Sets `moved` when some row's max moved.
  __device__ __forceinline__ void softmax_exact(int jb, bool masked, bool& moved) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float bmax = math::neg_inf();
      if (masked) {
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& sv = s[n][2 * rr + e];
            sv = jb + n * 8 + e < limit[rr] ? sv * sc : math::neg_inf();
            bmax = fmaxf(bmax, sv);
          }
      } else {
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& sv = s[n][2 * rr + e];
            sv *= sc;
            bmax = fmaxf(bmax, sv);
          }
      }
      // (a NaN score is left out of the max but its probability is NaN: the row ends NaN)
      bmax = butterfly_reduce<1, 2>(bmax, math::nan_max);
      alpha[rr] = os[rr].rescale(bmax);
      moved |= alpha[rr] != 1.f;
      // OnlineSoftmax::prob: 2^{s - m}, and 0 for -inf scores, also while m is still -inf
      const float m = os[rr].m == math::neg_inf() ? 0.f : os[rr].m;
      float psum = 0.f;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& sv = s[n][2 * rr + e];
          sv = exp2f(sv - m);
          psum += sv;
        }
      os[rr].add(psum);
    }
  }

  /// The variant instance's scores of the tile whose keys start at `jb` (this thread's first):
  /// the soft cap `cap · tanh(dot · scale / cap)` in base 2 (the softmax then scales by 1), and
  /// -inf before each row's window start. Each is one branch around its loop over the tile (the
  /// cap is the same for every score, and a tile wholly inside both rows' windows masks nothing),
  /// not a test per score.
  __device__ __forceinline__ void apply_variant(int jb) {
    if (var.cap_out != 0.f) {
#pragma unroll
      for (int n = 0; n < BN / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[n][i] = var.capped(s[n][i]);
    }
    if (jb < max(var.lo[0], var.lo[1])) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr)
#pragma unroll
        for (int n = 0; n < BN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            if (jb + n * 8 + e < var.lo[rr]) s[n][2 * rr + e] = math::neg_inf();
    }
  }

  /// Scale, mask, online softmax of tile kt in `s` (scores → unnormalised probabilities);
  /// returns whether some row of the warp moved its max (the accumulator then needs `alpha`).
  __device__ __forceinline__ bool softmax(int kt) {
    const int t0 = lb.kv_begin + kt * BN;
    const int jb = t0 + 2 * (lane & 3);
    const bool masked = t0 + BN > limit_min;
    if constexpr (Tile::kVariant) apply_variant(jb);
    bool moved = false;
    if constexpr (kFlat)
      softmax_flat(jb, masked, moved);
    else
      softmax_exact(jb, masked, moved);
    return __any_sync(0xffffffffu, moved) != 0;
  }

  /// O *= alpha (both rows).
  __device__ __forceinline__ void rescale_acc() {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }
  }

  /// The tile loop over the split's `lb.n_tiles` (> 0) tiles; with `pp` the two warpgroups
  /// issue their products in strict turns (named barriers 3 and 4).
  __device__ __forceinline__ void run(bool pp) {
    const int n_tiles = lb.n_tiles;
    if (pp && wg == 1) arch::named_arrive(3, 2 * 128);  // warpgroup 0 goes first
    // tile 0: S, softmax (the accumulator is still 0: no rescale)
    arch::mbar_wait(sm.full0, 0);
    issue_s(0);
    arch::wgmma_wait<0>();
    arch::fence_regs(s);
    softmax(0);
    pack_p<T, BN>(s, pf);
    bool resc = false;
    int st = 0, ph = 0;  // stage and phase of tile kt
    for (int kt = 1; kt < n_tiles; ++kt) {
      int stp;
      if constexpr (kDescPre) {
        stp = st;
        if (++st == kStages) {
          st = 0;
          ph ^= 1;
        }
      } else {
        st = kt % kStages;
        stp = (kt - 1) % kStages;
        ph = (kt / kStages) & 1;
      }
      arch::mbar_wait(sm.full0 + 8 * st, ph);
      if (pp) arch::named_sync(3 + wg, 2 * 128);
      issue_s(st);                        // S_t = Q K_tᵀ
      if (!kLate && resc) rescale_acc();  // O *= alpha_{t-1}
      issue_pv(stp);                      // O += P_{t-1} V_{t-1}
      // the other warpgroup's turn (warpgroup 1 gives no turn after its last products, so
      // every arrival is matched by a wait)
      if (pp && !(wg == 1 && kt == n_tiles - 1)) arch::named_arrive(3 + (wg ^ 1), 2 * 128);
      arch::wgmma_wait<1>();  // S_t is done (PV still runs)
      arch::fence_regs(s);
      resc = softmax(kt);
      arch::fence_regs(s);    // (ptxas still hoists the wait to where P packing may start)
      arch::wgmma_wait<0>();  // PV_{t-1} is done: stage t-1 is free, P may be overwritten
      arch::fence_regs(acc);
      if (lane == 0) arch::mbar_arrive(sm.empty0 + 8 * stp);
      if (kLate && resc) rescale_acc();  // O *= alpha_t
      pack_p<T, BN>(s, pf);
    }
    const int stl = (n_tiles - 1) % kStages;
    if (!kLate && resc) rescale_acc();
    issue_pv(stl);
    arch::wgmma_wait<0>();
    arch::fence_regs(acc);
    if (lane == 0) arch::mbar_arrive(sm.empty0 + 8 * stl);
  }

  /// The rows' full sums across the quad; a NaN score whose row saw no other score makes the
  /// state NaN, not empty.
  __device__ __forceinline__ void finish() {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      float l = os[rr].l;
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      os[rr].l = l;
      if (os[rr].m == math::neg_inf() && l != l) os[rr].m = l;
    }
  }
};

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
