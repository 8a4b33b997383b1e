/// @file mla_problem.hpp
/// @brief Random paged MLA decode problems in host memory: the kit's `MlaProblem` (every
///        request's latent tokens, one after the other) laid out in a paged latent cache in both
///        peers' layouts (two pools, FlashInfer's; one interleaved pool, FlashMLA's), queries in
///        one `(batch, q_len, heads, rank + rope)` buffer (FlashMLA's q: two strided views), and
///        the kit's double reference of each row over the keys it sees.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/testing/mla.hpp"

namespace attnstate_test {

/// Shape and options of a random paged MLA problem.
struct MlaConfig {
  std::int64_t q_len = 1;
  std::int64_t heads = 16;
  std::int64_t kv_lora_rank = 512;
  std::int64_t rope_dim = 64;
  std::int64_t page_size = 16;
  bool block_table = false;
  attnstate::DType q_dtype = attnstate::DType::kBF16;
  attnstate::DType ckv_dtype = attnstate::DType::kBF16;
  attnstate::DType kpe_dtype = attnstate::DType::kBF16;
  float q_gain = 1.f;            ///< Queries uniform in [-q_gain, q_gain] (before the fp8 rescale).
  float kv_amp = 1.f;            ///< fp8 parts stored uniform in [-kv_amp, kv_amp].
  float ckv_scale = 1.f;         ///< Scale of an fp8 ckv.
  float kpe_scale = 1.f;         ///< Scale of an fp8 kpe.
  bool scale_pointer = false;    ///< fp8 scales passed through a pointer, not as values.
  std::int64_t spare_pages = 2;  ///< Unused pages of the pool (NaN).
  std::vector<std::int32_t> seq_lens;

  std::string name() const {
    return "q_len=" + std::to_string(q_len) + " heads=" + std::to_string(heads) +
           " rank=" + std::to_string(kv_lora_rank) + " rope=" + std::to_string(rope_dim) +
           " page=" + std::to_string(page_size) + (block_table ? " bt" : " csr") +
           " q=" + attnstate::to_string(q_dtype) + " ckv=" + attnstate::to_string(ckv_dtype) +
           " kpe=" + attnstate::to_string(kpe_dtype) + " gain=" + std::to_string(q_gain) +
           " amp=" + std::to_string(kv_amp) + " scales=" + std::to_string(ckv_scale) + "," +
           std::to_string(kpe_scale) + (scale_pointer ? " (pointer)" : "");
  }
};

/// A paged MLA problem: the kit's problem, pools in both layouts, tables and queries.
struct MlaHost {
  MlaConfig cfg;
  std::int64_t batch = 0;
  std::int64_t num_pages = 0;
  std::int64_t bt_stride = 0;
  std::int64_t row_bytes = 0;              ///< Bytes of one token of the interleaved pool.
  attnstate::testing::MlaProblem problem;  ///< Rows `b·q_len + i`; keys request after request.
  std::vector<std::int64_t> first_key;     ///< First key of each request in `problem`.
  std::vector<unsigned char> ckv, kpe, pool, q;
  std::vector<std::int32_t> seq_lens, indptr, indices, block_table;
  std::vector<float> scale_mem;  ///< {ckv scale, kpe scale} for `scale_pointer`.

  std::int64_t tokens() const { return batch * cfg.q_len; }
  std::int64_t key_dim() const { return cfg.kv_lora_rank + cfg.rope_dim; }

  /// Page id of page `p` of request `b`.
  std::int64_t page(std::int64_t b, std::int64_t p) const {
    return cfg.block_table ? block_table[b * bt_stride + p] : indices[indptr[b] + p];
  }

  /// The cache in FlashInfer's layout (two dense pools) or, with `one_pool`, FlashMLA's (one pool,
  /// each token's `[ckv, kpe]` row interleaved).
  attnstate::MlaKvCache kv_view(bool one_pool = false) const {
    attnstate::MlaKvCache kv;
    kv.ckv_dtype = cfg.ckv_dtype;
    kv.kpe_dtype = cfg.kpe_dtype;
    kv.kv_lora_rank = cfg.kv_lora_rank;
    kv.rope_dim = cfg.rope_dim;
    kv.num_pages = num_pages;
    kv.page_size = cfg.page_size;
    if (one_pool) {
      const auto szc = static_cast<std::int64_t>(attnstate::size_of(cfg.ckv_dtype));
      const auto szk = static_cast<std::int64_t>(attnstate::size_of(cfg.kpe_dtype));
      kv.ckv = pool.data();
      kv.kpe = pool.data() + cfg.kv_lora_rank * szc;
      kv.ckv_token_stride = row_bytes / szc;
      kv.kpe_token_stride = row_bytes / szk;
      kv.ckv_page_stride = cfg.page_size * row_bytes / szc;
      kv.kpe_page_stride = cfg.page_size * row_bytes / szk;
    } else {
      kv.ckv = ckv.data();
      kv.kpe = kpe.data();
    }
    if (attnstate::is_fp8(cfg.ckv_dtype))
      kv.ckv_scale = cfg.scale_pointer ? attnstate::KvScale::per_tensor_at(&scale_mem[0])
                                       : attnstate::KvScale::per_tensor(cfg.ckv_scale);
    if (attnstate::is_fp8(cfg.kpe_dtype))
      kv.kpe_scale = cfg.scale_pointer ? attnstate::KvScale::per_tensor_at(&scale_mem[1])
                                       : attnstate::KvScale::per_tensor(cfg.kpe_scale);
    if (cfg.block_table) {
      kv.block_table = block_table.data();
      kv.block_table_stride = bt_stride;
    } else {
      kv.page_indptr = indptr.data();
      kv.page_indices = indices.data();
    }
    kv.seq_lens = seq_lens.data();
    kv.batch = batch;
    return kv;
  }

  /// `q_nope (batch, q_len, heads, rank)`: the first `rank` columns of the query buffer.
  attnstate::ConstTensorView q_nope_view() const { return q_part(0, cfg.kv_lora_rank); }
  /// `q_pe (batch, q_len, heads, rope)`: the last `rope` columns of the query buffer.
  attnstate::ConstTensorView q_pe_view() const { return q_part(cfg.kv_lora_rank, cfg.rope_dim); }
  attnstate::ConstTensorView q_part(std::int64_t col, std::int64_t width) const {
    attnstate::ConstTensorView t = attnstate::make_tensor_view(
        q.data(), cfg.q_dtype, {batch, cfg.q_len, cfg.heads, key_dim()});
    t.data = q.data() + col * static_cast<std::int64_t>(attnstate::size_of(cfg.q_dtype));
    t.shape[3] = width;
    return t;
  }

  /// The keys of `problem` row `b·q_len + i` sees: its request's `[0, len - q_len + i]`.
  std::vector<std::vector<std::int64_t>> keys_per_token() const {
    std::vector<std::vector<std::int64_t>> keys;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = 0; i < cfg.q_len; ++i) {
        const std::int64_t n = std::max<std::int64_t>(0, seq_lens[b] - cfg.q_len + i + 1);
        keys.emplace_back();
        for (std::int64_t k = 0; k < n; ++k) keys.back().push_back(first_key[b] + k);
      }
    return keys;
  }

  /// The kit's double reference of the decode (with `problem.sinks`, if any), LSEs in `base`.
  attnstate::testing::ReferenceState reference(attnstate::LseBase base) const {
    return attnstate::testing::reference_mla_state_per_token(problem, keys_per_token(), base);
  }
};

/// Stores `x` as dtype `dt` at element `i` of a byte buffer (fp8: the stored value, saturating).
inline void mla_put(unsigned char* buf, attnstate::DType dt, std::int64_t i, float x) {
  attnstate::dispatch_dtype_with_fp8(dt, [&](auto tag) {
    using T = decltype(tag);
    const T v = attnstate::from_float<T>(x);
    std::memcpy(buf + sizeof(T) * i, &v, sizeof(T));
  });
}

/// Builds a random problem: stored values uniform in [-1, 1] (fp8 × kv_amp; the queries × q_gain
/// divided by the largest real key element, at most × 256), page ids shuffled, unused slots NaN.
inline MlaHost make_mla_host(const MlaConfig& cfg, std::uint64_t seed) {
  using attnstate::DType;
  MlaHost h;
  h.cfg = cfg;
  h.batch = static_cast<std::int64_t>(cfg.seq_lens.size());
  h.seq_lens = cfg.seq_lens;
  h.scale_mem = {cfg.ckv_scale, cfg.kpe_scale};
  const std::int64_t L = cfg.kv_lora_rank, R = cfg.rope_dim, K = L + R;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  // page tables
  std::vector<std::int64_t> pages_of(static_cast<std::size_t>(h.batch));
  std::int64_t used = 0, keys = 0;
  for (std::int64_t b = 0; b < h.batch; ++b) {
    pages_of[b] = (cfg.seq_lens[b] + cfg.page_size - 1) / cfg.page_size;
    used += pages_of[b];
    h.bt_stride = std::max(h.bt_stride, pages_of[b]);
    h.first_key.push_back(keys);
    keys += cfg.seq_lens[b];
  }
  h.bt_stride += 1;  // a spare column
  h.num_pages = used + cfg.spare_pages;
  std::vector<std::int32_t> perm(static_cast<std::size_t>(h.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  h.indptr.assign(static_cast<std::size_t>(h.batch + 1), 0);
  h.block_table.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, h.batch * h.bt_stride)),
                       0);
  std::int64_t next = 0;
  for (std::int64_t b = 0; b < h.batch; ++b) {
    h.indptr[b + 1] = h.indptr[b] + static_cast<std::int32_t>(pages_of[b]);
    for (std::int64_t i = 0; i < pages_of[b]; ++i) {
      h.indices.push_back(perm[next]);
      h.block_table[b * h.bt_stride + i] = perm[next++];
    }
  }
  if (h.indices.empty()) h.indices.push_back(0);
  // the kit's problem: stored values of the keys, the queries rescaled to the real keys
  const float ckv_amp = attnstate::is_fp8(cfg.ckv_dtype) ? cfg.kv_amp : 1.f;
  const float kpe_amp = attnstate::is_fp8(cfg.kpe_dtype) ? cfg.kv_amp : 1.f;
  const float ckv_scale = attnstate::is_fp8(cfg.ckv_dtype) ? cfg.ckv_scale : 1.f;
  const float kpe_scale = attnstate::is_fp8(cfg.kpe_dtype) ? cfg.kpe_scale : 1.f;
  std::vector<float> ckv(static_cast<std::size_t>(keys * L)),
      kpe(static_cast<std::size_t>(keys * R));
  for (float& x : ckv) x = u(rng) * ckv_amp;
  for (float& x : kpe) x = u(rng) * kpe_amp;
  const float k_max = std::max(ckv_amp * ckv_scale, kpe_amp * kpe_scale);
  const float f = cfg.q_gain * std::min(1.f / k_max, 256.f);
  const std::int64_t rows = h.batch * cfg.q_len * cfg.heads;
  std::vector<float> qn(static_cast<std::size_t>(rows * L)), qp(static_cast<std::size_t>(rows * R));
  for (float& x : qn) x = u(rng) * f;
  for (float& x : qp) x = u(rng) * f;
  h.problem = attnstate::testing::make_mla_problem(
      h.tokens(), cfg.heads, L, R, keys, cfg.q_dtype, cfg.ckv_dtype, cfg.kpe_dtype, qn, qp, ckv,
      kpe, 1.f / std::sqrt(static_cast<float>(K)), DType::kF32, attnstate::LseBase::kNatural);
  h.problem.ckv_scale = ckv_scale;
  h.problem.kpe_scale = kpe_scale;
  // the query buffer (batch, q_len, heads, K): [q_nope, q_pe] per row, the stored values
  h.q.assign(static_cast<std::size_t>(std::max<std::int64_t>(1, rows * K)) *
                 attnstate::size_of(cfg.q_dtype),
             0);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t d = 0; d < L; ++d)
      mla_put(h.q.data(), cfg.q_dtype, r * K + d, h.problem.q_nope.get(r * L + d));
    for (std::int64_t d = 0; d < R; ++d)
      mla_put(h.q.data(), cfg.q_dtype, r * K + L + d, h.problem.q_pe.get(r * R + d));
  }
  // the pools, unused slots NaN: two dense pools, and one interleaved pool
  const auto szc = static_cast<std::int64_t>(attnstate::size_of(cfg.ckv_dtype));
  const auto szk = static_cast<std::int64_t>(attnstate::size_of(cfg.kpe_dtype));
  h.row_bytes = L * szc + R * szk;
  const std::int64_t slots = std::max<std::int64_t>(1, h.num_pages) * cfg.page_size;
  h.ckv.assign(static_cast<std::size_t>(slots * L * szc), 0);
  h.kpe.assign(static_cast<std::size_t>(slots * R * szk), 0);
  h.pool.assign(static_cast<std::size_t>(slots * h.row_bytes), 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t s = 0; s < slots; ++s) {
    for (std::int64_t d = 0; d < L; ++d) {
      mla_put(h.ckv.data(), cfg.ckv_dtype, s * L + d, nan);
      mla_put(h.pool.data() + s * h.row_bytes, cfg.ckv_dtype, d, nan);
    }
    for (std::int64_t d = 0; d < R; ++d) {
      mla_put(h.kpe.data(), cfg.kpe_dtype, s * R + d, nan);
      mla_put(h.pool.data() + s * h.row_bytes + L * szc, cfg.kpe_dtype, d, nan);
    }
  }
  for (std::int64_t b = 0; b < h.batch; ++b)
    for (std::int64_t t = 0; t < cfg.seq_lens[b]; ++t) {
      const std::int64_t slot = h.page(b, t / cfg.page_size) * cfg.page_size + t % cfg.page_size;
      const std::int64_t key = h.first_key[b] + t;
      for (std::int64_t d = 0; d < L; ++d) {
        const float x = h.problem.ckv.get(key * L + d);
        mla_put(h.ckv.data(), cfg.ckv_dtype, slot * L + d, x);
        mla_put(h.pool.data() + slot * h.row_bytes, cfg.ckv_dtype, d, x);
      }
      for (std::int64_t d = 0; d < R; ++d) {
        const float x = h.problem.kpe.get(key * R + d);
        mla_put(h.kpe.data(), cfg.kpe_dtype, slot * R + d, x);
        mla_put(h.pool.data() + slot * h.row_bytes + L * szc, cfg.kpe_dtype, d, x);
      }
    }
  return h;
}

}  // namespace attnstate_test
