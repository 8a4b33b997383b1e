#!/usr/bin/env bash
# The paired fp8 split decode (issue 33, item 3: `DecodeOptions::split_stages` 4 and 6 over fp8
# caches at head dim 128) on a GPU in one command: builds test_cuda_decode_fp8, test_cuda_decode
# and bench_decode_serving for sm_90a at head dim 128 (into build-f8), runs the fp8 GPU tests
# (every case at the planner's depth and at the paired depths, against the double reference or
# the CPU decode of the dequantised cache on fresh random inputs, outputs NaN-poisoned first; NaN
# propagation; graph replay), the decode tests that run every catalog row (the paired rows
# among them) and the sinks' merge paths, then times `bench_decode_serving --sections fp8`: the
# automatic plan, the paired configuration at ring depths 4 and 6, each beside the bf16 decode
# of the same batch (speedup columns). Logs and the CSV in $OUT (default ./gpu-out).
#
#   scripts/gpu-fp8-pair.sh              # build, tests, bench
#   STEP=build scripts/gpu-fp8-pair.sh   # only the build; STEP=run: only tests and bench
#
# Caps: the tests 300 s each executable, the bench 240 s. JOBS: build parallelism (default 12).
set -uo pipefail
cd "$(git rev-parse --show-toplevel)" || exit 1
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
B=${BUILD_DIR:-build-f8}
STEP=${STEP:-all}
status=0
if [ "$STEP" != run ]; then
  prefix=()
  [ -d .deps/usr ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/usr")
  if ! cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DATTNSTATE_CUDA_HEAD_DIMS=128 -DATTNSTATE_BUILD_DOCS=OFF "${prefix[@]}" \
      >"$OUT/configure.log" 2>&1 ||
    ! cmake --build "$B" -j "${JOBS:-12}" --target test_cuda_decode_fp8 test_cuda_decode \
      bench_decode_serving >"$OUT/build.log" 2>&1; then
    echo "BUILD FAILED"; tail -30 "$OUT/configure.log" "$OUT/build.log"; exit 1
  fi
  echo "built $B"
fi
[ "$STEP" = build ] && exit 0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
run() {  # name, cap, command...
  local name=$1 cap=$2
  shift 2
  if timeout "$cap" "$@" >"$OUT/$name.log" 2>&1; then
    echo "PASS $name: $(grep -E '^\[  PASSED  \]' "$OUT/$name.log" | tail -1)"
  else
    echo "FAIL $name (rc $?)"; grep -E 'Failure|FAILED|Expected|Which is|error' "$OUT/$name.log" |
      head -40; status=1
  fi
}
run test_cuda_decode_fp8 300 "$B/tests/cuda/decode/test_cuda_decode_fp8"
run test_cuda_decode 300 "$B/tests/cuda/decode/test_cuda_decode" \
  --gtest_filter='CudaDecode.EveryCatalogRowMatchesTheCpuDecode:CudaDecode.SinksAreMergedOnceAfterEveryMergePath'
if timeout 240 "$B/bench/bench_decode_serving" --sections fp8 --csv "$OUT/bench_fp8.csv" \
    >"$OUT/bench_fp8.txt" 2>&1; then
  cat "$OUT/bench_fp8.txt"
else
  echo "FAIL bench_decode_serving (rc $?)"; tail -20 "$OUT/bench_fp8.txt"; status=1
fi
exit $status
