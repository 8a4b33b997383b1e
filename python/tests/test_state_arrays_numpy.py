"""States from NumPy as engines hold them (CPU backend): bfloat16 and fp8 through ml_dtypes, the
fp8 scale, the LSE layout named by the caller (never inferred from strides), an output without
an LSE, and arrays without elements (NumPy 2 reports stride 0 for them)."""

import ml_dtypes
import numpy as np
import pytest

import attnstate
from helpers import has_module

rng = np.random.default_rng(30)
E4M3, E5M2, BF16 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.bfloat16


def merged(o_a, lse_a, o_b, lse_b):
    """float64 a ⊕ b of natural-base states (finite LSEs)."""
    o_a, lse_a, o_b, lse_b = (np.asarray(x, np.float64) for x in (o_a, lse_a, o_b, lse_b))
    lse = np.logaddexp(lse_a, lse_b)
    return (o_a * np.exp(lse_a - lse)[..., None] + o_b * np.exp(lse_b - lse)[..., None]), lse


def state(t=5, h=3, d=8, dtype=np.float32, scale=1.0):
    o = rng.standard_normal((t, h, d)).astype(np.float32)
    lse = rng.standard_normal((t, h)).astype(np.float32)
    return attnstate.State((o / scale).astype(dtype), lse, "natural", scale=scale)


# ---- bfloat16 and fp8 through ml_dtypes ----

def test_numpy_bfloat16_in_and_out():
    a, b = state(dtype=BF16), state(dtype=BF16)
    out = attnstate.merge_state(a, b)  # allocated like a: an ml_dtypes.bfloat16 array
    assert out.o.dtype == BF16
    o, lse = merged(a.o.astype(np.float32), a.lse, b.o.astype(np.float32), b.lse)
    np.testing.assert_allclose(out.o.astype(np.float32), o, rtol=2 ** -7, atol=1e-6)
    np.testing.assert_allclose(out.lse, lse, rtol=1e-6, atol=1e-6)
    # a bfloat16 output given by the caller, from float32 inputs; and strided bf16 views
    a32, b32 = state(), state()
    out = attnstate.State(np.empty((5, 3, 8), BF16), np.empty((5, 3), np.float32), "natural")
    attnstate.merge_state(a32, b32, out=out)
    o, _ = merged(a32.o, a32.lse, b32.o, b32.lse)
    np.testing.assert_array_equal(out.o, o.astype(np.float32).astype(BF16))
    wide = np.zeros((5, 6, 8), BF16)
    view = attnstate.State(wide[:, ::2], np.zeros((5, 3), np.float32), "natural")
    attnstate.merge_state(a32, b32, out=view)
    np.testing.assert_array_equal(wide[:, ::2], out.o)
    assert not wide[:, 1::2].astype(np.float32).any()
    # every function that allocates: the output dtype by an ml_dtypes type
    r = attnstate.rebase(a32, "base2", dtype=BF16)
    assert r.o.dtype == BF16 and r.base == attnstate.Base.BASE2


@pytest.mark.parametrize("fp8", [E4M3, E5M2])
def test_numpy_fp8_o_with_its_scale(fp8):
    s = 0.25
    a, b = state(dtype=fp8, scale=s), state()
    assert a.scale == s and a.o.dtype == fp8
    out = attnstate.merge_state(a, b, dtype="float32")
    o, lse = merged(a.o.astype(np.float32) * s, a.lse, b.o, b.lse)
    np.testing.assert_allclose(out.o, o, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(out.lse, lse, rtol=1e-6, atol=1e-6)
    # an fp8 output written with its scale: stored = round(value / scale)
    q = attnstate.State(np.empty((5, 3, 8), fp8), np.empty((5, 3), np.float32), "natural",
                        scale=0.5)
    attnstate.merge_state(a, b, out=q)
    np.testing.assert_array_equal(q.o, (out.o / np.float32(0.5)).astype(fp8))


def test_scale_is_checked_against_the_dtype():
    with pytest.raises(attnstate.Error, match="argument 'a.scale': expected 1 .*float32.*got 0.5"):
        attnstate.merge_state(state(scale=0.5), state())
    bad = attnstate.State(np.zeros((5, 3, 8), E4M3), np.zeros((5, 3), np.float32), "natural",
                          scale=0.0)
    with pytest.raises(attnstate.Error, match="argument 'b.scale': expected a finite scale > 0"):
        attnstate.merge_state(state(), bad)
    with pytest.raises(attnstate.Error, match="attnstate.State: argument 'scale'"):
        attnstate.State(np.zeros((1, 1, 4), np.float32), None, "natural", scale="one")


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3b11fnuz, ml_dtypes.int4, np.float64])
def test_an_unsupported_dtype_is_named(dtype):
    o = np.zeros((5, 3, 8), dtype)
    with pytest.raises(attnstate.Error, match=r"argument 'b.o': expected .*got .*" +
                       np.dtype(dtype).name) as e:
        attnstate.merge_state(state(), attnstate.State(o, np.zeros((5, 3), np.float32),
                                                       "natural"))
    assert "DLPack" not in str(e.value)


@pytest.mark.skipif(not has_module("torch"), reason="needs torch")
@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_torch_fp8_o(name):
    import torch
    dt = getattr(torch, name)
    o = torch.randn(5, 3, 8).to(dt)
    lse = torch.randn(5, 3)
    a = attnstate.State(o, lse, "natural", scale=2.0)
    b = attnstate.State(torch.randn(5, 3, 8), torch.randn(5, 3), "natural")
    out = attnstate.merge_state(a, b, dtype=torch.float32)
    ref, _ = merged(o.float().numpy() * 2.0, lse.numpy(), b.o.numpy(), b.lse.numpy())
    np.testing.assert_allclose(out.o.numpy(), ref, rtol=1e-6, atol=1e-6)


# ---- the LSE layout ----

def test_head_major_lse_needs_no_transpose_even_when_square():
    t = h = 4  # square: a head-major LSE read as tokens-major would be silently wrong
    a, b = state(t, h), state(t, h)
    head_major = np.ascontiguousarray(b.lse.T)  # (heads, tokens), as FlashAttention returns
    hb = attnstate.State(b.o, head_major, "natural", lse_layout="heads_tokens")
    assert hb.lse_layout == "heads_tokens" and "heads_tokens" in repr(hb)
    out = attnstate.merge_state(a, hb)
    o, lse = merged(a.o, a.lse, b.o, b.lse)
    np.testing.assert_allclose(out.o, o, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.lse, lse, rtol=1e-6, atol=1e-6)
    # a head-major output: written (heads, tokens)
    out_hm = attnstate.State(np.empty((t, h, 8), np.float32), np.empty((h, t), np.float32),
                             "natural", lse_layout="heads_tokens")
    attnstate.merge_state(a, hb, out=out_hm)
    np.testing.assert_allclose(out_hm.lse, lse.T, rtol=1e-6, atol=1e-6)
    # the transposed view still reads as (tokens, heads) by its strides
    view = attnstate.State(b.o, head_major.T, "natural")
    assert view.lse_layout == "tokens_heads"
    np.testing.assert_array_equal(attnstate.merge_state(a, view).o, out.o)


def test_the_shape_names_the_layout():
    o = np.zeros((5, 3, 8), np.float32)
    with pytest.raises(attnstate.Error, match=r"'b.lse': expected shape \(5, 3\).*heads_tokens"):
        attnstate.merge_state(state(), attnstate.State(o, np.zeros((3, 5), np.float32),
                                                       "natural"))
    with pytest.raises(attnstate.Error, match=r"'b.lse': expected shape \(3, 5\)"):
        attnstate.merge_state(state(), attnstate.State(o, np.zeros((5, 3), np.float32),
                                                       "natural", lse_layout="heads_tokens"))
    with pytest.raises(attnstate.Error, match="attnstate.State: argument 'lse_layout'"):
        attnstate.State(o, np.zeros((5, 3), np.float32), "natural", lse_layout="NHD")


def test_stack_of_head_major_lses():
    s, t, h, d = 3, 4, 4, 8
    o = rng.standard_normal((s, t, h, d)).astype(np.float32)
    lse = rng.standard_normal((s, t, h)).astype(np.float32)
    want = attnstate.merge_states(attnstate.State(o, lse, "natural"), order="states_major")
    hm = np.ascontiguousarray(lse.transpose(0, 2, 1))  # (S, heads, tokens)
    got = attnstate.merge_states(attnstate.State(o, hm, "natural", lse_layout="heads_tokens"),
                                 order="states_major")
    np.testing.assert_array_equal(got.o, want.o)
    np.testing.assert_array_equal(got.lse, want.lse)
    with pytest.raises(attnstate.Error, match="argument 'states.lse_layout'"):
        attnstate.merge_states(attnstate.State(o.transpose(1, 0, 2, 3), hm, "natural",
                                               lse_layout="heads_tokens"))


# ---- an output without an LSE ----

def test_lse_none():
    a, b = state(), state()
    out = attnstate.State(np.empty((5, 3, 8), np.float32), None, "natural")
    assert out.lse is None and "lse=None" in repr(out)
    try:
        attnstate.merge_state(a, b, out=out)
    except attnstate.Error as e:  # a library that still requires every LSE names it
        assert "argument 'out.lse'" in str(e)
    else:
        np.testing.assert_allclose(out.o, merged(a.o, a.lse, b.o, b.lse)[0], rtol=1e-5,
                                   atol=1e-6)
    with pytest.raises(attnstate.Error, match="argument 'a.lse'"):  # inputs need theirs
        attnstate.merge_state(attnstate.State(a.o, None, "natural"), b)
    with pytest.raises(attnstate.Error, match="argument 'states.lse'"):
        attnstate.merge_states(attnstate.State(np.zeros((2, 1, 3, 8), np.float32), None,
                                               "natural"))


# ---- arrays without elements ----

def empty_state(t=0, h=3, d=8):
    return attnstate.State(np.zeros((t, h, d), np.float32), np.zeros((t, h), np.float32),
                           "natural")


def test_empty_states_everywhere():
    e = empty_state()
    assert e.o.strides == (0, 0, 0) or e.o.size == 0
    assert attnstate.merge_state(e, empty_state()).o.shape == (0, 3, 8)
    attnstate.merge_state_(e, empty_state(), mask=np.zeros(0, np.uint8))
    assert attnstate.rebase(e, "base2").o.shape == (0, 3, 8)
    attnstate.mark_empty_rows(e)
    stack = attnstate.State(np.zeros((0, 2, 3, 8), np.float32), np.zeros((0, 2, 3), np.float32),
                            "natural")
    assert attnstate.merge_states(stack).o.shape == (0, 3, 8)
    assert attnstate.merge_states(
        attnstate.State(np.zeros((2, 0, 3, 8), np.float32), np.zeros((2, 0, 3), np.float32),
                        "natural"), order="states_major").o.shape == (0, 3, 8)
    sinks = np.zeros(3, np.float32)
    attnstate.merge_state_(e, attnstate.sink_state(sinks, 0, 8))


def test_ragged_merge_of_zero_rows_and_zero_tokens():
    # three tokens, no rows: each token gets the empty state (0, -inf)
    out = attnstate.merge_states_ragged(empty_state(), np.zeros(4, np.int32))
    np.testing.assert_array_equal(out.o, np.zeros((3, 3, 8), np.float32))
    np.testing.assert_array_equal(out.lse, np.full((3, 3), -np.inf, np.float32))
    # no tokens
    none = attnstate.merge_states_ragged(state(), np.zeros(1, np.int32))
    assert none.o.shape == (0, 3, 8) and none.lse.shape == (0, 3)


def test_decode_of_an_empty_batch():
    lens = np.zeros(0, np.int32)
    dec = attnstate.Decode().plan(lens, heads_q=2, heads_kv=1, head_dim=8, dtype=np.float32)
    k = np.zeros((1, 4, 1, 8), np.float32)
    out = dec.run(np.zeros((0, 1, 2, 8), np.float32), k, k, lens,
                  page_indptr=np.zeros(1, np.int32), page_indices=np.zeros(0, np.int32))
    assert out.o.shape == (0, 2, 8)


def test_fp8_kv_pools_of_their_own_dtype():
    # an ml_dtypes fp8 pool reads as its uint8 bytes do
    lens = np.array([13], np.int32)
    tables = dict(page_indptr=np.array([0, 2], np.int32), page_indices=np.array([1, 0], np.int32))
    k = (rng.standard_normal((2, 8, 1, 8)) * 4).astype(E5M2)
    v = (rng.standard_normal((2, 8, 1, 8)) * 4).astype(E5M2)
    q = rng.standard_normal((1, 1, 2, 8)).astype(np.float32)
    dec = attnstate.Decode().plan(lens, heads_q=2, heads_kv=1, head_dim=8, dtype="float32",
                                  kv_dtype=E5M2)
    typed = dec.run(q, k, v, lens, k_scale=0.5, v_scale=2.0, **tables)
    raw = dec.run(q, k.view(np.uint8), v.view(np.uint8), lens, k_scale=0.5, v_scale=2.0,
                  **tables)
    np.testing.assert_array_equal(typed.o, raw.o)
    np.testing.assert_array_equal(typed.lse, raw.lse)
    with pytest.raises(attnstate.Error, match="argument 'k': expected an array of the plan's "
                       "kv_dtype e5m2.*got dtype float8_e4m3fn"):
        dec.run(q, k.astype(E4M3), v, lens, **tables)
