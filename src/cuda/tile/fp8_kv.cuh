/// @file tile/fp8_kv.cuh
/// @brief The decode's 16-key attention tile over fp8 K/V (e4m3, e5m2) in shared memory, on
///        f16 tensor cores, with no conversion pass through shared memory: each fp8 pair becomes
///        an f16 pair in registers (`cvt.rn.f16x2.e4m3x2` / `e5m2x2`) on the way to the MMA.
///
/// The stage holds the fp8 rows as they are in the pool (16-byte chunk `c` of row `r` at
/// `c ^ (r & 7)`), and the fragments come from 16-bit `ldmatrix` over those bytes:
/// - K (B of `S = Q Kᵀ`): a plain `ldmatrix` gives lane `l` four consecutive fp8 of one key,
///   head-dim elements `4 (l % 4) .. + 3` of its 16; as f16 they are the B registers of
///   k-slots `2 (l % 4), + 1` and `2 (l % 4) + 8, + 9`. The dot product is a sum over the head
///   dim, so the query rows hold the same permutation of their columns (`permute_q_columns`).
/// - V (B of `O += P V`): a transposed `ldmatrix` gives lane `l` the fp8 pairs of two keys at
///   head-dim elements `2 (l / 4), + 1`; a byte permute pairs the keys, so n-tile `2g` of the
///   output holds the even head-dim elements of chunk `g` and n-tile `2g + 1` the odd ones: lane
///   `l`'s accumulators of both are elements `16 g + 4 (l % 4) .. + 3`, stored as one float4
///   (`store_warp_state_fp8`).
/// The dequantisation scales are not applied per element: K's scale joins the score scale and
/// V's multiplies the accumulators once. Conversions are exact (every e4m3 and e5m2 value is an
/// f16), so the products are those of the dequantised cache up to the scales' rounding.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/convert.cuh"
#include "cuda/arch/mma.cuh"
#include "cuda/tile/attention_tile.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace tile {

/// fp8 formats of a KV cache as the decode kernels' template argument.
enum Fp8Kv : int {
  kKvSame = 0,  ///< K/V of the queries' 16-bit dtype.
  kKvE4M3 = 1,
  kKvE5M2 = 2,
};

/// The KV loader policy (`Fp8Kv`) of a catalog row's K/V dtype.
constexpr int kv_policy(DType kv) {
  return kv == DType::kE4M3 ? kKvE4M3 : kv == DType::kE5M2 ? kKvE5M2 : kKvSame;
}

/// Two fp8 values (the low and high byte of `x`) as an f16x2 register, low byte in the low half.
template <int kKv>
__device__ __forceinline__ std::uint32_t fp8x2_to_f16x2(std::uint32_t x) {
  static_assert(kKv == kKvE4M3 || kKv == kKvE5M2, "an fp8 format");
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xFFFFu),
                                                   kKv == kKvE4M3 ? __NV_E4M3 : __NV_E5M2);
  return static_cast<std::uint32_t>(h.x) | (static_cast<std::uint32_t>(h.y) << 16);
}

/// The byte offset, in a K or V stage of fp8 rows of `D` bytes, of this lane's `ldmatrix` row
/// for the chunk pair `2j, 2j + 1`: lanes 0-7 keys 0-7 of chunk 2j, 8-15 keys 8-15 of chunk 2j,
/// 16-23 keys 0-7 of chunk 2j + 1, 24-31 keys 8-15 of chunk 2j + 1.
template <int D>
__device__ __forceinline__ std::uint32_t fp8_lane_offset(int lane, int j) {
  const int row = (((lane >> 3) & 1) << 3) + (lane & 7);
  const int chunk = (2 * j + (lane >> 4)) ^ (lane & 7);
  return static_cast<std::uint32_t>(row * D + chunk * 16);
}

/// Permutes the f16 query chunk `own` (8 columns, `col` = its chunk index in the row) within its
/// pair of chunks (16 columns), with the partner lane `lane ^ 1` holding the other chunk of the
/// pair: slot `s` of the pair takes column `4 (s / 2) + s % 2` for `s < 8` and
/// `4 ((s - 8) / 2) + 2 + s % 2` after, the order `attention_tile_fp8` reads K in. Every lane of
/// the warp must call this.
__device__ __forceinline__ uint4 permute_q_columns(uint4 own, int col) {
  const bool odd = (col & 1) != 0;
  // the even chunk needs the odd one's words 0 and 2, the odd chunk the even one's 1 and 3
  const std::uint32_t send0 = odd ? own.x : own.y;
  const std::uint32_t send1 = odd ? own.z : own.w;
  const std::uint32_t got0 = __shfl_xor_sync(0xffffffffu, send0, 1);
  const std::uint32_t got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
  return odd ? make_uint4(got0, got1, own.y, own.w) : make_uint4(own.x, own.z, got0, got1);
}

/// The bf16 pairs `w` (`N` registers of one query row, the rest of the row in the `kLanes`
/// lanes `lane ^ o`, `kFirst <= o < kFirst · kLanes`) as f16 pairs, scaled by the power of two
/// `2^k` that brings the row's largest magnitude to [2^14, 2^15) (see `queries_to_f16`); returns
/// `2^k`. Every lane of the warp must call this.
template <int N, int kFirst, int kLanes>
__device__ __forceinline__ float bf16_rows_to_f16(std::uint32_t (&w)[N]) {
  std::uint32_t mx = 0;  // largest magnitude of the row as bf16 bits (ordered like the values)
#pragma unroll
  for (int i = 0; i < N; ++i) mx = max(mx, max(w[i] & 0x7FFFu, (w[i] >> 16) & 0x7FFFu));
#pragma unroll
  for (int o = kFirst; o < kFirst * kLanes; o <<= 1)
    mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const int e = static_cast<int>(mx >> 7);  // biased exponent of the largest magnitude
  int k = mx == 0 ? 0 : 141 - e;            // 2^(e - 127) · 2^k = 2^14
  k = k < -110 ? -110 : (k > 110 ? 110 : k);
  const float f = __int_as_float((127 + k) << 23);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float lo = __uint_as_float(w[i] << 16) * f;
    const float hi = __uint_as_float(w[i] & 0xFFFF0000u) * f;
    w[i] = arch::Mma16816<__half>::pack(lo, hi);
  }
  return f;
}

/// The query chunk `q` (8 columns of a row whose `kCpr` chunks sit in `kCpr` consecutive lanes,
/// aligned; every lane of the warp calls this) as f16 for the f16 MMAs over fp8 K/V. bf16 rows
/// (`kBF16`) are multiplied by the power of two `2^k` that brings the row's largest magnitude to
/// [2^14, 2^15), exactly (bf16 values are f16 values inside the f16 range, and the scaled row
/// keeps every element within 2^-28 of its largest one); `2^k` is returned, for the score
/// factor to undo. An f16 row stays as it is (1 is returned). NaN and inf stay what they are.
template <bool kBF16, int kCpr>
__device__ __forceinline__ float queries_to_f16(uint4& q) {
  if constexpr (!kBF16) {
    return 1.f;
  } else {
    std::uint32_t w[4] = {q.x, q.y, q.z, q.w};
    const float f = bf16_rows_to_f16<4, 1, kCpr>(w);
    q = make_uint4(w[0], w[1], w[2], w[3]);
    return f;
  }
}

/// One 16-key tile of a warp over fp8 K/V (first key `t0`): as `attention_tile` (same softmax
/// step, same key order of the score fragments), the K and V fragments converted from the fp8
/// stages at `k_stage` / `v_stage` (shared-memory byte addresses of the stages) and f16 MMAs;
/// `q_frag(kk, a)` gives the permuted query fragments of k-step `kk`; `o_acc` in the fp8 column
/// order (see the file comment).
template <int D, int kKv, class QFrag, class Scores>
__device__ __forceinline__ void attention_tile_fp8(QFrag&& q_frag, std::uint32_t k_stage,
                                                   std::uint32_t v_stage, int t0,
                                                   const int (&lim)[2], float s2_scale,
                                                   math::OnlineSoftmax (&os)[2],
                                                   float (&o_acc)[D / 8][4], const Scores& scores) {
  using Mma = arch::Mma16816<__half>;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
  for (int j = 0; j < D / 32; ++j) {
    std::uint32_t r[4];
    arch::ldmatrix_x4(r, k_stage + fp8_lane_offset<D>(lane, j));
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // k-step 2j + h: r[2h] keys 0-7, r[2h + 1] keys 8-15
      std::uint32_t a[4];
      q_frag(2 * j + h, a);
      Mma::mma(sc[0], a, fp8x2_to_f16x2<kKv>(r[2 * h]), fp8x2_to_f16x2<kKv>(r[2 * h] >> 16));
      Mma::mma(sc[1], a, fp8x2_to_f16x2<kKv>(r[2 * h + 1]),
               fp8x2_to_f16x2<kKv>(r[2 * h + 1] >> 16));
    }
  }

  float pr[2][4];
  online_softmax_step<16, D, Base2MaxNanInsn>(sc, pr, o_acc, os, lim, t0, s2_scale, lane, scores);

  std::uint32_t pa[4];
  p_operand<false>(pr, pa);  // f16 probabilities
#pragma unroll
  for (int j = 0; j < D / 32; ++j) {
    std::uint32_t r[4];
    arch::ldmatrix_x4_trans(r, v_stage + fp8_lane_offset<D>(lane, j));
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // chunk g = 2j + h: r[2h] keys 0-7, r[2h + 1] keys 8-15
      const int g = 2 * j + h;
      // bytes (key 2c, key 2c + 1) of the even and of the odd element, keys 0-7 then 8-15
      const std::uint32_t even = __byte_perm(r[2 * h], r[2 * h + 1], 0x6420);
      const std::uint32_t odd = __byte_perm(r[2 * h], r[2 * h + 1], 0x7531);
      Mma::mma(o_acc[2 * g], pa, fp8x2_to_f16x2<kKv>(even), fp8x2_to_f16x2<kKv>(even >> 16));
      Mma::mma(o_acc[2 * g + 1], pa, fp8x2_to_f16x2<kKv>(odd), fp8x2_to_f16x2<kKv>(odd >> 16));
    }
  }
}

/// Two 16-key tiles of a warp over fp8 K/V in one step (first keys `t0[0]`, `t0[1]`; K and V
/// stages at `k_stage[i]` / `v_stage[i]`): as `attention_tile_fp8` for each, with the work of
/// both side by side so that their chains overlap — each k-step's query fragment serves both
/// tiles' score MMAs (four independent accumulator chains), one online-softmax step over the 32
/// keys (`online_softmax_runs`), and each output n-tile takes both tiles' `P V` MMAs. The score
/// of every key is the same sum as `attention_tile_fp8` forms; only the softmax's running max
/// moves once per 32 keys instead of per 16 (rounding only). Each fp8 quadruple converts with no
/// shift of its upper pair (`arch::fp8x4_to_f16x2x2`), and the block maxima take no branch
/// (`Base2MaxNanInsn`: the same values).
template <int D, int kKv, class QFrag, class Scores>
__device__ __forceinline__ void attention_pair_fp8(QFrag&& q_frag,
                                                   const std::uint32_t (&k_stage)[2],
                                                   const std::uint32_t (&v_stage)[2],
                                                   const int (&t0)[2], const int (&lim)[2],
                                                   float s2_scale, math::OnlineSoftmax (&os)[2],
                                                   float (&o_acc)[D / 8][4], const Scores& scores) {
  using Mma = arch::Mma16816<__half>;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  float sc[4][4];  // n-tiles 2i, 2i + 1: tile i's keys 0-7 and 8-15
#pragma unroll
  for (int n = 0; n < 4; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
  for (int j = 0; j < D / 32; ++j) {
    std::uint32_t r[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) arch::ldmatrix_x4(r[i], k_stage[i] + fp8_lane_offset<D>(lane, j));
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // k-step 2j + h
      std::uint32_t a[4];
      q_frag(2 * j + h, a);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        std::uint32_t b[4];
        arch::fp8x4_to_f16x2x2<kKv == kKvE4M3>(r[i][2 * h], b[0], b[1]);
        arch::fp8x4_to_f16x2x2<kKv == kKvE4M3>(r[i][2 * h + 1], b[2], b[3]);
        Mma::mma(sc[2 * i], a, b[0], b[1]);
        Mma::mma(sc[2 * i + 1], a, b[2], b[3]);
      }
    }
  }

  float pr[4][4];
  // the block maxima without branches: 16 scores a row per step (`Base2MaxNanInsn`)
  online_softmax_runs<32, D, 16, Base2MaxNanInsn>(sc, pr, o_acc, os, lim, t0, s2_scale, lane,
                                                  scores);

  std::uint32_t pa[2][4];  // f16 probabilities of each tile
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    pa[i][0] = Mma::pack(pr[2 * i][0], pr[2 * i][1]);
    pa[i][1] = Mma::pack(pr[2 * i][2], pr[2 * i][3]);
    pa[i][2] = Mma::pack(pr[2 * i + 1][0], pr[2 * i + 1][1]);
    pa[i][3] = Mma::pack(pr[2 * i + 1][2], pr[2 * i + 1][3]);
  }
#pragma unroll
  for (int j = 0; j < D / 32; ++j) {
    std::uint32_t r[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
      arch::ldmatrix_x4_trans(r[i], v_stage[i] + fp8_lane_offset<D>(lane, j));
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // chunk g = 2j + h, as in `attention_tile_fp8`
      const int g = 2 * j + h;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        std::uint32_t b[4];
        arch::fp8x4_to_f16x2x2<kKv == kKvE4M3>(__byte_perm(r[i][2 * h], r[i][2 * h + 1], 0x6420),
                                               b[0], b[1]);
        arch::fp8x4_to_f16x2x2<kKv == kKvE4M3>(__byte_perm(r[i][2 * h], r[i][2 * h + 1], 0x7531),
                                               b[2], b[3]);
        Mma::mma(o_acc[2 * g], pa[i], b[0], b[1]);
        Mma::mma(o_acc[2 * g + 1], pa[i], b[2], b[3]);
      }
    }
  }
}

/// As `store_warp_state` (tile/partial_state.cuh) for accumulators in the fp8 column order:
/// lane `l` holds elements `16 g + 4 (l % 4) .. + 3` of chunk `g` in n-tiles `2g` (even
/// elements) and `2g + 1` (odd ones), multiplied by `v_scale` on the way.
template <int D, int kOw>
__device__ __forceinline__ void store_warp_state_fp8(float* ow, float* mw, float* lw, int warp,
                                                     int lane, const float (&o_acc)[D / 8][4],
                                                     const math::OnlineSoftmax (&os)[2],
                                                     float v_scale) {
  constexpr int kRows = 16;
  float* mine = ow + warp * kRows * kOw;
  const int r = lane >> 2;
#pragma unroll
  for (int g = 0; g < D / 16; ++g) {
    const int d = 16 * g + 4 * (lane & 3);
    const float(&e)[4] = o_acc[2 * g];
    const float(&o)[4] = o_acc[2 * g + 1];
    *reinterpret_cast<float4*>(mine + r * kOw + d) =
        make_float4(e[0] * v_scale, o[0] * v_scale, e[1] * v_scale, o[1] * v_scale);
    *reinterpret_cast<float4*>(mine + (r + 8) * kOw + d) =
        make_float4(e[2] * v_scale, o[2] * v_scale, e[3] * v_scale, o[3] * v_scale);
  }
  if ((lane & 3) == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mw[warp * kRows + r + 8 * h] = os[h].m;
      lw[warp * kRows + r + 8 * h] = os[h].l;
    }
  }
}

/// Per-row scores over fp8 K: the dot times the row's factor (`scale · log2 e`, K's
/// dequantisation scale and the inverse of the row's power-of-two query scaling), rows lane/4
/// (h = 0) and lane/4 + 8 (h = 1).
struct RowScaledScores {
  float s2[2];
  __device__ __forceinline__ float operator()(float dot, float, int, int h) const {
    return dot * s2[h];
  }
};

/// The variant's scores over fp8 K/V (window, soft cap: `VariantScores`), of the dot products
/// as the 16-bit kernel sees them: each row's fp8 dot product times `s2[h]` (the K scale over the
/// query row's scaling, `queries_to_f16`) before the variant's map.
struct RowScaledVariantScores : VariantScores {
  float s2[2];
  __device__ __forceinline__ float operator()(float dot, float scale, int t, int h) const {
    const float d = dot * s2[h];
    return VariantScores::operator()(d, scale, t, h);
  }
};

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
