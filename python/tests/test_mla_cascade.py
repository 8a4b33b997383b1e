"""The MLA cascade (shared latent prefixes) through attnstate.MlaCascade: the CPU backend against a
float64 NumPy attention over each request's concatenated segments (2 and 3 levels, shared and
empty segments, causal and not, q_len 1 and 3, pages of 1 and 16 tokens, both peers' cache
layouts, state dtypes and bases, fp8 pools, sinks) and against attnstate.MlaDecode over the
concatenated pages; levels found by cascade_levels in a block table; outputs poisoned with NaN;
argument errors by name; the docs' example; the CUDA backend against the CPU one (skipped without
torch, a GPU or the CUDA backend)."""

import copy
import os
import runpy

import numpy as np
import pytest

import attnstate
from helpers import cuda_torch, has_module, requires_torch_cuda
from mla_helpers import NP_DTYPES as _NP
from mla_helpers import (RANK, ROPE, SCALE, check, compare_cuda, expect_errors, ln_to,
                         poisoned_out, queries, replayed_in_cuda_graphs, row_state,
                         shared_run_errors, stored, to_cuda)


class Tree:
    """An MLA cascade over one latent pool of shuffled pages (plus a spare page no segment
    owns). `spec`: per level, its segments as (requests, tokens), covering the batch in order.
    Holds the levels (host int32 tuples), the pool in FlashInfer's two pools or FlashMLA's one
    576-wide pool, and each request's tokens per level (flat slots of the pool)."""

    def __init__(self, rng, spec, page_size, layout="two_pools", ckv_dtype="float32",
                 kpe_dtype=None, ckv_scale=1.0, kpe_scale=1.0, rank=RANK, rope=ROPE):
        kpe_dtype = kpe_dtype or ckv_dtype
        self.batch = sum(n for n, _ in spec[0])
        pages_of = [[-(-t // page_size) for _, t in level] for level in spec]
        self.num_pages = sum(map(sum, pages_of)) + 1
        perm = rng.permutation(self.num_pages).astype(np.int32)
        ckv, self.ckv_real = stored(rng.standard_normal((self.num_pages, page_size, rank)),
                                    ckv_dtype, ckv_scale)
        kpe, self.kpe_real = stored(rng.standard_normal((self.num_pages, page_size, rope)),
                                    kpe_dtype, kpe_scale)
        if layout == "one_pool":  # FlashMLA: (blocks, block_size, 1, 576), two views of it
            assert ckv_dtype == kpe_dtype
            pool = np.empty((self.num_pages, page_size, 1, rank + rope), _NP[ckv_dtype])
            pool[:, :, 0, :rank], pool[:, :, 0, rank:] = ckv, kpe
            self.ckv, self.kpe = pool[..., :rank], pool[..., rank:]
        else:
            self.ckv, self.kpe = ckv, kpe
        self.page_size = page_size
        self.levels, self.slots = [], [[] for _ in range(self.batch)]
        first = 0
        for level, pages in zip(spec, pages_of):
            assert sum(n for n, _ in level) == self.batch
            request_indptr = np.concatenate([[0], np.cumsum([n for n, _ in level])])
            page_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
            page_indices = perm[first:first + page_indptr[-1]].copy()
            first += page_indptr[-1]
            for s, (_, tokens) in enumerate(level):
                own = page_indices[page_indptr[s]:page_indptr[s + 1]]
                slots = (own[:, None] * page_size + np.arange(page_size)).reshape(-1)[:tokens]
                for b in range(request_indptr[s], request_indptr[s + 1]):
                    self.slots[b].append(slots)
            self.levels.append((request_indptr.astype(np.int32), page_indptr, page_indices,
                                np.array([t for _, t in level], np.int32)))

    def keys(self, b):
        """Request b's (ckv, kpe) real values over its segments in level order, float64."""
        slots = np.concatenate(self.slots[b])
        return (self.ckv_real.reshape(-1, self.ckv_real.shape[-1])[slots],
                self.kpe_real.reshape(-1, self.kpe_real.shape[-1])[slots])

    def shortened(self, level, seg_lens):
        """The same cascade with level `level`'s segments cut to `seg_lens` tokens (within their
        pages): other lengths for the same plan."""
        out = copy.copy(self)
        lv = list(self.levels[level])
        lv[3] = np.asarray(seg_lens, np.int32)
        out.levels = self.levels[:level] + [tuple(lv)] + self.levels[level + 1:]
        out.slots = [list(s) for s in self.slots]
        for s in range(len(seg_lens)):
            for b in range(lv[0][s], lv[0][s + 1]):
                out.slots[b][level] = self.slots[b][level][:seg_lens[s]]
        return out

    def concatenated_csr(self):
        """A CSR page table of each request's pages in level order: the cascade as one decode
        (every segment but the last of a request must fill its pages)."""
        pages = []
        for b in range(self.batch):
            own = [slots[::self.page_size] // self.page_size for slots in self.slots[b]]
            assert all(len(s) % self.page_size == 0 for s in self.slots[b][:-1])
            pages.append(np.concatenate(own))
        indptr = np.concatenate([[0], np.cumsum([len(p) for p in pages])]).astype(np.int32)
        return indptr, np.concatenate(pages).astype(np.int32)

    def seq_lens(self):
        return np.array([sum(len(s) for s in slots) for slots in self.slots], np.int32)


def reference(q_nope, q_pe, tree, scale, causal=True, sinks=None, base="natural"):
    """The float64 state (batch * q_len, heads, rank) of the cascade: row i of request b over
    its concatenated keys [0, total - q_len + i] (causal) or all of them."""
    batch, q_len, heads, rank = q_nope.shape
    o = np.zeros((batch * q_len, heads, rank))
    lse = np.full((batch * q_len, heads), -np.inf)
    for b in range(batch):
        ckv, kpe = tree.keys(b)
        for i in range(q_len):
            n = max(len(ckv) - q_len + i + 1, 0) if causal else len(ckv)
            o[b * q_len + i], lse[b * q_len + i] = row_state(q_nope[b, i], q_pe[b, i], ckv[:n],
                                                             kpe[:n], scale, sinks)
    return o, lse * ln_to(base)


def three_levels(q_len, causal=True):
    """Five requests: a prefix shared by four (the fifth has none), a middle level shared by
    pairs (one pair's segment empty), each request's own suffix (the last request empty at
    q_len 1: a request with no keys)."""
    least = q_len - 1 if causal else 0  # a causal last-level segment holds the new tokens
    return [[(4, 37), (1, 0)],
            [(2, 20), (2, 0), (1, 0)],
            [(1, max(t, least)) for t in (5, 1, 9, 3, 0)]]


def nan_state(tokens, heads, base, rank=RANK):
    return attnstate.State(np.full((tokens, heads, rank), np.nan, np.float32),
                           np.full((tokens, heads), np.nan, np.float32), base)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("layout", ["two_pools", "one_pool"])
@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_cpu_matches_the_reference(page_size, layout, q_len, causal):
    rng = np.random.default_rng([page_size, len(layout), q_len, causal])
    tree = Tree(rng, three_levels(q_len, causal), page_size, layout)
    cas = attnstate.MlaCascade().plan(tree.levels, heads=4, num_pages=tree.num_pages,
                                      dtype="float32", batch=5, page_size=page_size, q_len=q_len,
                                      scale=SCALE, causal=causal)
    assert cas.workspace is None and cas.workspace_bytes == 0 and cas.num_levels == 3
    for run in range(2):  # plan once, run many: fresh queries each time
        q_nope, q_pe = queries(rng, 5, q_len, 4, flashmla=layout == "one_pool")
        out = nan_state(5 * q_len, 4, "natural")
        assert cas.run(q_nope, q_pe, tree.ckv, tree.kpe, tree.levels, out=out) is out
        assert not np.isnan(out.o).any() and not np.isnan(out.lse).any()  # every row written
        check(out, reference(q_nope, q_pe, tree, SCALE, causal), 2e-5)
    if q_len == 1 and causal:  # the request with no keys: (0, -inf)
        assert np.all(out.lse[4] == -np.inf) and not out.o[4].any()


@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("page_size", [16, 64])
def test_equals_mla_decode_over_the_concatenated_pages(q_len, page_size):
    # DeepSeek's widths and a 16-head group: a page-aligned prefix and middle, so each
    # request's pages in level order are one decode's page table
    rng = np.random.default_rng([q_len, page_size])
    spec = [[(6, 2 * page_size)], [(3, page_size), (3, 0)],
            [(1, t) for t in (1, 40, 77, 2, 130, 16)]]
    tree = Tree(rng, spec, page_size, ckv_dtype="bfloat16")
    q_nope, q_pe = queries(rng, 6, q_len, 16, "bfloat16")
    cas = attnstate.MlaCascade().plan(tree.levels, heads=16, num_pages=tree.num_pages,
                                      dtype="bfloat16", batch=6, page_size=page_size,
                                      q_len=q_len, scale=SCALE)
    got = cas.run(q_nope, q_pe, tree.ckv, tree.kpe, tree.levels, dtype="float32")
    indptr, indices = tree.concatenated_csr()
    seq_lens = tree.seq_lens()
    mla = attnstate.MlaDecode().plan(seq_lens, heads=16, dtype="bfloat16", q_len=q_len,
                                     scale=SCALE, policy="fixed_count", num_splits=1)
    want = mla.run(q_nope, q_pe, tree.ckv, tree.kpe, seq_lens, page_indptr=indptr,
                   page_indices=indices, dtype="float32")
    np.testing.assert_allclose(got.o, want.o, atol=2e-6, rtol=1e-5)
    np.testing.assert_allclose(got.lse, want.lse, atol=2e-6, rtol=1e-6)
    check(got, reference(q_nope, q_pe, tree, SCALE), 2e-5)


@pytest.mark.parametrize("q_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("o_dtype,atol", [("float32", 2e-5), ("float16", 2e-3),
                                          ("bfloat16", 1.6e-2)])
@pytest.mark.parametrize("base", ["natural", "base2"])
def test_state_dtypes_and_bases(q_dtype, o_dtype, atol, base):
    rng = np.random.default_rng([len(q_dtype), len(o_dtype), len(base)])
    tree = Tree(rng, three_levels(2), 16, ckv_dtype="bfloat16")
    q_nope, q_pe = queries(rng, 5, 2, 8, q_dtype)
    cas = attnstate.MlaCascade().plan(tree.levels, heads=8, num_pages=tree.num_pages,
                                      dtype=q_dtype, kv_dtype="bfloat16", batch=5, page_size=16,
                                      q_len=2, scale=SCALE)
    out = cas.run(q_nope, q_pe, tree.ckv, tree.kpe, tree.levels, dtype=o_dtype, base=base)
    assert out.o.dtype == _NP[o_dtype] and out.base == attnstate.Base[base.upper()]
    assert out.o.shape == (10, 8, RANK)
    check(out, reference(q_nope, q_pe, tree, SCALE, base=base), atol)


@pytest.mark.parametrize("ckv_dtype,kpe_dtype,layout", [
    ("e4m3", "bfloat16", "two_pools"),  # FlashMLA keeps the rotary part in bf16
    ("e4m3", "e4m3", "one_pool"),
    ("e5m2", "e5m2", "two_pools"),
])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_fp8_pools_with_per_tensor_scales(ckv_dtype, kpe_dtype, layout, as_bytes):
    rng = np.random.default_rng([len(ckv_dtype), len(kpe_dtype), len(layout), as_bytes])
    ckv_scale = 0.07
    kpe_scale = 0.11 if kpe_dtype != "bfloat16" else 1.0
    tree = Tree(rng, three_levels(1), 16, layout, ckv_dtype, kpe_dtype, ckv_scale, kpe_scale)
    q_nope, q_pe = queries(rng, 5, 1, 4, "bfloat16")
    cas = attnstate.MlaCascade().plan(tree.levels, heads=4, num_pages=tree.num_pages,
                                      dtype="bfloat16", kv_dtype=ckv_dtype, kpe_dtype=kpe_dtype,
                                      batch=5, page_size=16, scale=SCALE)
    ckv, kpe = tree.ckv, tree.kpe
    if as_bytes:  # the stored bytes, as array libraries without fp8 dtypes pass them
        ckv = ckv.view(np.uint8)
        kpe = kpe.view(np.uint8) if kpe_dtype != "bfloat16" else kpe
    out = cas.run(q_nope, q_pe, ckv, kpe, tree.levels, ckv_scale=ckv_scale,
                  kpe_scale=None if kpe_dtype == "bfloat16" else kpe_scale, dtype="float32")
    check(out, reference(q_nope, q_pe, tree, SCALE), 2e-5)


@pytest.mark.parametrize("base", ["natural", "base2"])
def test_sinks_merge_once_after_every_level(base):
    rng = np.random.default_rng(5)
    tree = Tree(rng, three_levels(1), 16)
    q_nope, q_pe = queries(rng, 5, 1, 4)
    sinks = rng.standard_normal(4).astype(np.float32) * 2
    cas = attnstate.MlaCascade().plan(tree.levels, heads=4, num_pages=tree.num_pages,
                                      dtype="float32", batch=5, page_size=16, scale=SCALE)
    out = cas.run(q_nope, q_pe, tree.ckv, tree.kpe, tree.levels, sinks=sinks, base=base)
    check(out, reference(q_nope, q_pe, tree, SCALE, sinks=sinks, base=base), 2e-5)
    # the request with no keys is the sink's state (0, sink)
    np.testing.assert_allclose(out.lse[4], sinks * ln_to(base), rtol=1e-6)
    assert not out.o[4].any()
    # the state without sinks, merged with the sink state once, is the same state
    plain = cas.run(q_nope, q_pe, tree.ckv, tree.kpe, tree.levels, base=base)
    attnstate.merge_state_(plain, attnstate.sink_state(sinks, 5, RANK))
    np.testing.assert_allclose(plain.o, out.o, atol=2e-6)
    np.testing.assert_allclose(plain.lse, out.lse, atol=2e-6)


def test_a_plan_runs_other_lengths_within_the_segments_pages():
    rng = np.random.default_rng(7)
    tree = Tree(rng, three_levels(1), 16)
    cas = attnstate.MlaCascade().plan(tree.levels, heads=4, num_pages=tree.num_pages,
                                      dtype="float32", batch=5, page_size=16, scale=SCALE)
    shorter = tree.shortened(0, [30, 0]).shortened(2, [1, 0, 9, 2, 0])
    q_nope, q_pe = queries(rng, 5, 1, 4)
    out = cas.run(q_nope, q_pe, tree.ckv, tree.kpe, shorter.levels)
    check(out, reference(q_nope, q_pe, shorter, SCALE), 2e-5)


def test_levels_found_in_a_block_table():
    # four requests over pages of 16: three share a prompt of 3 pages, two of them (not next to
    # each other) a 4th page; the cascade takes its queries in another order
    rng = np.random.default_rng(11)
    page, heads = 16, 16
    block_table = np.array([[7, 8, 9, 9, 9, 9], [0, 1, 2, 3, 4, 9], [0, 1, 2, 6, 9, 9],
                            [0, 1, 2, 3, 5, 9]], np.int32)
    seq_lens = np.array([20, 75, 56, 66], np.int32)
    ckv, _ = stored(rng.standard_normal((10, page, RANK)), "bfloat16")
    kpe, _ = stored(rng.standard_normal((10, page, ROPE)), "bfloat16")
    q_nope, q_pe = queries(rng, 4, 1, heads, "bfloat16")
    lv = attnstate.cascade_levels(seq_lens, page_size=page, num_pages=10,
                                  block_table=block_table)
    assert len(lv.levels) >= 2 and lv.keys_read < lv.keys_total  # the prompt is shared
    cas = attnstate.MlaCascade().plan(lv, heads=heads, num_pages=10, dtype="bfloat16",
                                      scale=SCALE)
    order = np.asarray(lv.order)
    assert not lv.identity_order
    got = cas.run(q_nope[order], q_pe[order], ckv, kpe, lv, dtype="float32")
    mla = attnstate.MlaDecode().plan(seq_lens, heads=heads, dtype="bfloat16", scale=SCALE)
    want = mla.run(q_nope, q_pe, ckv, kpe, seq_lens, block_table=block_table, dtype="float32")
    np.testing.assert_allclose(got.o, want.o[order], atol=2e-6, rtol=1e-5)
    np.testing.assert_allclose(got.lse, want.lse[order], atol=2e-6, rtol=1e-6)


def test_the_docs_example_runs_and_agrees_with_mla_decode(capsys):
    # docs/mla.md, "The MLA cascade from Python": the DeepSeek-V3-shaped CPU example asserts
    # that the cascade equals MlaDecode over the concatenated pages; a failure raises here.
    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
    runpy.run_path(os.path.join(examples, "mla_cascade_numpy.py"), run_name="__main__")
    assert "MLA cascade == MlaDecode over the whole pages" in capsys.readouterr().out


def _small_tree(rng):
    return Tree(rng, [[(2, 10)], [(1, 3), (1, 6)]], 4, rank=8, rope=4)


def test_plan_errors_name_the_argument():
    tree = _small_tree(np.random.default_rng(13))
    plan = attnstate.MlaCascade().plan
    levels = tree.levels
    bad_seg = [levels[0], levels[1][:3] + (np.array([3, 9], np.int32),)]
    regroup = [levels[0], (np.array([0, 2, 1], np.int32),) + levels[1][1:]]
    cases = [
        (dict(heads=0), "argument 'heads': expected >= 1"),
        (dict(heads=2.5), "argument 'heads': expected an int"),
        (dict(q_len=9), "argument 'q_len': expected 1..8"),
        (dict(q_len=0), "argument 'q_len': expected 1..8"),
        (dict(kv_lora_rank=0), "argument 'kv_lora_rank': expected >= 1"),
        (dict(rope_dim=0), "argument 'rope_dim': expected >= 1"),
        (dict(batch=None), "argument 'batch': expected an int \\(required unless levels"),
        (dict(batch=-1), "argument 'batch': expected >= 0"),
        (dict(batch=3), "argument 'levels\\[0\\].request_indptr'"),
        (dict(page_size=None), "argument 'page_size': expected an int"),
        (dict(page_size=0), "argument 'page_size': expected >= 1"),
        (dict(num_pages=-1), "argument 'num_pages': expected >= 0"),
        (dict(num_pages=2), "argument 'levels\\[\\d\\].page_indices': expected page ids in "
                            "\\[0, kv.num_pages = 2\\)"),
        (dict(num_pages="4"), "argument 'num_pages': expected an int"),
        (dict(dtype="e4m3"), "argument 'dtype': expected float32, float16 or bfloat16"),
        (dict(dtype="int8"), "argument 'dtype'"),
        (dict(kv_dtype="float64"), "argument 'kv_dtype'"),
        (dict(kpe_dtype="int32"), "argument 'kpe_dtype'"),
        (dict(scale=float("nan")), "argument 'scale': expected a finite value"),
        (dict(scale="big"), "argument 'scale': expected a finite float"),
        (dict(causal="yes"), "argument 'causal': expected a bool"),
        (dict(levels=5), "argument 'levels': expected an attnstate.CascadeLevels"),
        (dict(levels=[]), "argument 'levels': expected 1..8 levels"),
        (dict(levels=levels * 5), "argument 'levels': expected 1..8 levels"),
        (dict(levels=[levels[0][:3]]), "argument 'levels\\[0\\]': expected \\(request_indptr"),
        (dict(levels=bad_seg), "argument 'levels\\[1\\].seg_lens'"),
        (dict(levels=regroup), "argument 'levels\\[1\\].request_indptr'"),
        (dict(levels=[levels[0], tuple(a.astype(np.int64) for a in levels[1])]),
         "argument 'levels\\[1\\].request_indptr': expected dtype int32"),
        # causal: each request's last-level segment holds its q_len - 1 earlier new tokens
        (dict(q_len=5), "argument 'levels\\[1\\].seg_lens': expected a last-level segment"),
    ]
    for change, message in cases:
        kwargs = dict(levels=levels, heads=2, num_pages=tree.num_pages, dtype="float32",
                      batch=2, page_size=4, kv_lora_rank=8, rope_dim=4)
        kwargs.update(change)
        with pytest.raises(attnstate.Error, match="attnstate.MlaCascade.plan: " + message):
            plan(kwargs.pop("levels"), **kwargs)
    # the unchanged plan, and q_len 5 without causal masking, are accepted
    plan(levels, heads=2, num_pages=tree.num_pages, dtype="float32", batch=2, page_size=4,
         kv_lora_rank=8, rope_dim=4)
    plan(levels, heads=2, num_pages=tree.num_pages, dtype="float32", batch=2, page_size=4,
         kv_lora_rank=8, rope_dim=4, q_len=5, causal=False)
    with pytest.raises(attnstate.Error, match="call plan"):
        attnstate.MlaCascade().run(None, None, None, None, None)
    with pytest.raises(attnstate.Error, match="a planned MlaCascade"):
        attnstate.MlaCascade().workspace_bytes


def test_run_errors_name_the_argument():
    rng = np.random.default_rng(17)
    tree = _small_tree(rng)
    q_nope, q_pe = queries(rng, 2, 1, 2, rank=8, rope=4)
    cas = attnstate.MlaCascade().plan(tree.levels, heads=2, num_pages=tree.num_pages,
                                      dtype="float32", batch=2, page_size=4, kv_lora_rank=8,
                                      rope_dim=4)
    levels = tree.levels

    def run(*, qn=q_nope, qp=q_pe, ckv=tree.ckv, kpe=tree.kpe, lv=levels, **kw):
        return cas.run(qn, qp, ckv, kpe, lv, **kw)

    regroup = [levels[0], (np.array([0, 2, 1], np.int32),) + levels[1][1:]]
    cases = [
        (dict(qn=q_nope[:1]), "argument 'q_nope': expected shape \\(2, 1, 2, 8\\) \\(the "
                              "plan's batch, q_len, heads and kv_lora_rank\\)"),
        (dict(qn=q_nope[:, :, :1]), "argument 'q_nope': expected shape \\(2, 1, 2, 8\\)"),
        (dict(qn=q_nope[..., 0]), "argument 'q_nope'"),
        (dict(ckv=tree.ckv[:, :2], kpe=tree.kpe[:, :2]),
         "argument 'ckv': expected pages of the plan's page_size = 4 tokens, got 2"),
        (dict(lv=levels[:1]), "argument 'levels': expected 2 levels \\(the plan's\\)"),
        (dict(lv=5), "argument 'levels': expected an attnstate.CascadeLevels"),
        (dict(lv=regroup), "argument 'levels\\[1\\].request_indptr'"),
        (dict(ckv=tree.ckv[:2], kpe=tree.kpe[:2]),
         "argument 'levels\\[\\d\\].page_indices': expected page ids in \\[0, kv.num_pages = "
         "2\\)"),
    ]
    expect_errors(run, cases + shared_run_errors(q_nope, q_pe, tree.ckv, tree.kpe))


@pytest.mark.skipif(not has_module("torch"), reason="needs torch")
def test_torch_custom_op_on_cpu_tensors():
    import torch as th
    from attnstate import torch_ops
    rng = np.random.default_rng(37)
    tree = Tree(rng, three_levels(2), 16)
    q_nope, q_pe = queries(rng, 5, 2, 4)
    cas = attnstate.MlaCascade().plan(tree.levels, heads=4, num_pages=tree.num_pages,
                                      dtype="float32", batch=5, page_size=16, q_len=2,
                                      scale=SCALE)
    args = [th.from_numpy(a) for a in (q_nope, q_pe, tree.ckv, tree.kpe)]
    o, lse = torch_ops.mla_cascade(cas, *args, tree.levels, base=1)
    check(attnstate.State(o.numpy(), lse.numpy(), "base2"),
          reference(q_nope, q_pe, tree, SCALE, base="base2"), 2e-5)
    pid = torch_ops.register_plan(cas)
    flat = [th.from_numpy(a) for level in tree.levels for a in level]

    def step(q_nope, q_pe, ckv, kpe, levels):
        return th.ops.attnstate.mla_cascade(pid, q_nope, q_pe, ckv, kpe, levels, None, 0, "")

    eager = step(*args, flat)
    got = th.compile(step, fullgraph=True, backend="aot_eager")(*args, flat)  # the fake traced
    assert th.equal(got[0], eager[0]) and th.equal(got[1], eager[1])
    check(attnstate.State(eager[0].numpy(), eager[1].numpy(), "natural"),
          reference(q_nope, q_pe, tree, SCALE), 2e-5)


# ---- CUDA: the CUDA backend against the CPU backend on fresh random inputs ----------------------

torch = cuda_torch()


def _device_levels(levels):
    return [tuple(torch.from_numpy(a).cuda() for a in level) for level in levels]


def _cuda_tree(seed, spec, page_size, layout, ckv_dtype, kpe_dtype):
    """A random cascade, its queries' dtype bfloat16, and the CUDA copies of its pool."""
    rng = np.random.default_rng(seed)
    ckv_scale = 0.05 if ckv_dtype != "bfloat16" else 1.0
    kpe_scale = 0.08 if kpe_dtype != "bfloat16" else 1.0
    tree = Tree(rng, spec, page_size, layout, ckv_dtype, kpe_dtype, ckv_scale, kpe_scale)
    tree.scales = dict(ckv_scale=None if ckv_dtype == "bfloat16" else ckv_scale,
                       kpe_scale=None if kpe_dtype == "bfloat16" else kpe_scale)
    tree.device = (to_cuda(torch, tree.ckv), to_cuda(torch, tree.kpe))
    return rng, tree


def _cuda_spec(q_len):
    """Six requests: a long prompt shared by five, a middle level shared by two and three, own
    suffixes (one empty at q_len 1)."""
    return [[(5, 700), (1, 0)], [(2, 90), (3, 33), (1, 0)],
            [(1, max(t, q_len - 1)) for t in (5, 1, 60, 200, 3, 0)]]


@pytest.mark.gpu
@requires_torch_cuda
@pytest.mark.parametrize("page_size,layout", [(1, "two_pools"), (16, "one_pool"),
                                              (64, "two_pools")])
@pytest.mark.parametrize("ckv_dtype,kpe_dtype", [("bfloat16", "bfloat16"), ("e4m3", "bfloat16"),
                                                 ("e4m3", "e4m3")])
@pytest.mark.parametrize("heads,q_len", [(16, 1), (128, 2), (64, 4)])
def test_cuda_matches_the_cpu(page_size, layout, ckv_dtype, kpe_dtype, heads, q_len):
    if layout == "one_pool" and ckv_dtype != kpe_dtype:
        pytest.skip("one pool holds one dtype")
    seed = [page_size, len(layout), len(ckv_dtype), len(kpe_dtype), heads, q_len]
    rng, tree = _cuda_tree(seed, _cuda_spec(q_len), page_size, layout, ckv_dtype, kpe_dtype)
    q_nope, q_pe = queries(rng, 6, q_len, heads, "bfloat16", flashmla=layout == "one_pool")
    kw = dict(heads=heads, num_pages=tree.num_pages, dtype="bfloat16", kv_dtype=ckv_dtype,
              kpe_dtype=kpe_dtype, batch=6, page_size=page_size, q_len=q_len, scale=SCALE)
    cpu = attnstate.MlaCascade().plan(tree.levels, **kw).run(
        q_nope, q_pe, tree.ckv, tree.kpe, tree.levels, dtype="float32", **tree.scales)
    cas = attnstate.MlaCascade().plan(tree.levels, like=tree.device[0], **kw)
    assert cas.workspace is not None and cas.workspace.is_cuda
    dq = (to_cuda(torch, q_nope), to_cuda(torch, q_pe))
    for base in ("natural", "base2"):
        out = poisoned_out(torch, 6 * q_len, heads, torch.float32, base)
        assert cas.run(*dq, *tree.device, _device_levels(tree.levels), out=out,
                       **tree.scales) is out
        torch.cuda.synchronize()
        compare_cuda(out, attnstate.rebase(cpu, base), 2e-2)


@pytest.mark.gpu
@requires_torch_cuda
@pytest.mark.parametrize("o_dtype", ["float32", "bfloat16", "float16"])
def test_cuda_sinks_out_dtypes_and_shorter_lengths(o_dtype):
    rng, tree = _cuda_tree(23, _cuda_spec(1), 64, "two_pools", "bfloat16", "bfloat16")
    q_nope, q_pe = queries(rng, 6, 1, 16, "bfloat16")
    sinks = rng.standard_normal(16).astype(np.float32)
    kw = dict(heads=16, num_pages=tree.num_pages, dtype="bfloat16", batch=6, page_size=64,
              scale=SCALE)
    cas = attnstate.MlaCascade().plan(tree.levels, like=tree.device[0], **kw)
    dq = (to_cuda(torch, q_nope), to_cuda(torch, q_pe))
    # the planned lengths, then shorter ones within the same pages: one plan serves both
    for t in (tree, tree.shortened(0, [650, 0]).shortened(2, [4, 1, 0, 129, 3, 0])):
        cpu = attnstate.MlaCascade().plan(tree.levels, **kw).run(
            q_nope, q_pe, t.ckv, t.kpe, t.levels, sinks=sinks, dtype="float32")
        check(cpu, reference(q_nope, q_pe, t, SCALE, sinks=sinks), 2e-5)
        out = poisoned_out(torch, 6, 16, getattr(torch, o_dtype), "natural")
        cas.run(*dq, *tree.device, _device_levels(t.levels), out=out,
                sinks=torch.from_numpy(sinks).cuda())
        torch.cuda.synchronize()
        compare_cuda(out, cpu, 2e-2)


@pytest.mark.gpu
@requires_torch_cuda
def test_cuda_errors_name_the_argument():
    rng, tree = _cuda_tree(31, _cuda_spec(1), 16, "two_pools", "bfloat16", "bfloat16")
    q_nope, q_pe = queries(rng, 6, 1, 16, "bfloat16")
    kw = dict(num_pages=tree.num_pages, dtype="bfloat16", batch=6, page_size=16)
    with pytest.raises(attnstate.Error, match="heads"):  # the CUDA kernel's group of 16
        attnstate.MlaCascade().plan(tree.levels, heads=12, like=tree.device[0], **kw)
    with pytest.raises(attnstate.Error, match="levels"):  # the plan reads host levels
        attnstate.MlaCascade().plan(_device_levels(tree.levels), heads=16,
                                    like=tree.device[0], **kw)
    cas = attnstate.MlaCascade().plan(tree.levels, heads=16, like=tree.device[0], **kw)
    assert "level" in cas.description
    with pytest.raises(attnstate.Error, match="argument 'q_nope'"):  # host arrays, CUDA plan
        cas.run(q_nope, q_pe, tree.ckv, tree.kpe, tree.levels)
    dq = (to_cuda(torch, q_nope), to_cuda(torch, q_pe))
    with pytest.raises(attnstate.Error, match="levels\\[0\\]"):  # host levels, CUDA arrays
        cas.run(*dq, *tree.device, tree.levels)
    cas.run(*dq, *tree.device, _device_levels(tree.levels))
    torch.cuda.synchronize()


@pytest.mark.gpu
@requires_torch_cuda
def test_cuda_custom_op_in_cuda_graphs():
    from attnstate import torch_ops
    rng, tree = _cuda_tree(41, _cuda_spec(2), 16, "one_pool", "bfloat16", "bfloat16")
    q_nope, q_pe = queries(rng, 6, 2, 32, "bfloat16", flashmla=True)
    kw = dict(heads=32, num_pages=tree.num_pages, dtype="bfloat16", batch=6, page_size=16,
              q_len=2, scale=SCALE)
    cpu = attnstate.MlaCascade().plan(tree.levels, **kw).run(q_nope, q_pe, tree.ckv, tree.kpe,
                                                             tree.levels, dtype="float32")
    cas = attnstate.MlaCascade().plan(tree.levels, like=tree.device[0], **kw)
    dq = (to_cuda(torch, q_nope), to_cuda(torch, q_pe))
    levels = _device_levels(tree.levels)
    o, lse = torch_ops.mla_cascade(cas, *dq, *tree.device, levels, base=1, dtype="float32")
    torch.cuda.synchronize()
    compare_cuda(attnstate.State(o, lse, "base2"), attnstate.rebase(cpu, "base2"), 2e-2)
    pid = torch_ops.register_plan(cas)
    flat = [a for level in levels for a in level]

    def step(q_nope, q_pe, ckv, kpe, levels, ws):
        return torch.ops.attnstate.mla_cascade(pid, q_nope, q_pe, ckv, kpe, levels, ws, 0, "")

    args = (*dq, *tree.device, flat, cas.workspace)
    got = replayed_in_cuda_graphs(torch, step, args)
    compare_cuda(attnstate.State(*got, "natural"), cpu, 2e-2)
