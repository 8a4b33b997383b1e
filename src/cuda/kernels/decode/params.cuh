/// @file kernels/decode/params.cuh
/// @brief Parameters of the split-KV decode kernel (internal, shared by the launcher and the
///        kernel): tile shape, pipeline depths, CTA size, cluster limit and the argument block.
#pragma once

#include <cstdint>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "catalog/kernel_shapes.hpp"
#include "cuda/kernels/attention_params.cuh"

namespace attnstate {
namespace cuda {
namespace detail {

// The kernel's shape (`catalog/kernel_shapes.hpp`: one source, read by the kernels, the
// planner's facts and the tests).
using catalog::kDecodeMaxCluster;
using catalog::kDecodeMaxWsGroup;
using catalog::kDecodePairKeys;
using catalog::kDecodeShortStages;
using catalog::kDecodeShortTokens;
using catalog::kDecodeSmemPerSm;
using catalog::kDecodeSmemReservedPerCta;
using catalog::kDecodeStages;
using catalog::kDecodeTileRows;
using catalog::kDecodeWarps;
using catalog::kDecodeWsGroup;

/// Page ids of a warp's first tiles loaded speculatively with the length (block table, fixed
/// split size): at most the pipeline depth; 1 speculates the first tile only.
constexpr int kDecodeSpecTiles = 3;
static_assert(kDecodeSpecTiles >= 1, "at least the first tile");
/// Split columns the cluster merge loads per round trip (all the splits' LSEs come with the
/// first batch); a divisor of `kDecodeMaxCluster`.
constexpr int kDecodeClusterBatch = 8;
/// Splits whose `o` columns one thread of the workspace merge loads at once (straight into
/// registers; head dims above 64, and `kDecodeDirectBatch64` at 64, within its register budget).
constexpr int kDecodeDirectBatch = 16;
constexpr int kDecodeDirectBatch64 = 4;
/// Probe builds only (-DATTNSTATE_BUILD_PROBES=ON, never shipped): per-CTA globaltimer stamps in
/// a device array.
#ifndef ATTNSTATE_PROBES
#define ATTNSTATE_PROBES 0
#endif
/// CTAs whose stamps the probe timeline keeps (8 per CTA).
constexpr int kDecodeTimelineCtas = 16384;

/// Everything the decode kernel reads besides its template arguments: the attention fields
/// (`AttentionParams`: queries, paged K/V with the requests' CSR page table, shape, score map),
/// then the decode's own.
struct DecodeParams : AttentionParams {
  bool q_vec;  // query rows start on 16-byte boundaries: 16-byte query loads
  // paged KV: a block table (else the CSR page table) and the requests' lengths
  const std::int32_t* block_table;
  std::int64_t block_table_stride;
  const std::int32_t* seq_lens;
  // shape: query rows per KV head (q_len · group) and their tiles
  std::int32_t rows, row_tiles;
  SplitLayout splits;
  // output state
  void* out_o;
  float* out_lse;
  std::int64_t o_stride_token, o_stride_head, lse_stride_token, lse_stride_head;
  DType out_dtype;
  LseBase out_base;
  bool out_vec4;  // 4 consecutive o elements can be stored as one aligned vector
  // split merge: `cluster` == `splits.max_splits` > 1 merges the splits of a (request, KV head,
  // row tile) inside a cluster of that many CTAs (one per split); otherwise through the
  // workspace: partial states [(b, hkv, row tile, split, row)] and tickets [(b, hkv, row tile)],
  // one ticket per CTA (`cluster` 1) or per cluster of `cluster` consecutive splits (a divisor
  // of `max_splits`) whose last one merges in all its CTAs
  std::int32_t cluster;
  float* ws_o;
  float* ws_lse;
  std::int32_t* tickets;
  bool skip_combine;
  // prior states folded into the output (a cascade's shared levels): `prior_count` states per
  // output row `token · heads_q + hq`, state i at `prior_o + (i · prior_rows + row) · D` (fp32,
  // normalised) and `prior_lse[i · prior_rows + row]` (base 2); 0 = none
  const float* prior_o;
  const float* prior_lse;
  std::int32_t prior_count;
  std::int64_t prior_rows;
  // launched beside the previous kernel of the stream (programmatic dependent launch; nothing
  // it writes is read): every CTA lets the next kernel launch, and the grid's last CTA waits for
  // the previous kernel before it starts, so the grid completes only after that kernel
  std::int32_t beside_previous;
  // a programmatic dependent launch chained to the kernels around it (DecodePlan::
  // programmatic_launch): every CTA lets the next kernel launch and waits for the previous one
  // before its first read
  std::int32_t programmatic;
  // fp8 caches (the fp8 kernels only): the dequantisation scales of K and V (a host value, or
  // read on the device when the kernel runs)
  KvScale k_scale;
  KvScale v_scale;
  // attention sinks (AttentionSinks): `heads_q` natural-base logits merged into each output row
  // once, as the state (0, sinks[hq]), after the splits and prior states; null = none
  const float* sinks;
};

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
