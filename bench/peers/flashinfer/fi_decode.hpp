/// @file fi_decode.hpp
/// @brief What the fi_decode harness (fi_decode.cu) and its FlashInfer kernel objects
///        (fi_decode_kernel.cu: one decode instance each) share. The objects register themselves
///        at static-initialisation time, so the harness links whichever instances CMake built and
///        reports the others as not built. The dtype, FlashInfer's refusal and its message come
///        from the cascade harness's header (fi_cascade.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "fi_cascade.hpp"

namespace fid {

using fic::DType;
using fic::Unsupported;

/// The two paths of `BatchDecodeWithPagedKVCacheWrapper` for bf16/f16 on sm_90:
/// use_tensor_cores=False (DecodePlan + the CUDA-core decode kernel) and use_tensor_cores=True
/// (PrefillPlan + the fa2 paged batch prefill).
enum class Path : int { kCudaCore = 0, kTensorCore = 1 };

inline const char* path_name(Path p) { return p == Path::kCudaCore ? "cuda_core" : "tensor_core"; }

/// One paged-decode problem; device pointers owned by the harness.
struct Problem {
  int hq = 0, hkv = 0, d = 0, page = 0, batch = 0, q_len = 1;
  bool hnd = false;
  DType dtype = DType::kBF16;
  long long num_pages = 0;
  const std::int32_t* h_page_indptr = nullptr;  // host, batch + 1 (what plan() reads)
  void* k = nullptr;                            // pools: (num_pages, page, hkv, d) NHD or
  void* v = nullptr;                            //        (num_pages, hkv, page, d) HND
  void* q = nullptr;                            // (batch·q_len, hq, d)
  void* o = nullptr;                            // (batch·q_len, hq, d)
  float* lse = nullptr;                         // (batch·q_len, hq), log2-based
  std::int32_t* page_indptr = nullptr;          // device, batch + 1
  std::int32_t* page_indices = nullptr;         // device
  std::int32_t* last_page_len = nullptr;        // device, batch
  std::int32_t* qo_indptr = nullptr;            // device, batch + 1 (tensor-core path)
  double sm_scale = 0;
  bool pdl = true;
  cudaStream_t stream = nullptr;
};

/// What the plan chose.
struct PlanSummary {
  bool split_kv = false;
  long long padded_batch = 0;
  long long kv_chunk_tokens = 0;
  int cta_tile_q = 0;       // tensor-core path
  long long max_grid = -1;  // CUDA-core path: blocks/SM (occupancy query) × SMs
  std::size_t float_ws = 0, int_ws = 0;
};

class Runner {
 public:
  virtual ~Runner() = default;
  /// Plans the problem; throws Unsupported when FlashInfer refuses.
  virtual PlanSummary plan(const Problem& p) = 0;
  /// Enqueues one call on the stream of the planned problem.
  virtual void run() = 0;
  /// The plan's float workspace (the harness poisons it before the checked call).
  virtual void* float_workspace() const = 0;
  virtual std::size_t float_workspace_bytes() const = 0;
};

/// The compile-time choices of one decode instance (causal: the tensor-core path's mask for
/// q_len > 1; the CUDA-core path has none).
struct Key {
  Path path;
  DType dtype;
  int d;
  bool causal;
};
using Factory = std::unique_ptr<Runner> (*)();
struct Entry {
  Key key;
  Factory make;
  const char* name;
};
inline std::vector<Entry>& registry() {
  static std::vector<Entry> r;
  return r;
}
struct Registrar {
  Registrar(Key k, Factory f, const char* name) { registry().push_back(Entry{k, f, name}); }
};

/// The tensor-core instances hold the kernels of each CTA tile in an object of its own; the
/// tile objects of one (dtype, head dim, mask) register their launch here, so the runner (in the
/// tile-16 object) reports a tile that was not built instead of failing to link.
using TileLaunch = cudaError_t (*)(const void* params, void* tmp_v, float* tmp_s, bool pdl,
                                   cudaStream_t stream);
struct TileEntry {
  DType dtype;
  int d;
  bool causal;
  int cta_tile_q;
  TileLaunch launch;
};
inline std::vector<TileEntry>& tile_registry() {
  static std::vector<TileEntry> r;
  return r;
}
struct TileRegistrar {
  TileRegistrar(TileEntry e) { tile_registry().push_back(e); }
};

}  // namespace fid
