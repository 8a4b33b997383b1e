#!/usr/bin/env bash
# Batch-1 decode latency sweep (issue 33, item 1) on a GPU machine, in one command: builds
# bench_decode for sm_90a with the decode's head dims 64, 128 and 256 (tests, examples and the
# testing kit off), then runs `bench_decode --latency` under a time cap: batch 1 × {1k, 2k, 4k,
# 8k} keys × head dims {64, 128, 256} × 32/8 and 64/8 heads, every split count, merge path
# (cluster, workspace tickets alone or in cluster groups), pipeline depth, the streamed kernel,
# the automatic layout over fewer CTAs per SM (`DecodeOptions::plan_ctas_per_sm`) and PDL on the
# automatic and the best plan; each alternative checked against the CPU decode (NaN-poisoned
# outputs) and timed with the L2 flushed.
#
#   scripts/decode-latency.sh [OUT_DIR]      (default: $OUT, else ./latency-out)
#
# Knobs (environment): LAT_BUILD_DIR   build directory (default build-lat; reused when present)
#                      LAT_JOBS        build jobs (default: nproc)
#                      LAT_TIMEOUT     seconds the sweep may run (default 120)
#                      LAT_ARGS        extra bench_decode arguments (e.g. --reps 21, --latency-all)
#                      LAT_BUILD_ONLY  1: build, then stop (the build of three head dims may take
#                                      longer than one call; a later call resumes it)
# Output: OUT_DIR/latency.txt (one line per row: the automatic plan, the best alternative, each
# also as a programmatic launch), OUT_DIR/latency.csv (every alternative), OUT_DIR/build.log.
# Exit status: the build's, else the sweep's (2: a check failed; 124: the time cap).
set -uo pipefail
out=$(realpath -m "${1:-${OUT:-latency-out}}")
mkdir -p "$out"
src=$(cd "$(dirname "$0")/.." && pwd)
bld=${LAT_BUILD_DIR:-$src/build-lat}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
start=$(date +%s)
if ! cmake -S "$src" -B "$bld" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNSTATE_CUDA_HEAD_DIMS="64;128;256" \
  -DATTNSTATE_BUILD_TESTS=OFF -DATTNSTATE_BUILD_EXAMPLES=OFF -DATTNSTATE_BUILD_TESTING_KIT=OFF \
  -DATTNSTATE_BUILD_DOCS=OFF -DATTNSTATE_INSTALL=OFF -DATTNSTATE_ENABLE_NCCL=OFF \
  >"$out/build.log" 2>&1 ||
  ! cmake --build "$bld" -j "${LAT_JOBS:-$(nproc)}" --target bench_decode >>"$out/build.log" 2>&1
then
  echo "build failed"
  tail -30 "$out/build.log"
  exit 1
fi
echo "# built in $(( $(date +%s) - start )) s"
[ "${LAT_BUILD_ONLY:-0}" = 1 ] && exit 0
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader || true
# shellcheck disable=SC2086
timeout "${LAT_TIMEOUT:-120}" "$bld/bench/bench_decode" --latency --csv "$out/latency.csv" \
  ${LAT_ARGS:-} 2>&1 | tee "$out/latency.txt"
rc=${PIPESTATUS[0]}
echo "# sweep exit status $rc after $(( $(date +%s) - start )) s"
exit "$rc"
