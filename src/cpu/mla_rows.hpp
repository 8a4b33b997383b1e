/// @file mla_rows.hpp
/// @brief The row states of the CPU MLA producers (decode, cascade; internal): a row's query
///        `[q_nope, q_pe]` loaded as fp32, and the states of a tile of rows over a run of latent
///        tokens, each block of 16 tokens loaded (fp8 parts dequantised) once for every row.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/core/variant.hpp"
#include "cpu/producer_rows.hpp"

namespace attnstate {
namespace cpu {
namespace detail {

/// Loads query row `(b, qi, h)` of `q_nope` and `q_pe` as `kv_lora_rank + rope_dim` floats.
inline void load_mla_query(const ConstTensorView& q_nope, const ConstTensorView& q_pe,
                           const MlaKvCache& kv, std::int64_t b, std::int64_t qi, std::int64_t h,
                           float* dst) {
  load_row(q_nope.data, q_nope.dtype,
           b * q_nope.stride[0] + qi * q_nope.stride[1] + h * q_nope.stride[2], kv.kv_lora_rank,
           dst);
  load_row(q_pe.data, q_pe.dtype, b * q_pe.stride[0] + qi * q_pe.stride[1] + h * q_pe.stride[2],
           kv.rope_dim, dst + kv.kv_lora_rank);
}

/// Multiplies the latent values `row` (`kv_lora_rank` floats, read with scale 1) of token slot
/// `slot` of page `page` by their block scales (`kv.ckv_block_scale`), each product rounded once.
inline void scale_blocks(const MlaKvCache& kv, std::int64_t page, std::int64_t slot, float* row) {
  const float* s = kv.ckv_block_scale.data + kv.ckv_block_scale_offset(page, slot);
  const std::int64_t cols = kv.ckv_block_scale.block_cols;
  for (std::int64_t d = 0; d < kv.kv_lora_rank; ++d) row[d] *= s[d / cols];
}

/// The states of `rows` query rows (`qrows`: `rows × (kv_lora_rank + rope_dim)` fp32) over the
/// latent tokens `[begin, row_end[i])` of a run whose token `t` lives in page `page_of(t)` at
/// slot `t % page_size`, written normalised (fp32 `o` of `kv_lora_rank` values, base-2 LSE) to
/// `po` / `plse` at row `i`. A row that sees no token gets `(0, -inf)`. The fp8 parts are read
/// with the scales `ckv_scale`, `kpe_scale` (the latent part's by its block scales instead when
/// `kv.ckv_block_scale` is given: `ckv_scale` is then 1); keys are `[ckv, kpe]`, values `ckv`.
template <class PageOf>
void mla_row_states(const MlaKvCache& kv, float ckv_scale, float kpe_scale, const float* qrows,
                    const std::int64_t* row_end, std::int64_t rows, std::int64_t begin,
                    PageOf page_of, const math::ScoreMap& score, float* po, float* plse) {
  const std::int64_t L = kv.kv_lora_rank;
  const std::int64_t R = kv.rope_dim;
  const std::int64_t K = L + R;  // a key row: [ckv, kpe]
  std::vector<float> acc(static_cast<std::size_t>(rows * L), 0.f);
  std::vector<float> krows(static_cast<std::size_t>(kSplitGranularity * K));
  std::vector<math::OnlineSoftmax> os(static_cast<std::size_t>(rows));
  std::int64_t max_end = begin;
  for (std::int64_t i = 0; i < rows; ++i) max_end = std::max(max_end, row_end[i]);
  float s2[kSplitGranularity];
  for (std::int64_t t0 = begin; t0 < max_end; t0 += kSplitGranularity) {
    const std::int64_t nb = std::min<std::int64_t>(kSplitGranularity, max_end - t0);
    for (std::int64_t j = 0; j < nb; ++j) {
      const std::int64_t t = t0 + j;
      const std::int64_t page = page_of(t);
      const std::int64_t slot = t % kv.page_size;
      load_kv_row(kv.ckv, kv.ckv_dtype, ckv_scale, kv.ckv_offset(page, slot), L, &krows[j * K]);
      if (kv.ckv_block_scale.present()) scale_blocks(kv, page, slot, &krows[j * K]);
      load_kv_row(kv.kpe, kv.kpe_dtype, kpe_scale, kv.kpe_offset(page, slot), R, &krows[j * K + L]);
    }
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::int64_t n = std::min<std::int64_t>(nb, row_end[i] - t0);
      if (n <= 0) continue;
      // keys all K columns, values the first L of the same rows
      fold_key_block(os[i], &acc[i * L], &qrows[i * K], krows.data(), K, krows.data(), K, n, K, L,
                     score, s2);
    }
  }
  for (std::int64_t i = 0; i < rows; ++i) {
    const float inv = os[i].inv_sum();
    for (std::int64_t d = 0; d < L; ++d) po[i * L + d] = acc[i * L + d] * inv;
    plse[i] = os[i].lse(LseBase::kBase2);
  }
}

}  // namespace detail
}  // namespace cpu
}  // namespace attnstate
