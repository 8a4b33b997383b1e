"""attnstate.compat.vllm.merge_attn_states: vLLM's call (head-major natural-log LSEs, +inf
rows, output_lse=None, prefill_tokens_with_context, output_scale, padded outputs, errors in the
caller's names) on NumPy and torch CPU arrays, against a float64 reference. The peer's own grid
is in test_peer_vllm_merge.py."""

import os
import runpy

import numpy as np
import pytest

import attnstate
from attnstate.compat.vllm import merge_attn_states
from peer_merge import LSE_TOL, Lib, cpu_libs, tolerance, vllm_reference

INF = float("inf")


def inputs(lib, tokens, heads, hs, dtype="float32", seed=0):
    rng = lib.rng(seed)
    p_lse = lib.normal(rng, (heads, tokens)) * 3
    s_lse = lib.normal(rng, (heads, tokens)) * 3
    p_lse[0, :: 3] = INF  # FlashAttention 2's empty rows
    s_lse[-1, 1:: 4] = INF
    p_o = lib.normal(rng, (tokens, heads, hs), dtype)
    s_o = lib.normal(rng, (tokens, heads, hs), dtype)
    return p_o, p_lse, s_o, s_lse


@pytest.mark.parametrize("lib", cpu_libs())
@pytest.mark.parametrize("head_size", [1, 5, 80, 112])
def test_merges_head_major_lses_with_inf_rows_and_leaves_the_inputs(lib, head_size):
    lib = Lib(lib)
    p_o, p_lse, s_o, s_lse = inputs(lib, 11, 3, head_size, "float16")
    before = [lib.copy(x) for x in (p_o, p_lse, s_o, s_lse)]
    output, output_lse = lib.nan((11, 3, head_size), "float16"), lib.nan((3, 11))
    assert merge_attn_states(output, p_o, p_lse, s_o, s_lse, output_lse) is None
    ref_o, ref_lse = vllm_reference(lib, p_o, p_lse, s_o, s_lse)
    lib.close(output, ref_o, *tolerance("float16"), "output")
    lib.close(output_lse, ref_lse, *LSE_TOL, "output_lse")
    for x, x0 in zip((p_o, p_lse, s_o, s_lse), before):
        lib.equal(x, x0, "an input was modified")


@pytest.mark.parametrize("lib", cpu_libs())
def test_writes_a_padded_output_and_reads_strided_inputs(lib):
    # an attention backend may pad the head stride of the output (vLLM's comment) or of the
    # partials; the LSEs may be views too
    lib = Lib(lib)
    p_o, p_lse, s_o, s_lse = inputs(lib, 9, 4, 32, seed=1)
    wide = lib.nan((9, 4, 48))
    output = wide[:, :, :32]
    p_wide = lib.nan((9, 4, 40))
    p_wide[:, :, 8:] = p_o
    lse_wide = lib.nan((4, 18))
    lse_wide[:, ::2] = s_lse
    output_lse = lib.nan((4, 9))
    merge_attn_states(output, p_wide[:, :, 8:], p_lse, s_o, lse_wide[:, ::2], output_lse)
    ref_o, ref_lse = vllm_reference(lib, p_o, p_lse, s_o, s_lse)
    lib.close(output, ref_o, *tolerance("float32"), "output")
    lib.close(output_lse, ref_lse, *LSE_TOL, "output_lse")
    assert bool(lib.xp.isnan(wide[:, :, 32:]).all()), "the padding was written"


@pytest.mark.parametrize("lib", cpu_libs())
@pytest.mark.parametrize("with_context", [0, 5, 9, 100], ids=lambda n: f"ctx{n}")
def test_prefill_tokens_with_context(lib, with_context):
    # tokens from `with_context` on take the suffix alone (an empty suffix row: (0, -inf)); a
    # count past the tokens merges all of them, as vLLM's `token_idx < n` does
    lib = Lib(lib)
    dtype = "bfloat16" if lib.name == "torch" else "float16"
    p_o, p_lse, s_o, s_lse = inputs(lib, 9, 3, 16, dtype, seed=2)
    output, output_lse = lib.nan((9, 3, 16), dtype), lib.nan((3, 9))
    merge_attn_states(output, p_o, p_lse, s_o, s_lse, output_lse, with_context)
    ref_o, ref_lse = vllm_reference(lib, p_o, p_lse, s_o, s_lse, with_context)
    lib.close(output, ref_o, *tolerance(dtype), "output")
    lib.close(output_lse, ref_lse, *LSE_TOL, "output_lse")


@pytest.mark.parametrize("lib", cpu_libs())
@pytest.mark.parametrize("with_context", [None, 4], ids=["all", "ctx4"])
def test_output_lse_none_writes_no_lse(lib, with_context):
    lib = Lib(lib)
    p_o, p_lse, s_o, s_lse = inputs(lib, 7, 2, 24, seed=3)
    output = lib.nan((7, 2, 24))
    merge_attn_states(output, p_o, p_lse, s_o, s_lse, None, with_context)
    lib.close(output, vllm_reference(lib, p_o, p_lse, s_o, s_lse, with_context)[0],
              *tolerance("float32"), "output")


@pytest.mark.parametrize("lib", cpu_libs())
@pytest.mark.parametrize("scale", [0.05, "array"])
def test_fp8_output_is_quantised_with_the_scale(lib, scale):
    lib = Lib(lib)
    p_o, p_lse, s_o, s_lse = inputs(lib, 8, 2, 32, seed=4)
    s_o[0, 0, 0] = 100.0  # 100 / 0.05 = 2000: saturates to 448
    output = lib.nan((8, 2, 32), "float8_e4m3fn")
    output_scale = lib.asarray(np.array([0.05], np.float32)) if scale == "array" else scale
    merge_attn_states(output, p_o, p_lse, s_o, s_lse, None, None, output_scale)
    ref_o = vllm_reference(lib, p_o, p_lse, s_o, s_lse)[0]
    want = lib.xp.clip(ref_o / 0.05, -448.0, 448.0) * 0.05
    lib.close(lib.f64(output) * 0.05, want, 2.0 ** -9 * 0.05, 2.0 ** -3, "fp8 output")


def test_errors_name_the_adapter_and_the_callers_argument():
    o = np.zeros((4, 2, 8), np.float32)
    lse = np.zeros((2, 4), np.float32)
    fn = r"^attnstate\.compat\.vllm\.merge_attn_states: "
    with pytest.raises(attnstate.Error, match=fn + r"argument 'suffix_lse': expected shape "
                                                   r"\(2, 4\)"):
        merge_attn_states(o, o, lse, o, lse.T.copy())
    with pytest.raises(attnstate.Error, match=fn + r"argument 'output': expected 3 dim"):
        merge_attn_states(o[0], o, lse, o, lse)
    with pytest.raises(attnstate.Error, match=fn + r"argument 'prefill_tokens_with_context'"):
        merge_attn_states(o, o, lse, o, lse, None, -1)
    with pytest.raises(attnstate.Error, match=fn + r"argument 'output_scale': expected None "
                                                   r"for a non-fp8 output"):
        merge_attn_states(o, o, lse, o, lse, None, None, 0.5)
    with pytest.raises(attnstate.Error, match=fn + r"argument 'prefix_output[.']"):
        merge_attn_states(o, o[:, :, :4], lse, o, lse, lse.copy())
    with pytest.raises(attnstate.Error, match=fn + r"argument 'output_lse': expected shape"):
        merge_attn_states(o, o, lse, o, lse, np.zeros((4, 2), np.float32))
    with pytest.raises(attnstate.Error, match=fn + r"argument 'output_lse': .*float32"):
        merge_attn_states(o, o, lse, o, lse, lse.astype(np.float16))


def test_the_docs_example_runs(capsys):
    # docs/compat.md shows regions of this example; it asserts both adapters against one pass
    here = os.path.dirname(os.path.abspath(__file__))
    runpy.run_path(os.path.join(here, "..", "examples", "compat_drop_in.py"), run_name="__main__")
    assert "adapters == one pass" in capsys.readouterr().out
