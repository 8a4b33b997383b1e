/// @file fi_mla_kernel.cu
/// @brief One FlashInfer Hopper MLA instance: what `BatchMLAPagedAttentionWrapper(backend="fa3")`
///        runs for bf16 queries and outputs, head dims 512 / 64, int32 indices and one KV dtype,
///        built from the wheel's headers: the plan of csrc/batch_mla_sm90_plan.cu (`MLAPlan`,
///        scheduler.cuh) with the int workspace staged to the device as the module proxy of
///        jit/attention/modules.py does, and the run of csrc/batch_mla_sm90_run.cu
///        (`mla::BatchMLAPageAttentionHopper`, mla_hopper.cuh), Params filled field for field.
///
/// Compiled once per instance with -DFI_MLA_KV=0|1 (bf16 | e4m3 latent cache) and
/// -DFI_CAUSAL=0|1 (MaskMode kNone | kCausal: the mask the wrapper's `causal` selects).
#if !defined(FI_MLA_KV) || !defined(FI_CAUSAL)
#error "an instance needs FI_MLA_KV and FI_CAUSAL"
#endif

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <flashinfer/attention/mla_hopper.cuh>
#include <flashinfer/attention/mla_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/fastdiv.cuh>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "fi_buffers.hpp"
#include "fi_mla.hpp"

// A namespace named after the instance, so its kernels get names of their own (see
// fi_decode_kernel.cu on why not an anonymous one).
#define FI_MLA_CAT(a, b, c) a##_kv##b##_c##c
#define FI_MLA_NS_OF(k, c) FI_MLA_CAT(fi_mla_instance, k, c)
#define FI_MLA_NS FI_MLA_NS_OF(FI_MLA_KV, FI_CAUSAL)
namespace FI_MLA_NS {

using namespace flashinfer;

using DTypeQ = nv_bfloat16;
#if FI_MLA_KV == 0
using DTypeKV = nv_bfloat16;
#define FI_MLA_KV_NAME "bf16"
#else
using DTypeKV = __nv_fp8_e4m3;
#define FI_MLA_KV_NAME "e4m3"
#endif
using DTypeO = nv_bfloat16;
using IdType = std::int32_t;
using Params = MLAParams<DTypeQ, DTypeKV, DTypeO, IdType>;
constexpr int kHeadDimCkv = 512;
constexpr int kHeadDimKpe = 64;
constexpr MaskMode kMask = FI_CAUSAL ? MaskMode::kCausal : MaskMode::kNone;
constexpr fim::KvType kKv = FI_MLA_KV == 0 ? fim::KvType::kBF16 : fim::KvType::kE4M3;

using fib::cuda_ok;
using fib::DeviceBuffer;
using fib::PinnedBuffer;

class HopperMlaRunner final : public fim::Runner {
 public:
  fim::PlanSummary plan(const fim::Problem& p) override {
    if (p.kv != kKv || p.causal != (FI_CAUSAL != 0))
      throw std::logic_error("HopperMlaRunner::plan: the problem is not this instance's");
    stream_ = p.stream;
    // The wrapper's buffers: a float workspace of the caller's size (128 MiB, as FlashInfer's
    // examples allocate), an 8 MiB int workspace and its page-locked twin (mla/_batch_mla).
    float_ws_.reset(std::size_t{128} << 20);
    int_ws_.reset(std::size_t{8} << 20);
    pinned_.reset(int_ws_.bytes);
    qo_h_.assign(p.h_qo_indptr, p.h_qo_indptr + p.batch + 1);
    kv_h_.assign(p.h_kv_indptr, p.h_kv_indptr + p.batch + 1);
    len_h_.assign(p.h_kv_len, p.h_kv_len + p.batch);
    std::size_t staged = 0;
    try {
      // BatchMLAPagedAttentionSM90Plan: head_dim_o = head_dim_ckv
      cuda_ok(MLAPlan<IdType>(float_ws_.p, float_ws_.bytes, int_ws_.p, pinned_.p, int_ws_.bytes,
                              info_, staged, qo_h_.data(), kv_h_.data(), len_h_.data(),
                              static_cast<std::uint32_t>(p.batch),
                              static_cast<std::uint32_t>(p.heads), kHeadDimCkv, p.causal, p.stream),
              "MLAPlan");
    } catch (const flashinfer::Error& e) {
      throw fim::Unsupported(fic::refusal_text(e.what()));
    }
    // _BatchMLAModuleProxy.plan_with_staged_workspace_bytes: the staged bytes to the device
    cuda_ok(cudaMemcpyAsync(int_ws_.p, pinned_.p, staged, cudaMemcpyHostToDevice, p.stream),
            "int workspace copy");
    cuda_ok(cudaStreamSynchronize(p.stream), "int workspace copy");

    fim::PlanSummary s;
    s.cluster_size = static_cast<int>(info_.num_blks_x);
    s.clusters = static_cast<int>(info_.num_blks_y);
    const IdType* work_indptr = GetPtrFromBaseOffset<IdType>(pinned_.p, info_.work_indptr_offset);
    const IdType* partial = GetPtrFromBaseOffset<IdType>(pinned_.p, info_.partial_indptr_offset);
    s.works = work_indptr[info_.num_blks_y];
    for (long long i = 0; i < s.works; ++i) s.split_tiles += partial[i] >= 0 ? 1 : 0;
    s.int_ws = staged;

    // BatchMLAPagedAttentionSM90Run, q_nope (n, heads, 512), q_pe (n, heads, 64), ckv
    // (pages, page, 512), kpe (pages, page, 64), o (n, heads, 512): contiguous strides
    Params& a = params_;
    a = Params{};
    char* ib = static_cast<char*>(int_ws_.p);
    a.q_nope = static_cast<DTypeQ*>(const_cast<void*>(p.q_nope));
    a.q_pe = static_cast<DTypeQ*>(const_cast<void*>(p.q_pe));
    a.ckv = static_cast<DTypeKV*>(const_cast<void*>(p.ckv));
    a.kpe = static_cast<DTypeKV*>(const_cast<void*>(p.kpe));
    a.q_indptr = GetPtrFromBaseOffset<IdType>(ib, info_.q_indptr_offset);
    a.kv_indptr = GetPtrFromBaseOffset<IdType>(ib, info_.kv_indptr_offset);
    a.partial_indptr = GetPtrFromBaseOffset<IdType>(ib, info_.partial_indptr_offset);
    a.kv_indices = p.kv_indices;
    a.q_len = GetPtrFromBaseOffset<IdType>(ib, info_.q_len_offset);
    a.kv_len = GetPtrFromBaseOffset<IdType>(ib, info_.kv_len_offset);
    a.q_start = GetPtrFromBaseOffset<IdType>(ib, info_.q_start_offset);
    a.kv_start = GetPtrFromBaseOffset<IdType>(ib, info_.kv_start_offset);
    a.kv_end = GetPtrFromBaseOffset<IdType>(ib, info_.kv_end_offset);
    a.work_indptr = GetPtrFromBaseOffset<IdType>(ib, info_.work_indptr_offset);
    a.merge_packed_offset_start =
        GetPtrFromBaseOffset<IdType>(ib, info_.merge_packed_offset_start_offset);
    a.merge_packed_offset_end =
        GetPtrFromBaseOffset<IdType>(ib, info_.merge_packed_offset_end_offset);
    a.merge_partial_packed_offset_start =
        GetPtrFromBaseOffset<IdType>(ib, info_.merge_partial_packed_offset_start_offset);
    a.merge_partial_packed_offset_end =
        GetPtrFromBaseOffset<IdType>(ib, info_.merge_partial_packed_offset_end_offset);
    a.merge_partial_stride = GetPtrFromBaseOffset<IdType>(ib, info_.merge_partial_stride_offset);
    a.final_o = static_cast<DTypeO*>(p.o);
    a.final_lse = p.lse;
    a.partial_o = GetPtrFromBaseOffset<DTypeO>(float_ws_.p, info_.partial_o_offset);
    a.partial_lse = GetPtrFromBaseOffset<float>(float_ws_.p, info_.partial_lse_offset);
    a.num_heads = uint_fastdiv(static_cast<std::uint32_t>(p.heads));
    a.block_size = uint_fastdiv(static_cast<std::uint32_t>(p.page));
    a.q_nope_stride_n = static_cast<std::uint32_t>(p.heads) * kHeadDimCkv;
    a.q_nope_stride_h = kHeadDimCkv;
    a.q_pe_stride_n = static_cast<std::uint32_t>(p.heads) * kHeadDimKpe;
    a.q_pe_stride_h = kHeadDimKpe;
    a.ckv_stride_page = static_cast<std::uint32_t>(p.page) * kHeadDimCkv;
    a.ckv_stride_n = kHeadDimCkv;
    a.kpe_stride_page = static_cast<std::uint32_t>(p.page) * kHeadDimKpe;
    a.kpe_stride_n = kHeadDimKpe;
    a.o_stride_n = static_cast<std::uint32_t>(p.heads) * kHeadDimCkv;
    a.o_stride_h = kHeadDimCkv;
    a.return_lse_base_on_e = true;  // the harness compares natural-base LSEs
    a.sm_scale = static_cast<float>(p.sm_scale);
    // _run_generated_fa: the scales are 1.0 for a bf16 cache, the caller's for fp8
    a.ckv_scale = FI_MLA_KV == 0 ? 1.f : p.ckv_scale;
    a.kpe_scale = FI_MLA_KV == 0 ? 1.f : p.kpe_scale;
    a.ckv_scale_arr = nullptr;
    planned_ = true;
    return s;
  }

  void run() override {
    if (!planned_) throw std::runtime_error("HopperMlaRunner::run: no successful plan()");
    cuda_ok(mla::BatchMLAPageAttentionHopper<kMask, kHeadDimCkv, kHeadDimKpe>(
                params_, static_cast<std::uint32_t>(info_.num_blks_x),
                static_cast<std::uint32_t>(info_.num_blks_y), stream_),
            "BatchMLAPageAttentionHopper");
  }
  void* float_workspace() const override { return float_ws_.p; }
  std::size_t float_workspace_bytes() const override { return float_ws_.bytes; }

 private:
  std::vector<IdType> qo_h_, kv_h_, len_h_;
  MLAPlanInfo info_{};
  DeviceBuffer float_ws_, int_ws_;
  PinnedBuffer pinned_;
  Params params_{};
  bool planned_ = false;
  cudaStream_t stream_ = nullptr;
};

std::unique_ptr<fim::Runner> make_runner() { return std::make_unique<HopperMlaRunner>(); }
const fim::Registrar registrar(fim::Key{kKv, FI_CAUSAL != 0}, &make_runner,
                               FI_CAUSAL ? "fa3 causal " FI_MLA_KV_NAME : "fa3 " FI_MLA_KV_NAME);

}  // namespace FI_MLA_NS
