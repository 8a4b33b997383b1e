/// @file cuda_test_utils.hpp
/// @brief Helpers for GPU tests: skip without a GPU, RAII device buffers, NaN poisoning.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cuda/check.hpp"

namespace attnstate_test {

/// Expects `f()` to throw attnstate::Error with `status` and a message naming `'arg'` (and,
/// when `fn` is given, naming the function: e.g. "attnstate::cuda::").
template <class F>
void expect_named_error(F&& f, attnstate::Status status, const std::string& arg,
                        const char* fn = nullptr) {
  try {
    f();
    ADD_FAILURE() << "no error thrown (expected one naming '" << arg << "')";
  } catch (const attnstate::Error& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + arg + "'"), std::string::npos) << e.what();
    if (fn != nullptr) {
      EXPECT_NE(std::string(e.what()).find(fn), std::string::npos) << e.what();
    }
  }
}

/// True when a CUDA device is usable.
inline bool gpu_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

/// Streaming multiprocessors of the current device.
inline int device_sms() {
  int dev = 0, n = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

/// Skips the current test cleanly when no GPU is present.
#define ATTNSTATE_REQUIRE_GPU()                                               \
  do {                                                                        \
    if (!::attnstate_test::gpu_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

/// Owning device allocation of `n` elements of T.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n) ATTNSTATE_CUDA_CHECK(cudaMalloc(&p_, n * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  std::size_t bytes() const { return n_ * sizeof(T); }
  // upload() and poison() return with the device memory written: cudaMemcpy from pageable memory
  // may return before its DMA lands, and cudaMemset runs on the legacy stream, which a
  // non-blocking stream (a test's graph replay, say) does not wait for.
  void upload(const std::vector<T>& host) {
    ATTNSTATE_CUDA_CHECK(
        cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_) ATTNSTATE_CUDA_CHECK(cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return h;
  }
  /// Fills every byte with 0xFF: NaN for f32, f16 and bf16, so unwritten outputs show.
  void poison() {
    if (n_) ATTNSTATE_CUDA_CHECK(cudaMemset(p_, 0xFF, bytes()));
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Copies `h` to a device buffer of at least one element (so views are never null).
template <class T>
DeviceBuffer<T> upload(const std::vector<T>& h) {
  DeviceBuffer<T> d(std::max<std::size_t>(1, h.size()));
  if (!h.empty()) d.upload(h);
  return d;
}

}  // namespace attnstate_test
