/// @file kernels/merge/launch.cuh
/// @brief Launch geometry shared by the merge kernels: rows `(token, head)` of `o` are tiled
///        across a grid-stride 1-D grid, a few threads per row, each thread one or two chunks.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "attnstate/cuda/check.hpp"
#include "catalog/kernel_shapes.hpp"
#include "cuda/device_cache.hpp"
#include "cuda/launch.hpp"
#include "cuda/tile/vec.cuh"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Threads per block of the merge kernels (fewer when the problem does not fill the GPU).
constexpr int kMergeBlock = catalog::kMergeBlock;
/// Smallest block used for small problems (spreads a few rows over more SMs).
constexpr int kMinBlock = catalog::kMergeMinBlock;
static_assert(kChunk == catalog::kMergeChunk, "the catalog's chunk is the kernels'");

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
/// two, at most 32, lanes of one warp) each handling chunks `g, g + group, ...` of the row's
/// `per_row` chunks of `kChunk` elements (the last one partial when head_dim is not a multiple
/// of `kChunk`), `chunks` of them at most.
struct RowSplit {
  int group;    ///< Threads per row.
  int chunks;   ///< Most chunks per thread (`ceil(per_row / group)`).
  int shift;    ///< log2(group).
  int per_row;  ///< Chunks of a row (`ceil(head_dim / kChunk)`).
};

/// The smallest power of two `>= n` (n >= 1).
inline int pow2_ceil(std::int64_t n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

/// The split of a row of `head_dim` elements (any head_dim >= 1): the fewest threads (a power
/// of two, at most 32) that leave each at most `min_chunks` (1 or 2) chunks, so a row of a power
/// of two chunks gets `per_row / min_chunks` threads of `min_chunks` chunks; rows of more than
/// `32 * min_chunks` chunks give each of 32 threads more.
inline RowSplit row_split(std::int64_t head_dim, int min_chunks = 1) {
  const std::int64_t per_row = (head_dim + kChunk - 1) / kChunk;
  const int group = std::min(32, pow2_ceil((per_row + min_chunks - 1) / min_chunks));
  int shift = 0;
  while ((1 << shift) < group) ++shift;
  return RowSplit{group, static_cast<int>((per_row + group - 1) / group), shift,
                  static_cast<int>(per_row)};
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
/// for fp8. Rows of a head_dim that is not a multiple of `kChunk` never do (`rows_chunked`).
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

/// True when a row of `head_dim` elements is whole chunks (the condition, with
/// `chunk_aligned` of every view, for vector access).
inline bool rows_chunked(std::int64_t head_dim) { return head_dim % kChunk == 0; }

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
