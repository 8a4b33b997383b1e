/// @file producer_rows.hpp
/// @brief Building blocks shared by the CPU attention producers (decode, cascade): loading and
///        storing rows of stored elements as fp32, and folding a block of keys into one query
///        row's online softmax (internal).
#pragma once

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/variant.hpp"

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
