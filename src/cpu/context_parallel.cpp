#include "attnstate/cpu/context_parallel.hpp"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/cpu/merge.hpp"
#include "common/cp_merge_impl.hpp"
#include "common/validate.hpp"
#include "cpu/sinks.hpp"

namespace attnstate {
namespace cpu {
namespace {

constexpr const char* kFn = "attnstate::cpu::cp_merge_simulated";

// The CPU backend's operations for the shared phases (src/common/cp_merge_impl.hpp).
struct HostOps {
  MemorySpace space = MemorySpace::kHost;
  void rebase(ConstStateView in, StateView out) { cpu::rebase(in, out); }
  void merge_states(ConstStateStackView states, StateView out) { cpu::merge_states(states, out); }
  void merge_state_inplace(StateView acc, ConstStateView other) {
    cpu::merge_state_inplace(acc, other);
  }
  void zero(void* p, std::int64_t bytes) { std::memset(p, 0, static_cast<std::size_t>(bytes)); }
  // fp32 views only (the plan's o32 and rescaled regions), one base.
  void rescale(ConstStateView local, ConstStateStackView gathered, StateView out) {
    const auto* lo = static_cast<const float*>(local.o);
    auto* oo = static_cast<float*>(out.o);
    for (std::int64_t t = 0; t < out.tokens; ++t) {
      for (std::int64_t h = 0; h < out.heads; ++h) {
        const float self = local.lse[local.lse_offset(t, h)];
        const math::RescaleResult r =
            math::rescale_weight(gathered.base, gathered.lse + gathered.lse_offset(t, h),
                                 gathered.num_states, gathered.lse_stride_state, self);
        out.lse[out.lse_offset(t, h)] = r.lse;
        const float* src = lo + local.o_offset(t, h);
        float* dst = oo + out.o_offset(t, h);
        for (std::int64_t d = 0; d < out.head_dim; ++d)
          dst[d] = math::is_empty_lse(self) ? 0.f : r.weight * src[d];
      }
    }
  }
};

// 256-byte-aligned host workspace of one rank, filled with a NaN pattern so that a phase reading
// bytes no earlier phase or exchange wrote shows in the result.
struct Workspace {
  std::unique_ptr<std::byte[]> raw;
  std::byte* p = nullptr;
  explicit Workspace(std::int64_t bytes)
      : raw(new std::byte[static_cast<std::size_t>(bytes) + 256]) {
    std::memset(raw.get(), 0xff, static_cast<std::size_t>(bytes) + 256);
    const auto u = reinterpret_cast<std::uintptr_t>(raw.get());
    p = raw.get() + ((256 - u % 256) % 256);
  }
};

// Throws naming `out_name` unless `out` is disjoint from the state `in` named `in_name`.
void check_disjoint_state(const char* out_name, const ConstStateView& out, const char* in_name,
                          const ConstStateView& in) {
  attnstate::detail::check_disjoint(kFn, out_name, out, in_name, in.o,
                                    attnstate::detail::o_bytes(in), in.lse,
                                    attnstate::detail::lse_bytes(in));
}

void move_bytes(std::byte* dst, const std::byte* src, std::int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<std::size_t>(bytes));
}

}  // namespace

void cp_merge_simulated(const std::vector<CpMergePlan>& plans,
                        const std::vector<ConstStateView>& locals,
                        const std::vector<StateView>& outs, AttentionSinks sinks) {
  if (plans.empty()) attnstate::detail::throw_argument(kFn, "plans", "one plan per rank", "none");
  const CpMergeShape& s0 = plans[0].shape;
  const int n = s0.world_size;
  if (static_cast<std::int64_t>(plans.size()) != n)
    attnstate::detail::throw_argument(kFn, "plans",
                                      std::to_string(n) + " plans (plans[0].shape.world_size)",
                                      std::to_string(plans.size()));
  if (locals.size() != plans.size())
    attnstate::detail::throw_argument(kFn, "locals", std::to_string(n) + " states (one per rank)",
                                      std::to_string(locals.size()));
  if (outs.size() != plans.size())
    attnstate::detail::throw_argument(kFn, "outs", std::to_string(n) + " states (one per rank)",
                                      std::to_string(outs.size()));
  std::vector<Workspace> ws;
  ws.reserve(plans.size());
  const auto idx = [](int r) { return static_cast<std::size_t>(r); };
  const auto local = [&](int r) -> const ConstStateView& { return locals[idx(r)]; };
  const auto out = [&](int r) -> const StateView& { return outs[idx(r)]; };
  const auto wsp = [&](int r) { return ws[idx(r)].p; };
  for (int r = 0; r < n; ++r) {
    const CpMergePlan& plan = plans.at(static_cast<std::size_t>(r));
    check_cp_plans_agree(s0, plan.shape, r);
    if (plan.shape.rank != r)
      attnstate::detail::throw_argument(kFn,
                                        ("plans[" + std::to_string(r) + "].shape.rank").c_str(),
                                        std::to_string(r), std::to_string(plan.shape.rank));
    const std::string ln = "locals[" + std::to_string(r) + "]";
    const std::string on = "outs[" + std::to_string(r) + "]";
    attnstate::detail::check_cp_plan(kFn, plan);  // before its workspace_bytes are allocated
    ws.emplace_back(plan.workspace_bytes);
    attnstate::detail::check_cp_call(kFn, plan, local(r), ln.c_str(), out(r), on.c_str(),
                                     ws.back().p, static_cast<std::size_t>(plan.workspace_bytes),
                                     MemorySpace::kHost);
    if (!sinks.none())  // named as this rank's output (check_sinks names its output 'out')
      attnstate::detail::check_disjoint(kFn, on.c_str(), out(r), "sinks.logits", sinks.logits,
                                        s0.heads * 4, nullptr, 0);
    detail::check_sinks(kFn, sinks, s0.heads, out(r));
    for (int q = 0; q < r; ++q) {  // no rank's output over another rank's input or output
      const std::string lq = "locals[" + std::to_string(q) + "]";
      const std::string oq = "outs[" + std::to_string(q) + "]";
      check_disjoint_state(on.c_str(), out(r), lq.c_str(), local(q));
      check_disjoint_state(oq.c_str(), out(q), ln.c_str(), local(r));
      check_disjoint_state(on.c_str(), out(r), oq.c_str(), out(q));
    }
  }
  HostOps ops;
  const auto rank = [&](int r) -> const CpMergePlan& {
    return plans.at(static_cast<std::size_t>(r));
  };
  for (int r = 0; r < n; ++r) attnstate::detail::cp_pack(rank(r), local(r), wsp(r), ops);
  // Exchange 1.
  if (s0.algorithm == CpAlgorithm::kAllToAll) {
    // ncclSend(send chunk p of rank r -> p) / ncclRecv(slot r of rank p <- r)
    for (int r = 0; r < n; ++r)
      for (int p = 0; p < n; ++p) {
        const std::int64_t chunk = rank(p).chunk_bytes(rank(p).heads_of(p), s0.dtype);
        move_bytes(wsp(p) + rank(p).recv_offset + r * chunk,
                   wsp(r) + rank(r).send_offset + rank(r).send_chunk_offset(p), chunk);
      }
  } else {
    // ncclAllGather(lse of every rank -> gathered[r])
    const std::int64_t rows = s0.tokens * s0.heads * 4;
    for (int r = 0; r < n; ++r)
      for (int p = 0; p < n; ++p)
        move_bytes(wsp(p) + rank(p).gathered_offset + r * rows, wsp(r) + rank(r).lse_offset, rows);
  }
  for (int r = 0; r < n; ++r) attnstate::detail::cp_combine(rank(r), out(r), wsp(r), ops);
  // Exchange 2.
  if (s0.algorithm == CpAlgorithm::kAllToAll && s0.output == CpOutput::kReplicated) {
    // every rank's merged slice to every rank
    for (int r = 0; r < n; ++r)
      for (int p = 0; p < n; ++p)
        move_bytes(wsp(p) + rank(p).gather_offset + rank(p).gather_chunk_offset(r),
                   wsp(r) + rank(r).mine_offset,
                   rank(r).chunk_bytes(rank(r).heads_of(r), s0.out_dtype));
  } else if (s0.algorithm == CpAlgorithm::kAllGatherLse) {
    // ncclReduceScatter / ncclAllReduce (sum, fp32) of the rescaled outputs, in rank order
    const std::int64_t elems = rank(0).scaled_bytes / 4;
    std::vector<float> sum(static_cast<std::size_t>(elems), 0.f);
    for (int r = 0; r < n; ++r) {
      const float* x = reinterpret_cast<const float*>(wsp(r) + rank(r).scaled_offset);
      for (std::int64_t i = 0; i < elems; ++i) sum[static_cast<std::size_t>(i)] += x[i];
    }
    const auto* bytes = reinterpret_cast<const std::byte*>(sum.data());
    for (int p = 0; p < n; ++p) {
      if (s0.output == CpOutput::kReplicated)
        move_bytes(wsp(p) + rank(p).scaled_offset, bytes, elems * 4);
      else
        move_bytes(wsp(p) + rank(p).sum_offset, bytes + rank(p).scaled_chunk_offset(p),
                   s0.tokens * rank(p).heads_of(p) * s0.head_dim * 4);
    }
  }
  for (int r = 0; r < n; ++r) attnstate::detail::cp_finish(rank(r), out(r), sinks, wsp(r), ops);
}

}  // namespace cpu
}  // namespace attnstate
