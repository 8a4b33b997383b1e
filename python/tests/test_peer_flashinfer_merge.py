"""FlashInfer's merge test cases on attnstate: each case through attnstate's own API and through
the drop-in `attnstate.compat.flashinfer` (merge_state, merge_state_in_place, merge_states),
against a float64 reference.

Ported (grids and input recipes; the code is this project's) from flashinfer-ai/flashinfer:
  tests/attention/test_cascade_mask.py @ 591de30a7e58b009743d116c326a796529469ed3
      (test_merge_state_in_place_mask_stride: mask strides 0-3 at a storage offset, patterns,
      CUDA graph replays reading the mask's current values)
  tests/attention/test_shared_prefix_kernels.py @ fb28d7242b3506a2348265962041acc1fb56cca4
      (test_merge_state_in_place_with_mask)
  tests/utils/test_triton_cascade.py @ fb28d7242b3506a2348265962041acc1fb56cca4
      (test_merge_state, test_merge_state_in_place, test_merge_states,
      test_variable_length_merge_states)
  tests/trace/test_merge_state_reference_correctness.py,
  tests/trace/test_merge_state_in_place_reference_correctness.py,
  tests/trace/test_merge_states_reference_correctness.py
      @ fb28d7242b3506a2348265962041acc1fb56cca4 (their shapes)
  src/test_cascade.cu @ bf3445fc9c79624ac58a24e099f75f38ca09501e (the C++ merge grids, removed
      after that commit: num_index_sets x seq_len x heads x head_dim x sparse LSEs, and the
      variable-length merge)
with the semantics of flashinfer/cascade.py and include/flashinfer/attention/cascade.cuh
@ fb28d7242b3506a2348265962041acc1fb56cca4: base-2 LSEs; a mask entry 0 keeps v and s; two
empty states merge to (0, -inf); num_states = 0 gives (0, -inf).

The variable-length merge is not among the adapter's functions: it runs through attnstate's
`merge_states_ragged` only. The GPU runs the peers' shapes; where a peer's shape is large, the
CPU runs a smaller one or a deterministic sample of the grid (said at each).
"""

import itertools
import random

import numpy as np
import pytest

import attnstate
from attnstate.compat import flashinfer as fi
from peer_merge import (LN2, LSE_TOL, Lib, base2_reference, cpu_libs, reference_merge,
                        requires_gpu, seed_of, tolerance)

APIS = ["attnstate", "compat"]
GPU = [pytest.param("cuda", marks=[pytest.mark.gpu, requires_gpu])]


def lib_name(lib):
    return lib.values[0] if hasattr(lib, "values") else lib


def cases(libs, rows):
    """pytest params (lib, api, *row) over libs x APIS x rows, with the libs' marks."""
    for lib, api, row in itertools.product(libs, APIS, rows):
        name = lib_name(lib)
        yield pytest.param(name, api, *row, marks=getattr(lib, "marks", ()),
                           id="-".join(str(x) for x in (name, api) + tuple(row)))


def check(lib, v, s, ref_v, ref_s, dtype, what):
    lib.close(v, ref_v, *tolerance(dtype), what + " v")
    lib.close(s, ref_s, *LSE_TOL, what + " s")


# ---- merge_state: two states, out of place -------------------------------------------------

# (seq_len, num_heads, head_dim, dtype): the trace tests' shapes and the Triton test's
MERGE_STATE_GPU = [(16, 4, 64, "float16"), (7, 2, 64, "float16"), (2048, 32, 128, "float16")]
MERGE_STATE_CPU = MERGE_STATE_GPU[:2] + [(256, 32, 128, "float16")]  # seq_len 2048 -> 256


def run_merge_state(lib_name, api, seq_len, heads, dim, dtype):
    lib = Lib(lib_name)
    rng = lib.rng(seed_of("merge_state", lib_name, seq_len, heads, dim, dtype))
    va, vb = (lib.normal(rng, (seq_len, heads, dim), dtype) for _ in range(2))
    sa, sb = (lib.normal(rng, (seq_len, heads)) for _ in range(2))
    if api == "compat":
        v, s = fi.merge_state(va, sa, vb, sb)
        assert v.dtype == va.dtype and tuple(v.shape) == (seq_len, heads, dim)
    else:
        out = attnstate.State(lib.nan((seq_len, heads, dim), dtype), lib.nan((seq_len, heads)),
                              "base2")
        attnstate.merge_state(attnstate.State(va, sa, "base2"), attnstate.State(vb, sb, "base2"),
                              out=out)
        v, s = out.o, out.lse
    check(lib, v, s, *base2_reference(lib, [va, vb], [sa, sb]), dtype, api)


@pytest.mark.parametrize("lib,api,seq_len,heads,dim,dtype",
                         list(cases(cpu_libs(), MERGE_STATE_CPU)))
def test_merge_state_cpu(lib, api, seq_len, heads, dim, dtype):
    run_merge_state(lib, api, seq_len, heads, dim, dtype)


@pytest.mark.parametrize("lib,api,seq_len,heads,dim,dtype", list(cases(GPU, MERGE_STATE_GPU)))
def test_merge_state_gpu(lib, api, seq_len, heads, dim, dtype):
    run_merge_state(lib, api, seq_len, heads, dim, dtype)


# ---- merge_state_in_place: masks -----------------------------------------------------------

def merge_in_place(lib, api, v, s, v_other, s_other, mask):
    if api == "compat":
        fi.merge_state_in_place(v, s, v_other, s_other, mask=mask)
    else:
        attnstate.merge_state_(attnstate.State(v, s, "base2"),
                               attnstate.State(v_other, s_other, "base2"), mask=mask)


def check_masked(lib, v, s, v0, s0, ref_v, ref_s, keep, dtype, what):
    """Rows where `keep` (host bool per position) hold v0/s0 bit for bit, the others the
    float64 merge."""
    keep = np.asarray(keep, bool)
    merged = np.flatnonzero(~keep)
    kept = np.flatnonzero(keep)
    if merged.size:
        i = lib.asarray(merged)
        check(lib, v[i], s[i], ref_v[i], ref_s[i], dtype, what + " merged rows")
    if kept.size:
        i = lib.asarray(kept)
        lib.equal(v[i], v0[i], what + " kept rows v")
        lib.equal(s[i], s0[i], what + " kept rows s")


# test_cascade_mask.py: dtypes x CUDA graph x mask stride x pattern (a broadcast mask has one
# value, so stride 0 runs all_true and all_false only); seq_len 17, 2 heads, head_dim 64
MASK_GRID = [(dtype, stride, pattern)
             for dtype, stride, pattern in itertools.product(
                 ["float16", "bfloat16"], [0, 1, 2, 3], ["all_true", "all_false", "alternating"])
             if not (stride == 0 and pattern == "alternating")]


def strided_mask(lib, seq_len, stride, pattern):
    """The peer's mask: a view at storage offset 1 with the given stride (0: one flag expanded),
    the padding opposite to the selected entries. Returns (storage, mask)."""
    fill = pattern == "all_false"
    storage = lib.asarray(np.full(1 + seq_len * max(stride, 1), fill))
    if stride == 0:
        storage[1] = pattern == "all_true"
        mask = (np.broadcast_to(storage[1:2], (seq_len,)) if lib.name == "numpy"
                else storage[1:2].expand(seq_len))
    else:
        mask = storage[1::stride]
        if pattern == "alternating":
            mask[:] = lib.asarray(np.arange(seq_len) % 2 == 0)
        else:
            mask[:] = pattern == "all_true"
    step = mask.strides[0] if lib.name == "numpy" else mask.stride(0)
    assert step == stride
    return storage, mask


def run_mask_stride(lib_name, api, dtype, stride, pattern, graph):
    lib = Lib(lib_name)
    seq_len = 17
    rng = lib.rng(seed_of("mask_stride", lib_name, dtype, stride, pattern))
    v0 = lib.normal(rng, (seq_len, 2, 64), dtype)
    s0 = lib.normal(rng, (seq_len, 2))
    v_other = lib.normal(rng, (seq_len, 2, 64), dtype)
    s_other = lib.normal(rng, (seq_len, 2))
    ref_v, ref_s = base2_reference(lib, [v0, v_other], [s0, s_other])
    storage, mask = strided_mask(lib, seq_len, stride, pattern)
    v, s = lib.copy(v0), lib.copy(s0)
    if graph:
        torch = lib.xp
        merge_in_place(lib, api, v, s, v_other, s_other, mask)  # warm up before the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            merge_in_place(lib, api, v, s, v_other, s_other, mask)
    for _ in range(2):
        v[...] = v0
        s[...] = s0
        if graph:
            g.replay()
        else:
            merge_in_place(lib, api, v, s, v_other, s_other, mask)
        keep = ~lib.host(mask).astype(bool)
        check_masked(lib, v, s, v0, s0, ref_v, ref_s, keep, dtype, api)
        # the next round reads the flipped values through the same view
        storage[...] = ~storage


@pytest.mark.parametrize("lib,api,dtype,stride,pattern",
                         list(cases(cpu_libs(), MASK_GRID)))
def test_merge_state_in_place_mask_stride_cpu(lib, api, dtype, stride, pattern):
    run_mask_stride(lib, api, dtype, stride, pattern, graph=False)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("lib,api,dtype,stride,pattern", list(cases(GPU, MASK_GRID)))
def test_merge_state_in_place_mask_stride_gpu(lib, api, dtype, stride, pattern, graph):
    run_mask_stride(lib, api, dtype, stride, pattern, graph)


def run_random_masks(lib_name, api, seq_len, heads, dim, tries):
    """test_shared_prefix_kernels.py: no mask, all ones, all zeros, then random masks."""
    lib = Lib(lib_name)
    rng = lib.rng(seed_of("random_masks", lib_name, seq_len, heads, dim))
    v0 = lib.normal(rng, (seq_len, heads, dim), "float16")
    s0 = lib.normal(rng, (seq_len, heads))
    v_other = lib.normal(rng, (seq_len, heads, dim), "float16")
    s_other = lib.normal(rng, (seq_len, heads))
    ref_v, ref_s = base2_reference(lib, [v0, v_other], [s0, s_other])
    masks = [None, np.ones(seq_len, bool), np.zeros(seq_len, bool)]
    draw = np.random.default_rng(seed_of("random_masks", seq_len))
    masks += [draw.random(seq_len) > 0.5 for _ in range(tries)]
    for m in masks:
        v, s = lib.copy(v0), lib.copy(s0)
        merge_in_place(lib, api, v, s, v_other, s_other, None if m is None else lib.asarray(m))
        keep = np.zeros(seq_len, bool) if m is None else ~m
        check_masked(lib, v, s, v0, s0, ref_v, ref_s, keep, "float16", api)


@pytest.mark.parametrize("lib,api", list(cases(cpu_libs(), [()])))
def test_merge_state_in_place_with_mask_cpu(lib, api):
    run_random_masks(lib, api, 512, 32, 128, tries=4)  # the peer's 50 random masks on the GPU


@pytest.mark.parametrize("lib,api", list(cases(GPU, [()])))
def test_merge_state_in_place_with_mask_gpu(lib, api):
    run_random_masks(lib, api, 512, 32, 128, tries=50)


# the trace tests' shapes and the Triton test's (no mask)
IN_PLACE_GPU = [(128, 32, 128), (17, 8, 64), (2048, 32, 128)]
IN_PLACE_CPU = IN_PLACE_GPU[:2] + [(256, 32, 128)]  # seq_len 2048 -> 256


@pytest.mark.parametrize("lib,api,seq_len,heads,dim", list(cases(cpu_libs(), IN_PLACE_CPU)))
def test_merge_state_in_place_cpu(lib, api, seq_len, heads, dim):
    run_random_masks(lib, api, seq_len, heads, dim, tries=0)


@pytest.mark.parametrize("lib,api,seq_len,heads,dim", list(cases(GPU, IN_PLACE_GPU)))
def test_merge_state_in_place_gpu(lib, api, seq_len, heads, dim):
    run_random_masks(lib, api, seq_len, heads, dim, tries=0)


# ---- merge_states: S states per position --------------------------------------------------

def is_prime(n):
    return n > 1 and all(n % k for k in range(2, int(n ** 0.5) + 1))


def stack_lse(lib, rng, seq_len, num_states, heads, sparse):
    """src/test_cascade.cu's LSEs: uniform in [-10, 10], or (sparse) +10 for the states of
    prime index and -10 for the others, so that a few states carry almost all the weight."""
    if not sparse:
        return lib.asarray((lib.host(lib.uniform(rng, (seq_len, num_states, heads))) * 20 - 10)
                           .astype(np.float32))
    col = np.array([10.0 if is_prime(i) else -10.0 for i in range(num_states)], np.float32)
    return lib.asarray(np.broadcast_to(col[None, :, None], (seq_len, num_states, heads)).copy())


def run_merge_states(lib_name, api, seq_len, num_states, heads, dim, sparse, dtype="float16"):
    lib = Lib(lib_name)
    rng = lib.rng(seed_of("merge_states", lib_name, seq_len, num_states, heads, dim, sparse))
    v = lib.normal(rng, (seq_len, num_states, heads, dim), dtype)
    s = stack_lse(lib, rng, seq_len, num_states, heads, sparse)
    if api == "compat":
        out_v, out_s = fi.merge_states(v, s)
        assert out_v.dtype == v.dtype and tuple(out_v.shape) == (seq_len, heads, dim)
    else:
        out = attnstate.State(lib.nan((seq_len, heads, dim), dtype), lib.nan((seq_len, heads)),
                              "base2")
        attnstate.merge_states(attnstate.State(v, s, "base2"), out=out)
        out_v, out_s = out.o, out.lse
    xp = lib.xp
    ref_v, ref_s = reference_merge(xp, xp.moveaxis(lib.f64(v), 1, 0),
                                   xp.moveaxis(lib.f64(s), 1, 0) * LN2)
    check(lib, out_v, out_s, ref_v, ref_s / LN2, dtype, api)


# (seq_len, num_states, heads, head_dim, sparse): the trace tests' and the Triton test's
MERGE_STATES_PEERS = [(16, 3, 4, 64, False), (7, 2, 2, 64, False), (2048, 100, 32, 128, False)]
# src/test_cascade.cu: num_index_sets x seq_len x num_heads x head_dim x sparse
MERGE_STATES_GRID = list(itertools.product([1, 2, 9, 81, 513], [4, 16, 77], [1, 21, 32],
                                           [64, 128, 256], [False, True]))
MERGE_STATES_GPU = [(t, n, h, d, sp) for n, t, h, d, sp in MERGE_STATES_GRID]


def merge_states_cpu_rows():
    """The trace shapes, the Triton shape with seq_len 2048 -> 8, and one (seq_len, heads) per
    (num_index_sets, head_dim, sparse) of the C++ grid, drawn with a fixed seed among the pairs
    of at most 2^20 input elements (every value of the grid appears)."""
    rows = MERGE_STATES_PEERS[:2] + [(8, 100, 32, 128, False)]
    for n, d, sp in itertools.product([1, 2, 9, 81, 513], [64, 128, 256], [False, True]):
        pairs = [(t, h) for t in [4, 16, 77] for h in [1, 21, 32] if n * t * h * d <= 1 << 20]
        t, h = random.Random(seed_of(n, d, sp)).choice(pairs)
        rows.append((t, n, h, d, sp))
    return rows


@pytest.mark.parametrize("lib,api,seq_len,num_states,heads,dim,sparse",
                         list(cases(cpu_libs(), merge_states_cpu_rows())))
def test_merge_states_cpu(lib, api, seq_len, num_states, heads, dim, sparse):
    run_merge_states(lib, api, seq_len, num_states, heads, dim, sparse)


@pytest.mark.parametrize("lib,api,seq_len,num_states,heads,dim,sparse",
                         list(cases(GPU, MERGE_STATES_PEERS + MERGE_STATES_GPU)))
def test_merge_states_gpu(lib, api, seq_len, num_states, heads, dim, sparse):
    run_merge_states(lib, api, seq_len, num_states, heads, dim, sparse)


@pytest.mark.parametrize("lib,api", list(cases(cpu_libs() + GPU, [()])))
def test_merge_states_of_no_state_is_the_empty_state(lib, api):
    # cascade.cuh: num_index_sets == 0 writes v = 0 and s = -inf
    run_merge_states(lib, api, 5, 0, 3, 64, False)


def run_two_empty_states(lib_name, api):
    # cascade.cuh: max() drops the NaN of (-inf) - (-inf); the merged output is 0, s = -inf
    lib = Lib(lib_name)
    v0 = lib.nan((4, 2, 64), "float16")  # an empty state's v is never read
    s0 = lib.full((4, 2), -float("inf"))
    if api == "compat":
        v, s = fi.merge_state(v0, s0, lib.copy(v0), lib.copy(s0))
    else:
        out = attnstate.merge_state(attnstate.State(v0, s0, "base2"),
                                    attnstate.State(lib.copy(v0), lib.copy(s0), "base2"))
        v, s = out.o, out.lse
    lib.equal(v, lib.full((4, 2, 64), 0.0, "float16"), api + " v")
    lib.equal(s, s0, api + " s")


@pytest.mark.parametrize("lib,api", list(cases(cpu_libs() + GPU, [()])))
def test_two_empty_states_merge_to_the_empty_state(lib, api):
    run_two_empty_states(lib, api)


# ---- variable-length merge (attnstate.merge_states_ragged) ---------------------------------

def run_ragged(lib_name, seq_len, heads, dim, sparse, max_sets=512):
    """test_variable_length_merge_states / src/test_cascade.cu: position i merges lengths[i] in
    [1, max_sets) rows; fp16 v, base-2 LSEs."""
    lib = Lib(lib_name)
    seed = seed_of("ragged", lib_name, seq_len, heads, dim, sparse)
    draw = np.random.default_rng(seed)
    lengths = draw.integers(1, max_sets, seq_len)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    rows = int(indptr[-1])
    rng = lib.rng(seed)
    v = lib.normal(rng, (rows, heads, dim), "float16")
    if sparse:  # the C++ recipe: +10 for the prime-index rows of a position, else -10
        col = np.concatenate([[10.0 if is_prime(i) else -10.0 for i in range(n)]
                              for n in lengths]).astype(np.float32)
        s = lib.asarray(np.repeat(col[:, None], heads, 1))
    else:
        s = lib.asarray((lib.host(lib.uniform(rng, (rows, heads))) * 20 - 10).astype(np.float32))
    out = attnstate.State(lib.nan((seq_len, heads, dim), "float16"), lib.nan((seq_len, heads)),
                          "base2")
    attnstate.merge_states_ragged(attnstate.State(v, s, "base2"), lib.asarray(indptr), out=out)
    xp = lib.xp
    for b in range(0, seq_len, 64):  # the reference a few positions at a time (memory)
        e = min(seq_len, b + 64)
        n = int(lengths[b:e].max())
        pad_v = xp.zeros((n, e - b, heads, dim), dtype=xp.float64) if lib.name == "numpy" else \
            xp.zeros((n, e - b, heads, dim), dtype=xp.float64, device=lib.device)
        pad_s = pad_v[..., 0] - float("inf")
        for j in range(b, e):
            r0, r1 = int(indptr[j]), int(indptr[j + 1])
            pad_v[:r1 - r0, j - b] = lib.f64(v[r0:r1])
            pad_s[:r1 - r0, j - b] = lib.f64(s[r0:r1]) * LN2
        ref_v, ref_s = reference_merge(xp, pad_v, pad_s)
        check(lib, out.o[b:e], out.lse[b:e], ref_v, ref_s / LN2, "float16", "ragged")


# src/test_cascade.cu: seq_len x num_heads x head_dim x sparse; the Triton test's shape
RAGGED_GRID = list(itertools.product([1, 3, 77, 191], [1, 4, 32], [64, 128, 256], [False, True]))


def ragged_cpu_rows():
    """One (seq_len, heads) per (head_dim, sparse) of the C++ grid, drawn with a fixed seed
    among the pairs of seq_len x heads x head_dim <= 2^13 (with 256 rows per position on
    average: about 2^21 input elements at most)."""
    out = []
    for d, sp in itertools.product([64, 128, 256], [False, True]):
        pairs = [(t, h) for t in [1, 3, 77, 191] for h in [1, 4, 32] if t * h * d <= 1 << 13]
        t, h = random.Random(seed_of("ragged", d, sp)).choice(pairs)
        out.append((t, h, d, sp))
    return out


@pytest.mark.parametrize("lib", cpu_libs())
@pytest.mark.parametrize("seq_len,heads,dim,sparse", ragged_cpu_rows())
def test_variable_length_merge_states_cpu(lib, seq_len, heads, dim, sparse):
    run_ragged(lib, seq_len, heads, dim, sparse)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("seq_len,heads,dim,sparse", RAGGED_GRID + [(2048, 32, 128, False)])
def test_variable_length_merge_states_gpu(seq_len, heads, dim, sparse):
    run_ragged("cuda", seq_len, heads, dim, sparse)
