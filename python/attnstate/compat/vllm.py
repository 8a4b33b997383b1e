"""vLLM's `merge_attn_states` over attnstate's merge: an engine that calls
`vllm.v1.attention.ops.merge_attn_states.merge_attn_states` switches by changing the import:

    from attnstate.compat.vllm import merge_attn_states

Same arguments, layouts and conventions as vLLM's: outputs (num_tokens, num_heads, head_size),
LSEs (num_heads, num_tokens) head-major, natural log, float32; an LSE of +inf (FlashAttention 2's
mark of a row without keys) or -inf means an empty partial; tokens at and after
`prefill_tokens_with_context` take the suffix; `output_lse=None` writes no LSE; an fp8
`output` is quantised with the per-tensor `output_scale` in the merge's store. Any array library
speaking DLPack works, not only torch; host arrays run on the CPU backend, CUDA arrays on the
caller's current stream. docs/compat.md lists what differs from vLLM.
"""

import math

from .. import _merge
from .._attnstate import Base, State
from .._arrays import error
from ._common import (check_ndim, check_shape, copy, raw_dtype_name, renamed, shape_of,
                      token_mask)

__all__ = ["merge_attn_states"]

_FN = "attnstate.compat.vllm.merge_attn_states"
_HEADS_TOKENS = "heads_tokens"  # vLLM's LSEs are (num_heads, num_tokens)


def merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse,
                      output_lse=None, prefill_tokens_with_context=None, output_scale=None):
    """`output = prefix ⊕ suffix` per (token, head), written in place.

    output, prefix_output, suffix_output: (num_tokens, num_heads, head_size), last dim
        contiguous, any other strides (a padded head stride included); output float32, float16,
        bfloat16, or fp8 (e4m3/e5m2) with `output_scale`.
    prefix_lse, suffix_lse: (num_heads, num_tokens) float32, natural log; +inf and -inf rows are
        empty. They are not modified (the +inf rows are marked on a copy of the LSEs).
    output_lse: None, or (num_heads, num_tokens) float32 that receives the merged LSE (for the
        tokens without context: suffix_lse).
    prefill_tokens_with_context: tokens [0, n) merge, tokens [n, num_tokens) copy the suffix
        (quantised when output is fp8); None: all tokens merge. A row empty on both sides, or
        without context and an empty suffix, is written as the empty state (0, -inf).
    output_scale: the per-tensor dequantisation scale of an fp8 output (stored = value / scale,
        saturated to the format's range); required for fp8, refused otherwise.
    Returns None.
    """
    fn = _FN
    tokens, heads, _ = check_ndim(output, 3, "(num_tokens, num_heads, head_size)", fn, "output")
    lses = [(prefix_lse, "prefix_lse"), (suffix_lse, "suffix_lse")]
    if output_lse is not None:
        lses.append((output_lse, "output_lse"))
    for lse, arg in lses:
        check_shape(lse, (heads, tokens), "(num_heads, num_tokens) as output's", fn, arg)
    with_context = tokens
    if prefill_tokens_with_context is not None:
        with_context = int(prefill_tokens_with_context)
        if with_context < 0 or with_context != prefill_tokens_with_context:
            raise error(fn, "prefill_tokens_with_context", "None or an int >= 0",
                        repr(prefill_tokens_with_context))
        with_context = min(with_context, tokens)
    fp8 = raw_dtype_name(output).startswith("float8")
    if fp8 and output_scale is None:
        raise error(fn, "output_scale", f"a scale for the {raw_dtype_name(output)} output",
                    "None")
    if output_scale is not None and not fp8:
        raise error(fn, "output_scale", "None for a non-fp8 output (dtype "
                    f"{raw_dtype_name(output)})", "a scale")

    # attnstate's merges take an LSE of +inf as invalid (NaN out, so that a bug upstream shows):
    # the empty rows are marked first, on copies of the LSEs (num_heads x num_tokens floats,
    # 1/head_size of the outputs), so that the caller's stay as they are, as vLLM leaves them.
    p_lse, s_lse = copy(prefix_lse), copy(suffix_lse)
    for o, lse, arg in ((prefix_output, p_lse, "prefix"), (suffix_output, s_lse, "suffix")):
        with renamed(fn, {"state": (arg + "_output", arg + "_lse")}):
            _merge.mark_empty_rows(State(o, lse, Base.NATURAL, lse_layout=_HEADS_TOKENS))
    scale = 1.0 if output_scale is None else _scalar(output_scale, fn, "output_scale")
    out = State(output, output_lse, Base.NATURAL, scale=scale, lse_layout=_HEADS_TOKENS)
    # a = suffix: where the mask is 0 the merge writes a (vLLM's tokens without context)
    mask = None if with_context == tokens else token_mask(output, tokens, with_context)
    states = {"a": ("suffix_output", "suffix_lse"), "b": ("prefix_output", "prefix_lse"),
              "out": ("output", "output_lse")}
    with renamed(fn, states, {"mask": "prefill_tokens_with_context"}):
        _merge.merge_state(State(suffix_output, s_lse, Base.NATURAL, lse_layout=_HEADS_TOKENS),
                           State(prefix_output, p_lse, Base.NATURAL, lse_layout=_HEADS_TOKENS),
                           out=out, mask=mask)


def _scalar(x, fn, arg):
    """A float from a Python number or a one-element array of any library (vLLM passes a
    one-element tensor)."""
    if isinstance(x, (int, float)):
        return float(x)
    shape = shape_of(x, fn, arg)
    if math.prod(shape) != 1:
        raise error(fn, arg, "a number or a one-element array", f"shape {shape}")
    return float(x.reshape(()))
