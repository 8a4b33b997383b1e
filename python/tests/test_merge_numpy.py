"""The merges on NumPy arrays (CPU backend) against a float64 reference."""

import numpy as np
import pytest

import attnstate
from helpers import reference_state

rng = np.random.default_rng(7)


def problem(tokens=5, heads=4, heads_kv=2, d=16, keys=40):
    q = rng.standard_normal((tokens, heads, d)).astype(np.float32)
    k = rng.standard_normal((keys, heads_kv, d)).astype(np.float32)
    v = rng.standard_normal((keys, heads_kv, d)).astype(np.float32)
    return q, k, v, 1.0 / np.sqrt(d)


def state(q, k, v, scale, base="natural", dtype=np.float32):
    o, lse = reference_state(q, k, v, scale, base)
    return attnstate.State(o.astype(dtype), lse.astype(np.float32), base)


@pytest.mark.parametrize("base_a,base_b,base_out", [("natural", "base2", "natural"),
                                                    ("base2", "base2", "base2"),
                                                    ("natural", "natural", "base2")])
def test_merge_state_of_two_halves_is_full_attention(base_a, base_b, base_out):
    q, k, v, scale = problem()
    a = state(q, k[:17], v[:17], scale, base_a)
    b = state(q, k[17:], v[17:], scale, base_b)
    out = attnstate.merge_state(a, b, base=base_out)
    o, lse = reference_state(q, k, v, scale, base_out)
    assert out.base == attnstate.Base(1 if base_out == "base2" else 0)
    np.testing.assert_allclose(out.o, o, atol=2e-6)
    np.testing.assert_allclose(out.lse, lse, atol=2e-6)


def test_merge_state_writes_out_in_its_dtype_and_aliasing_a():
    q, k, v, scale = problem()
    a = state(q, k[:9], v[:9], scale)
    b = state(q, k[9:], v[9:], scale, "base2", np.float16)
    attnstate.merge_state(a, b, out=a)  # out may be a itself
    o, lse = reference_state(q, k, v, scale)
    np.testing.assert_allclose(a.o, o, atol=2e-3)
    np.testing.assert_allclose(a.lse, lse, atol=1e-5)
    half = attnstate.merge_state(a, state(q, k[:0], v[:0], scale), dtype="float16")
    assert half.o.dtype == np.float16
    np.testing.assert_allclose(half.o, o, atol=2e-3)


def test_empty_state_is_the_identity_even_with_nan_o():
    q, k, v, scale = problem()
    a = state(q, k, v, scale)
    empty = attnstate.State(np.full_like(a.o, np.nan), np.full_like(a.lse, -np.inf), "natural")
    out = attnstate.merge_state(a, empty)
    np.testing.assert_array_equal(out.o, a.o)
    np.testing.assert_array_equal(out.lse, a.lse)


def test_merge_state_in_place_with_mask():
    q, k, v, scale = problem(tokens=4)
    acc = state(q, k[:20], v[:20], scale)
    before = acc.o.copy()
    other = state(q, k[20:], v[20:], scale, "base2")
    mask = np.array([1, 0, 1, 0], np.uint8)
    assert attnstate.merge_state_(acc, other, mask=mask) is acc
    o, _ = reference_state(q, k, v, scale)
    np.testing.assert_allclose(acc.o[[0, 2]], o[[0, 2]], atol=2e-6)
    np.testing.assert_array_equal(acc.o[[1, 3]], before[[1, 3]])
    attnstate.merge_state_(acc, other, mask=np.array([False, True, False, True]))
    np.testing.assert_allclose(acc.o, o, atol=2e-6)


@pytest.mark.parametrize("order", ["tokens_major", "states_major"])
def test_merge_states_of_splits_in_both_orders(order):
    q, k, v, scale = problem(tokens=3, keys=64)
    cuts = [0, 5, 5, 30, 64]  # an empty split included
    parts = [reference_state(q, k[b:e], v[b:e], scale, "base2") for b, e in zip(cuts, cuts[1:])]
    axis = 1 if order == "tokens_major" else 0
    o = np.stack([p[0] for p in parts], axis=axis).astype(np.float32)
    lse = np.stack([p[1] for p in parts], axis=axis).astype(np.float32)
    out = attnstate.merge_states(attnstate.State(o, lse, "base2"), order=order, base="natural")
    ro, rlse = reference_state(q, k, v, scale)
    np.testing.assert_allclose(out.o, ro, atol=2e-6)
    np.testing.assert_allclose(out.lse, rlse, atol=2e-6)


def test_merge_states_ragged():
    q, k, v, scale = problem(tokens=1, keys=30)
    cuts = [0, 10, 30]
    rows = [reference_state(q, k[b:e], v[b:e], scale) for b, e in zip(cuts, cuts[1:])]
    o = np.concatenate([r[0] for r in rows]).astype(np.float32)  # (2, heads, d)
    lse = np.concatenate([r[1] for r in rows]).astype(np.float32)
    indptr = np.array([0, 2, 2], np.int32)  # token 0 merges both rows, token 1 none
    out = attnstate.merge_states_ragged(attnstate.State(o, lse, "natural"), indptr)
    ro, rlse = reference_state(q, k, v, scale)
    np.testing.assert_allclose(out.o[0], ro[0], atol=2e-6)
    np.testing.assert_allclose(out.lse[0], rlse[0], atol=2e-6)
    assert np.all(out.lse[1] == -np.inf) and np.all(out.o[1] == 0)


def test_head_major_lse_is_a_strided_view():
    q, k, v, scale = problem(tokens=6)
    o, lse = reference_state(q, k, v, scale)
    head_major = np.ascontiguousarray(lse.T.astype(np.float32))  # FlashAttention's (heads, T)
    s = attnstate.State(o.astype(np.float32), head_major.T, "natural")
    out = attnstate.rebase(s, "base2")
    np.testing.assert_allclose(out.lse, lse / np.log(2.0), rtol=1e-6)
    np.testing.assert_array_equal(out.o, s.o)


def test_rebase_in_place_and_mark_empty_rows():
    o = np.ones((2, 1, 4), np.float32)
    lse = np.array([[np.inf], [3.0]], np.float32)
    s = attnstate.State(o, lse, "natural")
    attnstate.mark_empty_rows(s)
    assert lse[0, 0] == -np.inf and lse[1, 0] == 3.0
    attnstate.rebase(s, out=attnstate.State(o, lse, "base2"))
    np.testing.assert_allclose(lse[1, 0], 3.0 / np.log(2.0), rtol=1e-6)
    assert lse[0, 0] == -np.inf


def test_nan_in_a_non_empty_input_propagates():
    q, k, v, scale = problem(tokens=2)
    a = state(q, k[:10], v[:10], scale)
    a.o[0, 0, 0] = np.nan
    out = attnstate.merge_state(a, state(q, k[10:], v[10:], scale))
    assert np.isnan(out.o[0, 0, 0]) and not np.isnan(out.o[1]).any()


def test_state_value_and_cpu_threads():
    o, lse = np.zeros((2, 1, 4), np.float32), np.zeros((2, 1), np.float32)
    s = attnstate.State(o, lse, attnstate.Base.BASE2)
    got_o, got_lse, base = s
    assert got_o is o and got_lse is lse and base == attnstate.Base.BASE2
    assert "base2" in repr(s) and "(2, 1, 4)" in repr(s)
    before = attnstate.num_threads()
    attnstate.set_num_threads(1)
    try:
        assert attnstate.num_threads() == 1
        test_merge_state_of_two_halves_is_full_attention("natural", "base2", "natural")
    finally:
        attnstate.set_num_threads(0)
    assert attnstate.num_threads() == before


@pytest.mark.parametrize("sink_base", ["natural", "base2"])
def test_sink_state_merged_once_is_the_softmax_with_the_sink_term(sink_base):
    q, k, v, scale = problem()
    heads, d = q.shape[1], q.shape[2]
    sinks = rng.standard_normal(heads).astype(np.float32)
    # two partials over disjoint keys, merged, then the sink once
    out = attnstate.merge_state(state(q, k[:13], v[:13], scale), state(q, k[13:], v[13:], scale))
    s = sinks if sink_base == "natural" else (sinks / np.log(2.0)).astype(np.float32)
    sink = attnstate.sink_state(s, q.shape[0], d, base=sink_base)
    assert sink.o.strides[0] == 0 and sink.lse.strides[0] == 0  # no per-row memory
    attnstate.merge_state_(out, sink)
    o, lse = reference_state(q, k, v, scale, "natural")
    # with the sink: the denominator gains exp(s_h), lse' = log(e^lse + e^s)
    lse_sink = np.logaddexp(lse.astype(np.float64), sinks[None, :].astype(np.float64))
    np.testing.assert_allclose(out.lse, lse_sink, atol=2e-6)
    np.testing.assert_allclose(out.o, o * np.exp(lse - lse_sink)[..., None], atol=2e-6)


def test_sink_state_checks_its_arguments():
    with pytest.raises(attnstate.Error, match="'sinks'"):
        attnstate.sink_state(np.zeros((2, 2), np.float32), 1, 8)
    with pytest.raises(attnstate.Error, match="'sinks'"):
        attnstate.sink_state(np.zeros(2, np.float64), 1, 8)
    with pytest.raises(attnstate.Error, match="'head_dim'"):
        attnstate.sink_state(np.zeros(2, np.float32), 1, 0)
    with pytest.raises(attnstate.Error, match="'base'"):
        attnstate.sink_state(np.zeros(2, np.float32), 1, 8, base="ten")
