/// @file producer_rows.hpp
/// @brief Building blocks shared by the CPU attention producers (decode, cascade): loading and
///        storing rows of stored elements as fp32 (KV rows dequantised with their scales), and
///        folding a block of keys into one query row's online softmax (internal).
#pragma once

#include <cstdint>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/variant.hpp"
#include "cpu/merge_rows.hpp"

namespace attnstate {
namespace cpu {
namespace detail {

/// `dst[i] = to_float(p[off + i])` for `i < n`, `p` holding elements of type `dt`.
inline void load_row(const void* p, DType dt, std::int64_t off, std::int64_t n, float* dst) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(p) + off;
    for (std::int64_t i = 0; i < n; ++i) dst[i] = to_float(s[i]);
  });
}

/// The dequantisation scales of both pools of `kv`, one per KV head (`KvScale::at`, read once:
/// the values the checks saw are the values used). Nothing is stored for a pool that is not
/// fp8, nor when the call reads no key (`used` false: a huge `heads_kv` then costs nothing);
/// the scales are then 1.
struct HeadScales {
  std::vector<float> k, v;  ///< `(heads_kv)` each, or empty.
  HeadScales(const PagedKvCache& kv, bool used) {
    if (!used || !is_fp8(kv.dtype)) return;
    k.resize(static_cast<std::size_t>(kv.heads_kv));
    v.resize(static_cast<std::size_t>(kv.heads_kv));
    for (std::int64_t h = 0; h < kv.heads_kv; ++h) {
      k[static_cast<std::size_t>(h)] = kv.k_scale.at(h);
      v[static_cast<std::size_t>(h)] = kv.v_scale.at(h);
    }
  }
  /// The scale of K of KV head `h`.
  float k_at(std::int64_t h) const { return k.empty() ? 1.f : k[static_cast<std::size_t>(h)]; }
  /// The scale of V of KV head `h`.
  float v_at(std::int64_t h) const { return v.empty() ? 1.f : v[static_cast<std::size_t>(h)]; }
};

/// `dst[i]` = the real value of element `off + i` of the KV pool `p` (dtype `dt`) for `i < n`:
/// `to_float`, times `scale` (its KV head's) for an fp8 pool, rounded once to fp32 as the fp8
/// merges load an fp8 `o`. Other dtypes ignore `scale` (it is 1: the checks require it).
inline void load_kv_row(const void* p, DType dt, float scale, std::int64_t off, std::int64_t n,
                        float* dst) {
  dispatch_dtype_with_fp8(dt, [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(p) + off;
    if constexpr (kIsFp8<T>) {
      const float* table = fp8_table<T>();
      for (std::int64_t i = 0; i < n; ++i) dst[i] = table[s[i].bits] * scale;
    } else {
      for (std::int64_t i = 0; i < n; ++i) dst[i] = to_float(s[i]);
    }
  });
}

/// `p[off + i] = round(src[i])` for `i < n`, `p` holding elements of type `dt` (rounded once).
inline void store_row(void* p, DType dt, std::int64_t off, std::int64_t n, const float* src) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(p) + off;
    for (std::int64_t i = 0; i < n; ++i) d[i] = from_float<T>(src[i]);
  });
}

/// Folds keys `k (n, qk_dim)` (rows `k_stride` apart) and values `v (n, v_dim)` (rows
/// `v_stride` apart; fp32 rows) into the running state of one query row `q (qk_dim)`: base-2
/// scores `score(q·k)` (the scale and, when set, the soft cap), then `math::OnlineSoftmax`
/// rescaling of `acc (v_dim)` (skipped when the running max did not move: multiplying by 1 is the
/// identity) and `acc += p · v`. `scores` is scratch of at least `n` floats. The values may be
/// the first `v_dim` columns of the keys (MLA: `v == k`, `v_stride == k_stride`).
inline void fold_key_block(math::OnlineSoftmax& os, float* acc, const float* q, const float* k,
                           std::int64_t k_stride, const float* v, std::int64_t v_stride,
                           std::int64_t n, std::int64_t qk_dim, std::int64_t v_dim,
                           const math::ScoreMap& score, float* scores) {
  float block_max = math::neg_inf();
  for (std::int64_t j = 0; j < n; ++j) {
    float dot = 0.f;
    for (std::int64_t d = 0; d < qk_dim; ++d) dot += q[d] * k[j * k_stride + d];
    scores[j] = score(dot);
    block_max = math::nan_max(block_max, scores[j]);
  }
  const float alpha = os.rescale(block_max);
  if (alpha != 1.f) {
    for (std::int64_t d = 0; d < v_dim; ++d) acc[d] *= alpha;
  }
  float p_sum = 0.f;
  for (std::int64_t j = 0; j < n; ++j) {
    const float p = os.prob(scores[j]);
    p_sum += p;
    for (std::int64_t d = 0; d < v_dim; ++d) acc[d] += p * v[j * v_stride + d];
  }
  os.add(p_sum);
}

/// `fold_key_block` over dense rows of one width `dim` (keys and values alike).
inline void fold_key_block(math::OnlineSoftmax& os, float* acc, const float* q, const float* k,
                           const float* v, std::int64_t n, std::int64_t dim,
                           const math::ScoreMap& score, float* scores) {
  fold_key_block(os, acc, q, k, dim, v, dim, n, dim, dim, score, scores);
}

/// Merges the partial states of one row over the `n` splits of its request, in split order,
/// with the max-subtracted merge: split `s` has the normalised fp32 `o` at `po + s · stride · D`
/// (`D` values) and its base-2 LSE at `plse[s · stride]`. Writes the normalised merged `o` to
/// `acc (D)` and returns its base-2 LSE. One split is copied as it is; an empty split (`-inf`)
/// contributes nothing, its `o` never read.
inline float merge_split_row(const float* po, const float* plse, std::int32_t n,
                             std::int64_t stride, std::int64_t D, float* acc) {
  if (n == 1) {
    for (std::int64_t d = 0; d < D; ++d) acc[d] = po[d];
    return plse[0];
  }
  float m = math::neg_inf();
  for (std::int32_t s = 0; s < n; ++s) m = math::nan_max(m, plse[s * stride]);
  float sum = 0.f;
  for (std::int64_t d = 0; d < D; ++d) acc[d] = 0.f;
  for (std::int32_t s = 0; s < n; ++s) {
    const float l = plse[s * stride];
    if (math::is_empty_lse(l)) continue;
    const float w = math::merge_weight(LseBase::kBase2, l, m);
    sum += w;
    const float* o = po + s * stride * D;
    for (std::int64_t d = 0; d < D; ++d) acc[d] += w * o[d];
  }
  const math::MergeResult res = math::merge_finalize(LseBase::kBase2, m, sum);
  for (std::int64_t d = 0; d < D; ++d) acc[d] *= res.inv_sum;
  return res.lse;
}

}  // namespace detail
}  // namespace cpu
}  // namespace attnstate
