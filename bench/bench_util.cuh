/// @file bench_util.cuh
/// @brief GPU helpers shared by the CUDA benchmarks: the bf16 fill of the inputs, the L2 flush
///        read, event-timed medians and the device-to-device copy bandwidth they compare with.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "attnstate/cuda/check.hpp"
#include "bench_util.hpp"
#include "hash_fill.cuh"

namespace bench_util {

// The kernels have internal linkage: each benchmark is one translation unit of its own, and one
// that does not launch a kernel must not export it.
namespace {

/// Fills `n` bf16 values with a hash of (index, seed) mapped to [-1, 1).
__global__ void fill_bf16(std::uint16_t* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(bench_hash::unit(i, seed)));
}

/// Reads `n` int4 of `p` (evicting the L2); `sink` is written only on an impossible value, so the
/// reads cannot be dropped.
__global__ void flush_read(const int4* p, std::size_t n, int* sink) {
  int acc = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const int4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7F3A5C1D) *sink = acc;
}

}  // namespace

/// The current device: its id, SM count and properties.
struct Device {
  int id = 0;
  int num_sms = 0;
  cudaDeviceProp prop{};
};

inline Device current_device() {
  Device d;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&d.id));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&d.num_sms, cudaDevAttrMultiProcessorCount, d.id));
  ATTNSTATE_CUDA_CHECK(cudaGetDeviceProperties(&d.prop, d.id));
  return d;
}

/// Median time (µs) of `reps` calls of `f` on `stream`, each timed by the events `e0` and `e1`
/// and preceded (untimed) by `before(i)`, i the index of the call.
template <class Before, class F>
double event_median_us(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, int reps,
                       Before&& before, F&& f) {
  std::vector<double> ms(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    before(i);
    ATTNSTATE_CUDA_CHECK(cudaEventRecord(e0, stream));
    f();
    ATTNSTATE_CUDA_CHECK(cudaEventRecord(e1, stream));
    ATTNSTATE_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    ATTNSTATE_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms[static_cast<std::size_t>(i)] = t;
  }
  return 1000.0 * median(std::move(ms));
}

/// A stream, its timing events and a 256 MiB buffer whose read by `flush_read` evicts the L2
/// (the H200's is 60 MiB) before a timed call.
struct FlushTimer {
  int num_sms = 0;
  cudaStream_t stream = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  int4* flush_buf = nullptr;
  std::size_t flush_n = 0;
  int* sink = nullptr;

  /// Creates the stream, the events and the flush buffer; `sms` sizes the flush grid.
  void init(int sms) {
    num_sms = sms;
    ATTNSTATE_CUDA_CHECK(cudaStreamCreate(&stream));
    ATTNSTATE_CUDA_CHECK(cudaEventCreate(&e0));
    ATTNSTATE_CUDA_CHECK(cudaEventCreate(&e1));
    flush_n = (std::size_t{256} << 20) / sizeof(int4);
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&flush_buf, flush_n * sizeof(int4)));
    ATTNSTATE_CUDA_CHECK(cudaMemset(flush_buf, 1, flush_n * sizeof(int4)));
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&sink, sizeof(int)));
  }
  void flush() {
    flush_read<<<num_sms * 4, 512, 0, stream>>>(flush_buf, flush_n, sink);
    ATTNSTATE_CHECK_LAUNCH(stream, "flush_read");
  }
  /// Median of `reps` event-timed calls of `f` after 3 untimed ones, `before(i)` ahead of timed
  /// call i (µs).
  template <class Before, class F>
  double time_us(int reps, Before&& before, F&& f) {
    for (int i = 0; i < 3; ++i) f();
    return event_median_us(stream, e0, e1, reps, before, f);
  }
  /// The same with an L2 flush before every timed call.
  template <class F>
  double time_us(int reps, F&& f) {
    return time_us(
        reps, [&](int) { flush(); }, f);
  }
};

/// Device-to-device copy bandwidth in bytes read + written per second: `time_us(copy)` times
/// `copy`, a cudaMemcpyAsync of `bytes` on `stream`, and returns its time in µs.
template <class Time>
double copy_bandwidth(cudaStream_t stream, std::size_t bytes, Time&& time_us) {
  void *a = nullptr, *b = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&a, bytes));
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&b, bytes));
  ATTNSTATE_CUDA_CHECK(cudaMemsetAsync(a, 1, bytes, stream));
  const double us = time_us([&] {
    ATTNSTATE_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  ATTNSTATE_CUDA_CHECK(cudaFree(a));
  ATTNSTATE_CUDA_CHECK(cudaFree(b));
  return 2.0 * static_cast<double>(bytes) / (us * 1e-6);
}

}  // namespace bench_util
