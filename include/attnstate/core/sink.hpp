/// @file sink.hpp
/// @brief Attention sinks as states: head `h`'s sink logit `s_h` is the state `(o = 0, lse = s_h)`.
///
/// A sink adds `exp(s_h)` to the softmax denominator and nothing to the numerator, which is
/// exactly the merge with that state. So applying sinks is one merge, done once, at the end of
/// the whole expression (after every split, cascade level or GPU has been merged):
/// `merge_state_inplace(out, make_sink_state(...))` on either backend. Partial states stay
/// sink-free; merging the sink into two partials and then merging those counts it twice.
/// See docs/numerics.md ("Attention sinks").
#pragma once

#include <cstdint>
#include <string>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {

/// The attention sinks of one attention call (a layer's learned per-head logits), for the decode
/// and cascade overloads that apply them in their final merge: each output row `(token, h)` is
/// merged once with the sink state `(0, logits[h])` after every split and level, so the state
/// they return is that of the keys plus the sink (its LSE includes the sink's mass), and any
/// partial state they expose stays sink-free. A run-time argument, not a plan option: one plan
/// serves every layer of a step, each with its own sinks.
struct AttentionSinks {
  /// `heads_q` sink logits, fp32, natural base (as models store them), in the memory of the
  /// call (host for `cpu::`, device for `cuda::`; a CUDA call reads them when its kernels run, so
  /// a captured graph reads what the buffer holds at replay). Null: no sinks.
  const float* logits = nullptr;
  /// True when there are no sinks.
  bool none() const { return logits == nullptr; }
};

/// The state of per-head attention sinks over `tokens` rows of `heads` heads: row `(t, h)` is
/// `(o = 0, lse = sink_lse[h])`, broadcast over tokens (`lse_stride_token = 0`) and reading the
/// same `head_dim` zeros for every row (`o` strides 0), so it needs no per-row memory. Merged
/// into a state of the same shape it applies the sinks: the merged LSE is `log(e^lse + e^s)`
/// and `o` is scaled by `e^lse / (e^lse + e^s)`; an empty row becomes `(0, s)`.
/// @param sink_lse  `heads` sink logits, fp32, in `base` (a model's sinks are natural-base
///                  logits: LseBase::kNatural), in memory of `space`.
/// @param zeros     `head_dim` zeros of `dtype`, in memory of `space` (the sink's `o`; the
///                  caller keeps them zero and alive while the view is used).
/// @param dtype     dtype of `zeros` (any of the merges' `o` dtypes).
/// @param tokens    rows the state spans (those of the state it is merged into).
/// @param heads     query heads.
/// @param head_dim  head dimension.
/// @param base      base of `sink_lse`.
/// @param space     where `sink_lse` and `zeros` live.
/// @throws Error(kInvalidArgument) naming the argument for null pointers, `tokens < 0`,
///         `heads < 1` or `head_dim < 1`.
inline ConstStateView make_sink_state(const float* sink_lse, const void* zeros, DType dtype,
                                      std::int64_t tokens, std::int64_t heads,
                                      std::int64_t head_dim, LseBase base,
                                      MemorySpace space = MemorySpace::kHost) {
  const char* fn = "attnstate::make_sink_state";
  if (sink_lse == nullptr) detail::throw_argument(fn, "sink_lse", "non-null", "null");
  if (zeros == nullptr) detail::throw_argument(fn, "zeros", "non-null (head_dim zeros)", "null");
  if (tokens < 0) detail::throw_argument(fn, "tokens", ">= 0", std::to_string(tokens));
  if (heads < 1) detail::throw_argument(fn, "heads", ">= 1", std::to_string(heads));
  if (head_dim < 1) detail::throw_argument(fn, "head_dim", ">= 1", std::to_string(head_dim));
  ConstStateView v;
  v.o = zeros;
  v.lse = sink_lse;
  v.tokens = tokens;
  v.heads = heads;
  v.head_dim = head_dim;
  v.o_stride_token = 0;
  v.o_stride_head = 0;
  v.lse_stride_token = 0;
  v.lse_stride_head = 1;
  v.dtype = dtype;
  v.base = base;
  v.space = space;
  return v;
}

}  // namespace attnstate
