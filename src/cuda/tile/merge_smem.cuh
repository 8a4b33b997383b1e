/// @file tile/merge_smem.cuh
/// @brief Host side of the merge kernels that stage their inputs in large dynamic shared memory:
///        the device's shared-memory limits, a once-per-device preparation of each such kernel,
///        and the number of its blocks resident per SM.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <mutex>

#include "attnstate/cuda/check.hpp"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Devices whose per-device facts the merge kernels cache.
constexpr int kMaxCachedDevices = 64;

/// Shared-memory limits of a device.
struct SmemLimits {
  int per_sm;     ///< Shared memory per SM, bytes.
  int per_block;  ///< Largest dynamic shared memory one block may opt in to, bytes.
  int reserved;   ///< Shared memory the system reserves per block, bytes.
  int arch;       ///< Compute capability as 10 * major + minor.
};

/// The shared-memory limits of the current device (queried once per device).
inline SmemLimits smem_limits() {
  static std::mutex mutex;
  static SmemLimits cache[kMaxCachedDevices] = {};
  int dev = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mutex);
  if (dev >= 0 && dev < kMaxCachedDevices && cache[dev].per_sm > 0) return cache[dev];
  SmemLimits l{};
  int major = 0, minor = 0;
  ATTNSTATE_CUDA_CHECK(
      cudaDeviceGetAttribute(&l.per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  ATTNSTATE_CUDA_CHECK(
      cudaDeviceGetAttribute(&l.per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  ATTNSTATE_CUDA_CHECK(
      cudaDeviceGetAttribute(&l.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  l.arch = 10 * major + minor;
  if (dev >= 0 && dev < kMaxCachedDevices) cache[dev] = l;
  return l;
}

/// What the host knows of one shared-memory kernel on the current device.
struct SmemKernelInfo {
  bool usable;   ///< Its code was built for `min_arch` or newer and the device is such a one.
  int resident;  ///< Blocks per SM by threads and registers alone.
};

/// Per device, once per kernel (`kKernel`, a distinct instantiation per kernel): whether the
/// kernel can run here (its code was compiled for at least `min_arch`, e.g. 90 for the bulk
/// copies, and the device has that architecture), and if so lets it use the largest dynamic
/// shared memory a block may have and counts its resident blocks by threads and registers.
template <auto kKernel>
SmemKernelInfo prepare_smem_kernel(int threads, int min_arch) {
  static std::mutex mutex;
  static SmemKernelInfo cache[kMaxCachedDevices] = {};
  static bool known[kMaxCachedDevices] = {};
  int dev = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  const SmemLimits lim = smem_limits();
  std::lock_guard<std::mutex> lock(mutex);
  if (dev >= 0 && dev < kMaxCachedDevices && known[dev]) return cache[dev];
  SmemKernelInfo info{false, 1};
  cudaFuncAttributes fa{};
  ATTNSTATE_CUDA_CHECK(cudaFuncGetAttributes(&fa, kKernel));
  if (lim.arch >= min_arch && fa.ptxVersion >= min_arch && fa.binaryVersion >= min_arch) {
    ATTNSTATE_CUDA_CHECK(
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, lim.per_block));
    int n = 0;
    ATTNSTATE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, threads, 0));
    info = SmemKernelInfo{true, n < 1 ? 1 : n};
  }
  if (dev >= 0 && dev < kMaxCachedDevices) {
    cache[dev] = info;
    known[dev] = true;
  }
  return info;
}

/// Blocks of a kernel resident per SM when each takes `smem` bytes of dynamic shared memory and
/// `by_threads` fit by threads and registers alone (at least 1).
inline int smem_blocks_per_sm(int by_threads, std::size_t smem) {
  const SmemLimits lim = smem_limits();
  const int by_smem = static_cast<int>(static_cast<std::size_t>(lim.per_sm) /
                                       (smem + static_cast<std::size_t>(lim.reserved)));
  return std::max(1, std::min(by_threads, by_smem));
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
