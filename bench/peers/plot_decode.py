"""Draws the decode sweep: GB/s against context length per batch size, for attnstate
(bench_decode's CSV), PyTorch SDPA (sdpa_decode.py's CSV), FlashInfer (the fi_decode harness's
CSV, its faster path per point) and the copy ceiling measured in the same runs. One panel per
(heads_q) and batch size; writes a PNG.

    python3 bench/peers/plot_decode.py --attnstate decode.csv --sdpa sdpa.csv \
        [--flashinfer fi_decode.csv] --out decode_sweep.png
"""

import argparse
import csv
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnstate", required=True)
    ap.add_argument("--sdpa")
    ap.add_argument("--flashinfer")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    series = defaultdict(dict)  # (label, hq, batch) -> {ctx: gbps}
    ceiling = []
    for r in read(args.attnstate):
        key = ("attnstate", int(r["heads_q"]), int(r["batch"]))
        series[key][int(r["ctx"])] = float(r["gbps"])
        ceiling.append(float(r["copy_gbps"]))
    if args.sdpa:
        for r in read(args.sdpa):
            if r["section"] != "uniform":
                continue
            key = (r["backend"].replace("_", " "), int(r["heads_q"]), int(r["batch"]))
            series[key][int(r["ctx"])] = float(r["gbps"])
            ceiling.append(float(r["copy_gbps"]))
    if args.flashinfer:
        for r in read(args.flashinfer):
            if r["path"] == "memcpy":
                ceiling.append(float(r["gbps"]))
                continue
            if r["check"] != "PASS" or not r["id"].startswith("u"):
                continue
            key = ("flashinfer", int(r["hq"]), int(r["batch"]))
            ctx = int(r["ctx"])
            series[key][ctx] = max(series[key].get(ctx, 0.0), float(r["gbps"]))
    hqs = sorted({k[1] for k in series})
    batches = sorted({k[2] for k in series})
    fig, axes = plt.subplots(len(hqs), len(batches), figsize=(4 * len(batches), 3.4 * len(hqs)),
                             squeeze=False, sharey=True)
    styles = {"attnstate": ("C0", "-o"), "sdpa cudnn": ("C1", "--s"), "sdpa flash": ("C2", "--^"),
              "flashinfer": ("C3", ":d")}
    copy = sum(ceiling) / len(ceiling) if ceiling else None
    for i, hq in enumerate(hqs):
        for j, batch in enumerate(batches):
            ax = axes[i][j]
            for (label, h, b), pts in sorted(series.items()):
                if h != hq or b != batch or not pts:
                    continue
                xs = sorted(pts)
                color, style = styles.get(label, ("k", "-"))
                ax.plot(xs, [pts[x] for x in xs], style, color=color, label=label, ms=4)
            if copy:
                ax.axhline(copy, color="grey", lw=1, ls="-.", label="device copy")
            ax.set_xscale("log", base=2)
            ax.set_title(f"H_q {hq} / H_kv 8, batch {batch}", fontsize=9)
            ax.set_xlabel("context (tokens)")
            if j == 0:
                ax.set_ylabel("GB/s (K + V read)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Decode, bf16, head dim 128, pages of 16 (H200, same device call)", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
