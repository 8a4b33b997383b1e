/// @file check.cpp
/// @brief Launch checking and the debug-sync switch of the cuda backend.
#include "attnstate/cuda/check.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

bool debug_sync_enabled() {
#if defined(ATTNSTATE_DEBUG_SYNC) && ATTNSTATE_DEBUG_SYNC
  return true;  // a build with -DATTNSTATE_DEBUG_SYNC=ON
#else
  return false;
#endif
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
