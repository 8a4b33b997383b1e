/// @file device_cache.hpp
/// @brief The CUDA backend's one per-device cache (`PerDevice<T>`: a value computed once per
///        device ordinal, thread-safe) and the facts of a device gathered once through it
///        (`DeviceFacts`: SM count, compute capability, the sm_90a code, the shared memory).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "attnstate/cuda/check.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

/// Lets this thread make non-stream CUDA calls (attribute settings, occupancy queries) while a
/// stream is being captured; restores the previous capture mode on scope exit.
struct RelaxedCaptureMode {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  RelaxedCaptureMode() { ATTNSTATE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode)); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;
};

/// The ordinal of the current device.
inline int current_device() {
  int device = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

/// A value of type `T` per device ordinal, computed once (the first call for a device runs
/// `compute(device)` under the cache's lock; later calls return the stored value). References
/// stay valid for the life of the cache. A `compute` that throws stores nothing (the next call
/// tries again). Function attributes and occupancy belong to the device context, so a process
/// driving several GPUs keeps one value per device.
template <class T>
class PerDevice {
 public:
  /// The value for `device`, computing it with `compute(device)` on first use.
  template <class F>
  const T& get(int device, F&& compute) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device < 0) device = 0;
    const auto i = static_cast<std::size_t>(device);
    if (i >= values_.size()) values_.resize(i + 1);
    if (!values_[i]) values_[i] = std::make_unique<T>(compute(device));
    return *values_[i];
  }
  /// The value for the current device.
  template <class F>
  const T& current(F&& compute) {
    return get(current_device(), static_cast<F&&>(compute));
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<T>> values_;
};

/// What the backend needs to know about a device, gathered once per device (`device_facts`).
struct DeviceFacts {
  int device = 0;           ///< Ordinal.
  int sm_count = 1;         ///< `cudaDevAttrMultiProcessorCount` (at least 1).
  int cc_major = 0;         ///< Compute capability, major.
  int cc_minor = 0;         ///< Compute capability, minor.
  bool sm90a_code = false;  ///< The code the runtime loaded for it was built for sm_90a.
  int smem_optin = 0;       ///< Opt-in dynamic shared memory per block, bytes.
  int smem_per_sm = 0;      ///< Shared memory per SM, bytes.
  /// The `wgmma` kernels can run: an sm_90 part running code built for sm_90a (a build for
  /// plain `90` has none).
  bool wgmma() const { return cc_major == 9 && cc_minor == 0 && sm90a_code; }
};

/// The facts of `device`, gathered on first use and cached (capture-safe: no stream operation).
const DeviceFacts& device_facts(int device);
/// The facts of the current device.
inline const DeviceFacts& device_facts() { return device_facts(current_device()); }

/// Raises `kKernel`'s dynamic shared-memory limit to `smem` bytes and prefers the largest
/// shared-memory carveout, once per device (the first call may come while the caller captures a
/// graph: these are not stream operations).
template <auto kKernel>
void raise_smem_limit(int smem) {
  static PerDevice<bool> done;
  done.current([smem](int) {
    RelaxedCaptureMode relaxed;
    ATTNSTATE_CUDA_CHECK(
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    ATTNSTATE_CUDA_CHECK(
        cudaFuncSetAttribute(kKernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    return true;
  });
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
