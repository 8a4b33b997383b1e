/// @file fi_decode_kernel.cu
/// @brief One FlashInfer 0.7.2.post1 paged-decode instance: what
///        `BatchDecodeWithPagedKVCacheWrapper` runs for bf16/f16 on sm_90 on one of its two paths.
///
/// Compiled once per instance with -DFI_PATH=0|1 (CUDA core | tensor core) -DFI_DTYPE=0|1
/// (bf16|f16) -DFI_HEAD_DIM=64|128|256 -DFI_CAUSAL=0|1 and, on the tensor-core path,
/// -DFI_CTA_TILE_Q=16|64|128 (see CMakeLists.txt). Mirrors:
///  - `cuda_core` (use_tensor_cores=False): csrc/batch_decode.cu, `BatchDecodeWithPagedKVCachePlan`
///    (DecodePlan with the work-estimation function of the GQA group size) and
///    `BatchDecodeWithPagedKVCacheRun` (`BatchDecodeWithPagedKVCacheDispatched`: the decode kernel,
///    plus `VariableLengthMergeStates` when the plan splits the KV); the Params struct is
///    batch_decode_customize_config.jinja as gen_batch_decode_module renders it;
///  - `tensor_core` (use_tensor_cores=True, backend "auto" -> "fa2" for 16-bit dtypes):
///    csrc/batch_prefill.cu `BatchPrefillWithKVCachePlan` (PrefillPlan with qo_indptr = [0, q_len,
///    2 q_len, ...], the page indptr as kv_indptr, fixed_split_size -1, disable_split_kv false, no
///    CUDA graph, uniform_q_len = q_len if q_len > 1, as decode.py plan() passes them) and
///    csrc/batch_prefill_paged.cuh (`BatchPrefillWithPagedKVCacheDispatched<SAME_KV_STRIDES =
///    true, CTA_TILE_Q, ...>` with the tile the plan chose); mask kNone for q_len 1, kCausal for
///    q_len > 1 (decode.py: is_causal = q_len_per_req > 1); the Params struct is
///    batch_prefill_customize_config.jinja as _gen_batch_prefill_module renders it for fa2.
/// Both: DefaultAttention<false, false, false, false> (no custom mask, window, soft cap or ALiBi),
/// PosEncodingMode::kNone, sm_scale from the problem, window_left -1, int32 indices, the LSE
/// always written, PDL as the problem says (the wrapper's default on sm_90 is on).
#if !defined(FI_PATH) || !defined(FI_DTYPE) || !defined(FI_HEAD_DIM) || !defined(FI_CAUSAL)
#error "an instance needs FI_PATH, FI_DTYPE, FI_HEAD_DIM and FI_CAUSAL"
#endif
#if FI_PATH == 1 && !defined(FI_CTA_TILE_Q)
#error "a tensor-core instance needs FI_CTA_TILE_Q (16, 64 or 128)"
#endif
// FI_RUNNER: this object holds the plan and the runner; the tensor-core path's objects with
// CTA_TILE_Q 64 and 128 hold only that tile's kernels (registered in fid::tile_registry).
#if FI_PATH == 0 || FI_CTA_TILE_Q == 16
#define FI_RUNNER 1
#else
#define FI_RUNNER 0
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/fastdiv.cuh>
#include <flashinfer/layout.cuh>
#include <flashinfer/math.cuh>
#include <flashinfer/page.cuh>
#include <flashinfer/pos_enc.cuh>
#include <flashinfer/utils.cuh>
#if FI_PATH == 0
#include <flashinfer/attention/decode.cuh>
#else
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/prefill.cuh>
#endif

#include "fi_buffers.hpp"
#include "fi_decode.hpp"

// A namespace named after the instance (path, dtype, head dim, mask), so its Params (and the
// kernels instantiated with them) get names of their own; the tensor-core path's three tile
// objects of one instance share it (and so the Params type). (An anonymous namespace would do for
// one object, but nvcc's stub generation trips over it next to FlashInfer's own anonymous
// namespaces.)
#define FI_CAT5(a, b, c, d, e) a##_p##b##_t##c##_d##d##_c##e
#define FI_NS_OF(p, t, d, c) FI_CAT5(fi_instance, p, t, d, c)
#define FI_NS FI_NS_OF(FI_PATH, FI_DTYPE, FI_HEAD_DIM, FI_CAUSAL)
namespace FI_NS {

using namespace flashinfer;

#if FI_DTYPE == 0
using Elem = nv_bfloat16;
#define FI_DTYPE_NAME "bf16"
#else
using Elem = half;
#define FI_DTYPE_NAME "f16"
#endif
using Id = std::int32_t;
constexpr std::uint32_t kD = FI_HEAD_DIM;
constexpr fid::DType kDType = FI_DTYPE == 0 ? fid::DType::kBF16 : fid::DType::kF16;
constexpr auto kPos = PosEncodingMode::kNone;

#if FI_RUNNER
using fib::cuda_ok;
using fib::DeviceBuffer;
using fib::PinnedBuffer;

/// The (page, n, h, d) strides csrc passes to paged_kv_t (`paged_k_cache.strides()`).
void cache_strides(const fid::Problem& p, std::int64_t s[4]) {
  if (p.hnd) {  // (num_pages, hkv, page, d)
    s[0] = static_cast<std::int64_t>(p.hkv) * p.page * p.d;
    s[1] = static_cast<std::int64_t>(p.page) * p.d;
  } else {  // (num_pages, page, hkv, d)
    s[0] = static_cast<std::int64_t>(p.page) * p.hkv * p.d;
    s[1] = static_cast<std::int64_t>(p.hkv) * p.d;
  }
  s[2] = p.d;
  s[3] = 1;
}
#endif  // FI_RUNNER

#if FI_PATH == 0
// ---------------------------------------------------------------------------------------------
// CUDA-core decode: batch_decode_customize_config.jinja as gen_batch_decode_module renders it
// (additional tensors maybe_alibi_slopes:float, scalars logits_soft_cap, sm_scale,
// rope_rcp_scale, rope_rcp_theta: double).

struct Params {
  using DTypeQ = Elem;
  using DTypeKV = Elem;
  using DTypeO = Elem;
  using IdType = Id;

  DTypeQ* q;
  paged_kv_t<DTypeKV, IdType> paged_kv;
  DTypeO* o;
  float* lse;

  float* maybe_alibi_slopes;
  double logits_soft_cap;
  double sm_scale;
  double rope_rcp_scale;
  double rope_rcp_theta;

  uint32_t padded_batch_size;
  uint32_t num_qo_heads;
  IdType q_stride_n;
  IdType q_stride_h;
  int32_t window_left;
  bool enable_pdl;

  IdType* request_indices;
  IdType* kv_tile_indices;
  IdType* o_indptr;
  IdType* kv_chunk_size_ptr;
  bool* block_valid_mask;
  bool partition_kv;

  __host__ __device__ __forceinline__ int32_t get_qo_len(int32_t batch_idx) const { return 1; }

  __host__ __device__ __forceinline__ int32_t get_kv_len(int32_t batch_idx) const {
    return paged_kv.get_length(batch_idx);
  }
};

using Variant = DefaultAttention<false, false, false, false>;

class CudaCoreRunner final : public fid::Runner {
 public:
  fid::PlanSummary plan(const fid::Problem& p) override {
    if (p.q_len != 1)
      throw fid::Unsupported(
          "q_len_per_req > 1 requires tensor-core decode (decode.py plan() raises ValueError; the "
          "CUDA-core kernel's Params::get_qo_len is 1)");
    stream_ = p.stream;
    pdl_ = p.pdl;
    indptr_h_.assign(p.h_page_indptr, p.h_page_indptr + p.batch + 1);
    fid::PlanSummary s;
    try {
      // BatchDecodeWithPagedKVCachePlan (csrc/batch_decode.cu): the group size picks the
      // work-estimation function; unsupported group sizes throw here.
      DISPATCH_GQA_GROUP_SIZE(p.hq / p.hkv, GROUP_SIZE, {
        auto wef = BatchDecodeWithPagedKVCacheWorkEstimationDispatched<GROUP_SIZE, kD, kPos,
                                                                       Variant, Params>;
        std::size_t fb = 0, ib = 0;
        cuda_ok(DecodePlanWorkspaceSize<kD, kPos, Variant, Params>(
                    fb, ib, indptr_h_.data(), p.batch, p.hq, p.page,
                    /*enable_cuda_graph=*/false, p.stream, wef),
                "DecodePlanWorkspaceSize");
        float_ws_.reset(fb);
        int_ws_.reset(ib);
        pinned_.reset(ib);
        cuda_ok(DecodePlan<kD, kPos, Variant, Params>(
                    float_ws_.p, fb, int_ws_.p, pinned_.p, ib, info_, indptr_h_.data(), p.batch,
                    p.hq, p.page, /*enable_cuda_graph=*/false, p.stream, wef),
                "DecodePlan");
        // once more, only to report the occupancy-derived grid the plan split against
        bool split = false;
        uint32_t max_grid = 0, pages_per_chunk = 0, new_batch = 0, gdy = 0;
        cuda_ok(wef(split, max_grid, pages_per_chunk, new_batch, gdy, p.batch, indptr_h_.data(),
                    p.hq, p.page, false, p.stream),
                "work estimation");
        s.max_grid = max_grid;
        s.float_ws = fb;
        s.int_ws = ib;
      });
    } catch (const flashinfer::Error& e) {
      std::string why = fic::refusal_text(e.what());
      if (why.find("group_size") != std::string::npos)
        why += " (BatchDecodeWithPagedKVCachePlan dispatches GQA group sizes 1 2 3 4 6 8 16 only)";
      throw fid::Unsupported(why);
    }
    cuda_ok(cudaStreamSynchronize(p.stream), "DecodePlan copy");
    s.split_kv = info_.split_kv;
    s.padded_batch = info_.padded_batch_size;
    s.kv_chunk_tokens = GetPtrFromBaseOffset<Id>(pinned_.p, info_.kv_chunk_size_ptr_offset)[0];

    // BatchDecodeWithPagedKVCacheRun (csrc/batch_decode.cu)
    std::int64_t strides[4];
    cache_strides(p, strides);
    paged_kv_t<Elem, Id> paged_kv(p.hkv, p.page, kD, p.batch,
                                  p.hnd ? QKVLayout::kHND : QKVLayout::kNHD,
                                  static_cast<Elem*>(p.k), static_cast<Elem*>(p.v), strides,
                                  strides, p.page_indices, p.page_indptr, p.last_page_len);
    Params& a = params_;
    a.q = static_cast<Elem*>(p.q);
    a.paged_kv = paged_kv;
    a.o = static_cast<Elem*>(p.o);
    a.lse = p.lse;
    a.padded_batch_size = 0;
    a.num_qo_heads = p.hq;
    a.q_stride_n = p.hq * p.d;
    a.q_stride_h = p.d;
    a.window_left = -1;
    a.enable_pdl = p.pdl;
    a.request_indices = nullptr;
    a.kv_tile_indices = nullptr;
    a.o_indptr = nullptr;
    a.kv_chunk_size_ptr = nullptr;
    a.block_valid_mask = nullptr;
    a.partition_kv = false;
    // ADDITIONAL_PARAMS_SETTER
    a.maybe_alibi_slopes = nullptr;
    a.logits_soft_cap = 0.0;
    a.sm_scale = p.sm_scale;
    a.rope_rcp_scale = 1.0;        // 1 / rope_scale (1)
    a.rope_rcp_theta = 1.0 / 1e4;  // 1 / rope_theta (1e4)
    tmp_v_ = nullptr;
    tmp_s_ = nullptr;
    a.request_indices = GetPtrFromBaseOffset<Id>(int_ws_.p, info_.request_indices_offset);
    a.kv_tile_indices = GetPtrFromBaseOffset<Id>(int_ws_.p, info_.kv_tile_indices_offset);
    a.o_indptr = GetPtrFromBaseOffset<Id>(int_ws_.p, info_.o_indptr_offset);
    a.kv_chunk_size_ptr = GetPtrFromBaseOffset<Id>(int_ws_.p, info_.kv_chunk_size_ptr_offset);
    if (info_.split_kv) {
      tmp_v_ = GetPtrFromBaseOffset<Elem>(float_ws_.p, info_.v_offset);
      tmp_s_ = GetPtrFromBaseOffset<float>(float_ws_.p, info_.s_offset);
      if (info_.enable_cuda_graph)
        a.block_valid_mask = GetPtrFromBaseOffset<bool>(int_ws_.p, info_.block_valid_mask_offset);
    }
    a.padded_batch_size = info_.padded_batch_size;
    return s;
  }

  void run() override {
    cuda_ok(BatchDecodeWithPagedKVCacheDispatched<kD, kPos, Variant>(params_, tmp_v_, tmp_s_, pdl_,
                                                                     stream_),
            "BatchDecodeWithPagedKVCacheDispatched");
  }
  void* float_workspace() const override { return float_ws_.p; }
  std::size_t float_workspace_bytes() const override { return float_ws_.bytes; }

 private:
  std::vector<Id> indptr_h_;
  DecodePlanInfo info_;
  DeviceBuffer float_ws_, int_ws_;
  PinnedBuffer pinned_;
  Params params_{};
  Elem* tmp_v_ = nullptr;
  float* tmp_s_ = nullptr;
  bool pdl_ = true;
  cudaStream_t stream_ = nullptr;
};

std::unique_ptr<fid::Runner> make_runner() { return std::make_unique<CudaCoreRunner>(); }
const fid::Registrar registrar(fid::Key{fid::Path::kCudaCore, kDType, FI_HEAD_DIM, false},
                               &make_runner, "cuda_core " FI_DTYPE_NAME);

#else
// ---------------------------------------------------------------------------------------------
// Tensor-core decode = fa2 batch prefill over the paged cache: batch_prefill_customize_config
// .jinja as _gen_batch_prefill_module renders it for backend fa2 (additional tensors
// maybe_custom_mask:uint8_t, maybe_mask_indptr:int32_t, maybe_alibi_slopes:float,
// maybe_prefix_len_ptr:uint32_t, maybe_token_pos_in_items_ptr:uint16_t,
// maybe_max_item_len_ptr:uint16_t, maybe_k_cache_sf:uint8_t, maybe_v_cache_sf:uint8_t; scalars
// logits_soft_cap, sm_scale, rope_rcp_scale, rope_rcp_theta: double, token_pos_in_items_len:
// int64_t).

struct PagedParams {
  using DTypeQ = Elem;
  using DTypeKV = Elem;
  using DTypeO = Elem;
  using IdType = Id;

  DTypeQ* q;
  paged_kv_t<DTypeKV, IdType> paged_kv;
  IdType* q_indptr;
  DTypeO* o;
  float* lse;
  uint_fastdiv group_size;

  uint8_t* maybe_custom_mask;
  int32_t* maybe_mask_indptr;
  float* maybe_alibi_slopes;
  uint32_t* maybe_prefix_len_ptr;
  uint16_t* maybe_token_pos_in_items_ptr;
  uint16_t* maybe_max_item_len_ptr;
  uint8_t* maybe_k_cache_sf;
  uint8_t* maybe_v_cache_sf;
  double logits_soft_cap;
  double sm_scale;
  double rope_rcp_scale;
  double rope_rcp_theta;
  int64_t token_pos_in_items_len;

  uint32_t num_qo_heads;
  IdType q_stride_n;
  IdType q_stride_h;
  uint32_t k_sf_stride_page;
  uint32_t k_sf_stride_n;
  uint32_t k_sf_stride_h;
  uint32_t v_sf_stride_page;
  uint32_t v_sf_stride_n;
  uint32_t v_sf_stride_h;
  int32_t window_left;

  IdType* request_indices;
  IdType* qo_tile_indices;
  IdType* kv_tile_indices;
  IdType* merge_indptr;
  IdType* o_indptr;
  bool* block_valid_mask;
  IdType* kv_chunk_size_ptr;
  uint32_t max_total_num_rows;
  uint32_t* total_num_rows;
  uint32_t padded_batch_size;
  bool partition_kv;

  __host__ __device__ __forceinline__ uint32_t get_qo_len(uint32_t batch_idx) const {
    return q_indptr[batch_idx + 1] - q_indptr[batch_idx];
  }

  __host__ __device__ __forceinline__ uint32_t get_kv_len(uint32_t batch_idx) const {
    return paged_kv.get_length(batch_idx);
  }
};

constexpr MaskMode kMask = FI_CAUSAL ? MaskMode::kCausal : MaskMode::kNone;
constexpr bool use_custom_mask = kMask == MaskMode::kCustom;  // batch_prefill_paged_kernel_inst
using Variant = DefaultAttention<use_custom_mask, false, false, false>;

// The kernels of one CTA_TILE_Q. batch_prefill_paged_kernel_inst.jinja instantiates 16, 64 and 128
// for head dims <= 256 and csrc/batch_prefill.cu dispatches on the plan's cta_tile_q
// (FA2DetermineCtaTileQ: 16 for a packed q_len·group <= 16, 64 up to 64, 128 above 64 when the head
// dim is < 256); each tile is compiled in an object of its own (-DFI_CTA_TILE_Q) and registers its
// launch, which the runner (in the tile-16 object) looks up.
#if FI_CTA_TILE_Q != 16 && FI_CTA_TILE_Q != 64 && FI_CTA_TILE_Q != 128
#error "FI_CTA_TILE_Q must be 16, 64 or 128"
#endif
static cudaError_t launch_tile(const void* params, void* tmp_v, float* tmp_s, bool pdl,
                               cudaStream_t st) {
  return BatchPrefillWithPagedKVCacheDispatched</*SAME_KV_STRIDES=*/true, FI_CTA_TILE_Q, kD, kD,
                                                kPos, /*USE_FP16_QK_REDUCTION=*/false, kMask,
                                                Variant, PagedParams>(
      *static_cast<const PagedParams*>(params), static_cast<Elem*>(tmp_v), tmp_s, pdl, st);
}
const fid::TileRegistrar tile_registrar(fid::TileEntry{kDType, FI_HEAD_DIM, FI_CAUSAL != 0,
                                                       FI_CTA_TILE_Q, &launch_tile});

#if FI_RUNNER
class TensorCoreRunner final : public fid::Runner {
 public:
  fid::PlanSummary plan(const fid::Problem& p) override {
    stream_ = p.stream;
    pdl_ = p.pdl;
    const std::uint32_t rows = static_cast<std::uint32_t>(p.batch) * p.q_len;
    qo_indptr_h_.resize(p.batch + 1);
    for (int b = 0; b <= p.batch; ++b) qo_indptr_h_[b] = b * p.q_len;
    kv_indptr_h_.assign(p.h_page_indptr, p.h_page_indptr + p.batch + 1);
    const std::int64_t uniform_q_len = p.q_len > 1 ? p.q_len : 0;
    fid::PlanSummary s;
    try {
      // BatchPrefillWithKVCachePlan (csrc/batch_prefill.cu) with decode.py's arguments
      std::size_t fb = 0, ib = 0;
      cuda_ok(PrefillPlanWorkspaceSize<Id>(fb, ib, qo_indptr_h_.data(), kv_indptr_h_.data(), rows,
                                           p.batch, p.hq, p.hkv, kD, kD, p.page,
                                           /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2,
                                           /*window_left=*/-1, /*fixed_split_size=*/-1,
                                           /*disable_split_kv=*/false, /*num_colocated_ctas=*/0,
                                           uniform_q_len, p.stream,
                                           /*kv_dtype_bytes=*/sizeof(Elem)),
              "PrefillPlanWorkspaceSize");
      float_ws_.reset(fb);
      int_ws_.reset(ib);
      pinned_.reset(ib);
      cuda_ok(PrefillPlan<Id>(float_ws_.p, fb, int_ws_.p, pinned_.p, ib, info_, qo_indptr_h_.data(),
                              kv_indptr_h_.data(), rows, p.batch, p.hq, p.hkv, kD, kD, p.page,
                              /*enable_cuda_graph=*/false,
                              /*sizeof_dtype_o=*/2, /*window_left=*/-1,
                              /*fixed_split_size=*/-1, /*disable_split_kv=*/false,
                              /*num_colocated_ctas=*/0, uniform_q_len, p.stream,
                              /*kv_dtype_bytes=*/sizeof(Elem)),
              "PrefillPlan");
      s.float_ws = fb;
      s.int_ws = ib;
    } catch (const flashinfer::Error& e) {
      throw fid::Unsupported(fic::refusal_text(e.what()));
    }
    cuda_ok(cudaStreamSynchronize(p.stream), "PrefillPlan copy");
    s.split_kv = info_.split_kv;
    s.padded_batch = info_.padded_batch_size;
    s.cta_tile_q = static_cast<int>(info_.cta_tile_q);
    s.kv_chunk_tokens = GetPtrFromBaseOffset<Id>(pinned_.p, info_.kv_chunk_size_ptr_offset)[0];
    launch_ = nullptr;
    for (const fid::TileEntry& t : fid::tile_registry())
      if (t.dtype == kDType && t.d == static_cast<int>(kD) && t.causal == (FI_CAUSAL != 0) &&
          t.cta_tile_q == static_cast<int>(info_.cta_tile_q))
        launch_ = t.launch;
    if (launch_ == nullptr)
      throw std::runtime_error("TensorCoreRunner::plan: the plan chose cta_tile_q " +
                               std::to_string(info_.cta_tile_q) +
                               ", whose kernels were not built (16, 64 and 128 are)");

    // BatchPrefillWithPagedKVCacheRun (csrc/batch_prefill_paged.cuh)
    std::int64_t strides[4];
    cache_strides(p, strides);
    paged_kv_t<Elem, Id> paged_kv(p.hkv, p.page, kD, p.batch,
                                  p.hnd ? QKVLayout::kHND : QKVLayout::kNHD,
                                  static_cast<Elem*>(p.k), static_cast<Elem*>(p.v), strides,
                                  strides, p.page_indices, p.page_indptr, p.last_page_len);
    PagedParams& a = params_;
    a.q = static_cast<Elem*>(p.q);
    a.paged_kv = paged_kv;
    a.q_indptr = p.qo_indptr;
    a.o = static_cast<Elem*>(p.o);
    a.lse = p.lse;
    a.num_qo_heads = p.hq;
    a.group_size = uint_fastdiv(p.hq / paged_kv.num_heads);
    a.q_stride_n = p.hq * p.d;
    a.q_stride_h = p.d;
    a.window_left = -1;
    a.request_indices = nullptr;
    a.qo_tile_indices = nullptr;
    a.kv_tile_indices = nullptr;
    a.merge_indptr = nullptr;
    a.o_indptr = nullptr;
    a.kv_chunk_size_ptr = nullptr;
    a.block_valid_mask = nullptr;
    a.total_num_rows = nullptr;
    a.max_total_num_rows = 0;
    a.padded_batch_size = 0;
    a.partition_kv = false;
    a.k_sf_stride_page = 0;
    a.k_sf_stride_n = 0;
    a.k_sf_stride_h = 0;
    a.v_sf_stride_page = 0;
    a.v_sf_stride_n = 0;
    a.v_sf_stride_h = 0;
    // ADDITIONAL_PARAMS_SETTER (all optional tensors absent)
    a.maybe_custom_mask = nullptr;
    a.maybe_mask_indptr = nullptr;
    a.maybe_alibi_slopes = nullptr;
    a.maybe_prefix_len_ptr = nullptr;
    a.maybe_token_pos_in_items_ptr = nullptr;
    a.maybe_max_item_len_ptr = nullptr;
    a.maybe_k_cache_sf = nullptr;
    a.maybe_v_cache_sf = nullptr;
    a.logits_soft_cap = 0.0;
    a.sm_scale = p.sm_scale;
    a.rope_rcp_scale = 1.0;
    a.rope_rcp_theta = 1.0 / 1e4;
    a.token_pos_in_items_len = 0;
    tmp_v_ = nullptr;
    tmp_s_ = nullptr;
    a.request_indices = GetPtrFromBaseOffset<Id>(int_ws_.p, info_.request_indices_offset);
    a.qo_tile_indices = GetPtrFromBaseOffset<Id>(int_ws_.p, info_.qo_tile_indices_offset);
    a.kv_tile_indices = GetPtrFromBaseOffset<Id>(int_ws_.p, info_.kv_tile_indices_offset);
    a.o_indptr = GetPtrFromBaseOffset<Id>(int_ws_.p, info_.o_indptr_offset);
    a.kv_chunk_size_ptr = GetPtrFromBaseOffset<Id>(int_ws_.p, info_.kv_chunk_size_ptr_offset);
    if (info_.split_kv) {
      a.merge_indptr = GetPtrFromBaseOffset<Id>(int_ws_.p, info_.merge_indptr_offset);
      tmp_v_ = GetPtrFromBaseOffset<Elem>(float_ws_.p, info_.v_offset);
      tmp_s_ = GetPtrFromBaseOffset<float>(float_ws_.p, info_.s_offset);
    }
    a.padded_batch_size = info_.padded_batch_size;
    a.max_total_num_rows = info_.total_num_rows;
    if (info_.enable_cuda_graph) {
      a.block_valid_mask = GetPtrFromBaseOffset<bool>(int_ws_.p, info_.block_valid_mask_offset);
      a.total_num_rows = GetPtrFromBaseOffset<uint32_t>(int_ws_.p, info_.total_num_rows_offset);
    }
    return s;
  }

  void run() override {  // DISPATCH_CTA_TILE_Q(plan_info.cta_tile_q, ...) of csrc/batch_prefill.cu
    if (launch_ == nullptr) throw std::runtime_error("TensorCoreRunner::run: no successful plan()");
    cuda_ok(launch_(&params_, tmp_v_, tmp_s_, pdl_, stream_),
            "BatchPrefillWithPagedKVCacheDispatched");
  }
  void* float_workspace() const override { return float_ws_.p; }
  std::size_t float_workspace_bytes() const override { return float_ws_.bytes; }

 private:
  std::vector<Id> qo_indptr_h_, kv_indptr_h_;
  PrefillPlanInfo info_;
  DeviceBuffer float_ws_, int_ws_;
  PinnedBuffer pinned_;
  PagedParams params_{};
  Elem* tmp_v_ = nullptr;
  float* tmp_s_ = nullptr;
  fid::TileLaunch launch_ = nullptr;
  bool pdl_ = true;
  cudaStream_t stream_ = nullptr;
};

std::unique_ptr<fid::Runner> make_runner() { return std::make_unique<TensorCoreRunner>(); }
const fid::Registrar registrar(
    fid::Key{fid::Path::kTensorCore, kDType, FI_HEAD_DIM, FI_CAUSAL != 0}, &make_runner,
    FI_CAUSAL ? "tensor_core causal " FI_DTYPE_NAME : "tensor_core " FI_DTYPE_NAME);
#endif  // FI_RUNNER
#endif  // FI_PATH

}  // namespace FI_NS
