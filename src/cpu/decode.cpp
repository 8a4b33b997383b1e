/// @file decode.cpp
/// @brief CPU split-KV decode: per (request, KV head, split) an attention state with
///        `math::OnlineSoftmax` (fp8 KV dequantised on load), then the ordered max-subtracted
///        merge of a request's splits (and of the attention sinks, once, when there are some).
#include "attnstate/cpu/decode.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/variant.hpp"
#include "common/decode_validate.hpp"
#include "cpu/page_table.hpp"
#include "cpu/parallel.hpp"
#include "cpu/producer_rows.hpp"
#include "cpu/scratch.hpp"
#include "cpu/sinks.hpp"

namespace attnstate {
namespace cpu {
namespace {

using attnstate::detail::decode_str;
using attnstate::detail::throw_argument;

using detail::fold_key_block;
using detail::HeadScales;
using detail::load_kv_row;
using detail::load_row;
using detail::merge_split_row;
using detail::page_id;
using detail::store_final_row;
using detail::validate_tables;

/// One split of one (request, KV head): the states of all `q_len × group` rows, written
/// normalised (fp32 `o`, base-2 `lse`) into `po` / `plse` at row `r` → offset `r·D` / `r`.
/// Query row `qi` is at position `p = len - q_len + qi` and sees the keys of the split inside
/// `[window_begin(p, window_left), p]`. An fp8 pool is read as `stored × scale` with the KV head's
/// scales of `scales`.
void split_states(const ConstTensorView& q, const PagedKvCache& kv, const HeadScales& scales,
                  std::int64_t b, std::int64_t hkv, TokenRange range, std::int32_t len,
                  const math::ScoreMap& score, std::int64_t window_left, float* po, float* plse) {
  const std::int64_t q_len = q.shape[1];
  const std::int64_t hq_n = q.shape[2];
  const std::int64_t group = hq_n / kv.heads_kv;
  const std::int64_t rows = q_len * group;
  const std::int64_t D = kv.head_dim;
  const std::int64_t page_elems = kv.page_elems();
  std::vector<float> qrows(static_cast<std::size_t>(rows * D));
  std::vector<float> acc(static_cast<std::size_t>(rows * D), 0.f);
  std::vector<float> krows(static_cast<std::size_t>(kSplitGranularity * D));
  std::vector<float> vrows(static_cast<std::size_t>(kSplitGranularity * D));
  std::vector<math::OnlineSoftmax> os(static_cast<std::size_t>(rows));
  std::vector<std::int64_t> row_begin(static_cast<std::size_t>(rows));
  std::vector<std::int64_t> row_end(static_cast<std::size_t>(rows));
  std::int64_t max_end = range.begin, min_begin = range.end;
  const float k_scale = scales.k_at(hkv);
  const float v_scale = scales.v_at(hkv);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t qi = r / group;
    const std::int64_t hq = hkv * group + r % group;
    load_row(q.data, q.dtype, b * q.stride[0] + qi * q.stride[1] + hq * q.stride[2], D,
             &qrows[r * D]);
    // Causal among the new tokens: row qi is at position p = len - q_len + qi and sees keys
    // [window_begin(p), p].
    const std::int64_t p = static_cast<std::int64_t>(len) - q_len + qi;
    row_end[r] = std::min<std::int64_t>(range.end, p + 1);
    row_begin[r] = std::max<std::int64_t>(range.begin, window_begin(p, window_left));
    if (row_begin[r] < row_end[r]) {
      max_end = std::max(max_end, row_end[r]);
      min_begin = std::min(min_begin, row_begin[r]);
    }
  }
  // Blocks of 16 keys on the split's grid (from the split start; with a window, from the block
  // of the earliest key any row sees), each converted once and used by every row; a row folds
  // only the keys of a block inside its own [begin, end).
  float s2[kSplitGranularity];
  const std::int64_t first =
      min_begin >= max_end
          ? max_end
          : range.begin + (min_begin - range.begin) / kSplitGranularity * kSplitGranularity;
  for (std::int64_t t0 = first; t0 < max_end; t0 += kSplitGranularity) {
    const std::int64_t nb = std::min<std::int64_t>(kSplitGranularity, max_end - t0);
    for (std::int64_t j = 0; j < nb; ++j) {
      const std::int64_t t = t0 + j;
      const std::int64_t off =
          page_id(kv, b, t / kv.page_size) * page_elems + kv.in_page_offset(t % kv.page_size, hkv);
      load_kv_row(kv.k, kv.dtype, k_scale, off, D, &krows[j * D]);
      load_kv_row(kv.v, kv.dtype, v_scale, off, D, &vrows[j * D]);
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t j0 = std::max<std::int64_t>(0, row_begin[r] - t0);
      const std::int64_t j1 = std::min<std::int64_t>(nb, row_end[r] - t0);
      if (j1 <= j0) continue;
      fold_key_block(os[r], &acc[r * D], &qrows[r * D], &krows[j0 * D], &vrows[j0 * D], j1 - j0, D,
                     score, s2);
    }
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const float inv = os[r].inv_sum();
    for (std::int64_t d = 0; d < D; ++d) po[r * D + d] = acc[r * D + d] * inv;
    plse[r] = os[r].lse(LseBase::kBase2);
  }
}

/// True when some row of a request of length `len` sees a key of `range`: the rows' windows
/// `[window_begin(p), p]` for `p = len - q_len .. len - 1` cover `[window_begin(len - q_len),
/// len)` without gaps (consecutive positions, windows of at least one key).
bool split_in_window(TokenRange range, std::int32_t len, std::int64_t q_len,
                     std::int64_t window_left) {
  if (range.begin >= range.end) return false;
  const std::int64_t lo = window_begin(static_cast<std::int64_t>(len) - q_len, window_left);
  return range.end > lo && range.begin < len;
}

/// Writes the empty state `(0, -inf)` of `rows` rows (a split no row's window reaches).
void empty_states(std::int64_t rows, std::int64_t D, float* po, float* plse) {
  std::fill(po, po + rows * D, 0.f);
  std::fill(plse, plse + rows, math::neg_inf());
}

/// The decode of a split layout (every argument checked here), with the sinks applied in the
/// final merge of each row when `sinks` is not `none()`.
void decode_layout(const ConstTensorView& q, const PagedKvCache& kv, const SplitLayout& splits,
                   float scale, const AttentionVariant& variant, const AttentionSinks& sinks,
                   StateView out) {
  const char* fn = "attnstate::cpu::decode";
  attnstate::detail::validate_decode_args(fn, q, kv, out, MemorySpace::kHost);
  attnstate::detail::validate_split_layout(fn, splits);
  scale = attnstate::detail::resolve_scale(fn, "scale", scale, kv.head_dim);
  attnstate::detail::check_variant(fn, "variant", variant);
  if (kv.batch > 0) validate_tables(fn, kv);
  const std::vector<float> sink = detail::check_sinks(fn, sinks, q.shape[2], out);

  const std::int64_t batch = kv.batch;
  const std::int64_t q_len = q.shape[1];
  const std::int64_t hq_n = q.shape[2];
  const std::int64_t hkv_n = kv.heads_kv;
  const std::int64_t group = hq_n / hkv_n;
  const std::int64_t D = kv.head_dim;
  const std::int64_t rows = q_len * group;
  const std::int64_t S = splits.max_splits;
  const math::ScoreMap score = math::make_score_map(scale, variant.logits_soft_cap);
  const HeadScales kv_scales(kv, batch > 0);

  // Partial states: [batch][hkv][split][rows] (o: × D), fp32, base-2 LSE.
  std::vector<float> po = detail::scratch_floats(fn, {batch, hkv_n, S, rows, D});
  std::vector<float> plse = detail::scratch_floats(fn, {batch, hkv_n, S, rows});
  const std::int64_t tasks = batch * hkv_n * S;
  detail::parallel_for(0, tasks, 1, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t s = t % S;
      const std::int64_t hkv = (t / S) % hkv_n;
      const std::int64_t b = t / (S * hkv_n);
      const std::int32_t len = kv.seq_lens[b];
      if (s >= splits.splits_for(len)) continue;
      const TokenRange range = splits.range(len, static_cast<std::int32_t>(s));
      if (!split_in_window(range, len, q_len, variant.window_left)) {
        empty_states(rows, D, &po[t * rows * D], &plse[t * rows]);  // outside every window
        continue;
      }
      split_states(q, kv, kv_scales, b, hkv, range, len, score, variant.window_left,
                   &po[t * rows * D], &plse[t * rows]);
    }
  });

  // Merge the splits of each (request, KV head) in split order; write in out's dtype and base.
  detail::parallel_for(0, batch * hkv_n, 1, [&](std::int64_t t0, std::int64_t t1) {
    std::vector<float> acc(D);
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t hkv = t % hkv_n;
      const std::int64_t b = t / hkv_n;
      const std::int32_t n = splits.splits_for(kv.seq_lens[b]);
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t qi = r / group;
        const std::int64_t hq = hkv * group + r % group;
        const std::int64_t token = b * q_len + qi;
        const std::int64_t base = t * S * rows + r;  // split s at base + s · rows
        const float lse2 = merge_split_row(&po[base * D], &plse[base], n, rows, D, acc.data());
        store_final_row(out, token, hq, lse2, sink, acc.data());
      }
    }
  });
}

}  // namespace

void decode(const ConstTensorView& q, const PagedKvCache& kv, const SplitLayout& splits,
            float scale, StateView out) {
  decode(q, kv, splits, scale, AttentionVariant{}, out);
}

void decode(const ConstTensorView& q, const PagedKvCache& kv, const SplitLayout& splits,
            float scale, const AttentionVariant& variant, StateView out) {
  decode_layout(q, kv, splits, scale, variant, AttentionSinks{}, out);
}

void decode(const ConstTensorView& q, const PagedKvCache& kv, const DecodeOptions& options,
            StateView out) {
  decode(q, kv, options, AttentionSinks{}, out);
}

void decode(const ConstTensorView& q, const PagedKvCache& kv, const DecodeOptions& options,
            const AttentionSinks& sinks, StateView out) {
  const char* fn = "attnstate::cpu::decode";
  attnstate::detail::validate_decode_args(fn, q, kv, out, MemorySpace::kHost);
  const float scale =
      attnstate::detail::resolve_scale(fn, "options.scale", options.scale, kv.head_dim);
  attnstate::detail::check_variant(fn, "options.variant", options.variant);
  if (kv.batch > 0) validate_tables(fn, kv);
  detail::check_sinks(fn, sinks, q.shape[2], out);
  DecodeProblem p;
  p.batch = kv.batch;
  p.q_len = q.shape[1];
  p.heads_q = q.shape[2];
  p.heads_kv = kv.heads_kv;
  p.head_dim = kv.head_dim;
  p.q_dtype = q.dtype;
  p.kv_dtype = kv.dtype;
  const SplitLayout layout = plan_split_layout(p, kv.seq_lens, options, detail::pool_threads(),
                                               kv.heads_kv, fn, "kv.seq_lens", "options");
  decode_layout(q, kv, layout, scale, options.variant, sinks, out);
}

}  // namespace cpu
}  // namespace attnstate
