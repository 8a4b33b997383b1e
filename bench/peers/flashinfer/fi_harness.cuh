/// @file fi_harness.cuh
/// @brief What the FlashInfer peer harnesses (fi_decode.cu; fi_cascade.cu) share on the host and
///        device side, apart from FlashInfer itself: device buffers, the counter-hash inputs, the
///        L2 flush and event timing, the 16-bit decode table of the host reference, formatting
///        and argument checks. Included by one harness source per executable.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fi_cascade.hpp"

#define FIH_CUDA(call)                                                                            \
  do {                                                                                            \
    const cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess)                                                                        \
      throw std::runtime_error(std::string(#call) + " failed: " + cudaGetErrorString(e_) + " (" + \
                               __FILE__ + ":" + std::to_string(__LINE__) + ")");                  \
  } while (0)

namespace fih {

using fic::DType;

inline std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt(const char* f, ...) {
  char b[2048];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(b, sizeof b, f, ap);
  va_end(ap);
  return b;
}

/// `x` printed with `f`, or nothing for NaN (an empty CSV cell).
inline std::string num(double x, const char* f) {
  if (std::isnan(x)) return "";
  char b[64];
  std::snprintf(b, sizeof b, f, x);
  return b;
}

/// A whole-string integer in [lo, hi]; throws std::invalid_argument naming the option.
inline long long int_arg(const char* opt, const char* text, long long lo, long long hi) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > hi)
    throw std::invalid_argument(
        fmt("%s: expected an integer in [%lld, %lld], got '%s'", opt, lo, hi, text));
  return v;
}

inline std::uint64_t splitmix64(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// float value of every 16-bit pattern of the dtype
inline const std::vector<float>& lut(DType dt) {
  static std::vector<float> bf, hf;
  std::vector<float>& t = dt == DType::kBF16 ? bf : hf;
  if (t.empty()) {
    t.resize(65536);
    for (std::uint32_t u = 0; u < 65536; ++u) {
      if (dt == DType::kBF16) {
        const std::uint32_t bits = u << 16;
        std::memcpy(&t[u], &bits, 4);
      } else {
        __half_raw r;
        r.x = static_cast<std::uint16_t>(u);
        t[u] = __half2float(__half(r));
      }
    }
  }
  return t;
}

/// The 16-bit pattern of `f` rounded to the dtype.
inline std::uint16_t round16(float f, DType dt) {
  return dt == DType::kBF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(f))
                            : __half_as_ushort(__float2half_rn(f));
}

/// A NaN-propagating maximum (a NaN difference makes the check fail).
inline double worse(double worst, double e) {
  return std::isnan(e) ? INFINITY : std::max(worst, e);
}

struct DevBuf {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit DevBuf(std::size_t n) : bytes(n) {
    if (n > 0) FIH_CUDA(cudaMalloc(&p, n));
  }
  ~DevBuf() {
    if (p != nullptr) cudaFree(p);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

template <class T>
std::unique_ptr<DevBuf> upload(const std::vector<T>& h) {
  auto d = std::make_unique<DevBuf>(std::max<std::size_t>(1, h.size()) * sizeof(T));
  if (!h.empty())
    FIH_CUDA(cudaMemcpy(d->p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

__device__ inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// p[i] = 0.5 · N(0, 1), Box–Muller on a counter hash of (seed, i), rounded to bf16 or f16.
template <bool kBF16>
__global__ void randn_kernel(std::uint16_t* p, std::size_t n, std::uint64_t seed) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const std::uint64_t hsh = mix64((seed << 40) + i + 0x9E3779B97F4A7C15ull * (seed + 1));
    const float u1 = (static_cast<float>(hsh >> 40) + 0.5f) * 0x1p-24f;  // (0, 1)
    const float u2 = static_cast<float>(hsh & 0xFFFFFFu) * 0x1p-24f;     // [0, 1)
    const float x = 0.5f * sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    p[i] =
        kBF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
  }
}

inline void fill_randn(void* p, std::size_t n, DType dt, std::uint64_t seed, int sms,
                       cudaStream_t s) {
  auto* q = static_cast<std::uint16_t*>(p);
  if (dt == DType::kBF16)
    randn_kernel<true><<<sms * 8, 512, 0, s>>>(q, n, seed);
  else
    randn_kernel<false><<<sms * 8, 512, 0, s>>>(q, n, seed);
  FIH_CUDA(cudaGetLastError());
}

/// Reads `n` int4 through the L2, leaving it holding clean lines of this buffer.
__global__ void read_buffer(const int4* p, std::size_t n, int* sink) {
  int acc = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    const int4 v = __ldcg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x2F6B1D37) *sink = acc;  // keeps the loads
}

inline double median(const std::vector<double>& sorted) {
  const std::size_t n = sorted.size();
  return n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

/// Event timing, optionally with an L2 flush before every call.
struct Timer {
  cudaStream_t stream = nullptr;
  int sms = 1;
  std::size_t flush_bytes = std::size_t{512} << 20;
  std::unique_ptr<DevBuf> buf, sink;

  void init(cudaStream_t s, int num_sms) {
    stream = s;
    sms = num_sms;
    buf = std::make_unique<DevBuf>(flush_bytes);
    sink = std::make_unique<DevBuf>(sizeof(int));
    FIH_CUDA(cudaMemset(buf->p, 1, flush_bytes));
  }
  void flush() {
    read_buffer<<<sms * 4, 512, 0, stream>>>(buf->as<const int4>(), flush_bytes / sizeof(int4),
                                             sink->as<int>());
    FIH_CUDA(cudaGetLastError());
  }
  /// Sorted µs of each of `reps` calls of `f`, after `warmup` untimed calls. The calls are queued
  /// back to back and synchronised once; the flush before each call keeps the GPU busy while the
  /// host queues that call, so no launch gap is timed.
  template <class F>
  std::vector<double> time(int reps, int warmup, bool flush_each, F&& f) {
    std::vector<cudaEvent_t> ev(2 * static_cast<std::size_t>(reps));
    for (cudaEvent_t& e : ev) FIH_CUDA(cudaEventCreate(&e));
    for (int i = 0; i < warmup; ++i) {
      if (flush_each) flush();
      f();
    }
    for (int i = 0; i < reps; ++i) {
      if (flush_each) flush();
      FIH_CUDA(cudaEventRecord(ev[2 * i], stream));
      f();
      FIH_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
    }
    FIH_CUDA(cudaEventSynchronize(ev.back()));
    std::vector<double> us(reps);
    for (int i = 0; i < reps; ++i) {
      float ms = 0;
      FIH_CUDA(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
      us[i] = 1000.0 * ms;
    }
    for (cudaEvent_t e : ev) cudaEventDestroy(e);
    std::sort(us.begin(), us.end());
    return us;
  }
};

/// The device every harness times on and the copy bandwidth that sets its floors.
struct DeviceCopy {
  std::string device_note;  ///< Name, sm, SMs, L2, driver and runtime versions.
  double median_us = 0, min_us = 0;
  double bytes_per_s = 0;  ///< Bytes read + written over the median.
};

/// Opens the current device (its SMs into `sms`, a blocking stream into `stream`, ordered with
/// cudaMemcpy, and `timer` on it), then times 10 device-to-device copies of `bytes` (`warmup`
/// untimed first; the L2 flushed before each when `flush_each`).
inline DeviceCopy open_device(int& sms, cudaStream_t& stream, Timer& timer, std::size_t bytes,
                              int warmup, bool flush_each) {
  int dev = 0, driver = 0, runtime = 0;
  FIH_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  FIH_CUDA(cudaGetDeviceProperties(&prop, dev));
  FIH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  FIH_CUDA(cudaDriverGetVersion(&driver));
  FIH_CUDA(cudaRuntimeGetVersion(&runtime));
  FIH_CUDA(cudaStreamCreate(&stream));
  timer.init(stream, sms);
  DevBuf a(bytes), b(bytes);
  FIH_CUDA(cudaMemset(a.p, 1, bytes));
  const std::vector<double> us = timer.time(10, warmup, flush_each, [&] {
    FIH_CUDA(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  DeviceCopy c;
  c.median_us = median(us);
  c.min_us = us.front();
  c.bytes_per_s = 2.0 * static_cast<double>(bytes) / (c.median_us * 1e-6);
  c.device_note = fmt("%s sm_%d%d %d SMs L2 %d MiB driver %d runtime %d", prop.name, prop.major,
                      prop.minor, sms, prop.l2CacheSize >> 20, driver, runtime);
  return c;
}

}  // namespace fih
