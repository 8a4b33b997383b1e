/// @file kernels/merge/launch.cuh
/// @brief Launch geometry shared by the merge kernels: rows `(token, head)` of `o` are tiled
///        across a grid-stride 1-D grid, a few threads per row, each thread one or two chunks.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "attnstate/cuda/check.hpp"
#include "cuda/device_cache.hpp"
#include "cuda/launch.hpp"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Threads per block of the merge kernels (fewer when the problem does not fill the GPU).
constexpr int kMergeBlock = 256;
/// Smallest block used for small problems (spreads a few rows over more SMs).
constexpr int kMinBlock = 64;

/// Number of SMs of the current device (`detail::device_facts`: cached per device, capture-safe).
inline int sm_count() { return detail::device_facts().sm_count; }

/// Resident blocks of `kMergeBlock` threads per SM for `kKernel` (queried once per device).
template <auto kKernel>
int blocks_per_sm() {
  static detail::PerDevice<int> cache;
  return cache.current([](int) {
    int n = 0;
    ATTNSTATE_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, kMergeBlock, 0));
    return n < 1 ? 1 : n;
  });
}

/// Grid and block size of a grid-stride merge kernel.
struct LaunchShape {
  unsigned blocks;  ///< Blocks in the grid.
  int threads;      ///< Threads per block (a multiple of 32).
};

/// The launch of `total_threads` threads of a grid-stride loop: at most one wave of resident
/// blocks (so no partial last wave), and smaller blocks when the problem is smaller than one
/// block per SM (so a few rows still spread over many SMs).
inline LaunchShape launch_shape(std::int64_t total_threads, int resident_blocks_per_sm) {
  const std::int64_t sms = sm_count();
  int threads = kMergeBlock;
  while (threads > kMinBlock && total_threads < sms * threads) threads /= 2;
  const std::int64_t needed = (total_threads + threads - 1) / threads;
  const std::int64_t cap = sms * resident_blocks_per_sm * (kMergeBlock / threads);
  return LaunchShape{static_cast<unsigned>(std::max<std::int64_t>(1, std::min(needed, cap))),
                     threads};
}

/// Launches the grid-stride merge kernel `kKernel(args...)` over `total_threads` threads
/// (`launch_shape`) on `stream`; `name` names it in launch errors.
template <auto kKernel, class... Args>
void launch_grid_stride(std::int64_t total_threads, cudaStream_t stream, const char* name,
                        const Args&... args) {
  const LaunchShape shape = launch_shape(total_threads, blocks_per_sm<kKernel>());
  detail::LaunchConfig c;
  c.grid = dim3(shape.blocks);
  c.block = dim3(static_cast<unsigned>(shape.threads));
  c.stream = stream;
  detail::launch_kernel(c, kKernel, name, args...);
}

/// How the threads of a warp split one row of `head_dim` elements: `group` threads (a power of
/// two, at most 32, lanes of one warp) each handling `chunks` chunks of `kChunk` elements.
struct RowSplit {
  int group;   ///< Threads per row.
  int chunks;  ///< Chunks per thread (`head_dim / (kChunk * group)`).
  int shift;   ///< log2(group).
};

/// The split of a row of `head_dim` (a multiple of `kChunk`, at most `32 * 2 * kChunk`): at
/// least `min_chunks` (1 or 2) chunks per thread, at most 32 threads.
inline RowSplit row_split(std::int64_t head_dim, int min_chunks = 1) {
  const int per_row = static_cast<int>(head_dim / kChunk);
  const int want = per_row / min_chunks;
  const int group = want < 32 ? want : 32;
  int shift = 0;
  while ((1 << shift) < group) ++shift;
  return RowSplit{group, per_row / group, shift};
}

/// True when `p` is 16-byte aligned and every stride (in elements of `elem_size` bytes) keeps it
/// so: the condition for vector loads and stores of chunks.
inline bool vec_aligned(const void* p, std::size_t elem_size,
                        std::initializer_list<std::int64_t> strides) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16u != 0) return false;
  for (std::int64_t s : strides) {
    if ((s * static_cast<std::int64_t>(elem_size)) % 16 != 0) return false;
  }
  return true;
}

/// True when chunks of `elem_size`-byte elements at `p` with these strides allow vector access:
/// 16-byte alignment (`vec_aligned`) for f32 and the 16-bit dtypes, 8-byte (one word per chunk)
/// for fp8.
inline bool chunk_aligned(const void* p, std::size_t elem_size,
                          std::initializer_list<std::int64_t> strides) {
  if (elem_size * kChunk >= 16) return vec_aligned(p, elem_size, strides);
  const std::int64_t align = static_cast<std::int64_t>(elem_size) * kChunk;
  if (reinterpret_cast<std::uintptr_t>(p) % static_cast<std::uintptr_t>(align) != 0) return false;
  for (std::int64_t s : strides) {
    if ((s * static_cast<std::int64_t>(elem_size)) % align != 0) return false;
  }
  return true;
}

/// Group-wide reduction over `width` lanes (a power of two ≤ 32) of `op`, in a fixed order.
/// Every lane of the warp must call it (the enclosing loop is warp-uniform).
template <class Op>
__device__ __forceinline__ float group_reduce(float v, int width, Op op) {
  for (int off = width >> 1; off > 0; off >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
