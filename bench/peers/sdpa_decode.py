"""PyTorch SDPA on the decode shapes of bench_decode and bench_decode_serving (issue 19).

Times torch.nn.functional.scaled_dot_product_attention with the cuDNN and the flash backends on
contiguous caches (q (B, Hq, 1, D), k and v (B, Hkv, T, D), bf16, enable_gqa) -- the same shapes
as attnstate's benchmarks, whose paged caches hold the same bytes -- beside a device-to-device copy
measured in the same run. Each time is the median of --reps CUDA-event-timed calls, each after an
L2 flush (a 256 MiB read). Writes CSV rows: backend, section, d, heads_q, heads_kv, batch, ctx,
time_us, gbps, frac_copy, copy_gbps (a backend that refuses a shape is left out, with a note on
stderr).

    python3 bench/peers/sdpa_decode.py --csv sdpa.csv [--sections uniform,shapes,pages,latency]
        [--reps 21]

Sections: uniform (bench_decode's sweep), shapes and pages (bench_decode_serving's), latency
(bench_decode --latency: batch 1 x {1k, 2k, 4k, 8k} x head dims {64, 128, 256} x 32/8 and 64/8).
"""

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, reps, flush):
    for _ in range(3):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.add_(1)
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    ts = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    return 1000.0 * ts[len(ts) // 2]


def copy_gbps(reps, flush):
    n = 1 << 30
    a = torch.ones(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    us = timed(lambda: b.copy_(a), reps, flush)
    return 2.0 * n / (us * 1e-6) / 1e9


def shapes(sections):
    out = []
    if "uniform" in sections:
        for hq in (32, 64):
            for batch in (1, 4, 16, 64):
                for ctx in (1024, 8192, 32768, 131072):
                    out.append(("uniform", 128, hq, 8, batch, ctx))
    if "shapes" in sections:
        for d, group in ((64, 4), (256, 4), (128, 1), (128, 2), (128, 5), (128, 7), (128, 8),
                         (128, 16)):
            for batch in (1, 16):
                for ctx in (8192, 131072):
                    out.append(("shapes", d, 8 * group, 8, batch, ctx))
    if "pages" in sections:
        for batch in (4, 16):
            out.append(("pages", 128, 32, 8, batch, 32768))
    if "latency" in sections:  # bench_decode --latency: batch 1, 8 KV heads
        for d in (64, 128, 256):
            for hq in (32, 64):
                for ctx in (1024, 2048, 4096, 8192):
                    out.append(("latency", d, hq, 8, 1, ctx))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--csv", required=True)
    ap.add_argument("--sections", default="uniform,shapes,pages")
    ap.add_argument("--reps", type=int, default=21)
    args = ap.parse_args()
    flush = torch.zeros((256 << 20) // 4, dtype=torch.float32, device="cuda")
    copy = copy_gbps(args.reps, flush)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"device-to-device copy {copy:.0f} GB/s (read + written)")
    rows = []
    for section, d, hq, hkv, batch, ctx in shapes(args.sections.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(1)
        q = torch.rand((batch, hq, 1, d), device="cuda", generator=gen, dtype=torch.bfloat16) - 0.5
        k = torch.rand((batch, hkv, ctx, d), device="cuda", generator=gen, dtype=torch.bfloat16)
        v = torch.rand((batch, hkv, ctx, d), device="cuda", generator=gen, dtype=torch.bfloat16)
        kv_bytes = 2.0 * k.numel() * k.element_size()
        ref = None
        for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                    res = fn()
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = res.float()
                    elif (res.float() - ref).abs().max().item() > 2e-2:
                        print(f"# {name} {section} {d}/{hq}/{batch}/{ctx}: differs from cuDNN",
                              file=sys.stderr)
                    us = timed(fn, args.reps, flush)
            except Exception as e:  # noqa: BLE001 - a backend that refuses the shape
                print(f"# {name} {section} d{d} hq{hq} b{batch} ctx{ctx}: not run ({str(e)[:80]})",
                      file=sys.stderr)
                continue
            gbps = kv_bytes / (us * 1e-6) / 1e9
            rows.append((name, section, d, hq, hkv, batch, ctx, us, gbps, gbps / copy, copy))
            print(f"{name:11s} {section:8s} d{d:<4d} {hq:3d}/{hkv} b{batch:<3d} ctx{ctx:<7d} "
                  f"{us:9.1f} us {gbps:6.0f} GB/s {100 * gbps / copy:5.1f}%")
        del q, k, v
        torch.cuda.empty_cache()
    with open(args.csv, "w") as f:
        f.write("backend,section,head_dim,heads_q,heads_kv,batch,ctx,time_us,gbps,frac_copy,"
                "copy_gbps\n")
        for r in rows:
            f.write("%s,%s,%d,%d,%d,%d,%d,%.2f,%.1f,%.4f,%.1f\n" % r)


if __name__ == "__main__":
    main()
