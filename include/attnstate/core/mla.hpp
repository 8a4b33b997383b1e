/// @file mla.hpp
/// @brief The paged latent cache of multi-head latent attention (MLA, DeepSeek-style, absorbed
///        form), shared by the CPU backend and the testing kit (and by the CUDA backend later).
///
/// In the absorbed form each request has `heads` query heads of width `kv_lora_rank + rope_dim`
/// (512 + 64 = 576 for DeepSeek-V3/R1 and Kimi K2): a latent part `q_nope` and a rotary part
/// `q_pe`. Every token of the cache holds ONE latent KV head shared by all query heads: its key
/// is the concatenation `[ckv, kpe]` (`kv_lora_rank + rope_dim` wide) and its value is `ckv`
/// alone (`kv_lora_rank` wide). A row's score over a token is
/// `scale · (q_nope · ckv + q_pe · kpe)`, and its state is `(o[kv_lora_rank], lse)`.
///
/// The two parts have separate pointers, strides and dtypes, so that both peers' layouts are
/// views of one struct without a copy:
///
/// - FlashInfer (`BatchMLAPagedAttentionWrapper`): two pools, `ckv (pages, page_size, 512)` and
///   `kpe (pages, page_size, 64)`: `ckv_token_stride = 512`, `kpe_token_stride = 64` (or 0,
///   the dense defaults);
/// - FlashMLA (`flash_mla_with_kvcache`): one pool `(blocks, block_size, 1, 576)`: `kpe = ckv +
///   512` elements, `ckv_token_stride = kpe_token_stride = 576` and both page strides
///   `block_size · 576`.
///
/// The same page table conventions as `PagedKvCache` (CSR `page_indptr`/`page_indices` or a
/// dense `block_table`, plus `seq_lens`): token `i` of request `b` lives in page
/// `pages(b)[i / page_size]` at slot `i % page_size`, in both parts.
#pragma once

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {

/// The latent width of DeepSeek-V3/R1 and Kimi K2 (`MlaKvCache::kv_lora_rank`).
constexpr std::int64_t kMlaKvLoraRank = 512;
/// The rotary width of DeepSeek-V3/R1 and Kimi K2 (`MlaKvCache::rope_dim`).
constexpr std::int64_t kMlaRopeDim = 64;

/// Per-token dequantisation scales of blocks of latent columns, for an fp8 latent part quantised
/// in blocks (FlashMLA's fp8 cache: four fp32 scales a token, one per 128 latent columns,
/// stored in the token's own row right after its 512 e4m3 values).
///
/// The scale of latent column `d` of token slot `s` of page `p` is
/// `data[p · page_elems + s · row_stride + d / block_cols]` (`MlaKvCache::ckv_block_scale_at`),
/// with the page table of the cache: the scales of a token live in the same page and slot as
/// its values. Strides are in floats; 0 means dense (`kv_lora_rank / block_cols` floats a token,
/// `page_size` tokens a page). The element is then read as `to_float(stored) × scale`, rounded
/// once to fp32. `data` null (the default) means no block scales.
struct MlaBlockScale {
  const float* data = nullptr;    ///< Scales in the cache's `space`, or null (none).
  std::int64_t block_cols = 128;  ///< Latent columns per scale (divides `kv_lora_rank`).
  std::int64_t token_stride = 0;  ///< Floats between token slots (0: `kv_lora_rank / block_cols`).
  std::int64_t page_stride = 0;   ///< Floats between pages (0: `page_size` token strides).

  /// True when block scales are given.
  ATTNSTATE_HOST_DEVICE bool present() const { return data != nullptr; }
};

/// A paged MLA latent cache: the latent part `ckv` and the rotary part `kpe` of every token, a
/// page table and per-request lengths.
///
/// Element `d` of the latent part of token slot `s` of page `p` is
/// `ckv[p · ckv_page_elems() + s · ckv_row_stride() + d]` (`d < kv_lora_rank`); likewise
/// `kpe[p · kpe_page_elems() + s · kpe_row_stride() + d]` (`d < rope_dim`). Strides are in
/// elements of each part's own dtype; 0 means dense (a token stride of the part's width, a
/// page stride of `page_size` token strides). The parts may lie in one buffer (FlashMLA's
/// interleaved pool).
///
/// Dtypes: f32, f16, bf16 (f32 on the CPU only), or fp8 (e4m3, e5m2) with a dequantisation
/// scale per part (`ckv_scale`, `kpe_scale`: one per tensor, as a host value or through a
/// pointer; `KvScale` with `head_stride` 0). The two parts may differ (FlashMLA's fp8 cache
/// keeps the rotary part in bf16). An fp8 element is read as `to_float(stored) × scale`,
/// accumulation in fp32. An fp8 latent part may instead carry per-token scales of blocks of
/// columns (`ckv_block_scale`, FlashMLA's fp8 rows), its per-tensor `ckv_scale` then left at the
/// default.
///
/// All pointers live in `space`. Element offsets are 64-bit.
struct MlaKvCache {
  const void* ckv = nullptr;       ///< Latent part (keys and values), of type `ckv_dtype`.
  const void* kpe = nullptr;       ///< Rotary part (keys only), of type `kpe_dtype`.
  DType ckv_dtype = DType::kBF16;  ///< Element type of `ckv`.
  DType kpe_dtype = DType::kBF16;  ///< Element type of `kpe`.
  KvScale ckv_scale;               ///< Scale of an fp8 `ckv` (per tensor; default 1).
  KvScale kpe_scale;               ///< Scale of an fp8 `kpe` (per tensor; default 1).
  MlaBlockScale ckv_block_scale;   ///< Per-token block scales of an fp8 `ckv` (default none).
  std::int64_t kv_lora_rank = kMlaKvLoraRank;  ///< Latent width (values and the first part of
                                               ///< the keys).
  std::int64_t rope_dim = kMlaRopeDim;         ///< Rotary width (the last part of the keys).
  std::int64_t num_pages = 0;                  ///< Pages in the pool(s).
  std::int64_t page_size = 0;                  ///< Tokens per page.
  std::int64_t ckv_token_stride = 0;  ///< Elements between token slots of `ckv` (0: kv_lora_rank).
  std::int64_t ckv_page_stride = 0;   ///< Elements between pages of `ckv` (0: page_size slots).
  std::int64_t kpe_token_stride = 0;  ///< Elements between token slots of `kpe` (0: rope_dim).
  std::int64_t kpe_page_stride = 0;   ///< Elements between pages of `kpe` (0: page_size slots).
  const std::int32_t* page_indptr = nullptr;   ///< CSR offsets `(batch + 1)`, [0] = 0, or null.
  const std::int32_t* page_indices = nullptr;  ///< CSR page ids, or null.
  const std::int32_t* block_table = nullptr;   ///< Dense `(batch, block_table_stride)`, or null.
  std::int64_t block_table_stride = 0;         ///< Columns of `block_table`.
  const std::int32_t* seq_lens = nullptr;      ///< `(batch)` tokens per request (≥ 0).
  std::int64_t batch = 0;                      ///< Number of requests.
  MemorySpace space = MemorySpace::kHost;      ///< Where the pools, scales and tables live.

  /// Width of a key (`kv_lora_rank + rope_dim`: 576 for DeepSeek-V3).
  ATTNSTATE_HOST_DEVICE std::int64_t key_dim() const { return kv_lora_rank + rope_dim; }
  /// Elements between token slots of `ckv` (resolves 0).
  ATTNSTATE_HOST_DEVICE std::int64_t ckv_row_stride() const {
    return ckv_token_stride != 0 ? ckv_token_stride : kv_lora_rank;
  }
  /// Elements between token slots of `kpe` (resolves 0).
  ATTNSTATE_HOST_DEVICE std::int64_t kpe_row_stride() const {
    return kpe_token_stride != 0 ? kpe_token_stride : rope_dim;
  }
  /// Elements between pages of `ckv` (resolves 0).
  ATTNSTATE_HOST_DEVICE std::int64_t ckv_page_elems() const {
    return ckv_page_stride != 0 ? ckv_page_stride : page_size * ckv_row_stride();
  }
  /// Elements between pages of `kpe` (resolves 0).
  ATTNSTATE_HOST_DEVICE std::int64_t kpe_page_elems() const {
    return kpe_page_stride != 0 ? kpe_page_stride : page_size * kpe_row_stride();
  }
  /// Element offset in `ckv` of token slot `slot` of page `page`.
  ATTNSTATE_HOST_DEVICE std::int64_t ckv_offset(std::int64_t page, std::int64_t slot) const {
    return page * ckv_page_elems() + slot * ckv_row_stride();
  }
  /// Block scales a token of `ckv` has (`kv_lora_rank / ckv_block_scale.block_cols`).
  ATTNSTATE_HOST_DEVICE std::int64_t ckv_blocks() const {
    return kv_lora_rank / ckv_block_scale.block_cols;
  }
  /// Floats between token slots of `ckv_block_scale` (resolves 0).
  ATTNSTATE_HOST_DEVICE std::int64_t ckv_block_scale_row_stride() const {
    return ckv_block_scale.token_stride != 0 ? ckv_block_scale.token_stride : ckv_blocks();
  }
  /// Floats between pages of `ckv_block_scale` (resolves 0).
  ATTNSTATE_HOST_DEVICE std::int64_t ckv_block_scale_page_elems() const {
    return ckv_block_scale.page_stride != 0 ? ckv_block_scale.page_stride
                                            : page_size * ckv_block_scale_row_stride();
  }
  /// Float offset in `ckv_block_scale.data` of the first scale of token slot `slot` of page
  /// `page` (the scale of its column `d` is at `+ d / block_cols`).
  ATTNSTATE_HOST_DEVICE std::int64_t ckv_block_scale_offset(std::int64_t page,
                                                            std::int64_t slot) const {
    return page * ckv_block_scale_page_elems() + slot * ckv_block_scale_row_stride();
  }
  /// Element offset in `kpe` of token slot `slot` of page `page`.
  ATTNSTATE_HOST_DEVICE std::int64_t kpe_offset(std::int64_t page, std::int64_t slot) const {
    return page * kpe_page_elems() + slot * kpe_row_stride();
  }
};

}  // namespace attnstate
