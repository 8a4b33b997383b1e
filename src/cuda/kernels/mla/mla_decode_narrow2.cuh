/// @file kernels/mla/mla_decode_narrow2.cuh
/// @brief The narrow MLA decode in a configuration of two CTAs per SM (internal, sm_90a): the
///        narrow kernel's requests (at most `kMlaNarrowRows` query rows), CTA prologue
///        (`mla_narrow_prologue`), products and epilogue, over a query tile of `kMlaNarrowRows`
///        rows and a ring of `kMlaNarrow2Stages` 64-key tiles, so that a CTA fits half an SM's
///        shared memory and half its registers.
///
/// Why one stage: `Sᵀ = K Qᵀ` takes the 64 keys of a tile as the wgmma's M (fixed at 64), so a
/// stage holds 64 keys × 576 columns (72 KiB); with the 32-row query tile (36 KiB) one stage is
/// all that fits twice in an SM. A CTA's consumer then runs each tile in order (scores, softmax,
/// `P V`, the stage released) while the producer waits, and the SM's other CTA streams its copies
/// meanwhile: the two CTAs' copies, compute and fixed costs (query load, split prologue,
/// epilogue) overlap each other's instead of one CTA's own.
///
/// Registers: 256 threads of two CTAs hold 128 a thread; the producer gives its share to the
/// consumer (`setmaxnreg`: the 32-row accumulator `Oᵀ` alone is 128 a thread), and both return
/// to 128 for the epilogue, which all 256 threads run (the narrow kernel's).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/arch/wgmma.cuh"
#include "cuda/kernels/mla/epilogue.cuh"
#include "cuda/kernels/mla/loader.cuh"
#include "cuda/kernels/mla/mla_decode_narrow.cuh"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/kernels/mla/ws_ring.cuh"
#include "cuda/tile/fp8_kv.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

using catalog::kMlaNarrow2Stages;

/// Bytes of one 64-column part of the query tile (`kMlaNarrowRows` rows of 128 bytes: 8-row
/// groups 1024 bytes apart, as the wgmma kernel's tiles), and of the whole tile.
constexpr std::uint32_t kMlaNarrow2QPartBytes = kMlaNarrowRows * 128;
constexpr std::uint32_t kMlaNarrow2QBytes = (kMlaHeadDim / 64) * kMlaNarrow2QPartBytes;
static_assert(kMlaNarrow2QPartBytes % 1024 == 0, "parts on the 128-byte swizzle's 1 KiB atoms");
/// Registers per thread of the producer warpgroup (fp8: its conversions; less beside the
/// 32-row consumer, whose fp8 scores need both parts' fragments) and of the consumer (the rest
/// of the two warpgroups' 2 × 128), and of both in the epilogue.
template <bool kFp8, int kN>
constexpr int kMlaNarrow2ProducerRegs = !kFp8      ? 40
                                        : kN == 32 ? 48
                                                   : 56;
template <bool kFp8, int kN>
constexpr int kMlaNarrow2ConsumerRegs = 2 * 128 - kMlaNarrow2ProducerRegs<kFp8, kN>;
constexpr int kMlaNarrow2EpilogueRegs = 128;
static_assert(kMlaNarrowThreads * 128 * catalog::kMlaNarrow2CtasPerSm <= 65536,
              "two CTAs' registers in an SM's file");

/// The shared memory of a two-CTA narrow CTA (base aligned up to 1 KiB): the query tile `q`, the
/// ring `kv` [stage], the probabilities `p` (bf16, `kMlaNarrowRows` rows of 64 keys, 128-byte
/// swizzled), the rows' exchange `red` [4 warps][kMlaNarrowRows] and LSEs `lse`, the mbarriers
/// ("full" [stage]: the producer's four warps; "empty" [stage]: the consumer's four) and the
/// ticket flag `is_last`; the epilogue's normalised `o` [kMlaNarrowRows][512] (fp32) over the
/// query tile and the ring. `fits`: the aligned carve-up ends within the catalog's bytes.
struct MlaNarrow2Smem {
  unsigned char* q;
  unsigned char* kv;
  unsigned char* p;
  float* red;
  float* lse;
  std::uint32_t full0;
  std::uint32_t empty0;
  int* is_last;
  float* o;
  bool fits;

  __device__ __forceinline__ explicit MlaNarrow2Smem(unsigned char* raw) {
    const auto at = reinterpret_cast<std::uintptr_t>(raw);
    const std::uintptr_t aligned = (at + 1023) & ~static_cast<std::uintptr_t>(1023);
    fits = aligned - at + static_cast<std::uintptr_t>(catalog::mla_narrow2_carve_bytes()) <=
           static_cast<std::uintptr_t>(catalog::mla_narrow2_smem_bytes());
    unsigned char* base = reinterpret_cast<unsigned char*>(aligned);
    q = base;
    kv = q + kMlaNarrow2QBytes;
    p = kv + kMlaNarrow2Stages * kMlaWsTileBytes;
    red = reinterpret_cast<float*>(p + kMlaNarrowRows * kMlaWsTileKeys * 2);
    lse = red + 4 * kMlaNarrowRows;
    full0 = arch::smem_addr(lse + kMlaNarrowRows);
    empty0 = full0 + 8 * kMlaNarrow2Stages;
    is_last = reinterpret_cast<int*>(lse + kMlaNarrowRows + 4 * kMlaNarrow2Stages);
    o = reinterpret_cast<float*>(base);
  }
  /// Shared address of stage `st` of the ring.
  __device__ __forceinline__ std::uint32_t stage(int st) const {
    return arch::smem_addr(kv) + static_cast<std::uint32_t>(st) * kMlaWsTileBytes;
  }
};
static_assert(kMlaNarrow2QBytes + kMlaNarrow2Stages * kMlaWsTileBytes +
                      kMlaNarrowRows * kMlaWsTileKeys * 2 + 4 * kMlaNarrowRows * 4 +
                      kMlaNarrowRows * 4 + 16 * kMlaNarrow2Stages + 16 ==
                  catalog::mla_narrow2_carve_bytes(),
              "the carve-up is the catalog's");

/// The query tile's layout (`mla_ws_offset`'s swizzle, parts `kMlaNarrow2QPartBytes` apart), for
/// `mla_load_queries`.
struct MlaNarrow2QLayout {
  __device__ static __forceinline__ std::uint32_t at(int r, int c) {
    return static_cast<std::uint32_t>((c >> 3) * kMlaNarrow2QPartBytes + r * 128 +
                                      (((c & 7) ^ (r & 7)) << 4));
  }
};

/// The scores' descriptors of k-step `ks` (`MlaWsScoreDescs`'s words) over the K tile of stage
/// `st` and the query tile, whose parts are `kMlaNarrow2QPartBytes` apart.
struct MlaNarrow2ScoreDescs {
  std::uint32_t q_lo, k_lo;
  __device__ __forceinline__ MlaNarrow2ScoreDescs(const MlaNarrow2Smem& sm, int st)
      : q_lo(((arch::smem_addr(sm.q) & 0x3FFFFu) >> 4) | (1u << 16)),
        k_lo(((sm.stage(st) & 0x3FFFFu) >> 4) | (1u << 16)) {}
  __device__ __forceinline__ std::uint64_t q(int ks) const {
    return arch::desc_join(q_lo + (((ks >> 2) * kMlaNarrow2QPartBytes + (ks & 3) * 32) >> 4),
                           MlaWsScoreDescs::kHi);
  }
  __device__ __forceinline__ std::uint64_t k(int ks) const {
    return arch::desc_join(k_lo + MlaWsScoreDescs::off(ks), MlaWsScoreDescs::kHi);
  }
};

/// The two-CTA narrow wgmma MLA decode kernel over a latent part of `kKv` (`kBlock`: with its
/// block scales), `kN` (16 or 32) the rows of its products (the request's rows, at most `kN`).
template <int kKv, bool kBlock, int kN>
__global__ void __launch_bounds__(kMlaNarrowThreads, catalog::kMlaNarrow2CtasPerSm)
    mla_decode_narrow2_kernel(const MlaParams p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kN == 16 || kN == 32, "products of 16 or 32 rows");
  constexpr bool kFp8 = kKv != tile::kKvSame;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const MlaNarrow2Smem sm(smem_raw);
  if (!sm.fits) __trap();  // a dynamic base too far below 1 KiB alignment for the slack
  const int tid = threadIdx.x;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // (uniform: the branches below)
  const int lane = tid & 31;
  MlaNarrowRows<kN> r;
  {
    MlaNarrowWork w;
    if (!mla_narrow_prologue<kMlaNarrow2Stages, MlaNarrow2QLayout, kMlaNarrowRows>(p, sm, tid, w))
      return;
    if (warp >= 4) {
      arch::setmaxnreg_dec<kMlaNarrow2ProducerRegs<kFp8, kN>>();
      mla_ws_produce<kKv, kBlock, kMlaNarrow2Stages>(p, w.c, sm, tid - 128, lane, w.range.begin,
                                                     w.range.end, w.n_tiles);
      arch::setmaxnreg_inc<kMlaNarrow2EpilogueRegs>();  // (once the consumer gave its share back)
    } else {
      arch::setmaxnreg_inc<kMlaNarrow2ConsumerRegs<kFp8, kN>>();
      mla_narrow_rows_init(p, w, lane, r);
      if (w.n_tiles > 0)
        mla_narrow_consume<kKv, kN, kMlaNarrow2Stages, MlaNarrow2ScoreDescs>(p, sm, sm.red, r,
                                                                             w.n_tiles, warp, lane);
      mla_narrow_state_to_smem(r, sm.red, warp, lane, kFp8 ? p.ckv_scale.at(0) : 1.f, sm.o, sm.lse);
      arch::setmaxnreg_dec<kMlaNarrow2EpilogueRegs>();
    }
  }
  // ---- epilogue (the narrow kernel's, all 256 threads) ----
  __syncthreads();  // the state in shared memory; the producer's last copies landed long before
  mla_rows_out(p, tid, sm.o, sm.lse, sm.is_last, 0);
#elif defined(__CUDA_ARCH__)
  __trap();  // not built for sm_90a: the run never launches it (DeviceFacts::wgmma())
#endif
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
