/// @file mla_cascade.cpp
/// @brief CPU MLA cascade: per (level, segment, tile of 64 rows of the segment's requests) the
///        rows' states over the segment's latent tokens (each block of 16 tokens loaded once for
///        the tile: a shared prefix is read once per tile, not once per request), then per row
///        the ordered max-subtracted merge of its levels and, when there are some, the sinks.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnstate/cpu/mla.hpp"
#include "common/cascade_validate.hpp"
#include "common/mla_cascade_validate.hpp"
#include "cpu/mla_rows.hpp"
#include "cpu/parallel.hpp"
#include "cpu/producer_rows.hpp"
#include "cpu/scratch.hpp"
#include "cpu/sinks.hpp"

namespace attnstate {
namespace cpu {
namespace {

constexpr const char* kFn = "attnstate::cpu::mla_cascade";

/// Rows per work item: the rows of the requests sharing a segment, `q_len × heads` per request
/// (with 16 heads at q_len 1, four requests), share each block's load.
constexpr std::int64_t kRowTile = 64;

/// One work item: rows `[r0, r1)` of segment `seg` of level `level`, the rows of a segment being
/// its requests' `q_len × heads` rows one request after the other.
struct Item {
  int level;
  std::int64_t seg, r0, r1;
};

}  // namespace

void mla_cascade(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                 const CascadeLevel* levels, int num_levels, const CascadeOptions& options,
                 StateView out) {
  mla_cascade(q_nope, q_pe, kv, levels, num_levels, options, AttentionSinks{}, out);
}

void mla_cascade(const ConstTensorView& q_nope, const ConstTensorView& q_pe, const MlaKvCache& kv,
                 const CascadeLevel* levels, int num_levels, const CascadeOptions& options,
                 const AttentionSinks& sinks, StateView out) {
  namespace v = ::attnstate::detail;
  const MlaKvCache pool =
      v::validate_mla_cascade_args(kFn, q_nope, q_pe, kv, options, out, MemorySpace::kHost);
  const float scale = v::resolve_scale(kFn, "options.scale", options.scale, kv.key_dim());
  const std::int64_t batch = q_nope.shape[0];
  const std::int64_t q_len = q_nope.shape[1];
  const std::int64_t heads = q_nope.shape[2];
  const std::vector<float> sink = detail::check_sinks(kFn, sinks, heads, out);
  if (batch == 0) return;  // nothing to read or write (levels unused)
  v::check_cascade_levels(kFn, levels, num_levels, batch, q_len, options.causal,
                          v::mla_level_geometry(kv), false);
  v::check_out_disjoint_from_levels(kFn, out, levels, num_levels, true);
  const math::ScoreMap score = math::make_score_map(scale, 0.f);
  // the scales, read once (the values the checks saw are the values used)
  const float ckv_scale = is_fp8(kv.ckv_dtype) ? kv.ckv_scale.at(0) : 1.f;
  const float kpe_scale = is_fp8(kv.kpe_dtype) ? kv.kpe_scale.at(0) : 1.f;

  const std::int64_t L = kv.kv_lora_rank;
  const std::int64_t K = kv.key_dim();
  const std::int64_t req_rows = q_len * heads;
  const std::int64_t rows = batch * req_rows;  // row b·req_rows + r: request b's row r
  // every level's state of every row: [level][row] (o: × L), fp32, base-2 LSE
  std::vector<float> po = detail::scratch_floats(kFn, {num_levels, rows, L});
  std::vector<float> plse = detail::scratch_floats(kFn, {num_levels, rows});
  std::vector<Item> items;
  for (int l = 0; l < num_levels; ++l)
    for (std::int64_t s = 0; s < levels[l].num_segments; ++s) {
      const std::int64_t n =
          (levels[l].request_indptr[s + 1] - levels[l].request_indptr[s]) * req_rows;
      for (std::int64_t r = 0; r < n; r += kRowTile)
        items.push_back(Item{l, s, r, std::min(n, r + kRowTile)});
    }
  detail::parallel_for(
      0, static_cast<std::int64_t>(items.size()), 1, [&](std::int64_t i0, std::int64_t i1) {
        std::vector<float> qrows(static_cast<std::size_t>(kRowTile * K));
        std::vector<std::int64_t> row_end(static_cast<std::size_t>(kRowTile));
        for (std::int64_t i = i0; i < i1; ++i) {
          const Item& w = items[static_cast<std::size_t>(i)];
          const CascadeLevel& lv = levels[w.level];
          const std::int64_t len = lv.seg_lens[w.seg];
          const std::int64_t b0 = lv.request_indptr[w.seg];
          const bool last = w.level == num_levels - 1;
          for (std::int64_t r = w.r0; r < w.r1; ++r) {
            const std::int64_t qi = (r % req_rows) / heads;
            detail::load_mla_query(q_nope, q_pe, kv, b0 + r / req_rows, qi, r % heads,
                                   &qrows[(r - w.r0) * K]);
            // causal among the new tokens, the last q_len of the last level: row qi sees its tokens
            // [0, len - q_len + qi]; every token of an earlier level
            row_end[r - w.r0] =
                last && options.causal ? std::max<std::int64_t>(0, len - q_len + qi + 1) : len;
          }
          const std::int32_t* pages = lv.page_indices + lv.page_indptr[w.seg];
          // the segment's rows are rows b0·req_rows + r of the level's states (consecutive)
          const std::int64_t first = w.level * rows + b0 * req_rows + w.r0;
          detail::mla_row_states(
              pool, ckv_scale, kpe_scale, qrows.data(), row_end.data(), w.r1 - w.r0, 0,
              [&](std::int64_t t) { return std::int64_t{pages[t / kv.page_size]}; }, score,
              &po[first * L], &plse[first]);
        }
      });

  // ⊕ over the levels in level order; the sinks once after them; written in out's dtype and base
  detail::parallel_for(0, rows, kRowTile, [&](std::int64_t r0, std::int64_t r1) {
    std::vector<float> acc(static_cast<std::size_t>(L));
    for (std::int64_t r = r0; r < r1; ++r) {
      const float lse2 =
          detail::merge_split_row(&po[r * L], &plse[r], num_levels, rows, L, acc.data());
      detail::store_final_row(out, r / heads, r % heads, lse2, sink, acc.data());
    }
  });
}

}  // namespace cpu
}  // namespace attnstate
