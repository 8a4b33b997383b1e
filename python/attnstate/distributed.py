"""attnstate.distributed: the context-parallel merge over a `torch.distributed` process group.

Each rank of the group holds the attention state of its shard of the keys (decode context
parallelism: the KV cache sharded across devices) for the same (tokens, heads) rows, and
`cp_merge` merges the ranks' states with ⊕ across the ranks:
`state(q, KV) = ⊕_rank state(q, KV shard of rank)`. It uses torch's collectives (any backend:
NCCL for CUDA tensors, gloo for CPU tensors) and the package's own merges, on torch's current
stream for CUDA tensors.

Importing this module imports torch. The process group must be initialised
(`torch.distributed.init_process_group`); `group=None` is the default group. A group of one
rank runs without any collective. See docs/python.md, "Context parallelism", for the
algorithms, their bytes on the wire and an example; `attnstate.cp_merge_simulated` runs every
rank of the same merge in one process (the reference the tests compare against).
"""

import torch
import torch.distributed as dist

from . import _attnstate as _C
from ._arrays import dtype_name, library
from ._context_parallel import check_options, head_bounds
from ._merge import State, _parse_base, merge_state_, merge_states, rebase, sink_state

__all__ = ["ArgumentError", "cp_merge", "head_bounds"]

_FN = "attnstate.distributed.cp_merge"
_DTYPES = ("float32", "float16", "bfloat16")
_ALGORITHMS = ("all_to_all", "all_gather_lse")
_OUTPUTS = ("head_sharded", "replicated")


class ArgumentError(_C.Error, ValueError):
    """An argument `cp_merge` refuses: an `attnstate.Error` (status INVALID_ARGUMENT, the message
    naming the argument) that is also a `ValueError`."""


def _fail(fn, arg, expected, got):
    err = ArgumentError(f"{fn}: argument '{arg}': expected {expected}, got {got}")
    err.status = _C.Status.INVALID_ARGUMENT
    return err


def _pad16(n):
    return (n + 15) // 16 * 16


class _Args:
    """One rank's checked arguments."""

    def __init__(self, state, n, algorithm, output, sinks, out_dtype, out_base):
        fn = _FN
        if not isinstance(state, State):
            raise _fail(fn, "state", "an attnstate.State(o, lse, base)", type(state).__name__)
        o, lse = state.o, state.lse
        for name, a in (("state.o", o), ("state.lse", lse)):
            if library(a) != "torch":
                raise _fail(fn, name, "a torch.Tensor", type(a).__name__)
        if o.dim() != 3:
            raise _fail(fn, "state.o", "3 dimensions (tokens, heads, head_dim)", tuple(o.shape))
        if tuple(lse.shape) != tuple(o.shape[:2]):
            raise _fail(fn, "state.lse", f"shape {tuple(o.shape[:2])} (o's first two dimensions)",
                        tuple(lse.shape))
        if lse.dtype != torch.float32:
            raise _fail(fn, "state.lse", "dtype float32", lse.dtype)
        if str(o.dtype).rsplit(".", 1)[-1] not in _DTYPES:
            raise _fail(fn, "state.o", "dtype float32, float16 or bfloat16", o.dtype)
        if o.shape[2] < 1:
            raise _fail(fn, "state.o", "head_dim >= 1", tuple(o.shape))
        if o.shape[2] > 1 and o.stride(2) != 1:
            raise _fail(fn, "state.o", "a contiguous last dimension (stride 1)",
                        f"stride {o.stride(2)}")
        if lse.device != o.device:
            raise _fail(fn, "state.lse", f"a tensor on {o.device} (as state.o)", lse.device)
        self.o, self.lse, self.base = o, lse, state.base
        self.tokens, self.heads, self.head_dim = (int(x) for x in o.shape)
        self.dtype = dtype_name(o.dtype, "state.o", fn)
        self.out_dtype = dtype_name(out_dtype, "out_dtype", fn) if out_dtype else self.dtype
        self.out_base = state.base if out_base is None else _parse_base(out_base, fn, "out_base")
        check_options(fn, algorithm, output, self.heads, n, exc=_fail)
        self.algorithm, self.output = algorithm, output
        if sinks is not None:
            if library(sinks) != "torch":
                raise _fail(fn, "sinks", "a torch.Tensor of per-head logits", type(sinks).__name__)
            if sinks.dim() != 1 or sinks.shape[0] != self.heads:
                raise _fail(fn, "sinks", f"shape ({self.heads},) (one logit per head, of all "
                            "heads)", tuple(sinks.shape))
            if sinks.dtype != torch.float32:
                raise _fail(fn, "sinks", "dtype float32", sinks.dtype)
            if sinks.device != o.device:
                raise _fail(fn, "sinks", f"a tensor on {o.device} (as state.o)", sinks.device)
            if sinks.shape[0] > 1 and sinks.stride(0) != 1:
                raise _fail(fn, "sinks", "a contiguous tensor", f"stride {sinks.stride(0)}")
        self.sinks = sinks

    # What every rank must agree on: (argument name, value as an int; _NAMES shows the codes).
    def fields(self):
        return [
            ("state.tokens", self.tokens), ("state.heads", self.heads),
            ("state.head_dim", self.head_dim), ("state.o.dtype", _DTYPES.index(self.dtype)),
            ("out_dtype", _DTYPES.index(self.out_dtype)),
            ("algorithm", _ALGORITHMS.index(self.algorithm)),
            ("output", _OUTPUTS.index(self.output)), ("sinks", int(self.sinks is not None)),
        ]


_NAMES = {"state.o.dtype": _DTYPES, "out_dtype": _DTYPES, "algorithm": _ALGORITHMS,
          "output": _OUTPUTS, "sinks": ("None", "a tensor")}


def _group_rank(group):
    if not dist.is_available() or not dist.is_initialized():
        raise _fail(_FN, "group", "an initialised torch.distributed process group "
                    "(torch.distributed.init_process_group first; None is the default group)",
                    "no initialised process group")
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank < 0:
        raise _fail(_FN, "group", "a process group this process is a member of",
                    "a group without this process")
    return n, rank


def _meta_device(group, state):
    if isinstance(state, State) and library(state.o) == "torch":
        return state.o.device
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _agree(group, n, state, args, err):
    """The ranks' check before any data collective: an all-gather of each rank's shape (or of
    its refusal). Every rank raises the same kind of error, so none waits in a collective."""
    fields = args.fields() if args is not None else None
    width = 9
    row = [1] + [v for _, v in fields] if fields else [0] * width
    mine = torch.tensor(row, dtype=torch.int64, device=_meta_device(group, state))
    every = torch.empty(n * width, dtype=torch.int64, device=mine.device)
    dist.all_gather_into_tensor(every, mine, group=group)
    rows = every.view(n, width).tolist()
    refused = [r for r, x in enumerate(rows) if x[0] == 0]
    if err is not None:
        raise err
    if refused:
        raise _fail(_FN, "state", "valid arguments on every rank",
                    f"rank(s) {refused} of the group refused theirs (see the error raised there)")
    for i, (name, _) in enumerate(fields, start=1):
        for r, x in enumerate(rows):
            if x[i] != rows[0][i]:
                show = _NAMES.get(name)
                want, got = (show[rows[0][i]], show[x[i]]) if show else (rows[0][i], x[i])
                raise _fail(_FN, name, f"{want} (as on rank 0: every rank the same)",
                            f"{got} on rank {r}")


def _torch_dtype(name):
    return getattr(torch, name)


def _chunk_bytes(tokens, heads, head_dim, dtype):
    """Bytes of the o part and of the LSE part of a packed chunk of `heads` heads: o (tokens,
    heads, head_dim) of `dtype` then the fp32 LSEs (tokens, heads), each padded to 16 bytes (the
    C++ plan's chunk layout)."""
    es = torch.empty((), dtype=_torch_dtype(dtype)).element_size()
    return _pad16(tokens * heads * head_dim * es), _pad16(tokens * heads * 4)


def _chunk_views(rows, tokens, heads, head_dim, dtype):
    """The o (stack, tokens, heads, head_dim) and lse (stack, tokens, heads) views of packed
    chunks, one per row of the uint8 `rows` (stack, bytes per chunk or more)."""
    o_bytes, lse_bytes = _chunk_bytes(tokens, heads, head_dim, dtype)
    o_elems, lse_elems = tokens * heads * head_dim, tokens * heads
    o = rows[:, :o_bytes].view(_torch_dtype(dtype))[:, :o_elems]
    lse = rows[:, o_bytes:o_bytes + lse_bytes].view(torch.float32)[:, :lse_elems]
    return o.view(-1, tokens, heads, head_dim), lse.view(-1, tokens, heads)


def _chunk(buf, offset, tokens, heads, head_dim, dtype):
    """The chunk of `heads` heads at byte `offset` of the uint8 `buf` as a natural-base State."""
    size = sum(_chunk_bytes(tokens, heads, head_dim, dtype))
    o, lse = _chunk_views(buf[offset:offset + size].view(1, size), tokens, heads, head_dim, dtype)
    return State(o[0], lse[0], _C.Base.NATURAL)


def _empty_out(a, heads):
    o = torch.empty((a.tokens, heads, a.head_dim), dtype=_torch_dtype(a.out_dtype),
                    device=a.o.device)
    return State(o, torch.empty((a.tokens, heads), dtype=torch.float32, device=a.o.device),
                 a.out_base)


def _all_to_all(a, group, n, rank, bounds):
    dev, t, d = a.o.device, a.tokens, a.head_dim
    heads_of = [bounds[p + 1] - bounds[p] for p in range(n)]
    chunk = [sum(_chunk_bytes(t, h, d, a.dtype)) for h in heads_of]
    send = torch.empty(sum(chunk), dtype=torch.uint8, device=dev)
    for p in range(n):  # pack: peer p's heads, o in its dtype, the LSE in the wire base
        b0, b1 = bounds[p], bounds[p + 1]
        rebase(State(a.o[:, b0:b1], a.lse[:, b0:b1], a.base),
               out=_chunk(send, sum(chunk[:p]), t, heads_of[p], d, a.dtype))
    h = heads_of[rank]
    if n == 1:
        recv = send
    else:
        recv = torch.empty(n * chunk[rank], dtype=torch.uint8, device=dev)
        dist.all_to_all_single(recv, send, output_split_sizes=[chunk[rank]] * n,
                               input_split_sizes=chunk, group=group)
    # the n received states of this rank's heads, in rank order: one stack (states-major)
    o, lse = _chunk_views(recv.view(n, chunk[rank]), t, h, d, a.dtype)
    stack = State(o, lse, _C.Base.NATURAL)
    if a.output == "head_sharded":
        return merge_states(stack, order="states_major", out=_empty_out(a, h))
    # replicated: every rank's merged slice (out dtype, wire base) to every rank, each padded to
    # the largest slice (an all-gather takes one size)
    size = sum(_chunk_bytes(t, max(heads_of), d, a.out_dtype))
    mine = torch.empty(size, dtype=torch.uint8, device=dev)
    merge_states(stack, order="states_major", out=_chunk(mine, 0, t, h, d, a.out_dtype))
    if n == 1:
        gathered = mine
    else:
        gathered = torch.empty(n * size, dtype=torch.uint8, device=dev)
        dist.all_gather_into_tensor(gathered, mine, group=group)
    out = _empty_out(a, a.heads)
    for s in range(n):
        b0, b1 = bounds[s], bounds[s + 1]
        rebase(_chunk(gathered, s * size, t, heads_of[s], d, a.out_dtype),
               out=State(out.o[:, b0:b1], out.lse[:, b0:b1], a.out_base))
    return out


def _all_gather_lse(a, group, n, rank, bounds):
    natural = _C.Base.NATURAL
    local = rebase(State(a.o, a.lse, a.base), natural, dtype="float32")  # fp32 o, natural LSE
    if n == 1:
        gathered = local.lse.unsqueeze(0)
    else:
        gathered = torch.empty(n * a.tokens * a.heads, dtype=torch.float32, device=a.o.device)
        dist.all_gather_into_tensor(gathered, local.lse.reshape(-1), group=group)
        gathered = gathered.view(n, a.tokens, a.heads)
    # merged LSE, max-subtracted; an all-empty row stays -inf (log 0), a NaN propagates
    m = gathered.amax(dim=0)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    lse_merged = m + torch.log(torch.exp(gathered - m).sum(dim=0))
    empty = local.lse == float("-inf")  # contributes nothing, whatever its o holds
    weight = torch.where(empty, torch.zeros_like(m), torch.exp(local.lse - lse_merged))
    scaled = torch.where(empty.unsqueeze(-1), torch.zeros((), device=a.o.device),
                         local.o * weight.unsqueeze(-1))
    if a.output == "head_sharded":
        b0, b1 = bounds[rank], bounds[rank + 1]
        if n == 1:
            summed = scaled
        else:  # rank-major chunks: rank p's heads [tokens, heads / n, head_dim]
            chunks = scaled.view(a.tokens, n, a.heads // n, a.head_dim).transpose(0, 1)
            summed = torch.empty((a.tokens, b1 - b0, a.head_dim), dtype=torch.float32,
                                 device=a.o.device)
            dist.reduce_scatter_tensor(summed.view(-1), chunks.contiguous().view(-1), group=group)
    else:
        b0, b1 = 0, a.heads
        if n > 1:
            dist.all_reduce(scaled, group=group)
        summed = scaled
    return rebase(State(summed, lse_merged[:, b0:b1], natural), out=_empty_out(a, b1 - b0))


def cp_merge(state, group=None, *, algorithm="all_to_all", output="head_sharded", sinks=None,
             out_dtype=None, out_base=None, check=True):
    """Merges the ranks' states of one context-parallel attention across a process group.

    Every rank of `group` calls it with its own `state`, in the same order relative to its other
    collectives on that group.

    state: this rank's `State` of its shard of the keys: o (tokens, heads, head_dim) and lse
        (tokens, heads) torch tensors of *every* head, o float32/float16/bfloat16 (the same
        dtype and shape on every rank) with the last dim contiguous, lse float32 in this rank's
        base (ranks may differ: the LSEs travel in the natural base). CUDA tensors for an NCCL
        group, CPU tensors for gloo.
    group: a `torch.distributed` process group this process is in; None is the default group
        (which must be initialised). Rank r of the group owns heads
        `[floor(r*H/N), floor((r+1)*H/N))` (`head_bounds(H, N)`).
    algorithm:
        "all_to_all" (default): each rank sends every peer the peer's heads (o in its dtype
        and the LSE, packed in one chunk per peer: one `all_to_all_single`), then merges the N
        states it received with `attnstate.merge_states` in rank order, so its output is
        bitwise the `merge_states` of the ranks' states (converted to the natural base) over
        its heads, whatever the order of arrival. Any heads >= N.
        "all_gather_lse" (vLLM's scheme): all-gather the LSEs, merge them (max-subtracted; an
        empty state, lse = -inf, contributes nothing even if its o is NaN), rescale the local o
        in fp32 by exp(lse_local - lse_merged), then reduce-scatter (head-sharded; heads a
        multiple of N) or all-reduce (replicated) the fp32 sums. Exact to rounding.
    output: "head_sharded" (default; this rank's heads) or "replicated" (every head; the
        all-to-all algorithm all-gathers the merged slices, the other all-reduces).
    sinks: None or a (heads,) float32 tensor of natural-base sink logits of *every* head (the
        same on every rank), on the state's device: merged once into the result after the merge
        across ranks (a head-sharded rank applies its heads' slice). Never fold sinks into the
        ranks' states: N ranks would count them N times.
    out_dtype: dtype of the output's o (default the state's). out_base: its LSE base (default
        the state's).
    check: all-gather the ranks' shapes and options before the data collectives (a small
        collective and, for CUDA tensors, a host synchronisation), so that a rank whose shape,
        dtype, options or sinks differ, or whose arguments are refused, makes every rank raise
        instead of leaving the others waiting in a collective. Pass False once the ranks are
        known to agree (a bad argument then raises on its rank only).
    Returns a new State: (tokens, heads of this rank or all heads, head_dim) in out_dtype and
    out_base, on the state's device.
    Raises `ArgumentError` (an attnstate.Error and a ValueError) naming the argument: `state`
    not a State of torch tensors of the shapes above, `group` not initialised, `algorithm` or
    `output` unknown, `heads` fewer than the ranks or (all_gather_lse, head-sharded) not a
    multiple of them, `sinks` of another shape, dtype or device, and any field where a rank
    differs from rank 0 (`state.heads`, `state.tokens`, `state.head_dim`, `state.o.dtype`,
    `out_dtype`, `algorithm`, `output`, `sinks`).
    """
    n, rank = _group_rank(group)
    args, err = None, None
    try:
        args = _Args(state, n, algorithm, output, sinks, out_dtype, out_base)
    except ArgumentError as e:
        err = e
    except _C.Error as e:  # from the package's parsers (dtype, base): the same, as a ValueError
        err = ArgumentError(str(e))
        err.status = e.status
    if check and n > 1:
        _agree(group, n, state, args, err)
    elif err is not None:
        raise err
    bounds = head_bounds(args.heads, n)
    sharded = args.output == "head_sharded"
    if args.tokens == 0:  # every rank has no rows (they agree): nothing to exchange
        return _empty_out(args, bounds[rank + 1] - bounds[rank] if sharded else args.heads)
    if args.algorithm == "all_to_all":
        out = _all_to_all(args, group, n, rank, bounds)
    else:
        out = _all_gather_lse(args, group, n, rank, bounds)
    if args.sinks is not None:
        b0, b1 = (bounds[rank], bounds[rank + 1]) if sharded else (0, args.heads)
        merge_state_(out, sink_state(args.sinks[b0:b1], args.tokens, args.head_dim))
    return out
