/// @file cascade_decision.hpp
/// @brief Cascade or plain decode: a cost model over the levels `build_cascade_levels` found,
///        choosing the cascade (and how many of its shared levels) only where it is estimated to
///        be faster than the plain decode, with its reason for logs (see docs/cascade.md,
///        "Cascade or plain decode").
///
/// The model prices each stage by the roofline of its bytes and FLOPs plus a fixed cost per
/// launch, with constants measured on the H200 (bench/RESULTS.md, `bench_cascade`'s stage
/// columns). It errs on the side of the plain decode: the cascade's stages are summed as if
/// they did not overlap, at their lowest measured efficiencies, and the plain decode is priced
/// at its best measured one (pages shared by many requests at once partly hit the L2 cache, so
/// the plain decode can exceed the copy bandwidth). So where it picks the cascade, the cascade
/// is faster by a margin; where the gain is small it picks the plain decode.
#pragma once

#include <cstdint>
#include <string>

#include "attnstate/core/cascade_levels.hpp"
#include "attnstate/core/dtype.hpp"

namespace attnstate {

/// The attention shape the decision prices: the queries' and the KV pool's.
struct CascadeCostShape {
  std::int64_t q_len = 1;         ///< New tokens per request (`1..kMaxCascadeQueryLen`).
  std::int64_t heads_q = 0;       ///< Query heads (a multiple of `heads_kv`).
  std::int64_t heads_kv = 0;      ///< KV heads.
  std::int64_t head_dim = 0;      ///< Elements per head.
  DType kv_dtype = DType::kBF16;  ///< Element type of the pools (any storage dtype).
};

/// The device constants of the model (defaults: the H200, sm_90a, as measured in
/// bench/RESULTS.md). Every field finite and > 0; `margin` in (0, 1].
struct CascadeCostModel {
  /// Device copy bandwidth, bytes read + written per second in GB/s (what the benchmarks
  /// measure beside every run; a kernel reading N bytes at this rate takes N / copy_gbps).
  double copy_gbps = 4280;
  double tensor_tflops = 790;  ///< Dense f16/bf16 tensor-core peak, TFLOP/s.
  /// The plain decode's best measured fraction of `copy_gbps` over the bytes its requests read
  /// (above 1 where shared pages hit the L2 cache).
  double decode_efficiency = 1.2;
  double decode_fixed_us = 3;           ///< The plain decode's fixed cost (launch, merge), µs.
  double level_byte_efficiency = 0.85;  ///< A shared level's lowest measured share of copy.
  double level_flop_efficiency = 0.7;   ///< A shared level's lowest measured share of the peak.
  double level_fixed_us = 12;           ///< Per shared level: launch, pipeline fill, tail, µs.
  /// The cascade's last level (each request's own keys, on the split-KV decode): its share of
  /// the copy bandwidth.
  double last_level_efficiency = 0.85;
  double last_level_fixed_us = 8;  ///< The last level's fixed cost, µs.
  double merge_fixed_us = 8;       ///< The merge of the levels' states, µs (plus its bytes).
  /// The cascade is chosen only when its estimate is at most `margin` times the plain decode's.
  double margin = 0.97;
};

/// What `decide_cascade` chose, with its estimates and a one-line reason.
struct CascadeDecision {
  bool use_cascade = false;  ///< Run the cascade (else the plain decode over the page table).
  /// Shared levels to keep (0 with the plain decode). When fewer than the levels hold, rebuild
  /// them with `CascadeLevelsOptions::max_levels = shared_levels + 1`: the deeper shared
  /// segments then fold into the requests' remainders, which is what the estimate priced.
  int shared_levels = 0;
  double cascade_us = 0;     ///< Estimate of the best cascade (0 when the levels share nothing).
  double decode_us = 0;      ///< Estimate of the plain decode.
  double cascade_bytes = 0;  ///< KV bytes the best cascade reads (each shared segment once).
  double decode_bytes = 0;   ///< KV bytes the plain decode reads (every request its own keys).
  std::string reason;        ///< One line for logs: the choice, the estimates, the bytes.
};

/// Chooses between the cascade over `levels` (keeping its first 1, 2, … shared levels) and the
/// plain decode over the same requests, by the estimates of `model` for `shape`.
///
/// A cascade keeping `s` shared levels costs, summed: each kept level `max(bytes / (copy ·
/// level_byte_efficiency), FLOPs / (peak · level_flop_efficiency)) + level_fixed_us` (bytes:
/// each of its segments once; FLOPs: `4 · rows · keys · head_dim` over the rows of the requests
/// each segment serves, `rows = q_len · heads_q` per request); the last level, every request's
/// remainder plus the shared levels below `s`, at `last_level_efficiency` plus its fixed cost;
/// the merge of `s + 1` fp32 states per row plus `merge_fixed_us`. The plain decode costs its
/// requests' bytes at `decode_efficiency` plus `decode_fixed_us`.
/// @param levels  the levels (`build_cascade_levels`); one level means nothing is shared.
/// @param shape   the shape (every field as documented).
/// @param model   the device constants.
/// @return the decision; deterministic for given arguments.
/// @throws Error `kInvalidArgument` naming the field of `shape` or `model` out of range.
CascadeDecision decide_cascade(const CascadeLevels& levels, const CascadeCostShape& shape,
                               const CascadeCostModel& model = CascadeCostModel{});

}  // namespace attnstate
