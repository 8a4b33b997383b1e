/// @file attention_params.cpp
/// @brief The host-side fill of the attention kernels' shared argument fields.
#include "cuda/kernels/attention_params.cuh"

#include "attnstate/core/online_softmax.hpp"

namespace attnstate {
namespace cuda {

void fill_attention_params(AttentionParams& a, const ConstTensorView& q, const PagedKvCache& kv,
                           std::int64_t batch, std::int64_t q_len, std::int64_t heads_q,
                           float scale, float soft_cap, std::int64_t window_left) {
  a.q = q.data;
  a.q_stride_b = q.stride[0];
  a.q_stride_t = q.stride[1];
  a.q_stride_h = q.stride[2];
  a.k = kv.k;
  a.v = kv.v;
  a.page_elems = kv.page_elems();
  a.num_pages = kv.num_pages;
  a.page_size = static_cast<std::int32_t>(kv.page_size);
  a.heads_kv = static_cast<std::int32_t>(kv.heads_kv);
  a.layout_hnd = kv.layout == KvLayout::kHND ? 1 : 0;
  a.page_indptr = kv.page_indptr;
  a.page_indices = kv.page_indices;
  a.batch = static_cast<std::int32_t>(batch);
  a.q_len = static_cast<std::int32_t>(q_len);
  a.heads_q = static_cast<std::int32_t>(heads_q);
  a.group = static_cast<std::int32_t>(heads_q / kv.heads_kv);
  a.s2_scale = math::base2_score_scale(scale);
  a.scale = scale;
  a.soft_cap = soft_cap;
  a.window_left =
      window_left >= 0 && window_left <= 0x7FFFFFFF ? static_cast<std::int32_t>(window_left) : -1;
}

}  // namespace cuda
}  // namespace attnstate
