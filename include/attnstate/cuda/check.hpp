/// @file check.hpp
/// @brief CUDA error checking for the cuda backend: every runtime call and every launch is
///        checked and turned into `attnstate::Error(Status::kCudaError)`.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "attnstate/core/error.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

/// Throws `Error(kCudaError)` for `err`, returned by `what`. The failing call also recorded `err`
/// as the thread's last error: it is consumed here (a non-sticky one is cleared), so that a later
/// launch check does not report it again against another kernel.
[[noreturn]] inline void throw_cuda(cudaError_t err, const char* what, const char* file, int line) {
  (void)cudaGetLastError();
  throw Error(Status::kCudaError, std::string("attnstate: CUDA error in ") + what + " (" + file +
                                      ":" + std::to_string(line) + "): " + cudaGetErrorName(err) +
                                      ": " + cudaGetErrorString(err));
}

/// True when launches are followed by a stream synchronisation (debug aid: a build configured
/// with `-DATTNSTATE_DEBUG_SYNC=ON`). Never done during graph capture.
bool debug_sync_enabled();

/// Checks the last launch on `stream` (and synchronises it in debug-sync mode unless capturing).
void check_launch(cudaStream_t stream, const char* kernel, const char* file, int line);

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate

/// Checks a CUDA runtime call; throws `attnstate::Error(kCudaError)` on failure.
#define ATTNSTATE_CUDA_CHECK(call)                                                      \
  do {                                                                                  \
    cudaError_t attnstate_err_ = (call);                                                \
    if (attnstate_err_ != cudaSuccess)                                                  \
      ::attnstate::cuda::detail::throw_cuda(attnstate_err_, #call, __FILE__, __LINE__); \
  } while (0)

/// Checks the launch just made on `stream` (use right after every `<<<...>>>`).
#define ATTNSTATE_CHECK_LAUNCH(stream, name) \
  ::attnstate::cuda::detail::check_launch((stream), (name), __FILE__, __LINE__)
