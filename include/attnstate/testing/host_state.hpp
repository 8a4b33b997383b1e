/// @file host_state.hpp
/// @brief `HostState`: an owning attention state `(o, lse)` in host memory, tagged with its
///        dtype and LSE base, viewable by the library and by user kernels.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/testing/host_tensor.hpp"

namespace attnstate {
namespace testing {

/// An owning attention state in host memory: `o (tokens, heads, head_dim)` stored in `dtype`
/// and `lse (tokens, heads)` in fp32, in base `base`. The storage is contiguous, so `view()`
/// can be handed to `attnstate::cpu` functions or to a user kernel that writes a state.
///
/// A freshly constructed state is the identity of ⊕: every row is `(o = 0, lse = -inf)`.
class HostState {
 public:
  /// A state with no rows (0 tokens, 0 heads, 0 head_dim).
  HostState() = default;
  /// The empty state `(0, -inf)` of shape `(tokens, heads, head_dim)`, `o` stored in `dtype`,
  /// LSE in `base`.
  /// @param tokens    number of tokens (≥ 0).
  /// @param heads     heads per token (≥ 0).
  /// @param head_dim  elements of `o` per (token, head) (≥ 0).
  /// @param dtype     storage dtype of `o` (f32, f16 or bf16).
  /// @param base      base of the LSEs.
  /// @throws attnstate::Error (`kInvalidArgument`) naming the argument on a negative extent, an
  ///         invalid dtype or base, or sizes past 2^62 elements or bytes (`kMaxSize`,
  ///         core/checked.hpp); `kNotSupported` for an fp8 dtype (a host state holds no `o`
  ///         scale); `kResourceExhausted` when the host cannot allocate them.
  HostState(std::int64_t tokens, std::int64_t heads, std::int64_t head_dim, DType dtype,
            LseBase base);
  /// A deep copy of a host state view of any strides (`o` keeps the view's dtype, the LSEs
  /// keep its base): the easy way to return a kernel's host output to the kit.
  /// @param view  a state in host memory (e.g. `make_state_view(o, dtype, lse, ...)` over the
  ///              kernel's output buffers).
  /// @return an owning, contiguous copy with the view's shape, dtype and base.
  /// @throws attnstate::Error (`kInvalidArgument`) on a device view, a negative extent or
  ///         stride, strides whose span overflows, an invalid dtype or base, or a null pointer
  ///         where there is data to read; `kNotSupported` for an fp8 `o`.
  static HostState from_view(const ConstStateView& view);

  /// @return the number of tokens (independent query rows).
  std::int64_t tokens() const { return tokens_; }
  /// @return the heads per token.
  std::int64_t heads() const { return heads_; }
  /// @return the elements of `o` per (token, head).
  std::int64_t head_dim() const { return head_dim_; }
  /// @return the storage type of `o`.
  DType dtype() const { return o_.dtype(); }
  /// @return the base of the stored LSEs.
  LseBase base() const { return base_; }

  /// `o[t, h, d]` converted to float (exact).
  /// @param t  token; @param h  head; @param d  element.
  /// @return the stored value as a float.
  /// @throws attnstate::Error (`kInvalidArgument`) naming the index (`t`, `h` or `d`) that is
  ///         out of range (the same for `set_o`, `lse`, `set_lse` and `is_empty_row`).
  float o(std::int64_t t, std::int64_t h, std::int64_t d) const;
  /// Stores `o[t, h, d] = x`, rounded once to `dtype()`.
  /// @param t  token; @param h  head; @param d  element; @param x  the value.
  void set_o(std::int64_t t, std::int64_t h, std::int64_t d, float x);
  /// `lse[t, h]` in `base()`.
  /// @param t  token; @param h  head.
  /// @return the stored LSE.
  float lse(std::int64_t t, std::int64_t h) const;
  /// Stores `lse[t, h] = x` (interpreted in `base()`).
  /// @param t  token; @param h  head; @param x  the LSE.
  void set_lse(std::int64_t t, std::int64_t h, float x);
  /// True when row `(t, h)` is empty (`lse == -inf`).
  /// @param t  token; @param h  head.
  /// @return whether the row is empty.
  bool is_empty_row(std::int64_t t, std::int64_t h) const;

  /// The `o` tensor `(tokens, heads, head_dim)`.
  /// @return the tensor, stored in `dtype()`.
  const HostTensor& o_tensor() const { return o_; }
  /// @copydoc o_tensor() const
  HostTensor& o_tensor() { return o_; }
  /// The LSEs, row-major `(tokens, heads)`.
  /// @return the LSEs, in `base()`.
  const std::vector<float>& lse_values() const { return lse_; }
  /// @copydoc lse_values() const
  std::vector<float>& lse_values() { return lse_; }

  /// A writable contiguous view (`MemorySpace::kHost`) of this state.
  /// @return the view (valid while this state lives and is not resized).
  /// @throws attnstate::Error (`kInvalidArgument`) when `o_tensor()` or `lse_values()` was
  ///         replaced by storage of another size (also for the const `view()`).
  StateView view();
  /// A read-only contiguous view of this state.
  /// @return the view (valid while this state lives and is not resized).
  ConstStateView view() const;
  /// Same as the const `view()`, callable on a non-const state.
  /// @return a read-only view.
  ConstStateView const_view() const { return view(); }

  /// Fills `o` and `lse` with NaN, so that a kernel that leaves a value unwritten is caught.
  void poison();
  /// Changes the base tag WITHOUT touching the values (only for building deliberately
  /// mislabeled states in tests; use `converted()` to change the base correctly).
  /// @param base  the new tag.
  /// @throws attnstate::Error (`kInvalidArgument`) unless `base` is natural or base2.
  void relabel_base(LseBase base);
  /// A copy stored in `dtype` with LSEs converted to `base` (via `math::convert_lse`; `o`
  /// rounded once).
  /// @param dtype  storage dtype of the copy's `o`.
  /// @param base   base of the copy's LSEs.
  /// @return the converted copy.
  /// @throws attnstate::Error (`kInvalidArgument`) for an invalid dtype or base.
  HostState converted(DType dtype, LseBase base) const;

 private:
  // Bounds-checked flat indices; the storage (reachable through o_tensor() and lse_values())
  // is checked against the shape too, so a resized vector is an error, not a wild read.
  std::int64_t o_index(std::int64_t t, std::int64_t h, std::int64_t d, const char* func) const;
  std::size_t lse_index(std::int64_t t, std::int64_t h, const char* func) const;
  void check_storage(const char* func) const;

  std::int64_t tokens_ = 0;
  std::int64_t heads_ = 0;
  std::int64_t head_dim_ = 0;
  LseBase base_ = LseBase::kNatural;
  HostTensor o_{DType::kF32, {0, 0, 0}};
  std::vector<float> lse_;
};

/// Bitwise equality of two states.
/// @param a  a state.
/// @param b  another state.
/// @return true when `a` and `b` have the same shape, dtype and base and bitwise-identical `o`
///         and `lse` (NaN payloads included).
bool bitwise_equal(const HostState& a, const HostState& b);

/// Prints a state in a compact human-readable form (shape, dtype, base, each row's LSE and
/// its first `o` values). Used by RapidCheck to show counterexamples.
/// @param state  the state.
/// @param os     the stream written to.
void showValue(const HostState& state, std::ostream& os);
/// Streams `showValue(state)`.
/// @param os     the stream written to.
/// @param state  the state.
/// @return `os`.
std::ostream& operator<<(std::ostream& os, const HostState& state);

}  // namespace testing
}  // namespace attnstate
