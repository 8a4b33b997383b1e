/// @file mla_kit_kernel.hpp
/// @brief The CPU MLA decode as a testing-kit kernel (`check_mla_kernel`): a problem's selected
///        latent tokens in one page that every query row (a request of one new token) reads
///        through its block table, fp8 scales per tensor or the latent part's block scales;
///        with the bugs the kit's laws must catch, on request.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/cpu/mla.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/mla.hpp"
#include "split_layouts.hpp"

namespace attnstate_test {

/// Bugs of a kit kernel the laws must catch.
struct MlaKitBugs {
  bool drop_rope = false;      ///< The rotary queries zeroed.
  bool natural_only = false;   ///< Natural-base LSEs whatever base is asked for.
  bool ignore_blocks = false;  ///< The latent part's block scales dropped (per-tensor instead).
};

/// The CPU MLA decode (two splits) of `all`'s tokens `keys`, with `bugs`.
inline attnstate::testing::HostState cpu_mla_kit_kernel(const attnstate::testing::MlaProblem& all,
                                                        const std::vector<std::int64_t>& keys,
                                                        MlaKitBugs bugs = {}) {
  using namespace attnstate;
  const attnstate::testing::MlaProblem p = attnstate::testing::select_keys(all, keys);
  const std::int64_t T = p.tokens(), H = p.heads(), L = p.kv_lora_rank(), R = p.rope_dim();
  const std::int64_t N = p.num_keys();
  const std::vector<std::int32_t> table(static_cast<std::size_t>(T), 0);
  const std::vector<std::int32_t> lens(static_cast<std::size_t>(T), static_cast<std::int32_t>(N));
  MlaKvCache kv;
  kv.ckv = p.ckv.data();
  kv.kpe = p.kpe.data();
  kv.ckv_dtype = p.ckv.dtype();
  kv.kpe_dtype = p.kpe.dtype();
  if (!p.ckv_block_scales.empty() && !bugs.ignore_blocks) {
    kv.ckv_block_scale.data = p.ckv_block_scales.data();
    kv.ckv_block_scale.block_cols = p.ckv_block_cols;
  } else if (is_fp8(kv.ckv_dtype)) {
    kv.ckv_scale = KvScale::per_tensor(p.ckv_scale);
  }
  if (is_fp8(kv.kpe_dtype)) kv.kpe_scale = KvScale::per_tensor(p.kpe_scale);
  kv.kv_lora_rank = L;
  kv.rope_dim = R;
  kv.num_pages = N > 0 ? 1 : 0;
  kv.page_size = std::max<std::int64_t>(1, N);
  kv.block_table = table.data();
  kv.block_table_stride = 1;
  kv.seq_lens = lens.data();
  kv.batch = T;
  attnstate::testing::HostTensor zeros(p.q_pe.dtype(), {T, H, R});
  const ConstTensorView qn = make_tensor_view(p.q_nope.data(), p.q_nope.dtype(), {T, 1, H, L});
  const ConstTensorView qp =
      make_tensor_view(bugs.drop_rope ? zeros.data() : p.q_pe.data(), p.q_pe.dtype(), {T, 1, H, R});
  attnstate::testing::HostState out = attnstate::testing::make_output_state(p);
  if (bugs.natural_only) out.relabel_base(LseBase::kNatural);
  cpu::mla_decode(qn, qp, kv, fixed_count(2), p.scale, p.attention_sinks(), out.view());
  if (bugs.natural_only) out.relabel_base(p.base);
  return out;
}

}  // namespace attnstate_test
