"""Context-parallel merging: each rank holds the state of its shard of the keys for the same
(tokens, heads) rows, and the ranks' states are merged with ⊕ across the ranks.

This module holds what the CPU simulation (`cp_merge_simulated`, every rank in one process,
`attnstate::cpu::cp_merge_simulated`) and the torch.distributed run
(`attnstate.distributed.cp_merge`) share: the head slices of the ranks and the argument checks.
See docs/python.md, "Context parallelism", and docs/context_parallel.md.
"""

from . import _attnstate as _C
from ._arrays import array_dtype, dtype_name, empty, error
from ._merge import State, _parse_base

ALGORITHMS = ("all_to_all", "all_gather_lse")
OUTPUTS = ("head_sharded", "replicated")


def head_bounds(heads, world_size):
    """The head slices of the ranks: rank r owns heads `[b[r], b[r + 1])` with
    `b[r] = floor(r * heads / world_size)` (the C++ plan's `head_begin`). Returns the
    `world_size + 1` bounds."""
    return [r * heads // world_size for r in range(world_size + 1)]


def check_options(fn, algorithm, output, heads, world_size, exc=None):
    """Raises naming the argument unless `algorithm` and `output` are known and `heads` suits
    them on `world_size` ranks (every rank owns at least one head; the all-gather algorithm's
    head-sharded output needs `heads` to be a multiple of `world_size`, as a reduce-scatter
    gives every rank the same count). `exc(fn, arg, expected, got)` makes the exception
    (default: `attnstate.Error`)."""
    exc = exc or error
    if algorithm not in ALGORITHMS:
        raise exc(fn, "algorithm", '"all_to_all" or "all_gather_lse"', repr(algorithm))
    if output not in OUTPUTS:
        raise exc(fn, "output", '"head_sharded" or "replicated"', repr(output))
    if heads < world_size:
        raise exc(fn, "heads", f"at least the world size {world_size} (every rank owns a head)",
                  heads)
    if algorithm == "all_gather_lse" and output == "head_sharded" and heads % world_size:
        raise exc(fn, "heads",
                  f"a multiple of the world size {world_size} for algorithm=\"all_gather_lse\" "
                  "with output=\"head_sharded\" (a reduce-scatter gives every rank the same "
                  "number of heads; use \"all_to_all\" or output=\"replicated\")", heads)


def cp_merge_simulated(states, *, algorithm="all_to_all", output="head_sharded",
                       wire_base="natural", out_dtype=None, out_base=None, sinks=None, outs=None):
    """The context-parallel merge of `len(states)` ranks, every rank run here on the host.

    The same packing, head slicing and merges as a distributed run (the C++
    `attnstate::cpu::cp_merge_simulated`: the library's reference of `attnstate::dist::cp_merge`
    over NCCL, and of `attnstate.distributed.cp_merge`), with the collectives' byte movement
    done in memory. For testing an engine's context-parallel wiring without several devices.

    states: one `State` per rank, host arrays of any DLPack library: rank r's state of its shard
        of the keys, o (tokens, heads, head_dim) and lse (tokens, heads) of *every* head; one
        o dtype (float32/float16/bfloat16) and shape for all, each in its own base.
    algorithm: "all_to_all" (each rank gets its heads from every rank and merges them with
        `merge_states` in rank order: rank r's output is bitwise `merge_states` of the ranks'
        states, converted to `wire_base`, over its heads) or "all_gather_lse" (vLLM's scheme:
        gather the LSEs, rescale each rank's o in fp32 by exp(lse_local - lse_merged), sum).
    output: "head_sharded" (rank r holds its heads `[floor(r*H/N), floor((r+1)*H/N))`) or
        "replicated" (every rank holds every head).
    wire_base: the LSE base the ranks exchange ("natural" or "base2").
    out_dtype: dtype of the outputs' o (default the states'). out_base: their LSE base
        (default each rank's own state's).
    sinks: None or a (heads,) float32 host array of natural-base sink logits (finite), merged
        once into every output row after the merge across ranks (rank r: its heads' sinks).
    outs: optional list of output States to write (one per rank, the shapes above); default
        allocated like `states[0].o`.
    Returns the list of the ranks' output States.
    Raises attnstate.Error naming the argument (`states[r].o` of another shape or dtype,
    `heads` fewer than the ranks or, for all_gather_lse head-sharded, not a multiple of them,
    ...).
    """
    fn = "attnstate.cp_merge_simulated"
    states = list(states)
    if not states:
        raise error(fn, "states", "one state per rank (at least one)", "an empty sequence")
    for r, s in enumerate(states):
        if not isinstance(s, State):
            raise error(fn, f"states[{r}]", "an attnstate.State(o, lse, base)", type(s).__name__)
    first = states[0]
    shape = tuple(getattr(first.o, "shape", ()))
    if len(shape) != 3:
        raise error(fn, "states[0].o", "3 dimensions (tokens, heads, head_dim)", shape)
    n, (tokens, heads, head_dim) = len(states), shape
    check_options(fn, algorithm, output, heads, n)
    if outs is None:
        o_dtype = dtype_name(out_dtype, "out_dtype", fn) if out_dtype else array_dtype(first.o)
        bounds = head_bounds(heads, n)
        outs = []
        for r, s in enumerate(states):
            h = bounds[r + 1] - bounds[r] if output == "head_sharded" else heads
            base = s.base if out_base is None else _parse_base(out_base, fn, "out_base")
            outs.append(State(empty(first.o, (tokens, h, head_dim), o_dtype),
                              empty(first.o, (tokens, h), "float32"), base))
    else:
        outs = list(outs)
    _C.cp_merge_simulated(states, outs, algorithm, output, _parse_base(wire_base, fn, "wire_base"),
                          sinks)
    return outs
