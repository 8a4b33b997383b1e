"""Python-side costs of attnstate on a CUDA GPU (torch tensors):

1. host time of one Python call (`merge_state` on 4096 tokens x 32 heads x 128 bf16 with out=,
   decode `run` at batch 1 x 1k keys) while the stream is held by a spin kernel, so the GPU's
   work is not in the time; with the parts the time is spent on (the binding's array imports
   and stream lookup, against a bare torch op launch);
2. kernel time of the same calls launched from Python, measured as the C++ benchmarks do
   (CUDA graphs of back-to-back calls over rotating buffers, L2 flushed), for comparison with
   bench_merge / bench_decode;
3. a decode captured in torch.cuda.graph: replay cost per call and bitwise equality.

    python bench/python/bench_python.py [--json out.json]
"""

import argparse
import json
import statistics
import time

import torch

import attnstate
from attnstate import _attnstate as _C

T, H, D = 4096, 32, 128


def host_times(fn, calls=200, rounds=5):
    """Median host time (us) of one fn() call, the stream held by a spin kernel."""
    times = []
    for _ in range(rounds):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU spin: every launch below just queues
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            fn()
            times.append(time.perf_counter_ns() - t0)
        torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def state(dtype=torch.bfloat16, tokens=T):
    return attnstate.State(torch.randn(tokens, H, D, device="cuda", dtype=dtype),
                           torch.randn(tokens, H, device="cuda"), "natural")


def flush_l2(buf):
    buf.add_(1)


def graph_time_per_call(body, calls, reps=20):
    """Median time (us) per call of a CUDA graph of `calls` calls of body(i), L2 flushed."""
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(calls):
            body(i)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            body(i)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        flush_l2(flush)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / calls)
    return statistics.median(times), g


def decode_problem(layers, batch=1, ctx=1024, heads_q=32, heads_kv=8, page=16):
    pages = batch * (-(-ctx // page))
    caches = [(torch.randn(pages, page, heads_kv, D, device="cuda", dtype=torch.bfloat16),
               torch.randn(pages, page, heads_kv, D, device="cuda", dtype=torch.bfloat16))
              for _ in range(layers)]
    seq = torch.full((batch,), ctx, dtype=torch.int32)
    table = torch.arange(pages, dtype=torch.int32, device="cuda").view(batch, -1)  # block table
    q = torch.randn(batch, 1, heads_q, D, device="cuda", dtype=torch.bfloat16)
    return q, caches, seq, table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    r = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    # 1. host time of merge_state (out given; and allocating out)
    a, b, out = state(), state(), state()
    stream = torch.cuda.current_stream().cuda_stream
    x = torch.empty(T * H * D, device="cuda", dtype=torch.bfloat16)
    r["host_merge_state_us"] = host_times(lambda: attnstate.merge_state(a, b, out=out))
    r["host_merge_state_alloc_us"] = host_times(lambda: attnstate.merge_state(a, b))
    r["host_binding_explicit_stream_us"] = host_times(lambda: _C.merge_state(a, b, out, stream))
    r["host_binding_current_stream_us"] = host_times(lambda: _C.merge_state(a, b, out, None))
    r["host_torch_add_us"] = host_times(lambda: torch.add(x, x, out=x))
    r["host_to_dlpack_x6_us"] = host_times(
        lambda: [torch.utils.dlpack.to_dlpack(t) for t in (a.o, a.lse, b.o, b.lse, out.o, out.lse)])
    r["host_current_stream_us"] = host_times(lambda: torch.cuda.current_stream().cuda_stream)
    r["host_empty_kernel_launch_us"] = host_times(lambda: torch.cuda._sleep(0))

    # 1b. host time of a decode run (batch 1 x 1k keys, 32/8 heads, pages of 16)
    q, caches, seq, table = decode_problem(64)
    seq_dev = seq.cuda()
    dec = attnstate.Decode().plan(seq.numpy(), heads_q=32, heads_kv=8, head_dim=D,
                                  dtype=torch.bfloat16, like=caches[0][0])
    dout = attnstate.State(torch.empty(1, 32, D, device="cuda", dtype=torch.bfloat16),
                           torch.empty(1, 32, device="cuda"), "natural")
    k0, v0 = caches[0]
    r["decode_max_splits"] = dec.max_splits
    r["host_decode_run_us"] = host_times(
        lambda: dec.run(q, k0, v0, seq_dev, block_table=table, out=dout))

    # 2. kernel times from Python, as the C++ benchmarks measure them
    sets = [(state(), state(), state()) for _ in range(3)]  # 3 x ~100 MB: L2 never serves them
    r["kernel_merge_state_us"], _ = graph_time_per_call(
        lambda i: attnstate.merge_state(sets[i % 3][0], sets[i % 3][1], out=sets[i % 3][2]),
        calls=30)
    # as bench_decode --layers: 64 calls in one graph, each on its own 4 MiB cache, one plan,
    # one workspace and one output (runs on one stream are sequential)
    lout = attnstate.State(torch.empty_like(dout.o), torch.empty_like(dout.lse), "natural")
    r["kernel_decode_layers64_us"], graph = graph_time_per_call(
        lambda i: dec.run(q, caches[i][0], caches[i][1], seq_dev, block_table=table,
                              out=lout), calls=64)

    # 3. graph replay: the same bits as an eager call, no Python per call
    eager = dec.run(q, caches[63][0], caches[63][1], seq_dev, block_table=table)
    lout.o.zero_()
    graph.replay()
    torch.cuda.synchronize()
    r["graph_decode_same_bits"] = torch.equal(eager.o, lout.o) and torch.equal(eager.lse, lout.lse)
    t0 = time.perf_counter_ns()
    graph.replay()
    r["host_graph_replay_64_decodes_us"] = (time.perf_counter_ns() - t0) / 1e3
    torch.cuda.synchronize()

    for key, val in r.items():
        print(f"{key:36s} {val:.2f}" if isinstance(val, float) else f"{key:36s} {val}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
