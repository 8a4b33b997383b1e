/// @file host_tensor.cpp
/// @brief `HostTensor`: owning, contiguous host storage in a declared dtype.
#include "attnstate/testing/host_tensor.hpp"

#include <string>
#include <utility>

#include "attnstate/core/error.hpp"

namespace attnstate {
namespace testing {

namespace {

float load(const void* data, DType dt, std::int64_t i) {
  return dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    return to_float(static_cast<const T*>(data)[i]);
  });
}

void store(void* data, DType dt, std::int64_t i, float x) {
  dispatch_dtype(dt, [&](auto tag) {
    using T = decltype(tag);
    static_cast<T*>(data)[i] = from_float<T>(x);
    return 0;
  });
}

}  // namespace

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  if (!is_valid(dtype)) {
    detail::throw_argument("HostTensor", "dtype", "f32, f16 or bf16",
                           std::to_string(static_cast<int>(dtype)));
  }
  if (shape_.empty() || shape_.size() > 4) {
    detail::throw_argument("HostTensor", "shape", "1 to 4 extents", std::to_string(shape_.size()));
  }
  numel_ = 1;
  for (std::int64_t d : shape_) {
    if (d < 0) detail::throw_argument("HostTensor", "shape", "extents >= 0", std::to_string(d));
    numel_ *= d;
  }
  const std::size_t bytes = static_cast<std::size_t>(numel_) * size_of(dtype_);
  storage_.assign((bytes + 3) / 4, 0.f);
}

HostTensor HostTensor::from_floats(DType dtype, std::vector<std::int64_t> shape,
                                   const std::vector<float>& values) {
  HostTensor t(dtype, std::move(shape));
  if (static_cast<std::int64_t>(values.size()) != t.numel()) {
    detail::throw_argument("HostTensor::from_floats", "values",
                           std::to_string(t.numel()) + " elements", std::to_string(values.size()));
  }
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, values[static_cast<std::size_t>(i)]);
  return t;
}

float HostTensor::get(std::int64_t i) const { return load(storage_.data(), dtype_, i); }

void HostTensor::set(std::int64_t i, float x) { store(storage_.data(), dtype_, i, x); }

void HostTensor::fill(float x) {
  for (std::int64_t i = 0; i < numel_; ++i) set(i, x);
}

std::vector<float> HostTensor::to_floats() const {
  std::vector<float> out(static_cast<std::size_t>(numel_));
  for (std::int64_t i = 0; i < numel_; ++i) out[static_cast<std::size_t>(i)] = get(i);
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
