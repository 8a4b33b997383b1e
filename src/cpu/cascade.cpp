/// @file cascade.cpp
/// @brief CPU cascade attention: one state per level (online softmax, fp32), levels merged with ⊕.
#include "attnstate/cpu/cascade.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "cpu/cascade_validate.hpp"

namespace attnstate {
namespace cpu {
namespace {

constexpr const char* kFunc = "attnstate::cpu::cascade_attention";
constexpr int kBlock = 64;  // keys per online-softmax block

float load_elem(const void* base, DType dt, std::int64_t idx) {
  switch (dt) {
    case DType::kF16: return to_float(static_cast<const half_t*>(base)[idx]);
    case DType::kBF16: return to_float(static_cast<const bfloat16_t*>(base)[idx]);
    default: return static_cast<const float*>(base)[idx];
  }
}

void store_elem(void* base, DType dt, std::int64_t idx, float x) {
  switch (dt) {
    case DType::kF16: static_cast<half_t*>(base)[idx] = from_float<half_t>(x); break;
    case DType::kBF16: static_cast<bfloat16_t*>(base)[idx] = from_float<bfloat16_t>(x); break;
    default: static_cast<float*>(base)[idx] = x; break;
  }
}

/// Runs `f(i)` for i in [0, n) on a few threads; rethrows the first exception.
template <class F>
void parallel_for(std::int64_t n, F&& f) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int nt = static_cast<int>(std::min<std::int64_t>(std::min(hw, 32), n));
  if (nt <= 1) {
    for (std::int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<std::int64_t> next{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < nt; ++t)
    pool.emplace_back([&] {
      for (std::int64_t i; (i = next.fetch_add(1)) < n;) f(i);
    });
  for (auto& th : pool) th.join();
}

/// The state (o normalised, lse in base 2) of one query row over keys [0, limit) of a segment.
void level_state(const float* qrow, const PagedKvCache& kv, const CascadeLevel& lv,
                 std::int64_t seg, std::int64_t limit, std::int64_t h_kv, float s2_scale,
                 float* o, float* lse2, std::vector<float>& scores) {
  const std::int64_t D = kv.head_dim;
  math::OnlineSoftmax os;
  std::fill(o, o + D, 0.f);
  const std::int64_t pbeg = lv.page_indptr[seg];
  for (std::int64_t j0 = 0; j0 < limit; j0 += kBlock) {
    const std::int64_t j1 = std::min<std::int64_t>(limit, j0 + kBlock);
    float bmax = math::neg_inf();
    for (std::int64_t j = j0; j < j1; ++j) {
      const std::int64_t page = lv.page_indices[pbeg + j / kv.page_size];
      const std::int64_t off = page * kv.page_elems() + kv.in_page_offset(j % kv.page_size, h_kv);
      float dot = 0.f;
      for (std::int64_t d = 0; d < D; ++d) dot += qrow[d] * load_elem(kv.k, kv.dtype, off + d);
      scores[j - j0] = dot * s2_scale;
      bmax = math::nan_max(bmax, scores[j - j0]);
    }
    const float alpha = os.rescale(bmax);
    for (std::int64_t d = 0; d < D; ++d) o[d] *= alpha;
    float psum = 0.f;
    for (std::int64_t j = j0; j < j1; ++j) {
      const float p = os.prob(scores[j - j0]);
      psum += p;
      const std::int64_t page = lv.page_indices[pbeg + j / kv.page_size];
      const std::int64_t off = page * kv.page_elems() + kv.in_page_offset(j % kv.page_size, h_kv);
      for (std::int64_t d = 0; d < D; ++d) o[d] += p * load_elem(kv.v, kv.dtype, off + d);
    }
    os.add(psum);
  }
  const float inv = os.inv_sum();
  for (std::int64_t d = 0; d < D; ++d) o[d] *= inv;
  *lse2 = os.lse(LseBase::kBase2);
}

}  // namespace

void cascade_attention(const ConstTensorView& q, const PagedKvCache& kv,
                       const CascadeLevel* levels, int num_levels, const CascadeOptions& options,
                       StateView out) {
  detail::check_cascade_pool(kFunc, kv, MemorySpace::kHost);
  detail::check_cascade_query(kFunc, q, kv, MemorySpace::kHost);
  const std::int64_t batch = q.shape[0], q_len = q.shape[1], heads_q = q.shape[2];
  const std::int64_t D = kv.head_dim, group = heads_q / kv.heads_kv;
  detail::check_cascade_levels(kFunc, levels, num_levels, batch, q_len, options.causal, kv, false);
  detail::check_cascade_out(kFunc, out, batch * q_len, heads_q, D, MemorySpace::kHost);
  const float s2_scale = math::base2_score_scale(detail::cascade_scale(kFunc, options, D));

  // segment of every request at every level
  std::vector<std::vector<std::int64_t>> seg_of(num_levels, std::vector<std::int64_t>(batch));
  for (int l = 0; l < num_levels; ++l)
    for (std::int64_t s = 0; s < levels[l].num_segments; ++s)
      for (std::int32_t b = levels[l].request_indptr[s]; b < levels[l].request_indptr[s + 1]; ++b)
        seg_of[l][b] = s;

  parallel_for(batch * q_len * heads_q, [&](std::int64_t row) {
    const std::int64_t h = row % heads_q, t = (row / heads_q) % q_len, b = row / (heads_q * q_len);
    const std::int64_t h_kv = h / group;
    std::vector<float> qrow(D), acc(D, 0.f), scores(kBlock);
    std::vector<float> lo(static_cast<std::size_t>(num_levels) * D);
    float llse[kMaxCascadeLevels];
    const std::int64_t qoff = b * q.stride[0] + t * q.stride[1] + h * q.stride[2];
    for (std::int64_t d = 0; d < D; ++d) qrow[d] = load_elem(q.data, q.dtype, qoff + d);
    float m = math::neg_inf();
    for (int l = 0; l < num_levels; ++l) {
      const std::int64_t seg = seg_of[l][b];
      std::int64_t limit = levels[l].seg_lens[seg];
      if (options.causal && l == num_levels - 1) limit -= q_len - 1 - t;
      level_state(qrow.data(), kv, levels[l], seg, std::max<std::int64_t>(limit, 0), h_kv,
                  s2_scale, &lo[l * D], &llse[l], scores);
      m = math::nan_max(m, llse[l]);
    }
    float sum = 0.f;
    for (int l = 0; l < num_levels; ++l) {
      if (math::is_empty_lse(llse[l])) continue;
      const float w = math::merge_weight(LseBase::kBase2, llse[l], m);
      sum += w;
      for (std::int64_t d = 0; d < D; ++d) acc[d] += w * lo[l * D + d];
    }
    const math::MergeResult r = math::merge_finalize(LseBase::kBase2, m, sum);
    const std::int64_t token = b * q_len + t;
    const std::int64_t ooff = out.o_offset(token, h);
    for (std::int64_t d = 0; d < D; ++d) store_elem(out.o, out.dtype, ooff + d, acc[d] * r.inv_sum);
    out.lse[out.lse_offset(token, h)] = math::convert_lse(r.lse, LseBase::kBase2, out.base);
  });
}

}  // namespace cpu
}  // namespace attnstate
