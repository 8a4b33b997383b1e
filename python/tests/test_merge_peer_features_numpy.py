"""The merges on what the serving engines' merge tests ask for, on NumPy arrays (CPU backend)
against a float64 reference: any head dim, masks of any stride (0 included) on both pairwise
merges, stacks of no states, and rebase writing empty rows as (0, -inf)."""

import numpy as np
import pytest

import attnstate
from helpers import reference_state

rng = np.random.default_rng(11)


def halves(tokens, heads, d, keys=24, split=9, base_a="natural", base_b="base2"):
    q = rng.standard_normal((tokens, heads, d)).astype(np.float32)
    k = rng.standard_normal((keys, heads, d)).astype(np.float32)
    v = rng.standard_normal((keys, heads, d)).astype(np.float32)
    scale = 1.0 / np.sqrt(d)
    oa, la = reference_state(q, k[:split], v[:split], scale, base_a)
    ob, lb = reference_state(q, k[split:], v[split:], scale, base_b)
    a = attnstate.State(oa.astype(np.float32), la.astype(np.float32), base_a)
    b = attnstate.State(ob.astype(np.float32), lb.astype(np.float32), base_b)
    return a, b, reference_state(q, k, v, scale), (oa, la)


@pytest.mark.parametrize("d", [1, 3, 32, 48, 80, 96, 100, 112, 160, 192, 576])
def test_merge_state_takes_any_head_dim(d):
    a, b, (o, lse), _ = halves(4, 3, d)
    out = attnstate.merge_state(a, b)
    np.testing.assert_allclose(out.o, o, atol=3e-6)
    np.testing.assert_allclose(out.lse, lse, atol=3e-6)


@pytest.mark.parametrize("stride", [1, 3, 0])
def test_masked_merge_state_passes_a_through_where_the_mask_is_zero(stride):
    tokens = 7
    a, b, (o, lse), (oa, la) = halves(tokens, 2, 40)
    flags = rng.integers(0, 2, size=tokens).astype(np.uint8)
    if stride == 0:  # one flag broadcast to every token
        mask = np.broadcast_to(np.uint8(1), (tokens,))
        flags = np.ones(tokens, np.uint8)
    else:
        buf = np.full(tokens * stride, 0xCD, np.uint8)
        buf[::stride] = flags
        mask = buf[::stride]
        assert mask.strides == (stride,)
    out = attnstate.merge_state(a, b, mask=mask)
    for t in range(tokens):
        want_o, want_l = (o[t], lse[t]) if flags[t] else (oa[t], la[t])
        np.testing.assert_allclose(out.o[t], want_o, atol=3e-6)
        np.testing.assert_allclose(out.lse[t], want_l, atol=3e-6)


def test_merge_state_in_place_with_a_strided_and_a_broadcast_mask():
    tokens = 6
    a, b, (o, lse), _ = halves(tokens, 2, 24)
    buf = np.zeros(tokens * 2, np.uint8)
    buf[0::2] = [1, 0, 1, 1, 0, 1]
    acc = attnstate.State(a.o.copy(), a.lse.copy(), a.base)
    attnstate.merge_state_(acc, b, mask=buf[0::2])
    for t in range(tokens):
        want = o[t] if buf[2 * t] else a.o[t]
        np.testing.assert_allclose(acc.o[t], want, atol=3e-6)
    none = np.broadcast_to(np.uint8(0), (tokens,))  # stride 0, flag 0: nothing is written
    before = acc.o.copy()
    attnstate.merge_state_(acc, b, mask=none)
    np.testing.assert_array_equal(acc.o, before)


def test_merge_of_no_states_is_the_empty_state():
    states = attnstate.State(np.zeros((3, 0, 2, 16), np.float32), np.zeros((3, 0, 2), np.float32),
                             "base2")
    out = attnstate.merge_states(states)
    np.testing.assert_array_equal(out.o, np.zeros((3, 2, 16)))
    np.testing.assert_array_equal(out.lse, np.full((3, 2), -np.inf))


def test_rebase_writes_empty_rows_as_zero():
    o = rng.standard_normal((4, 3, 8)).astype(np.float32)
    lse = rng.standard_normal((4, 3)).astype(np.float32)
    o[1, 2] = np.nan
    lse[1, 2] = -np.inf
    out = attnstate.rebase(attnstate.State(o, lse, "natural"), "base2")
    np.testing.assert_array_equal(out.o[1, 2], np.zeros(8))
    assert out.lse[1, 2] == -np.inf
    np.testing.assert_allclose(out.lse[0], lse[0] / np.log(2.0), rtol=1e-6)


def test_a_mask_of_the_wrong_shape_or_dtype_is_named():
    a, b, _, _ = halves(5, 2, 8)
    with pytest.raises(attnstate.Error, match="'mask'"):
        attnstate.merge_state(a, b, mask=np.ones(4, np.uint8))
    with pytest.raises(attnstate.Error, match="'mask'"):
        attnstate.merge_state(a, b, mask=np.ones(5, np.float32))


def test_an_fp8_state_merged_without_out_keeps_its_format_and_scale():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a, b, (o, lse), _ = halves(3, 2, 16)
    a8 = attnstate.State((a.o / 0.25).astype(ml_dtypes.float8_e4m3fn), a.lse, a.base, scale=0.25)
    out = attnstate.merge_state(a8, b)
    assert out.o.dtype == a8.o.dtype and out.scale == 0.25
    np.testing.assert_allclose(out.o.astype(np.float32) * 0.25, o, atol=0.1)
