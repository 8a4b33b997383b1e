/// @file decode_split.hpp
/// @brief The decode problem shape and the split layout of split-KV decode: how each request's
///        keys are cut into splits. Shared by the CPU and CUDA backends (host planning, device
///        evaluation), so both cut every request at the same token positions.
///
/// A `SplitLayout` is a small value: the split size (or the split count) and the maximum number
/// of splits per request. The splits of a request are derived from its *actual* length wherever
/// the decode runs (on the device from the device's `seq_lens`), so a layout planned for maximum
/// lengths stays valid, and replays correctly, for shorter requests.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/config.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/paged_kv.hpp"

namespace attnstate {

/// Shape of a decode problem: queries `(batch, q_len, heads_q, head_dim)` over a KV cache with
/// `heads_kv` heads (`heads_q % heads_kv == 0`; group = `heads_q / heads_kv`).
struct DecodeProblem {
  std::int64_t batch = 0;         ///< Requests.
  std::int64_t q_len = 1;         ///< New tokens per request (1..8), causal among themselves.
  std::int64_t heads_q = 0;       ///< Query heads (H_q).
  std::int64_t heads_kv = 0;      ///< KV heads (H_kv).
  std::int64_t head_dim = 0;      ///< Elements per head (64, 128 or 256 on the GPU).
  DType q_dtype = DType::kBF16;   ///< Dtype of the queries.
  DType kv_dtype = DType::kBF16;  ///< Dtype of the KV pools.

  /// Query heads per KV head.
  std::int64_t group() const { return heads_kv > 0 ? heads_q / heads_kv : 0; }
};

/// Split boundaries are multiples of this many tokens (the GPU kernel's tile).
constexpr std::int32_t kSplitGranularity = 16;
/// Upper bound on the splits of one request.
constexpr std::int32_t kMaxSplits = 512;
/// Wave-efficiency threshold of the automatic split policy (see `wave_efficiency_splits`).
constexpr double kAutoWaveThreshold = 0.95;

/// A half-open token range `[begin, end)` of one split.
struct TokenRange {
  std::int32_t begin;  ///< First token.
  std::int32_t end;    ///< One past the last token (`end <= begin` means empty).
};

/// How the keys of every request are cut into splits.
///
/// - `kFixedCount`: a request of length `L` gets splits of `c = roundup(ceil(L / num_splits), 16)`
///   tokens, i.e. `ceil(L / c) <= num_splits` non-empty splits.
/// - `kFixedSize` (also the resolved form of `kAuto`): splits of `split_size` tokens; at most
///   `max_splits` splits, the last one extended to the end of the request if it is longer than
///   planned.
///
/// A request always has at least one split (an empty one when `L == 0`).
struct SplitLayout {
  SplitPolicy policy = SplitPolicy::kFixedCount;  ///< kFixedCount or kFixedSize.
  std::int32_t num_splits = 1;                    ///< kFixedCount: splits per request.
  std::int32_t split_size = 0;  ///< kFixedSize: tokens per split (multiple of 16).
  std::int32_t max_splits = 1;  ///< Most splits any request can have (the grid extent).

  /// Tokens per split for a request of `len` tokens.
  ATTNSTATE_HOST_DEVICE std::int32_t chunk_for(std::int32_t len) const {
    if (policy == SplitPolicy::kFixedCount) {
      // 64-bit intermediates: no overflow for lengths near 2^31
      const std::int64_t c = (static_cast<std::int64_t>(len) + num_splits - 1) / num_splits;
      const std::int64_t r = (c + kSplitGranularity - 1) / kSplitGranularity * kSplitGranularity;
      constexpr std::int64_t kMax = 0x7FFFFFFF / kSplitGranularity * kSplitGranularity;
      return r <= 0 ? kSplitGranularity : static_cast<std::int32_t>(r < kMax ? r : kMax);
    }
    return split_size;
  }
  /// Number of splits (≥ 1, ≤ `max_splits`) of a request of `len` tokens.
  ATTNSTATE_HOST_DEVICE std::int32_t splits_for(std::int32_t len) const {
    if (len <= 0) return 1;
    const std::int32_t c = chunk_for(len);
    const auto n = static_cast<std::int32_t>((static_cast<std::int64_t>(len) + c - 1) / c);
    return n < max_splits ? n : max_splits;
  }
  /// Token range of split `s` of a request of `len` tokens.
  ATTNSTATE_HOST_DEVICE TokenRange range(std::int32_t len, std::int32_t s) const {
    const std::int32_t c = chunk_for(len);
    const std::int32_t n = splits_for(len);
    const std::int64_t b = static_cast<std::int64_t>(s) * c;
    std::int64_t e = (s == n - 1) ? len : b + c;
    if (e > len) e = len;
    TokenRange r;
    r.begin = static_cast<std::int32_t>(b < len ? b : len);
    r.end = static_cast<std::int32_t>(e);
    return r;
  }
};

/// Splits of the automatic policy: the wave-efficiency heuristic (FlashAttention-2's
/// `num_splits_heuristic`) over `work_items` CTAs of `n_blocks` key blocks on `slots`
/// concurrent CTA slots: the smallest split count whose last wave is at least `threshold` times
/// as full as the best achievable. FlashAttention-2 uses 0.85; the decode planner uses 0.95
/// (filling the slots exactly measured faster: bench/RESULTS.md). Returns a count in `[1, 128]`.
inline int wave_efficiency_splits(std::int64_t work_items, std::int64_t slots,
                                  std::int64_t n_blocks, double threshold = 0.85) {
  if (work_items <= 0 || n_blocks <= 1) return 1;
  if (work_items * 10 >= slots * 8) return 1;  // already about fills the machine
  const std::int64_t max_s =
      std::min<std::int64_t>({static_cast<std::int64_t>(128), slots, n_blocks});
  auto eligible = [&](std::int64_t s) {
    return s == 1 || (n_blocks + s - 1) / s != (n_blocks + s - 2) / (s - 1);
  };
  double best = 0;
  double eff[129] = {0};
  for (std::int64_t s = 1; s <= max_s; ++s) {
    if (!eligible(s)) continue;
    const double waves = static_cast<double>(work_items * s) / static_cast<double>(slots);
    const double w = waves / static_cast<double>((work_items * s + slots - 1) / slots);
    eff[s] = w;
    best = std::max(best, w);
  }
  for (std::int64_t s = 1; s <= max_s; ++s)
    if (eligible(s) && eff[s] >= threshold * best) return static_cast<int>(s);
  return 1;
}

/// Plans the split layout of a decode problem (host only).
///
/// @param problem   the shape; `batch` requests.
/// @param seq_lens  host array `(batch)` of the (maximum) lengths the layout must serve, each ≥ 0.
/// @param options   the policy: `kAuto` (wave-efficiency on `slots`), `kFixedCount`
///                  (`1 ≤ num_splits ≤ kMaxSplits`) or `kFixedSize` (`split_size` a positive
///                  multiple of 16, at most `kMaxSplits` splits for the longest request).
/// @param slots     concurrent CTAs of the device (SMs × CTAs per SM) or worker threads.
/// @param ctas_per_split  CTAs (or tasks) per split and request (KV heads × row tiles).
/// @param fn             the function named in error messages (a public entry point that plans
///                       through this one passes its own name).
/// @param seq_lens_name  the name of `seq_lens` in error messages (e.g. `"kv.seq_lens"`).
/// @param options_name   the name of `options` in error messages (e.g. `"options"`, giving
///                       `"options.split_size"`).
/// @throws Error (`kInvalidArgument`) on a bad policy argument or a negative length, naming
///         `fn` and the argument.
inline SplitLayout plan_split_layout(const DecodeProblem& problem, const std::int32_t* seq_lens,
                                     const DecodeOptions& options, std::int64_t slots,
                                     std::int64_t ctas_per_split,
                                     const char* fn = "attnstate::plan_split_layout",
                                     const char* seq_lens_name = "seq_lens",
                                     const char* options_name = "options") {
  const auto field = [options_name](const char* f) { return std::string(options_name) + "." + f; };
  if (problem.batch < 0)
    detail::throw_argument(fn, "problem.batch", ">= 0", std::to_string(problem.batch));
  if (options.policy != SplitPolicy::kAuto && options.policy != SplitPolicy::kFixedCount &&
      options.policy != SplitPolicy::kFixedSize)
    detail::throw_argument(fn, field("policy").c_str(), "kAuto, kFixedCount or kFixedSize",
                           "value " + std::to_string(static_cast<int>(options.policy)));
  if (problem.batch > 0 && seq_lens == nullptr)
    detail::throw_argument(fn, seq_lens_name, "a host array of batch lengths", "null");
  std::int32_t max_len = 0;
  for (std::int64_t b = 0; b < problem.batch; ++b) {
    if (seq_lens[b] < 0)
      detail::throw_argument(fn, seq_lens_name, "lengths >= 0",
                             std::to_string(seq_lens[b]) + " at request " + std::to_string(b));
    max_len = std::max(max_len, seq_lens[b]);
  }
  SplitLayout l;
  switch (options.policy) {
    case SplitPolicy::kFixedCount:
      if (options.num_splits < 1 || options.num_splits > kMaxSplits)
        detail::throw_argument(fn, field("num_splits").c_str(), "1.." + std::to_string(kMaxSplits),
                               std::to_string(options.num_splits));
      l.policy = SplitPolicy::kFixedCount;
      l.num_splits = options.num_splits;
      l.max_splits = options.num_splits;
      return l;
    case SplitPolicy::kFixedSize: {
      if (options.split_size <= 0 || options.split_size % kSplitGranularity != 0)
        detail::throw_argument(fn, field("split_size").c_str(), "a positive multiple of 16",
                               std::to_string(options.split_size));
      const std::int64_t n =
          (static_cast<std::int64_t>(max_len) + options.split_size - 1) / options.split_size;
      if (n > kMaxSplits)
        detail::throw_argument(
            fn, field("split_size").c_str(),
            "at most " + std::to_string(kMaxSplits) + " splits per request",
            std::to_string(n) + " splits for " + std::to_string(max_len) + " tokens");
      l.policy = SplitPolicy::kFixedSize;
      l.split_size = options.split_size;
      l.max_splits = static_cast<std::int32_t>(std::max<std::int64_t>(1, n));
      return l;
    }
    default: {  // kAuto (other values were rejected above)
      // counts past 2^40 CTAs mean "far more than fill the machine": capped so that the
      // heuristic's products cannot overflow
      constexpr std::int64_t kCap = std::int64_t{1} << 40;
      std::int64_t work = kCap;
      if (!checked_mul(problem.batch, std::max<std::int64_t>(1, ctas_per_split), &work) ||
          work > kCap)
        work = kCap;
      const std::int64_t blocks = (static_cast<std::int64_t>(max_len) + 63) / 64;
      const int s = wave_efficiency_splits(work, std::clamp<std::int64_t>(slots, 1, kCap), blocks,
                                           kAutoWaveThreshold);
      std::int64_t chunk = (static_cast<std::int64_t>(max_len) + s - 1) / s;
      chunk = (chunk + kSplitGranularity - 1) / kSplitGranularity * kSplitGranularity;
      if (chunk <= 0) chunk = kSplitGranularity;
      // split sizes stay int32 (the largest multiple of 16 below 2^31)
      chunk = std::min<std::int64_t>(chunk, 0x7FFFFFFF / kSplitGranularity * kSplitGranularity);
      l.policy = SplitPolicy::kFixedSize;
      l.split_size = static_cast<std::int32_t>(chunk);
      l.max_splits = static_cast<std::int32_t>(
          std::max<std::int64_t>(1, (static_cast<std::int64_t>(max_len) + chunk - 1) / chunk));
      return l;
    }
  }
}

}  // namespace attnstate
