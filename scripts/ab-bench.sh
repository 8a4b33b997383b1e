#!/usr/bin/env bash
# A/B benchmark of two source trees on one GPU machine, in one run: builds the benchmarks of
# both (sm_90a, Release), then runs rounds that alternate the order (old-new, new-old, ...) and
# writes, per benchmark row, the median over rounds of each build's time and their ratio.
#
#   scripts/ab-bench.sh OLD_SRC NEW_SRC OUT_DIR
#
# OLD_SRC / NEW_SRC: source trees (e.g. `git archive` extracts). Knobs (environment):
#   AB_ROUNDS   rounds (default 3)      AB_BUDGET  seconds after which no round starts (480)
#   AB_DECODE   bench_decode arguments  (default: the whole sweep, --no-s1 --reps 15)
#   AB_CASCADE  bench_cascade arguments (default: --quick, every column incl. the mma.sync one)
#   AB_MERGE    bench_merge arguments   (default: --quick)
# GoogleTest/RapidCheck are not needed (tests off). Output: OUT_DIR/ab.md (the table),
# OUT_DIR/ab-<build>-<round>-<bench>.csv.
set -uo pipefail
old=$(realpath "${1:?usage: ab-bench.sh OLD_SRC NEW_SRC OUT_DIR}")
new=$(realpath "${2:?}")
out=$(realpath -m "${3:?}")
mkdir -p "$out"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
build() {  # src -> builds $src/build-ab
  cmake -S "$1" -B "$1/build-ab" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNSTATE_BUILD_TESTS=OFF -DATTNSTATE_BUILD_EXAMPLES=OFF \
    -DATTNSTATE_BUILD_TESTING_KIT=OFF -DATTNSTATE_BUILD_DOCS=OFF -DATTNSTATE_INSTALL=OFF \
    >"$out/configure-$2.log" 2>&1 &&
    cmake --build "$1/build-ab" -j "$(( $(nproc) / 2 ))" --target bench_decode bench_cascade \
      bench_merge >"$out/build-$2.log" 2>&1
}
build "$old" old & p1=$!
build "$new" new & p2=$!
wait $p1 || { echo "old build failed"; tail -20 "$out/build-old.log"; exit 1; }
wait $p2 || { echo "new build failed"; tail -20 "$out/build-new.log"; exit 1; }
declare -A src=([old]=$old [new]=$new)
args_decode=${AB_DECODE:---no-s1 --reps 15}
args_cascade=${AB_CASCADE:---quick}
args_merge=${AB_MERGE:---quick}
start=$(date +%s)
rounds=0
for ((r = 0; r < ${AB_ROUNDS:-3}; ++r)); do
  [ $(( $(date +%s) - start )) -gt "${AB_BUDGET:-480}" ] && break
  order="old new"
  [ $((r % 2)) = 1 ] && order="new old"
  for b in $order; do
    for bench in decode cascade merge; do
      a="args_$bench"
      # shellcheck disable=SC2086
      "${src[$b]}/build-ab/bench/bench_$bench" --csv "$out/ab-$b-$r-$bench.csv" ${!a} \
        >"$out/ab-$b-$r-$bench.txt" 2>&1 || { echo "bench_$bench ($b) failed"; exit 1; }
    done
  done
  rounds=$((r + 1))
  echo "round $rounds done at $(( $(date +%s) - start )) s"
done
python3 - "$out" "$rounds" <<'EOF'
import csv, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
spec = {  # key columns, time columns
    "decode": (["heads_q", "heads_kv", "batch", "ctx"], ["time_us"]),
    "cascade": (["prefix", "suffix", "batch"],
                ["cascade_us", "prefix_level_us", "suffix_level_us", "merge_us", "mma_only_us"]),
    "merge": (["op", "layout", "states", "tokens", "heads", "head_dim", "dtype"], ["time_us"]),
}
lines = [f"A/B: {rounds} rounds, medians over rounds (each round's value is the benchmark's own "
         "median of its repeats)", "", "| bench | row | column | old µs | new µs | new/old |",
         "|---|---|---|---:|---:|---:|"]
worst = {}
for bench, (keys, cols) in spec.items():
    vals = {}
    for b in ("old", "new"):
        for r in range(rounds):
            try:
                rows = list(csv.DictReader(open(f"{out}/ab-{b}-{r}-{bench}.csv")))
            except FileNotFoundError:
                continue
            for row in rows:
                k = "/".join(row[c] for c in keys)
                for c in cols:
                    if c in row and row[c] not in ("", "nan"):
                        vals.setdefault((k, c), {}).setdefault(b, []).append(float(row[c]))
    for (k, c), v in vals.items():
        if "old" not in v or "new" not in v:
            continue
        o, n = statistics.median(v["old"]), statistics.median(v["new"])
        ratio = n / o if o > 0 else float("nan")
        worst[bench] = max(worst.get(bench, 0), abs(ratio - 1))
        lines.append(f"| {bench} | {k} | {c} | {o:.2f} | {n:.2f} | {ratio:.3f} |")
lines.append("")
for bench, w in worst.items():
    lines.append(f"{bench}: largest |new/old - 1| = {w:.3f}")
open(f"{out}/ab.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines[-len(worst):]))
EOF
