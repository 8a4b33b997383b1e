/// @file kernels/decode/epilogue.cuh
/// @brief The epilogues of the split decode kernel (internal): the merge of a CTA's warps into
///        its split state and that state's slot (direct store, cluster publication or workspace
///        partial state), the cluster merge, the tickets and the workspace merge after them; and
///        the direct store of an output row with its prior fold and sink (`store_row_columns`),
///        which every output path ends in. Each is a part of the kernel's composition
///        (`decode_split_kv_kernel`), inlined there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/memory.cuh"
#include "cuda/kernels/decode/common.cuh"
#include "cuda/kernels/decode/params.cuh"
#include "cuda/kernels/decode/split_merge.cuh"
#include "cuda/tile/fp8_kv.cuh"
#include "cuda/tile/partial_state.cuh"
#include "cuda/tile/warp_reduce.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

/// Stores four merged columns (from `4 · d4`) of query row `rg` of (request `b`, KV head `hkv`)
/// as the output state, with the prior states folded in first when there are any and the head's
/// attention sink merged in last when there are sinks.
/// `grouped`: the calling lanes come in aligned groups of min(32, D / 4) active lanes that hold
/// the quads of one row (then the fold shares its per-row work across the group).
template <int D>
__device__ __forceinline__ void store_row_columns(const DecodeParams& p, int b, int hkv, int rg,
                                                  int d4, MergedColumns mc, bool grouped) {
  const std::int64_t token = static_cast<std::int64_t>(b) * p.q_len + rg / p.group;
  const std::int64_t hq = static_cast<std::int64_t>(hkv) * p.group + rg % p.group;
  if (p.prior_count > 0) {
    constexpr int kGroup = D / 4 < 32 ? D / 4 : 32;
    if (grouped)
      mc = fold_prior_group<D, kGroup>(p.prior_o, p.prior_lse, p.prior_count, p.prior_rows,
                                       token * p.heads_q + hq, d4, mc);
    else
      mc = fold_prior<D>(p.prior_o, p.prior_lse, p.prior_count, p.prior_rows,
                         token * p.heads_q + hq, d4, mc);
  }
  if (p.sinks != nullptr) mc = tile::merge_sink(mc, p.sinks[hq]);  // once, after everything else
  store4_as(p.out_o, p.out_dtype, token * p.o_stride_token + hq * p.o_stride_head + 4 * d4, mc.o,
            p.out_vec4);
  if (d4 == 0)
    p.out_lse[token * p.lse_stride_token + hq * p.lse_stride_head] =
        math::convert_lse(mc.lse, LseBase::kBase2, p.out_base);
}

/// Where a split's state goes after its warps are merged: the output itself (`single`: one
/// split), its CTA's shared memory for the cluster merge (`clustered`: `pub_o` [row][D],
/// `pub_lse` [row]), else its workspace slot (row `part0` of `p.ws_o` / `p.ws_lse`).
struct SplitSlot {
  bool single;
  bool clustered;
  float* pub_o;
  float* pub_lse;
};

/// The warp-merge epilogue: the warps' states (`o_acc`, `os`; fp8: `o` still to be scaled by
/// the head's V scale) through shared memory (`ow` [warp][row][kOw], `mw`, `lw` [warp][row]),
/// merged in warp order, each thread four columns of one row with the warps' factors recomputed
/// per row, into `slot` (`store_merged(r, d4, mc, grouped)` for the output). Part `part0` of the
/// workspace is split `s` of tile `tile_id` (of `S` slots per tile).
template <int D, int kOw, bool kFp8, class StoreMerged>
__device__ __forceinline__ void split_warp_merge(const DecodeParams& p, const int& tid,
                                                 const int& warp, const int& lane, const int& hkv,
                                                 const int& rows_here, float (&o_acc)[D / 8][4],
                                                 math::OnlineSoftmax (&os)[2], float* ow, float* mw,
                                                 float* lw, const std::int64_t tile_id,
                                                 const std::int64_t S, const int& s,
                                                 const SplitSlot& slot, StoreMerged& store_merged) {
  constexpr int kWarps = kDecodeWarps;
  constexpr int kRows = kDecodeTileRows;
  constexpr int kThreads = kWarps * 32;
  constexpr int kD4 = D / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = os[h].l;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    os[h].l = l;
  }
  __syncthreads();  // every warp is done with the pipeline buffers
  if constexpr (kFp8)
    tile::store_warp_state_fp8<D, kOw>(ow, mw, lw, warp, lane, o_acc, os, p.v_scale.at(hkv));
  else
    tile::store_warp_state<D, kOw>(ow, mw, lw, warp, lane, o_acc, os);
  __syncthreads();

  const std::int64_t part0 = (tile_id * S + s) * kRows;
#pragma unroll 1
  for (int e = tid; e < rows_here * kD4; e += kThreads) {
    const int r = e / kD4;
    const int d4 = e % kD4;
    float m = math::neg_inf();
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = math::nan_max(m, mw[w * kRows + r]);
    float f[kWarps];
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mwv = mw[w * kRows + r];
      f[w] = math::is_empty_lse(mwv) ? 0.f : math::merge_weight(LseBase::kBase2, mwv, m);
      sum += f[w] * lw[w * kRows + r];
    }
    const math::MergeResult res = math::merge_finalize(LseBase::kBase2, m, sum);
    // (the four sums as scalars declared last to first: the register order, and so the machine
    // code, of this loop when it was written in the kernel)
    float aw = 0.f, az = 0.f, ay = 0.f, ax = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (!math::is_empty_lse(mw[w * kRows + r])) {
        const float4 x = *reinterpret_cast<const float4*>(ow + (w * kRows + r) * kOw + 4 * d4);
        ax += f[w] * x.x;
        ay += f[w] * x.y;
        az += f[w] * x.z;
        aw += f[w] * x.w;
      }
    }
    const float4 o =
        make_float4(ax * res.inv_sum, ay * res.inv_sum, az * res.inv_sum, aw * res.inv_sum);
    if (slot.single) {
      // (each row's kD4 items are consecutive threads, rows in whole groups: grouped)
      MergedColumns mc;
      mc.o = o;
      mc.lse = res.lse;
      store_merged(r, d4, mc, true);
    } else if (slot.clustered) {
      *reinterpret_cast<float4*>(slot.pub_o + r * D + 4 * d4) = o;
      if (d4 == 0) slot.pub_lse[r] = res.lse;
    } else {
      *reinterpret_cast<float4*>(p.ws_o + (part0 + r) * D + 4 * d4) = o;
      if (d4 == 0) p.ws_lse[part0 + r] = res.lse;
    }
  }
}

/// The cluster-merge epilogue (one CTA per split, `p.cluster` of them): CTA `s` merges a
/// contiguous share of the tile's `items` columns, reading the published states (`pub_o`,
/// `pub_lse`) of the request's `n_splits` splits from their CTAs' shared memory.
template <int D, class StoreMerged>
__device__ __forceinline__ void split_cluster_merge(const DecodeParams& p, const int& tid,
                                                    const int& s, const int& n_splits,
                                                    const int& items, float* pub_o, float* pub_lse,
                                                    StoreMerged& store_merged) {
  constexpr int kRows = kDecodeTileRows;
  constexpr int kThreads = kDecodeWarps * 32;
  constexpr int kD4 = D / 4;
  arch::cluster_sync();
  const int share = (items + p.cluster - 1) / p.cluster;
  const int e_end = min(items, (s + 1) * share);
  const std::uint32_t o_addr = arch::smem_addr(pub_o);
  const std::uint32_t l_addr = arch::smem_addr(pub_lse);
  // (a fixed trip count, unrolled: no loop state lives across the output calls; a cluster has
  // at least two CTAs)
  constexpr int kIters = (kRows * kD4 / 2 + kThreads - 1) / kThreads;
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int e = s * share + tid + k * kThreads;
    if (e >= e_end) break;
    const int r = e / kD4;
    const int d4 = e % kD4;
    auto lse_at = [&](int i) { return arch::ld_cluster(arch::cluster_map(l_addr + 4 * r, i)); };
    auto o_at = [&](int i) {
      return arch::ld_cluster4(arch::cluster_map(o_addr + 4 * (r * D + 4 * d4), i));
    };
    store_merged(r, d4,
                 split_merge<kDecodeMaxCluster, kDecodeClusterBatch>(n_splits, lse_at, o_at));
  }
  arch::cluster_sync();  // peers may still read this CTA's state until here
  ATTNSTATE_DECODE_MARK(3);
}

/// The ticket epilogue: every CTA of the request's splits takes one (acquire-release: its
/// partial state is released with it, the others' are acquired); the CTA with the last one, or
/// every CTA of the cluster group holding it (`p.cluster` consecutive splits), merges the
/// splits, a group's CTAs sharing the columns. True when this CTA merges, with its share
/// [`e_begin`, `e_end`) of the `items` columns; `is_last` holds a flag per CTA of a group.
__device__ __forceinline__ bool split_ticket(const DecodeParams& p, const int& tid, const int& s,
                                             const int& n_splits, const bool& active,
                                             const std::int64_t& tile_id, int* is_last,
                                             const int& items, int& e_begin, int& e_end) {
  const int C = p.cluster;  // 1, or groups of C consecutive splits in a cluster
  const int g = s / C;
  if (g * C >= n_splits) {  // the whole group (cluster): no split of the request in it
    if (C > 1) arch::cluster_wait();
    return false;
  }
  const int rank = s - g * C;
  __syncthreads();                  // every thread's partial-state stores precede the release below
  if (C > 1) arch::cluster_wait();  // every CTA of the group runs: its flags may be written
  if (tid == 0) {
    const int ticket = active ? arch::atomic_add_acq_rel_gpu(p.tickets + tile_id, 1) : -1;
    const int last = ticket == n_splits - 1;
    if (last) p.tickets[tile_id] = 0;  // the next launch is ordered after this kernel
    if (C > 1) {
      // this CTA's slot in every CTA of the group
      const std::uint32_t slot = arch::smem_addr(is_last + rank);
#pragma unroll 1
      for (int c = 0; c < C; ++c)
        arch::st_cluster(arch::cluster_map(slot, static_cast<std::uint32_t>(c)), last);
    } else {
      *is_last = last;
    }
  }
  if (C > 1)
    arch::cluster_sync();  // every slot is written; no remote access after this
  else
    __syncthreads();
  ATTNSTATE_DECODE_MARK(2);
  int last = 0;
#pragma unroll 1
  for (int c = 0; c < C; ++c) last |= is_last[c];
  if (!last) return false;
  const int share = (items + C - 1) / C;
  e_begin = min(items, rank * share);
  e_end = min(items, e_begin + share);
  return true;
}

/// The workspace merge's batch of columns in flight: item `it` (from `e_begin`) of splits
/// [`i0`, `i0 + kB`) clamped to the last of the `n` splits, from the partial states of tile row
/// `split0` (split 0, row 0) into `v`. (References, as the kernel's lambda captured them: so the
/// machine code stays the same.)
template <int D, int kB>
__device__ __forceinline__ void split_load_batch(const DecodeParams& p, const std::int64_t& split0,
                                                 const int& e_begin, const int& n, float4 (&v)[kB],
                                                 int it, int i0) {
  const float* src = p.ws_o + split0 * D + 4 * (e_begin + it);
#pragma unroll
  for (int u = 0; u < kB; ++u) {
    const int i = i0 + u < n ? i0 + u : n - 1;
    v[u] = __ldcg(
        reinterpret_cast<const float4*>(src + static_cast<std::int64_t>(i) * kDecodeTileRows * D));
  }
}

/// The workspace merge's row max (`split_ws_row_max`, `split_ws_weight`, `split_ws_sum_splits`
/// and `split_ws_store` are its parts, in the kernel's order; see `decode_split_kv_kernel`): the
/// max over the `n` splits' LSEs of row `r` in `st_w` [split][16 rows], lane `j` of the row's 8
/// taking splits `j, j + 8, ...`, then reduced over the 8 lanes by shuffles.
__device__ __forceinline__ float split_ws_row_max(const int& j, const int& r, const int& n,
                                                  float* st_w) {
  constexpr int kRows = kDecodeTileRows;
  float m = math::neg_inf();
#pragma unroll 1
  for (int i = j; i < n; i += 8) m = math::nan_max(m, st_w[i * kRows + r]);
  m = tile::butterfly_reduce<4, 1>(m, math::nan_max);
  return m;
}

/// Split `i`'s weight of row `r` in place of its LSE in `st_w` (row max `m`; -1 marks an empty
/// split: merge weights are never negative).
__device__ __forceinline__ void split_ws_weight(int i, int r, float m, float* st_w) {
  constexpr int kRows = kDecodeTileRows;
  const float l = st_w[i * kRows + r];
  st_w[i * kRows + r] = math::is_empty_lse(l) ? -1.f : math::merge_weight(LseBase::kBase2, l, m);
}

/// The weighted sums of item `it` (from `e_begin`: four columns of one row) over splits
/// [`c0`, `c1`) of the `n` splits, into `acc` and `sum` (started from the item's running sums in
/// `acc_s` / `sum_s` after the first chunk of splits): batches of `kB` splits, every load of a
/// batch in flight (`split_load_batch` into `v`; the first batch of this thread's first item,
/// `it == tid`, already requested) before the adds in split order, the weights from `st_w`
/// through `w`. (The kernel's variables and by-value indices: the register order, and so the
/// machine code, of this code when it was written in the kernel.)
template <int D, int kB>
__device__ __forceinline__ void split_ws_sum_splits(const DecodeParams& p,
                                                    const std::int64_t& split0, int it, int tid,
                                                    int c0, int c1, const int& n,
                                                    const int& e_begin, float* st_w, float4* acc_s,
                                                    float* sum_s, float4 (&v)[kB], float4& acc,
                                                    float& sum, float (&w)[kB]) {
  constexpr int kD4 = D / 4;
  constexpr int kRows = kDecodeTileRows;
  const int r = (e_begin + it) / kD4;
  acc = make_float4(0.f, 0.f, 0.f, 0.f);
  sum = 0.f;
  if (c0 > 0) {
    acc = acc_s[it];
    sum = sum_s[it];
  }
  // batches of splits: every load of a batch in flight before the adds (in split order)
#pragma unroll 1
  for (int i0 = c0; i0 < c1; i0 += kB) {
    if (i0 > 0 || it != tid) split_load_batch<D, kB>(p, split0, e_begin, n, v, it, i0);
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      const int i = i0 + u < c1 ? i0 + u : c1 - 1;
      w[u] = i0 + u < c1 ? st_w[i * kRows + r] : -1.f;
    }
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      if (w[u] != -1.f) {
        sum += w[u];
        acc.x += w[u] * v[u].x;
        acc.y += w[u] * v[u].y;
        acc.z += w[u] * v[u].z;
        acc.w += w[u] * v[u].w;
      }
    }
  }
}

/// The workspace merge's outputs: this thread's `ne` items (from `e_begin`) of merged columns
/// (`acc_s`, `sum_s`: `o` and the base-2 LSE) stored by `store_merged(r, d4, mc)`, after the
/// merge's loops (little state lives across the output calls).
template <int D, class StoreMerged>
__device__ __forceinline__ void split_ws_store(int tid, int ne, int e_begin, float4* acc_s,
                                               float* sum_s, StoreMerged& store_merged) {
  constexpr int kD4 = D / 4;
  constexpr int kThreads = kDecodeWarps * 32;
#pragma unroll 1
  for (int it = tid; it < ne; it += kThreads) {
    const int e = e_begin + it;
    MergedColumns mc;
    mc.o = acc_s[it];
    mc.lse = sum_s[it];
    store_merged(e / kD4, e % kD4, mc);
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
