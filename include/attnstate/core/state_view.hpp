/// @file state_view.hpp
/// @brief Non-owning views of attention states `(o, lse)` and of stacks of states, tagged with
///        their LSE base, dtype and memory space.
///
/// A state view describes, for `tokens × heads` rows, the normalised output
/// `o (tokens, heads, head_dim)` in f32/f16/bf16 (or fp8 e4m3/e5m2 with a scale, in the merges)
/// and `lse (tokens, heads)` in fp32. Strides are
/// in elements; `head_dim` is always contiguous (stride 1). The LSE base is part of the view, so
/// states of different conventions cannot be mixed silently.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/lse_base.hpp"

namespace attnstate {

/// Where a view's memory lives.
enum class MemorySpace : std::uint8_t {
  kHost = 0,    ///< Host memory (the cpu backend).
  kDevice = 1,  ///< CUDA device memory (the cuda backend).
};

/// Name of a memory space ("host" or "device").
inline const char* to_string(MemorySpace s) {
  return s == MemorySpace::kDevice ? "device" : "host";
}

/// Shape, strides and tags of a state view (everything but the pointers).
struct StateLayout {
  std::int64_t tokens = 0;                 ///< Number of tokens (rows of independent states).
  std::int64_t heads = 0;                  ///< Heads per token.
  std::int64_t head_dim = 0;               ///< Elements of `o` per (token, head); contiguous.
  std::int64_t o_stride_token = 0;         ///< Elements between consecutive tokens of `o`.
  std::int64_t o_stride_head = 0;          ///< Elements between consecutive heads of `o`.
  std::int64_t lse_stride_token = 0;       ///< Elements between consecutive tokens of `lse`.
  std::int64_t lse_stride_head = 0;        ///< Elements between consecutive heads of `lse`.
  DType dtype = DType::kF32;               ///< Storage type of `o`.
  LseBase base = LseBase::kNatural;        ///< Base of `lse`.
  MemorySpace space = MemorySpace::kHost;  ///< Where `o` and `lse` live.
  /// Scale of an fp8 `o`: stored value × `o_scale` = real value (an fp8 output is written as
  /// the saturating rounding of value / `o_scale`). Finite and > 0; 1 for every other dtype.
  float o_scale = 1.f;

  /// Offset in elements of `o[token, head, 0]`.
  ATTNSTATE_HOST_DEVICE std::int64_t o_offset(std::int64_t token, std::int64_t head) const {
    return token * o_stride_token + head * o_stride_head;
  }
  /// Offset in elements of `lse[token, head]`.
  ATTNSTATE_HOST_DEVICE std::int64_t lse_offset(std::int64_t token, std::int64_t head) const {
    return token * lse_stride_token + head * lse_stride_head;
  }
};

/// A writable state view: `o (tokens, heads, head_dim)` and `lse (tokens, heads)`.
struct StateView : StateLayout {
  void* o = nullptr;     ///< First element of `o`, of type `dtype`.
  float* lse = nullptr;  ///< First element of `lse` (fp32).
};

/// A read-only state view; any `StateView` converts to it.
struct ConstStateView : StateLayout {
  const void* o = nullptr;     ///< First element of `o`, of type `dtype`.
  const float* lse = nullptr;  ///< First element of `lse` (fp32).

  ConstStateView() = default;
  /// Views the same memory read-only.
  ConstStateView(const StateView& v)  // NOLINT(google-explicit-constructor): a widening conversion
      : StateLayout(v), o(v.o), lse(v.lse) {}
};

/// A per-token mask of bytes, for the masked merges: token `t` is selected when
/// `data[t * stride] != 0`. Any stride `>= 0`: 1 for a contiguous array, 0 to broadcast one flag
/// to every token (FlashInfer's masks take any stride). A null `data` selects every token. It
/// converts implicitly from a pointer to a contiguous mask.
struct TokenMask {
  const std::uint8_t* data = nullptr;  ///< Flag of token 0 (null: every token is selected).
  std::int64_t stride = 1;             ///< Bytes between the flags of consecutive tokens.

  TokenMask() = default;
  /// A contiguous mask (or none, for a null pointer).
  TokenMask(const std::uint8_t* p)  // NOLINT(google-explicit-constructor): a mask is a pointer
      : data(p) {}
  /// A mask with `stride` bytes between the flags of consecutive tokens.
  TokenMask(const std::uint8_t* p, std::int64_t s) : data(p), stride(s) {}

  /// True when token `t` is selected.
  ATTNSTATE_HOST_DEVICE bool selected(std::int64_t t) const {
    return data == nullptr || data[t * stride] != 0;
  }
};

namespace detail {

/// A contiguous stride: the product of the extents `x[0..n)` (named `names[i]`, function `fn`).
/// Negative extents are kept as given (the call taking the view rejects them, naming them);
/// throws naming the extent largest in magnitude when the product passes `kMaxSize`.
inline std::int64_t contiguous_stride(const char* fn, std::initializer_list<const char*> names,
                                      std::initializer_list<std::int64_t> x) {
  std::int64_t magnitude = 1;
  bool negative = false, fits = true;
  for (std::int64_t v : x) {
    negative ^= v < 0;
    fits = fits && v != INT64_MIN && checked_mul(magnitude, v < 0 ? -v : v, &magnitude);
  }
  if (fits) return negative ? -magnitude : magnitude;
  const char* largest = *names.begin();
  std::uint64_t big = 0;
  std::string got;
  const char* const* name = names.begin();
  for (std::int64_t v : x) {
    const std::uint64_t m =
        v < 0 ? 0 - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
    if (m > big) {
      big = m;
      largest = *name;
    }
    got += (got.empty() ? "" : " * ") + std::string(*name) + " = " + std::to_string(v);
    ++name;
  }
  throw_argument(fn, largest, "extents whose product is at most 2^62 elements", got);
}

}  // namespace detail

/// A contiguous state view: `o` laid out `[tokens, heads, head_dim]`, `lse` `[tokens, heads]`.
/// @throws Error (`kInvalidArgument`) naming the largest extent when `heads * head_dim` passes
///         2^62 (negative extents are kept, for the taking call to reject).
inline StateView make_state_view(void* o, DType dtype, float* lse, std::int64_t tokens,
                                 std::int64_t heads, std::int64_t head_dim, LseBase base,
                                 MemorySpace space = MemorySpace::kHost) {
  StateView v;
  v.o = o;
  v.lse = lse;
  v.tokens = tokens;
  v.heads = heads;
  v.head_dim = head_dim;
  v.o_stride_head = head_dim;
  v.o_stride_token = detail::contiguous_stride("attnstate::make_state_view", {"heads", "head_dim"},
                                               {heads, head_dim});
  v.lse_stride_head = 1;
  v.lse_stride_token = heads;
  v.dtype = dtype;
  v.base = base;
  v.space = space;
  return v;
}

/// A read-only contiguous state view: `o` laid out `[tokens, heads, head_dim]`, `lse`
/// `[tokens, heads]` (see make_state_view()).
inline ConstStateView make_const_state_view(const void* o, DType dtype, const float* lse,
                                            std::int64_t tokens, std::int64_t heads,
                                            std::int64_t head_dim, LseBase base,
                                            MemorySpace space = MemorySpace::kHost) {
  return make_state_view(const_cast<void*>(o), dtype, const_cast<float*>(lse), tokens, heads,
                         head_dim, base, space);
}

/// `v` with its LSE read head-major, `lse(t, h) = lse[h · lse_stride_head + t]`: the layout of
/// FlashAttention's `softmax_lse`. Its `(batch, heads, seqlen)` output is one view per batch
/// element (LSE pointer `softmax_lse + b · heads · seqlen`, `tokens = seqlen`); its varlen
/// `(heads, total_q)` output is one view with `lse_stride_head = total_q`. `lse_stride_head` 0
/// (the default) means `v.tokens`. (FlashInfer's LSE is `[tokens, heads]`, the factories'
/// default.)
/// @param v                a state view.
/// @param lse_stride_head  elements between the LSEs of consecutive heads; 0 means `v.tokens`.
/// @return `v` with `lse_stride_token = 1` and that `lse_stride_head`.
inline StateView with_head_major_lse(StateView v, std::int64_t lse_stride_head = 0) {
  v.lse_stride_token = 1;
  v.lse_stride_head = lse_stride_head > 0 ? lse_stride_head : v.tokens;
  return v;
}

/// `v` with its LSE read head-major (the read-only form of the overload above).
/// @param v                a read-only state view.
/// @param lse_stride_head  elements between the LSEs of consecutive heads; 0 means `v.tokens`.
/// @return `v` with `lse_stride_token = 1` and that `lse_stride_head`.
inline ConstStateView with_head_major_lse(ConstStateView v, std::int64_t lse_stride_head = 0) {
  v.lse_stride_token = 1;
  v.lse_stride_head = lse_stride_head > 0 ? lse_stride_head : v.tokens;
  return v;
}

/// Shape, strides and tags of a stack of `num_states` states over the same tokens and heads.
struct StateStackLayout : StateLayout {
  std::int64_t num_states = 0;        ///< S, the number of states merged per (token, head).
  std::int64_t o_stride_state = 0;    ///< Elements between consecutive states of `o`.
  std::int64_t lse_stride_state = 0;  ///< Elements between consecutive states of `lse`.
};

/// A read-only stack of states: for each (token, head) there are `num_states` states to merge.
struct ConstStateStackView : StateStackLayout {
  const void* o = nullptr;     ///< First element of `o`, of type `dtype`.
  const float* lse = nullptr;  ///< First element of `lse` (fp32).
};

/// The layout of a dense stack of states.
enum class StackOrder : std::uint8_t {
  kTokensMajor = 0,  ///< `o [tokens, S, heads, head_dim]`, `lse [tokens, S, heads]`.
  kStatesMajor = 1,  ///< `o [S, tokens, heads, head_dim]`, `lse [S, tokens, heads]`.
};

/// A contiguous stack of states in one of the two dense layouts (see `StackOrder`).
inline ConstStateStackView make_state_stack(const void* o, DType dtype, const float* lse,
                                            StackOrder order, std::int64_t tokens,
                                            std::int64_t num_states, std::int64_t heads,
                                            std::int64_t head_dim, LseBase base,
                                            MemorySpace space = MemorySpace::kHost) {
  ConstStateStackView v;
  v.o = o;
  v.lse = lse;
  v.tokens = tokens;
  v.num_states = num_states;
  v.heads = heads;
  v.head_dim = head_dim;
  v.o_stride_head = head_dim;
  v.lse_stride_head = 1;
  constexpr const char* kFn = "attnstate::make_state_stack";
  const std::int64_t row = detail::contiguous_stride(kFn, {"heads", "head_dim"}, {heads, head_dim});
  if (order == StackOrder::kTokensMajor) {
    v.o_stride_state = row;
    v.o_stride_token = detail::contiguous_stride(kFn, {"num_states", "heads", "head_dim"},
                                                 {num_states, heads, head_dim});
    v.lse_stride_state = heads;
    v.lse_stride_token =
        detail::contiguous_stride(kFn, {"num_states", "heads"}, {num_states, heads});
  } else {
    v.o_stride_token = row;
    v.o_stride_state =
        detail::contiguous_stride(kFn, {"tokens", "heads", "head_dim"}, {tokens, heads, head_dim});
    v.lse_stride_token = heads;
    v.lse_stride_state = detail::contiguous_stride(kFn, {"tokens", "heads"}, {tokens, heads});
  }
  v.dtype = dtype;
  v.base = base;
  v.space = space;
  return v;
}

/// A read-only view of a tensor of rank 1 to 4 (e.g. queries `[tokens, heads, head_dim]` or a
/// paged KV pool `[pages, page_size, heads, head_dim]`). Strides are in elements.
struct ConstTensorView {
  const void* data = nullptr;              ///< First element, of type `dtype`.
  DType dtype = DType::kF32;               ///< Element type.
  int rank = 0;                            ///< Number of dimensions (1..4).
  std::int64_t shape[4] = {0, 0, 0, 0};    ///< Extent of each dimension.
  std::int64_t stride[4] = {0, 0, 0, 0};   ///< Elements between consecutive indices of each dim.
  MemorySpace space = MemorySpace::kHost;  ///< Where `data` lives.

  /// Total number of elements; -1 when the rank is outside 0..4, an extent is negative or the
  /// product passes `kMaxSize` (core/checked.hpp).
  std::int64_t numel() const { return rank < 0 || rank > 4 ? -1 : checked_product(shape, rank); }
};

/// A contiguous (row-major) tensor view of rank `dims.size()` (1..4).
/// @throws Error (`kInvalidArgument`) naming `dims` unless it holds 1 to 4 dimensions, naming
///         `dims[i]` for a negative extent, and naming `dims` when the element count (or a
///         stride) passes `kMaxSize` (2^62).
inline ConstTensorView make_tensor_view(const void* data, DType dtype,
                                        std::initializer_list<std::int64_t> dims,
                                        MemorySpace space = MemorySpace::kHost) {
  constexpr const char* kFn = "attnstate::make_tensor_view";
  if (dims.size() < 1 || dims.size() > 4)
    detail::throw_argument(kFn, "dims", "1 to 4 dimensions", std::to_string(dims.size()));
  ConstTensorView t;
  t.data = data;
  t.dtype = dtype;
  t.space = space;
  t.rank = static_cast<int>(dims.size());
  int i = 0;
  for (std::int64_t d : dims) {
    if (d < 0)
      detail::throw_argument(kFn, ("dims[" + std::to_string(i) + "]").c_str(), ">= 0",
                             std::to_string(d));
    t.shape[i++] = d;
  }
  std::int64_t s = 1;
  for (int k = t.rank - 1; k >= 0; --k) {
    t.stride[k] = s;
    if (k > 0 && !checked_mul(s, t.shape[k], &s))
      detail::throw_argument(
          kFn, "dims", "extents whose product is at most 2^62 elements",
          "a product past 2^62 at dims[" + std::to_string(k) + "] = " + std::to_string(t.shape[k]));
  }
  if (t.numel() < 0)
    detail::throw_argument(kFn, "dims", "extents whose product is at most 2^62 elements",
                           "a product past 2^62 at dims[0] = " + std::to_string(t.shape[0]));
  return t;
}

}  // namespace attnstate
