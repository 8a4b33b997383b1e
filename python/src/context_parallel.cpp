/// @file context_parallel.cpp
/// @brief `attnstate.cp_merge_simulated`: the context-parallel merge of every rank of one plan
///        in one process on the host (`cpu::cp_merge_simulated`, core/context_parallel.hpp), for
///        host arrays of any DLPack library. The package's `attnstate.distributed.cp_merge` runs
///        the same algorithms over a `torch.distributed` process group.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <vector>

#include "arrays.hpp"

namespace attnstate {
namespace py {
namespace {

using nb::arg;

CpAlgorithm parse_algorithm(const Call& c, const std::string& a) {
  if (a == "all_to_all") return CpAlgorithm::kAllToAll;
  if (a == "all_gather_lse") return CpAlgorithm::kAllGatherLse;
  c.fail("algorithm", "\"all_to_all\" or \"all_gather_lse\"", "\"" + a + "\"");
}

CpOutput parse_output(const Call& c, const std::string& o) {
  if (o == "head_sharded") return CpOutput::kHeadSharded;
  if (o == "replicated") return CpOutput::kReplicated;
  c.fail("output", "\"head_sharded\" or \"replicated\"", "\"" + o + "\"");
}

std::string indexed(const char* name, std::size_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

// Every rank's merge: `states[r]` (rank r's state of every head) into `outs[r]` (its heads, or
// every head), sinks (None or `heads` natural-base logits) merged once after the ranks.
void cp_merge_simulated(nb::sequence states, nb::sequence outs, const std::string& algorithm,
                        const std::string& output, nb::handle wire_base, nb::handle sinks) {
  Call c("attnstate.cp_merge_simulated");
  const std::size_t n = nb::len(states);
  if (n == 0) c.fail("states", "one state per rank (at least one)", "an empty sequence");
  if (nb::len(outs) != n)
    c.fail("outs", std::to_string(n) + " states (one per rank, as states)",
           std::to_string(nb::len(outs)));
  std::vector<ConstStateView> locals;
  std::vector<StateView> views;
  for (std::size_t r = 0; r < n; ++r) {
    const std::string name = indexed("states", r);
    const StateView v = c.state(states[r], name);
    if (c.space() != MemorySpace::kHost)
      c.fail(name + ".o", "a host array (the simulation runs every rank on the host)",
             "a CUDA array");
    if (r > 0) {  // named here as the Python arguments (the library names them 'locals[r]')
      const ConstStateView& s0 = locals[0];
      const auto same = [&](const char* what, std::int64_t want, std::int64_t got) {
        if (want != got)
          c.fail(name + ".o", std::to_string(want) + " " + what + " (as states[0])",
                 std::to_string(got));
      };
      same("tokens", s0.tokens, v.tokens);
      same("heads", s0.heads, v.heads);
      same("head_dim", s0.head_dim, v.head_dim);
      if (v.dtype != s0.dtype)
        c.fail(name + ".o", std::string("dtype ") + to_string(s0.dtype) + " (as states[0].o)",
               to_string(v.dtype));
    }
    locals.push_back(v);
  }
  for (std::size_t r = 0; r < n; ++r) views.push_back(c.state(outs[r], indexed("outs", r)));
  CpMergeShape shape;
  shape.world_size = static_cast<int>(n);
  shape.tokens = locals[0].tokens;
  shape.heads = locals[0].heads;
  shape.head_dim = locals[0].head_dim;
  shape.dtype = locals[0].dtype;
  shape.out_dtype = views[0].dtype;
  shape.wire_base = parse_base(wire_base, c.fn(), "wire_base");
  shape.algorithm = parse_algorithm(c, algorithm);
  shape.output = parse_output(c, output);
  AttentionSinks sk;
  if (!sinks.is_none()) {
    std::int64_t count = 0;
    sk.logits = c.float32_vector(sinks, "sinks", &count);
    if (count != shape.heads)
      c.fail("sinks", std::to_string(shape.heads) + " logits (one per head, as states[0])",
             std::to_string(count));
  }
  if (n > static_cast<std::size_t>(kMaxCpWorldSize))
    c.fail("states", "at most " + std::to_string(kMaxCpWorldSize) + " ranks", std::to_string(n));
  std::vector<CpMergePlan> plans;
  for (std::size_t r = 0; r < n; ++r) {
    shape.rank = static_cast<int>(r);
    plans.push_back(plan_cp_merge(shape));
  }
  nb::gil_scoped_release unlocked;
  cpu::cp_merge_simulated(plans, locals, views, sk);
}

}  // namespace

void bind_context_parallel(nb::module_& m) {
  m.def("cp_merge_simulated", &cp_merge_simulated, arg("states"), arg("outs"), arg("algorithm"),
        arg("output"), arg("wire_base"), arg("sinks").none());
}

}  // namespace py
}  // namespace attnstate
