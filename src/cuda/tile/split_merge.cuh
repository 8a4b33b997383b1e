/// @file tile/split_merge.cuh
/// @brief The merge of split states, four output columns of a query row at a time, in split
///        order with the core max-subtracted merge: `split_merge` over states read through
///        accessors (the decode reads its cluster peers' distributed shared memory) and
///        `split_finalize`; the decode's two ways of running it on a tile's splits (the cluster
///        merge through distributed shared memory, and the workspace merge with its tickets).
///
/// The merge takes the max over all the splits' LSEs (base 2), then adds `w = 2^(lse − m)` to the
/// weight sum and `w · o` to the columns in split order, then `split_finalize`. The decode's
/// workspace merge runs the same operations with each row's weights computed once; the sequence
/// of floating-point operations per output element is the same, so every path gives bitwise the
/// same result.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/merge_math.hpp"
#include "cuda/arch/barrier.cuh"
#include "cuda/arch/memory.cuh"

namespace attnstate {
namespace cuda {
namespace tile {

/// Merged columns of one row: `o` normalised, `lse` in base 2.
struct MergedColumns {
  float4 o;
  float lse;
};

/// The merged state from the max and the weighted sums.
__device__ __forceinline__ MergedColumns split_finalize(float m, float sum, float4 acc) {
  const math::MergeResult r = math::merge_finalize(LseBase::kBase2, m, sum);
  MergedColumns out;
  out.o = make_float4(acc.x * r.inv_sum, acc.y * r.inv_sum, acc.z * r.inv_sum, acc.w * r.inv_sum);
  out.lse = r.lse;
  return out;
}

/// Merges splits `[0, n)`, `1 ≤ n ≤ N`, whose base-2 LSEs are `lse_at(i)` and four normalised
/// columns `o_at(i)`: every split's LSE and the columns of the first `B` splits are requested at
/// once (one round trip when `n ≤ B`, further batches of `B` columns after), then the max, then in
/// split order `w = 2^(lse − m)`, `sum += w`, `acc += w · o` over the non-empty splits (an empty
/// split's columns are loaded but never used).
template <int N, int B, class LseAt, class OAt>
__device__ __forceinline__ MergedColumns split_merge(int n, LseAt&& lse_at, OAt&& o_at) {
  static_assert(N % B == 0, "whole batches");
  float l[N];
  float4 v[B];
#pragma unroll
  for (int u = 0; u < N; ++u) l[u] = lse_at(u < n ? u : n - 1);
#pragma unroll
  for (int u = 0; u < B; ++u) v[u] = o_at(u < n ? u : n - 1);
  float m = math::neg_inf();
#pragma unroll
  for (int u = 0; u < N; ++u)
    if (u < n) m = math::nan_max(m, l[u]);
  float sum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int u0 = 0; u0 < N; u0 += B) {
    if (u0 >= n) break;
    if (u0 > 0) {
#pragma unroll
      for (int u = 0; u < B; ++u) v[u] = o_at(u0 + u < n ? u0 + u : n - 1);
    }
#pragma unroll
    for (int u = 0; u < B; ++u) {
      if (u0 + u < n && !math::is_empty_lse(l[u0 + u])) {
        const float w = math::merge_weight(LseBase::kBase2, l[u0 + u], m);
        sum += w;
        acc.x += w * v[u].x;
        acc.y += w * v[u].y;
        acc.z += w * v[u].z;
        acc.w += w * v[u].w;
      }
    }
  }
  return split_finalize(m, sum, acc);
}

/// The cluster merge of a tile's `n` splits (one CTA per split, cluster rank = split `s`, the
/// cluster `cluster` CTAs, at least two): after a cluster barrier CTA `s` merges a contiguous
/// share of the `items` items (item e: row e / (D / 4), column quad e % (D / 4)) with
/// `split_merge<N, B>`, reading every split's published state (`pub_o` [row][D], `pub_lse` [row]
/// base 2, at the same offsets in every CTA) through distributed shared memory, and stores each
/// with `store(r, d4, merged)`; a second barrier keeps the state alive while peers read it.
template <int D, int kRows, int kThreads, int N, int B, class Store>
__device__ __forceinline__ void cluster_split_merge(const float* pub_o, const float* pub_lse, int s,
                                                    const int& cluster, int n, int items, int tid,
                                                    Store&& store) {
  constexpr int kD4 = D / 4;
  arch::cluster_sync();
  const int share = (items + cluster - 1) / cluster;
  const int e_end = min(items, (s + 1) * share);
  const std::uint32_t o_addr = arch::smem_addr(pub_o);
  const std::uint32_t l_addr = arch::smem_addr(pub_lse);
  // (a fixed trip count, unrolled: no loop state lives across the output calls)
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
    store(r, d4, split_merge<N, B>(n, lse_at, o_at));
  }
  arch::cluster_sync();  // peers may still read this CTA's state until here
}

/// The tickets of the workspace merge: every CTA of a tile's `n` splits takes one from
/// `tickets[tile_id]` (acquire-release: its partial state, stored by every thread before, is
/// released with it, the others' are acquired; a CTA that is not `active` takes none); the CTA
/// with the last one resets it (the next launch is ordered after this kernel). With `C` > 1 the
/// CTAs of groups of `C` consecutive splits share a cluster (every CTA of it arrived at a
/// barrier phase at its start) and tell each other their tickets in the flags `is_last`
/// [rank]; every CTA of the group holding the last ticket merges a share of the `items` items.
/// Returns whether this CTA merges, its items `[e_begin, e_end)`; `mark(2)` stamps the decision.
template <class Mark>
__device__ __forceinline__ bool split_ticket(std::int32_t* tickets, std::int64_t tile_id, int n,
                                             int s, int C, bool active, int* is_last, int items,
                                             int tid, int& e_begin, int& e_end, Mark&& mark) {
  const int g = s / C;
  if (g * C >= n) {  // the whole group (cluster): no split of the request in it
    if (C > 1) arch::cluster_wait();
    return false;
  }
  const int rank = s - g * C;
  __syncthreads();                  // every thread's partial-state stores precede the release below
  if (C > 1) arch::cluster_wait();  // every CTA of the group runs: its flags may be written
  if (tid == 0) {
    const int ticket = active ? arch::atomic_add_acq_rel_gpu(tickets + tile_id, 1) : -1;
    const int last = ticket == n - 1;
    if (last) tickets[tile_id] = 0;
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
  mark(2);
  int last = 0;
#pragma unroll 1
  for (int c = 0; c < C; ++c) last |= is_last[c];
  if (!last) return false;
  const int share = (items + C - 1) / C;
  e_begin = min(items, rank * share);
  e_end = min(items, e_begin + share);
  return true;
}

/// The workspace merge, by a CTA holding a tile's last ticket: items `[e_begin, e_begin + ne)`
/// (`ne` ≥ 1; item e: row e / (D / 4), column quad e % (D / 4)) of the tile's `n` splits, whose
/// partial states (`p.ws_o` [split][kRows][D] fp32, `p.ws_lse` [split][kRows] base 2) start at
/// (split 0, row 0) = `split0`. Shared memory: `st_w`, every split's LSE, then its weight
/// (-1: empty) [split][kRows]; `state`, the merged columns [item] (float4), their sums [item] and
/// each row's max [row]. The splits' `o` columns are loaded straight into registers, `kB` splits'
/// loads in flight per batch (measured faster than staging them in shared memory by 16-byte
/// cp.async or by bulk copies, which issue slowly); the first batch of this thread's first item
/// is requested with the LSEs. `store(e, merged)` stores item e, after the loops (little state
/// lives across the output calls); `mark(slot)` stamps the phases 4..7.
template <int D, int kRows, int kThreads, int kB, class P, class Mark, class Store>
__device__ __forceinline__ void workspace_split_merge(const P& p, std::int64_t split0, int n,
                                                      int e_begin, int ne, int rows_here,
                                                      float* st_w, float* state, int tid,
                                                      Mark&& mark, Store&& store) {
  constexpr int kD4 = D / 4;
  float4* acc_s = reinterpret_cast<float4*>(state);  // [item]
  float* sum_s = state + 4 * kRows * kD4;            // [item]
  float* row_m = sum_s + kRows * kD4;                // [row]
  const int cap = n;                                 // (one chunk of splits)
  // The batch of columns in flight (item `it`, splits [i0, i0 + kB) clamped to the last split).
  float4 v[kB];
  auto load_batch = [&](int it, int i0) {
    const float* src = p.ws_o + split0 * D + 4 * (e_begin + it);
#pragma unroll
    for (int u = 0; u < kB; ++u) {
      const int i = i0 + u < n ? i0 + u : n - 1;
      v[u] =
          __ldcg(reinterpret_cast<const float4*>(src + static_cast<std::int64_t>(i) * kRows * D));
    }
  };
  mark(4);
  // The LSEs, and the first batch of this thread's first item, in flight together.
#pragma unroll 1
  for (int c = tid; c < n * (kRows / 4); c += kThreads)
    arch::cp_async_16_zfill<0>(arch::smem_addr(st_w + 4 * c), p.ws_lse + split0 + 4 * c, 16);
  arch::cp_async_commit();
  if (tid < ne) load_batch(tid, 0);
  mark(5);
  arch::cp_async_wait<0>();
  __syncthreads();
  mark(6);
  // Each row's max over the splits' LSEs and every split's weight in place of its LSE (-1 marks
  // an empty split; merge weights are never negative): 8 threads per row, each a stride of the
  // splits, the max by shuffles.
  static_assert(kThreads == 8 * kRows, "8 threads per row");
  {
    const int r = tid >> 3;
    const int j = tid & 7;
    float m = math::neg_inf();
#pragma unroll 1
    for (int i = j; i < n; i += 8) m = math::nan_max(m, st_w[i * kRows + r]);
#pragma unroll
    for (int off = 4; off > 0; off >>= 1)
      m = math::nan_max(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (r < rows_here) {
#pragma unroll 1
      for (int i = j; i < n; i += 8) {
        const float l = st_w[i * kRows + r];
        st_w[i * kRows + r] =
            math::is_empty_lse(l) ? -1.f : math::merge_weight(LseBase::kBase2, l, m);
      }
      if (j == 0) row_m[r] = m;
    }
  }
  mark(7);
#pragma unroll 1
  for (int c0 = 0; c0 < n; c0 += cap) {
    const int c1 = min(n, c0 + cap);
    __syncthreads();  // the weights of every split are in place
#pragma unroll 1
    for (int it = tid; it < ne; it += kThreads) {  // this thread's own items
      const int r = (e_begin + it) / kD4;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      float sum = 0.f;
      if (c0 > 0) {
        acc = acc_s[it];
        sum = sum_s[it];
      }
      // batches of splits: every load of a batch in flight before the adds (in split order)
#pragma unroll 1
      for (int i0 = c0; i0 < c1; i0 += kB) {
        float w[kB];
        if (i0 > 0 || it != tid) load_batch(it, i0);
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
      if (c1 == n) {
        const MergedColumns mc = split_finalize(row_m[r], sum, acc);
        acc = mc.o;
        sum = mc.lse;
      }
      acc_s[it] = acc;
      sum_s[it] = sum;
    }
  }
#pragma unroll 1
  for (int it = tid; it < ne; it += kThreads) {
    MergedColumns mc;
    mc.o = acc_s[it];
    mc.lse = sum_s[it];
    store(e_begin + it, mc);
  }
}

}  // namespace tile
}  // namespace cuda
}  // namespace attnstate
