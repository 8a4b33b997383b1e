/// @file variant.hpp
/// @brief Attention variants shared by every backend: a sliding window over the keys and a
///        soft cap on the logits (see docs/numerics.md, "Sliding window and soft cap").
///
/// Both act before the softmax and keep the algebra intact: a window only restricts the key set
/// (the state of a windowed row is the plain state of the keys inside its window, the empty
/// state when none is), and the soft cap is a per-score transform, so states of disjoint key
/// sets still merge exactly with ⊕.
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "attnstate/core/config.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/lse_base.hpp"

namespace attnstate {

/// No sliding window (every key up to the causal limit).
constexpr std::int64_t kNoWindow = -1;

/// Score variants applied before the softmax, shared by every backend. The default is plain
/// attention.
struct AttentionVariant {
  /// Sliding window: a query row at key position p sees keys [p - window_left, p] (with the
  /// decode's q_len > 1 causal rule giving p). kNoWindow (-1): no window. 0: only the key at p.
  std::int64_t window_left = kNoWindow;
  /// Logits soft cap: the scaled score s = scale * q.k becomes cap * tanh(s / cap) before the
  /// softmax; 0: none; else finite and > 0.
  float logits_soft_cap = 0.f;

  /// True for plain attention (no window, no cap).
  bool is_plain() const { return window_left == kNoWindow && logits_soft_cap == 0.f; }
};

/// The first key position a row at position `p` sees: `max(0, p - window_left)`, or 0 without a
/// window. Positions are 64-bit; `p - window_left` cannot overflow for `window_left ≥ -1` and
/// `p` a key position of a cache.
ATTNSTATE_HOST_DEVICE std::int64_t window_begin(std::int64_t p, std::int64_t window_left) {
  if (window_left < 0) return 0;
  const std::int64_t lo = p - window_left;
  return lo > 0 ? lo : 0;
}

namespace math {

/// The soft-capped score `cap · tanh(s / cap)` of a scaled score `s` (`cap > 0`), in fp32. The
/// online softmax then takes it times `log2(e)` (base-2 scores).
ATTNSTATE_HOST_DEVICE float soft_cap(float s, float cap) {
#if ATTNSTATE_DEVICE_PASS
  return cap * tanhf(s / cap);
#else
  return cap * std::tanh(s / cap);
#endif
}

/// The base-2 score the online softmax takes for a raw dot product `q·k`: `dot · scale ·
/// log2(e)` as `base2_score_scale` gives it, or with a cap (`cap > 0`)
/// `soft_cap(dot · scale, cap) · log2(e)`, the cap acting on the scaled score.
struct ScoreMap {
  float s2_scale = 0.f;  ///< `scale · log2(e)` (the plain path's one multiply).
  float scale = 0.f;     ///< Softmax scale.
  float cap = 0.f;       ///< Logits soft cap; 0: none.

  /// The base-2 score of `dot`.
  ATTNSTATE_HOST_DEVICE float operator()(float dot) const {
    if (cap == 0.f) return dot * s2_scale;
    return soft_cap(dot * scale, cap) * constants::kLog2e;
  }
};

/// The score map of a softmax scale and a soft cap (0: none).
ATTNSTATE_HOST_DEVICE ScoreMap make_score_map(float scale, float cap) {
  ScoreMap m;
  m.s2_scale = scale * constants::kLog2e;  // = base2_score_scale(scale)
  m.scale = scale;
  m.cap = cap;
  return m;
}

}  // namespace math

namespace detail {

/// Checks a variant: `window_left ≥ -1` (kNoWindow) and `logits_soft_cap` 0 or finite and > 0.
/// Throws `Error(kInvalidArgument)` from `fn` naming `<arg>.window_left` or
/// `<arg>.logits_soft_cap` (e.g. `options.variant.window_left`).
inline void check_variant(const char* fn, const char* arg, const AttentionVariant& v) {
  if (v.window_left < kNoWindow) {
    const std::string name = std::string(arg) + ".window_left";
    throw_argument(fn, name.c_str(), ">= 0 keys, or kNoWindow (-1) for no window",
                   std::to_string(v.window_left));
  }
  const float c = v.logits_soft_cap;
  if (c != 0.f && !(std::isfinite(c) && c > 0.f)) {
    const std::string name = std::string(arg) + ".logits_soft_cap";
    std::ostringstream got;
    got << c;
    throw_argument(fn, name.c_str(), "0 (no cap) or a finite cap > 0", got.str());
  }
}

}  // namespace detail
}  // namespace attnstate
