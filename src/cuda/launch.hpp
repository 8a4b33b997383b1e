/// @file launch.hpp
/// @brief The CUDA backend's one launch helper: a `LaunchConfig` (grid, block, dynamic shared
///        memory, cluster, programmatic dependent launch, stream) and `launch_kernel`, which
///        builds the `cudaLaunchConfig_t` and its attributes, launches and checks the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "attnstate/cuda/check.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

/// How one kernel is launched.
struct LaunchConfig {
  dim3 grid{1};          ///< Blocks.
  dim3 block{1};         ///< Threads per block.
  std::size_t smem = 0;  ///< Dynamic shared memory per block, bytes.
  unsigned cluster = 1;  ///< Blocks per thread-block cluster (x); 1 = no cluster attribute.
  /// A programmatic dependent launch: its blocks may be placed while the previous kernel of the
  /// stream finishes (the kernel decides where it waits for it).
  bool pdl = false;
  cudaStream_t stream = nullptr;  ///< The caller's stream.
};

/// Fills `attrs` (room for 2) with the attributes of `c`; returns how many.
inline unsigned launch_attributes(const LaunchConfig& c, cudaLaunchAttribute* attrs) {
  unsigned n = 0;
  if (c.cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = c.cluster;
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (c.pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  return n;
}

/// The runtime's launch configuration of `c` over `attrs` (room for 2 attributes).
inline cudaLaunchConfig_t to_cuda(const LaunchConfig& c, cudaLaunchAttribute* attrs) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = c.grid;
  cfg.blockDim = c.block;
  cfg.dynamicSmemBytes = c.smem;
  cfg.stream = c.stream;
  cfg.numAttrs = launch_attributes(c, attrs);
  cfg.attrs = cfg.numAttrs > 0 ? attrs : nullptr;
  return cfg;
}

/// Launches `kernel(args...)` as `c` says (`cudaLaunchKernelEx`), then checks the launch
/// (`ATTNSTATE_CHECK_LAUNCH`, naming `name`).
template <class... Params, class... Args>
void launch_kernel(const LaunchConfig& c, void (*kernel)(Params...), const char* name,
                   Args&&... args) {
  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t cfg = to_cuda(c, attrs);
  ATTNSTATE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  ATTNSTATE_CHECK_LAUNCH(c.stream, name);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
