/// @file mla_cascade_problem.hpp
/// @brief Random MLA cascades in host memory: levels of segments (each shared by a run of
///        requests) over one paged latent pool, the same keys laid out as a plain paged decode
///        cache (each request's segments concatenated in level order: what the cascade must
///        equal), the queries, and the kit's double reference of each row over the keys it sees.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/testing/mla.hpp"
#include "mla_problem.hpp"

namespace attnstate_test {

/// A segment of a level: the number of (consecutive) requests that share it and its tokens.
struct MlaSegment {
  std::int32_t requests = 1;
  std::int32_t tokens = 0;
};

/// Shape of a random MLA cascade: `mla` gives the query length, heads, widths, page size,
/// dtypes and fp8 amplitudes and scales (its `seq_lens` and `block_table` are not used); each
/// level lists its segments, whose request counts must add up to the same batch.
struct MlaCascadeConfig {
  MlaConfig mla;
  std::vector<std::vector<MlaSegment>> levels;
  bool causal = true;

  std::string name() const {
    std::string s = mla.name() + (causal ? " causal" : " non-causal") + " levels:";
    for (const auto& lv : levels) {
      s += " [";
      for (const MlaSegment& g : lv)
        s += std::to_string(g.requests) + "x" + std::to_string(g.tokens) + " ";
      s += "]";
    }
    return s;
  }
};

/// A paged MLA cascade and the equivalent decode problem.
struct MlaCascadeHost {
  /// One level's host arrays (`CascadeLevel`).
  struct LevelArrays {
    std::vector<std::int32_t> request_indptr, page_indptr, page_indices, seg_lens;
  };

  MlaCascadeConfig cfg;
  std::int64_t batch = 0;
  MlaHost keys;  ///< Queries and every segment's tokens (as its `problem`, level after level).
  std::int64_t num_pages = 0;
  std::vector<unsigned char> ckv, kpe;  ///< The cascade's pool (two dense pools, NaN unused).
  std::vector<LevelArrays> arrays;
  std::vector<std::vector<std::int64_t>> request_keys;  ///< Each request's keys, level order.
  // the same keys as a decode cache: request b's concatenated keys in its own pages (CSR)
  std::int64_t cat_pages = 0;
  std::vector<unsigned char> cat_ckv, cat_kpe;
  std::vector<std::int32_t> cat_indptr, cat_indices, cat_lens;

  std::int64_t tokens() const { return batch * cfg.mla.q_len; }
  const attnstate::testing::MlaProblem& problem() const { return keys.problem; }

  /// The levels over the host arrays.
  std::vector<attnstate::CascadeLevel> levels() const {
    std::vector<attnstate::CascadeLevel> v;
    for (const LevelArrays& a : arrays) {
      attnstate::CascadeLevel lv;
      lv.num_segments = static_cast<std::int64_t>(a.seg_lens.size());
      lv.request_indptr = a.request_indptr.data();
      lv.page_indptr = a.page_indptr.data();
      lv.page_indices = a.page_indices.data();
      lv.seg_lens = a.seg_lens.data();
      v.push_back(lv);
    }
    return v;
  }

  /// The cascade's pool (no page table: the levels hold the pages).
  attnstate::MlaKvCache pool_view() const {
    attnstate::MlaKvCache kv = keys.kv_view();
    kv.ckv = ckv.data();
    kv.kpe = kpe.data();
    kv.num_pages = num_pages;
    kv.page_indptr = kv.page_indices = kv.block_table = nullptr;
    kv.block_table_stride = 0;
    kv.seq_lens = nullptr;
    kv.batch = 0;
    return kv;
  }

  /// The decode cache of the concatenated keys (CSR, `batch` requests).
  attnstate::MlaKvCache concat_view() const {
    attnstate::MlaKvCache kv = pool_view();
    kv.ckv = cat_ckv.data();
    kv.kpe = cat_kpe.data();
    kv.num_pages = cat_pages;
    kv.page_indptr = cat_indptr.data();
    kv.page_indices = cat_indices.data();
    kv.seq_lens = cat_lens.data();
    kv.batch = batch;
    return kv;
  }

  /// The keys row `b·q_len + i` sees: with `causal`, the first `total − q_len + i + 1` of its
  /// request's keys; without, all of them.
  std::vector<std::vector<std::int64_t>> keys_per_token() const {
    std::vector<std::vector<std::int64_t>> out;
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t i = 0; i < cfg.mla.q_len; ++i) {
        const auto& all = request_keys[static_cast<std::size_t>(b)];
        const std::int64_t total = static_cast<std::int64_t>(all.size());
        const std::int64_t n =
            cfg.causal ? std::max<std::int64_t>(0, total - cfg.mla.q_len + i + 1) : total;
        out.emplace_back(all.begin(), all.begin() + n);
      }
    return out;
  }

  /// The kit's double reference (with the problem's sinks, if any), LSEs in `base`.
  attnstate::testing::ReferenceState reference(attnstate::LseBase base) const {
    return attnstate::testing::reference_mla_state_per_token(keys.problem, keys_per_token(), base);
  }
};

/// Writes key `key` of `h.keys.problem` to slot `slot` (in token rows) of the pools `c`, `k`.
inline void mla_place_key(const MlaHost& h, std::vector<unsigned char>& c,
                          std::vector<unsigned char>& k, std::int64_t slot, std::int64_t key) {
  const std::int64_t L = h.cfg.kv_lora_rank, R = h.cfg.rope_dim;
  for (std::int64_t d = 0; d < L; ++d)
    mla_put(c.data(), h.cfg.ckv_dtype, slot * L + d, h.problem.ckv.get(key * L + d));
  for (std::int64_t d = 0; d < R; ++d)
    mla_put(k.data(), h.cfg.kpe_dtype, slot * R + d, h.problem.kpe.get(key * R + d));
}

/// Two dense pools of `pages` pages of `h`'s shape, every element NaN.
inline void mla_nan_pools(const MlaHost& h, std::int64_t pages, std::vector<unsigned char>& c,
                          std::vector<unsigned char>& k) {
  const std::int64_t L = h.cfg.kv_lora_rank, R = h.cfg.rope_dim;
  const std::int64_t slots = std::max<std::int64_t>(1, pages) * h.cfg.page_size;
  c.assign(static_cast<std::size_t>(slots * L) * attnstate::size_of(h.cfg.ckv_dtype), 0);
  k.assign(static_cast<std::size_t>(slots * R) * attnstate::size_of(h.cfg.kpe_dtype), 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t i = 0; i < slots * L; ++i) mla_put(c.data(), h.cfg.ckv_dtype, i, nan);
  for (std::int64_t i = 0; i < slots * R; ++i) mla_put(k.data(), h.cfg.kpe_dtype, i, nan);
}

/// Builds a random cascade: the queries and token values of `make_mla_host` (every segment's
/// tokens one after the other, level by level), each segment in its own shuffled pages of one
/// pool (`mla.spare_pages` unused pages; every unused slot NaN), and the decode cache of the
/// concatenated keys.
inline MlaCascadeHost make_mla_cascade_host(const MlaCascadeConfig& cfg, std::uint64_t seed) {
  MlaCascadeHost h;
  h.cfg = cfg;
  const std::int64_t P = cfg.mla.page_size;
  std::int64_t unique = 0, pages = 0;
  for (const auto& lv : cfg.levels) {
    std::int64_t b = 0;
    for (const MlaSegment& g : lv) {
      b += g.requests;
      unique += g.tokens;
      pages += (g.tokens + P - 1) / P;
    }
    h.batch = b;  // every level serves the same batch (the library checks it)
  }
  // the values: one request holding every unique token, the others none (batch query rows)
  MlaConfig kc = cfg.mla;
  kc.block_table = false;
  kc.seq_lens.assign(static_cast<std::size_t>(h.batch), 0);
  if (h.batch > 0) kc.seq_lens[0] = static_cast<std::int32_t>(unique);
  h.keys = make_mla_host(kc, seed);
  h.num_pages = pages + cfg.mla.spare_pages;
  mla_nan_pools(h.keys, h.num_pages, h.ckv, h.kpe);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::vector<std::int32_t> perm(static_cast<std::size_t>(h.num_pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  h.request_keys.assign(static_cast<std::size_t>(h.batch), {});
  std::int64_t next_page = 0, next_key = 0;
  for (const auto& lv : cfg.levels) {
    MlaCascadeHost::LevelArrays a;
    a.request_indptr.push_back(0);
    a.page_indptr.push_back(0);
    for (const MlaSegment& g : lv) {
      const std::int32_t r0 = a.request_indptr.back();
      a.request_indptr.push_back(r0 + g.requests);
      const std::int64_t np = (g.tokens + P - 1) / P;
      a.page_indptr.push_back(a.page_indptr.back() + static_cast<std::int32_t>(np));
      for (std::int64_t p = 0; p < np; ++p) a.page_indices.push_back(perm[next_page++]);
      a.seg_lens.push_back(g.tokens);
      const std::int32_t* seg_pages =
          a.page_indices.data() + a.page_indptr[a.page_indptr.size() - 2];
      for (std::int64_t t = 0; t < g.tokens; ++t)
        mla_place_key(h.keys, h.ckv, h.kpe, seg_pages[t / P] * P + t % P, next_key + t);
      for (std::int32_t b = r0; b < r0 + g.requests; ++b)
        for (std::int64_t t = 0; t < g.tokens; ++t)
          h.request_keys[static_cast<std::size_t>(b)].push_back(next_key + t);
      next_key += g.tokens;
    }
    if (a.page_indices.empty()) a.page_indices.push_back(0);
    h.arrays.push_back(std::move(a));
  }
  // the decode cache: request b's keys in pages of its own, in order
  h.cat_indptr.push_back(0);
  for (std::int64_t b = 0; b < h.batch; ++b) {
    const std::int64_t n = static_cast<std::int64_t>(h.request_keys[b].size());
    h.cat_lens.push_back(static_cast<std::int32_t>(n));
    h.cat_indptr.push_back(h.cat_indptr.back() + static_cast<std::int32_t>((n + P - 1) / P));
  }
  h.cat_pages = h.cat_indptr.back() + 1;
  mla_nan_pools(h.keys, h.cat_pages, h.cat_ckv, h.cat_kpe);
  for (std::int32_t p = 0; p < h.cat_indptr.back(); ++p) h.cat_indices.push_back(p);
  if (h.cat_indices.empty()) h.cat_indices.push_back(0);
  for (std::int64_t b = 0; b < h.batch; ++b)
    for (std::int64_t t = 0; t < h.cat_lens[b]; ++t)
      mla_place_key(h.keys, h.cat_ckv, h.cat_kpe, h.cat_indptr[b] * P + t,
                    h.request_keys[b][static_cast<std::size_t>(t)]);
  return h;
}

}  // namespace attnstate_test
