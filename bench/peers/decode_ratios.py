"""Same-run ratios of the decode against its peers: attnstate (bench_decode's and
bench_decode_serving's CSVs) beside FlashInfer (fi_decode's CSV, the faster of its two paths with
check PASS) and PyTorch's cuDNN SDPA (sdpa_decode.py's CSV), point by point, as Markdown tables.

A ratio is the peer's median time over attnstate's (above 1: attnstate is faster), so only CSVs of
one device call should be given together. Each section ends with the minimum and the median
ratio. Rows pair as follows:

- uniform (bench_decode): by (H_q, batch, context) with fi_decode's `u...` rows and SDPA's
  `uniform` rows;
- pages and shapes (bench_decode_serving): with fi_decode's `pages-<B>x32k-p<page>` and
  `shapes-d<D>-g<G>-<B>x<ctx>` rows (its --serving), and SDPA's `pages` (by batch) and `shapes`
  rows;
- ragged (bench_decode_serving): in order with fi_decode's rows read from the spec file that
  bench_decode_serving --fi-spec wrote (its --points-file); a pair whose batch or longest
  length differ is reported and left out.

    python3 bench/peers/decode_ratios.py --flashinfer fi_decode.csv [--sdpa sdpa.csv] \
        [--decode decode.csv] [--serving serving.csv] [--flashinfer fi_serving.csv ...]
"""

import argparse
import csv
import statistics
import sys


def read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def ctx_text(n):
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def flashinfer_rows(paths):
    """id -> (time_us, path, batch, ctx) of the faster PASS path, and the ids in first-seen
    order."""
    best, order = {}, []
    for path in paths:
        for r in read(path):
            if r["path"] == "memcpy":
                continue
            if r["id"] not in best and r["id"] not in order:
                order.append(r["id"])
            if r["check"] != "PASS":
                continue
            t = float(r["median_us"])
            if r["id"] not in best or t < best[r["id"]][0]:
                best[r["id"]] = (t, r["path"], int(r["batch"]), int(r["ctx"]))
    return best, order


def sdpa_rows(path):
    """(section, d, hq, batch, ctx) -> cuDNN time_us."""
    out = {}
    if path:
        for r in read(path):
            if r["backend"] == "sdpa_cudnn":
                key = (r["section"], int(r["head_dim"]), int(r["heads_q"]), int(r["batch"]),
                       int(r["ctx"]))
                out[key] = float(r["time_us"])
    return out


def table(title, rows):
    """rows: (label, attnstate_us, frac_copy, fi (us, path) or None, cudnn_us or None)."""
    print(f"\n### {title}\n")
    print("| point | attnstate µs | % copy | FlashInfer µs (path) | × FlashInfer | cuDNN µs "
          "| × cuDNN |")
    print("|---|---|---|---|---|---|---|")
    r_fi, r_cd = [], []
    for label, t, frac, fi, cd in rows:
        fi_txt = x_fi = cd_txt = x_cd = "–"
        if fi:
            r_fi.append((fi[0] / t, label))
            fi_txt, x_fi = f"{fi[0]:.1f} ({fi[1]})", f"{fi[0] / t:.3f}"
        if cd:
            r_cd.append((cd / t, label))
            cd_txt, x_cd = f"{cd:.1f}", f"{cd / t:.3f}"
        print(f"| {label} | {t:.1f} | {100 * frac:.1f} | {fi_txt} | {x_fi} | {cd_txt} | {x_cd} |")
    for name, rs in (("FlashInfer", r_fi), ("cuDNN", r_cd)):
        if rs:
            lo = min(rs)
            print(f"\n× {name}: minimum {lo[0]:.3f} ({lo[1]}), median "
                  f"{statistics.median(x for x, _ in rs):.3f}, {len(rs)} points")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flashinfer", action="append", required=True,
                    help="fi_decode CSV (may repeat: e.g. one per device call's harness run)")
    ap.add_argument("--sdpa")
    ap.add_argument("--decode", help="bench_decode's CSV")
    ap.add_argument("--serving", help="bench_decode_serving's CSV")
    args = ap.parse_args()
    if not args.decode and not args.serving:
        ap.error("give --decode and/or --serving")
    fi, fi_order = flashinfer_rows(args.flashinfer)
    cd = sdpa_rows(args.sdpa)
    if args.decode:
        rows = []
        for r in read(args.decode):
            hq, b, ctx = int(r["heads_q"]), int(r["batch"]), int(r["ctx"])
            fid = f"u{hq}-{b}x{ctx_text(ctx)}"
            rows.append((f"{hq}/8 b{b} {ctx_text(ctx)}", float(r["time_us"]), float(r["frac_copy"]),
                         fi[fid][:2] if fid in fi else None, cd.get(("uniform", 128, hq, b, ctx))))
        table("uniform sweep (bench_decode)", rows)
    if args.serving:
        serving = read(args.serving)
        ragged_ids = [i for i in fi_order if not i.startswith(("u", "pages-", "shapes-"))]
        sections = {"ragged": [], "pages": [], "shapes": []}
        k = 0
        for r in serving:
            sec = r["section"]
            if sec not in sections:
                continue
            b, d = int(r["batch"]), int(r["head_dim"])
            hq, hkv = int(r["heads_q"]), int(r["heads_kv"])
            page, ctx, t = int(r["page"]), int(r["max_len"]), float(r["time_us"])
            frac = float(r["frac_copy"])
            if sec == "ragged":
                label = f"{r['dist']} b{b} {r['kv_mib']} MiB"
                f = None
                if k < len(ragged_ids):
                    got = fi.get(ragged_ids[k])
                    if got and (got[2] != b or got[3] != ctx):
                        print(f"# ragged row {k} ({label}): fi_decode's point {ragged_ids[k]} has "
                              f"batch {got[2]}, longest {got[3]}; left out", file=sys.stderr)
                    elif got:
                        f = got[:2]
                k += 1
                sections[sec].append((label, t, frac, f, None))
            elif sec == "pages":
                fid = f"pages-{b}x32k-p{page}"
                sections[sec].append((f"b{b} page {page}", t, frac,
                                      fi[fid][:2] if fid in fi else None,
                                      cd.get(("pages", 128, hq, b, ctx))))
            else:
                g = hq // hkv
                fid = f"shapes-d{d}-g{g}-{b}x{ctx_text(ctx)}"
                sections[sec].append((f"d{d} g{g} b{b} {ctx_text(ctx)}", t, frac,
                                      fi[fid][:2] if fid in fi else None,
                                      cd.get(("shapes", d, hq, b, ctx))))
        for sec, rows in sections.items():
            if rows:
                table(f"{sec} (bench_decode_serving)", rows)


if __name__ == "__main__":
    main()
