"""attnstate.cp_merge_simulated (every rank of a context-parallel merge in one process) on NumPy
arrays: against a float64 reference of ⊕ over the ranks, bitwise against attnstate.merge_states
for the all-to-all algorithm, uneven head slices, empty shards holding NaN, mixed bases, sinks
merged once, and the argument errors."""

import math

import numpy as np
import pytest

import attnstate

LN2 = math.log(2.0)
ALGORITHMS = ("all_to_all", "all_gather_lse")
OUTPUTS = ("head_sharded", "replicated")


def rank_states(rng, n, tokens, heads, head_dim, *, dtype="float32", bases=("natural",),
                empty=0.2, empty_ranks=()):
    """n States: rank r in base bases[r % len(bases)]; a fraction `empty` of the (token, head)
    rows, and every row of the ranks in `empty_ranks`, empty (lse -inf, o NaN garbage)."""
    out = []
    for r in range(n):
        o = rng.standard_normal((tokens, heads, head_dim)).astype(np.float32)
        lse = (rng.standard_normal((tokens, heads)) * 3).astype(np.float32)
        gone = rng.random((tokens, heads)) < empty
        if r in empty_ranks:
            gone[...] = True
        lse[gone] = -np.inf
        o[gone] = np.nan
        base = bases[r % len(bases)]
        if base == "base2":
            lse = (lse / np.float32(LN2)).astype(np.float32)
        out.append(attnstate.State(o.astype(dtype), lse, base))
    return out


def natural64(s):
    lse = s.lse.astype(np.float64)
    return s.o.astype(np.float64), (lse * LN2 if s.base == attnstate.Base.BASE2 else lse)


def reference(states, sinks=None):
    """⊕ over the states in float64 (natural-base LSE), then the sinks once."""
    os_, lses = zip(*(natural64(s) for s in states))
    o, lse = np.stack(os_), np.stack(lses)
    if sinks is not None:
        o = np.concatenate([o, np.zeros_like(o[:1])])
        lse = np.concatenate([lse, np.broadcast_to(sinks.astype(np.float64), lse.shape[1:])[None]])
    m = lse.max(axis=0)
    m0 = np.where(np.isneginf(m), 0.0, m)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(np.isneginf(lse), 0.0, np.exp(lse - m0))
        total = w.sum(axis=0)
        num = np.where(w[..., None] > 0, w[..., None] * np.nan_to_num(o, nan=0.0), 0.0).sum(0)
        out_o = np.where(total[..., None] > 0, num / total[..., None], 0.0)
        out_lse = m0 + np.log(total)
    return out_o, out_lse


def sliced(out_o, out_lse, bounds, r, output):
    if output == "replicated":
        return out_o, out_lse
    return out_o[:, bounds[r]:bounds[r + 1]], out_lse[:, bounds[r]:bounds[r + 1]]


def assert_close(state, want_o, want_lse, tol):
    got_o, got_lse = natural64(state)
    np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(got_lse[fin], want_lse[fin], rtol=tol, atol=tol)
    np.testing.assert_allclose(got_o, want_o, rtol=tol, atol=tol)


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view({4: np.uint32, 2: np.uint16}[a.dtype.itemsize])


@pytest.mark.parametrize("algorithm,output,n,heads", [
    (a, o, n, h) for a in ALGORITHMS for o in OUTPUTS
    for n, h in [(1, 4), (2, 4), (3, 7), (4, 8), (5, 5), (8, 13)]
    if not (a == "all_gather_lse" and o == "head_sharded" and h % n)])  # that one: an error
def test_against_float64_reference(algorithm, output, n, heads):
    rng = np.random.default_rng(n * 100 + heads)
    states = rank_states(rng, n, 6, heads, 16, bases=("natural", "base2"))
    outs = attnstate.cp_merge_simulated(states, algorithm=algorithm, output=output)
    want_o, want_lse = reference(states)
    bounds = attnstate.head_bounds(heads, n)
    assert len(outs) == n
    for r, out in enumerate(outs):
        assert out.base == states[r].base  # default: each rank's own base
        h = heads if output == "replicated" else bounds[r + 1] - bounds[r]
        assert out.o.shape == (6, h, 16) and out.lse.shape == (6, h)
        assert_close(out, *sliced(want_o, want_lse, bounds, r, output), 2e-5)


def test_head_bounds():
    assert attnstate.head_bounds(7, 3) == [0, 2, 4, 7]
    assert attnstate.head_bounds(8, 4) == [0, 2, 4, 6, 8]
    assert attnstate.head_bounds(5, 5) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("wire_base", ["natural", "base2"])
@pytest.mark.parametrize("dtype,out_dtype", [("float32", "float32"), ("float16", "float32"),
                                             ("float32", "float16"), ("float16", "float16")])
@pytest.mark.parametrize("out_base", ["natural", "base2"])
@pytest.mark.parametrize("n,heads", [(1, 3), (2, 5), (3, 7), (4, 6)])
def test_all_to_all_is_bitwise_merge_states(output, wire_base, dtype, out_dtype, out_base, n,
                                            heads):
    rng = np.random.default_rng(7 * n + heads)
    states = rank_states(rng, n, 5, heads, 8, dtype=dtype, bases=("base2", "natural"))
    outs = attnstate.cp_merge_simulated(states, output=output, wire_base=wire_base,
                                        out_dtype=out_dtype, out_base=out_base)
    # the ranks' states converted to the wire base, merged per owner's head slice
    wire = [attnstate.rebase(s, wire_base) for s in states]
    bounds = attnstate.head_bounds(heads, n)
    slices = []
    for r in range(n):
        b0, b1 = bounds[r], bounds[r + 1]
        stack = attnstate.State(np.stack([w.o[:, b0:b1] for w in wire]),
                                np.stack([w.lse[:, b0:b1] for w in wire]), wire_base)
        if output == "head_sharded":
            slices.append(attnstate.merge_states(stack, order="states_major", dtype=out_dtype,
                                                 base=out_base))
        else:  # merged in the wire base, then written in the output's base
            mine = attnstate.merge_states(stack, order="states_major", dtype=out_dtype)
            slices.append(attnstate.rebase(mine, out_base))
    for r, out in enumerate(outs):
        if output == "head_sharded":
            want_o, want_lse = slices[r].o, slices[r].lse
        else:
            want_o = np.concatenate([s.o for s in slices], axis=1)
            want_lse = np.concatenate([s.lse for s in slices], axis=1)
        assert out.o.dtype == np.dtype(out_dtype)
        np.testing.assert_array_equal(bits(out.o), bits(want_o))
        np.testing.assert_array_equal(bits(out.lse), bits(want_lse))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("output", OUTPUTS)
def test_empty_shards_with_nan_garbage(algorithm, output):
    n, heads, tokens, d = 4, 8, 5, 8
    rng = np.random.default_rng(3)
    # ranks 1 and 3 hold no keys at all (NaN o), and every rank is empty for token 0
    states = rank_states(rng, n, tokens, heads, d, empty=0.3, empty_ranks=(1, 3))
    for s in states:
        s.lse[0] = -np.inf
        s.o[0] = np.nan
    outs = attnstate.cp_merge_simulated(states, algorithm=algorithm, output=output)
    want_o, want_lse = reference(states)
    bounds = attnstate.head_bounds(heads, n)
    for r, out in enumerate(outs):
        assert not np.isnan(out.o).any()
        assert np.all(out.o[0] == 0) and np.all(np.isneginf(out.lse[0]))  # (0, -inf)
        assert_close(out, *sliced(want_o, want_lse, bounds, r, output), 2e-5)
    # a single rank that alone holds keys: the others' NaN garbage never reaches the output
    only = rank_states(rng, n, tokens, heads, d, empty=0.0, empty_ranks=(0, 1, 3))
    for r, out in enumerate(attnstate.cp_merge_simulated(only, algorithm=algorithm,
                                                         output=output)):
        want = sliced(only[2].o, only[2].lse, bounds, r, output)
        np.testing.assert_allclose(out.o, want[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(out.lse, want[1], rtol=1e-6, atol=1e-6)


def test_nan_in_a_non_empty_state_propagates():
    states = rank_states(np.random.default_rng(4), 2, 3, 4, 8, empty=0.0)
    states[1].o[1, 2, 3] = np.nan
    for algorithm in ALGORITHMS:
        out = attnstate.cp_merge_simulated(states, algorithm=algorithm, output="replicated")[0]
        assert np.isnan(out.o[1, 2]).any()
        assert not np.isnan(np.delete(out.o.reshape(-1, 8), 1 * 4 + 2, axis=0)).any()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("output", OUTPUTS)
def test_sinks_merged_once(algorithm, output):
    n, heads = 3, 6
    rng = np.random.default_rng(11)
    states = rank_states(rng, n, 4, heads, 8, bases=("natural", "base2"))
    states[0].lse[1] = -np.inf  # a row no rank has keys for: becomes (0, sink)
    states[1].lse[1] = -np.inf
    states[2].lse[1] = -np.inf
    sinks = rng.standard_normal(heads).astype(np.float32)
    outs = attnstate.cp_merge_simulated(states, algorithm=algorithm, output=output, sinks=sinks)
    want_o, want_lse = reference(states, sinks)
    sink_rank = attnstate.State(np.zeros_like(states[0].o),
                                np.broadcast_to(sinks, (4, heads)).copy(), "natural")
    _, twice_lse = reference(states + [sink_rank], sinks)  # the sink counted twice
    bounds = attnstate.head_bounds(heads, n)
    for r, out in enumerate(outs):
        assert_close(out, *sliced(want_o, want_lse, bounds, r, output), 2e-5)
        _, got_lse = natural64(out)
        _, twice = sliced(want_o, twice_lse, bounds, r, output)
        assert np.all(np.abs(got_lse - twice) > 1e-3)
        _, own_sinks = sliced(want_o, sinks[None].astype(np.float64), bounds, r, output)
        np.testing.assert_allclose(got_lse[1], own_sinks[0], rtol=1e-6)  # (0, sink)
        assert np.all(out.o[1] == 0)


def test_outs_given():
    states = rank_states(np.random.default_rng(5), 2, 3, 4, 8)
    outs = [attnstate.State(np.full((3, 2, 8), 7, np.float32), np.zeros((3, 2), np.float32),
                            "base2") for _ in range(2)]
    got = attnstate.cp_merge_simulated(states, outs=outs)
    assert got[0] is outs[0] and got[1] is outs[1]
    want_o, want_lse = reference(states)
    assert_close(outs[1], want_o[:, 2:], want_lse[:, 2:], 2e-5)


def test_strided_inputs():
    rng = np.random.default_rng(6)
    states = rank_states(rng, 3, 4, 6, 8)
    strided = [attnstate.State(np.ascontiguousarray(s.o.transpose(1, 0, 2)).transpose(1, 0, 2),
                               np.ascontiguousarray(s.lse.T).T, s.base) for s in states]
    for algorithm in ALGORITHMS:
        a = attnstate.cp_merge_simulated(states, algorithm=algorithm)
        b = attnstate.cp_merge_simulated(strided, algorithm=algorithm)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x.o, y.o)
            np.testing.assert_array_equal(x.lse, y.lse)


def error_of(fn):
    with pytest.raises(attnstate.Error) as e:
        fn()
    return str(e.value)


def test_errors():
    sim = attnstate.cp_merge_simulated
    rng = np.random.default_rng(8)
    s3 = rank_states(rng, 3, 2, 6, 8)
    assert "'states'" in error_of(lambda: sim([]))
    assert "'states[1]'" in error_of(lambda: sim([s3[0], (s3[1].o, s3[1].lse)]))
    assert "'algorithm'" in error_of(lambda: sim(s3, algorithm="ring"))
    assert "'output'" in error_of(lambda: sim(s3, output="sharded"))
    msg = error_of(lambda: sim(rank_states(rng, 4, 2, 3, 8)))
    assert "'heads'" in msg and "at least the world size 4" in msg
    msg = error_of(lambda: sim(rank_states(rng, 4, 2, 6, 8), algorithm="all_gather_lse"))
    assert "'heads'" in msg and "multiple of the world size 4" in msg
    sim(rank_states(rng, 4, 2, 6, 8), algorithm="all_gather_lse", output="replicated")  # fine
    other = rank_states(rng, 1, 2, 5, 8)[0]
    msg = error_of(lambda: sim([s3[0], other, s3[2]]))
    assert "'states[1].o'" in msg and "6 heads (as states[0])" in msg
    half = attnstate.State(s3[1].o.astype(np.float16), s3[1].lse, "natural")
    msg = error_of(lambda: sim([s3[0], half, s3[2]]))
    assert "'states[1].o'" in msg and "dtype f32" in msg
    assert "'sinks'" in error_of(lambda: sim(s3, sinks=np.zeros(5, np.float32)))
    assert "'sinks'" in error_of(lambda: sim(s3, sinks=np.zeros(6, np.float64)))
    bad = np.zeros(6, np.float32)
    bad[2] = np.inf
    assert "sinks.logits[2]" in error_of(lambda: sim(s3, sinks=bad))
    assert "'wire_base'" in error_of(lambda: sim(s3, wire_base="e"))
    assert "'out_dtype'" in error_of(lambda: sim(s3, out_dtype="int8"))
    assert "'out_base'" in error_of(lambda: sim(s3, out_base="ten"))
    assert "'outs'" in error_of(lambda: sim(s3, outs=[]))
    wrong = [attnstate.State(np.zeros((2, 6, 8), np.float32), np.zeros((2, 6), np.float32),
                             "natural") for _ in range(3)]
    assert "outs[0].heads" in error_of(lambda: sim(s3, outs=wrong))  # sharded: 2 heads each
    same = [attnstate.State(s.o, s.lse, "natural") for s in s3]  # outputs over the inputs
    assert "outs[0]" in error_of(lambda: sim(s3, outs=same, output="replicated"))
