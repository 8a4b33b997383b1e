"""CUDA backend from torch: merges on the caller's stream, decode with graph capture,
torch.compile over the custom ops, errors (skipped without torch, a GPU or the CUDA backend)."""

import numpy as np
import pytest

import attnstate
from helpers import cuda_torch, requires_torch_cuda, shared_prefix_levels

pytestmark = [pytest.mark.gpu, requires_torch_cuda]
torch = cuda_torch()


def rand_state(tokens, heads, d, dtype, base, scale=3.0, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    o = torch.randn(tokens, heads, d, device="cuda", generator=g).to(dtype)
    lse = torch.randn(tokens, heads, device="cuda", generator=g) * scale
    return attnstate.State(o, lse, base)


def host_merge(a, b, base="natural"):
    """The same merge on the CPU backend (float32 NumPy copies): the GPU must match it."""
    def h(s):
        return attnstate.State(s.o.float().cpu().numpy(), s.lse.cpu().numpy(), s.base)
    return attnstate.merge_state(h(a), h(b), base=base)


def test_sink_state_on_the_gpu_matches_the_cpu():
    # expanded views (strides 0) of the sink logits and of head_dim zeros, merged once in place
    acc = rand_state(64, 8, 128, torch.bfloat16, "natural", seed=5)
    sinks = torch.randn(8, device="cuda", generator=torch.Generator(device="cuda").manual_seed(6))
    want = attnstate.State(acc.o.float().cpu().numpy(), acc.lse.cpu().numpy(), acc.base)
    attnstate.merge_state_(want, attnstate.sink_state(sinks.cpu().numpy(), 64, 128))
    attnstate.merge_state_(acc, attnstate.sink_state(sinks, 64, 128, dtype=torch.bfloat16))
    torch.cuda.synchronize()
    np.testing.assert_allclose(acc.o.float().cpu().numpy(), want.o, atol=1e-2, rtol=1e-2)
    np.testing.assert_allclose(acc.lse.cpu().numpy(), want.lse, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_merge_state_matches_the_cpu_on_a_side_stream(dtype):
    dt = getattr(torch, dtype)
    a = rand_state(4096, 8, 128, dt, "natural", seed=1)
    b = rand_state(4096, 8, 128, torch.float16, "base2", seed=2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the current stream: attnstate launches there
        out = attnstate.merge_state(a, b, dtype=torch.float32)
    side.synchronize()
    ref = host_merge(a, b)
    np.testing.assert_allclose(out.o.cpu().numpy(), ref.o, atol=1e-5)
    np.testing.assert_allclose(out.lse.cpu().numpy(), ref.lse, atol=1e-5)


def test_explicit_streams_int_and_object():
    a, b = rand_state(64, 4, 64, torch.bfloat16, "natural"), rand_state(64, 4, 64, torch.bfloat16,
                                                                          "natural", seed=5)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    o1 = attnstate.merge_state(a, b, stream=s.cuda_stream)
    o2 = attnstate.merge_state(a, b, stream=s)
    s.synchronize()
    assert torch.equal(o1.o, o2.o) and torch.equal(o1.lse, o2.lse)


@pytest.mark.parametrize("order", ["tokens_major", "states_major"])
def test_merge_states_and_ragged_equal_pairwise_merges(order):
    S, T, H, D = 3, 33, 4, 128
    o = torch.randn(S, T, H, D, device="cuda")
    lse = torch.randn(S, T, H, device="cuda")
    stack_o, stack_lse = (o, lse) if order == "states_major" else (o.transpose(0, 1),
                                                                   lse.transpose(0, 1))
    out = attnstate.merge_states(attnstate.State(stack_o, stack_lse, "natural"), order=order)
    acc = attnstate.State(o[0].clone(), lse[0].clone(), "natural")
    for s in range(1, S):
        attnstate.merge_state_(acc, attnstate.State(o[s], lse[s], "natural"))
    torch.testing.assert_close(out.o, acc.o, atol=1e-5, rtol=1e-5)
    rows = attnstate.State(o.transpose(0, 1).reshape(T * S, H, D).contiguous(),
                           lse.transpose(0, 1).reshape(T * S, H).contiguous(), "natural")
    indptr = torch.arange(0, T * S + 1, S, dtype=torch.int32, device="cuda")
    ragged = attnstate.merge_states_ragged(rows, indptr)
    torch.testing.assert_close(ragged.o, out.o, atol=1e-5, rtol=1e-5)


def test_errors_from_cuda_calls():
    a = rand_state(8, 2, 128, torch.bfloat16, "natural")
    host = attnstate.State(a.o.cpu(), a.lse.cpu(), "natural")
    with pytest.raises(attnstate.Error, match="argument 'b.o': expected a device array"):
        attnstate.merge_state(a, host)
    mixed = attnstate.State(a.o, a.lse.cpu(), "natural")
    with pytest.raises(attnstate.Error, match="argument 'a.lse'"):
        attnstate.merge_state(mixed, a)
    with pytest.raises(attnstate.Error, match="argument 'stream'"):
        attnstate.merge_state(host, host, stream=torch.cuda.current_stream())
    # an fp8 o mixed with another fp8 format is refused by name (the merges take any head dim)
    f8 = attnstate.State(a.o.to(torch.float8_e4m3fn), a.lse, "natural")
    f5 = attnstate.State(a.o.to(torch.float8_e5m2), a.lse, "natural")
    with pytest.raises(attnstate.Error) as e:
        attnstate.merge_state(f8, f5)
    assert e.value.status == attnstate.Status.NOT_SUPPORTED and "dtype" in str(e.value)


def paged_problem(batch=4, heads_q=32, heads_kv=8, d=128, page=16, lens=(1000, 17, 0, 300)):
    pages_of = [-(-n // page) for n in lens]
    total = max(sum(pages_of), 1)
    perm = torch.randperm(total, dtype=torch.int32)
    k = torch.randn(total, page, heads_kv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total, page, heads_kv, d, device="cuda", dtype=torch.bfloat16)
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages_of)]), dtype=torch.int32)
    seq = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(batch, 1, heads_q, d, device="cuda", dtype=torch.bfloat16)
    return q, k, v, seq, indptr, perm


def test_decode_matches_the_cpu_decode_and_replays_in_a_graph():
    q, k, v, seq, indptr, indices = paged_problem()
    dec = attnstate.Decode().plan(seq.numpy(), heads_q=32, heads_kv=8, head_dim=128,
                                  dtype=torch.bfloat16, like=k)
    dev = dict(page_indptr=indptr.cuda(), page_indices=indices.cuda())
    out = dec.run(q, k, v, seq.cuda(), **dev, dtype=torch.float32)
    host = attnstate.Decode().plan(seq.numpy(), heads_q=32, heads_kv=8, head_dim=128,
                                   dtype="float32")
    ref = host.run(q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(),
                   seq.numpy(), page_indptr=indptr.numpy(), page_indices=indices.numpy())
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.o.cpu().numpy(), ref.o, atol=2e-2)
    np.testing.assert_allclose(out.lse.cpu().numpy(), ref.lse, atol=2e-2)

    # captured once with out=, replayed: the same bits as the eager run
    seq_dev = seq.cuda()
    static = attnstate.State(torch.empty_like(out.o), torch.empty_like(out.lse), "natural")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dec.run(q, k, v, seq_dev, **dev, out=static)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dec.run(q, k, v, seq_dev, **dev, out=static)
    static.o.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static.o, out.o) and torch.equal(static.lse, out.lse)


@pytest.mark.parametrize("fmt,window_left,cap",
                         [("e4m3", None, None), ("e5m2", None, None), ("e4m3", 37, None),
                          ("e5m2", None, 5.0), ("e4m3", 300, 30.0)])
def test_fp8_decode_on_the_gpu_matches_the_cpu(fmt, window_left, cap):
    q, k, v, seq, indptr, indices = paged_problem()
    if cap is not None:
        q = q * 4  # large scores, so that the cap matters
    tdt = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    k_scale, v_scale = 0.05, 0.02
    k8 = (k.float() / k_scale).to(tdt).view(torch.uint8)  # the stored bytes
    v8 = (v.float() / v_scale).to(tdt).view(torch.uint8)
    opts = dict(heads_q=32, heads_kv=8, head_dim=128, kv_dtype=fmt, window_left=window_left,
                logits_soft_cap=cap)
    dec = attnstate.Decode().plan(seq.numpy(), dtype=torch.bfloat16, like=k, **opts)
    out = dec.run(q, k8, v8, seq.cuda(), page_indptr=indptr.cuda(), page_indices=indices.cuda(),
                  dtype=torch.float32, k_scale=k_scale, v_scale=v_scale)
    host = attnstate.Decode().plan(seq.numpy(), dtype="float32", **opts)
    ref = host.run(q.float().cpu().numpy(), k8.cpu().numpy(), v8.cpu().numpy(), seq.numpy(),
                   page_indptr=indptr.numpy(), page_indices=indices.numpy(), k_scale=k_scale,
                   v_scale=v_scale)
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.o.cpu().numpy(), ref.o, atol=1e-2)
    np.testing.assert_allclose(out.lse.cpu().numpy(), ref.lse, atol=1e-2)
    assert np.isfinite(ref.o).all()  # (the scales keep every stored value finite)


@pytest.mark.parametrize("window_left,cap", [(0, None), (37, None), (None, 5.0), (300, 30.0)])
def test_decode_with_a_window_and_a_soft_cap_matches_the_cpu(window_left, cap):
    q, k, v, seq, indptr, indices = paged_problem()
    q = q * 4  # large scores, so that the cap matters
    opts = dict(heads_q=32, heads_kv=8, head_dim=128, window_left=window_left,
                logits_soft_cap=cap)
    dec = attnstate.Decode().plan(seq.numpy(), dtype=torch.bfloat16, like=k, **opts)
    out = dec.run(q, k, v, seq.cuda(), page_indptr=indptr.cuda(), page_indices=indices.cuda(),
                  dtype=torch.float32)
    host = attnstate.Decode().plan(seq.numpy(), dtype="float32", **opts)
    ref = host.run(q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(),
                   seq.numpy(), page_indptr=indptr.numpy(), page_indices=indices.numpy())
    plain = attnstate.Decode().plan(seq.numpy(), heads_q=32, heads_kv=8, head_dim=128,
                                    dtype="float32")
    base = plain.run(q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(),
                     seq.numpy(), page_indptr=indptr.numpy(), page_indices=indices.numpy())
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.o.cpu().numpy(), ref.o, atol=2e-2)
    np.testing.assert_allclose(out.lse.cpu().numpy(), ref.lse, atol=2e-2)
    seen = np.isfinite(base.lse)  # rows with keys (an empty request stays empty)
    assert np.abs(ref.lse[seen] - base.lse[seen]).max() > 1e-2  # the variant changed the result


def test_torch_compile_fullgraph_custom_ops():
    a = rand_state(256, 8, 128, torch.bfloat16, "natural", seed=3)
    b = rand_state(256, 8, 128, torch.bfloat16, "base2", seed=4)

    def f(ao, alse, bo, blse):
        o, lse = torch.ops.attnstate.merge_state(ao, alse, 0, bo, blse, 1, 0, "float32")
        return o * 2, lse

    eager = f(a.o, a.lse, b.o, b.lse)
    compiled = torch.compile(f, fullgraph=True)(a.o, a.lse, b.o, b.lse)
    assert torch.equal(eager[0], compiled[0]) and torch.equal(eager[1], compiled[1])
    ref = attnstate.merge_state(a, b, dtype="float32")
    assert torch.equal(eager[0], ref.o * 2)


def test_torch_compile_decode_op_in_cuda_graphs():
    from attnstate import torch_ops
    q, k, v, seq, indptr, indices = paged_problem()
    dec = attnstate.Decode().plan(seq.numpy(), heads_q=32, heads_kv=8, head_dim=128,
                                  dtype=torch.bfloat16, like=k)
    pid = torch_ops.register_plan(dec)
    args = (seq.cuda(), indptr.cuda(), indices.cuda())

    def step(q, k, v, seq_lens, ip, ix, ws):
        return torch.ops.attnstate.decode(pid, q, k, v, seq_lens, ip, ix, None, "NHD", ws, 0, "")

    eager = step(q, k, v, *args, dec.workspace)
    compiled = torch.compile(step, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # warm-up, record, replay
        got = compiled(q, k, v, *args, dec.workspace)
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    # with attention sinks: the op's optional last argument, the same bits as Decode.run's
    sinks = torch.rand(32, device="cuda") * 6 - 2

    def step_sinks(q, k, v, seq_lens, ip, ix, ws, s):
        return torch.ops.attnstate.decode(pid, q, k, v, seq_lens, ip, ix, None, "NHD", ws, 0, "",
                                          s)

    got = torch.compile(step_sinks, fullgraph=True)(q, k, v, *args, dec.workspace, sinks)
    ref = dec.run(q, k, v, args[0], page_indptr=args[1], page_indices=args[2], sinks=sinks)
    assert torch.equal(got[0], ref.o) and torch.equal(got[1], ref.lse)
    assert not torch.equal(got[1], eager[1])


@pytest.mark.parametrize("cap", [None, 5.0])
def test_cascade_on_the_gpu_matches_the_cpu_cascade(cap):
    heads_q, heads_kv, d, page = 16, 4, 128, 16
    prefix, suffixes = 200, [37, 5, 64]
    batch = len(suffixes)
    levels, total, _ = shared_prefix_levels(prefix, suffixes, page)
    k = torch.randn(total, page, heads_kv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total, page, heads_kv, d, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(batch, 1, heads_q, d, device="cuda", dtype=torch.bfloat16)
    shape = dict(batch=batch, heads_q=heads_q, heads_kv=heads_kv, head_dim=d, page_size=page,
                 num_pages=total)
    cas = attnstate.Cascade().plan(levels, dtype=torch.bfloat16, like=k, logits_soft_cap=cap,
                                   **shape)
    assert cas.description.startswith("cascade plan: batch 3, 16/4 heads, d 128, bf16")
    assert "level 1 (last): 3 segments, split-KV decode" in cas.description
    dev_levels = [tuple(torch.from_numpy(a).cuda() for a in level) for level in levels]
    out = cas.run(q, k, v, dev_levels, dtype=torch.float32)
    host = attnstate.Cascade().plan(levels, dtype="float32", logits_soft_cap=cap, **shape)
    ref = host.run(q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(),
                   levels)
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.o.cpu().numpy(), ref.o, atol=2e-2)
    np.testing.assert_allclose(out.lse.cpu().numpy(), ref.lse, atol=2e-2)
    if cap is not None:  # the cap changed the result; a window too, on the GPU as on the CPU
        plain = attnstate.Cascade().plan(levels, dtype="float32", **shape).run(
            q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(), levels)
        assert np.abs(plain.lse - ref.lse).max() > 1e-2
        win = attnstate.Cascade().plan(levels, dtype=torch.bfloat16, like=k, window_left=64,
                                       logits_soft_cap=cap, **shape)
        assert "window 64" in win.description
        got = win.run(q, k, v, dev_levels, dtype=torch.float32)
        want = attnstate.Cascade().plan(levels, dtype="float32", window_left=64,
                                        logits_soft_cap=cap, **shape).run(
            q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(), levels)
        torch.cuda.synchronize()
        np.testing.assert_allclose(got.o.cpu().numpy(), want.o, atol=2e-2)
        np.testing.assert_allclose(got.lse.cpu().numpy(), want.lse, atol=2e-2)
        assert np.abs(want.lse - ref.lse).max() > 1e-2


@pytest.mark.parametrize("fmt,cap", [("e4m3", None), ("e5m2", 5.0)])
def test_fp8_cascade_on_the_gpu_matches_the_cpu_cascade(fmt, cap):
    # fp8 pools as torch float8 tensors and as their uint8 bytes, bf16 queries: the CUDA cascade
    # (the catalog's fp8 level rows) against the CPU cascade over the same bytes and scales
    heads_q, heads_kv, d, page = 16, 4, 128, 16
    levels, total, _ = shared_prefix_levels(300, [37, 5, 64], page)
    tdt = torch.float8_e4m3fn if fmt == "e4m3" else torch.float8_e5m2
    k = (torch.rand(total, page, heads_kv, d, device="cuda") * 4 - 2).to(tdt)
    v = (torch.rand(total, page, heads_kv, d, device="cuda") * 4 - 2).to(tdt)
    q = torch.randn(3, 1, heads_q, d, device="cuda", dtype=torch.bfloat16)
    shape = dict(batch=3, heads_q=heads_q, heads_kv=heads_kv, head_dim=d, page_size=page,
                 num_pages=total, kv_dtype=fmt, logits_soft_cap=cap)
    cas = attnstate.Cascade().plan(levels, dtype=torch.bfloat16, like=q, **shape)
    assert f"K/V {fmt}" in cas.description, cas.description
    dev_levels = [tuple(torch.from_numpy(a).cuda() for a in level) for level in levels]
    scales = dict(k_scale=0.37, v_scale=1.9)
    out = cas.run(q, k, v, dev_levels, dtype=torch.float32, **scales)
    raw = cas.run(q, k.view(torch.uint8), v.view(torch.uint8), dev_levels, dtype=torch.float32,
                  **scales)
    host = attnstate.Cascade().plan(levels, dtype="float32", **shape)
    kb, vb = k.view(torch.uint8).cpu().numpy(), v.view(torch.uint8).cpu().numpy()
    ref = host.run(q.float().cpu().numpy(), kb, vb, levels, **scales)
    torch.cuda.synchronize()
    assert torch.equal(out.o, raw.o) and torch.equal(out.lse, raw.lse)
    np.testing.assert_allclose(out.o.cpu().numpy(), ref.o, atol=2e-2)
    np.testing.assert_allclose(out.lse.cpu().numpy(), ref.lse, atol=2e-2)


def test_decode_with_sinks_matches_the_cpu():
    q, k, v, seq, indptr, indices = paged_problem()  # request 2 has no key
    sinks = torch.rand(32, device="cuda") * 8 - 3
    dec = attnstate.Decode().plan(seq.numpy(), heads_q=32, heads_kv=8, head_dim=128,
                                  dtype=torch.bfloat16, like=k)
    dev = dict(page_indptr=indptr.cuda(), page_indices=indices.cuda())
    out = dec.run(q, k, v, seq.cuda(), **dev, dtype=torch.float32, sinks=sinks)
    host = attnstate.Decode().plan(seq.numpy(), heads_q=32, heads_kv=8, head_dim=128,
                                   dtype="float32")
    ref = host.run(q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(),
                   seq.numpy(), page_indptr=indptr.numpy(), page_indices=indices.numpy(),
                   sinks=sinks.cpu().numpy())
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.o.cpu().numpy(), ref.o, atol=2e-2)
    np.testing.assert_allclose(out.lse.cpu().numpy(), ref.lse, atol=2e-2)
    assert torch.all(out.o[2] == 0)  # no key: (0, s)
    torch.testing.assert_close(out.lse[2], sinks, rtol=1e-6, atol=1e-6)
    # sinks must be in the memory of q: host logits for a CUDA run are named
    with pytest.raises(attnstate.Error, match="argument 'sinks'"):
        dec.run(q, k, v, seq.cuda(), **dev, sinks=sinks.cpu())


def test_cascade_with_sinks_matches_the_cpu():
    heads_q, heads_kv, d, page = 16, 4, 128, 16
    levels, total, _ = shared_prefix_levels(200, [37, 5, 64], page)
    k = torch.randn(total, page, heads_kv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(total, page, heads_kv, d, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(3, 1, heads_q, d, device="cuda", dtype=torch.bfloat16)
    sinks = torch.rand(heads_q, device="cuda") * 8 - 3
    shape = dict(batch=3, heads_q=heads_q, heads_kv=heads_kv, head_dim=d, page_size=page,
                 num_pages=total)
    cas = attnstate.Cascade().plan(levels, dtype=torch.bfloat16, like=k, **shape)
    dev_levels = [tuple(torch.from_numpy(a).cuda() for a in level) for level in levels]
    out = cas.run(q, k, v, dev_levels, dtype=torch.float32, sinks=sinks)
    host = attnstate.Cascade().plan(levels, dtype="float32", **shape)
    ref = host.run(q.float().cpu().numpy(), k.float().cpu().numpy(), v.float().cpu().numpy(),
                   levels, sinks=sinks.cpu().numpy())
    torch.cuda.synchronize()
    np.testing.assert_allclose(out.o.cpu().numpy(), ref.o, atol=2e-2)
    np.testing.assert_allclose(out.lse.cpu().numpy(), ref.lse, atol=2e-2)
