"""torch custom ops (`torch.ops.attnstate.*`) over the same bindings, registered when torch is
importable: with fake (meta) implementations they trace under `torch.compile(fullgraph=True)`
and run inside CUDA graphs. They take plain tensors and integer bases (0 natural, 1 base2), and
run on the current torch stream.

    o, lse = torch.ops.attnstate.merge_state(a_o, a_lse, 0, b_o, b_lse, 1, 0, "")

`decode(dec, q, k, v, seq_lens, ...)` runs a planned `attnstate.Decode` as the op
`attnstate::decode`, its workspace a mutated argument; `mla_decode(mla, q_nope, q_pe, ckv, kpe,
seq_lens, ...)` a planned `attnstate.MlaDecode` as the op `attnstate::mla_decode`;
`mla_cascade(cas, q_nope, q_pe, ckv, kpe, levels, ...)` a planned `attnstate.MlaCascade` as the op
`attnstate::mla_cascade` (the levels' arrays one flat list of tensors, four per level).
"""

import weakref
from typing import List, Optional, Tuple

import torch

from . import _attnstate as _C
from ._merge import State
from ._plans import _levels

Tensor = torch.Tensor
_BASES = (_C.Base.NATURAL, _C.Base.BASE2)
# id -> Decode, so that a compiled graph names a plan by an int; weak: the caller owns the plan
_PLANS = weakref.WeakValueDictionary()


def _dtype(name, like):
    return getattr(torch, name) if name else like.dtype


def _state(o, lse, base):
    return State(o, lse, _BASES[base])


def _new_state(o_shape, lse_shape, dtype, like):
    return (torch.empty(o_shape, dtype=dtype, device=like.device),
            torch.empty(lse_shape, dtype=torch.float32, device=like.device))


@torch.library.custom_op("attnstate::merge_state", mutates_args=())
def merge_state(a_o: Tensor, a_lse: Tensor, a_base: int, b_o: Tensor, b_lse: Tensor,
                b_base: int, out_base: int, out_dtype: str) -> Tuple[Tensor, Tensor]:
    """(o, lse) of a ⊕ b, o in out_dtype ("" for a_o's), lse in out_base."""
    o, lse = _new_state(a_o.shape, a_lse.shape, _dtype(out_dtype, a_o), a_o)
    _C.merge_state(_state(a_o, a_lse, a_base), _state(b_o, b_lse, b_base),
                   _state(o, lse, out_base), None, None)
    return o, lse


@merge_state.register_fake
def _(a_o, a_lse, a_base, b_o, b_lse, b_base, out_base, out_dtype):
    return _new_state(a_o.shape, a_lse.shape, _dtype(out_dtype, a_o), a_o)


@torch.library.custom_op("attnstate::merge_state_", mutates_args=("acc_o", "acc_lse"))
def merge_state_(acc_o: Tensor, acc_lse: Tensor, acc_base: int, other_o: Tensor,
                 other_lse: Tensor, other_base: int, mask: Optional[Tensor]) -> None:
    """In place: acc = acc ⊕ other where mask (bool/uint8 per token, or None)."""
    _C.merge_state_(_state(acc_o, acc_lse, acc_base), _state(other_o, other_lse, other_base),
                    mask, None)


@merge_state_.register_fake
def _(acc_o, acc_lse, acc_base, other_o, other_lse, other_base, mask):
    return None


@torch.library.custom_op("attnstate::merge_states", mutates_args=())
def merge_states(o: Tensor, lse: Tensor, base: int, order: str, out_base: int,
                 out_dtype: str) -> Tuple[Tensor, Tensor]:
    """⊕ over the states axis of a stack (order "tokens_major" or "states_major")."""
    shape = _merged_shape(o, order)
    out = _new_state(shape, shape[:-1], _dtype(out_dtype, o), o)
    _C.merge_states(_state(o, lse, base), order, _state(*out, out_base), None)
    return out


def _merged_shape(o, order):
    tokens = o.shape[0] if order == "tokens_major" else o.shape[1]
    return (tokens, o.shape[2], o.shape[3])


@merge_states.register_fake
def _(o, lse, base, order, out_base, out_dtype):
    shape = _merged_shape(o, order)
    return _new_state(shape, shape[:-1], _dtype(out_dtype, o), o)


@torch.library.custom_op("attnstate::rebase", mutates_args=())
def rebase(o: Tensor, lse: Tensor, base: int, out_base: int,
           out_dtype: str) -> Tuple[Tensor, Tensor]:
    """The state in out_base (and o in out_dtype)."""
    out = _new_state(o.shape, lse.shape, _dtype(out_dtype, o), o)
    _C.rebase(_state(o, lse, base), _state(*out, out_base), None)
    return out


@rebase.register_fake
def _(o, lse, base, out_base, out_dtype):
    return _new_state(o.shape, lse.shape, _dtype(out_dtype, o), o)


@torch.library.custom_op("attnstate::mark_empty_rows_", mutates_args=("lse",))
def mark_empty_rows_(o: Tensor, lse: Tensor) -> None:
    """In place: LSEs of +inf (rows without keys) become -inf."""
    _C.mark_empty_rows(_state(o, lse, 0), None)


@mark_empty_rows_.register_fake
def _(o, lse):
    return None


@torch.library.custom_op("attnstate::decode", mutates_args=("workspace",))
def decode_op(plan_id: int, q: Tensor, k: Tensor, v: Tensor, seq_lens: Tensor,
              page_indptr: Optional[Tensor], page_indices: Optional[Tensor],
              block_table: Optional[Tensor], layout: str, workspace: Optional[Tensor],
              out_base: int, out_dtype: str,
              sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """A planned decode (plan_id from `register_plan`), output (batch * q_len, heads_q, D);
    `sinks`: attention sinks merged once into every output row (as Decode.run's keyword)."""
    dec = _PLANS[plan_id]
    b, t, h, d = q.shape
    out = _new_state((b * t, h, d), (b * t, h), _dtype(out_dtype, q), q)
    _C.run_decode(dec._plan, q, k, v, seq_lens, page_indptr, page_indices, block_table, layout,
                  _state(*out, out_base), workspace, None, sinks=sinks)
    return out


@decode_op.register_fake
def _(plan_id, q, k, v, seq_lens, page_indptr, page_indices, block_table, layout, workspace,
      out_base, out_dtype, sinks=None):
    b, t, h, d = q.shape
    return _new_state((b * t, h, d), (b * t, h), _dtype(out_dtype, q), q)


@torch.library.custom_op("attnstate::mla_decode", mutates_args=("workspace",))
def mla_decode_op(plan_id: int, q_nope: Tensor, q_pe: Tensor, ckv: Tensor, kpe: Tensor,
                  seq_lens: Tensor, page_indptr: Optional[Tensor], page_indices: Optional[Tensor],
                  block_table: Optional[Tensor], workspace: Optional[Tensor], out_base: int,
                  out_dtype: str, ckv_scale: float = 1.0, kpe_scale: float = 1.0,
                  sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """A planned MLA decode (plan_id from `register_plan` of an attnstate.MlaDecode), output
    (batch * q_len, heads, kv_lora_rank); ckv_scale, kpe_scale: an fp8 cache's scales (1.0 for
    none); `sinks` as MlaDecode.run's keyword."""
    mla = _PLANS[plan_id]
    b, t, h, r = q_nope.shape
    out = _new_state((b * t, h, r), (b * t, h), _dtype(out_dtype, q_nope), q_nope)
    _C.run_mla_decode(mla._plan, q_nope, q_pe, ckv, kpe, seq_lens, page_indptr, page_indices,
                      block_table, _state(*out, out_base), workspace, None, ckv_scale, kpe_scale,
                      sinks)
    return out


@mla_decode_op.register_fake
def _(plan_id, q_nope, q_pe, ckv, kpe, seq_lens, page_indptr, page_indices, block_table,
      workspace, out_base, out_dtype, ckv_scale=1.0, kpe_scale=1.0, sinks=None):
    b, t, h, r = q_nope.shape
    return _new_state((b * t, h, r), (b * t, h), _dtype(out_dtype, q_nope), q_nope)


@torch.library.custom_op("attnstate::mla_cascade", mutates_args=("workspace",))
def mla_cascade_op(plan_id: int, q_nope: Tensor, q_pe: Tensor, ckv: Tensor, kpe: Tensor,
                   levels: List[Tensor], workspace: Optional[Tensor], out_base: int,
                   out_dtype: str, ckv_scale: float = 1.0, kpe_scale: float = 1.0,
                   sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """A planned MLA cascade (plan_id from `register_plan` of an attnstate.MlaCascade), output
    (batch * q_len, heads, kv_lora_rank); `levels`: each level's (request_indptr, page_indptr,
    page_indices, seg_lens) int32 tensors one after the other (4 per level); ckv_scale,
    kpe_scale: an fp8 pool's scales (1.0 for none); `sinks` as MlaCascade.run's keyword."""
    cas = _PLANS[plan_id]
    b, t, h, r = q_nope.shape
    out = _new_state((b * t, h, r), (b * t, h), _dtype(out_dtype, q_nope), q_nope)
    _C.run_mla_cascade(cas._plan, q_nope, q_pe, ckv, kpe, _level_tuples(levels),
                       _state(*out, out_base), workspace, None, ckv_scale, kpe_scale, sinks)
    return out


@mla_cascade_op.register_fake
def _(plan_id, q_nope, q_pe, ckv, kpe, levels, workspace, out_base, out_dtype, ckv_scale=1.0,
      kpe_scale=1.0, sinks=None):
    b, t, h, r = q_nope.shape
    return _new_state((b * t, h, r), (b * t, h), _dtype(out_dtype, q_nope), q_nope)


def _level_tuples(flat):
    """The flat list of the op's level tensors as the binding's level tuples (a list not of 4
    tensors a level is refused by the binding, naming the level)."""
    return [tuple(flat[i:i + 4]) for i in range(0, len(flat), 4)]


def register_plan(dec):
    """An int naming `dec` (an attnstate.Decode, MlaDecode or MlaCascade) for the ops, valid
    while `dec` lives."""
    key = id(dec)
    _PLANS[key] = dec
    return key


def decode(dec, q, k, v, seq_lens, *, page_indptr=None, page_indices=None, block_table=None,
           layout="NHD", base=0, dtype="", sinks=None):
    """`dec.run(...)` as the custom op (traceable by torch.compile); returns (o, lse) tensors."""
    return torch.ops.attnstate.decode(register_plan(dec), q, k, v, seq_lens, page_indptr,
                                      page_indices, block_table, layout, dec.workspace, base,
                                      dtype, sinks)


def mla_decode(mla, q_nope, q_pe, ckv, kpe, seq_lens, *, page_indptr=None, page_indices=None,
               block_table=None, base=0, dtype="", ckv_scale=None, kpe_scale=None, sinks=None):
    """`mla.run(...)` (an attnstate.MlaDecode) as the custom op `attnstate::mla_decode`
    (traceable by torch.compile); returns (o, lse) tensors, lse in `base` (0 natural, 1 base2)."""
    return torch.ops.attnstate.mla_decode(
        register_plan(mla), q_nope, q_pe, ckv, kpe, seq_lens, page_indptr, page_indices,
        block_table, mla.workspace, base, dtype, 1.0 if ckv_scale is None else float(ckv_scale),
        1.0 if kpe_scale is None else float(kpe_scale), sinks)


def mla_cascade(cas, q_nope, q_pe, ckv, kpe, levels, *, base=0, dtype="", ckv_scale=None,
                kpe_scale=None, sinks=None):
    """`cas.run(...)` (an attnstate.MlaCascade) as the custom op `attnstate::mla_cascade`
    (traceable by torch.compile); `levels` as MlaCascade.run takes them (a CascadeLevels' NumPy
    arrays become CPU tensors without a copy); returns (o, lse) tensors, lse in `base` (0
    natural, 1 base2)."""
    flat = [torch.as_tensor(a) for level in _levels(levels, "attnstate.torch_ops.mla_cascade")
            for a in level]
    return torch.ops.attnstate.mla_cascade(
        register_plan(cas), q_nope, q_pe, ckv, kpe, flat, cas.workspace, base, dtype,
        1.0 if ckv_scale is None else float(ckv_scale),
        1.0 if kpe_scale is None else float(kpe_scale), sinks)


__all__: List[str] = ["decode", "mla_cascade", "mla_decode", "register_plan"]
