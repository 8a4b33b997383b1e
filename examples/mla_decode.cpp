/// @file mla_decode.cpp
/// @brief The CPU MLA decode (DeepSeek-V3 shape: 16 query heads of 512 latent + 64 rotary
///        columns, one shared latent head per token) over a FlashMLA-style interleaved bf16 pool
///        of 64-token blocks, as docs/mla.md shows it: the same cache viewed as FlashInfer's two
///        pools gives the same bits, and the states of the two halves of the keys (as two GPUs
///        of a context-parallel decode would compute them) merged with `merge_states` equal the
///        one-pass state.
///
/// Exits 0 only if both hold.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "attnstate/cpu/merge.hpp"
#include "attnstate/cpu/mla.hpp"

using namespace attnstate;

int main() {
  constexpr std::int64_t kHeads = 16, kRank = 512, kRope = 64, kWidth = kRank + kRope;
  constexpr std::int64_t kBlock = 64, kBlocks = 4, kLen = 200;  // one request of 200 tokens
  // The pool (blocks, block_size, 1, 576) and the query (batch, q_len, heads, 576), bf16.
  std::vector<bfloat16_t> pool(kBlocks * kBlock * kWidth), q(kHeads * kWidth);
  for (std::size_t i = 0; i < pool.size(); ++i)
    pool[i] = from_float<bfloat16_t>(0.01f * static_cast<float>((i * 37) % 200) - 1.f);
  for (std::size_t i = 0; i < q.size(); ++i)
    q[i] = from_float<bfloat16_t>(0.01f * static_cast<float>((i * 53) % 200) - 1.f);
  const std::int32_t block_table[kBlocks] = {2, 0, 3, 1}, seq_lens[1] = {kLen};

  //! [mla-flashmla-view]
  // FlashMLA's cache: one pool (blocks, block_size, 1, 576), kpe the last 64 columns of each row.
  MlaKvCache kv;
  kv.ckv = pool.data();
  kv.kpe = pool.data() + kRank;
  kv.ckv_dtype = kv.kpe_dtype = DType::kBF16;
  kv.kv_lora_rank = kRank;  // 512, the default
  kv.rope_dim = kRope;      // 64, the default
  kv.num_pages = kBlocks;
  kv.page_size = kBlock;
  kv.ckv_token_stride = kv.kpe_token_stride = kWidth;
  kv.ckv_page_stride = kv.kpe_page_stride = kBlock * kWidth;
  kv.block_table = block_table;
  kv.block_table_stride = kBlocks;
  kv.seq_lens = seq_lens;
  kv.batch = 1;
  // FlashMLA's query (batch, q_len, heads, 576) as two views: its first 512 columns and its
  // last 64.
  ConstTensorView q_nope = make_tensor_view(q.data(), DType::kBF16, {1, 1, kHeads, kWidth});
  ConstTensorView q_pe = q_nope;
  q_nope.shape[3] = kRank;
  q_pe.data = q.data() + kRank;
  q_pe.shape[3] = kRope;
  // States (o[512], lse) of the 16 heads, natural base.
  std::vector<float> o(kHeads * kRank), lse(kHeads);
  DecodeOptions options;
  options.scale = 1.f / std::sqrt(static_cast<float>(kWidth));  // DeepSeek-V3 passes its own
  cpu::mla_decode(
      q_nope, q_pe, kv, options,
      make_state_view(o.data(), DType::kF32, lse.data(), 1, kHeads, kRank, LseBase::kNatural));
  //! [mla-flashmla-view]

  // The same tokens as FlashInfer's two dense pools (pages, page_size, 512) and (.., 64).
  std::vector<bfloat16_t> ckv(kBlocks * kBlock * kRank), kpe(kBlocks * kBlock * kRope);
  for (std::int64_t s = 0; s < kBlocks * kBlock; ++s) {
    for (std::int64_t d = 0; d < kRank; ++d) ckv[s * kRank + d] = pool[s * kWidth + d];
    for (std::int64_t d = 0; d < kRope; ++d) kpe[s * kRope + d] = pool[s * kWidth + kRank + d];
  }
  MlaKvCache two = kv;
  two.ckv = ckv.data();
  two.kpe = kpe.data();
  two.ckv_token_stride = two.kpe_token_stride = 0;  // dense: 512 and 64
  two.ckv_page_stride = two.kpe_page_stride = 0;
  std::vector<float> o2(o.size()), lse2(lse.size());
  cpu::mla_decode(
      q_nope, q_pe, two, options,
      make_state_view(o2.data(), DType::kF32, lse2.data(), 1, kHeads, kRank, LseBase::kNatural));
  bool ok = o2 == o && lse2 == lse;

  // Two halves of the keys (blocks 0-1 and 2-3 of the request), each decoded alone, merged.
  const std::int32_t first[2] = {2, 0}, second[2] = {3, 1}, lens0[1] = {128}, lens1[1] = {72};
  std::vector<float> parts_o(2 * kHeads * kRank), parts_lse(2 * kHeads), merged(o.size()),
      merged_lse(lse.size());
  for (int r = 0; r < 2; ++r) {
    MlaKvCache shard = kv;
    shard.block_table = r == 0 ? first : second;
    shard.block_table_stride = 2;
    shard.seq_lens = r == 0 ? lens0 : lens1;
    cpu::mla_decode(q_nope, q_pe, shard, options,
                    make_state_view(&parts_o[r * kHeads * kRank], DType::kF32,
                                    &parts_lse[r * kHeads], 1, kHeads, kRank, LseBase::kNatural));
  }
  cpu::merge_states(
      make_state_stack(parts_o.data(), DType::kF32, parts_lse.data(), StackOrder::kStatesMajor, 1,
                       2, kHeads, kRank, LseBase::kNatural),
      make_state_view(merged.data(), DType::kF32, merged_lse.data(), 1, kHeads, kRank,
                      LseBase::kNatural));
  for (std::int64_t i = 0; i < kHeads * kRank; ++i) ok = ok && std::fabs(merged[i] - o[i]) < 1e-5f;
  for (std::int64_t h = 0; h < kHeads; ++h)
    ok = ok && std::isfinite(lse[h]) && std::fabs(merged_lse[h] - lse[h]) < 1e-5f;
  std::printf("MLA decode: head 0 lse %.6f, o[0] %.6f; two layouts equal and shards merged: %s\n",
              lse[0], o[0], ok ? "yes" : "NO");
  return ok ? 0 : 1;
}
