/// @file mla.cpp
/// @brief CPU MLA decode: per (request, split, tile of query rows) an attention state with
///        `math::OnlineSoftmax` over blocks of 16 latent tokens (keys `[ckv, kpe]` loaded once per
///        block and used by every row of the tile, fp8 parts dequantised on load; values the
///        `ckv` columns of the same rows), then the ordered max-subtracted merge of a request's
///        splits (and of the attention sinks, once, when there are some), as `cpu::decode`.
#include "attnstate/cpu/mla.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnstate/core/variant.hpp"
#include "common/decode_validate.hpp"
#include "common/mla_validate.hpp"
#include "cpu/mla_rows.hpp"
#include "cpu/page_table.hpp"
#include "cpu/parallel.hpp"
#include "cpu/producer_rows.hpp"
#include "cpu/scratch.hpp"
#include "cpu/sinks.hpp"

namespace attnstate {
namespace cpu {
namespace {

using detail::merge_split_row;
using detail::page_id;
using detail::store_final_row;

constexpr const char* kFn = "attnstate::cpu::mla_decode";

/// Query rows `(q_len × heads)` per task: a tile's rows share each key block's load (all heads
/// of a request read the same latent tokens), and a request's many heads still spread over the
/// threads.
constexpr std::int64_t kRowTile = 64;

/// The states of rows `[r0, r1)` (row `r` = new token `r / heads`, head `r % heads`) of request
/// `b` over the keys of `range`, written normalised (fp32 `o` of `kv_lora_rank` values, base-2
/// LSE) to `po` / `plse` at row `r - r0`. Row `qi` is at position `len - q_len + qi` and sees the
/// keys of the range up to it. The fp8 parts are read with the scales `ckv_scale`, `kpe_scale`.
void split_states(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                  float ckv_scale, float kpe_scale, std::int64_t b, TokenRange range,
                  std::int32_t len, const math::ScoreMap& score, std::int64_t r0, std::int64_t r1,
                  float* po, float* plse) {
  const std::int64_t q_len = q_nope.shape[1];
  const std::int64_t heads = q_nope.shape[2];
  const std::int64_t K = kv.key_dim();
  const std::int64_t rows = r1 - r0;
  std::vector<float> qrows(static_cast<std::size_t>(rows * K));
  std::vector<std::int64_t> row_end(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t qi = (r0 + i) / heads;
    detail::load_mla_query(q_nope, q_pe, kv, b, qi, (r0 + i) % heads, &qrows[i * K]);
    // causal among the new tokens: row qi sees keys [0, len - q_len + qi]
    row_end[i] = std::min<std::int64_t>(range.end, static_cast<std::int64_t>(len) - q_len + qi + 1);
  }
  detail::mla_row_states(
      kv, ckv_scale, kpe_scale, qrows.data(), row_end.data(), rows, range.begin,
      [&](std::int64_t t) { return page_id(kv, b, t / kv.page_size); }, score, po, plse);
}

/// The decode of a split layout, every argument checked before anything is read.
void mla_layout(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                const SplitLayout& splits, float scale, const AttentionSinks& sinks,
                StateView out) {
  attnstate::detail::validate_mla_args(kFn, q_nope, q_pe, kv, out, MemorySpace::kHost);
  attnstate::detail::validate_split_layout(kFn, splits);
  scale = attnstate::detail::resolve_scale(kFn, "scale", scale, kv.key_dim());
  if (kv.batch > 0) detail::validate_tables(kFn, kv);
  const std::vector<float> sink = detail::check_sinks(kFn, sinks, q_nope.shape[2], out);

  const std::int64_t batch = kv.batch;
  const std::int64_t q_len = q_nope.shape[1];
  const std::int64_t heads = q_nope.shape[2];
  const std::int64_t L = kv.kv_lora_rank;
  const std::int64_t rows = q_len * heads;
  const std::int64_t S = splits.max_splits;
  const std::int64_t tiles = (rows + kRowTile - 1) / kRowTile;
  const math::ScoreMap score = math::make_score_map(scale, 0.f);
  // the scales, read once (the values the checks saw are the values used)
  const bool reads = batch > 0;
  const float ckv_scale = reads && is_fp8(kv.ckv_dtype) ? kv.ckv_scale.at(0) : 1.f;
  const float kpe_scale = reads && is_fp8(kv.kpe_dtype) ? kv.kpe_scale.at(0) : 1.f;

  // Partial states: [batch][split][rows] (o: × L), fp32, base-2 LSE.
  std::vector<float> po = detail::scratch_floats(kFn, {batch, S, rows, L});
  std::vector<float> plse = detail::scratch_floats(kFn, {batch, S, rows});
  detail::parallel_for(0, batch * S * tiles, 1, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t tile = t % tiles;
      const std::int64_t s = (t / tiles) % S;
      const std::int64_t b = t / (tiles * S);
      const std::int32_t len = kv.seq_lens[b];
      if (s >= splits.splits_for(len)) continue;
      const TokenRange range = splits.range(len, static_cast<std::int32_t>(s));
      const std::int64_t r0 = tile * kRowTile;
      const std::int64_t r1 = std::min(rows, r0 + kRowTile);
      const std::int64_t first = (b * S + s) * rows + r0;
      split_states(q_nope, q_pe, kv, ckv_scale, kpe_scale, b, range, len, score, r0, r1,
                   &po[first * L], &plse[first]);
    }
  });

  // Merge the splits of each (request, row) in split order; write in out's dtype and base.
  detail::parallel_for(0, batch * tiles, 1, [&](std::int64_t t0, std::int64_t t1) {
    std::vector<float> acc(static_cast<std::size_t>(L));
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t tile = t % tiles;
      const std::int64_t b = t / tiles;
      const std::int32_t n = splits.splits_for(kv.seq_lens[b]);
      for (std::int64_t r = tile * kRowTile; r < std::min(rows, (tile + 1) * kRowTile); ++r) {
        const std::int64_t base = b * S * rows + r;  // split s at base + s · rows
        const float lse2 = merge_split_row(&po[base * L], &plse[base], n, rows, L, acc.data());
        store_final_row(out, b * q_len + r / heads, r % heads, lse2, sink, acc.data());
      }
    }
  });
}

}  // namespace

void mla_decode(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                const SplitLayout& splits, float scale, StateView out) {
  mla_layout(q_nope, q_pe, kv, splits, scale, AttentionSinks{}, out);
}

void mla_decode(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                const SplitLayout& splits, float scale, const AttentionSinks& sinks,
                StateView out) {
  mla_layout(q_nope, q_pe, kv, splits, scale, sinks, out);
}

void mla_decode(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                const DecodeOptions& options, StateView out) {
  mla_decode(q_nope, q_pe, kv, options, AttentionSinks{}, out);
}

void mla_decode(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                const DecodeOptions& options, const AttentionSinks& sinks, StateView out) {
  attnstate::detail::validate_mla_args(kFn, q_nope, q_pe, kv, out, MemorySpace::kHost);
  const float scale =
      attnstate::detail::resolve_scale(kFn, "options.scale", options.scale, kv.key_dim());
  if (!options.variant.is_plain())
    attnstate::detail::throw_argument(
        kFn, "options.variant", "plain attention (the MLA decode takes no window or soft cap)",
        "window_left " + std::to_string(options.variant.window_left) + ", logits_soft_cap " +
            std::to_string(options.variant.logits_soft_cap),
        Status::kNotSupported);
  if (kv.batch > 0) detail::validate_tables(kFn, kv);
  detail::check_sinks(kFn, sinks, q_nope.shape[2], out);
  DecodeProblem p;
  p.batch = kv.batch;
  p.q_len = q_nope.shape[1];
  p.heads_q = q_nope.shape[2];
  p.heads_kv = 1;
  p.head_dim = kv.key_dim();
  p.q_dtype = q_nope.dtype;
  p.kv_dtype = kv.ckv_dtype;
  const SplitLayout layout = plan_split_layout(p, kv.seq_lens, options, detail::pool_threads(),
                                               (p.q_len * p.heads_q + kRowTile - 1) / kRowTile, kFn,
                                               "kv.seq_lens", "options");
  mla_layout(q_nope, q_pe, kv, layout, scale, sinks, out);
}

}  // namespace cpu
}  // namespace attnstate
