/// @file cuda/plan_run_checks.hpp
/// @brief Checks the CUDA runners share: that a plan was made by this build's planner (its
///        kernel ids index this build's catalog) and that a scale pointer is memory the kernels
///        can read when they run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "attnstate/core/error.hpp"
#include "attnstate/cuda/check.hpp"
#include "catalog/catalog.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

/// Throws naming `plan` unless `fingerprint` (a plan's) is this build's catalog fingerprint;
/// `planner` names the function that makes the plans.
inline void check_plan_fingerprint(const char* fn, std::uint64_t fingerprint, const char* planner) {
  if (fingerprint == catalog::kFingerprint) return;
  char want[40], got[40];
  std::snprintf(want, sizeof want, "%016llx",
                static_cast<unsigned long long>(catalog::kFingerprint));
  std::snprintf(got, sizeof got, "%016llx", static_cast<unsigned long long>(fingerprint));
  attnstate::detail::throw_argument(
      fn, "plan",
      std::string("a plan from ") + planner + " of this build (kernel catalog fingerprint " + want +
          ")",
      fingerprint == 0 ? std::string("a plan no planner made (default-constructed)")
                       : std::string("a plan of another kernel catalog (fingerprint ") + got + ")");
}

/// Throws naming `name` unless `scales` is null or memory the kernels can read (device or
/// managed memory: the fp8 kernels read a cache's scales when they run).
inline void check_scale_memory(const char* fn, const char* name, const float* scales,
                               const char* what = "the kernel reads the scales") {
  if (scales == nullptr) return;
  cudaPointerAttributes a{};
  ATTNSTATE_CUDA_CHECK(cudaPointerGetAttributes(&a, scales));
  if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
    attnstate::detail::throw_argument(
        fn, name, std::string("device or managed memory (") + what + ")",
        a.type == cudaMemoryTypeHost ? "pinned host memory" : "host memory");
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
