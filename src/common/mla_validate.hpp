/// @file mla_validate.hpp
/// @brief Argument checks of the MLA decode entry points (internal, host only): the latent cache
///        (dtypes, widths, strides, scales, pool sizes, tables), the two query views and the
///        output state, each against the others. Contents of host tables are checked by the CPU
///        backend (cpu/page_table.hpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "attnstate/core/error.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/core/state_view.hpp"
#include "common/decode_validate.hpp"
#include "common/validate.hpp"

namespace attnstate {
namespace detail {

/// Checks one part of the latent cache named `kv.<part>` (`"ckv"` or `"kpe"`): its dtype (any,
/// fp8 with a valid per-tensor scale `kv.<part>_scale`; the default scale otherwise), a token
/// stride of 0 (dense) or at least `width`, a page stride of 0 (dense) or at least `page_size`
/// token strides, a pool span of `num_pages` pages within 2^62 bytes, and a non-null (when the
/// pool has pages) pointer aligned to its element. Returns the bytes the part spans (0 without
/// pages).
inline std::int64_t check_mla_part(const char* fn, const char* part, const void* p, DType dtype,
                                   const KvScale& scale, std::int64_t width,
                                   std::int64_t token_stride, std::int64_t page_stride,
                                   const MlaKvCache& kv, MemorySpace space) {
  const std::string name = std::string("kv.") + part;
  const auto field = [&](const char* f) { return name + "_" + f; };
  if (!is_valid(dtype))
    throw_argument(fn, field("dtype").c_str(), "f32, f16, bf16, e4m3 or e5m2",
                   "value " + std::to_string(static_cast<int>(dtype)));
  // one latent head: a per-head scale is the per-tensor one (heads_kv = 1)
  check_kv_scale(fn, field("scale").c_str(), scale, dtype, 1, space);
  check_min(fn, field("token_stride").c_str(), token_stride, 0);
  if (token_stride != 0 && token_stride < width)
    throw_argument(fn, field("token_stride").c_str(),
                   "0 or >= the part's width " + std::to_string(width) + " (rows must not overlap)",
                   std::to_string(token_stride));
  const std::int64_t row = token_stride != 0 ? token_stride : width;
  std::int64_t dense = 0;
  if (!checked_mul(kv.page_size, row, &dense) || if_bytes_fit(dense, size_of(dtype)) < 0)
    throw_argument(fn, kv.page_size > row ? "kv.page_size" : field("token_stride").c_str(),
                   "page_size * token stride within 2^62 bytes",
                   std::to_string(kv.page_size) + " * " + std::to_string(row));
  check_min(fn, field("page_stride").c_str(), page_stride, 0);
  if (page_stride != 0 && page_stride < dense)
    throw_argument(fn, field("page_stride").c_str(),
                   "0 or >= page_size * token stride = " + std::to_string(dense),
                   std::to_string(page_stride));
  const std::int64_t page = page_stride != 0 ? page_stride : dense;
  std::int64_t span = 0;
  if (kv.num_pages > 0) {
    // the last page's last slot ends at (num_pages - 1) · page + (page_size - 1) · row + width
    const std::int64_t elems = checked_span(kv.num_pages, page, dense - row + width);
    if (elems < 0 || if_bytes_fit(elems, size_of(dtype)) < 0) {
      const bool pages = kv.num_pages > page;
      throw_argument(
          fn, pages ? "kv.num_pages" : field("page_stride").c_str(),
          "a pool of num_pages pages within 2^62 bytes",
          std::to_string(kv.num_pages) + " pages of " + std::to_string(page) + " elements");
    }
    span = elems * static_cast<std::int64_t>(size_of(dtype));
    check_not_null(fn, name.c_str(), p);
  }
  check_aligned(fn, name.c_str(), p, size_of(dtype));
  return span;
}

/// Checks the block scales of the latent part, `kv.ckv_block_scale`: absent (null data, the other
/// fields at their defaults), or given for an fp8 `ckv` whose per-tensor `ckv_scale` is the
/// default, with `block_cols ≥ 1` dividing `kv_lora_rank`, a token stride of 0 (dense) or at
/// least the blocks of a token, a page stride of 0 (dense) or at least `page_size` token strides,
/// a span of `num_pages` pages within 2^62 bytes and data aligned to a float. Returns the bytes
/// the scales span (0 when absent or without pages). The scale values are read as stored.
inline std::int64_t check_mla_block_scale(const char* fn, const MlaKvCache& kv) {
  const MlaBlockScale& bs = kv.ckv_block_scale;
  if (!bs.present()) {
    const MlaBlockScale none;
    if (bs.block_cols != none.block_cols || bs.token_stride != 0 || bs.page_stride != 0)
      throw_argument(fn,
                     bs.block_cols != none.block_cols ? "kv.ckv_block_scale.block_cols"
                     : bs.token_stride != 0           ? "kv.ckv_block_scale.token_stride"
                                                      : "kv.ckv_block_scale.page_stride",
                     "its default without kv.ckv_block_scale.data (no block scales)",
                     bs.block_cols != none.block_cols ? decode_str(bs.block_cols)
                     : bs.token_stride != 0           ? decode_str(bs.token_stride)
                                                      : decode_str(bs.page_stride));
    return 0;
  }
  if (!is_fp8(kv.ckv_dtype))
    throw_argument(fn, "kv.ckv_block_scale.data",
                   std::string("null: block scales apply to an fp8 latent part, this one is ") +
                       to_string(kv.ckv_dtype),
                   "a scale pointer");
  if (!kv.ckv_scale.is_default())
    throw_argument(fn, "kv.ckv_scale",
                   "the default (value 1, no data) with kv.ckv_block_scale: the block scales are "
                   "the whole scale of the latent part",
                   kv.ckv_scale.data != nullptr ? "a scale pointer"
                                                : "value " + scale_str(kv.ckv_scale.value));
  if (bs.block_cols < 1 || kv.kv_lora_rank % bs.block_cols != 0)
    throw_argument(fn, "kv.ckv_block_scale.block_cols",
                   ">= 1 dividing kv.kv_lora_rank = " + decode_str(kv.kv_lora_rank),
                   decode_str(bs.block_cols));
  const std::int64_t blocks = kv.kv_lora_rank / bs.block_cols;
  check_min(fn, "kv.ckv_block_scale.token_stride", bs.token_stride, 0);
  if (bs.token_stride != 0 && bs.token_stride < blocks)
    throw_argument(fn, "kv.ckv_block_scale.token_stride",
                   "0 or >= the scales of a token, kv_lora_rank / block_cols = " +
                       decode_str(blocks) + " (rows must not overlap)",
                   decode_str(bs.token_stride));
  const std::int64_t row = bs.token_stride != 0 ? bs.token_stride : blocks;
  std::int64_t dense = 0;
  if (!checked_mul(kv.page_size, row, &dense) || if_bytes_fit(dense, sizeof(float)) < 0)
    throw_argument(fn, "kv.ckv_block_scale.token_stride",
                   "page_size * token stride within 2^62 bytes",
                   decode_str(kv.page_size) + " * " + decode_str(row));
  check_min(fn, "kv.ckv_block_scale.page_stride", bs.page_stride, 0);
  if (bs.page_stride != 0 && bs.page_stride < dense)
    throw_argument(fn, "kv.ckv_block_scale.page_stride",
                   "0 or >= page_size * token stride = " + decode_str(dense),
                   decode_str(bs.page_stride));
  const std::int64_t page = bs.page_stride != 0 ? bs.page_stride : dense;
  check_aligned(fn, "kv.ckv_block_scale.data", bs.data, sizeof(float));
  if (kv.num_pages == 0) return 0;
  const std::int64_t elems = checked_span(kv.num_pages, page, dense - row + blocks);
  if (elems < 0 || if_bytes_fit(elems, sizeof(float)) < 0)
    throw_argument(fn, kv.num_pages > page ? "kv.num_pages" : "kv.ckv_block_scale.page_stride",
                   "the block scales of num_pages pages within 2^62 bytes",
                   decode_str(kv.num_pages) + " pages of " + decode_str(page) + " floats");
  return elems * static_cast<std::int64_t>(sizeof(float));
}

/// Checks one query view named `name` (`"q_nope"` or `"q_pe"`) of an MLA decode: `space`, rank 4
/// `(batch, q_len, heads, width)`, f32/f16/bf16, `batch == kv.batch`, `q_len` 1..8, `heads ≥ 1`,
/// the last dim `width` and contiguous, other strides ≥ 0, a span within 2^62 bytes, non-null
/// and aligned data. Returns its bytes.
inline std::int64_t check_mla_query(const char* fn, const char* name, const ConstTensorView& q,
                                    const MlaKvCache& kv, const char* width_name,
                                    std::int64_t width, MemorySpace space) {
  const auto f = [name](const std::string& x) { return std::string(name) + "." + x; };
  if (q.space != space)
    throw_argument(fn, f("space").c_str(), to_string(space), to_string(q.space));
  if (q.rank != 4)
    throw_argument(fn, f("rank").c_str(),
                   std::string("4 (batch, q_len, heads, ") + width_name + ")", decode_str(q.rank));
  if (!is_valid(q.dtype))
    throw_argument(fn, f("dtype").c_str(), "f32, f16 or bf16",
                   "value " + std::to_string(static_cast<int>(q.dtype)));
  if (is_fp8(q.dtype))
    throw_argument(fn, f("dtype").c_str(), "f32, f16 or bf16 (fp8 is taken for the cache only)",
                   to_string(q.dtype), Status::kNotSupported);
  if (q.shape[0] != kv.batch)
    throw_argument(fn, f("shape[0]").c_str(), "kv.batch = " + decode_str(kv.batch),
                   decode_str(q.shape[0]));
  if (q.shape[1] < 1 || q.shape[1] > 8)
    throw_argument(fn, f("shape[1]").c_str(), "q_len in 1..8", decode_str(q.shape[1]));
  if (q.shape[2] < 1)
    throw_argument(fn, f("shape[2]").c_str(), "heads >= 1", decode_str(q.shape[2]));
  if (q.shape[3] != width)
    throw_argument(fn, f("shape[3]").c_str(), std::string(width_name) + " = " + decode_str(width),
                   decode_str(q.shape[3]));
  if (q.stride[3] != 1) throw_argument(fn, f("stride[3]").c_str(), "1", decode_str(q.stride[3]));
  for (int d = 0; d < 3; ++d)
    if (q.stride[d] < 0)
      throw_argument(fn, f("stride[" + decode_str(d) + "]").c_str(), ">= 0",
                     decode_str(q.stride[d]));
  const std::int64_t bytes = check_tensor_span(fn, name, q);
  if (q.shape[0] * q.shape[1] > 0 && q.data == nullptr)
    throw_argument(fn, f("data").c_str(), "non-null", "null");
  check_aligned(fn, f("data").c_str(), q.data, size_of(q.dtype));
  return bytes;
}

/// Checks every argument of an MLA decode but the split layout, the scale and the sinks: the
/// cache (`kv_lora_rank`, `rope_dim ≥ 1`, `num_pages ≥ 0`, `page_size ≥ 1`, both parts,
/// the block scales, the tables), the queries (`q_pe` of `q_nope`'s dtype, batch, q_len and heads)
/// and `out`, an output state `(batch·q_len, heads, kv_lora_rank)` in `space` disjoint from the
/// queries, both parts of the cache, their scales and the tables. With `tables` false (the cascade,
/// whose levels hold the page tables) the cache's table fields are neither checked nor read.
inline void validate_mla_args(const char* fn, const ConstTensorView& q_nope,
                              const ConstTensorView& q_pe, const MlaKvCache& kv,
                              const StateView& out, MemorySpace space, bool tables = true) {
  check_space(fn, "kv.space", kv.space, space);
  check_min(fn, "kv.kv_lora_rank", kv.kv_lora_rank, 1);
  check_min(fn, "kv.rope_dim", kv.rope_dim, 1);
  check_min(fn, "kv.num_pages", kv.num_pages, 0);
  check_min(fn, "kv.page_size", kv.page_size, 1);
  if (kv.kv_lora_rank > (std::int64_t{1} << 30) || kv.rope_dim > (std::int64_t{1} << 30))
    throw_argument(fn, kv.kv_lora_rank > kv.rope_dim ? "kv.kv_lora_rank" : "kv.rope_dim",
                   "at most 2^30", decode_str(std::max(kv.kv_lora_rank, kv.rope_dim)));
  const std::int64_t ckv_bytes =
      check_mla_part(fn, "ckv", kv.ckv, kv.ckv_dtype, kv.ckv_scale, kv.kv_lora_rank,
                     kv.ckv_token_stride, kv.ckv_page_stride, kv, space);
  const std::int64_t kpe_bytes =
      check_mla_part(fn, "kpe", kv.kpe, kv.kpe_dtype, kv.kpe_scale, kv.rope_dim,
                     kv.kpe_token_stride, kv.kpe_page_stride, kv, space);
  const std::int64_t block_scale_bytes = check_mla_block_scale(fn, kv);
  if (tables) validate_page_tables(fn, kv);
  const std::int64_t qn_bytes =
      check_mla_query(fn, "q_nope", q_nope, kv, "kv.kv_lora_rank", kv.kv_lora_rank, space);
  const std::int64_t qp_bytes =
      check_mla_query(fn, "q_pe", q_pe, kv, "kv.rope_dim", kv.rope_dim, space);
  if (q_pe.dtype != q_nope.dtype)
    throw_argument(fn, "q_pe.dtype", std::string("q_nope.dtype = ") + to_string(q_nope.dtype),
                   to_string(q_pe.dtype));
  for (int d = 1; d < 3; ++d)
    if (q_pe.shape[d] != q_nope.shape[d])
      throw_argument(fn, ("q_pe.shape[" + decode_str(d) + "]").c_str(),
                     "q_nope.shape[" + decode_str(d) + "] = " + decode_str(q_nope.shape[d]),
                     decode_str(q_pe.shape[d]));
  const std::int64_t tokens = q_nope.shape[0] * q_nope.shape[1];  // small: q's span fits
  if (out.tokens != tokens)
    throw_argument(fn, "out.tokens", "batch*q_len = " + decode_str(tokens), decode_str(out.tokens));
  if (out.heads != q_nope.shape[2])
    throw_argument(fn, "out.heads", "heads = " + decode_str(q_nope.shape[2]),
                   decode_str(out.heads));
  if (out.head_dim != kv.kv_lora_rank)
    throw_argument(fn, "out.head_dim", "kv.kv_lora_rank = " + decode_str(kv.kv_lora_rank),
                   decode_str(out.head_dim));
  check_output_state(fn, "out", out, out.o, out.lse, space);
  check_disjoint(fn, "out", out, "q_nope", q_nope.data, qn_bytes, nullptr, 0);
  check_disjoint(fn, "out", out, "q_pe", q_pe.data, qp_bytes, nullptr, 0);
  check_disjoint(fn, "out", out, "kv.ckv", kv.ckv, ckv_bytes, nullptr, 0);
  check_disjoint(fn, "out", out, "kv.kpe", kv.kpe, kpe_bytes, nullptr, 0);
  check_disjoint(fn, "out", out, "kv.ckv_scale.data", kv.ckv_scale.data,
                 kv_scale_bytes(kv.ckv_scale, 1), nullptr, 0);
  check_disjoint(fn, "out", out, "kv.kpe_scale.data", kv.kpe_scale.data,
                 kv_scale_bytes(kv.kpe_scale, 1), nullptr, 0);
  check_disjoint(fn, "out", out, "kv.ckv_block_scale.data", kv.ckv_block_scale.data,
                 block_scale_bytes, nullptr, 0);
  if (tables) check_disjoint_from_tables(fn, "out", out, kv, space);
}

}  // namespace detail
}  // namespace attnstate
