/// @file cpu_decode_and_cascade.cpp
/// @brief The CPU split-KV decode and cascade attention on a tiny paged cache (one request, one
///        new token, 2 query heads over 1 KV head, 6 keys in two NHD pages of 4), as
///        docs/decode.md and docs/cascade.md show them; both checked against the one-pass
///        `cpu::attention_state` over the same 6 keys.
///
/// Exits 0 only if both agree with the one-pass state.
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"

using namespace attnstate;

namespace {

constexpr int kHeads = 2, kDim = 4, kPage = 4, kPages = 2, kKeys = 6;

/// True when (o, lse) (lse in `base`) is within 1e-5 of the one-pass state (natural base).
bool close_to(const float* o, const float* lse, LseBase base, const float* want_o,
              const float* want_lse) {
  const float to_natural = base == LseBase::kBase2 ? std::log(2.f) : 1.f;
  for (int h = 0; h < kHeads; ++h) {
    if (!(std::fabs(lse[h] * to_natural - want_lse[h]) < 1e-5f)) return false;
    for (int d = 0; d < kDim; ++d)
      if (!(std::fabs(o[h * kDim + d] - want_o[h * kDim + d]) < 1e-5f)) return false;
  }
  return true;
}

}  // namespace

int main() {
  float q[kHeads * kDim], k[kPages * kPage * kDim] = {}, v[kPages * kPage * kDim] = {};
  for (int i = 0; i < kHeads * kDim; ++i) q[i] = 0.25f * static_cast<float>((i * 5) % 7) - 0.5f;
  for (int j = 0; j < kKeys; ++j)
    for (int d = 0; d < kDim; ++d) {
      k[j * kDim + d] = 0.5f * static_cast<float>((j * 3 + d * 7) % 5) - 1.f;
      v[j * kDim + d] = static_cast<float>((j * 11 + d * 2) % 9) - 4.f;
    }

  // The one-pass state over the 6 keys (pages 0 and 1 are contiguous here), natural base.
  float want_o[kHeads * kDim], want_lse[kHeads];
  cpu::attention_state(
      make_tensor_view(q, DType::kF32, {1, kHeads, kDim}),
      make_tensor_view(k, DType::kF32, {kKeys, 1, kDim}),
      make_tensor_view(v, DType::kF32, {kKeys, 1, kDim}), 1.f / std::sqrt(float(kDim)),
      make_state_view(want_o, DType::kF32, want_lse, 1, kHeads, kDim, LseBase::kNatural));

  //! [cpu-decode]
  // One request holding 6 keys in pages 0 and 1 (CSR page table), one new token.
  const std::int32_t page_indptr[2] = {0, 2}, page_indices[2] = {0, 1}, seq_lens[1] = {kKeys};
  PagedKvCache kv;
  kv.k = k;  // pools [pages, page_size, heads_kv, head_dim] (NHD)
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

  float dec_o[kHeads * kDim], dec_lse[kHeads];
  DecodeOptions options;  // scale 0: 1/sqrt(head_dim)
  options.policy = SplitPolicy::kFixedCount;
  options.num_splits = 2;
  cpu::decode(qv, kv, options,
              make_state_view(dec_o, DType::kF32, dec_lse, 1, kHeads, kDim, LseBase::kNatural));
  //! [cpu-decode]
  const bool decode_ok = close_to(dec_o, dec_lse, LseBase::kNatural, want_o, want_lse);

  //! [cpu-cascade]
  // Level 0: page 0 (4 keys, shared); level 1: page 1 (2 keys, the request's own).
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
  //! [cpu-cascade]
  const bool cascade_ok = close_to(cas_o, cas_lse, LseBase::kBase2, want_o, want_lse);

  std::printf("cpu decode %s, cpu cascade %s (lse head 0: one pass %.6f, decode %.6f)\n",
              decode_ok ? "ok" : "WRONG", cascade_ok ? "ok" : "WRONG", want_lse[0], dec_lse[0]);
  return decode_ok && cascade_ok ? 0 : 1;
}
