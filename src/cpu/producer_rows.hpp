/// @file producer_rows.hpp
/// @brief Building blocks shared by the CPU attention producers (decode, cascade): loading and
///        storing rows of stored elements as fp32 (KV rows dequantised with their scales), and
///        folding a block of keys into one query row's online softmax (internal).
#pragma once

#include <cstdint>
#include <vector>

#include "attnstate/core/dtype.hpp"
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

/// Folds keys `k (n, dim)` and values `v (n, dim)` (fp32 rows) into the running state of one
/// query row `q (dim)`: base-2 scores `score(q·k)` (the scale and, when set, the soft cap),
/// then `math::OnlineSoftmax` rescaling of `acc (dim)` (skipped when the running max did not
/// move: multiplying by 1 is the identity) and `acc += p · v`. `scores` is scratch of at least
/// `n` floats.
inline void fold_key_block(math::OnlineSoftmax& os, float* acc, const float* q, const float* k,
                           const float* v, std::int64_t n, std::int64_t dim,
                           const math::ScoreMap& score, float* scores) {
  float block_max = math::neg_inf();
  for (std::int64_t j = 0; j < n; ++j) {
    float dot = 0.f;
    for (std::int64_t d = 0; d < dim; ++d) dot += q[d] * k[j * dim + d];
    scores[j] = score(dot);
    block_max = math::nan_max(block_max, scores[j]);
  }
  const float alpha = os.rescale(block_max);
  if (alpha != 1.f) {
    for (std::int64_t d = 0; d < dim; ++d) acc[d] *= alpha;
  }
  float p_sum = 0.f;
  for (std::int64_t j = 0; j < n; ++j) {
    const float p = os.prob(scores[j]);
    p_sum += p;
    for (std::int64_t d = 0; d < dim; ++d) acc[d] += p * v[j * dim + d];
  }
  os.add(p_sum);
}

}  // namespace detail
}  // namespace cpu
}  // namespace attnstate
