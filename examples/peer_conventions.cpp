/// @file peer_conventions.cpp
/// @brief FlashInfer's, vLLM's and FlashAttention's conventions mapped onto attnstate, on the
///        CPU, as docs/peers.md shows them: a FlashInfer paged KV cache (`paged_kv_indptr`,
///        `paged_kv_indices`, `paged_kv_last_page_len`, K and V interleaved in one tensor) and
///        the same cache through a vLLM block table; a vLLM sliding window; vLLM's
///        `merge_attn_states` inputs (head-major natural-log LSEs, `+inf` for a row without keys);
///        FlashInfer's base-2 `merge_state`. Each is checked against one-pass
///        `cpu::attention_state` over the keys it must see.
///
/// Exits 0 only if every check agrees with the one-pass state.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/decode.hpp"
#include "attnstate/cpu/merge.hpp"

using namespace attnstate;

namespace {

constexpr std::int64_t kHeadsQ = 4, kHeadsKv = 2, kDim = 8, kPageSize = 4, kNumPages = 8;
constexpr std::int64_t kBatch = 3;
const float kScale = 1.f / std::sqrt(static_cast<float>(kDim));

/// One state's storage, `(tokens, kHeadsQ, kDim)` f32.
struct Owned {
  std::vector<float> o, lse;
  explicit Owned(std::int64_t tokens) : o(tokens * kHeadsQ * kDim), lse(tokens * kHeadsQ) {}
  StateView view(std::int64_t tokens, LseBase base) {
    return make_state_view(o.data(), DType::kF32, lse.data(), tokens, kHeadsQ, kDim, base);
  }
};

/// The larger of `a` and `b`, NaN if either is (std::fmax would drop a NaN).
float worse(float a, float b) { return std::isnan(a) || std::isnan(b) ? NAN : std::fmax(a, b); }

/// Largest difference of `o` and of the natural-log LSE between token `t` of `got` (LSE
/// `got_base`, token-major) and token `w` of `want` (natural base, token-major), over all heads.
float max_diff(const Owned& got, std::int64_t t, LseBase got_base, const Owned& want,
               std::int64_t w) {
  const float to_natural = got_base == LseBase::kBase2 ? std::log(2.f) : 1.f;
  float diff = 0.f;
  for (std::int64_t h = 0; h < kHeadsQ; ++h) {
    diff =
        worse(diff, std::fabs(got.lse[t * kHeadsQ + h] * to_natural - want.lse[w * kHeadsQ + h]));
    for (std::int64_t d = 0; d < kDim; ++d)
      diff = worse(diff, std::fabs(got.o[(t * kHeadsQ + h) * kDim + d] -
                                   want.o[(w * kHeadsQ + h) * kDim + d]));
  }
  return diff;
}

bool report(const char* what, float diff) {
  const bool ok = diff < 1e-5f;
  std::printf("%-58s max |diff| %.2e  %s\n", what, diff, ok ? "ok" : "WRONG");
  return ok;
}

}  // namespace

int main() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto random = [&](std::size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = normal(rng);
    return x;
  };
  const std::int64_t page_elems = kPageSize * kHeadsKv * kDim;
  // FlashInfer's paged cache as one tensor [num_pages, 2, page_size, heads_kv, head_dim] (NHD):
  // the K page and the V page of page i are adjacent.
  std::vector<float> paged_kv_cache = random(kNumPages * 2 * page_elems);
  const std::vector<float> q = random(kBatch * kHeadsQ * kDim);  // one new token per request

  //! [flashinfer-paged-kv]
  // FlashInfer's page table: request b owns pages paged_kv_indices[indptr[b] .. indptr[b+1]),
  // the last of them holding paged_kv_last_page_len[b] tokens (1..page_size).
  const std::int32_t paged_kv_indptr[kBatch + 1] = {0, 2, 3, 6};
  const std::int32_t paged_kv_indices[6] = {5, 1, 7, 0, 3, 6};
  const std::int32_t paged_kv_last_page_len[kBatch] = {3, 4, 1};
  // attnstate takes each request's length instead:
  // seq_len = (num_pages - 1) * page_size + last_page_len.
  std::int32_t seq_lens[kBatch];
  for (std::int64_t b = 0; b < kBatch; ++b) {
    const std::int32_t num_pages = paged_kv_indptr[b + 1] - paged_kv_indptr[b];
    seq_lens[b] = num_pages == 0 ? 0
                                 : (num_pages - 1) * static_cast<std::int32_t>(kPageSize) +
                                       paged_kv_last_page_len[b];
  }
  PagedKvCache kv;
  kv.k = paged_kv_cache.data();               // K page of page i at i * page_stride
  kv.v = paged_kv_cache.data() + page_elems;  // V page right after it
  kv.page_stride = 2 * page_elems;            // K and V interleaved
  kv.dtype = DType::kF32;
  kv.layout = KvLayout::kNHD;  // FlashInfer's kv_layout="NHD" ("HND": KvLayout::kHND)
  kv.num_pages = kNumPages;
  kv.page_size = kPageSize;
  kv.heads_kv = kHeadsKv;
  kv.head_dim = kDim;
  kv.page_indptr = paged_kv_indptr;
  kv.page_indices = paged_kv_indices;
  kv.seq_lens = seq_lens;
  kv.batch = kBatch;
  const ConstTensorView qv = make_tensor_view(q.data(), DType::kF32, {kBatch, 1, kHeadsQ, kDim});
  Owned decoded(kBatch);
  DecodeOptions options;
  options.scale = kScale;  // FlashInfer's sm_scale, vLLM's scale (0: 1/sqrt(head_dim))
  cpu::decode(qv, kv, options, decoded.view(kBatch, LseBase::kNatural));
  //! [flashinfer-paged-kv]

  // The keys each request must see, gathered into contiguous (T, heads_kv, D) arrays.
  auto gather = [&](std::int64_t b, std::int64_t first, std::int64_t last, std::vector<float>& k,
                    std::vector<float>& v) {
    k.clear();
    v.clear();
    for (std::int64_t t = first; t < last; ++t) {
      const std::int64_t page = paged_kv_indices[paged_kv_indptr[b] + t / kPageSize];
      const float* kp =
          paged_kv_cache.data() + page * 2 * page_elems + (t % kPageSize) * kHeadsKv * kDim;
      k.insert(k.end(), kp, kp + kHeadsKv * kDim);
      v.insert(v.end(), kp + page_elems, kp + page_elems + kHeadsKv * kDim);
    }
  };
  // One-pass state of request b's query over its keys [first, last), natural base.
  auto one_pass = [&](std::int64_t b, std::int64_t first, std::int64_t last) {
    std::vector<float> k, v;
    gather(b, first, last, k, v);
    Owned s(1);
    const std::int64_t n = last - first;
    cpu::attention_state(
        make_tensor_view(q.data() + b * kHeadsQ * kDim, DType::kF32, {1, kHeadsQ, kDim}),
        make_tensor_view(k.data(), DType::kF32, {n, kHeadsKv, kDim}),
        make_tensor_view(v.data(), DType::kF32, {n, kHeadsKv, kDim}), kScale,
        s.view(1, LseBase::kNatural));
    return s;
  };
  bool ok = true;
  float diff = 0.f;
  for (std::int64_t b = 0; b < kBatch; ++b)
    diff = worse(diff, max_diff(decoded, b, LseBase::kNatural, one_pass(b, 0, seq_lens[b]), 0));
  ok &= report("FlashInfer paged KV (indptr, indices, last_page_len)", diff);

  //! [vllm-block-table]
  // vLLM's block table [num_seqs, max_num_blocks_per_seq] with its seq_lens: the same pages.
  constexpr std::int64_t kMaxBlocks = 3;
  const std::int32_t block_table[kBatch][kMaxBlocks] = {{5, 1, 0}, {7, 0, 0}, {0, 3, 6}};
  PagedKvCache by_table = kv;
  by_table.page_indptr = nullptr;  // exactly one of the two tables is set
  by_table.page_indices = nullptr;
  by_table.block_table = &block_table[0][0];
  by_table.block_table_stride = kMaxBlocks;
  Owned by_table_out(kBatch);
  cpu::decode(qv, by_table, options, by_table_out.view(kBatch, LseBase::kNatural));
  //! [vllm-block-table]
  diff = 0.f;
  for (std::int64_t b = 0; b < kBatch; ++b)
    diff = worse(diff, max_diff(by_table_out, b, LseBase::kNatural, decoded, b));
  ok &= report("vLLM block table: same states as the CSR table", diff);

  //! [vllm-sliding-window]
  // vLLM's sliding_window = W keys (FlashAttention's window_size = (W - 1, 0)) is
  // window_left = W - 1 (FlashInfer's window_left means the same as attnstate's): the new token
  // at position p = seq_len - 1 sees the keys [p - (W - 1), p], its last W keys.
  const std::int32_t sliding_window = 5;
  DecodeOptions windowed = options;
  windowed.variant.window_left = sliding_window - 1;
  Owned window_out(kBatch);
  cpu::decode(qv, kv, windowed, window_out.view(kBatch, LseBase::kNatural));
  //! [vllm-sliding-window]
  diff = 0.f;
  for (std::int64_t b = 0; b < kBatch; ++b) {
    const std::int64_t first = seq_lens[b] > sliding_window ? seq_lens[b] - sliding_window : 0;
    diff =
        worse(diff, max_diff(window_out, b, LseBase::kNatural, one_pass(b, first, seq_lens[b]), 0));
  }
  ok &= report("vLLM sliding_window W = window_left W - 1", diff);

  // Prefix and suffix states of request 2's query, replicated over 3 tokens so that the merge
  // has rows; FlashAttention writes them with a head-major LSE [heads, tokens], natural log.
  constexpr std::int64_t kTokens = 3;
  const std::int64_t split = 4, len = seq_lens[2];
  const Owned prefix_1 = one_pass(2, 0, split), suffix_1 = one_pass(2, split, len);
  const Owned whole = one_pass(2, 0, len);
  Owned prefix(kTokens), suffix(kTokens);
  for (std::int64_t t = 0; t < kTokens; ++t)
    for (std::int64_t h = 0; h < kHeadsQ; ++h) {
      prefix.lse[h * kTokens + t] = prefix_1.lse[h];  // head-major
      suffix.lse[h * kTokens + t] = suffix_1.lse[h];
      for (std::int64_t d = 0; d < kDim; ++d) {
        prefix.o[(t * kHeadsQ + h) * kDim + d] = prefix_1.o[h * kDim + d];
        suffix.o[(t * kHeadsQ + h) * kDim + d] = suffix_1.o[h * kDim + d];
      }
    }
  // Token 0 had no prefix keys: FlashAttention-2 writes lse = +inf there (and o = 0).
  for (std::int64_t h = 0; h < kHeadsQ; ++h) {
    prefix.lse[h * kTokens + 0] = INFINITY;
    for (std::int64_t d = 0; d < kDim; ++d) prefix.o[h * kDim + d] = 0.f;
  }

  //! [vllm-merge-attn-states]
  // vLLM's merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
  // output_lse): o [tokens, heads, head_dim], LSEs [heads, tokens] in natural log.
  const StateView prefix_state = with_head_major_lse(make_state_view(
      prefix.o.data(), DType::kF32, prefix.lse.data(), kTokens, kHeadsQ, kDim, LseBase::kNatural));
  cpu::mark_empty_rows(prefix_state);  // vLLM reads lse = +inf as -inf: here, explicitly
  const ConstStateView suffix_state = with_head_major_lse(make_const_state_view(
      suffix.o.data(), DType::kF32, suffix.lse.data(), kTokens, kHeadsQ, kDim, LseBase::kNatural));
  std::vector<float> output(kTokens * kHeadsQ * kDim), output_lse(kHeadsQ * kTokens);
  cpu::merge_state(
      prefix_state, suffix_state,
      with_head_major_lse(make_state_view(output.data(), DType::kF32, output_lse.data(), kTokens,
                                          kHeadsQ, kDim, LseBase::kNatural)));
  //! [vllm-merge-attn-states]
  Owned merged(kTokens);  // token-major copy for the comparison
  merged.o = output;
  for (std::int64_t t = 0; t < kTokens; ++t)
    for (std::int64_t h = 0; h < kHeadsQ; ++h)
      merged.lse[t * kHeadsQ + h] = output_lse[h * kTokens + t];
  diff = max_diff(merged, 0, LseBase::kNatural, suffix_1, 0);  // +inf prefix: the suffix alone
  for (std::int64_t t = 1; t < kTokens; ++t)
    diff = worse(diff, max_diff(merged, t, LseBase::kNatural, whole, 0));
  ok &= report("vLLM merge_attn_states (head-major, +inf rows)", diff);

  // The same prefix and suffix in FlashInfer's convention: LSE [tokens, heads] in base 2.
  Owned a(1), b(1);
  for (std::int64_t h = 0; h < kHeadsQ; ++h) {
    a.lse[h] = prefix_1.lse[h] / std::log(2.f);
    b.lse[h] = suffix_1.lse[h] / std::log(2.f);
  }
  a.o = prefix_1.o;
  b.o = suffix_1.o;

  //! [flashinfer-merge-state]
  // FlashInfer's merge_state(v_a, s_a, v_b, s_b) -> (v, s): v [tokens, heads, head_dim],
  // s [tokens, heads] in base 2 (the views' default LSE layout).
  const ConstStateView s_a = make_const_state_view(a.o.data(), DType::kF32, a.lse.data(), 1,
                                                   kHeadsQ, kDim, LseBase::kBase2);
  const ConstStateView s_b = make_const_state_view(b.o.data(), DType::kF32, b.lse.data(), 1,
                                                   kHeadsQ, kDim, LseBase::kBase2);
  Owned v(1);
  cpu::merge_state(s_a, s_b, v.view(1, LseBase::kBase2));
  //! [flashinfer-merge-state]
  ok &= report("FlashInfer merge_state (base-2 LSE)", max_diff(v, 0, LseBase::kBase2, whole, 0));

  return ok ? 0 : 1;
}
