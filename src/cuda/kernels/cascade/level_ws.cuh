/// @file kernels/cascade/level_ws.cuh
/// @brief The warp-specialised cascade level kernel (sm_90a; bf16 or f16; head_dim 64, 128 or 256;
///        16-bit or fp8 K/V): the work and
///        the results of level_wgmma.cuh (one CTA = a tile of stacked query rows × one KV
///        split of a segment, online softmax in fp32, the partial state to the workspace), laid
///        out as a FlashAttention-3 style pipeline. One producer warp fills a ring of K/V stages
///        with bulk tensor copies (TMA, completing on the stage's "full" mbarrier: one box per
///        page granule holding both halves of head_dim for its keys, or one per run of
///        consecutive pages; the tile laid out in groups of 8 keys, `tile::kv_tile_offset`, so
///        that a box is one contiguous piece of it); one or two consumer warpgroups of 64 rows each
///        wait on "full", issue `QKᵀ` of tile t and `PV` of tile t-1 back to back (`wgmma`, queries
///        and probabilities from registers; at head_dim 256 the queries from shared memory), run
///        the softmax of tile t while `PV` runs on the tensor cores, and release the stage on its
///        "empty" mbarrier; with two warpgroups one's softmax overlaps the other's matrix products
///        (optionally in strict turns through named barriers, `ws_pingpong`). No block-wide barrier
///        in the main loop.
///
///        Numerics as everywhere in the library: fp32 scores and accumulators, max-subtracted
///        base-2 online softmax (`math::OnlineSoftmax`), the accumulator rescaled between two
///        tiles' `PV` exactly as in the sequential loop (`kWsRescaleLate`: after the previous
///        `PV` completed, the same operations in the same order), probabilities rounded to bf16
///        as the `PV` operand. With `kWsFastExp` (the 128-key tiles) a probability is one FFMA
///        and one `ex2.approx.ftz`, `2^{fma(s, |scale|, -m)}` on the raw score `s` (the running
///        max `m` is the scaled max of the raw scores; masked keys -inf give 0, a row still at
///        -inf gives 0, NaN scores make the row NaN); a negative scale negates the queries
///        instead (exact in bf16). With `kWsFlatStats` the row max and the rescale factor take
///        no branch (`max.NaN`, the factor `2^{m_old - m_new}` on `ex2.approx.ftz`: 0 from an
///        empty row, 1 while nothing was seen). The last, partial tile of a split is copied with
///        `cp.async` and its keys past the end zero-filled, so nothing past a segment's length is
///        ever read as a factor.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/wgmma.cuh"
#include "cuda/kernels/cascade/level_wgmma.cuh"
#include "cuda/tile/cascade_ws_consumer.cuh"
#include "cuda/tile/cascade_ws_ring.cuh"
#include "cuda/tile/fp8_kv.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// The tensor maps of a pool's K and V, seen as 5-D tensors whose boxes land in shared memory in
/// the layout of a KV tile (`tile::kv_tile_offset`): groups of 8 keys, each both 64-wide halves of
/// head_dim × 8 keys, 128-byte swizzled. Dims (innermost first, `CascadeLevelParams::tma_coords`):
/// 0 (NHD) `(64 of head_dim, 8 slots, KV head · 2 + half, slot / 8, page)`; 1 (unpadded HND)
/// `(64, 8 slots, half, slot / 8, page · heads_kv + KV head)`; 2 (padded HND) `(64, slot, half,
/// KV head, page)`. A box holds `tma_box` keys of one page and both halves.
struct CascadeTmaMaps {
  CUtensorMap k;  ///< K pool.
  CUtensorMap v;  ///< V pool.
  /// K pool, boxes of `CascadeLevelParams::tma_run` keys (consecutive whole pages: the page dim
  /// of the box is `tma_run / tma_box`), for granules whose pages are consecutive in the pool.
  CUtensorMap k_run;
  CUtensorMap v_run;  ///< V pool, boxes of `tma_run` keys (as `k_run`).
};

/// Options of the warp-specialised kernel (bit flags, the `Opt` of `CascadeWsTile`).
enum CascadeWsOpt : int {
  /// Probabilities as `2^{fma(s, |scale|, -m)}` on `ex2.approx.ftz` (one FFMA and one MUFU per
  /// score instead of a scale, a subtraction and the subnormal-safe `exp2f`); a negative scale
  /// runs as its magnitude on negated queries (exact in bf16).
  kWsFastExp = 1,
  /// wgmma descriptors from one base per ring stage plus constant offsets per k-step (shared
  /// addresses are below 2^18, so the 14-bit address field never carries into the next field).
  kWsDescPre = 2,
  /// Row max and rescale factor without branches (`max.NaN`; the factor on `ex2.approx.ftz`);
  /// required with kWsFastExp.
  kWsFlatStats = 4,
  /// The accumulator is rescaled after the previous `PV` completed instead of before issuing
  /// it (the same operations in the same order on the accumulator).
  kWsRescaleLate = 8,
  /// Diagnostic only, wrong results (instantiated by probe builds, ATTNSTATE_CASCADE_WS_PROBE):
  /// after the first ring's worth of tiles the producer copies nothing and only signals the
  /// stages (the consumers re-read stale tiles), to time the pipeline without the copies.
  kWsDiagNoCopy = 16,
  /// f16 operands (else bf16): the same copies and products on the other 16-bit type.
  kWsF16 = 32,
  /// The variant instance: the soft cap `p.soft_cap` on the scores (then in base 2, the fast
  /// exponent's scale 1) and the window `p.window_left` (`tile::level_variant`).
  kWsVariant = 64,
  /// K/V stored as fp8 e4m3 (else the operands' 16-bit type): the copies land in a ring of fp8
  /// stages, and the producer warpgroup converts each into the 16-bit stage the consumers read.
  kWsE4M3 = 128,
  kWsE5M2 = 256,  ///< K/V stored as fp8 e5m2 (as kWsE4M3).
};

/// Tile configuration: `NWG` consumer warpgroups of 64 rows, `BN` keys per KV tile, `Stages`
/// K/V stages in the ring, the options `Opt` (`CascadeWsOpt` flags: among them the operand type
/// and the variant instance); head_dim `D` (64, 128 or 256: at 256 the queries stay in shared
/// memory, `kQSmem`, since their fragments do not fit in registers beside the accumulator).
template <int NWG_, int BN_, int Stages_, int Opt_ = 0, int D_ = 128>
struct CascadeWsTile {
  static constexpr int D = D_;
  /// `S = Q Kᵀ` reads the queries from shared memory (wgmma with both operands from shared
  /// memory) instead of register fragments: at head_dim 256, and in the variant and fp8 instances
  /// of two warpgroups on 128-key tiles at head_dim 128 (whose fragments spill beside the scores
  /// of 128 keys, or in the registers the fp8 producers keep).
  static constexpr bool kQSmem = D > 128 || (((Opt_ & (kWsVariant | kWsE4M3 | kWsE5M2)) != 0) &&
                                             NWG_ == 2 && BN_ == 128 && D == 128);
  /// k-steps of the query fragments held in registers (1, unused, with kQSmem).
  static constexpr int kQFragSteps = kQSmem ? 1 : D / 16;
  /// The 16-bit operand type (kWsF16).
  using T = std::conditional_t<(Opt_ & kWsF16) != 0, __half, __nv_bfloat16>;
  static constexpr bool kVariant = (Opt_ & kWsVariant) != 0;  ///< Option kWsVariant.
  /// The KV loader policy (`tile::Fp8Kv`): the operands' type, or fp8 (kWsE4M3, kWsE5M2).
  static constexpr int kKv = (Opt_ & kWsE4M3) != 0   ? tile::kKvE4M3
                             : (Opt_ & kWsE5M2) != 0 ? tile::kKvE5M2
                                                     : tile::kKvSame;
  static constexpr bool kFp8 = kKv != tile::kKvSame;
  /// An element of the pools and of the stages the copies fill.
  using KvStore = std::conditional_t<kFp8, unsigned char, T>;
  static constexpr int NWG = NWG_;
  static constexpr int BM = 64 * NWG;  ///< Query rows per CTA.
  static constexpr int BN = BN_;       ///< Keys per KV tile.
  static constexpr int kStages = Stages_;
  static constexpr int kOpt = Opt_;                                   ///< The option flags.
  static constexpr bool kFastExp = (Opt_ & kWsFastExp) != 0;          ///< Option kWsFastExp.
  static constexpr bool kDescPre = (Opt_ & kWsDescPre) != 0;          ///< Option kWsDescPre.
  static constexpr bool kRescaleLate = (Opt_ & kWsRescaleLate) != 0;  ///< Option kWsRescaleLate.
  static constexpr bool kDiagNoCopy = (Opt_ & kWsDiagNoCopy) != 0;    ///< Option kWsDiagNoCopy.
  static constexpr int kConsumers = 128 * NWG;
  /// + one producer warpgroup (one warp copies; its registers go to the consumers).
  static constexpr int kThreads = kConsumers + 128;
  /// Registers per thread after `setmaxnreg`: the launch gives every thread
  /// 65536 / kThreads (rounded down to 8); the producer warpgroup drops to kProducerRegs and the
  /// consumers take the rest.
  static constexpr int kProducerRegs = kFp8 ? 96 : 56;  // (fp8: the producer warps convert)
  /// fp8: 16-byte chunks of K and of V a converting thread holds at once (on 128-key tiles
  /// fewer than the tile's 8: ptxas spills otherwise).
  static constexpr int kConvertBatch = BN == 128 ? 2 : 4;
  static constexpr int kConsumerRegs =
      ((65536 / kThreads / 8 * 8 * kThreads - 128 * kProducerRegs) / kConsumers) / 8 * 8 > 240
          ? 240
          : ((65536 / kThreads / 8 * 8 * kThreads - 128 * kProducerRegs) / kConsumers) / 8 * 8;
  static constexpr int kTileBytes = BN * D * 2;  ///< One K (or V) tile in shared memory.
  /// One K (or V) tile as stored (the fp8 stages).
  static constexpr int kStoredTileBytes = BN * D * static_cast<int>(sizeof(KvStore));
  /// fp8: the stages of stored K/V tiles (as many as the shared memory holds beside the 16-bit
  /// ring, at most 4); else 0.
  static constexpr int kFp8Stages =
      !kFp8 ? 0
            : ((232448 - 1024 - BM * D * 2 - 2 * kStages * kTileBytes - 2 * kStages * 8) /
                           (2 * kStoredTileBytes + 16) >
                       4
                   ? 4
                   : (232448 - 1024 - BM * D * 2 - 2 * kStages * kTileBytes - 2 * kStages * 8) /
                         (2 * kStoredTileBytes + 16));
  /// Dynamic shared memory: 1 KiB of alignment slack, Q, the K and V rings, the fp8 rings, the
  /// mbarriers.
  static constexpr int smem_bytes() {
    return 1024 + BM * D * 2 + 2 * kStages * kTileBytes + 2 * kFp8Stages * kStoredTileBytes +
           2 * kStages * 8 + 2 * kFp8Stages * 8;
  }
  static_assert(BN == 64 || BN == 128, "KV tile of 64 or 128 keys");
  static_assert(NWG == 1 || NWG == 2, "one or two consumer warpgroups");
  static_assert(D == 64 || D == 128 || D == 256,
                "head_dim 64, 128 or 256 (64-wide parts of 128-byte rows)");
  static_assert(D <= 128 || (!kFp8 && BN == 64), "head_dim 256: 16-bit K/V tiles of 64 keys");
  static_assert(!kFp8 || kFp8Stages >= 2, "fp8: two stored stages beside the 16-bit ring");
  static_assert(smem_bytes() <= 232448, "the shared memory of one sm_90 CTA");
  static_assert(!kFastExp || (Opt_ & kWsFlatStats) != 0,
                "the fast exponent runs with the branch-free row statistics");
};

/// The body of both kernels below: `k_scale`, `v_scale` are an fp8 pool's dequantisation scales
/// (`Tile::kFp8`; K's joins the score scale, V's multiplies the accumulator once).
template <class Tile>
__device__ __forceinline__ void cascade_level_ws_body(
    const CascadeLevelParams& p, const CUtensorMap* tm_k, const CUtensorMap* tm_v,
    const CUtensorMap* tm_k_run, const CUtensorMap* tm_v_run, const KvScale& k_scale,
    const KvScale& v_scale) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = Tile::D, BM = Tile::BM, BN = Tile::BN, NWG = Tile::NWG;

  extern __shared__ unsigned char smem_raw[];
  const tile::WsSmem<Tile> sm(smem_raw);

  const tile::PdlScope pdl;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h_kv = blockIdx.y;
  tile::LevelBlock lb;
  if (!lb.locate(p, BM, BN)) return;
  tile::VariantScores var;  // (the kWsVariant instance only)
  if constexpr (Tile::kVariant) {
    // every thread, the producer warpgroup with the last consumer warp's rows
    const int rw = warp < 4 * NWG ? warp : 4 * NWG - 1;
    if (!tile::level_variant(p, lb, rw * 16, lane, BN, var)) return;
  }

  if (tid == 0) sm.init_barriers();
  if (tid < Tile::kConsumers) tile::ws_load_q<Tile>(p, lb, h_kv, sm.q_smem, tid);
  __syncthreads();  // the mbarriers are initialised

  if (warp >= 4 * NWG) {
    // ================= producer warpgroup: one warp fills the K/V ring =================
    if constexpr (NWG == 2) arch::setmaxnreg_dec<Tile::kProducerRegs>();
    if constexpr (Tile::kFp8) {
      // every warp of the group converts; its first also copies
      if (lb.n_tiles == 0) return;
      const tile::WsProducer<Tile> producer(p, lb, h_kv, lane, tm_k, tm_v, tm_k_run, tm_v_run);
      producer.run_fp8(sm, warp - 4 * NWG);
    } else {
      if (warp != 4 * NWG || lb.n_tiles == 0) return;
      const tile::WsProducer<Tile> producer(p, lb, h_kv, lane, tm_k, tm_v, tm_k_run, tm_v_run);
      producer.run(sm);
    }
    return;
  }

  // ================= consumer warpgroups =================
  if constexpr (NWG == 2) arch::setmaxnreg_inc<Tile::kConsumerRegs>();
  const int wg = warp >> 2, wl = warp & 3;
  // with the fast exponent, and in the variant instance, a negative scale runs as |scale| on
  // negated queries (exact; the window's -inf scores stay -inf when scaled); capped scores are
  // already base 2 (`WsConsumer::apply_variant`): scale 1
  constexpr bool kAbsScale = Tile::kFastExp || Tile::kVariant;
  const bool capped = Tile::kVariant && p.soft_cap != 0.f;
  // fp8: K's scale joins the score scale (and the variant's map)
  const float s2_scale = tile::level_score_scale<Tile::kFp8, Tile::kVariant>(p, k_scale, h_kv, var);
  const bool negate_q = kAbsScale && !capped && s2_scale < 0.f;
  const float sc = capped ? 1.f : kAbsScale ? fabsf(s2_scale) : s2_scale;
  std::uint32_t qf[Tile::kQFragSteps][4];
  int limit[2];
  tile::ws_consumer_rows<Tile>(p, lb, sm.q_smem, wg, wl, lane, negate_q, qf, limit);
  const int limit_min = min(limit[0], limit[1]);

  float acc[D / 8][4];
  tile::zero_frags(acc);
  math::OnlineSoftmax os[2];
  float alpha[2] = {1.f, 1.f};
  float s[BN / 8][4];
  std::uint32_t pf[BN / 16][4];
  tile::WsConsumer<Tile> c{p,         lb,  sm, lane,  wg, sc, qf, limit,
                           limit_min, acc, os, alpha, s,  pf, var};
  // ping-pong: warpgroup w issues its products after barrier 3 + w, then lets the other go
  if (lb.n_tiles > 0) c.run(NWG == 2 && p.ws_pingpong != 0 && lb.n_tiles >= 2);
  c.finish();
  if constexpr (Tile::kFp8) tile::scale_frags(acc, v_scale.at(h_kv));  // V's scale

  // partial state → workspace slot (slot_offset + split); later slots of this segment are empty
  lb.store_partial<D>(p, h_kv, wg * 64 + wl * 16, acc, os);
#elif defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the plan never picks it (DeviceFacts::wgmma())
#endif
}

/// One CTA: (segment, row tile, split) from `blockIdx.x`, KV head `blockIdx.y`. Threads: the
/// consumer warpgroups first, the producer warpgroup last (with two consumer warpgroups the
/// registers move from the producer to the consumers with `setmaxnreg`).
template <class Tile>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    cascade_level_ws_kernel(const CascadeLevelParams p, const __grid_constant__ CUtensorMap tm_k,
                            const __grid_constant__ CUtensorMap tm_v,
                            const __grid_constant__ CUtensorMap tm_k_run,
                            const __grid_constant__ CUtensorMap tm_v_run) {
  static_assert(!Tile::kFp8, "16-bit K/V (fp8: cascade_level_ws_fp8_kernel)");
  cascade_level_ws_body<Tile>(p, &tm_k, &tm_v, &tm_k_run, &tm_v_run, KvScale{}, KvScale{});
}

/// The warp-specialised level kernel over an fp8 pool (`Tile::kFp8`) with its dequantisation
/// scales; the tensor maps are the pool's byte maps (`CascadeTmaMaps`).
template <class Tile>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    cascade_level_ws_fp8_kernel(const CascadeLevelParams p,
                                const __grid_constant__ CUtensorMap tm_k,
                                const __grid_constant__ CUtensorMap tm_v,
                                const __grid_constant__ CUtensorMap tm_k_run,
                                const __grid_constant__ CUtensorMap tm_v_run, const KvScale k_scale,
                                const KvScale v_scale) {
  static_assert(Tile::kFp8, "an fp8 loader policy");
  cascade_level_ws_body<Tile>(p, &tm_k, &tm_v, &tm_k_run, &tm_v_run, k_scale, v_scale);
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
