/// @file kernels/decode/common.cuh
/// @brief What every part of the decode kernels shares (internal): the shapes read from the
///        catalog, the start of a programmatic dependent launch and the probe stamps.
#pragma once

#include <cuda_runtime.h>

#include "cuda/arch/grid_dependency.cuh"
#include "cuda/arch/special.cuh"
#include "cuda/kernels/decode/params.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

// The shared-memory layout and occupancy (`catalog/kernel_shapes.hpp`, read by the planner too).
using catalog::decode_body_bytes;
using catalog::decode_ctas_per_sm;
using catalog::decode_ow_stride;
using catalog::decode_smem_bytes;

/// The decode kernels' start in a programmatic dependent launch: beside the previous kernel
/// (`p.beside_previous`) every CTA lets the next kernel launch and the grid's last CTA waits for
/// the previous one; chained (`p.programmatic`) every CTA does both. A no-op otherwise.
__device__ __forceinline__ void decode_grid_dependency(const DecodeParams& p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  if (p.beside_previous != 0 || p.programmatic != 0) {
    arch::launch_dependent_grids();
    if (p.programmatic != 0 || blockIdx.x == gridDim.x - 1) arch::wait_on_dependent_grids();
  }
#else
  (void)p;
#endif
}

#if ATTNSTATE_PROBES
/// Probe timeline: per CTA, globaltimer at start (0), partial state done (1), merge decision
/// (2), merge end (3), length known (4), first tile in shared memory (5), main loop done (6);
/// a CTA that runs the workspace merge overwrites 4..7 with SM clock values (cycles) at the
/// decision, the copies issued, the LSEs landed and the weights done.
// (one copy per translation unit: each decode unit's kernels stamp their own, read back by
// `decode_unit_timeline`)
static __device__ unsigned long long g_decode_timeline[kDecodeTimelineCtas * 8];
__device__ __forceinline__ void decode_mark(int slot) {
  if (threadIdx.x == 0 && blockIdx.x < static_cast<unsigned>(kDecodeTimelineCtas)) {
    g_decode_timeline[blockIdx.x * 8 + slot] = arch::globaltimer();
  }
}
/// As `decode_mark`, after `dep` is available.
__device__ __forceinline__ void decode_mark_dep(int slot, int dep) {
  if (threadIdx.x == 0 && blockIdx.x < static_cast<unsigned>(kDecodeTimelineCtas)) {
    g_decode_timeline[blockIdx.x * 8 + slot] = arch::globaltimer_after(dep);
  }
}
/// As `decode_mark`, the SM clock instead (cycles; the workspace merge's sub-phases).
__device__ __forceinline__ void decode_mark_clock(int slot) {
  if (threadIdx.x == 0 && blockIdx.x < static_cast<unsigned>(kDecodeTimelineCtas))
    g_decode_timeline[blockIdx.x * 8 + slot] = clock64();
}
#define ATTNSTATE_DECODE_MARK(slot) decode_mark(slot)
#define ATTNSTATE_DECODE_MARK_DEP(slot, dep) decode_mark_dep(slot, dep)
#define ATTNSTATE_DECODE_MARK_CLOCK(slot) decode_mark_clock(slot)
#else
#define ATTNSTATE_DECODE_MARK(slot) ((void)0)
#define ATTNSTATE_DECODE_MARK_DEP(slot, dep) ((void)0)
#define ATTNSTATE_DECODE_MARK_CLOCK(slot) ((void)0)
#endif

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
