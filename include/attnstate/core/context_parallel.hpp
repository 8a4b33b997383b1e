/// @file context_parallel.hpp
/// @brief Context-parallel merge plans: each of `world_size` ranks holds the attention state of
///        its shard of the keys for the same `(tokens, heads)` rows, and the ranks' states are
///        merged with ⊕ across the ranks (`⊕_rank state(q, KV shard of rank)`).
///
/// The plan is backend-neutral host C++: it fixes the algorithm, which heads each rank owns, the
/// bytes each rank sends and receives, and the layout of the workspace the run uses. The CUDA
/// run over NCCL is `attnstate::dist::cp_merge` (attnstate/dist/cp_merge.hpp, the `dist`
/// component, built when NCCL is found); `attnstate::cpu::cp_merge_simulated`
/// (attnstate/cpu/context_parallel.hpp) runs every rank of one plan in one process, moving the
/// bytes as the collectives would. See docs/context_parallel.md.
#pragma once

#include <cstdint>
#include <string>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/lse_base.hpp"

namespace attnstate {

/// How the ranks' states are merged.
enum class CpAlgorithm : std::uint8_t {
  /// Each rank sends every peer the slice of heads that peer owns (`o` and LSE packed in one
  /// buffer per peer), then merges the `world_size` states it received with `merge_states`, in
  /// rank order: bitwise the `merge_states` of the ranks' states on one device, whatever the
  /// order of arrival. Wire bytes per rank: its whole state once (`tokens · heads · (head_dim ·
  /// size_of(dtype) + 4)`, less its own slice); with `CpOutput::kReplicated` a second exchange
  /// sends each rank's merged slice to every peer.
  kAllToAll = 0,
  /// vLLM's scheme: all-gather the LSEs (`tokens · heads · 4` bytes per rank), rescale the
  /// local `o` (in fp32) by `exp(lse_local − lse_merged)`, then reduce-scatter (sum) the fp32
  /// rescaled outputs over the heads (or all-reduce them, for a replicated output): exact to
  /// rounding, and 4 bytes per element of `o` on the wire whatever `dtype`.
  kAllGatherLse = 1,
};

/// What each rank holds after the merge.
enum class CpOutput : std::uint8_t {
  /// Rank `r` holds the merged state of its own heads `[head_begin(r), head_end(r))` (what a
  /// tensor-parallel output projection consumes).
  kHeadSharded = 0,
  /// Every rank holds the merged state of all heads.
  kReplicated = 1,
};

/// Name of an algorithm ("all_to_all", "all_gather_lse"; "invalid" otherwise).
inline const char* to_string(CpAlgorithm a) {
  switch (a) {
    case CpAlgorithm::kAllToAll:
      return "all_to_all";
    case CpAlgorithm::kAllGatherLse:
      return "all_gather_lse";
  }
  return "invalid";
}

/// Name of an output kind ("head_sharded", "replicated"; "invalid" otherwise).
inline const char* to_string(CpOutput o) {
  switch (o) {
    case CpOutput::kHeadSharded:
      return "head_sharded";
    case CpOutput::kReplicated:
      return "replicated";
  }
  return "invalid";
}

/// What one rank's merge looks like. Every field but `rank` must be the same on every rank
/// (`dist::check_cp_plans` compares them across the ranks once, before the first run).
struct CpMergeShape {
  int world_size = 1;         ///< Ranks taking part (1..kMaxCpWorldSize).
  int rank = 0;               ///< This rank, `0..world_size-1`.
  std::int64_t tokens = 0;    ///< Rows of the local states (e.g. batch × q_len); may be 0.
  std::int64_t heads = 0;     ///< Heads per row, of the local states (all heads).
  std::int64_t head_dim = 0;  ///< Elements of `o` per (token, head).
  /// dtype of every rank's local `o` (f32, f16, bf16): what `kAllToAll` sends.
  DType dtype = DType::kBF16;
  DType out_dtype = DType::kBF16;  ///< dtype of the output's `o` (f32, f16, bf16).
  /// Base of the LSEs on the wire: each rank's local LSE is converted to it as it is packed (no
  /// conversion where the local state is in this base already).
  LseBase wire_base = LseBase::kNatural;
  CpAlgorithm algorithm = CpAlgorithm::kAllToAll;  ///< How the states are merged.
  CpOutput output = CpOutput::kHeadSharded;        ///< What each rank holds afterwards.
};

/// The most ranks a plan takes.
inline constexpr int kMaxCpWorldSize = 1024;

/// One rank's context-parallel merge: its shape, the heads each rank owns, and the byte layout
/// of its workspace. Made by `plan_cp_merge`; the run only validates and launches. All offsets
/// and sizes are in bytes, every region 256-byte aligned.
struct CpMergePlan {
  CpMergeShape shape;  ///< The shape the plan was made for.

  /// First head rank `r` owns: `floor(r · heads / world_size)` (so the ranks' slices differ by
  /// at most one head when `heads` is not a multiple of `world_size`). `r` in `0..world_size`.
  std::int64_t head_begin(int r) const {
    return static_cast<std::int64_t>(r) * shape.heads / shape.world_size;
  }
  /// One past the last head rank `r` owns.
  std::int64_t head_end(int r) const { return head_begin(r + 1); }
  /// Heads rank `r` owns.
  std::int64_t heads_of(int r) const { return head_end(r) - head_begin(r); }
  /// Heads of this rank's output: its own (head-sharded) or all of them (replicated).
  std::int64_t out_heads() const {
    return shape.output == CpOutput::kHeadSharded ? heads_of(shape.rank) : shape.heads;
  }

  /// Bytes of a packed chunk of `h` heads of every token with `o` of `dtype`: the `o` part
  /// (`tokens · h · head_dim` elements, padded to 16 bytes) then the fp32 LSE part
  /// (`tokens · h`, padded to 16 bytes). -1 for `h < 0` or past 2^62 bytes.
  std::int64_t chunk_bytes(std::int64_t h, DType dtype) const;
  /// Offset of the LSE part in a chunk of `h` heads (the `o` part's padded size); -1 for `h < 0`
  /// or past 2^62 bytes.
  std::int64_t chunk_lse_offset(std::int64_t h, DType dtype) const;

  // kAllToAll: the chunk for peer p at send_offset + send_chunk_offset(p); the chunk from
  // source s at recv_offset + s · chunk_bytes(heads_of(rank), dtype). With kReplicated, this
  // rank's merged slice is a chunk in out_dtype at mine_offset, and the merged slice of rank s
  // arrives at gather_offset + gather_chunk_offset(s).
  // kAllGatherLse: o32 (fp32 [tokens, heads, head_dim]) at o32_offset, the local LSE (fp32
  // [tokens, heads], wire base) at lse_offset, the gathered LSEs ([world_size, tokens, heads])
  // at gathered_offset, the merged LSE ([tokens, heads]) at lse_merged_offset, the rescaled
  // fp32 outputs in rank-major chunks (rank r's heads [tokens, heads_of(r), head_dim] at
  // scaled_offset + scaled_chunk_offset(r)) and the reduce-scattered sum of this rank's chunk
  // at sum_offset (kHeadSharded; all-reduce works in place in kReplicated).
  // Both: head_dim fp32 zeros at zeros_offset (the `o` of the sink state).

  /// Offset of the chunk sent to peer `p` within the send region (kAllToAll).
  std::int64_t send_chunk_offset(int p) const;
  /// Offset of the merged slice of rank `s` within the gather region (kAllToAll, kReplicated).
  std::int64_t gather_chunk_offset(int s) const;
  /// Offset of rank `r`'s rescaled chunk within the scaled region (kAllGatherLse).
  std::int64_t scaled_chunk_offset(int r) const;

  std::int64_t send_offset = 0;        ///< kAllToAll: chunks for every peer, in peer order.
  std::int64_t send_bytes = 0;         ///< kAllToAll: bytes of the send region.
  std::int64_t recv_offset = 0;        ///< kAllToAll: chunks from every source, in rank order.
  std::int64_t recv_bytes = 0;         ///< kAllToAll: bytes of the receive region.
  std::int64_t mine_offset = 0;        ///< kAllToAll + kReplicated: this rank's merged slice.
  std::int64_t gather_offset = 0;      ///< kAllToAll + kReplicated: every rank's merged slice.
  std::int64_t gather_bytes = 0;       ///< kAllToAll + kReplicated: bytes of that region.
  std::int64_t o32_offset = 0;         ///< kAllGatherLse: the local `o` in fp32.
  std::int64_t lse_offset = 0;         ///< kAllGatherLse: the local LSE, sent.
  std::int64_t gathered_offset = 0;    ///< kAllGatherLse: every rank's LSE.
  std::int64_t lse_merged_offset = 0;  ///< kAllGatherLse: the merged LSE.
  std::int64_t scaled_offset = 0;      ///< kAllGatherLse: the rescaled fp32 `o`, rank-major.
  std::int64_t scaled_bytes = 0;       ///< kAllGatherLse: bytes of that region.
  std::int64_t sum_offset = 0;         ///< kAllGatherLse + kHeadSharded: the summed chunk.
  std::int64_t zeros_offset = 0;       ///< `head_dim` fp32 zeros (the sink state's `o`).
  std::int64_t workspace_bytes = 0;    ///< Bytes of workspace the run needs.
  std::int64_t wire_bytes_sent = 0;    ///< Bytes this rank puts on the wire per run (to peers).
};

/// Plans one rank's context-parallel merge.
/// @param shape  the merge (see `CpMergeShape`).
/// @return the plan: head slices, workspace layout and size.
/// @throws Error(kInvalidArgument) naming the field of `shape` (`shape.world_size` outside
///         1..kMaxCpWorldSize, `shape.rank` outside 0..world_size-1, `shape.tokens < 0`,
///         `shape.heads < world_size` (every rank owns at least one head) or past 2^52,
///         `shape.head_dim < 1`,
///         a dtype outside f32/f16/bf16, an invalid base, algorithm or output, `shape.heads` not
///         a multiple of `world_size` for kAllGatherLse with kHeadSharded (the reduce-scatter
///         gives every rank the same count), or sizes past 2^62 bytes).
CpMergePlan plan_cp_merge(const CpMergeShape& shape);

/// Throws naming the first field where `b` (the plan of rank `b_rank`) differs from `a` (ignoring
/// `rank`): the check that the ranks agree, made before any collective.
/// @throws Error(kInvalidArgument) naming `plans[b_rank].shape.<field>` and both values.
void check_cp_plans_agree(const CpMergeShape& a, const CpMergeShape& b, int b_rank);

/// One line for logs, e.g. `"cp_merge all_to_all head_sharded: rank 1 of 4, 16 tokens x 32 heads
/// x 128 (bf16 -> bf16), heads 8..16, 98304 bytes sent, workspace 401408 bytes"`.
std::string to_string(const CpMergePlan& plan);

}  // namespace attnstate
