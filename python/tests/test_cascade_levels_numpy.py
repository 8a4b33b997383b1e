"""attnstate.cascade_levels and attnstate.decide_cascade on the CPU: levels found in a page table
(CSR and block table) give the plain decode's result through the cascade, the decision picks the
cascade where a long prompt is shared and the plain decode where little is, named errors."""

import numpy as np
import pytest

import attnstate

rng = np.random.default_rng(33)


def forest_table(page_size=4):
    """Seven requests: a 3-page system prompt shared by all, 2-page blocks shared by two groups
    (requests 0, 2, 4 and 1, 5; requests 3 and 6 have none), then 1-3 pages of their own, the
    last one partly filled; the groups interleave, so the levels reorder the requests."""
    pages = iter(rng.permutation(64).tolist())
    prompt = [next(pages) for _ in range(3)]
    block_a = [next(pages) for _ in range(2)]
    block_b = [next(pages) for _ in range(2)]
    lists, lens = [], []
    for b in range(7):
        mine = prompt + (block_a if b in (0, 2, 4) else block_b if b in (1, 5) else [])
        own = [next(pages) for _ in range(1 + b % 3)]
        lists.append(mine + own)
        lens.append((len(mine) + len(own) - 1) * page_size + 1 + b % page_size)
    return lists, np.array(lens, np.int32), 64


def csr(lists):
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int32)
    return indptr, np.concatenate(lists).astype(np.int32)


@pytest.mark.parametrize("block", [False, True])
def test_levels_from_a_page_table_give_the_plain_decode(block):
    page_size, heads_q, heads_kv, d = 4, 4, 2, 8
    lists, lens, num_pages = forest_table(page_size)
    indptr, indices = csr(lists)
    if block:
        table = np.full((len(lists), max(map(len, lists)) + 1), -1, np.int32)
        for b, x in enumerate(lists):
            table[b, :len(x)] = x
        lv = attnstate.cascade_levels(lens, page_size=page_size, num_pages=num_pages,
                                      block_table=table, min_shared_tokens=4)
    else:
        lv = attnstate.cascade_levels(lens, page_size=page_size, num_pages=num_pages,
                                      page_indptr=indptr, page_indices=indices,
                                      min_shared_tokens=4)
    assert lv.num_levels == 3 and lv.batch == 7 and not lv.identity_order
    assert sorted(lv.order.tolist()) == list(range(7))
    assert lv.keys_total == int(lens.sum()) and lv.keys_read < lv.keys_total
    assert "cascade levels: batch 7" in repr(lv)
    k = rng.standard_normal((num_pages, page_size, heads_kv, d)).astype(np.float32)
    v = rng.standard_normal(k.shape).astype(np.float32)
    q = rng.standard_normal((7, 1, heads_q, d)).astype(np.float32)
    dec = attnstate.Decode().plan(lens, heads_q=heads_q, heads_kv=heads_kv, head_dim=d,
                                  dtype="float32")
    plain = dec.run(q, k, v, lens, page_indptr=indptr, page_indices=indices)
    cas = attnstate.Cascade().plan(lv.levels, batch=7, heads_q=heads_q, heads_kv=heads_kv,
                                   head_dim=d, page_size=page_size, num_pages=num_pages,
                                   dtype="float32")
    assert cas.description == "CPU cascade: 3 levels, each a state merged into the output"
    order = lv.order
    out = cas.run(np.ascontiguousarray(q[order]), k, v, lv.levels)
    np.testing.assert_allclose(out.o, plain.o[order], atol=2e-6)
    np.testing.assert_allclose(out.lse, plain.lse[order], atol=2e-6)


def shared_prompt(batch, prefix_pages, own_pages, page_size=16):
    ids = iter(range(prefix_pages + batch * own_pages))
    prompt = [next(ids) for _ in range(prefix_pages)]
    lists = [prompt + [next(ids) for _ in range(own_pages)] for _ in range(batch)]
    lens = np.full(batch, (prefix_pages + own_pages) * page_size, np.int32)
    indptr, indices = csr(lists)
    return attnstate.cascade_levels(lens, page_size=page_size, num_pages=prefix_pages +
                                    batch * own_pages, page_indptr=indptr, page_indices=indices)


def test_the_decision_follows_the_sharing():
    many = shared_prompt(128, 2048, 16)  # a 32k prompt shared by 128 requests
    d = attnstate.decide_cascade(many, heads_q=32, heads_kv=8, head_dim=128)
    assert d.use_cascade and d.shared_levels == 1
    assert d.cascade_us < d.decode_us and d.cascade_bytes < d.decode_bytes
    assert d.reason.startswith("cascade with 1 shared level") and repr(d) == d.reason
    few = shared_prompt(8, 16, 125)  # 256 tokens shared under 2000-token suffixes
    d = attnstate.decide_cascade(few, heads_q=32, heads_kv=8, head_dim=128)
    assert not d.use_cascade and d.shared_levels == 0 and d.reason.startswith("plain decode")
    # fp8 pools: half the bytes of bf16 ones
    e4 = attnstate.decide_cascade(many, heads_q=32, heads_kv=8, head_dim=128, kv_dtype="e4m3")
    bf = attnstate.decide_cascade(many, heads_q=32, heads_kv=8, head_dim=128)
    assert e4.decode_bytes * 2 == bf.decode_bytes


def test_errors_name_the_argument():
    lens = np.array([8, 8], np.int32)
    indptr, indices = np.array([0, 2, 4], np.int32), np.array([0, 1, 0, 2], np.int32)
    kw = dict(page_size=4, num_pages=3)
    with pytest.raises(attnstate.Error, match="argument 'page_indptr': expected either"):
        attnstate.cascade_levels(lens, **kw)
    with pytest.raises(attnstate.Error, match="argument 'page_indptr': expected either"):
        attnstate.cascade_levels(lens, page_indptr=indptr, page_indices=indices,
                                 block_table=np.zeros((2, 2), np.int32), **kw)
    with pytest.raises(attnstate.Error, match="argument 'page_indptr': expected len"):
        attnstate.cascade_levels(lens, page_indptr=indptr[:2], page_indices=indices, **kw)
    with pytest.raises(attnstate.Error, match="argument 'page_indices': expected at least"):
        attnstate.cascade_levels(lens, page_indptr=indptr, page_indices=indices[:3], **kw)
    with pytest.raises(attnstate.Error, match="argument 'block_table': expected at least"):
        attnstate.cascade_levels(lens, block_table=np.zeros((1, 2), np.int32), **kw)
    with pytest.raises(attnstate.Error, match="num_pages"):
        attnstate.cascade_levels(lens, page_indptr=indptr, page_indices=indices, page_size=4,
                                 num_pages=2)
    lv = attnstate.cascade_levels(lens, page_indptr=indptr, page_indices=indices,
                                  min_shared_tokens=4, **kw)
    assert lv.num_levels == 2  # page 0 shared by both
    with pytest.raises(attnstate.Error, match="argument 'levels'"):
        attnstate.decide_cascade("levels", heads_q=2, heads_kv=1, head_dim=8)
    with pytest.raises(attnstate.Error, match="shape.heads_q"):
        attnstate.decide_cascade(lv, heads_q=3, heads_kv=2, head_dim=8)
    with pytest.raises(attnstate.Error, match="model.copy_gbps"):
        attnstate.decide_cascade(lv, heads_q=2, heads_kv=1, head_dim=8, copy_gbps=-1)
