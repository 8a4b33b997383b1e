/// @file paged_kv.hpp
/// @brief Description of a paged KV cache and of decode problems over it (shared by the CPU and
///        CUDA backends).
#pragma once

#include <cstdint>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/core/variant.hpp"

namespace attnstate {

/// Order of the dimensions inside one KV page.
enum class KvLayout : std::uint8_t {
  kNHD = 0,  ///< Pool `[pages, page_size, H_kv, head_dim]`.
  kHND = 1,  ///< Pool `[pages, H_kv, page_size, head_dim]`.
};

/// Dequantisation scale of one fp8 KV pool (K or V): the real value of a stored element of KV
/// head `h` is `to_float(stored) × scale(h)`, with one formula for every kind of scale:
///
///     scale(h) = data != nullptr ? data[h · head_stride] : value
///
/// - one scale per tensor, a host value: `value` (`data` null, `head_stride` 0);
/// - one scale per tensor in memory: `data` points to one float in the cache's `space`,
///   `head_stride` 0. It is read when the call runs (on the GPU by the kernel), so a captured CUDA
///   graph replays with the scale the buffer holds at replay;
/// - one scale per KV head: `data` points to `H_kv` floats in `space`, head `h` at
///   `data[h · head_stride]` (`head_stride` ≥ 1; 1 for a dense `[H_kv]` array).
///
/// Every scale must be finite and > 0; `value` must stay 1 when `data` is set. A cache of f16,
/// bf16 or f32 takes only the default (value 1, no data): a scale there would be ignored, so it
/// is an error. Accumulation stays fp32: the CPU backend dequantises each element once to fp32
/// (`to_float(stored) · scale(h)`, one rounding).
struct KvScale {
  float value = 1.f;             ///< The scale when `data` is null.
  const float* data = nullptr;   ///< Scale(s) in the cache's `space`, or null.
  std::int64_t head_stride = 0;  ///< Elements between the scales of consecutive KV heads in
                                 ///< `data` (0: one scale for every head).

  /// The scale of KV head `h` (`0 ≤ h < H_kv`): the one formula above.
  ATTNSTATE_HOST_DEVICE float at(std::int64_t h) const {
    return data != nullptr ? data[h * head_stride] : value;
  }
  /// True for the default, the only scale a non-fp8 cache takes: value 1, no data.
  ATTNSTATE_HOST_DEVICE bool is_default() const {
    return data == nullptr && value == 1.f && head_stride == 0;
  }
  /// One scale per tensor, a host value.
  static KvScale per_tensor(float scale) { return KvScale{scale, nullptr, 0}; }
  /// One scale per tensor, read from `*scale` (in the cache's `space`) when the call runs.
  static KvScale per_tensor_at(const float* scale) { return KvScale{1.f, scale, 0}; }
  /// One scale per KV head: head `h` at `scales[h · stride]` (in the cache's `space`).
  static KvScale per_head(const float* scales, std::int64_t stride = 1) {
    return KvScale{1.f, scales, stride};
  }
};

/// A paged KV cache: two page pools (K and V) of the same shape, a page table and per-request
/// sequence lengths. A contiguous `[batch, T, H_kv, D]` cache is the case `page_size = T` with
/// page `b` holding request `b`.
///
/// The page table is either CSR (`page_indptr` `(batch + 1)` and `page_indices`) or a dense
/// block table `(batch, block_table_stride)`; exactly one of the two is set. Request `b` owns
/// pages `pages(b)[0 .. ceil(seq_lens[b] / page_size))` in order; token `i` of request `b` lives
/// in page `pages(b)[i / page_size]` at slot `i % page_size`.
///
/// The pools hold f16, bf16 (f32 on the CPU) or fp8 (e4m3, e5m2) elements; an fp8 pool is read
/// as `stored × scale` (`k_scale`, `v_scale`; see `KvScale`), the queries staying f16/bf16/f32.
///
/// All pointers live in `space` (device memory for the CUDA backend). Element offsets are 64-bit.
struct PagedKvCache {
  const void* k = nullptr;           ///< K pool, of type `dtype`.
  const void* v = nullptr;           ///< V pool, same shape and strides as `k`.
  DType dtype = DType::kBF16;        ///< Element type of the pools (f16, bf16; fp8 on the CPU).
  KvScale k_scale;                   ///< Dequantisation scale of `k` (fp8 only; default 1).
  KvScale v_scale;                   ///< Dequantisation scale of `v` (fp8 only; default 1).
  KvLayout layout = KvLayout::kNHD;  ///< Dimension order inside a page.
  std::int64_t num_pages = 0;        ///< Pages in each pool.
  std::int64_t page_size = 0;        ///< Tokens per page.
  std::int64_t heads_kv = 0;         ///< KV heads (H_kv).
  std::int64_t head_dim = 0;         ///< Elements per head.
  std::int64_t page_stride = 0;  ///< Elements between consecutive pages (≥ page_size·H_kv·D;
                                 ///< 0 means exactly that, i.e. a dense pool).
  const std::int32_t* page_indptr = nullptr;   ///< CSR offsets `(batch + 1)`, [0] = 0, or null.
  const std::int32_t* page_indices = nullptr;  ///< CSR page ids, or null.
  const std::int32_t* block_table = nullptr;   ///< Dense `(batch, block_table_stride)`, or null.
  std::int64_t block_table_stride = 0;         ///< Columns of `block_table`.
  const std::int32_t* seq_lens = nullptr;      ///< `(batch)` tokens per request (≥ 0).
  std::int64_t batch = 0;                      ///< Number of requests.
  MemorySpace space = MemorySpace::kHost;      ///< Where the pools and tables live.

  /// Elements between consecutive pages (resolves `page_stride == 0`).
  ATTNSTATE_HOST_DEVICE std::int64_t page_elems() const {
    return page_stride != 0 ? page_stride : page_size * heads_kv * head_dim;
  }
  /// Element offset of token slot `slot` of KV head `h` inside a page.
  ATTNSTATE_HOST_DEVICE std::int64_t in_page_offset(std::int64_t slot, std::int64_t h) const {
    return layout == KvLayout::kNHD ? (slot * heads_kv + h) * head_dim
                                    : (h * page_size + slot) * head_dim;
  }
};

/// How split-KV decode partitions each request's keys.
enum class SplitPolicy : std::uint8_t {
  kAuto = 0,        ///< Chosen from shapes, lengths and the SM count (wave-efficiency heuristic).
  kFixedCount = 1,  ///< Exactly `DecodeOptions::num_splits` splits of equal size per request.
  kFixedSize = 2,   ///< Splits of `DecodeOptions::split_size` tokens: a row's result depends only
                    ///< on its own request, never on the rest of the batch.
};

/// Which kernel the CUDA decode runs (`DecodeOptions::kernel`; a plan's `cuda::DecodePlan::kernel`
/// is `kSplit` or `kStreamed`).
enum class DecodeKernel : std::uint8_t {
  kAuto = 0,      ///< The planner's choice (docs/decode.md, "How it runs").
  kSplit = 1,     ///< The split-KV kernel.
  kStreamed = 2,  ///< The streamed kernel: one split per request, a compiled streamed instance.
};

/// Options of a decode call.
struct DecodeOptions {
  float scale = 0.f;                        ///< Softmax scale; 0 means `1/sqrt(head_dim)`.
  SplitPolicy policy = SplitPolicy::kAuto;  ///< Split policy.
  int num_splits = 0;                       ///< For `kFixedCount`.
  int split_size = 0;  ///< For `kFixedSize`, in tokens: a positive multiple of 16
                       ///< (`kSplitGranularity`, core/decode_split.hpp) giving at most
                       ///< `kMaxSplits` splits for the longest request; any `page_size`.
  /// Sliding window and logits soft cap (default: plain attention). Row `i` of request `b` is at
  /// position `p = seq_lens[b] - q_len + i` and sees the keys `[max(0, p - window_left), p]`.
  AttentionVariant variant;

  // CUDA backend only (`cuda::plan_decode` checks them; the CPU backend ignores them): hand
  // choices of the kernel and its launch, for comparisons and tests. Each choice gives the same
  // results up to rounding (the launch overrides: the same bits, but for the paired depths).

  /// The kernel: `kAuto` (the planner), `kSplit`, or `kStreamed` (refused by name unless every
  /// request has one split and a streamed instance takes the problem and variant).
  DecodeKernel kernel = DecodeKernel::kAuto;
  /// The split kernel's pipeline depth: 0 (the planner), or a compiled depth (3, or 2 at head
  /// dim 128; over fp8 caches at head dim 128 also 4 and 6: the paired configuration, whose warps
  /// take 32 keys a step, which the planner never picks; its results differ from the other
  /// depths' by rounding, and the automatic layout then fills only the CTAs it keeps resident).
  int split_stages = 0;
  /// CTAs per thread-block cluster of the split kernel: 0 (the planner), 1, the split count
  /// (at most 8: the cluster merge) or a smaller divisor of it up to 8 (the workspace merge in
  /// groups).
  int split_cluster = 0;
  /// CTAs per SM the automatic split policy (`policy = kAuto`) plans to fill: 0 (the planner:
  /// the split kernel's occupancy at its default depth) or 1..that occupancy. Fewer slots give
  /// fewer, longer splits (a latency-bound call of few requests pays less merge).
  int plan_ctas_per_sm = 0;
  /// Launch the decode as a programmatic dependent launch (sm_90 and later; see
  /// `cuda::DecodePlan::programmatic_launch`).
  bool programmatic_launch = false;
};

}  // namespace attnstate
