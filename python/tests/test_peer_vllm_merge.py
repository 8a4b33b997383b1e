"""vLLM's merge test cases on attnstate: each case through attnstate's own API and through the
drop-in `attnstate.compat.vllm.merge_attn_states`, against a float64 reference.

Ported (the grid and the input recipe; the code is this project's) from
  vllm-project/vllm tests/kernels/attention/test_merge_attn_states.py
      @ 073c5a8703eddcdad21e4e4d9eed20ce4ad38dbd (test_merge_attn_states)
with the semantics of
  vllm-project/vllm vllm/v1/attention/ops/merge_attn_states.py
      @ 15a3fd47ef45622a355ab7be62035231891f5e44 (arguments, prefill_tokens_with_context)
  vllm-project/vllm vllm/v1/attention/ops/triton_merge_attn_states.py
      @ 01ac819c1d476d2d0afdd0693bf41ddace2d4c5a and csrc/attention/merge_attn_states.cu
      (+inf LSE = empty; tokens without context copy the suffix and its LSE as given; fp8 stores
      value / scale saturated; both partials empty gives LSE -inf).
Not ported: test_mask_empty_context_lse (vLLM's own LSE-masking utility, not a merge).

The peer compares its CUDA kernel with its Triton kernel; here each case is checked against the
float64 merge of the very inputs (fresh random inputs per case, outputs poisoned with NaN).
The GPU runs the peer's whole grid (2,592 cases per API); the CPU a deterministic sample of it
(cpu_sample) to keep the CPU suite short. The documented differences (docs/compat.md) are in
the reference and tested as such: where no partial is left (both empty, or a token without
context whose suffix is empty) attnstate writes the empty state (0, -inf), where vLLM's CUDA
kernel copies prefix_output (expected to be zero), or suffix_output and its LSE as given.
"""

import itertools
import random

import numpy as np
import pytest

import attnstate
from attnstate.compat.vllm import merge_attn_states
from peer_merge import (LSE_TOL, Lib, cpu_libs, requires_gpu, seed_of, tolerance,
                        vllm_reference)

NUM_BATCH_TOKENS = [256, 512, 613, 1024, 1536, 4096]
NUM_QUERY_HEADS = [4, 8, 16, 32, 48, 64]
HEAD_SIZES = [32, 48, 64, 96, 128, 256]
DTYPES = ["float32", "float16", "bfloat16"]
USE_FP8 = [False, True]
PREFILL_TOKENS_WITH_CONTEXT = [None, 128]
FP8_SCALE = 0.05  # the peer's output_scale
FP8_MAX = 448.0  # float8_e4m3fn
APIS = ["attnstate", "compat"]


def grid_cases(libs, shapes):
    """pytest params of (lib, api, tokens, heads, head_size, dtype, use_fp8, with_context)."""
    for lib, api, (tokens, heads, hs, dtype, fp8, ctx) in itertools.product(libs, APIS, shapes):
        name = lib.values[0] if hasattr(lib, "values") else lib
        yield pytest.param(name, api, tokens, heads, hs, dtype, fp8, ctx,
                           marks=getattr(lib, "marks", ()),
                           id=f"{name}-{api}-T{tokens}-H{heads}-D{hs}-{dtype}-fp8{int(fp8)}"
                              f"-ctx{ctx}")


FULL_GRID = list(itertools.product(NUM_BATCH_TOKENS, NUM_QUERY_HEADS, HEAD_SIZES, DTYPES, USE_FP8,
                                   PREFILL_TOKENS_WITH_CONTEXT))


def cpu_sample():
    """One (tokens, heads) per (head size, dtype, fp8, context) of the peer's grid, drawn with
    a fixed seed among the pairs of at most 2^18 output elements (every head size, dtype and
    mode of the peer runs on the CPU), and the counts that bound leaves out (4096 tokens, 48
    and 64 heads) once each at head size 32: a few seconds of CPU in all."""
    out = []
    for hs, dtype, fp8, ctx in itertools.product(HEAD_SIZES, DTYPES, USE_FP8,
                                                 PREFILL_TOKENS_WITH_CONTEXT):
        pairs = [(t, h) for t in NUM_BATCH_TOKENS for h in NUM_QUERY_HEADS if t * h * hs <= 1 << 18]
        t, h = random.Random(seed_of(hs, dtype, fp8, ctx)).choice(pairs)
        out.append((t, h, hs, dtype, fp8, ctx))
    return out + [(4096, 4, 32, "bfloat16", False, 128), (256, 48, 32, "float16", True, None),
                  (256, 64, 32, "float32", False, 128)]


def make_inputs(lib, tokens, heads, hs, dtype, seed):
    """The peer's recipe: LSEs ~ N(0, 1) with 10% of the entries +inf in each, never both at one
    position; outputs ~ N(0, 1) in the input dtype."""
    rng = lib.rng(seed)
    p_lse = lib.normal(rng, (heads, tokens))
    s_lse = lib.normal(rng, (heads, tokens))
    mark_p = lib.uniform(rng, (heads, tokens)) < 0.1
    mark_s = lib.uniform(rng, (heads, tokens)) < 0.1
    both = mark_p & mark_s
    p_lse[mark_p & ~both] = float("inf")
    s_lse[mark_s & ~both] = float("inf")
    p_o = lib.normal(rng, (tokens, heads, hs), dtype)
    s_o = lib.normal(rng, (tokens, heads, hs), dtype)
    return p_o, p_lse, s_o, s_lse


def check_output(lib, output, output_lse, ref_o, ref_lse, dtype, use_fp8, what):
    if use_fp8:
        # compared as values (stored * scale) with the reference quantised the same way: within
        # one e4m3 step (2^-3 relative; 2^-9 * scale among the subnormals)
        xp = lib.xp
        want = xp.clip(ref_o / FP8_SCALE, -FP8_MAX, FP8_MAX) * FP8_SCALE
        lib.close(lib.f64(output) * FP8_SCALE, want, 2.0 ** -9 * FP8_SCALE, 2.0 ** -3, what)
    else:
        lib.close(output, ref_o, *tolerance(dtype), what + " output")
    if output_lse is not None:
        lib.close(output_lse, ref_lse, *LSE_TOL, what + " output_lse")


def run_attnstate(lib, output, output_lse, p_o, p_lse, s_o, s_lse, with_context, scale):
    """The same merge written with attnstate's own API (what the adapter does for an engine),
    the head-major LSEs spelled as (tokens, heads) transposed views here (the adapter names
    the layout instead: lse_layout="heads_tokens")."""
    tokens = p_o.shape[0]
    n = tokens if with_context is None else min(with_context, tokens)
    p_lse, s_lse = lib.copy(p_lse).T, lib.copy(s_lse).T  # +inf marked on copies
    attnstate.mark_empty_rows(attnstate.State(p_o, p_lse, "natural"))
    attnstate.mark_empty_rows(attnstate.State(s_o, s_lse, "natural"))
    out = attnstate.State(output, output_lse.T, "natural", scale=1.0 if scale is None else scale)
    mask = None if n == tokens else lib.asarray(np.arange(tokens) < n)
    attnstate.merge_state(attnstate.State(s_o, s_lse, "natural"),
                          attnstate.State(p_o, p_lse, "natural"), out=out, mask=mask)


def run_case(lib_name, api, tokens, heads, hs, dtype, use_fp8, with_context):
    lib = Lib(lib_name)
    seed = seed_of(lib_name, tokens, heads, hs, dtype, use_fp8, with_context)
    p_o, p_lse, s_o, s_lse = make_inputs(lib, tokens, heads, hs, dtype, seed)
    out_dtype = "float8_e4m3fn" if use_fp8 else dtype
    output = lib.nan((tokens, heads, hs), out_dtype)
    output_lse = lib.nan((heads, tokens))
    p_lse_in, s_lse_in = lib.copy(p_lse), lib.copy(s_lse)
    if api == "compat":
        scale = lib.asarray(np.array([FP8_SCALE], np.float32)) if use_fp8 else None
        merge_attn_states(output, p_o, p_lse, s_o, s_lse, output_lse, with_context, scale)
    else:
        run_attnstate(lib, output, output_lse, p_o, p_lse, s_o, s_lse, with_context,
                      FP8_SCALE if use_fp8 else None)
    ref_o, ref_lse = vllm_reference(lib, p_o, p_lse, s_o, s_lse, with_context)
    check_output(lib, output, output_lse, ref_o, ref_lse, dtype, use_fp8, api)
    # the inputs' +inf marks stay as the caller wrote them
    lib.equal(p_lse, p_lse_in, "prefix_lse unchanged")
    lib.equal(s_lse, s_lse_in, "suffix_lse unchanged")


@pytest.mark.parametrize("lib,api,tokens,heads,hs,dtype,use_fp8,with_context",
                         list(grid_cases(cpu_libs(), cpu_sample())))
def test_merge_attn_states_cpu(lib, api, tokens, heads, hs, dtype, use_fp8, with_context):
    run_case(lib, api, tokens, heads, hs, dtype, use_fp8, with_context)


@pytest.mark.parametrize("lib,api,tokens,heads,hs,dtype,use_fp8,with_context",
                         list(grid_cases(["cuda"], FULL_GRID)))
@pytest.mark.gpu
@requires_gpu
def test_merge_attn_states_gpu(lib, api, tokens, heads, hs, dtype, use_fp8, with_context):
    run_case(lib, api, tokens, heads, hs, dtype, use_fp8, with_context)


def run_both_empty(lib_name, api):
    """The documented difference: where both partials are empty (+inf or -inf in each), vLLM's
    CUDA kernel copies prefix_output (expected to be zero) with LSE -inf, its Triton kernel
    gives NaN; attnstate writes the empty state (0, -inf) whatever prefix_output holds."""
    lib = Lib(lib_name)
    inf = float("inf")
    heads, hs = 3, 32
    # tokens 0-3: both empty in each combination; 4: both finite; 5, 6: one of them empty
    p_row = [inf, -inf, inf, -inf, 0.5, 1.5, inf]
    s_row = [inf, -inf, -inf, inf, -0.25, inf, 2.0]
    p_lse = lib.asarray(np.array([p_row] * heads, np.float32))
    s_lse = lib.asarray(np.array([s_row] * heads, np.float32))
    rng = lib.rng(seed_of("both_empty", lib_name))
    p_o = lib.normal(rng, (7, heads, hs))
    s_o = lib.normal(rng, (7, heads, hs))
    output, output_lse = lib.nan((7, heads, hs)), lib.nan((heads, 7))
    if api == "compat":
        merge_attn_states(output, p_o, p_lse, s_o, s_lse, output_lse)
    else:
        run_attnstate(lib, output, output_lse, p_o, p_lse, s_o, s_lse, None, None)
    lib.equal(output[:4], lib.full((4, heads, hs), 0.0), "both empty: o = 0")
    lib.equal(output_lse[:, :4], lib.full((heads, 4), -inf), "both empty: lse = -inf")
    ref_o, ref_lse = vllm_reference(lib, p_o, p_lse, s_o, s_lse, None)
    check_output(lib, output, output_lse, ref_o, ref_lse, "float32", False, api)


def both_empty_params(libs):
    for lib in libs:
        for api in APIS:
            name = lib.values[0] if hasattr(lib, "values") else lib
            yield pytest.param(name, api, marks=getattr(lib, "marks", ()), id=f"{name}-{api}")


@pytest.mark.parametrize("lib,api", list(both_empty_params(cpu_libs())))
def test_both_partials_empty_give_the_empty_state_cpu(lib, api):
    run_both_empty(lib, api)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("lib,api", list(both_empty_params(["cuda"])))
def test_both_partials_empty_give_the_empty_state_gpu(lib, api):
    run_both_empty(lib, api)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("head_size", HEAD_SIZES)
@pytest.mark.parametrize("with_context,use_fp8", [
    (None, False), (128, False), (128, True)])
def test_merge_attn_states_in_a_cuda_graph(head_size, with_context, use_fp8):
    """The adapter captured in a CUDA graph (its LSE copies, masks and merges included) and
    replayed on new inputs written into the captured ones. The scale is a Python float: a
    one-element CUDA tensor is read on the host, which a capture forbids."""
    lib = Lib("cuda")
    torch = lib.xp
    tokens, heads, dtype = 1024, 16, "bfloat16"
    static = make_inputs(lib, tokens, heads, head_size, dtype, seed_of("graph", head_size, 0))
    out_dtype = "float8_e4m3fn" if use_fp8 else dtype
    output, output_lse = lib.nan((tokens, heads, head_size), out_dtype), lib.nan((heads, tokens))
    scale = FP8_SCALE if use_fp8 else None
    merge_attn_states(output, *static, output_lse, with_context, scale)  # warm-up
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        merge_attn_states(output, *static, output_lse, with_context, scale)
    for replay in (1, 2):
        fresh = make_inputs(lib, tokens, heads, head_size, dtype, seed_of("graph", head_size,
                                                                        replay))
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        output.fill_(float("nan"))
        output_lse.fill_(float("nan"))
        g.replay()
        ref_o, ref_lse = vllm_reference(lib, *fresh, with_context)
        check_output(lib, output, output_lse, ref_o, ref_lse, dtype, use_fp8, "graph")
