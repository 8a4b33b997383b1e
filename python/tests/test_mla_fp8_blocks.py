"""MlaDecode / MlaCascade over FlashMLA's fp8 cache: one uint8 pool (blocks, block_size, 1, 656),
each token 512 e4m3 latent values, 4 fp32 scales (one per 128 columns) and 64 bfloat16 rope
values, read through `attnstate.flashmla_fp8_views` and `ckv_block_scales=`. The CPU backend
against a float64 reference (with a control: the scales of the wrong block are far off), other
block sizes, torch CPU tensors, the cascade over a shared prefix, argument errors by name; with
torch and a GPU, the CUDA backend against the CPU one and the float64 reference over the values
the kernels read (bfloat16-rounded), outputs poisoned with NaN."""

import ml_dtypes
import numpy as np
import pytest

import attnstate
from helpers import cuda_torch, has_module, requires_torch_cuda, shared_prefix_levels
from mla_helpers import SCALE, poisoned_out, queries, row_state, to_cuda

E4M3 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16
ATOL = 2e-4  # the CPU backend's fp32 against float64 (products rounded once, fp32 sums)


def flashmla_pool(rng, blocks, block_size, rank=512, rope=64, block_cols=128):
    """A random FlashMLA fp8 pool: (uint8 pool, latent e4m3 (blocks, block_size, rank), scales
    float32 (blocks, block_size, rank // block_cols), rope bfloat16 (blocks, block_size, rope)).
    The scales of a token differ from block to block (2^-6 .. 2^-2 times 1..2)."""
    nb = rank // block_cols
    latent = (rng.standard_normal((blocks, block_size, rank)) * 8).astype(E4M3)
    scales = (np.ldexp(1.0, rng.integers(-6, -1, (blocks, block_size, nb)))
              * rng.uniform(1, 2, (blocks, block_size, nb))).astype(np.float32)
    kpe = rng.standard_normal((blocks, block_size, rope)).astype(BF16)
    pool = np.concatenate([latent.view(np.uint8), scales.view(np.uint8), kpe.view(np.uint8)],
                          axis=-1)[:, :, None, :]
    assert pool.shape[-1] == rank + 4 * nb + 2 * rope
    return np.ascontiguousarray(pool), latent, scales, kpe


def dequantised(latent, scales, shift=0, bf16=False):
    """The latent values as float64: e4m3 value x its block's scale (`shift`: the scale of block
    (b + shift) % blocks instead, a wrong index), rounded to bfloat16 when `bf16` (what the CUDA
    kernels read)."""
    nb = scales.shape[-1]
    s = np.roll(scales, -shift, axis=-1)
    v = latent.astype(np.float32) * np.repeat(s, latent.shape[-1] // nb, axis=-1)
    return (v.astype(BF16) if bf16 else v).astype(np.float64)


def reference(q_nope, q_pe, ckv, kpe, seq_lens, block_table, page_size, scale):
    """float64 states (o (batch*q_len, heads, rank), lse) of a causal decode over the real cache
    values ckv (blocks, block_size, rank), kpe (blocks, block_size, rope) through a block table."""
    batch, q_len, heads, rank = q_nope.shape
    o = np.zeros((batch * q_len, heads, rank))
    lse = np.full((batch * q_len, heads), -np.inf)
    for b in range(batch):
        n = int(seq_lens[b])
        pages = block_table[b, :-(-n // page_size)]
        keys = ckv[pages].reshape(-1, rank)[:n], kpe[pages].reshape(-1, kpe.shape[-1])[:n]
        for i in range(q_len):
            see = max(0, n - q_len + i + 1)
            o[b * q_len + i], lse[b * q_len + i] = row_state(
                q_nope[b, i], q_pe[b, i], keys[0][:see], keys[1][:see], scale)
    return o, lse


def case(seed, seq_lens, page_size, heads, q_len, block_cols=128, rank=512, rope=64):
    rng = np.random.default_rng(seed)
    seq_lens = np.array(seq_lens, np.int32)
    per = [-(-int(n) // page_size) for n in seq_lens]
    blocks = sum(per) + 2
    pool, latent, scales, kpe = flashmla_pool(rng, blocks, page_size, rank, rope, block_cols)
    perm = rng.permutation(blocks).astype(np.int32)
    table = np.full((len(seq_lens), max(per) + 1), perm[-1], np.int32)
    at = 0
    for b, k in enumerate(per):
        table[b, :k] = perm[at:at + k]
        at += k
    q_nope, q_pe = queries(rng, len(seq_lens), q_len, heads, "bfloat16", rank, rope)
    # scores of about unit spread (x 1/4: exact): the bf16 rounding of the values the CUDA
    # kernels read then moves the LSEs by < 0.01 (the CUDA tolerances below)
    q_nope, q_pe = ((q.astype(np.float32) * 0.25).astype(BF16) for q in (q_nope, q_pe))
    return dict(pool=pool, latent=latent, scales=scales, kpe=kpe, table=table, seq_lens=seq_lens,
                q_nope=q_nope, q_pe=q_pe, page_size=page_size)


def run_cpu(c, heads, q_len, block_cols=128, rank=512, rope=64, **kw):
    ckv, kpe, scales = attnstate.flashmla_fp8_views(c["pool"], kv_lora_rank=rank, rope_dim=rope,
                                                    block_cols=block_cols)
    mla = attnstate.MlaDecode().plan(c["seq_lens"], heads=heads, dtype=BF16, kv_dtype="e4m3",
                                     kpe_dtype="bfloat16", q_len=q_len, kv_lora_rank=rank,
                                     rope_dim=rope, scale=SCALE)
    return mla.run(c["q_nope"], c["q_pe"], ckv, kpe, c["seq_lens"], block_table=c["table"],
                   ckv_block_scales=scales, dtype="float32", **kw)


def want(c, shift=0, bf16=False):
    return reference(c["q_nope"], c["q_pe"], dequantised(c["latent"], c["scales"], shift, bf16),
                     c["kpe"].astype(np.float64), c["seq_lens"], c["table"], c["page_size"],
                     SCALE)


def test_the_views_are_the_pool():
    c = case(1, [5], 4, 16, 1)
    ckv, kpe, scales = attnstate.flashmla_fp8_views(c["pool"])
    assert ckv.shape == (c["pool"].shape[0], 4, 1, 512) and ckv.dtype == np.uint8
    assert kpe.shape[-1] == 64 and kpe.dtype == BF16 and scales.dtype == np.float32
    np.testing.assert_array_equal(ckv[:, :, 0].view(E4M3).astype(np.float32),
                                  c["latent"].astype(np.float32))
    np.testing.assert_array_equal(scales[:, :, 0], c["scales"])
    np.testing.assert_array_equal(kpe[:, :, 0].astype(np.float32), c["kpe"].astype(np.float32))
    assert np.shares_memory(scales, c["pool"]) and np.shares_memory(kpe, c["pool"])


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("q_len", [1, 3])
def test_cpu_matches_the_reference(page_size, q_len):
    c = case([page_size, q_len], [150, 3, 64], page_size, 16, q_len)
    state = run_cpu(c, 16, q_len)
    o, lse = want(c)
    np.testing.assert_allclose(state.o, o, atol=ATOL, rtol=ATOL)
    np.testing.assert_allclose(state.lse, lse, atol=ATOL, rtol=1e-6)
    # the control: a wrong block's scales are far outside the tolerance
    wrong, _ = want(c, shift=1)
    assert np.abs(state.o - wrong).max() > 100 * ATOL


@pytest.mark.parametrize("block_cols,rank,rope", [(64, 512, 64), (32, 96, 16), (96, 96, 8)])
def test_other_block_sizes_on_the_cpu(block_cols, rank, rope):
    c = case(block_cols, [40, 17], 8, 4, 2, block_cols, rank, rope)
    state = run_cpu(c, 4, 2, block_cols, rank, rope)
    o, lse = want(c)
    np.testing.assert_allclose(state.o, o, atol=ATOL, rtol=ATOL)
    np.testing.assert_allclose(state.lse, lse, atol=ATOL, rtol=1e-6)


@pytest.mark.skipif(not has_module("torch"), reason="needs torch")
def test_torch_cpu_views_give_the_numpy_bits():
    import torch
    c = case(3, [70, 9], 16, 16, 1)
    a = run_cpu(c, 16, 1)
    ckv, kpe, scales = attnstate.flashmla_fp8_views(torch.from_numpy(c["pool"]))
    assert kpe.dtype == torch.bfloat16 and scales.dtype == torch.float32
    mla = attnstate.MlaDecode().plan(c["seq_lens"], heads=16, dtype=BF16, kv_dtype="e4m3",
                                     kpe_dtype="bfloat16", scale=SCALE)
    q = [torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) for x in (c["q_nope"], c["q_pe"])]
    b = mla.run(*q, ckv, kpe, torch.from_numpy(c["seq_lens"]),
                block_table=torch.from_numpy(c["table"]), ckv_block_scales=scales,
                dtype="float32")
    np.testing.assert_array_equal(b.o.numpy(), a.o)
    np.testing.assert_array_equal(b.lse.numpy(), a.lse)


def test_cascade_over_a_shared_prefix():
    rng = np.random.default_rng(7)
    page, heads, q_len = 16, 16, 2
    suffixes = [20, 35, 2, 17]
    levels, total, starts = shared_prefix_levels(48, suffixes, page)
    pool, latent, scales, kpe = flashmla_pool(rng, total, page)
    ckv_v, kpe_v, scales_v = attnstate.flashmla_fp8_views(pool)
    q_nope, q_pe = queries(rng, len(suffixes), q_len, heads, "bfloat16")
    cas = attnstate.MlaCascade().plan(levels, heads=heads, num_pages=total, dtype=BF16,
                                      kv_dtype="e4m3", kpe_dtype="bfloat16", batch=len(suffixes),
                                      page_size=page, q_len=q_len, scale=SCALE)
    state = cas.run(q_nope, q_pe, ckv_v, kpe_v, levels, ckv_block_scales=scales_v,
                    dtype="float32")
    # each request: the prefix's pages, then its own
    seq_lens = np.array([48 + n for n in suffixes], np.int32)
    width = 3 + max(-(-n // page) for n in suffixes)
    table = np.zeros((len(suffixes), width), np.int32)
    for b, n in enumerate(suffixes):
        own = np.arange(starts[b + 1], starts[b + 1] + -(-n // page))
        table[b, :3 + len(own)] = np.concatenate([np.arange(3), own])
    o, lse = reference(q_nope, q_pe, dequantised(latent, scales), kpe.astype(np.float64),
                       seq_lens, table, page, SCALE)
    np.testing.assert_allclose(state.o, o, atol=ATOL, rtol=ATOL)
    np.testing.assert_allclose(state.lse, lse, atol=ATOL, rtol=1e-6)


def test_errors_name_the_argument():
    c = case(5, [20], 16, 16, 1)
    ckv, kpe, scales = attnstate.flashmla_fp8_views(c["pool"])

    def run(kv_dtype="e4m3", **kw):
        mla = attnstate.MlaDecode().plan(c["seq_lens"], heads=16, dtype=BF16, kv_dtype=kv_dtype,
                                         kpe_dtype="bfloat16", scale=SCALE)
        args = dict(ckv=ckv, kpe=kpe, ckv_block_scales=scales)
        args.update(kw)
        return mla.run(c["q_nope"], c["q_pe"], args.pop("ckv"), args.pop("kpe"), c["seq_lens"],
                       block_table=c["table"], **args)

    run()
    cases = [
        (dict(ckv_scale=0.5), "argument 'ckv_scale': expected None with ckv_block_scales"),
        (dict(ckv_block_scales=scales.astype(np.float16)),
         "argument 'ckv_block_scales': expected dtype float32"),
        (dict(ckv_block_scales=scales[1:]), "argument 'ckv_block_scales': expected the pages"),
        (dict(ckv_block_scales=np.ones((scales.shape[0], 16, 1, 3), np.float32)),
         "argument 'ckv_block_scales': expected a last extent dividing kv_lora_rank = 512"),
        (dict(ckv_block_scales=np.ones((scales.shape[0], 16, 2, 4), np.float32)),
         "argument 'ckv_block_scales': expected \\(pages, page_size, 1, blocks\\)"),
    ]
    for change, message in cases:
        with pytest.raises(attnstate.Error, match=message):
            run(**change)
    with pytest.raises(attnstate.Error, match="argument 'ckv_block_scales': expected None"):
        run(kv_dtype="bfloat16", ckv=np.zeros((scales.shape[0], 16, 512), BF16))
    with pytest.raises(attnstate.Error, match="argument 'kv_cache': expected shape"):
        attnstate.flashmla_fp8_views(c["pool"][..., :600])
    with pytest.raises(attnstate.Error, match="argument 'kv_cache': expected dtype uint8"):
        attnstate.flashmla_fp8_views(c["pool"].view(np.int8))
    with pytest.raises(attnstate.Error, match="argument 'block_cols'"):
        attnstate.flashmla_fp8_views(c["pool"], block_cols=100)


torch = cuda_torch()


def _cuda_run(c, heads, q_len, options, out):
    ckv, kpe, scales = attnstate.flashmla_fp8_views(to_cuda(torch, c["pool"]))
    mla = attnstate.MlaDecode().plan(c["seq_lens"], heads=heads, dtype=BF16, kv_dtype="e4m3",
                                     kpe_dtype="bfloat16", q_len=q_len, scale=SCALE, like=ckv,
                                     **options)
    q = [to_cuda(torch, x) for x in (c["q_nope"], c["q_pe"])]
    assert mla.run(*q, ckv, kpe, torch.from_numpy(c["seq_lens"]).cuda(),
                   block_table=torch.from_numpy(c["table"]).cuda(), ckv_block_scales=scales,
                   out=out) is out
    torch.cuda.synchronize()
    o, lse = out.o.float().cpu().numpy(), out.lse.cpu().numpy()
    assert not np.isnan(o).any() and not np.isnan(lse).any()  # every row written
    return o, lse


@pytest.mark.gpu
@requires_torch_cuda
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("heads,q_len", [(16, 1), (128, 2), (64, 4)])
@pytest.mark.parametrize("options", [{}, dict(policy="fixed_count", num_splits=3)])
def test_cuda_matches_the_cpu_and_the_reference(page_size, heads, q_len, options):
    c = case([page_size, heads, q_len], [700, 3, 1500], page_size, heads, q_len)
    out = poisoned_out(torch, 3 * q_len, heads, torch.float32, "natural")
    o, lse = _cuda_run(c, heads, q_len, options, out)
    # the values the kernels read (scaled, rounded to bfloat16): P's rounding remains
    ro, rlse = want(c, bf16=True)
    np.testing.assert_allclose(o, ro, atol=3e-2, rtol=2e-2)
    np.testing.assert_allclose(lse, rlse, atol=2e-3, rtol=1e-4)
    # the CPU backend (exact fp32 values): the bfloat16 rounding of K and V besides
    cpu = run_cpu(c, heads, q_len)
    np.testing.assert_allclose(o, cpu.o, atol=6e-2, rtol=4e-2)
    np.testing.assert_allclose(lse, cpu.lse, atol=2e-2, rtol=1e-4)
