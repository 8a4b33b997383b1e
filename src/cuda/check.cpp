/// @file check.cpp
/// @brief Launch checking and the debug-sync switch of the cuda backend.
#include "attnstate/cuda/check.hpp"

#include <cstdlib>
#include <cstring>

namespace attnstate {
namespace cuda {
namespace detail {

bool debug_sync_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("ATTNSTATE_DEBUG_SYNC");
    return v != nullptr && std::strcmp(v, "0") != 0 && v[0] != '\0';
  }();
  return enabled;
}

void check_launch(cudaStream_t stream, const char* kernel, const char* file, int line) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw_cuda(err, kernel, file, line);
  if (debug_sync_enabled()) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    err = cudaStreamIsCapturing(stream, &capture);
    if (err != cudaSuccess) throw_cuda(err, "cudaStreamIsCapturing", file, line);
    if (capture == cudaStreamCaptureStatusNone) {
      err = cudaStreamSynchronize(stream);
      if (err != cudaSuccess) throw_cuda(err, kernel, file, line);
    }
  }
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
