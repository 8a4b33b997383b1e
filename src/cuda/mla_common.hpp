/// @file cuda/mla_common.hpp
/// @brief What the CUDA MLA decode and the MLA cascade share on the host (internal): the
///        problem checks, the planner's facts for the MLA kernels, the catalog query, the
///        16-byte copy checks and the kernel's input parameters (queries and latent cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/merge.hpp"
#include "attnstate/cuda/mla.hpp"
#include "catalog/catalog.hpp"
#include "common/mla_validate.hpp"
#include "common/validate.hpp"
#include "cuda/kernels/mla/params.cuh"
#include "cuda/plan_run_checks.hpp"
#include "plan/decode_plan.hpp"
#include "plan/mla_plan.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

using attnstate::detail::decode_str;
using attnstate::detail::throw_argument;

// The planner's facts for the MLA kernels (plan/mla_plan.hpp, host-only and tested there).
using plan::mla_facts;

/// Resident CTAs per SM of the two-CTA narrow MLA decode's instance of `rows` (16 or 32) rows
/// over a bf16 latent cache on the current device (its shared-memory limit raised first, as its
/// launch does): what `catalog::kMlaNarrow2CtasPerSm` promises, for the tests. Defined in
/// cuda/mla.cu.
int mla_narrow2_resident_ctas(int rows);

/// The catalog query of a problem's kernel of `family` (the decode's, or the cascade's levels).
inline catalog::Query mla_query(const MlaDecodeProblem& pr,
                                catalog::Family family = catalog::Family::kMlaDecode) {
  catalog::Query q;
  q.family = family;
  q.head_dim = pr.kv_lora_rank + pr.rope_dim;
  q.q = catalog::mask(pr.q_dtype);
  q.kv = catalog::mask(pr.ckv_dtype);
  return q;
}

/// Throws naming `fn` and `<prefix><field>` (`problem.batch`, ...; the cascade's fields are
/// `problem.mla.<field>`) unless the problem is one the kernels take.
inline void check_mla_problem(const char* fn, const MlaDecodeProblem& pr,
                              const std::string& prefix = "problem.") {
  const auto n = [&](const char* field) { return prefix + field; };
  if (pr.batch < 0) throw_argument(fn, n("batch").c_str(), ">= 0", decode_str(pr.batch));
  if (pr.q_len < 1 || pr.q_len > 4)
    throw_argument(fn, n("q_len").c_str(), "1..4", decode_str(pr.q_len),
                   pr.q_len < 1 ? Status::kInvalidArgument : Status::kNotSupported);
  if (pr.heads < 1) throw_argument(fn, n("heads").c_str(), ">= 1", decode_str(pr.heads));
  if (pr.heads % 16 != 0 || pr.heads > 128)
    throw_argument(fn, n("heads").c_str(), "a multiple of 16 up to 128", decode_str(pr.heads),
                   Status::kNotSupported);
  if (pr.kv_lora_rank != catalog::kMlaLoraRank)
    throw_argument(fn, n("kv_lora_rank").c_str(), decode_str(catalog::kMlaLoraRank),
                   decode_str(pr.kv_lora_rank), Status::kNotSupported);
  if (pr.rope_dim != catalog::kMlaRopeDim)
    throw_argument(fn, n("rope_dim").c_str(), decode_str(catalog::kMlaRopeDim),
                   decode_str(pr.rope_dim), Status::kNotSupported);
  const DType dts[3] = {pr.q_dtype, pr.ckv_dtype, pr.kpe_dtype};
  const std::string names[3] = {n("q_dtype"), n("ckv_dtype"), n("kpe_dtype")};
  for (int i = 0; i < 3; ++i)
    if (!is_valid(dts[i]))
      throw_argument(fn, names[i].c_str(), "a dtype",
                     "value " + decode_str(static_cast<int>(dts[i])));
  if (pr.q_dtype != DType::kBF16)
    throw_argument(fn, n("q_dtype").c_str(), "bf16", to_string(pr.q_dtype), Status::kNotSupported);
  if (!catalog::compiled(mla_query(pr)))
    throw_argument(fn, n("ckv_dtype").c_str(), catalog::not_supported_message(mla_query(pr)),
                   to_string(pr.ckv_dtype), Status::kNotSupported);
  if (pr.kpe_dtype != DType::kBF16 && !(is_fp8(pr.ckv_dtype) && pr.kpe_dtype == pr.ckv_dtype))
    throw_argument(fn, n("kpe_dtype").c_str(),
                   "bf16, or " + n("ckv_dtype") + " when fp8 (" + to_string(pr.ckv_dtype) + ")",
                   to_string(pr.kpe_dtype), Status::kNotSupported);
}

/// Throws naming `name` unless the bytes `bytes` are a multiple of 16 (the kernel's copies).
inline void check_multiple_16(const char* fn, const char* name, std::int64_t elems, DType dt) {
  const std::int64_t bytes = elems * static_cast<std::int64_t>(size_of(dt));
  if (bytes % 16 != 0)
    throw_argument(fn, name,
                   "a multiple of 16 bytes (" + decode_str(16 / size_of(dt)) +
                       " elements: the kernel copies 16 bytes at a time)",
                   decode_str(elems) + " elements", Status::kNotSupported);
}

/// Throws naming `name` unless query view `q` has 16-byte aligned data and rows.
inline void check_query_rows(const char* fn, const char* name, const ConstTensorView& q) {
  const std::string n(name);
  attnstate::detail::check_aligned(fn, (n + ".data").c_str(), q.data, 16);
  for (int d = 0; d < 3; ++d)
    check_multiple_16(fn, (n + ".stride[" + decode_str(d) + "]").c_str(), q.stride[d], q.dtype);
}

/// The element strides of query view `q` as the kernel's (request, token, head) strides.
inline void query_strides(const ConstTensorView& q, std::int64_t* b, std::int64_t* t,
                          std::int64_t* h) {
  *b = q.stride[0];
  *t = q.stride[1];
  *h = q.stride[2];
}

/// The kernels' limits of the latent part's block scales (when given; the shared checks passed):
/// blocks of `kMlaBlockCols` (128) columns, the 4 scales of a token one aligned 16-byte vector
/// (data, token and page strides multiples of 4 floats), in memory the kernels read.
inline void check_mla_block_scale_copies(const char* fn, const MlaKvCache& kv) {
  const MlaBlockScale& bs = kv.ckv_block_scale;
  if (!bs.present()) return;
  namespace v = ::attnstate::detail;
  if (bs.block_cols != kMlaBlockCols)
    v::throw_argument(fn, "kv.ckv_block_scale.block_cols",
                      decode_str(kMlaBlockCols) + " (the CUDA kernels' blocks)",
                      decode_str(bs.block_cols), Status::kNotSupported);
  v::check_aligned(fn, "kv.ckv_block_scale.data", bs.data, 16);
  check_multiple_16(fn, "kv.ckv_block_scale.token_stride", kv.ckv_block_scale_row_stride(),
                    DType::kF32);
  check_multiple_16(fn, "kv.ckv_block_scale.page_stride", kv.ckv_block_scale_page_elems(),
                    DType::kF32);
  check_scale_memory(fn, "kv.ckv_block_scale.data", bs.data);
}

/// The checks of the kernels' 16-byte copies (the pools, their token and page strides, the query
/// rows) and of the fp8 scales' memory (read on the device), naming the argument.
inline void check_mla_copies(const char* fn, const ConstTensorView& q_nope,
                             const ConstTensorView& q_pe, const MlaKvCache& kv) {
  attnstate::detail::check_aligned(fn, "kv.ckv", kv.ckv, 16);
  attnstate::detail::check_aligned(fn, "kv.kpe", kv.kpe, 16);
  check_multiple_16(fn, "kv.ckv_token_stride", kv.ckv_row_stride(), kv.ckv_dtype);
  check_multiple_16(fn, "kv.ckv_page_stride", kv.ckv_page_elems(), kv.ckv_dtype);
  check_multiple_16(fn, "kv.kpe_token_stride", kv.kpe_row_stride(), kv.kpe_dtype);
  check_multiple_16(fn, "kv.kpe_page_stride", kv.kpe_page_elems(), kv.kpe_dtype);
  check_query_rows(fn, "q_nope", q_nope);
  check_query_rows(fn, "q_pe", q_pe);
  check_scale_memory(fn, "kv.ckv_scale.data", kv.ckv_scale.data);
  check_scale_memory(fn, "kv.kpe_scale.data", kv.kpe_scale.data);
  check_mla_block_scale_copies(fn, kv);
}

/// The checks of a workspace of `need` bytes (> 0): non-null, at least `need` bytes
/// (`kWorkspaceTooSmall`), 16-byte aligned, disjoint from `out`, the queries and both parts of
/// the cache (the callers add their tables).
inline void check_mla_workspace(const char* fn, const ConstTensorView& q_nope,
                                const ConstTensorView& q_pe, const MlaKvCache& kv,
                                const StateView& out, const void* workspace,
                                std::size_t workspace_bytes, std::size_t need) {
  namespace v = ::attnstate::detail;
  if (workspace == nullptr) throw_argument(fn, "workspace", "non-null", "null");
  if (workspace_bytes < need)
    throw_argument(fn, "workspace_bytes", ">= plan.workspace_bytes() = " + decode_str(need),
                   decode_str(static_cast<std::int64_t>(workspace_bytes)),
                   Status::kWorkspaceTooSmall);
  v::check_aligned(fn, "workspace", workspace, 16);
  const auto wb = static_cast<std::int64_t>(need);
  v::check_disjoint(fn, "out", out, "workspace", workspace, wb, nullptr, 0);
  const auto disjoint = [&](const char* name, const void* p, std::int64_t bytes) {
    v::check_buffer_disjoint(fn, "workspace", workspace, wb, name, p, bytes);
  };
  disjoint("q_nope", q_nope.data, v::tensor_bytes(q_nope));
  disjoint("q_pe", q_pe.data, v::tensor_bytes(q_pe));
  disjoint("kv.ckv", kv.ckv,
           v::check_mla_part(fn, "ckv", kv.ckv, kv.ckv_dtype, kv.ckv_scale, kv.kv_lora_rank,
                             kv.ckv_token_stride, kv.ckv_page_stride, kv, MemorySpace::kDevice));
  disjoint("kv.kpe", kv.kpe,
           v::check_mla_part(fn, "kpe", kv.kpe, kv.kpe_dtype, kv.kpe_scale, kv.rope_dim,
                             kv.kpe_token_stride, kv.kpe_page_stride, kv, MemorySpace::kDevice));
  disjoint("kv.ckv_block_scale.data", kv.ckv_block_scale.data, v::check_mla_block_scale(fn, kv));
}

/// The kernel's query and latent-cache fields of `p` (and its shape: `q_len`, `group = heads`,
/// `rows`, the base-2 score scale of `scale`) from checked views; `kv`'s page table (of the
/// decode; null fields for the cascade, whose levels give theirs) and lengths as they are.
inline void fill_mla_inputs(const ConstTensorView& q_nope, const ConstTensorView& q_pe,
                            const MlaKvCache& kv, std::int64_t q_len, std::int64_t heads,
                            float scale, MlaParams* p) {
  p->q_nope = static_cast<const std::uint16_t*>(q_nope.data);
  p->q_pe = static_cast<const std::uint16_t*>(q_pe.data);
  query_strides(q_nope, &p->qn_stride_b, &p->qn_stride_t, &p->qn_stride_h);
  query_strides(q_pe, &p->qp_stride_b, &p->qp_stride_t, &p->qp_stride_h);
  p->ckv = static_cast<const unsigned char*>(kv.ckv);
  p->kpe = static_cast<const unsigned char*>(kv.kpe);
  const auto ckv_size = static_cast<std::int64_t>(size_of(kv.ckv_dtype));
  const auto kpe_size = static_cast<std::int64_t>(size_of(kv.kpe_dtype));
  p->ckv_token_bytes = kv.ckv_row_stride() * ckv_size;
  p->ckv_page_bytes = kv.ckv_page_elems() * ckv_size;
  p->kpe_token_bytes = kv.kpe_row_stride() * kpe_size;
  p->kpe_page_bytes = kv.kpe_page_elems() * kpe_size;
  p->kpe_fp8 = is_fp8(kv.kpe_dtype);
  p->ckv_scale = kv.ckv_scale;
  p->kpe_scale = kv.kpe_scale;
  p->ckv_bscale = reinterpret_cast<const unsigned char*>(kv.ckv_block_scale.data);
  p->bscale_token_bytes = kv.ckv_block_scale.present() ? kv.ckv_block_scale_row_stride() * 4 : 0;
  p->bscale_page_bytes = kv.ckv_block_scale.present() ? kv.ckv_block_scale_page_elems() * 4 : 0;
  p->page_indptr = kv.page_indptr;
  p->page_indices = kv.page_indices;
  p->block_table = kv.block_table;
  p->block_table_stride = kv.block_table_stride;
  p->seq_lens = kv.seq_lens;
  p->num_pages = kv.num_pages;
  p->page_size = static_cast<std::int32_t>(kv.page_size);
  p->q_len = static_cast<std::int32_t>(q_len);
  p->group = static_cast<std::int32_t>(heads);
  p->rows = p->q_len * p->group;
  p->s2_scale = math::base2_score_scale(scale);
}

/// Bytes of an fp32 `o` row of the MLA kernels' states.
inline constexpr std::int64_t kMlaStateRowBytes = std::int64_t{catalog::kMlaLoraRank} * 4;

/// A workspace holding a stack of MLA states and what its merge needs: the stack
/// `[slots][rows][512]` (`o` fp32, LSEs base 2), an fp32 state of `rows` rows (the stack merged
/// before the sinks) and one zero row (the sink state's `o`); sections 256-byte aligned.
struct MlaStackLayout {
  std::size_t o_off = 0, lse_off = 0, tmp_o_off = 0, tmp_lse_off = 0, zeros_off = 0, total = 0;
};

/// The stack workspace of `slots` states of `rows` rows from byte `base` (256-byte aligned) on;
/// false when the stack does not fit 2^60 bytes.
inline bool mla_stack_layout(std::int64_t rows, std::int64_t slots, std::size_t base,
                             MlaStackLayout* w) {
  const auto up = [](std::int64_t x) { return static_cast<std::size_t>((x + 255) / 256 * 256); };
  *w = MlaStackLayout{};
  std::int64_t parts = 0, o_bytes = 0;
  if (!checked_mul(rows, slots, &parts) || !checked_mul(parts, kMlaStateRowBytes, &o_bytes) ||
      o_bytes > (std::int64_t{1} << 60))
    return false;
  w->o_off = base;
  w->lse_off = w->o_off + up(o_bytes);
  w->tmp_o_off = w->lse_off + up(parts * 4);
  w->tmp_lse_off = w->tmp_o_off + up(rows * kMlaStateRowBytes);
  w->zeros_off = w->tmp_lse_off + up(rows * 4);
  w->total = w->zeros_off + up(kMlaStateRowBytes);
  return true;
}

/// `merge_states` of the dense stack of `workspace` (`w`: `[slots][tokens · heads][512]`) into
/// `out`, on `stream`; with sinks, the stack merged into the workspace's fp32 state first, then
/// that state merged once with the sink state into `out` (rounded once). The stacked merge of
/// the MLA decode and the MLA cascade's merge of its levels.
inline void merge_mla_stack(void* workspace, const MlaStackLayout& w, std::int64_t tokens,
                            std::int64_t slots, std::int64_t heads, const AttentionSinks& sinks,
                            const StateView& out, cudaStream_t stream) {
  char* ws = static_cast<char*>(workspace);
  const ConstStateStackView stack =
      make_state_stack(ws + w.o_off, DType::kF32, reinterpret_cast<const float*>(ws + w.lse_off),
                       StackOrder::kStatesMajor, tokens, slots, heads, catalog::kMlaLoraRank,
                       LseBase::kBase2, MemorySpace::kDevice);
  if (sinks.none()) {
    merge_states(stack, out, stream);
    return;
  }
  const StateView tmp =
      make_state_view(ws + w.tmp_o_off, DType::kF32, reinterpret_cast<float*>(ws + w.tmp_lse_off),
                      tokens, heads, catalog::kMlaLoraRank, LseBase::kBase2, MemorySpace::kDevice);
  merge_states(stack, tmp, stream);
  ATTNSTATE_CUDA_CHECK(
      cudaMemsetAsync(ws + w.zeros_off, 0, static_cast<std::size_t>(kMlaStateRowBytes), stream));
  merge_state(tmp,
              make_sink_state(sinks.logits, ws + w.zeros_off, DType::kF32, tokens, heads,
                              catalog::kMlaLoraRank, LseBase::kNatural, MemorySpace::kDevice),
              out, stream);
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
