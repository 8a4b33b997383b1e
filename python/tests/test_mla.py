"""MLA (multi-head latent attention) decode through attnstate.MlaDecode: the CPU backend against a
float64 NumPy reference (576-wide keys, 512-wide values, causal q_len), both peers' cache layouts,
CSR and block tables, fp8 caches, sinks, state dtypes and bases, shard states merged with the
library's merges, argument errors; the CUDA backend against the CPU one (skipped without torch,
a GPU or the CUDA backend)."""

import math

import numpy as np
import pytest

import attnstate
from helpers import cuda_torch, requires_torch_cuda
from mla_helpers import NP_DTYPES as _NP
from mla_helpers import (RANK, ROPE, SCALE, check, compare_cuda, expect_errors, poisoned_out,
                         queries, replayed_in_cuda_graphs, shared_run_errors, stored, to_cuda)


class Cache:
    """A paged latent cache of random tokens in shuffled pages (plus a spare page no request
    owns) in FlashInfer's two pools or FlashMLA's one 576-wide pool, with its CSR and block
    tables and each request's real token values."""

    def __init__(self, rng, seq_lens, page_size, layout="two_pools", ckv_dtype="float32",
                 kpe_dtype=None, ckv_scale=1.0, kpe_scale=1.0, rank=RANK, rope=ROPE):
        kpe_dtype = kpe_dtype or ckv_dtype
        pages_of = [-(-int(n) // page_size) for n in seq_lens]
        num_pages = sum(pages_of) + 1
        perm = rng.permutation(num_pages).astype(np.int32)
        ckv, self.ckv_real = stored(rng.standard_normal((num_pages, page_size, rank)), ckv_dtype,
                                    ckv_scale)
        kpe, self.kpe_real = stored(rng.standard_normal((num_pages, page_size, rope)), kpe_dtype,
                                    kpe_scale)
        if layout == "one_pool":  # FlashMLA: (blocks, block_size, 1, 576), two views of it
            assert ckv_dtype == kpe_dtype
            pool = np.empty((num_pages, page_size, 1, rank + rope), _NP[ckv_dtype])
            pool[:, :, 0, :rank], pool[:, :, 0, rank:] = ckv, kpe
            self.ckv, self.kpe = pool[..., :rank], pool[..., rank:]
        else:
            self.ckv, self.kpe = ckv, kpe
        self.indptr = np.concatenate([[0], np.cumsum(pages_of)]).astype(np.int32)
        self.indices = perm[:sum(pages_of)].copy()
        self.table = np.full((len(seq_lens), max(1, max(pages_of, default=1))), perm[-1], np.int32)
        for b in range(len(seq_lens)):
            self.table[b, :pages_of[b]] = self.pages(b)
        self.seq_lens = np.asarray(seq_lens, np.int32)
        self.page_size = page_size

    def pages(self, b):
        return self.indices[self.indptr[b]:self.indptr[b + 1]]

    def tokens(self, b):
        """Request b's (ckv, kpe) real values, (n, rank) and (n, rope), in float64."""
        n, p = self.seq_lens[b], self.pages(b)
        return (self.ckv_real[p].reshape(-1, self.ckv_real.shape[-1])[:n],
                self.kpe_real[p].reshape(-1, self.kpe_real.shape[-1])[:n])

    def table_kwargs(self, table):
        if table == "csr":
            return {"page_indptr": self.indptr, "page_indices": self.indices}
        return {"block_table": self.table}


def reference(q_nope, q_pe, cache, scale, sinks=None, base="natural"):
    """The float64 MLA state (batch * q_len, heads, rank): row i of request b sees keys
    [0, seq_len - q_len + i]; the sink (0, sinks[h]) merged into every row."""
    qn, qp = q_nope.astype(np.float64), q_pe.astype(np.float64)
    batch, q_len, heads, rank = qn.shape
    o = np.zeros((batch * q_len, heads, rank))
    lse = np.full((batch * q_len, heads), -np.inf)
    for b in range(batch):
        ckv, kpe = cache.tokens(b)
        for i in range(q_len):
            n = int(cache.seq_lens[b]) - q_len + i + 1
            s = scale * (qn[b, i] @ ckv[:max(n, 0)].T + qp[b, i] @ kpe[:max(n, 0)].T)  # (H, n)
            if sinks is not None:
                s = np.concatenate([s, np.asarray(sinks, np.float64)[:, None]], axis=1)
            if s.shape[1] == 0:
                continue
            m = s.max(axis=1, keepdims=True)
            e = np.exp(s - m)
            den = e.sum(axis=1)
            o[b * q_len + i] = (e[:, :max(n, 0)] @ ckv[:max(n, 0)]) / den[:, None]
            lse[b * q_len + i] = m[:, 0] + np.log(den)
    return o, (lse / math.log(2.0) if base == "base2" else lse)


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("table", ["csr", "block"])
@pytest.mark.parametrize("layout", ["two_pools", "one_pool"])
@pytest.mark.parametrize("q_len", [1, 3])
def test_cpu_matches_the_reference(page_size, table, layout, q_len):
    rng = np.random.default_rng([page_size, len(table), len(layout), q_len])
    seq_lens = np.array([70, 0, 2, 129], np.int32)  # an empty request, one shorter than q_len
    cache = Cache(rng, seq_lens, page_size, layout)
    q_nope, q_pe = queries(rng, len(seq_lens), q_len, 4, flashmla=layout == "one_pool")
    mla = attnstate.MlaDecode().plan(seq_lens, heads=4, dtype="float32", q_len=q_len,
                                     scale=SCALE)
    assert mla.workspace is None and mla.workspace_bytes == 0  # the CPU needs none
    out = mla.run(q_nope, q_pe, cache.ckv, cache.kpe, seq_lens, **cache.table_kwargs(table))
    assert out.o.shape == (len(seq_lens) * q_len, 4, RANK) and out.base == attnstate.Base.NATURAL
    check(out, reference(q_nope, q_pe, cache, SCALE), 2e-5)
    # the rows that see no key: (0, -inf)
    assert np.all(out.lse[q_len:2 * q_len] == -np.inf) and not out.o[q_len:2 * q_len].any()


@pytest.mark.parametrize("q_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("o_dtype,atol", [("float32", 2e-5), ("float16", 2e-3),
                                          ("bfloat16", 1.6e-2)])
@pytest.mark.parametrize("base", ["natural", "base2"])
def test_state_dtypes_and_bases(q_dtype, o_dtype, atol, base):
    rng = np.random.default_rng([len(q_dtype), len(o_dtype), len(base)])
    seq_lens = np.array([33, 100], np.int32)
    cache = Cache(rng, seq_lens, 16, ckv_dtype="bfloat16")
    q_nope, q_pe = queries(rng, 2, 2, 8, q_dtype)
    mla = attnstate.MlaDecode().plan(seq_lens, heads=8, dtype=q_dtype, kv_dtype="bfloat16",
                                     q_len=2, scale=SCALE)
    out = mla.run(q_nope, q_pe, cache.ckv, cache.kpe, seq_lens, page_indptr=cache.indptr,
                  page_indices=cache.indices, dtype=o_dtype, base=base)
    assert out.o.dtype == _NP[o_dtype] and out.base == attnstate.Base[base.upper()]
    check(out, reference(q_nope, q_pe, cache, SCALE, base=base), atol)


def test_default_scale_and_any_widths_on_the_cpu():
    rng = np.random.default_rng(3)
    seq_lens = np.array([17, 40], np.int32)
    cache = Cache(rng, seq_lens, 8, rank=48, rope=16)
    q_nope, q_pe = queries(rng, 2, 1, 3, rank=48, rope=16)
    mla = attnstate.MlaDecode().plan(seq_lens, heads=3, dtype="float32", kv_lora_rank=48,
                                     rope_dim=16)
    out = mla.run(q_nope, q_pe, cache.ckv, cache.kpe, seq_lens, block_table=cache.table)
    check(out, reference(q_nope, q_pe, cache, 1.0 / math.sqrt(64)), 2e-5)


@pytest.mark.parametrize("ckv_dtype,kpe_dtype,layout", [
    ("e4m3", "bfloat16", "two_pools"),  # FlashMLA keeps the rotary part in bf16
    ("e4m3", "e4m3", "two_pools"),
    ("e4m3", "e4m3", "one_pool"),
    ("e5m2", "e5m2", "two_pools"),
])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_fp8_caches_with_per_tensor_scales(ckv_dtype, kpe_dtype, layout, as_bytes):
    rng = np.random.default_rng([len(ckv_dtype), len(kpe_dtype), len(layout), as_bytes])
    seq_lens = np.array([50, 97], np.int32)
    ckv_scale = 0.07
    kpe_scale = 0.11 if kpe_dtype != "bfloat16" else 1.0
    cache = Cache(rng, seq_lens, 16, layout, ckv_dtype, kpe_dtype, ckv_scale, kpe_scale)
    q_nope, q_pe = queries(rng, 2, 1, 4, "bfloat16")
    mla = attnstate.MlaDecode().plan(seq_lens, heads=4, dtype="bfloat16", kv_dtype=ckv_dtype,
                                     kpe_dtype=kpe_dtype, scale=SCALE)
    ckv, kpe = cache.ckv, cache.kpe
    if as_bytes:  # the stored bytes, as array libraries without fp8 dtypes pass them
        ckv = ckv.view(np.uint8)
        kpe = kpe.view(np.uint8) if kpe_dtype != "bfloat16" else kpe
    out = mla.run(q_nope, q_pe, ckv, kpe, seq_lens, page_indptr=cache.indptr,
                  page_indices=cache.indices, ckv_scale=ckv_scale,
                  kpe_scale=None if kpe_dtype == "bfloat16" else kpe_scale, dtype="float32")
    check(out, reference(q_nope, q_pe, cache, SCALE), 2e-5)


@pytest.mark.parametrize("base", ["natural", "base2"])
def test_sinks_merge_once(base):
    rng = np.random.default_rng(5)
    seq_lens = np.array([40, 0, 1], np.int32)
    cache = Cache(rng, seq_lens, 16)
    q_nope, q_pe = queries(rng, 3, 2, 4)
    sinks = rng.standard_normal(4).astype(np.float32) * 2
    mla = attnstate.MlaDecode().plan(seq_lens, heads=4, dtype="float32", q_len=2, scale=SCALE)
    out = mla.run(q_nope, q_pe, cache.ckv, cache.kpe, seq_lens, block_table=cache.table,
                  sinks=sinks, base=base)
    want = reference(q_nope, q_pe, cache, SCALE, sinks=sinks, base=base)
    check(out, want, 2e-5)
    # a row with no key is the sink's state (0, sink)
    ln = 1.0 if base == "natural" else 1.0 / math.log(2.0)
    np.testing.assert_allclose(out.lse[2], sinks * ln, rtol=1e-6)
    assert not out.o[2].any()


def shard(cache, lo_tokens):
    """Two sub-caches of `cache` (q_len 1): each request's first `lo_tokens` keys (a multiple of
    the page size) and the rest, as CSR tables over the same pools."""
    ps = cache.page_size
    assert lo_tokens % ps == 0
    n = cache.seq_lens
    lo_lens = np.minimum(n, lo_tokens).astype(np.int32)
    hi_lens = (n - lo_lens).astype(np.int32)
    tables = []
    for lens, first in ((lo_lens, lambda b: 0), (hi_lens, lambda b: lo_tokens // ps)):
        pages = [cache.pages(b)[first(b):first(b) + -(-int(lens[b]) // ps)]
                 for b in range(len(n))]
        indptr = np.concatenate([[0], np.cumsum([len(p) for p in pages])]).astype(np.int32)
        indices = np.concatenate(pages + [np.zeros(0, np.int32)]).astype(np.int32)
        tables.append((lens, indptr, indices))
    return tables


@pytest.mark.parametrize("layout", ["two_pools", "one_pool"])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_shard_states_merge_into_the_one_pass_state(layout, with_sinks):
    rng = np.random.default_rng([len(layout), with_sinks])
    seq_lens = np.array([100, 16, 7, 300], np.int32)
    cache = Cache(rng, seq_lens, 16, layout)
    q_nope, q_pe = queries(rng, 4, 1, 4, flashmla=layout == "one_pool")
    sinks = rng.standard_normal(4).astype(np.float32) if with_sinks else None
    mla = attnstate.MlaDecode().plan(seq_lens, heads=4, dtype="float32", scale=SCALE)
    whole = mla.run(q_nope, q_pe, cache.ckv, cache.kpe, seq_lens, page_indptr=cache.indptr,
                    page_indices=cache.indices, sinks=sinks)
    parts = [mla.run(q_nope, q_pe, cache.ckv, cache.kpe, lens, page_indptr=indptr,
                     page_indices=indices, base=base)
             for (lens, indptr, indices), base in zip(shard(cache, 64), ("base2", "natural"))]
    merged = attnstate.merge_state(*parts, base="natural")
    if with_sinks:  # shards without the sink, merged, then the sink once
        attnstate.merge_state_(merged, attnstate.sink_state(sinks, 4, RANK))
    np.testing.assert_allclose(merged.o, whole.o, atol=2e-6)
    np.testing.assert_allclose(merged.lse, whole.lse, atol=2e-6)
    # and a stack of the two shard states through merge_states
    stack = attnstate.State(np.stack([p.o for p in parts], 1),
                            np.stack([attnstate.rebase(p, "natural").lse for p in parts], 1),
                            "natural")
    both = attnstate.merge_states(stack)
    if with_sinks:
        attnstate.merge_state_(both, attnstate.sink_state(sinks, 4, RANK))
    np.testing.assert_allclose(both.o, whole.o, atol=2e-6)
    check(whole, reference(q_nope, q_pe, cache, SCALE, sinks=sinks), 2e-5)


@pytest.mark.parametrize("policy,num_splits,split_size", [("fixed_count", 5, 0),
                                                          ("fixed_size", 0, 32)])
def test_split_layouts_agree(policy, num_splits, split_size):
    rng = np.random.default_rng(9)
    seq_lens = np.array([300, 20, 129], np.int32)
    cache = Cache(rng, seq_lens, 16)
    q_nope, q_pe = queries(rng, 3, 2, 4)
    one = attnstate.MlaDecode().plan(seq_lens, heads=4, dtype="float32", q_len=2,
                                     policy="fixed_count", num_splits=1, scale=SCALE)
    many = attnstate.MlaDecode().plan(seq_lens, heads=4, dtype="float32", q_len=2, policy=policy,
                                      num_splits=num_splits, split_size=split_size, scale=SCALE)
    args = (q_nope, q_pe, cache.ckv, cache.kpe, seq_lens)
    a = one.run(*args, page_indptr=cache.indptr, page_indices=cache.indices)
    b = many.run(*args, page_indptr=cache.indptr, page_indices=cache.indices)
    np.testing.assert_allclose(b.o, a.o, atol=2e-6)
    np.testing.assert_allclose(b.lse, a.lse, atol=2e-6)


def test_a_plan_serves_fewer_and_shorter_requests_and_out():
    rng = np.random.default_rng(13)
    seq_lens = np.array([80, 50, 10], np.int32)
    cache = Cache(rng, seq_lens, 16)
    mla = attnstate.MlaDecode().plan(seq_lens, heads=4, dtype="float32", scale=SCALE)
    fewer = Cache(rng, np.array([60, 3], np.int32), 16)
    q_nope, q_pe = queries(rng, 2, 1, 4)
    out = attnstate.State(np.full((2, 4, RANK), np.nan, np.float32),
                          np.full((2, 4), np.nan, np.float32), "base2")
    assert mla.run(q_nope, q_pe, fewer.ckv, fewer.kpe, fewer.seq_lens, block_table=fewer.table,
                   out=out) is out
    check(out, reference(q_nope, q_pe, fewer, SCALE, base="base2"), 2e-5)


def test_plan_errors_name_the_argument():
    lens = np.array([5], np.int32)
    plan = attnstate.MlaDecode().plan
    cases = [
        (dict(seq_lens=np.array([5], np.int64)), "argument 'seq_lens': expected dtype int32"),
        (dict(seq_lens=np.array([-1], np.int32)), "argument 'seq_lens': expected lengths >= 0"),
        (dict(heads=0), "argument 'heads'"),
        (dict(heads=2.5), "argument 'heads': expected an int"),
        (dict(q_len=9), "argument 'q_len'"),
        (dict(kv_lora_rank=0), "argument 'kv_lora_rank'"),
        (dict(rope_dim=0), "argument 'rope_dim'"),
        (dict(dtype="e4m3"), "argument 'dtype'"),
        (dict(dtype="int8"), "argument 'dtype'"),
        (dict(kv_dtype="float64"), "argument 'kv_dtype'"),
        (dict(kpe_dtype="int32"), "argument 'kpe_dtype'"),
        (dict(scale=float("nan")), "argument 'scale'"),
        (dict(scale="big"), "argument 'scale'"),
        (dict(policy="many"), "argument 'policy'"),
        (dict(policy="fixed_count", num_splits=0), "argument 'num_splits'"),
        (dict(policy="fixed_size", split_size=10), "argument 'split_size'"),
    ]
    for change, message in cases:
        kwargs = dict(seq_lens=lens, heads=2, dtype="float32")
        kwargs.update(change)
        with pytest.raises(attnstate.Error, match=message):
            plan(kwargs.pop("seq_lens"), **kwargs)
    with pytest.raises(attnstate.Error, match="call plan"):
        attnstate.MlaDecode().run(None, None, None, None, None)
    with pytest.raises(attnstate.Error, match="a planned MlaDecode"):
        attnstate.MlaDecode().workspace_bytes


def test_run_errors_name_the_argument():
    rng = np.random.default_rng(17)
    lens = np.array([20, 9], np.int32)
    cache = Cache(rng, lens, 8)
    q_nope, q_pe = queries(rng, 2, 1, 2)
    mla = attnstate.MlaDecode().plan(lens, heads=2, dtype="float32")
    csr = cache.table_kwargs("csr")

    def run(*, qn=q_nope, qp=q_pe, ckv=cache.ckv, kpe=cache.kpe, seq_lens=lens, tables=csr,
            **kw):
        return mla.run(qn, qp, ckv, kpe, seq_lens, **tables, **kw)

    cases = [
        (dict(qn=q_nope[:, :, :1]), "argument 'q_nope': expected shape \\(batch, 1, 2, 512\\)"),
        (dict(qp=q_pe[:1]), "argument 'q_pe.shape\\[0\\]'"),
        (dict(seq_lens=lens.astype(np.int64)), "argument 'seq_lens': expected dtype int32"),
        (dict(seq_lens=np.array([20, 90], np.int32)),
         "argument 'kv.seq_lens': expected at most the pages of the request"),
        (dict(tables={**csr, "block_table": cache.table}), "argument 'kv.block_table'"),
        (dict(tables={}), "argument 'kv.block_table': expected exactly one"),
        (dict(tables={"page_indptr": cache.indptr}), "argument 'kv.page_indices'"),
        (dict(tables={"page_indptr": cache.indptr, "page_indices": cache.indices + 100}),
         "argument 'kv.page_indices': expected page ids in \\[0, num_pages = 6\\)"),
    ]
    expect_errors(run, cases + shared_run_errors(q_nope, q_pe, cache.ckv, cache.kpe))


def test_fp8_run_errors_name_the_scale():
    rng = np.random.default_rng(19)
    lens = np.array([20], np.int32)
    cache = Cache(rng, lens, 8, ckv_dtype="e4m3", kpe_dtype="bfloat16", ckv_scale=0.5)
    q_nope, q_pe = queries(rng, 1, 1, 2, "bfloat16")
    mla = attnstate.MlaDecode().plan(lens, heads=2, dtype="bfloat16", kv_dtype="e4m3",
                                     kpe_dtype="bfloat16")
    for scale, message in ((0.0, "'ckv_scale': expected a finite scale > 0"),
                           (float("inf"), "'ckv_scale': expected a finite scale > 0")):
        with pytest.raises(attnstate.Error, match=message):
            mla.run(q_nope, q_pe, cache.ckv, cache.kpe, lens, block_table=cache.table,
                    ckv_scale=scale)
    with pytest.raises(attnstate.Error, match="argument 'ckv': expected an array of the plan's"):
        mla.run(q_nope, q_pe, cache.ckv.astype(np.float32), cache.kpe, lens,
                block_table=cache.table, ckv_scale=0.5)
    with pytest.raises(attnstate.Error, match="'kpe': expected dtype bf16 \\(the plan's kpe_dtype"):
        mla.run(q_nope, q_pe, cache.ckv, cache.kpe.astype(np.float32), lens,
                block_table=cache.table, ckv_scale=0.5)


# ---- CUDA: the CUDA backend against the CPU backend on fresh random inputs ----------------------

torch = cuda_torch()


def _cuda_case(seed, seq_lens, page_size, heads, q_len, layout, ckv_dtype, kpe_dtype, table):
    """Random host inputs and their CUDA copies: (host args, device args) of a run."""
    rng = np.random.default_rng(seed)
    ckv_scale = 0.05 if ckv_dtype != "bfloat16" else 1.0
    kpe_scale = 0.08 if kpe_dtype != "bfloat16" else 1.0
    cache = Cache(rng, seq_lens, page_size, layout, ckv_dtype, kpe_dtype, ckv_scale, kpe_scale)
    q_nope, q_pe = queries(rng, len(seq_lens), q_len, heads, "bfloat16",
                           flashmla=layout == "one_pool")
    host = dict(q_nope=q_nope, q_pe=q_pe, ckv=cache.ckv, kpe=cache.kpe, seq_lens=cache.seq_lens,
                tables=cache.table_kwargs(table),
                ckv_scale=None if ckv_dtype == "bfloat16" else ckv_scale,
                kpe_scale=None if kpe_dtype == "bfloat16" else kpe_scale)

    device = {k: to_cuda(torch, v) for k, v in host.items() if isinstance(v, np.ndarray)}
    device["tables"] = {k: torch.from_numpy(v).cuda() for k, v in host["tables"].items()}
    for k in ("ckv_scale", "kpe_scale"):
        device[k] = host[k]
    return host, device


def _run(mla, args, **kw):
    return mla.run(args["q_nope"], args["q_pe"], args["ckv"], args["kpe"], args["seq_lens"],
                   **args["tables"], ckv_scale=args["ckv_scale"], kpe_scale=args["kpe_scale"],
                   **kw)


def _poisoned_out(tokens, heads, dtype, base):
    return poisoned_out(torch, tokens, heads, dtype, base)


@pytest.mark.gpu
@requires_torch_cuda
@pytest.mark.parametrize("page_size,layout,table", [(1, "two_pools", "csr"),
                                                    (16, "one_pool", "block"),
                                                    (64, "two_pools", "block"),
                                                    (64, "one_pool", "csr")])
@pytest.mark.parametrize("ckv_dtype,kpe_dtype", [("bfloat16", "bfloat16"), ("e4m3", "bfloat16"),
                                                 ("e4m3", "e4m3")])
@pytest.mark.parametrize("heads,q_len", [(16, 1), (128, 2), (64, 4)])
def test_cuda_matches_the_cpu(page_size, layout, table, ckv_dtype, kpe_dtype, heads, q_len):
    if layout == "one_pool" and ckv_dtype != kpe_dtype:
        pytest.skip("one pool holds one dtype")
    seq_lens = np.array([700, 0, 3, 1500], np.int32)
    seed = [page_size, len(layout), len(table), len(ckv_dtype), len(kpe_dtype), heads, q_len]
    host, device = _cuda_case(seed, seq_lens, page_size, heads, q_len, layout, ckv_dtype,
                              kpe_dtype, table)
    kw = dict(heads=heads, dtype="bfloat16", kv_dtype=ckv_dtype, kpe_dtype=kpe_dtype,
              q_len=q_len, scale=SCALE)
    cpu = _run(attnstate.MlaDecode().plan(seq_lens, **kw), host)
    mla = attnstate.MlaDecode().plan(seq_lens, like=device["ckv"], **kw)
    for base in ("natural", "base2"):
        out = _poisoned_out(len(seq_lens) * q_len, heads, torch.float32, base)
        assert _run(mla, device, out=out) is out
        torch.cuda.synchronize()
        compare_cuda(out, attnstate.rebase(cpu, base), 2e-2)


@pytest.mark.gpu
@requires_torch_cuda
@pytest.mark.parametrize("o_dtype", ["float32", "bfloat16", "float16"])
def test_cuda_splits_sinks_and_out_dtypes(o_dtype):
    seq_lens = np.array([4000, 1, 0, 2500, 64], np.int32)
    host, device = _cuda_case(23, seq_lens, 64, 16, 1, "two_pools", "bfloat16", "bfloat16",
                              "csr")
    sinks = np.random.default_rng(29).standard_normal(16).astype(np.float32)
    kw = dict(heads=16, dtype="bfloat16", scale=SCALE)
    cpu = _run(attnstate.MlaDecode().plan(seq_lens, **kw), host, sinks=sinks)
    mla = attnstate.MlaDecode().plan(seq_lens, like=device["ckv"], policy="fixed_count",
                                     num_splits=6, **kw)
    assert mla.max_splits > 1 and mla.workspace is not None
    for _ in range(2):  # the workspace's tickets are left zero for the next run
        out = _poisoned_out(len(seq_lens), 16, getattr(torch, o_dtype), "natural")
        _run(mla, device, out=out, sinks=torch.from_numpy(sinks).cuda())
        torch.cuda.synchronize()
        compare_cuda(out, cpu, 2e-2)


@pytest.mark.gpu
@requires_torch_cuda
def test_cuda_custom_op_and_errors():
    seq_lens = np.array([300, 77], np.int32)
    host, device = _cuda_case(31, seq_lens, 64, 32, 2, "one_pool", "bfloat16", "bfloat16", "csr")
    kw = dict(heads=32, dtype="bfloat16", q_len=2, scale=SCALE)
    cpu = _run(attnstate.MlaDecode().plan(seq_lens, **kw), host)
    mla = attnstate.MlaDecode().plan(seq_lens, like=device["ckv"], **kw)
    from attnstate import torch_ops
    o, lse = torch_ops.mla_decode(mla, device["q_nope"], device["q_pe"], device["ckv"],
                                  device["kpe"], device["seq_lens"], **device["tables"],
                                  base=1, dtype="float32")
    torch.cuda.synchronize()
    compare_cuda(attnstate.State(o, lse, "base2"), attnstate.rebase(cpu, "base2"), 2e-2)
    pid = torch_ops.register_plan(mla)
    ip, ix = device["tables"]["page_indptr"], device["tables"]["page_indices"]

    def step(q_nope, q_pe, ckv, kpe, seq_lens, ip, ix, ws):
        return torch.ops.attnstate.mla_decode(pid, q_nope, q_pe, ckv, kpe, seq_lens, ip, ix,
                                              None, ws, 0, "")

    args = (device["q_nope"], device["q_pe"], device["ckv"], device["kpe"], device["seq_lens"],
            ip, ix, mla.workspace)
    got = replayed_in_cuda_graphs(torch, step, args)
    compare_cuda(attnstate.State(*got, "natural"), cpu, 2e-2)
    # the CUDA limits, refused by name
    with pytest.raises(attnstate.Error, match="heads"):
        attnstate.MlaDecode().plan(seq_lens, heads=12, dtype="bfloat16", like=device["ckv"])
    with pytest.raises(attnstate.Error, match="q_nope"):
        mla.run(host["q_nope"], host["q_pe"], host["ckv"], host["kpe"], seq_lens,
                **host["tables"])
