/// @file lse_base.hpp
/// @brief The base tag every log-sum-exp carries: natural log (FlashAttention) or base 2
/// (FlashInfer).
#pragma once

#include <cstdint>

#include "attnstate/core/config.hpp"

namespace attnstate {

/// The base of a stored log-sum-exp.
///
/// A state with base `kNatural` stores `lse = ln Σ e^{s_i}`; a state with base `kBase2` stores
/// `lse = log2 Σ 2^{s_i log2 e}` = `ln Σ e^{s_i} / ln 2`. Both describe the same softmax mass;
/// merging states is exact whatever their bases, because every operation converts on load.
enum class LseBase : std::uint8_t {
  kNatural = 0,  ///< `lse = ln Σ exp(s_i)` (FlashAttention, PyTorch).
  kBase2 = 1,    ///< `lse = log2 Σ exp(s_i)` (FlashInfer).
};

/// Human-readable name of a base ("natural" or "base2").
inline const char* to_string(LseBase base) { return base == LseBase::kBase2 ? "base2" : "natural"; }

namespace constants {
/// log2(e).
constexpr float kLog2e = 1.4426950408889634f;
/// ln(2).
constexpr float kLn2 = 0.6931471805599453f;
}  // namespace constants

}  // namespace attnstate
