/// @file device_cache.cu
/// @brief `device_facts`: the facts of a device, gathered once per device ordinal.
#include "cuda/device_cache.hpp"

namespace attnstate {
namespace cuda {
namespace detail {
namespace {

/// Its static shared memory shows the host which code the runtime loaded for a device: 16 bytes
/// only in code built for sm_90a (the target of the `wgmma` kernels).
__global__ void sm90a_facts_probe_kernel(int* out) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ int s[4];
  s[threadIdx.x & 3] = static_cast<int>(threadIdx.x);
  __syncthreads();
  if (out != nullptr) out[threadIdx.x] = s[(threadIdx.x + 1) & 3];
#else
  (void)out;
#endif
}

DeviceFacts gather(int device) {
  DeviceFacts f;
  f.device = device;
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&f.sm_count, cudaDevAttrMultiProcessorCount, device));
  if (f.sm_count < 1) f.sm_count = 1;
  ATTNSTATE_CUDA_CHECK(
      cudaDeviceGetAttribute(&f.cc_major, cudaDevAttrComputeCapabilityMajor, device));
  ATTNSTATE_CUDA_CHECK(
      cudaDeviceGetAttribute(&f.cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  ATTNSTATE_CUDA_CHECK(
      cudaDeviceGetAttribute(&f.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  ATTNSTATE_CUDA_CHECK(
      cudaDeviceGetAttribute(&f.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  // the code loaded for the current device: look at `device` as the current one
  int current = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) ATTNSTATE_CUDA_CHECK(cudaSetDevice(device));
  cudaFuncAttributes fa{};
  const cudaError_t err = cudaFuncGetAttributes(&fa, sm90a_facts_probe_kernel);
  if (current != device) ATTNSTATE_CUDA_CHECK(cudaSetDevice(current));
  ATTNSTATE_CUDA_CHECK(err);
  f.sm90a_code = fa.sharedSizeBytes > 0;
  return f;
}

}  // namespace

const DeviceFacts& device_facts(int device) {
  static PerDevice<DeviceFacts> cache;
  return cache.get(device, gather);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
