// The context-parallel merge of one rank, as phases between the collectives, shared by the CUDA
// run over NCCL (src/dist) and the CPU simulation of every rank in one process (src/cpu): the
// packing, the slicing of heads and the merges are this code in both; only the byte movement
// between the phases differs. `Ops` provides the backend's state operations:
//   MemorySpace space;
//   void rebase(ConstStateView in, StateView out);
//   void merge_states(ConstStateStackView states, StateView out);
//   void merge_state_inplace(StateView acc, ConstStateView other);
//   void rescale(ConstStateView local, ConstStateStackView gathered, StateView out);
//     out.lse = ⊕ of the gathered LSEs; out.o = local.o · exp(local.lse − out.lse), and 0 where
//     local.lse = -inf (whatever its o holds) or out.lse = -inf; out.o and out.lse in fp32;
//   void zero(void* p, std::int64_t bytes);
// Order of one run: check_cp_call, cp_pack, exchange 1, cp_combine, exchange 2, cp_finish
// (docs/context_parallel.md gives each exchange's pairs and bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "attnstate/core/context_parallel.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"
#include "common/validate.hpp"

namespace attnstate {
namespace detail {

inline std::byte* at(void* ws, std::int64_t offset) { return static_cast<std::byte*>(ws) + offset; }

// The heads [h0, h0 + h) of `v`.
template <class View>
View head_slice(View v, std::int64_t h0, std::int64_t h) {
  using Byte = std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(v.o)>>,
                                  const std::byte, std::byte>;
  v.o = reinterpret_cast<Byte*>(v.o) +
        h0 * v.o_stride_head * static_cast<std::int64_t>(size_of(v.dtype));
  v.lse += h0 * v.lse_stride_head;
  v.heads = h;
  return v;
}

// A packed chunk of `h` heads at `p`: o [tokens, h, head_dim] of `dtype`, then the LSEs.
inline StateView chunk_view(const CpMergePlan& plan, void* p, std::int64_t h, DType dtype,
                            MemorySpace space) {
  const CpMergeShape& s = plan.shape;
  return make_state_view(p, dtype, reinterpret_cast<float*>(at(p, plan.chunk_lse_offset(h, dtype))),
                         s.tokens, h, s.head_dim, s.wire_base, space);
}

// o in fp32 [tokens, h, head_dim] at `o` and the LSEs of heads [h0, h0 + h) of a
// [tokens, heads] fp32 array at `lse` (in the wire base).
inline StateView split_view(const CpMergePlan& plan, void* o, float* lse, std::int64_t h0,
                            std::int64_t h, MemorySpace space) {
  const CpMergeShape& s = plan.shape;
  StateView v =
      make_state_view(o, DType::kF32, lse + h0, s.tokens, h, s.head_dim, s.wire_base, space);
  v.lse_stride_token = s.heads;
  return v;
}

inline float* ws_floats(void* ws, std::int64_t offset) {
  return reinterpret_cast<float*>(at(ws, offset));
}

/// Throws naming `plan` unless it is the plan `plan_cp_merge(plan.shape)` makes: a shape it
/// accepts (its error is quoted) and every layout field as planned (each offset and size is
/// used as given). Checked before anything is sized from the plan.
inline void check_cp_plan(const char* fn, const CpMergePlan& plan) {
  CpMergePlan fresh;
  try {
    fresh = plan_cp_merge(plan.shape);
  } catch (const Error& e) {
    throw_argument(fn, "plan", "a plan made by plan_cp_merge (a shape it accepts)",
                   std::string("a shape it rejects (") + e.what() + ")", e.status());
  }
  static constexpr std::int64_t CpMergePlan::*kLayout[] = {
      &CpMergePlan::send_offset,     &CpMergePlan::send_bytes,        &CpMergePlan::recv_offset,
      &CpMergePlan::recv_bytes,      &CpMergePlan::mine_offset,       &CpMergePlan::gather_offset,
      &CpMergePlan::gather_bytes,    &CpMergePlan::o32_offset,        &CpMergePlan::lse_offset,
      &CpMergePlan::gathered_offset, &CpMergePlan::lse_merged_offset, &CpMergePlan::scaled_offset,
      &CpMergePlan::scaled_bytes,    &CpMergePlan::sum_offset,        &CpMergePlan::zeros_offset,
      &CpMergePlan::workspace_bytes, &CpMergePlan::wire_bytes_sent};
  for (const auto field : kLayout)
    if (fresh.*field != plan.*field)
      throw_argument(fn, "plan", "a plan made by plan_cp_merge (its layout fields unchanged)",
                     "a plan whose workspace layout differs from plan_cp_merge(plan.shape)'s");
}

/// Validates one rank's call: the plan is one `plan_cp_merge` made, `local` and `out` fit it,
/// the workspace is large enough and aligned, and no buffer the call writes overlaps another
/// it reads. `local_name` / `out_name` name the views in errors.
inline void check_cp_call(const char* fn, const CpMergePlan& plan, const ConstStateView& local,
                          const char* local_name, const StateView& out, const char* out_name,
                          const void* workspace, std::size_t workspace_bytes, MemorySpace space) {
  check_cp_plan(fn, plan);
  const CpMergeShape& s = plan.shape;
  check_state(fn, local_name, local, space);
  const auto expect = [&](const char* name, const char* field, std::int64_t want, std::int64_t got,
                          const char* why) {
    if (want != got)
      throw_argument(fn, arg_name(name, field).c_str(), std::to_string(want) + " (" + why + ")",
                     std::to_string(got));
  };
  expect(local_name, "tokens", s.tokens, local.tokens, "plan.shape.tokens");
  expect(local_name, "heads", s.heads, local.heads, "plan.shape.heads: every head");
  expect(local_name, "head_dim", s.head_dim, local.head_dim, "plan.shape.head_dim");
  if (local.dtype != s.dtype)
    throw_argument(fn, arg_name(local_name, "dtype").c_str(),
                   std::string(to_string(s.dtype)) + " (plan.shape.dtype)", to_string(local.dtype));
  check_output_state(fn, out_name, out, out.o, out.lse, space);
  expect(out_name, "tokens", s.tokens, out.tokens, "plan.shape.tokens");
  expect(out_name, "heads", plan.out_heads(), out.heads,
         s.output == CpOutput::kHeadSharded ? "the heads this rank owns" : "every head");
  expect(out_name, "head_dim", s.head_dim, out.head_dim, "plan.shape.head_dim");
  if (out.dtype != s.out_dtype)
    throw_argument(fn, arg_name(out_name, "dtype").c_str(),
                   std::string(to_string(s.out_dtype)) + " (plan.shape.out_dtype)",
                   to_string(out.dtype));
  const std::int64_t need = plan.workspace_bytes;
  if (workspace_bytes < static_cast<std::size_t>(need))
    throw_argument(fn, "workspace_bytes", ">= plan.workspace_bytes = " + std::to_string(need),
                   std::to_string(workspace_bytes), Status::kWorkspaceTooSmall);
  if (workspace == nullptr) throw_argument(fn, "workspace", "non-null", "null");
  check_aligned(fn, "workspace", workspace, 256);
  check_disjoint(fn, out_name, out, local_name, local.o, o_bytes(local), local.lse,
                 lse_bytes(local));
  check_buffer_disjoint(fn, "workspace", workspace, need, local_name, local.o, o_bytes(local));
  check_buffer_disjoint(fn, "workspace", workspace, need, arg_name(local_name, "lse").c_str(),
                        local.lse, lse_bytes(local));
  check_buffer_disjoint(fn, "workspace", workspace, need, out_name, out.o, o_bytes(out));
  check_buffer_disjoint(fn, "workspace", workspace, need, arg_name(out_name, "lse").c_str(),
                        out.lse, lse_bytes(out));
}

/// Phase 1: packs the local state into the workspace (every peer's chunk, or the fp32 `o` and
/// the LSEs to gather), in the wire base; writes the sink state's zeros.
template <class Ops>
void cp_pack(const CpMergePlan& plan, const ConstStateView& local, void* ws, Ops& ops) {
  const CpMergeShape& s = plan.shape;
  ops.zero(at(ws, plan.zeros_offset), s.head_dim * 4);
  if (s.algorithm == CpAlgorithm::kAllToAll) {
    for (int p = 0; p < s.world_size; ++p) {
      const std::int64_t h = plan.heads_of(p);
      ops.rebase(head_slice(local, plan.head_begin(p), h),
                 chunk_view(plan, at(ws, plan.send_offset + plan.send_chunk_offset(p)), h, s.dtype,
                            ops.space));
    }
  } else {
    ops.rebase(local, split_view(plan, at(ws, plan.o32_offset), ws_floats(ws, plan.lse_offset), 0,
                                 s.heads, ops.space));
  }
}

/// Phase 2, after the first exchange: the merge of the received states (kAllToAll; into `out`
/// or, replicated, into this rank's slice) or the rescale by the merged LSE (kAllGatherLse).
template <class Ops>
void cp_combine(const CpMergePlan& plan, const StateView& out, void* ws, Ops& ops) {
  const CpMergeShape& s = plan.shape;
  const int n = s.world_size;
  if (s.algorithm == CpAlgorithm::kAllToAll) {
    const std::int64_t h = plan.heads_of(s.rank);
    const StateView first = chunk_view(plan, at(ws, plan.recv_offset), h, s.dtype, ops.space);
    ConstStateStackView stack;
    static_cast<StateLayout&>(stack) = first;
    stack.o = first.o;
    stack.lse = first.lse;
    stack.num_states = n;
    const std::int64_t chunk = plan.chunk_bytes(h, s.dtype);
    stack.o_stride_state = chunk / static_cast<std::int64_t>(size_of(s.dtype));
    stack.lse_stride_state = chunk / 4;
    ops.merge_states(stack,
                     s.output == CpOutput::kHeadSharded
                         ? out
                         : chunk_view(plan, at(ws, plan.mine_offset), h, s.out_dtype, ops.space));
    return;
  }
  float* gathered = ws_floats(ws, plan.gathered_offset);
  for (int p = 0; p < n; ++p) {
    const std::int64_t h0 = plan.head_begin(p), h = plan.heads_of(p);
    ConstStateStackView g;
    static_cast<StateLayout&>(g) =
        split_view(plan, at(ws, plan.zeros_offset), gathered, h0, h, ops.space);
    g.o = at(ws, plan.zeros_offset);  // never read: the LSEs only
    g.lse = gathered + h0;
    g.o_stride_token = g.o_stride_head = 0;
    g.num_states = n;
    g.o_stride_state = 0;
    g.lse_stride_state = s.tokens * s.heads;
    const StateView local =
        split_view(plan, at(ws, plan.o32_offset), ws_floats(ws, plan.lse_offset), h0, h, ops.space);
    ConstStateView local_slice = local;
    local_slice.o = at(ws, plan.o32_offset + s.head_dim * 4 * h0);
    local_slice.o_stride_token = s.heads * s.head_dim;
    const StateView scaled =
        split_view(plan, at(ws, plan.scaled_offset + plan.scaled_chunk_offset(p)),
                   ws_floats(ws, plan.lse_merged_offset), h0, h, ops.space);
    ops.rescale(local_slice, g, scaled);
  }
}

/// Phase 3, after the second exchange (if any): the output, then the sinks merged once.
template <class Ops>
void cp_finish(const CpMergePlan& plan, const StateView& out, const AttentionSinks& sinks, void* ws,
               Ops& ops) {
  const CpMergeShape& s = plan.shape;
  const int n = s.world_size;
  const bool sharded = s.output == CpOutput::kHeadSharded;
  if (s.algorithm == CpAlgorithm::kAllToAll) {
    if (!sharded) {
      for (int r = 0; r < n; ++r)
        ops.rebase(chunk_view(plan, at(ws, plan.gather_offset + plan.gather_chunk_offset(r)),
                              plan.heads_of(r), s.out_dtype, ops.space),
                   head_slice(out, plan.head_begin(r), plan.heads_of(r)));
    }
  } else if (sharded) {
    const std::int64_t h0 = plan.head_begin(s.rank);
    ops.rebase(split_view(plan, at(ws, plan.sum_offset), ws_floats(ws, plan.lse_merged_offset), h0,
                          plan.heads_of(s.rank), ops.space),
               out);
  } else {
    for (int r = 0; r < n; ++r) {
      const std::int64_t h0 = plan.head_begin(r), h = plan.heads_of(r);
      ops.rebase(split_view(plan, at(ws, plan.scaled_offset + plan.scaled_chunk_offset(r)),
                            ws_floats(ws, plan.lse_merged_offset), h0, h, ops.space),
                 head_slice(out, h0, h));
    }
  }
  if (!sinks.none()) {
    const std::int64_t h0 = sharded ? plan.head_begin(s.rank) : 0;
    ops.merge_state_inplace(
        out, make_sink_state(sinks.logits + h0, at(ws, plan.zeros_offset), DType::kF32, s.tokens,
                             out.heads, s.head_dim, LseBase::kNatural, ops.space));
  }
}

}  // namespace detail
}  // namespace attnstate
