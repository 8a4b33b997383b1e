// A consumer that links only attnstate::cpu: split-KV decode and cascade attention over a tiny
// paged cache, both checked against attention computed here in double precision, and the cascade
// levels of a page table (build_cascade_levels).
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "attnstate/core/cascade_levels.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"

using namespace attnstate;

int main() {
  // One request, one new token, 2 query heads sharing 1 KV head, head_dim 4; 6 keys in 2 NHD
  // pages of 4 (the second half full).
  constexpr int kHeads = 2, kDim = 4, kPage = 4, kPages = 2, kKeys = 6;
  float q[kHeads * kDim], k[kPages * kPage * kDim] = {}, v[kPages * kPage * kDim] = {};
  for (int i = 0; i < kHeads * kDim; ++i) q[i] = 0.25f * static_cast<float>((i * 5) % 7) - 0.5f;
  for (int j = 0; j < kKeys; ++j)
    for (int d = 0; d < kDim; ++d) {
      k[j * kDim + d] = 0.5f * static_cast<float>((j * 3 + d * 7) % 5) - 1.f;
      v[j * kDim + d] = static_cast<float>((j * 11 + d * 2) % 9) - 4.f;
    }
  const std::int32_t page_indptr[2] = {0, 2}, page_indices[2] = {0, 1}, seq_lens[1] = {kKeys};
  PagedKvCache kv;
  kv.k = k;
  kv.v = v;
  kv.dtype = DType::kF32;
  kv.layout = KvLayout::kNHD;
  kv.num_pages = kPages;
  kv.page_size = kPage;
  kv.heads_kv = 1;
  kv.head_dim = kDim;
  kv.page_indptr = page_indptr;
  kv.page_indices = page_indices;
  kv.seq_lens = seq_lens;
  kv.batch = 1;
  const ConstTensorView qv = make_tensor_view(q, DType::kF32, {1, 1, kHeads, kDim});

  // Reference: softmax over the 6 keys with scale 1/sqrt(head_dim), natural-log LSE.
  double ref_o[kHeads * kDim] = {}, ref_lse[kHeads];
  for (int h = 0; h < kHeads; ++h) {
    double s[kKeys], m = -INFINITY, sum = 0;
    for (int j = 0; j < kKeys; ++j) {
      s[j] = 0;
      for (int d = 0; d < kDim; ++d) s[j] += 0.5 * q[h * kDim + d] * k[j * kDim + d];
      m = std::fmax(m, s[j]);
    }
    for (int j = 0; j < kKeys; ++j) sum += std::exp(s[j] - m);
    for (int j = 0; j < kKeys; ++j)
      for (int d = 0; d < kDim; ++d)
        ref_o[h * kDim + d] += std::exp(s[j] - m) / sum * v[j * kDim + d];
    ref_lse[h] = m + std::log(sum);
  }
  auto matches = [&](const float* o, const float* lse, double lse_scale) {
    for (int h = 0; h < kHeads; ++h) {
      if (!(std::fabs(lse[h] / lse_scale - ref_lse[h]) < 1e-4)) return false;
      for (int d = 0; d < kDim; ++d)
        if (!(std::fabs(o[h * kDim + d] - ref_o[h * kDim + d]) < 1e-4)) return false;
    }
    return true;
  };

  // cpu::decode (attnstate_cpu_decode), natural-log output, two fixed splits.
  float dec_o[kHeads * kDim], dec_lse[kHeads];
  DecodeOptions options;
  options.policy = SplitPolicy::kFixedCount;
  options.num_splits = 2;
  cpu::decode(qv, kv, options,
              make_state_view(dec_o, DType::kF32, dec_lse, 1, kHeads, kDim, LseBase::kNatural));
  const bool decode_ok = matches(dec_o, dec_lse, 1.0);

  // cpu::cascade_attention (attnstate_cpu_cascade): level 0 = page 0 (4 keys, shared), level 1 =
  // page 1 (2 keys, the request's own); base-2 output.
  const std::int32_t one_request[2] = {0, 1}, one_page[2] = {0, 1};
  const std::int32_t level0_pages[1] = {0}, level0_len[1] = {4};
  const std::int32_t level1_pages[1] = {1}, level1_len[1] = {2};
  CascadeLevel levels[2];
  levels[0] = {1, one_request, one_page, level0_pages, level0_len};
  levels[1] = {1, one_request, one_page, level1_pages, level1_len};
  float cas_o[kHeads * kDim], cas_lse[kHeads];
  cpu::cascade_attention(
      qv, kv, levels, 2, CascadeOptions{},
      make_state_view(cas_o, DType::kF32, cas_lse, 1, kHeads, kDim, LseBase::kBase2));
  const bool cascade_ok = matches(cas_o, cas_lse, 1.0 / std::log(2.0));

  // build_cascade_levels (attnstate_cascade_levels, part of attnstate::cpu): two requests holding
  // the same 6 keys share them in one segment and keep empty remainders.
  const std::int32_t two_indptr[3] = {0, 2, 4}, two_pages[4] = {0, 1, 0, 1};
  const std::int32_t two_lens[2] = {kKeys, kKeys};
  PagedKvCache two = kv;
  two.page_indptr = two_indptr;
  two.page_indices = two_pages;
  two.seq_lens = two_lens;
  two.batch = 2;
  CascadeLevelsOptions level_options;
  level_options.min_shared_tokens = 0;
  const CascadeLevels found = build_cascade_levels(two, level_options);
  const bool levels_ok = found.num_levels() == 2 && found.levels()[0].num_segments == 1 &&
                         found.levels()[0].seg_lens[0] == kKeys && found.keys_read() == kKeys;

  std::printf(
      "consumer_cpu: decode %s, cascade %s, levels %s (lse head 0: reference %.6f, decode %.6f)\n",
      decode_ok ? "ok" : "WRONG", cascade_ok ? "ok" : "WRONG", levels_ok ? "ok" : "WRONG",
      ref_lse[0], dec_lse[0]);
  return decode_ok && cascade_ok && levels_ok ? 0 : 1;
}
