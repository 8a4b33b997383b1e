"""Decode and cascade plan/run objects on NumPy arrays (CPU backend) against a reference."""

import numpy as np
import pytest

import attnstate
from helpers import reference_state, shared_prefix_levels

rng = np.random.default_rng(11)


def paged(seq_lens, page_size, heads_kv, d, layout="NHD"):
    """A paged pool holding each request's keys in shuffled pages, and its CSR page table."""
    pages_of = [-(-n // page_size) for n in seq_lens]
    total = sum(pages_of)
    perm = rng.permutation(total).astype(np.int32)
    shape = (total, page_size, heads_kv, d) if layout == "NHD" else (total, heads_kv, page_size, d)
    k = rng.standard_normal(shape).astype(np.float32)
    v = rng.standard_normal(shape).astype(np.float32)
    indptr = np.concatenate([[0], np.cumsum(pages_of)]).astype(np.int32)
    return k, v, indptr, perm


def keys_of(pool, pages, n, layout):
    x = pool[pages]  # (pages, ...)
    if layout == "HND":
        x = x.transpose(0, 2, 1, 3)
    return x.reshape(-1, *x.shape[2:])[:n]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("policy,num_splits,split_size", [("auto", 0, 0), ("fixed_count", 3, 0),
                                                          ("fixed_size", 0, 16)])
def test_decode_matches_attention(layout, policy, num_splits, split_size):
    seq_lens = np.array([37, 0, 5, 64], np.int32)
    heads_q, heads_kv, d, page_size = 4, 2, 8, 8
    k, v, indptr, indices = paged(seq_lens, page_size, heads_kv, d, layout)
    q = rng.standard_normal((len(seq_lens), 1, heads_q, d)).astype(np.float32)
    dec = attnstate.Decode().plan(seq_lens, heads_q=heads_q, heads_kv=heads_kv, head_dim=d,
                                  dtype="float32", policy=policy, num_splits=num_splits,
                                  split_size=split_size)
    assert dec.workspace is None  # the CPU needs none
    out = dec.run(q, k, v, seq_lens, page_indptr=indptr, page_indices=indices, layout=layout,
                  base="base2")
    assert out.o.shape == (4, heads_q, d) and out.base == attnstate.Base.BASE2
    scale = 1.0 / np.sqrt(d)
    for b, n in enumerate(seq_lens):
        pages = indices[indptr[b]:indptr[b + 1]]
        kb, vb = keys_of(k, pages, n, layout), keys_of(v, pages, n, layout)
        o, lse = reference_state(q[b], kb, vb, scale, "base2")
        np.testing.assert_allclose(out.o[b], o[0], atol=1e-5)
        np.testing.assert_allclose(out.lse[b], lse[0], atol=1e-5)


def test_decode_with_block_table_and_out():
    seq_lens = np.array([20, 9], np.int32)
    k, v, indptr, indices = paged(seq_lens, 4, 1, 4)
    table = np.full((2, 5), 0, np.int32)
    for b in range(2):
        p = indices[indptr[b]:indptr[b + 1]]
        table[b, :len(p)] = p
    q = rng.standard_normal((2, 1, 2, 4)).astype(np.float32)
    dec = attnstate.Decode().plan(seq_lens, heads_q=2, heads_kv=1, head_dim=4, dtype="float32")
    out = attnstate.State(np.empty((2, 2, 4), np.float16), np.empty((2, 2), np.float32), "natural")
    assert dec.run(q, k, v, seq_lens, block_table=table, out=out) is out
    csr = dec.run(q, k, v, seq_lens, page_indptr=indptr, page_indices=indices)
    np.testing.assert_allclose(out.o, csr.o, atol=1e-3)


def test_decode_errors_name_the_argument():
    dec = attnstate.Decode()
    with pytest.raises(attnstate.Error, match="call plan"):
        dec.run(np.zeros((1, 1, 2, 4), np.float32), None, None, None)
    with pytest.raises(attnstate.Error, match="argument 'seq_lens': expected dtype int32"):
        dec.plan(np.array([3], np.int64), heads_q=2, heads_kv=1, head_dim=4, dtype="float32")
    with pytest.raises(attnstate.Error, match="argument 'policy'"):
        dec.plan(np.array([3], np.int32), heads_q=2, heads_kv=1, head_dim=4, dtype="float32",
                 policy="many")
    dec.plan(np.array([3], np.int32), heads_q=2, heads_kv=1, head_dim=4, dtype="float32")
    k = np.zeros((1, 4, 1, 4), np.float32)
    with pytest.raises(attnstate.Error, match="argument 'v'"):
        dec.run(np.zeros((1, 1, 2, 4), np.float32), k, np.zeros((1, 4, 1, 4), np.float16),
                np.array([3], np.int32), page_indptr=np.array([0, 1], np.int32),
                page_indices=np.array([0], np.int32))
    with pytest.raises(attnstate.Error, match="argument 'layout'"):
        dec.run(np.zeros((1, 1, 2, 4), np.float32), k, k, np.array([3], np.int32),
                page_indptr=np.array([0, 1], np.int32), page_indices=np.array([0], np.int32),
                layout="NDH")


def test_cascade_shared_prefix_matches_attention():
    heads_q, heads_kv, d, page_size = 4, 2, 8, 4
    prefix, suffixes = 10, [3, 7, 1]
    batch = len(suffixes)
    levels, total, starts = shared_prefix_levels(prefix, suffixes, page_size)
    k = rng.standard_normal((total, page_size, heads_kv, d)).astype(np.float32)
    v = rng.standard_normal((total, page_size, heads_kv, d)).astype(np.float32)
    q = rng.standard_normal((batch, 1, heads_q, d)).astype(np.float32)
    cas = attnstate.Cascade().plan(levels, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
                                   head_dim=d, page_size=page_size, num_pages=total,
                                   dtype="float32")
    out = cas.run(q, k, v, levels)
    flat_k = k.reshape(-1, heads_kv, d)
    flat_v = v.reshape(-1, heads_kv, d)
    for b, n in enumerate(suffixes):
        s0 = starts[1 + b] * page_size
        idx = np.concatenate([np.arange(prefix), np.arange(s0, s0 + n)])
        o, lse = reference_state(q[b], flat_k[idx], flat_v[idx], 1.0 / np.sqrt(d))
        np.testing.assert_allclose(out.o[b], o[0], atol=1e-5)
        np.testing.assert_allclose(out.lse[b], lse[0], atol=1e-5)
