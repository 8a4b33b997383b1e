"""The merges of the attention-state algebra over arrays of any DLPack library.

Every function takes `attnstate.State` values (o, lse and the LSE base), runs on the CPU
backend for host arrays and on the CUDA backend for CUDA arrays, on the caller's stream: for
torch tensors the current `torch.cuda.current_stream()` unless `stream=` is given (an int
handle or any object with `__cuda_stream__`; CuPy arrays default to CuPy's current stream,
other libraries need `stream=`). Nothing synchronises. Outputs are written into `out=` when
given, else allocated with the inputs' own library on their device.
"""

from . import _attnstate as _C
from ._arrays import array_dtype, dtype_name, empty, error, library

State = _C.State


def _base(base, default, fn, arg="base"):
    return default if base is None else _parse_base(base, fn, arg)


def _parse_base(base, fn, arg):
    if isinstance(base, _C.Base):
        return base
    if base == "natural":
        return _C.Base.NATURAL
    if base == "base2":
        return _C.Base.BASE2
    raise error(fn, arg, 'attnstate.Base or "natural" / "base2"', repr(base))


def _check_state(s, fn, arg):
    # only where an output is allocated from `s`; the binding checks every State it gets
    if not isinstance(s, State):
        raise error(fn, arg, "an attnstate.State(o, lse, base)", type(s).__name__)


def _alloc(like, o_shape, dtype, base, fn):
    o_dtype = dtype_name(dtype, "dtype", fn) if dtype else array_dtype(like.o)
    o = empty(like.o, tuple(o_shape), o_dtype)
    lse = empty(like.o, tuple(o_shape[:-1]), "float32")
    # an fp8 output in the input's own format keeps its scale (pass `out=` for another scale)
    scale = like.scale if o_dtype == array_dtype(like.o) else 1.0
    return State(o, lse, base, scale=scale)


def merge_state(a, b, *, out=None, mask=None, dtype=None, base=None, stream=None):
    """`a ⊕ b` for every (token, head): the state of the union of two disjoint key sets.

    a, b: State with o (tokens, heads, head_dim) float32/float16/bfloat16 (independently, last
        dim contiguous, any other strides; any head_dim >= 1) and lse (tokens, heads) float32,
        each in its own base (converted on load: mixing bases is exact).
    out: State of the same shape to write (its own dtype and base); may be `a` or `b` itself;
        its lse may be None (no LSE written, vLLM's `output_lse=None`). Default: allocated like
        `a.o`, with `dtype` (default a's) and `base` (default a's).
    mask: optional (tokens,) bool or uint8 array of any stride (0 broadcasts one flag), in the
        memory of the states: tokens whose flag is 0 get `a` alone (converted to out's dtype and
        base; an empty row as (0, -inf)), as vLLM's prefill tokens without context do.
    stream: CUDA stream for CUDA arrays (see the module doc); must be None for host arrays.
    Returns `out`.
    """
    if out is None:
        fn = "attnstate.merge_state"
        _check_state(a, fn, "a")
        out = _alloc(a, a.o.shape, dtype, _base(base, a.base, fn), fn)
    _C.merge_state(a, b, out, mask, stream)
    return out


def merge_state_(acc, other, *, mask=None, stream=None):
    """In place: `acc = acc ⊕ other` for every (token, head) whose `mask[token]` is non-zero.

    acc: State (tokens, heads, head_dim), updated in its own dtype and base.
    other: State of the same shape, any dtype and base.
    mask: optional (tokens,) bool or uint8 array of any stride (0 broadcasts one flag), in the
        memory of the states; None merges all. Tokens whose flag is 0 are not written.
    Returns `acc`.
    """
    _C.merge_state_(acc, other, mask, stream)
    return acc


def merge_states(states, *, order="tokens_major", out=None, dtype=None, base=None, stream=None):
    """`out[t, h] = ⊕_s states[t, s, h]`: merges S states per (token, head).

    states: State whose o is (tokens, S, heads, head_dim) and lse (tokens, S, heads) for
        order="tokens_major", or o (S, tokens, heads, head_dim) / lse (S, tokens, heads) for
        order="states_major"; any strides with the last dim contiguous; S >= 0 (S = 0 gives
        the empty state (0, -inf) in every row, as FlashInfer's merge of no states).
    out: State (tokens, heads, head_dim), its lse may be None (not written); default allocated
        like `states.o` with `dtype` (default the stack's) and `base` (default the stack's).
    Returns `out`.
    """
    fn = "attnstate.merge_states"
    if out is None:
        _check_state(states, fn, "states")
        shape = states.o.shape
        if len(shape) != 4:
            raise error(fn, "states.o", "4 dimensions", tuple(shape))
        if order not in ("tokens_major", "states_major"):
            raise error(fn, "order", '"tokens_major" or "states_major"', repr(order))
        tokens = shape[0] if order == "tokens_major" else shape[1]
        out = _alloc(states, (tokens, shape[2], shape[3]), dtype,
                     _base(base, states.base, fn), fn)
    _C.merge_states(states, order, out, stream)
    return out


def merge_states_ragged(rows, indptr, *, out=None, dtype=None, base=None, stream=None):
    """Ragged merge: `out[t, h] = ⊕_{r in [indptr[t], indptr[t+1])} rows[r, h]`.

    rows: State (total_rows, heads, head_dim). indptr: (tokens + 1,) int32, contiguous, in the
    memory of the states (on the device it is read on the device: a graph captured for a
    maximum token count replays for fewer; offsets are clamped to the rows). A token without
    rows gets the empty state (0, -inf). out: State (tokens, heads, head_dim) or allocated; its
    lse may be None (not written).
    Returns `out`.
    """
    fn = "attnstate.merge_states_ragged"
    if out is None:
        _check_state(rows, fn, "rows")
        tokens = len(indptr) - 1
        if tokens < 0:
            raise error(fn, "indptr", "at least one entry", "0")
        shape = rows.o.shape
        out = _alloc(rows, (tokens,) + tuple(shape[1:]), dtype, _base(base, rows.base, fn), fn)
    _C.merge_states_ragged(rows, indptr, out, stream)
    return out


def rebase(state, base=None, *, dtype=None, out=None, stream=None):
    """The same state with its LSE in `base` (and o in `dtype`): a conversion, exact up to
    the rounding of the new dtype.

    state: State (tokens, heads, head_dim). An empty row (LSE -inf) is written as (0, -inf)
    whatever its o held. base: the target base (required unless `out` is given, whose base is
    the target). out: may be `state` itself (then only the LSEs change;
    pass `State(state.o, state.lse, new_base)` over the same arrays). Returns `out`.
    """
    fn = "attnstate.rebase"
    if out is None:
        _check_state(state, fn, "state")
        if base is None:
            raise error(fn, "base", 'the target base (attnstate.Base or "natural" / "base2")',
                        "None")
        out = _alloc(state, state.o.shape, dtype, _parse_base(base, fn, "base"), fn)
    _C.rebase(state, out, stream)
    return out


def mark_empty_rows(state, *, stream=None):
    """In place: rows whose LSE is +inf (FlashAttention's mark of a query row without keys)
    become the empty state (their LSE -inf; o is not written). Call it on FlashAttention's
    states before merging them. Returns `state`."""
    _C.mark_empty_rows(state, stream)
    return state


def sink_state(sinks, tokens, head_dim, *, base="natural", dtype="float32"):
    """The state of attention sinks: row (t, h) is `(o = 0, lse = sinks[h])`.

    A sink logit adds `exp(s_h)` to the softmax denominator and nothing to the numerator, which
    is the merge with this state: apply it once, at the end of the expression (after every
    split, level and producer has been merged), `merge_state_(out, sink_state(...))`. Merging it
    into each partial instead counts it once per partial.

    sinks: (heads,) float32 array of sink logits in `base` (a model's: "natural"), host or CUDA.
    tokens, head_dim: the rows and head dim of the state it is merged into.
    dtype: dtype of the zero `o`. Returns a State whose o (tokens, heads, head_dim) and lse
    (tokens, heads) are broadcast views (strides 0) from the library and device of `sinks`:
    no per-row memory.
    """
    fn = "attnstate.sink_state"
    b = _parse_base(base, fn, "base")
    if len(getattr(sinks, "shape", ())) != 1:
        raise error(fn, "sinks", "a (heads,) array", tuple(getattr(sinks, "shape", ())))
    if dtype_name(sinks.dtype, "sinks", fn) != "float32":
        raise error(fn, "sinks", "dtype float32", dtype_name(sinks.dtype))
    if int(tokens) < 0:
        raise error(fn, "tokens", ">= 0", int(tokens))
    if int(head_dim) < 1:
        raise error(fn, "head_dim", ">= 1", int(head_dim))
    heads = sinks.shape[0]
    o_dtype = dtype_name(dtype, "dtype", fn)
    o_shape, lse_shape = (int(tokens), heads, int(head_dim)), (int(tokens), heads)
    lib = library(sinks)
    if lib == "jax":  # immutable arrays, no strided views: materialised
        import jax.numpy as jnp
        return State(jnp.zeros(o_shape, o_dtype), jnp.broadcast_to(sinks, lse_shape), b)
    zeros = empty(sinks, (int(head_dim),), o_dtype)
    zeros[...] = 0
    if lib == "torch":
        return State(zeros.expand(o_shape), sinks.expand(lse_shape), b)
    if lib == "cupy":
        import cupy
        return State(cupy.broadcast_to(zeros, o_shape), cupy.broadcast_to(sinks, lse_shape), b)
    import numpy as np
    return State(np.broadcast_to(zeros, o_shape), np.broadcast_to(sinks, lse_shape), b)
