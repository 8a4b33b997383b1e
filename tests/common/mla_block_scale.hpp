/// @file mla_block_scale.hpp
/// @brief Random MLA decode problems over FlashMLA's fp8 cache rows, in host memory: one pool of
///        rows `[e4m3 latent (rank), fp32 block scales (rank / block_cols), bf16 rope (rope)]`
///        (656 bytes at 512 / 128 / 64), bf16 queries, a block table, and an independent
///        double-precision reference of every row (its own e4m3 and bf16 decoding), optionally
///        with the block scales of the wrong block (so a test can show that a wrong block index
///        would fail).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/testing/host_state.hpp"

namespace attnstate_test {

/// The real value of e4m3 bits (decoded here, apart from the library's tables).
inline double e4m3_value(std::uint8_t b) {
  const int sign = (b >> 7) != 0 ? -1 : 1;
  const int e = (b >> 3) & 15;
  const int m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return sign * mag;
}

/// The real value of bf16 bits.
inline double bf16_value(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// The nearest bf16 (ties to even) of a finite double, as a double (what the CUDA kernels' fp8
/// conversion gives for a scaled value: fp32 product, then bf16).
inline double round_bf16(double x) {
  float f = static_cast<float>(x);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

/// Shape of a random FlashMLA fp8 problem.
struct BlockScaleConfig {
  std::int64_t q_len = 1;
  std::int64_t heads = 16;
  std::int64_t kv_lora_rank = 512;
  std::int64_t rope_dim = 64;
  std::int64_t block_cols = 128;
  std::int64_t page_size = 64;
  std::vector<std::int32_t> seq_lens;
};

/// A FlashMLA fp8 cache with queries and a block table (host memory).
struct BlockScaleHost {
  BlockScaleConfig cfg;
  std::int64_t batch = 0;
  std::int64_t num_pages = 0;
  std::int64_t row_bytes = 0;       ///< Bytes of a token row (656 at 512 / 128 / 64).
  std::int64_t blocks = 0;          ///< Block scales a token.
  std::int64_t table_stride = 0;    ///< Columns of the block table.
  std::vector<unsigned char> pool;  ///< `(num_pages, page_size, row_bytes)`, 16-byte aligned.
  std::vector<std::int32_t> block_table;
  std::vector<std::uint16_t> q_nope, q_pe;  ///< bf16 bits `(batch, q_len, heads, width)`.
  float scale = 0.f;                        ///< Softmax scale.

  std::int64_t tokens() const { return batch * cfg.q_len; }
  std::int64_t scale_offset() const { return cfg.kv_lora_rank; }  ///< Bytes into a row.
  std::int64_t rope_offset() const { return cfg.kv_lora_rank + 4 * blocks; }

  /// The cache as views of the pool at `base` (a copy of `pool` in `space`), its tables at
  /// `lens` and `table`: ckv the e4m3 values, kpe the bf16 rope, ckv_block_scale the scales,
  /// all with the row's stride.
  attnstate::MlaKvCache view(const unsigned char* base, const std::int32_t* lens,
                             const std::int32_t* table,
                             attnstate::MemorySpace space = attnstate::MemorySpace::kHost) const {
    attnstate::MlaKvCache kv;
    kv.ckv = base;
    kv.kpe = base + rope_offset();
    kv.ckv_dtype = attnstate::DType::kE4M3;
    kv.kpe_dtype = attnstate::DType::kBF16;
    kv.kv_lora_rank = cfg.kv_lora_rank;
    kv.rope_dim = cfg.rope_dim;
    kv.num_pages = num_pages;
    kv.page_size = cfg.page_size;
    kv.ckv_token_stride = row_bytes;
    kv.ckv_page_stride = cfg.page_size * row_bytes;
    kv.kpe_token_stride = row_bytes / 2;
    kv.kpe_page_stride = cfg.page_size * row_bytes / 2;
    kv.ckv_block_scale.data = reinterpret_cast<const float*>(base + scale_offset());
    kv.ckv_block_scale.block_cols = cfg.block_cols;
    kv.ckv_block_scale.token_stride = row_bytes / 4;
    kv.ckv_block_scale.page_stride = cfg.page_size * row_bytes / 4;
    kv.block_table = table;
    kv.block_table_stride = table_stride;
    kv.seq_lens = lens;
    kv.batch = batch;
    kv.space = space;
    return kv;
  }
  attnstate::MlaKvCache view() const {
    return view(pool.data(), cfg.seq_lens.data(), block_table.data());
  }

  /// Query view of `data` (bf16 `(batch, q_len, heads, width)`) in `space`.
  attnstate::ConstTensorView query(const void* data, std::int64_t width,
                                   attnstate::MemorySpace space) const {
    attnstate::ConstTensorView v = attnstate::make_tensor_view(
        data, attnstate::DType::kBF16, {batch, cfg.q_len, cfg.heads, width});
    v.space = space;
    return v;
  }

  /// Token `t` of request `b`: its row in the pool.
  const unsigned char* row(std::int64_t b, std::int64_t t) const {
    const std::int64_t page =
        block_table[static_cast<std::size_t>(b * table_stride + t / cfg.page_size)];
    return pool.data() + (page * cfg.page_size + t % cfg.page_size) * row_bytes;
  }

  /// Scale of block `blk` of a token row.
  static float row_scale(const unsigned char* r, std::int64_t offset, std::int64_t blk) {
    float s;
    std::memcpy(&s, r + offset + 4 * blk, 4);
    return s;
  }

  /// The double-precision state of every row `(b·q_len + i, h)`: `o` `(tokens, heads, rank)` and
  /// natural-base `lse` `(tokens, heads)`. Row `i` of request `b` sees its keys
  /// `[0, len − q_len + i]`; a row with none is `(0, -inf)`. A latent value is
  /// `e4m3(stored) × scale[(d / block_cols + block_shift) % blocks]` (`block_shift` 0: the right
  /// block), rounded to bf16 when `bf16_values` (the CUDA kernels' converted tiles).
  void reference(std::vector<double>& o, std::vector<double>& lse, std::int64_t block_shift = 0,
                 bool bf16_values = false) const {
    const std::int64_t L = cfg.kv_lora_rank, R = cfg.rope_dim, H = cfg.heads, Q = cfg.q_len;
    o.assign(static_cast<std::size_t>(tokens() * H * L), 0.0);
    lse.assign(static_cast<std::size_t>(tokens() * H), -std::numeric_limits<double>::infinity());
    std::vector<double> v, k;
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t len = cfg.seq_lens[static_cast<std::size_t>(b)];
      v.assign(static_cast<std::size_t>(len * L), 0.0);
      k.assign(static_cast<std::size_t>(len * R), 0.0);
      for (std::int64_t t = 0; t < len; ++t) {
        const unsigned char* r = row(b, t);
        for (std::int64_t d = 0; d < L; ++d) {
          const std::int64_t blk = (d / cfg.block_cols + block_shift) % blocks;
          double x = e4m3_value(r[d]) * static_cast<double>(row_scale(r, scale_offset(), blk));
          if (bf16_values) x = round_bf16(x);
          v[static_cast<std::size_t>(t * L + d)] = x;
        }
        for (std::int64_t d = 0; d < R; ++d) {
          std::uint16_t bits;
          std::memcpy(&bits, r + rope_offset() + 2 * d, 2);
          k[static_cast<std::size_t>(t * R + d)] = bf16_value(bits);
        }
      }
      for (std::int64_t i = 0; i < Q; ++i)
        for (std::int64_t h = 0; h < H; ++h) {
          const std::int64_t n = std::max<std::int64_t>(0, len - Q + i + 1);
          if (n == 0) continue;
          const std::size_t qi = static_cast<std::size_t>(((b * Q + i) * H + h));
          std::vector<double> s(static_cast<std::size_t>(n));
          double m = -std::numeric_limits<double>::infinity();
          for (std::int64_t t = 0; t < n; ++t) {
            double acc = 0.0;
            for (std::int64_t d = 0; d < L; ++d)
              acc += bf16_value(q_nope[qi * L + d]) * v[static_cast<std::size_t>(t * L + d)];
            for (std::int64_t d = 0; d < R; ++d)
              acc += bf16_value(q_pe[qi * R + d]) * k[static_cast<std::size_t>(t * R + d)];
            s[static_cast<std::size_t>(t)] = acc * scale;
            m = std::max(m, s[static_cast<std::size_t>(t)]);
          }
          double sum = 0.0;
          for (double& x : s) sum += (x = std::exp(x - m));
          double* orow = &o[qi * L];
          for (std::int64_t t = 0; t < n; ++t)
            for (std::int64_t d = 0; d < L; ++d)
              orow[d] +=
                  s[static_cast<std::size_t>(t)] / sum * v[static_cast<std::size_t>(t * L + d)];
          lse[qi] = m + std::log(sum);
        }
    }
  }
};

/// A random FlashMLA fp8 problem of `cfg` (seed `seed`): e4m3 latent values in (-4, 4), each
/// token's block scales drawn apart (2^-3 to 2^2 times 1..2, so blocks differ), bf16 rope and
/// queries, pages shuffled in a block table with spare columns; slots past a request's length
/// hold NaN (e4m3 0x7f, NaN scales and rope) so that a read of them shows.
inline BlockScaleHost make_block_scale_host(const BlockScaleConfig& cfg, std::uint64_t seed) {
  BlockScaleHost h;
  h.cfg = cfg;
  h.batch = static_cast<std::int64_t>(cfg.seq_lens.size());
  const std::int64_t L = cfg.kv_lora_rank, R = cfg.rope_dim, P = cfg.page_size;
  h.blocks = L / cfg.block_cols;
  h.row_bytes = L + 4 * h.blocks + 2 * R;
  std::mt19937_64 rng(seed);
  std::int64_t need = 0, most = 0;
  for (std::int32_t len : cfg.seq_lens) {
    need += (len + P - 1) / P;
    most = std::max<std::int64_t>(most, (len + P - 1) / P);
  }
  h.num_pages = need + 2;
  h.table_stride = most + 1;
  std::vector<std::int32_t> ids(static_cast<std::size_t>(h.num_pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  h.block_table.assign(static_cast<std::size_t>(h.batch * h.table_stride), ids.back());
  std::size_t next = 0;
  for (std::int64_t b = 0; b < h.batch; ++b)
    for (std::int64_t j = 0; j < (cfg.seq_lens[static_cast<std::size_t>(b)] + P - 1) / P; ++j)
      h.block_table[static_cast<std::size_t>(b * h.table_stride + j)] = ids[next++];
  // every row NaN, then the requests' tokens drawn
  h.pool.assign(static_cast<std::size_t>(h.num_pages * P * h.row_bytes), 0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::uint16_t nan_bf16 = 0x7fc0;
  for (std::int64_t s = 0; s < h.num_pages * P; ++s) {
    unsigned char* r = h.pool.data() + s * h.row_bytes;
    std::memset(r, 0x7f, static_cast<std::size_t>(L));
    for (std::int64_t j = 0; j < h.blocks; ++j) std::memcpy(r + L + 4 * j, &nan, 4);
    for (std::int64_t d = 0; d < R; ++d) std::memcpy(r + h.rope_offset() + 2 * d, &nan_bf16, 2);
  }
  std::uniform_int_distribution<int> bits(0, 255), exps(-3, 1), small(-48, 48);
  std::uniform_real_distribution<float> frac(1.f, 2.f);
  const auto bf16_of = [&](int k) {  // k / 32: exact in bf16
    const float f = static_cast<float>(k) / 32.f;
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<std::uint16_t>(u >> 16);
  };
  for (std::int64_t b = 0; b < h.batch; ++b)
    for (std::int64_t t = 0; t < cfg.seq_lens[static_cast<std::size_t>(b)]; ++t) {
      unsigned char* r = const_cast<unsigned char*>(h.row(b, t));
      for (std::int64_t d = 0; d < L; ++d) {
        // exponent field 0..8 (|x| < 4): no NaN, subnormals included
        const int e = bits(rng) % 9;
        r[d] = static_cast<unsigned char>((bits(rng) & 0x87) | (e << 3));
      }
      for (std::int64_t j = 0; j < h.blocks; ++j) {
        const float s = std::ldexp(frac(rng), exps(rng));
        std::memcpy(r + L + 4 * j, &s, 4);
      }
      for (std::int64_t d = 0; d < R; ++d) {
        const std::uint16_t x = bf16_of(small(rng));
        std::memcpy(r + h.rope_offset() + 2 * d, &x, 2);
      }
    }
  h.q_nope.resize(static_cast<std::size_t>(h.tokens() * cfg.heads * L));
  h.q_pe.resize(static_cast<std::size_t>(h.tokens() * cfg.heads * R));
  for (auto& x : h.q_nope) x = bf16_of(small(rng));
  for (auto& x : h.q_pe) x = bf16_of(small(rng));
  h.scale = 1.f / std::sqrt(static_cast<float>(L + R));
  return h;
}

/// Two cascade levels over a `BlockScaleHost`'s pool: a prefix of `pages` pages shared by every
/// request (one segment), then each request's own pages (one segment each).
struct BlockScaleLevels {
  std::vector<std::int32_t> ri0, pi0, ix0, len0;  // level 0
  std::vector<std::int32_t> ri1, pi1, ix1, len1;  // level 1

  std::vector<attnstate::CascadeLevel> levels() const {
    attnstate::CascadeLevel a{1, ri0.data(), pi0.data(), ix0.data(), len0.data()};
    attnstate::CascadeLevel b{static_cast<std::int64_t>(len1.size()), ri1.data(), pi1.data(),
                              ix1.data(), len1.data()};
    return {a, b};
  }
};

/// Makes every request of `h` read request 0's first `pages` pages as the first tokens of its
/// own (its block table rewritten: `h.reference` then sees the shared prefix) and returns the
/// two levels of that cascade. Each request must hold more than `pages` pages' tokens plus
/// `q_len − 1`.
inline BlockScaleLevels share_prefix(BlockScaleHost& h, std::int64_t pages) {
  BlockScaleLevels lv;
  const std::int64_t P = h.cfg.page_size;
  const auto batch = static_cast<std::int32_t>(h.batch);
  for (std::int64_t b = 1; b < h.batch; ++b)
    for (std::int64_t j = 0; j < pages; ++j)
      h.block_table[static_cast<std::size_t>(b * h.table_stride + j)] =
          h.block_table[static_cast<std::size_t>(j)];
  // the shared prefix's tokens are request 0's: copy nothing, the table points at them
  lv.ri0 = {0, batch};
  lv.pi0 = {0, static_cast<std::int32_t>(pages)};
  lv.ix0.assign(h.block_table.begin(), h.block_table.begin() + pages);
  lv.len0 = {static_cast<std::int32_t>(pages * P)};
  lv.ri1.push_back(0);
  lv.pi1.push_back(0);
  for (std::int64_t b = 0; b < h.batch; ++b) {
    const std::int64_t len = h.cfg.seq_lens[static_cast<std::size_t>(b)];
    const std::int64_t own = (len + P - 1) / P;
    for (std::int64_t j = pages; j < own; ++j)
      lv.ix1.push_back(h.block_table[static_cast<std::size_t>(b * h.table_stride + j)]);
    lv.ri1.push_back(static_cast<std::int32_t>(b + 1));
    lv.pi1.push_back(static_cast<std::int32_t>(lv.ix1.size()));
    lv.len1.push_back(static_cast<std::int32_t>(len - pages * P));
  }
  return lv;
}

/// The largest `|a − b| / (atol + rtol·|b|)` over `o` `(n)` floats against `ref`, and over the
/// LSEs (natural base) with `atol` alone; NaN counts as infinitely far.
inline double block_scale_error(const float* o, const double* ref, std::int64_t n, const float* lse,
                                const double* ref_lse, std::int64_t rows, double atol,
                                double rtol) {
  double worst = 0.0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double e =
        std::abs(static_cast<double>(o[i]) - ref[i]) / (atol + rtol * std::abs(ref[i]));
    worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(worst, e);
  }
  for (std::int64_t i = 0; i < rows; ++i) {
    if (std::isinf(ref_lse[i]) && static_cast<double>(lse[i]) == ref_lse[i]) continue;
    const double e = std::abs(static_cast<double>(lse[i]) - ref_lse[i]) / atol;
    worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(worst, e);
  }
  return worst;
}

/// The error of the state `out` (natural or base-2 LSEs, any dtype) of `h` against its double
/// reference (`block_shift`, `bf16_values` as for `BlockScaleHost::reference`), in tolerances
/// (`block_scale_error`).
inline double block_scale_state_error(const BlockScaleHost& h,
                                      const attnstate::testing::HostState& out, double atol,
                                      double rtol, std::int64_t block_shift = 0,
                                      bool bf16_values = false) {
  std::vector<double> o, lse;
  h.reference(o, lse, block_shift, bf16_values);
  const std::int64_t L = h.cfg.kv_lora_rank, H = h.cfg.heads;
  std::vector<float> got_o(o.size()), got_lse(lse.size());
  for (std::int64_t t = 0; t < h.tokens(); ++t)
    for (std::int64_t hd = 0; hd < H; ++hd) {
      const float l = out.lse(t, hd);
      got_lse[static_cast<std::size_t>(t * H + hd)] =
          out.base() == attnstate::LseBase::kBase2 ? l * 0.69314718f : l;
      for (std::int64_t d = 0; d < L; ++d)
        got_o[static_cast<std::size_t>((t * H + hd) * L + d)] = out.o(t, hd, d);
    }
  return block_scale_error(got_o.data(), o.data(), static_cast<std::int64_t>(o.size()),
                           got_lse.data(), lse.data(), static_cast<std::int64_t>(lse.size()), atol,
                           rtol);
}

}  // namespace attnstate_test
