/// @file fi_cascade.hpp
/// @brief What the fi_cascade harness (fi_cascade.cu) and its FlashInfer kernel objects
///        (fi_cascade_level.cu: one FA3 paged-prefill instance each; fi_cascade_merge.cu:
///        MergeStateInPlace) share. The objects register themselves at static-initialisation
///        time, so the harness links whichever instances CMake built and reports the others as
///        not compiled.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace fic {

enum class DType : int { kBF16 = 0, kF16 = 1 };

inline const char* dtype_name(DType t) { return t == DType::kBF16 ? "bf16" : "f16"; }

/// A flashinfer::Error message without its "Error in function '...' at FILE:LINE: " prefix (the
/// macros that throw expand in this folder's files, so the location would point here).
inline std::string refusal_text(std::string m) {
  const std::size_t at = m.find("' at ");
  if (at != std::string::npos) {
    const std::size_t colon = m.find(": ", at);
    if (colon != std::string::npos) m = m.substr(colon + 2);
  }
  return m;
}

/// FlashInfer refused the problem (its plan threw, or its dispatch returned an error code the
/// Python wrapper would raise on).
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One level of the cascade as one `BatchPrefillWithPagedKVCacheWrapper` sees it: `segments`
/// query segments (CSR `qo_indptr` over the query rows), each attending its own page list (CSR
/// `kv_page_indptr` over `kv_indices`, `last_page_len` tokens in its last page). Device pointers
/// are owned by the harness; the host arrays are what the wrapper's plan() reads.
struct LevelProblem {
  int hq = 0, hkv = 0, d = 0, page = 0;
  DType dtype = DType::kBF16;
  int segments = 0;
  std::int64_t rows = 0;                           // query rows (= qo_indptr[segments])
  const std::int32_t* h_qo_indptr = nullptr;       // host, segments + 1
  const std::int32_t* h_kv_page_indptr = nullptr;  // host, segments + 1 (pages)
  const std::int32_t* h_kv_len = nullptr;          // host, segments (tokens)
  std::int32_t* qo_indptr = nullptr;               // device copies of the above
  std::int32_t* kv_page_indptr = nullptr;
  std::int32_t* kv_indices = nullptr;
  std::int32_t* last_page_len = nullptr;
  void* k = nullptr;  // page pools, (num_pages, page, hkv, d) NHD
  void* v = nullptr;
  void* q = nullptr;     // (rows, hq, d)
  void* o = nullptr;     // (rows, hq, d)
  float* lse = nullptr;  // (rows, hq), log2-based as FlashInfer writes it
  double sm_scale = 0;
  double soft_cap = 0;   // 0: none
  int window_left = -1;  // -1: none
  bool pdl = true;
  void* float_workspace = nullptr;  // shared by the levels, as the cascade wrapper shares it
  std::size_t float_workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};

/// What PrefillSM90Plan chose.
struct PlanSummary {
  bool same_schedule_for_all_heads = false;
  int cta_tile_q = 0;
  long long works = 0;     // work items over all CTAs
  int ctas = 0;            // persistent CTAs (the SM count)
  std::size_t int_ws = 0;  // bytes of the int workspace the plan used
};

class LevelRunner {
 public:
  virtual ~LevelRunner() = default;
  /// Plans the level; throws Unsupported when FlashInfer refuses.
  virtual PlanSummary plan(const LevelProblem& p) = 0;
  /// Enqueues the level's kernel on the stream of the planned problem.
  virtual void run() = 0;
};

/// The compile-time choices of one FA3 paged-prefill instance (mask kNone: the cascade's levels
/// are planned with causal=False for q_len 1).
struct LevelKey {
  DType dtype;
  int d;
  bool soft_cap;  // DefaultAttention<use_logits_soft_cap = true>
  bool window;    // USE_SLIDING_WINDOW
};
using LevelFactory = std::unique_ptr<LevelRunner> (*)();
struct LevelEntry {
  LevelKey key;
  LevelFactory make;
  const char* name;
};
inline std::vector<LevelEntry>& level_registry() {
  static std::vector<LevelEntry> r;
  return r;
}
struct LevelRegistrar {
  LevelRegistrar(LevelKey k, LevelFactory f, const char* name) {
    level_registry().push_back(LevelEntry{k, f, name});
  }
};

/// MergeStateInPlace(v, s, v_other, s_other, seq_len, num_heads, head_dim, mask = nullptr,
/// stream) of one dtype; throws Unsupported for what FlashInfer refuses.
using MergeFn = void (*)(void* v, float* s, const void* v_other, const float* s_other,
                         std::uint32_t seq_len, std::uint32_t num_heads, std::uint32_t head_dim,
                         cudaStream_t stream);
struct MergeEntry {
  DType dtype;
  MergeFn fn;
};
inline std::vector<MergeEntry>& merge_registry() {
  static std::vector<MergeEntry> r;
  return r;
}
struct MergeRegistrar {
  MergeRegistrar(DType t, MergeFn f) { merge_registry().push_back(MergeEntry{t, f}); }
};

}  // namespace fic
