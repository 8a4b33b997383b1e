/// @file cudart_stub.cpp
/// @brief A host-only stand-in for the CUDA runtime, linked instead of cudart into
///        `fi_cascade_dryrun`, `fi_decode_dryrun` and `fi_mla_dryrun` (CMake option FI_DRYRUN), for
///        a dry run of the harnesses on a machine without a GPU. Adapted from the stub of the
///        FlashInfer decode harness (shared/peers/flashinfer/cudart_stub.cpp), with the driver
///        entry point the FA3 kernels' TMA descriptors need (CUTLASS fetches cuTensorMapEncodeTiled
///        through cudaGetDriverEntryPoint[ByVersion]; here it fills nothing and succeeds).
///
/// "Device" memory is host memory (mmap, untouched pages stay unbacked), copies and memsets are
/// memcpy/memset (except device-to-device copies and memsets of more than 256 MiB, which only the
/// timing scaffolding issues and which are skipped), kernels are not run (a launch only counts),
/// events report 1 µs. Device attributes are an H200's (132 SMs, sm_90, 227 KiB opt-in shared
/// memory per block, 228 KiB per SM, 60 MiB L2). A dry run therefore shows the host side: the
/// shapes, the plans FlashInfer makes for 132 SMs (PrefillSM90Plan, PrefillPlan; DecodePlan also
/// asks cudaOccupancyMaxActiveBlocksPerMultiprocessor, answered with FIB_STUB_BLOCKS_PER_SM,
/// default 9), the control flow and the cost of the host reference. Outputs stay NaN-poisoned, so
/// every check of a dry run FAILs. FIB_STUB_TRACE=1 prints every launch (kernel name, grid, block,
/// shared memory); FIB_STUB_FILL=1 fills allocations of up to 2 GiB with random finite 16-bit
/// values.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

std::mutex g_mu;
std::map<void*, std::size_t>& allocations() {
  static std::map<void*, std::size_t> m;
  return m;
}
std::map<const void*, std::string>& kernel_names() {
  static std::map<const void*, std::string> m;
  return m;
}
struct CallConfig {
  dim3 grid, block;
  std::size_t smem;
  void* stream;
};
thread_local std::vector<CallConfig> g_configs;
constexpr std::size_t kSkipBytes = std::size_t{256} << 20;
long long g_launches = 0;

bool trace() {
  static const bool t = std::getenv("FIB_STUB_TRACE") != nullptr &&
                        std::strcmp(std::getenv("FIB_STUB_TRACE"), "0") != 0;
  return t;
}

void record_launch(const void* func, dim3 g, dim3 b, std::size_t smem) {
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_launches;
  if (trace()) {
    auto it = kernel_names().find(func);
    std::fprintf(stderr, "[stub] launch %s grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n",
                 it == kernel_names().end() ? "?" : it->second.c_str(), g.x, g.y, g.z, b.x, b.y,
                 b.z, smem);
  }
}

cudaError_t host_alloc(void** p, std::size_t n) {
  const std::size_t len = n == 0 ? 1 : n;
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) return cudaErrorMemoryAllocation;
  // FIB_STUB_FILL=1: fill allocations up to 2 GiB with random 16-bit values, finite in bf16 and f16
  // (stands in for the randn kernel, which does not run; for timing the host reference)
  static const bool fill = std::getenv("FIB_STUB_FILL") != nullptr &&
                           std::strcmp(std::getenv("FIB_STUB_FILL"), "0") != 0;
  if (fill && len <= (std::size_t{2} << 30)) {
    auto* u = static_cast<std::uint16_t*>(m);
    unsigned long long x = 0x9E3779B97F4A7C15ull ^ len;
    for (std::size_t i = 0; i < len / 2; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      u[i] = static_cast<std::uint16_t>(0x3400 + (x >> 40) % 0x0800) | ((x >> 20) & 0x8000);
    }
  }
  std::lock_guard<std::mutex> lock(g_mu);
  allocations()[m] = len;
  *p = m;
  return cudaSuccess;
}

cudaError_t host_free(void* p) {
  if (p == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = allocations().find(p);
  if (it == allocations().end()) return cudaErrorInvalidValue;
  munmap(it->first, it->second);
  allocations().erase(it);
  return cudaSuccess;
}

}  // namespace

extern "C" {

// --- registration and launch plumbing that nvcc's generated host code calls
void** __cudaRegisterFatBinary(void* fatCubin) {
  static void* handle = nullptr;
  (void)fatCubin;
  return &handle;
}
void __cudaRegisterFatBinaryEnd(void** h) { (void)h; }
void __cudaUnregisterFatBinary(void** h) { (void)h; }
void __cudaRegisterVar(void** h, char* hostVar, char* deviceAddress, const char* deviceName,
                       int ext, size_t size, int constant, int global) {
  (void)h, (void)hostVar, (void)deviceAddress, (void)deviceName, (void)ext, (void)size,
      (void)constant, (void)global;
}
void __cudaRegisterFunction(void** h, const char* hostFun, char* deviceFun, const char* deviceName,
                            int thread_limit, uint3* tid, uint3* bid, dim3* bDim, dim3* gDim,
                            int* wSize) {
  (void)h, (void)deviceFun, (void)thread_limit, (void)tid, (void)bid, (void)bDim, (void)gDim,
      (void)wSize;
  std::lock_guard<std::mutex> lock(g_mu);
  kernel_names()[hostFun] = deviceName;
}
unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                     struct CUstream_st* stream) {
  g_configs.push_back(CallConfig{gridDim, blockDim, sharedMem, stream});
  return 0;
}
cudaError_t __cudaPopCallConfiguration(dim3* gridDim, dim3* blockDim, size_t* sharedMem,
                                       void* stream) {
  if (g_configs.empty()) return cudaErrorInvalidConfiguration;
  const CallConfig c = g_configs.back();
  g_configs.pop_back();
  *gridDim = c.grid;
  *blockDim = c.block;
  *sharedMem = c.smem;
  *static_cast<void**>(stream) = c.stream;
  return cudaSuccess;
}
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* fun) {
  *kernel = reinterpret_cast<cudaKernel_t>(const_cast<void*>(fun));
  return cudaSuccess;
}
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                               size_t sharedMem, cudaStream_t stream) {
  (void)args, (void)stream;
  record_launch(reinterpret_cast<const void*>(kernel), gridDim, blockDim, sharedMem);
  return cudaSuccess;
}

// --- the runtime API the harness and FlashInfer call
cudaError_t cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                             size_t sharedMem, cudaStream_t stream) {
  (void)args, (void)stream;
  record_launch(func, gridDim, blockDim, sharedMem);
  return cudaSuccess;
}
// (the Hopper MLA kernel is a cooperative launch)
cudaError_t cudaLaunchCooperativeKernel(const void* func, dim3 gridDim, dim3 blockDim, void** args,
                                        size_t sharedMem, cudaStream_t stream) {
  (void)args, (void)stream;
  record_launch(func, gridDim, blockDim, sharedMem);
  return cudaSuccess;
}
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  (void)args;
  record_launch(func, config->gridDim, config->blockDim, config->dynamicSmemBytes);
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  (void)func, (void)attr, (void)value;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* numBlocks, const void* func,
                                                                   int blockSize,
                                                                   size_t dynamicSMemSize,
                                                                   unsigned int flags) {
  (void)func, (void)blockSize, (void)dynamicSMemSize, (void)flags;
  const char* e = std::getenv("FIB_STUB_BLOCKS_PER_SM");
  *numBlocks = e != nullptr ? std::atoi(e) : 9;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  (void)device;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = 233472;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = 232448;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = 49152;
      break;
    case cudaDevAttrL2CacheSize:
      *value = 60 << 20;
      break;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
      *value = 2048;
      break;
    default:
      *value = 0;
      break;
  }
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  (void)device;
  std::memset(prop, 0, sizeof *prop);
  std::snprintf(prop->name, sizeof prop->name, "H200 attributes (cudart stub, no GPU)");
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->l2CacheSize = 60 << 20;
  prop->sharedMemPerBlockOptin = 232448;
  prop->sharedMemPerMultiprocessor = 233472;
  prop->totalGlobalMem = std::size_t{150} << 30;
  return cudaSuccess;
}
const char* cudaGetErrorString(cudaError_t error) {
  static thread_local char buf[64];
  std::snprintf(buf, sizeof buf, "cudart stub error %d", static_cast<int>(error));
  return buf;
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int* v) {
  *v = 0;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  static int dummy;
  *s = reinterpret_cast<cudaStream_t>(&dummy);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t n) { return host_alloc(p, n); }
cudaError_t cudaMallocHost(void** p, size_t n) { return host_alloc(p, n); }
cudaError_t cudaFree(void* p) { return host_free(p); }
cudaError_t cudaFreeHost(void* p) { return host_free(p); }
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  if (kind == cudaMemcpyDeviceToDevice && count > kSkipBytes) return cudaSuccess;
  std::memcpy(dst, src, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  (void)stream;
  return cudaMemcpy(dst, src, count, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t count) {
  if (count > kSkipBytes) return cudaSuccess;
  std::memset(p, value, count);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t stream) {
  (void)stream;
  return cudaMemset(p, value, count);
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new int(0));
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<int*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  (void)e, (void)s;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  (void)a, (void)b;
  *ms = 0.001f;
  return cudaSuccess;
}

// --- the driver entry points CUTLASS asks the runtime for (TMA descriptors)
static CUresult stub_tensor_map_encode_tiled(CUtensorMap* map, CUtensorMapDataType type,
                                             cuuint32_t rank, void* addr, const cuuint64_t* dims,
                                             const cuuint64_t* strides, const cuuint32_t* box,
                                             const cuuint32_t* elem_strides,
                                             CUtensorMapInterleave interleave,
                                             CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                             CUtensorMapFloatOOBfill oob) {
  (void)type, (void)rank, (void)addr, (void)dims, (void)strides, (void)box, (void)elem_strides,
      (void)interleave, (void)swizzle, (void)l2, (void)oob;
  std::memset(map, 0, sizeof *map);
  return CUDA_SUCCESS;
}
static cudaError_t entry_point(const char* symbol, void** funcPtr,
                               enum cudaDriverEntryPointQueryResult* driverStatus) {
  const bool known = std::strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
  *funcPtr = known ? reinterpret_cast<void*>(&stub_tensor_map_encode_tiled) : nullptr;
  if (driverStatus != nullptr)
    *driverStatus = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult* driverStatus) {
  (void)cudaVersion, (void)flags;
  return entry_point(symbol, funcPtr, driverStatus);
}
cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** funcPtr, unsigned long long flags,
                                    enum cudaDriverEntryPointQueryResult* driverStatus) {
  (void)flags;
  return entry_point(symbol, funcPtr, driverStatus);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  (void)flags;
  return cudaStreamCreate(s);
}

}  // extern "C"
