"""FlashInfer's merge functions over attnstate's merges: an engine that calls
`flashinfer.merge_state`, `merge_state_in_place` or `merge_states` switches by changing the
import, with the same argument order, shapes, dtypes and return values:

    from attnstate.compat.flashinfer import merge_state, merge_state_in_place, merge_states

v: (seq_len, num_heads, head_dim) float32/float16/bfloat16; s: (seq_len, num_heads) log-sum-exp
in base 2 (FlashInfer's), float32 (other float dtypes are converted, as FlashInfer does, except
where s is written in place). Host arrays run on the CPU backend, CUDA arrays on the caller's
current stream; any array library speaking DLPack works, not only torch. docs/compat.md lists
what differs from FlashInfer.
"""

from .. import _merge
from .._attnstate import Base, State
from ._common import as_float32, check_float32, renamed

__all__ = ["merge_state", "merge_state_in_place", "merge_states"]

_FN = "attnstate.compat.flashinfer."


def merge_state(v_a, s_a, v_b, s_b):
    """The state of the union of two disjoint KV segments A and B: `(v, s)` with v
    (seq_len, num_heads, head_dim) in v_a's dtype and s (seq_len, num_heads) float32, base 2,
    both new arrays of v_a's library and device."""
    fn = _FN + "merge_state"
    a = State(v_a, as_float32(s_a, fn, "s_a"), Base.BASE2)
    b = State(v_b, as_float32(s_b, fn, "s_b"), Base.BASE2)
    with renamed(fn, {"a": ("v_a", "s_a"), "b": ("v_b", "s_b"), "out": ("v_a", "s_a")}):
        out = _merge.merge_state(a, b)
    return out.o, out.lse


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """In place: `(v, s) = (v, s) ⊕ (v_other, s_other)` for every sequence position whose
    `mask` entry is non-zero (all when mask is None); the others keep v and s bit for bit.

    s must be float32 (it is written). mask: (seq_len,) bool or uint8 of any stride, 0 included
    (one flag broadcast to every position), read when the merge runs (so a captured CUDA graph
    replays with the mask's current values). Returns None."""
    fn = _FN + "merge_state_in_place"
    check_float32(s, fn, "s")
    acc = State(v, s, Base.BASE2)
    other = State(v_other, as_float32(s_other, fn, "s_other"), Base.BASE2)
    with renamed(fn, {"acc": ("v", "s"), "other": ("v_other", "s_other")}):
        _merge.merge_state_(acc, other, mask=mask)


def merge_states(v, s):
    """Merges num_states states per (position, head): v (seq_len, num_states, num_heads,
    head_dim), s (seq_len, num_states, num_heads) base 2. Returns `(v, s)`, v (seq_len,
    num_heads, head_dim) in v's dtype, s (seq_len, num_heads) float32 base 2. num_states = 0
    gives the empty state (v = 0, s = -inf), as FlashInfer's."""
    fn = _FN + "merge_states"
    states = State(v, as_float32(s, fn, "s"), Base.BASE2)
    with renamed(fn, {"states": ("v", "s"), "out": ("v", "s")}):
        out = _merge.merge_states(states, order="tokens_major")
    return out.o, out.lse
