/// @file host_tensor.cpp
/// @brief `HostTensor`: owning, contiguous host storage in a declared dtype.
#include "attnstate/testing/host_tensor.hpp"

#include <string>
#include <utility>

#include "arg_checks.hpp"
#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"

namespace attnstate {
namespace testing {

namespace {

float load(const void* data, DType dt, std::int64_t i) {
  return dispatch_dtype_with_fp8(dt, [&](auto tag) {
    using T = decltype(tag);
    return to_float(static_cast<const T*>(data)[i]);
  });
}

void store(void* data, DType dt, std::int64_t i, float x) {
  dispatch_dtype_with_fp8(dt, [&](auto tag) {
    using T = decltype(tag);
    static_cast<T*>(data)[i] = from_float<T>(x);
    return 0;
  });
}

/// Validates `dtype` and `shape` for `func` and returns the element count: 1 to 4 extents, each
/// >= 0, elements and bytes both at most kMaxSize (so every offset into the tensor fits in 64
/// bits).
std::int64_t checked_numel(DType dtype, const std::vector<std::int64_t>& shape, const char* func) {
  kit::check_dtype(dtype, func, "dtype", /*fp8=*/true);
  if (shape.empty() || shape.size() > 4) {
    detail::throw_argument(func, "shape", "1 to 4 extents", std::to_string(shape.size()));
  }
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      detail::throw_argument(func, ("shape[" + std::to_string(i) + "]").c_str(), ">= 0",
                             std::to_string(shape[i]));
    }
  }
  const std::int64_t numel = checked_product(shape.data(), static_cast<int>(shape.size()));
  std::int64_t bytes = 0;
  if (numel < 0 || !checked_mul(numel, static_cast<std::int64_t>(size_of(dtype)), &bytes)) {
    std::string got;
    for (std::size_t i = 0; i < shape.size(); ++i)
      got += (i ? " x " : "") + std::to_string(shape[i]);
    detail::throw_argument(func, "shape", "at most 2^62 bytes in all",
                           got + " " + to_string(dtype) + " elements");
  }
  return numel;
}

}  // namespace

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  const char* fn = "attnstate::testing::HostTensor";
  numel_ = checked_numel(dtype_, shape_, fn);
  const std::int64_t bytes = numel_ * static_cast<std::int64_t>(size_of(dtype_));  // checked
  kit::assign_or_throw(storage_, (bytes + 3) / 4, 0.f, fn, "shape");
}

HostTensor HostTensor::from_floats(DType dtype, std::vector<std::int64_t> shape,
                                   const std::vector<float>& values) {
  const char* fn = "attnstate::testing::HostTensor::from_floats";
  // Checked before allocating: a wrong count is reported as such, not as a failed allocation.
  const std::int64_t numel = checked_numel(dtype, shape, fn);
  if (static_cast<std::int64_t>(values.size()) != numel) {
    detail::throw_argument(fn, "values", std::to_string(numel) + " elements (the shape's)",
                           std::to_string(values.size()));
  }
  HostTensor t(dtype, std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    store(t.storage_.data(), dtype, i, values[static_cast<std::size_t>(i)]);
  return t;
}

std::int64_t HostTensor::dim(int i) const {
  kit::check_index(i, rank(), "attnstate::testing::HostTensor::dim", "i");
  return shape_[static_cast<std::size_t>(i)];
}

float HostTensor::get(std::int64_t i) const {
  kit::check_index(i, numel_, "attnstate::testing::HostTensor::get", "i");
  return load(storage_.data(), dtype_, i);
}

void HostTensor::set(std::int64_t i, float x) {
  kit::check_index(i, numel_, "attnstate::testing::HostTensor::set", "i");
  store(storage_.data(), dtype_, i, x);
}

void HostTensor::fill(float x) {
  for (std::int64_t i = 0; i < numel_; ++i) store(storage_.data(), dtype_, i, x);
}

std::vector<float> HostTensor::to_floats() const {
  std::vector<float> out;
  kit::assign_or_throw(out, numel_, 0.f, "attnstate::testing::HostTensor::to_floats", "this");
  for (std::int64_t i = 0; i < numel_; ++i)
    out[static_cast<std::size_t>(i)] = load(storage_.data(), dtype_, i);
  return out;
}

ConstTensorView HostTensor::view() const {
  ConstTensorView t;
  t.data = storage_.data();
  t.dtype = dtype_;
  t.space = MemorySpace::kHost;
  t.rank = rank();
  std::int64_t s = 1;
  for (int k = t.rank - 1; k >= 0; --k) {
    t.shape[k] = shape_[static_cast<std::size_t>(k)];
    t.stride[k] = s;
    s *= t.shape[k];
  }
  return t;
}

}  // namespace testing
}  // namespace attnstate
