/// @file cascade.cpp
/// @brief CPU cascade attention: one state per level (online softmax, fp32), each shared segment's
///        keys converted (fp8 dequantised) once per block for all the rows that share it; levels
///        merged with ⊕ (and the attention sinks merged once into the result, when there are
///        some).
#include "attnstate/cpu/cascade.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/variant.hpp"
#include "common/cascade_positions.hpp"
#include "common/cascade_validate.hpp"
#include "cpu/parallel.hpp"
#include "cpu/producer_rows.hpp"
#include "cpu/scratch.hpp"
#include "cpu/sinks.hpp"

namespace attnstate {
namespace cpu {
namespace {

using detail::fold_key_block;
using detail::HeadScales;
using detail::load_kv_row;
using detail::load_row;
using detail::store_row;

constexpr const char* kFunc = "attnstate::cpu::cascade_attention";
constexpr int kBlock = 64;  // keys per online-softmax block

/// One work item: the rows `[row_begin, row_end)` of (level, segment, KV head), where the rows of
/// a segment are its requests × new tokens × the KV head's group of query heads.
struct WorkItem {
  int level;
  std::int64_t seg, h_kv, row_begin, row_end;
};

constexpr std::int64_t kRowsPerItem = 16;  // query rows sharing one pass over a key block

/// Where each request's keys lie in the concatenation of its segments (level order): the position
/// and first visible key of its rows, what the causal rule and the window need.
using Positions = ::attnstate::detail::CascadePositions;

/// The states (o normalised, lse in base 2) of the rows of `w` over their segment: every block
/// of keys is converted to fp32 once and used by all the rows of the item (the shared segment is
/// read once per item, not once per request). Row `(b, t)` is at position `p` of its request's
/// keys (`total - q_len + t`, or `total - 1` without `causal`) and sees the segment's keys at
/// positions `[window_begin(p), p]`; an item none of whose rows sees a key reads nothing. An fp8
/// pool is read as `stored × scale` with the KV head's scales of `scales`.
void item_states(const WorkItem& w, const ConstTensorView& q, const PagedKvCache& kv,
                 const HeadScales& scales, const CascadeLevel& lv, const Positions& pos,
                 std::int64_t batch, bool causal, const math::ScoreMap& score,
                 std::int64_t window_left, std::int64_t q_len, std::int64_t group,
                 std::int64_t heads_q, float* lvl_o, float* lvl_lse) {
  const std::int64_t D = kv.head_dim;
  const std::int64_t len = lv.seg_lens[w.seg], pbeg = lv.page_indptr[w.seg];
  const std::int64_t r0 = lv.request_indptr[w.seg];
  const std::int64_t nr = w.row_end - w.row_begin;
  std::vector<std::int64_t> begin(nr), limit(nr), out_row(nr);
  std::int64_t min_begin = len, max_end = 0;
  for (std::int64_t i = 0; i < nr; ++i) {
    const std::int64_t r = w.row_begin + i;
    const std::int64_t b = r0 + r / (q_len * group), t = (r / group) % q_len, g = r % group;
    const std::int64_t total = pos.total[b], base = pos.base[w.level * batch + b];
    const std::int64_t p = causal ? total - q_len + t : total - 1;
    // keys [window_begin(p), p] of the request, as indices into this segment
    begin[i] = std::min(len, std::max<std::int64_t>(0, window_begin(p, window_left) - base));
    limit[i] = std::min(len, std::max<std::int64_t>(0, p + 1 - base));
    out_row[i] = (b * q_len + t) * heads_q + w.h_kv * group + g;
    if (begin[i] < limit[i]) {
      min_begin = std::min(min_begin, begin[i]);
      max_end = std::max(max_end, limit[i]);
    }
  }
  if (min_begin >= max_end) {  // no row sees a key of this segment: the empty state
    for (std::int64_t i = 0; i < nr; ++i) {
      std::fill(lvl_o + out_row[i] * D, lvl_o + (out_row[i] + 1) * D, 0.f);
      lvl_lse[out_row[i]] = math::neg_inf();
    }
    return;
  }
  std::vector<float> qf(nr * D), kf(kBlock * D), vf(kBlock * D), s(kBlock);
  std::vector<float> acc(nr * D, 0.f);
  std::vector<math::OnlineSoftmax> os(nr);
  for (std::int64_t i = 0; i < nr; ++i) {
    const std::int64_t r = w.row_begin + i;
    const std::int64_t b = r0 + r / (q_len * group), t = (r / group) % q_len;
    const std::int64_t h = w.h_kv * group + r % group;
    const std::int64_t qoff = b * q.stride[0] + t * q.stride[1] + h * q.stride[2];
    load_row(q.data, q.dtype, qoff, D, &qf[i * D]);
  }
  const float k_scale = scales.k_at(w.h_kv);
  const float v_scale = scales.v_at(w.h_kv);
  // blocks on the segment's grid of kBlock keys, from the block of the earliest visible key
  for (std::int64_t j0 = min_begin / kBlock * kBlock; j0 < max_end; j0 += kBlock) {
    const std::int64_t n = std::min<std::int64_t>(kBlock, max_end - j0);
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t tok = j0 + j;
      const std::int64_t page = lv.page_indices[pbeg + tok / kv.page_size];
      const std::int64_t off =
          page * kv.page_elems() + kv.in_page_offset(tok % kv.page_size, w.h_kv);
      load_kv_row(kv.k, kv.dtype, k_scale, off, D, &kf[j * D]);
      load_kv_row(kv.v, kv.dtype, v_scale, off, D, &vf[j * D]);
    }
    for (std::int64_t i = 0; i < nr; ++i) {
      const std::int64_t a = std::max<std::int64_t>(0, begin[i] - j0);  // visible keys [a, e)
      const std::int64_t e = std::min<std::int64_t>(n, limit[i] - j0);
      if (e <= a) continue;
      fold_key_block(os[i], &acc[i * D], &qf[i * D], &kf[a * D], &vf[a * D], e - a, D, score,
                     s.data());
    }
  }
  for (std::int64_t i = 0; i < nr; ++i) {
    const float inv = os[i].inv_sum();
    float* o = lvl_o + out_row[i] * D;
    for (std::int64_t d = 0; d < D; ++d) o[d] = acc[i * D + d] * inv;
    lvl_lse[out_row[i]] = os[i].lse(LseBase::kBase2);
  }
}

}  // namespace

void cascade_attention(const ConstTensorView& q, const PagedKvCache& kv, const CascadeLevel* levels,
                       int num_levels, const CascadeOptions& options, StateView out) {
  cascade_attention(q, kv, levels, num_levels, options, AttentionSinks{}, out);
}

void cascade_attention(const ConstTensorView& q, const PagedKvCache& kv, const CascadeLevel* levels,
                       int num_levels, const CascadeOptions& options, const AttentionSinks& sinks,
                       StateView out) {
  namespace v = ::attnstate::detail;
  const std::int64_t pool_bytes = v::check_cascade_pool(kFunc, kv, MemorySpace::kHost);
  v::check_cascade_query(kFunc, q, kv, MemorySpace::kHost);
  const std::int64_t batch = q.shape[0], q_len = q.shape[1], heads_q = q.shape[2];
  const std::int64_t D = kv.head_dim, group = heads_q / kv.heads_kv;
  v::check_cascade_out(kFunc, out, batch * q_len, heads_q, D, MemorySpace::kHost, &q);
  v::check_disjoint_from_pool(kFunc, "out", out, kv, pool_bytes);
  const float scale = v::cascade_scale(kFunc, options, D);
  v::check_variant(kFunc, "options.variant", options.variant);
  const math::ScoreMap score = math::make_score_map(scale, options.variant.logits_soft_cap);
  const std::vector<float> sink = detail::check_sinks(kFunc, sinks, heads_q, out);
  if (batch == 0) return;  // an empty batch: nothing to read or write (levels unused)
  v::check_cascade_levels(kFunc, levels, num_levels, batch, q_len, options.causal, kv, false);
  v::check_out_disjoint_from_levels(kFunc, out, levels, num_levels, true);
  const Positions pos = ::attnstate::detail::cascade_positions(levels, num_levels, batch);
  const HeadScales kv_scales(kv, true);  // batch > 0 here

  // every level's state of every row, computed per (level, segment, KV head, row chunk)
  const std::int64_t rows = batch * q_len * heads_q;
  std::vector<float> lvl_o = detail::scratch_floats(kFunc, {num_levels, rows, D});
  std::vector<float> lvl_lse = detail::scratch_floats(kFunc, {num_levels, rows});
  std::vector<WorkItem> items;
  for (int l = 0; l < num_levels; ++l)
    for (std::int64_t s = 0; s < levels[l].num_segments; ++s) {
      const std::int64_t nrows =
          (levels[l].request_indptr[s + 1] - levels[l].request_indptr[s]) * q_len * group;
      for (std::int64_t h = 0; h < kv.heads_kv; ++h)
        for (std::int64_t r = 0; r < nrows; r += kRowsPerItem)
          items.push_back(WorkItem{l, s, h, r, std::min(nrows, r + kRowsPerItem)});
    }
  detail::parallel_for(
      0, static_cast<std::int64_t>(items.size()), 1, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) {
          const WorkItem& w = items[i];
          item_states(w, q, kv, kv_scales, levels[w.level], pos, batch, options.causal, score,
                      options.variant.window_left, q_len, group, heads_q,
                      &lvl_o[w.level * rows * D], &lvl_lse[w.level * rows]);
        }
      });

  // ⊕ over the levels, written in the output's dtype and base
  detail::parallel_for(0, rows, 64, [&](std::int64_t b, std::int64_t e) {
    std::vector<float> acc(D);
    for (std::int64_t row = b; row < e; ++row) {
      float m = math::neg_inf();
      for (int l = 0; l < num_levels; ++l) m = math::nan_max(m, lvl_lse[l * rows + row]);
      std::fill(acc.begin(), acc.end(), 0.f);
      float sum = 0.f;
      for (int l = 0; l < num_levels; ++l) {
        const float lse = lvl_lse[l * rows + row];
        if (math::is_empty_lse(lse)) continue;  // an empty state's o is never read
        const float w = math::merge_weight(LseBase::kBase2, lse, m);
        sum += w;
        const float* o = &lvl_o[(l * rows + row) * D];
        for (std::int64_t d = 0; d < D; ++d) acc[d] += w * o[d];
      }
      const math::MergeResult r = math::merge_finalize(LseBase::kBase2, m, sum);
      const std::int64_t token = row / heads_q, h = row % heads_q;
      const std::int64_t ooff = out.o_offset(token, h);
      for (std::int64_t d = 0; d < D; ++d) acc[d] *= r.inv_sum;
      float lse = math::convert_lse(r.lse, LseBase::kBase2, out.base);
      if (!sink.empty())  // the one merge that carries the sink: after every level
        lse = detail::merge_sink(out.base, lse, sink[static_cast<std::size_t>(h)], acc.data(), D);
      store_row(out.o, out.dtype, ooff, D, acc.data());
      out.lse[out.lse_offset(token, h)] = lse;
    }
  });
}

}  // namespace cpu
}  // namespace attnstate
