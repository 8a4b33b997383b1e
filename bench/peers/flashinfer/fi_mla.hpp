/// @file fi_mla.hpp
/// @brief What the fi_mla harness (fi_mla.cu) and its FlashInfer kernel objects (fi_mla_kernel.cu:
///        one Hopper MLA instance each) share. The objects register themselves at
///        static-initialisation time, so the harness links whichever instances CMake built and
///        reports the others as not built. FlashInfer's refusal and its message come from the
///        cascade harness's header (fi_cascade.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "fi_cascade.hpp"

namespace fim {

using fic::Unsupported;

/// The latent cache's element type: `kv_data_type` of `BatchMLAPagedAttentionWrapper.plan`
/// (both parts, as FlashInfer keeps them in one dtype).
enum class KvType : int { kBF16 = 0, kE4M3 = 1 };

inline const char* kv_name(KvType t) { return t == KvType::kBF16 ? "bf16" : "e4m3"; }
inline int kv_bytes(KvType t) { return t == KvType::kBF16 ? 2 : 1; }

/// One MLA decode as `BatchMLAPagedAttentionWrapper(backend="fa3")` sees it: `batch` requests of
/// `q_len` query tokens each (CSR `qo_indptr`), `heads` query heads of 512 + 64, one shared latent
/// head per token in two page pools, page lists in CSR (`kv_indptr` in pages, `kv_indices`), the
/// lengths in `kv_len`. Device pointers are owned by the harness; the host arrays are what plan()
/// reads.
struct Problem {
  int heads = 0, q_len = 1, page = 0, batch = 0;
  KvType kv = KvType::kBF16;
  bool causal = false;
  const std::int32_t* h_qo_indptr = nullptr;  // host, batch + 1 (query tokens)
  const std::int32_t* h_kv_indptr = nullptr;  // host, batch + 1 (pages)
  const std::int32_t* h_kv_len = nullptr;     // host, batch (tokens)
  std::int32_t* kv_indices = nullptr;         // device page ids
  const void* q_nope = nullptr;               // (batch·q_len, heads, 512) bf16
  const void* q_pe = nullptr;                 // (batch·q_len, heads, 64) bf16
  const void* ckv = nullptr;                  // (num_pages, page, 512) of `kv`
  const void* kpe = nullptr;                  // (num_pages, page, 64) of `kv`
  void* o = nullptr;                          // (batch·q_len, heads, 512) bf16
  float* lse = nullptr;                       // (batch·q_len, heads), natural base
  double sm_scale = 0;
  float ckv_scale = 1.f, kpe_scale = 1.f;  // fp8: per-tensor dequantisation scales
  cudaStream_t stream = nullptr;
};

/// What MLAPlan chose.
struct PlanSummary {
  int cluster_size = 0;       // num_blks_x: CTAs per cluster (1, or 2 when heads·q_len > 64)
  int clusters = 0;           // num_blks_y
  long long works = 0;        // work items over all clusters
  long long split_tiles = 0;  // work items writing partial states (split KV)
  std::size_t int_ws = 0;     // bytes of the int workspace the plan staged
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

struct Key {
  KvType kv;
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

}  // namespace fim
