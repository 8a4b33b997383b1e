/// @file host_tensor.hpp
/// @brief `HostTensor`: an owning, contiguous host tensor stored in its declared dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace testing {

/// An owning, contiguous (row-major) host tensor of rank 1 to 4 whose elements are stored in
/// `dtype` (f32, f16, bf16, or fp8 e4m3/e5m2). Values are written as floats and rounded once to
/// the dtype (round to nearest even; to fp8 saturating to the largest finite value, NaN staying
/// NaN); reads convert back exactly. An fp8 tensor holds the stored values: it carries no scale
/// (an `AttentionProblem` holds the scales of its fp8 keys and values). `view()` exposes the
/// storage to the library and to user kernels.
class HostTensor {
 public:
  /// An empty tensor (rank 0, no elements).
  HostTensor() = default;
  /// A zero-filled tensor of `shape` (1 to 4 extents, each ≥ 0) stored as `dtype`.
  /// @param dtype  storage dtype (f32, f16, bf16, e4m3 or e5m2).
  /// @param shape  extents, outermost first.
  /// @throws attnstate::Error (`kInvalidArgument`) for a bad rank, a negative extent (naming
  ///         `shape[i]`), an unknown dtype, or more than 2^62 bytes in all (`kMaxSize`,
  ///         core/checked.hpp); `kResourceExhausted` when the host cannot allocate it.
  HostTensor(DType dtype, std::vector<std::int64_t> shape);
  /// A tensor of `shape` holding `values` (row-major, `values.size()` = number of elements),
  /// each rounded once to `dtype`.
  /// @param dtype   storage dtype (f32, f16, bf16, e4m3 or e5m2).
  /// @param shape   extents, outermost first.
  /// @param values  the elements, row-major.
  /// @return the tensor.
  /// @throws attnstate::Error (`kInvalidArgument`) as the constructor, or when `values.size()`
  ///         is not the number of elements.
  static HostTensor from_floats(DType dtype, std::vector<std::int64_t> shape,
                                const std::vector<float>& values);

  /// @return the storage type of the elements.
  DType dtype() const { return dtype_; }
  /// @return the number of dimensions.
  int rank() const { return static_cast<int>(shape_.size()); }
  /// @return the extents, outermost first.
  const std::vector<std::int64_t>& shape() const { return shape_; }
  /// Extent of dimension `i`.
  /// @param i  the dimension (0 = outermost).
  /// @return its extent.
  /// @throws attnstate::Error (`kInvalidArgument`) naming `i` unless `0 <= i < rank()`.
  std::int64_t dim(int i) const;
  /// @return the total number of elements.
  std::int64_t numel() const { return numel_; }

  /// Element `i` of the flattened tensor, converted to float (exact).
  /// @param i  flat (row-major) index.
  /// @return the stored value as a float.
  /// @throws attnstate::Error (`kInvalidArgument`) naming `i` unless `0 <= i < numel()`.
  float get(std::int64_t i) const;
  /// Stores `x` at flat index `i`, rounded once to the dtype.
  /// @param i  flat (row-major) index.
  /// @param x  the value.
  /// @throws attnstate::Error (`kInvalidArgument`) naming `i` unless `0 <= i < numel()`.
  void set(std::int64_t i, float x);
  /// Stores `x` in every element.
  /// @param x  the value (rounded once to the dtype).
  void fill(float x);
  /// All elements as floats, row-major.
  /// @return `numel()` floats.
  std::vector<float> to_floats() const;

  /// Raw storage (`numel() * size_of(dtype())` bytes).
  /// @return a pointer to the first element.
  void* data() { return storage_.data(); }
  /// @copydoc data()
  const void* data() const { return storage_.data(); }
  /// A read-only, contiguous host view of the tensor.
  /// @return the view (valid while this tensor lives).
  ConstTensorView view() const;

 private:
  DType dtype_ = DType::kF32;
  std::vector<std::int64_t> shape_;
  std::int64_t numel_ = 0;
  std::vector<float> storage_;  // float-aligned backing store, reinterpreted per dtype
};

}  // namespace testing
}  // namespace attnstate
