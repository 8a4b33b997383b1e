/// @file fi_buffers.hpp
/// @brief The workspace buffers of the FlashInfer runners (fi_decode_kernel.cu,
///        fi_mla_kernel.cu): a device buffer and a page-locked host buffer that free themselves,
///        and the CUDA error check that names the call. Host code only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace fib {

/// Throws std::runtime_error naming `what` unless `e` is cudaSuccess.
inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// Device memory of `bytes` (none when 0), freed on reset and destruction.
struct DeviceBuffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  void reset(std::size_t n) {
    release();
    if (n > 0) cuda_ok(cudaMalloc(&p, n), "cudaMalloc (workspace)");
    bytes = n;
  }
  void release() {
    if (p != nullptr) cudaFree(p);
    p = nullptr;
    bytes = 0;
  }
  ~DeviceBuffer() { release(); }
};

/// Page-locked host memory (at least 16 bytes), freed on reset and destruction.
struct PinnedBuffer {
  void* p = nullptr;
  void reset(std::size_t n) {
    release();
    cuda_ok(cudaMallocHost(&p, n > 0 ? n : 16), "cudaMallocHost (page-locked int workspace)");
  }
  void release() {
    if (p != nullptr) cudaFreeHost(p);
    p = nullptr;
  }
  ~PinnedBuffer() { release(); }
};

}  // namespace fib
