/// @file tile/attention_tile.cuh
/// @brief One 16-key tile of a warp's attention on tensor cores (m16n8k16, 16 query rows as M):
///        the ldmatrix lane addressing of the XOR-swizzled tiles, `S = Q Kᵀ`, the online-softmax
///        step (`tile/softmax_step.cuh`) and `O += P V` (`pv_accumulate`). Used by both decode
///        kernels.
#pragma once

#include <cstdint>

#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/mma.cuh"
#include "cuda/tile/softmax_step.cuh"

namespace attnstate {
namespace cuda {
namespace tile {

/// Per-lane parts of the ldmatrix addresses of a swizzled tile (rows of D 16-bit elements,
/// 16-byte chunk `c` of row `r` at `c ^ (r & 7)`): the lane's row, and the XOR of the chunk index
/// with the row, so that the chunk of k-step `kk` is `(32 · kk) ^ x`.
struct LdmatrixLanes {
  int a_row;  ///< Q fragments (A) and V (transposed B).
  std::uint32_t a_x;
  int b_row;  ///< K (B).
  std::uint32_t b_x;
  __device__ __forceinline__ explicit LdmatrixLanes(int lane)
      : a_row(lane & 15),
        a_x(static_cast<std::uint32_t>(((lane >> 4) ^ (lane & 7)) << 4)),
        b_row(((lane >> 4) << 3) + (lane & 7)),
        b_x(static_cast<std::uint32_t>((((lane >> 3) & 1) ^ (lane & 7)) << 4)) {}
};

/// The A operand of `O += P V` (16 rows × 16 keys) from the probability registers `pr` (the
/// C fragments of the two 8-key n-tiles of `S`), rounded to the 16-bit type of `kBF16`.
template <bool kBF16>
__device__ __forceinline__ void p_operand(const float (&pr)[2][4], std::uint32_t (&pa)[4]) {
  using Mma = arch::Mma16816<arch::B16<kBF16>>;
  pa[0] = Mma::pack(pr[0][0], pr[0][1]);
  pa[1] = Mma::pack(pr[0][2], pr[0][3]);
  pa[2] = Mma::pack(pr[1][0], pr[1][1]);
  pa[3] = Mma::pack(pr[1][2], pr[1][3]);
}

/// `O += P V`: P (16 rows × 16 keys) from the probability registers `pr`, V via transposed
/// ldmatrix from the swizzled tile at `v_lane` (the lane's row) with chunk XOR `a_x`.
template <int D, bool kBF16>
__device__ __forceinline__ void pv_accumulate(const float (&pr)[2][4], std::uint32_t v_lane,
                                              std::uint32_t a_x, float (&o_acc)[D / 8][4]) {
  using Mma = arch::Mma16816<arch::B16<kBF16>>;
  std::uint32_t pa[4];
  p_operand<kBF16>(pr, pa);
#pragma unroll
  for (int jj = 0; jj < D / 16; ++jj) {
    std::uint32_t bv[4];
    arch::ldmatrix_x4_trans(bv, v_lane + ((32u * jj) ^ a_x));
    Mma::mma(o_acc[2 * jj], pa, bv[0], bv[1]);
    Mma::mma(o_acc[2 * jj + 1], pa, bv[2], bv[3]);
  }
}

/// One 16-key tile of a warp (first key `t0`): `S = Q Kᵀ` (the A fragments of k-step `kk` from
/// `q_frag(kk, a)`, K from the swizzled tile at `k_lane`, the lane's ldmatrix row), the online
/// softmax (base 2: `s2_scale` = softmax scale · log2 e) of rows lane/4 and lane/4 + 8 with keys
/// at or past `lim[h]` masked, and `O += P V` (V from `v_lane`). `a_x` / `b_x`: the lane's chunk
/// XORs (`LdmatrixLanes`); `scores` as in `online_softmax_step`. (The Q Kᵀ loop stays written out
/// here: as a third part beside the other two ptxas gives the split kernel other code.)
template <int D, bool kBF16, class QFrag, class Scores = PlainScores>
__device__ __forceinline__ void attention_tile(QFrag&& q_frag, std::uint32_t k_lane,
                                               std::uint32_t v_lane, std::uint32_t a_x,
                                               std::uint32_t b_x, int t0, const int (&lim)[2],
                                               float s2_scale, math::OnlineSoftmax (&os)[2],
                                               float (&o_acc)[D / 8][4],
                                               const Scores& scores = Scores()) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  // S = Q Kᵀ : 16 rows × 16 tokens (two n-tiles of 8 tokens).
  float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    std::uint32_t a[4], bk[4];
    q_frag(kk, a);
    arch::ldmatrix_x4(bk, k_lane + ((32u * kk) ^ b_x));
    arch::Mma16816<arch::B16<kBF16>>::mma(sc[0], a, bk[0], bk[1]);
    arch::Mma16816<arch::B16<kBF16>>::mma(sc[1], a, bk[2], bk[3]);
  }

  // Online softmax over the tile (base 2), rows lane/4 (h = 0) and lane/4 + 8 (h = 1); the
  // block maxima one `max.NaN` each (`Base2MaxNanInsn`: `math::nan_max`'s values, no branch).
  float pr[2][4];
  online_softmax_step<16, D, Base2MaxNanInsn>(sc, pr, o_acc, os, lim, t0, s2_scale, lane, scores);
  pv_accumulate<D, kBF16>(pr, v_lane, a_x, o_acc);
}

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
