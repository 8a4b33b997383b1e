/// @file fi_cascade_level.cu
/// @brief One FlashInfer 0.7.2.post1 FA3 (sm_90a) paged batch-prefill instance: what one level
///        of `MultiLevelCascadeAttentionWrapper` runs on an H100/H200 for bf16/f16 queries and
///        KV (`BatchPrefillWithPagedKVCacheWrapper`, backend "auto" -> "fa3").
///
/// Compiled once per (dtype, head dim, soft cap, window) with -DFI_DTYPE=0|1 (bf16|f16)
/// -DFI_HEAD_DIM=64|128|256 -DFI_SOFT_CAP=0|1 -DFI_WINDOW=0|1 (see CMakeLists.txt). Mirrors, for
/// mask mode kNone (the cascade plans every level with causal=False for q_len 1):
///  - csrc/batch_prefill_sm90_customize_config.jinja as flashinfer/jit/attention/modules.py
///    renders it for backend fa3 without fp8 (additional tensors maybe_prefix_len_ptr:uint32_t,
///    maybe_token_pos_in_items_ptr:uint16_t, maybe_max_item_len_ptr:uint16_t, maybe_scale_v:float;
///    scalars logits_soft_cap, sm_scale, scale_v_scalar: double, token_pos_in_items_len: int64_t;
///    variant DefaultAttention<use_logits_soft_cap> of hopper/variants.cuh), field for field;
///  - csrc/batch_prefill_paged_sm90_kernel_inst.jinja (both SAME_SCHEDULER_FOR_ALL_HEADS values);
///  - csrc/batch_prefill_sm90.cu: BatchPrefillWithKVCacheSM90Plan (PrefillSM90Plan with the
///    wrapper's host qo_indptr, page indptr and KV lengths, causal false, no CUDA graph,
///    sizeof_dtype_o 2) and BatchPrefillWithPagedKVCacheSM90Run (the NHD strides, the plan's
///    offsets, the additional parameters prefill.py run() passes: no optional tensor, the soft
///    cap, sm_scale, scale_v_scalar 1, token_pos_in_items_len 0).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <flashinfer/attention/hopper/attention_updater.cuh>
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variant_helper.cuh>
#include <flashinfer/attention/hopper/variants.cuh>
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/cutlass_utils.cuh>
#include <flashinfer/layout.cuh>
#include <flashinfer/math.cuh>

#include "fi_cascade.hpp"

#if !defined(FI_DTYPE) || !defined(FI_HEAD_DIM) || !defined(FI_SOFT_CAP) || !defined(FI_WINDOW)
#error "a level instance needs FI_DTYPE, FI_HEAD_DIM, FI_SOFT_CAP and FI_WINDOW"
#endif

// A namespace named after the instance, so that its Params (and the kernels instantiated with
// them) get names of their own across the objects linked into one executable.
#define FI_CAT4(a, b, c, d) fi_level_t##a##_d##b##_s##c##_w##d
#define FI_NS_OF(a, b, c, d) FI_CAT4(a, b, c, d)
#define FI_NS FI_NS_OF(FI_DTYPE, FI_HEAD_DIM, FI_SOFT_CAP, FI_WINDOW)

namespace FI_NS {

using namespace flashinfer;

#if FI_DTYPE == 0
using Elem = nv_bfloat16;
#define FI_DTYPE_NAME "bf16"
#else
using Elem = half;
#define FI_DTYPE_NAME "f16"
#endif

// batch_prefill_sm90_customize_config.jinja
using DTypeQ = cutlass_dtype_t<Elem>;
using DTypeKV = cutlass_dtype_t<Elem>;
using DTypeO = cutlass_dtype_t<Elem>;
using IdType = cutlass_dtype_t<std::int32_t>;

constexpr int HEAD_DIM_QK = FI_HEAD_DIM;
constexpr int HEAD_DIM_VO = FI_HEAD_DIM;
constexpr bool USE_LOGITS_SOFT_CAP = FI_SOFT_CAP != 0;
constexpr bool USE_SLIDING_WINDOW = FI_WINDOW != 0;

struct PagedParams {
  using DTypeQ = FI_NS::DTypeQ;
  using DTypeKV = FI_NS::DTypeKV;
  using DTypeO = FI_NS::DTypeO;
  using IdType = FI_NS::IdType;
  // The QKV matrices.
  DTypeQ* q_ptr;
  DTypeKV* k_ptr;
  DTypeKV* v_ptr;
  DTypeO* o_ptr;
  float* lse_ptr;

  IdType* qo_tile_indices;
  IdType* qo_indptr;
  IdType* kv_indptr;
  IdType* kv_indices;
  IdType* qo_lens;
  IdType* kv_lens;
  IdType* head_indices;
  IdType* work_indptr;
  IdType* batch_indices;

  struct AdditionalParams {
    uint32_t* maybe_prefix_len_ptr;
    uint16_t* maybe_token_pos_in_items_ptr;
    uint16_t* maybe_max_item_len_ptr;
    float* maybe_scale_v;
    double logits_soft_cap;
    double sm_scale;
    double scale_v_scalar;
    int64_t token_pos_in_items_len;
  } additional_params;

  int64_t q_stride_n;
  int64_t k_stride_n;
  int64_t v_stride_n;
  int64_t o_stride_n;
  int64_t q_stride_h;
  int64_t k_stride_h;
  int64_t v_stride_h;
  int64_t o_stride_h;
  int64_t nnz_qo;

  int64_t k_page_stride;
  int64_t v_page_stride;

  int head_dim;
  int num_qo_heads;
  int num_kv_heads;
  int group_size;
  int page_size;
  int window_left;

  bool causal;
};

using AttentionVariant = DefaultAttention<USE_LOGITS_SOFT_CAP>;
constexpr MaskMode kMask = MaskMode::kNone;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// The prefill wrapper's own int workspace (prefill.py: 8 MiB on the device and 8 MiB of
/// page-locked host memory per wrapper, so per level).
constexpr std::size_t kIntWorkspaceBytes = std::size_t{8} << 20;

class Fa3LevelRunner final : public fic::LevelRunner {
 public:
  ~Fa3LevelRunner() override {
    if (int_ws_ != nullptr) cudaFree(int_ws_);
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
  }

  fic::PlanSummary plan(const fic::LevelProblem& p) override {
    if (p.d != HEAD_DIM_QK)
      throw std::invalid_argument("Fa3LevelRunner::plan: head dim " + std::to_string(p.d) +
                                  " given to the instance of head dim " +
                                  std::to_string(HEAD_DIM_QK));
    if ((p.soft_cap > 0) != USE_LOGITS_SOFT_CAP || (p.window_left >= 0) != USE_SLIDING_WINDOW)
      throw std::invalid_argument(
          "Fa3LevelRunner::plan: soft cap / window of the problem do not match the instance");
    stream_ = p.stream;
    pdl_ = p.pdl;
    if (int_ws_ == nullptr) {
      cuda_ok(cudaMalloc(&int_ws_, kIntWorkspaceBytes), "cudaMalloc (int workspace)");
      cuda_ok(cudaMallocHost(&pinned_, kIntWorkspaceBytes), "cudaMallocHost (int workspace)");
    }
    qo_indptr_h_.assign(p.h_qo_indptr, p.h_qo_indptr + p.segments + 1);
    kv_indptr_h_.assign(p.h_kv_page_indptr, p.h_kv_page_indptr + p.segments + 1);
    kv_len_h_.assign(p.h_kv_len, p.h_kv_len + p.segments);
    fic::PlanSummary s;
    try {
      cuda_ok(PrefillSM90Plan<IdType>(
                  p.float_workspace, p.float_workspace_bytes, int_ws_, pinned_, kIntWorkspaceBytes,
                  info_, qo_indptr_h_.data(), kv_indptr_h_.data(), kv_len_h_.data(),
                  static_cast<uint32_t>(qo_indptr_h_.back()), static_cast<uint32_t>(p.segments),
                  p.hq, p.hkv, HEAD_DIM_QK, HEAD_DIM_VO, p.page, /*causal=*/false,
                  /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2, p.stream),
              "PrefillSM90Plan");
    } catch (const flashinfer::Error& e) {
      throw fic::Unsupported(fic::refusal_text(e.what()));
    }
    cuda_ok(cudaStreamSynchronize(p.stream), "PrefillSM90Plan copy");
    int sms = 0, dev = 0;
    cuda_ok(cudaGetDevice(&dev), "cudaGetDevice");
    cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
            "cudaDeviceGetAttribute");
    const IdType* work_indptr = GetPtrFromBaseOffset<IdType>(pinned_, info_.work_indptr_offset);
    s.same_schedule_for_all_heads = info_.same_schedule_for_all_heads;
    s.cta_tile_q = HEAD_DIM_VO == 64 ? 192 : 128;
    s.ctas = sms;
    s.works = work_indptr[sms];
    s.int_ws = static_cast<std::size_t>(info_.batch_indices_offset) +
               sizeof(IdType) * static_cast<std::size_t>(s.works);

    // BatchPrefillWithPagedKVCacheSM90Run, NHD: (num_pages, page_size, num_heads, head_dim)
    PagedParams& a = params_;
    a = PagedParams{};
    a.q_ptr = static_cast<DTypeQ*>(p.q);
    a.k_ptr = static_cast<DTypeKV*>(p.k);
    a.v_ptr = static_cast<DTypeKV*>(p.v);
    a.o_ptr = static_cast<DTypeO*>(p.o);
    a.lse_ptr = p.lse;
    a.q_stride_n = static_cast<int64_t>(p.hq) * p.d;
    a.q_stride_h = p.d;
    a.o_stride_n = a.q_stride_n;
    a.o_stride_h = a.q_stride_h;
    a.k_stride_n = static_cast<int64_t>(p.hkv) * p.d;
    a.k_stride_h = p.d;
    a.v_stride_n = a.k_stride_n;
    a.v_stride_h = a.k_stride_h;
    a.k_page_stride = static_cast<int64_t>(p.page) * p.hkv * p.d;
    a.v_page_stride = a.k_page_stride;
    a.nnz_qo = p.rows;
    a.num_qo_heads = p.hq;
    a.num_kv_heads = p.hkv;
    a.group_size = p.hq / p.hkv;
    a.page_size = p.page;
    a.window_left = p.window_left;
    a.causal = false;
    a.qo_tile_indices = GetPtrFromBaseOffset<IdType>(int_ws_, info_.qo_tile_indices_offset);
    a.qo_indptr = GetPtrFromBaseOffset<IdType>(int_ws_, info_.qo_indptr_offset);
    a.kv_indptr = GetPtrFromBaseOffset<IdType>(int_ws_, info_.kv_indptr_offset);
    a.qo_lens = GetPtrFromBaseOffset<IdType>(int_ws_, info_.qo_len_offset);
    a.kv_lens = GetPtrFromBaseOffset<IdType>(int_ws_, info_.kv_len_offset);
    a.head_indices = GetPtrFromBaseOffset<IdType>(int_ws_, info_.head_indices_offset);
    a.work_indptr = GetPtrFromBaseOffset<IdType>(int_ws_, info_.work_indptr_offset);
    a.batch_indices = GetPtrFromBaseOffset<IdType>(int_ws_, info_.batch_indices_offset);
    a.kv_indices = p.kv_indices;
    // ADDITIONAL_PARAMS_SETTER
    a.additional_params.maybe_prefix_len_ptr = nullptr;
    a.additional_params.maybe_token_pos_in_items_ptr = nullptr;
    a.additional_params.maybe_max_item_len_ptr = nullptr;
    a.additional_params.maybe_scale_v = nullptr;
    a.additional_params.logits_soft_cap = p.soft_cap;
    a.additional_params.sm_scale = p.sm_scale;
    a.additional_params.scale_v_scalar = 1.0;
    a.additional_params.token_pos_in_items_len = 0;
    return s;
  }

  void run() override {  // DISPATCH_BOOL(same_schedule_for_all_heads, ...)
    cudaError_t e;
    if (info_.same_schedule_for_all_heads)
      e = BatchPrefillWithPagedKVCacheDispatched<HEAD_DIM_QK, HEAD_DIM_VO, kMask,
                                                 USE_SLIDING_WINDOW, true, AttentionVariant>(
          params_, pdl_, stream_);
    else
      e = BatchPrefillWithPagedKVCacheDispatched<HEAD_DIM_QK, HEAD_DIM_VO, kMask,
                                                 USE_SLIDING_WINDOW, false, AttentionVariant>(
          params_, pdl_, stream_);
    cuda_ok(e, "BatchPrefillWithPagedKVCacheDispatched (FA3)");
  }

 private:
  std::vector<IdType> qo_indptr_h_, kv_indptr_h_, kv_len_h_;
  PrefillPlanSM90Info info_;
  void* int_ws_ = nullptr;
  void* pinned_ = nullptr;
  PagedParams params_{};
  bool pdl_ = true;
  cudaStream_t stream_ = nullptr;
};

std::unique_ptr<fic::LevelRunner> make_runner() { return std::make_unique<Fa3LevelRunner>(); }

#if FI_SOFT_CAP && FI_WINDOW
#define FI_VARIANT_NAME " soft_cap window"
#elif FI_SOFT_CAP
#define FI_VARIANT_NAME " soft_cap"
#elif FI_WINDOW
#define FI_VARIANT_NAME " window"
#else
#define FI_VARIANT_NAME ""
#endif

const fic::LevelRegistrar registrar(fic::LevelKey{FI_DTYPE == 0 ? fic::DType::kBF16
                                                                : fic::DType::kF16,
                                                  FI_HEAD_DIM, FI_SOFT_CAP != 0, FI_WINDOW != 0},
                                    &make_runner, "fa3 " FI_DTYPE_NAME FI_VARIANT_NAME);

}  // namespace FI_NS
