#!/usr/bin/env bash
# GPU check for attnstate, run on a machine with an NVIDIA GPU (the project's H200):
#   1. configures and builds for sm_90a (tests, examples, benchmarks),
#   2. runs every test with CTest (GPU tests included),
#   3. runs compute-sanitizer memcheck and racecheck over the GPU test executables,
#   4. runs the GPU benchmarks, each writing a CSV (bench_cascade also with --quick --lean
#      --scatter: the shared prefix's pages scattered over the pool, with --quick
#      --soft-cap 50, and with --sections: f16, head dims 64/256, soft cap, window and fp8 KV
#      beside bf16 / D 128, each with its floor and the plain decode; bench_mla with --quick, then
#      q_len 2 (causal) on pages of 16 tokens, each row checked against the CPU),
# and leaves logs and CSVs in $OUT (default ./gpu-out): summary.txt plus gpu-check.tar.gz.
#
# Knobs (environment): GPU_TARGETS   build only these targets (default: all)
#                      GPU_TESTS     ctest -R regex (default: every test); "none" to skip ctest
#                      GPU_SANITIZE  0 to skip compute-sanitizer (default 1)
#                      GPU_SAN_EXES  names of executables to sanitize (default: every test_cuda_*)
#                      GPU_SAN_TOOLS compute-sanitizer tools to run (default: memcheck racecheck)
#                      GPU_SAN_PRINT_LIMIT reports printed per run (default 200): a run whose
#                                    summary counts more errors than it printed fails (an
#                                    unprinted error is never taken for NCCL's API noise)
#                      GPU_SAN_API_ERRORS compute-sanitizer --report-api-errors (all, explicit or
#                                    no; default: the tool's, explicit)
#                      GPU_BENCH     names of bench executables to run (default: every bench_*
#                                    built with CUDA); "none" to skip
#                      GPU_BENCH_ARGS extra arguments for each benchmark (e.g. --quick; bench_mla
#                                    refuses an option it does not know)
#                      GPU_BENCH_ARGS_<name> extra arguments for benchmark <name> only (e.g.
#                                    GPU_BENCH_ARGS_bench_decode="--layers 32"); bench_mla gets
#                                    --quick unless GPU_BENCH_ARGS_bench_mla is set (set it empty
#                                    for the full table: batch 1-128 x ctx 1k-64k x 16/128 heads x
#                                    q_len 1/2 x bf16/e4m3)
#                      GPU_SAN_BUDGET seconds after which no sanitizer run starts (default 420);
#                                    each run is capped at GPU_SAN_TIMEOUT (default 240) and
#                                    property tests run RC_PARAMS=max_success=20 under it
#                      GPU_SAN_FUZZ_CASES cases per entry point of test_cuda_fuzz under
#                                    the sanitizers (default 50)
#                      GPU_SAN_SHARDS GoogleTest shards per (tool, executable) run (default 1)
#                      GPU_SAN_JOBS  sanitizer runs at once (default 1; e.g. 6 on 16 host cores)
#                      GPU_SAN_RETRY_TIMEOUT cap of the re-run, alone, of a run that hit
#                                    GPU_SAN_TIMEOUT while sharing the host (default 400)
#                      GPU_HEAD_DIMS the CUDA head dims to compile (ATTNSTATE_CUDA_HEAD_DIMS, e.g.
#                                    "128": the reduced build CI compiles, its GPU tests run here;
#                                    default: the project's list); the package build takes it too
#                      GPU_PYTHON    0 to skip the Python package's build and pytest run (default 1)
#                      GPU_PYTHON_EXE the Python with torch, nanobind, scikit-build-core, pytest
#                                    (default python3)
# One part alone, e.g. memcheck of the NCCL test only:
#   GPU_TARGETS=test_cuda_cp_merge GPU_TESTS=none GPU_SAN_EXES=test_cuda_cp_merge \
#     GPU_SAN_TOOLS=memcheck GPU_BENCH=none GPU_PYTHON=0 scripts/gpu-check.sh
# GoogleTest/RapidCheck are taken from .deps/usr when present (scripts/make-device-deps.sh).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# NVLink multicast stays off for the NCCL tests and benchmarks (test_cuda_cp_merge,
# bench_cp_merge): the device machines require it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-$PWD/gpu-out}
LOG=$OUT/logs
mkdir -p "$LOG"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
status=0

say "== gpu-check $(date -u +%FT%TZ) commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo none)}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$LOG/nvidia-smi.csv" 2>&1
say "$(tail -n +2 "$LOG/nvidia-smi.csv")"

prefix=()
[ -d .deps/usr ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/usr")
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
dims=()
[ -n "${GPU_HEAD_DIMS:-}" ] && dims=(-DATTNSTATE_CUDA_HEAD_DIMS="$GPU_HEAD_DIMS")
BUILD=${BUILD_DIR:-build-gpu}
if ! cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DATTNSTATE_BUILD_DOCS=OFF -DATTNSTATE_INSTALL=OFF "${prefix[@]}" "${dims[@]}" \
      >"$LOG/configure.log" 2>&1; then
  say "CONFIGURE FAILED"; tail -30 "$LOG/configure.log"; status=1
fi
# shellcheck disable=SC2206  # a list of target names
targets=(${GPU_TARGETS:-all})
t0=$(date +%s)
if ! cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}" >"$LOG/build.log" 2>&1; then
  say "BUILD FAILED"; grep -E "error|Error" "$LOG/build.log" | head -40 | tee -a "$SUMMARY"; status=1
fi
say "build: $(( $(date +%s) - t0 )) s"

# 2. every test
if [ -f "$BUILD/CTestTestfile.cmake" ] && [ "${GPU_TESTS:-}" != none ]; then
  ctest --test-dir "$BUILD" --output-on-failure -j 4 --timeout 900 ${GPU_TESTS:+-R "$GPU_TESTS"} >"$LOG/ctest.log" 2>&1 || status=1
  say "ctest: $(grep -E 'tests passed|tests failed' "$LOG/ctest.log" | tail -1)"
  grep -E "\*\*\*Failed|Not Run|Timeout" "$LOG/ctest.log" | head -40 | tee -a "$SUMMARY"
fi

# 3. compute-sanitizer over the GPU tests (tests named *Large* are skipped: too slow there;
# e.g. test_cuda_mla's matrix, whose EveryPathOnASmallProblem covers each MLA row instead).
# Each (tool, executable) run is cut into GPU_SAN_SHARDS GoogleTest shards, and GPU_SAN_JOBS runs
# go at once (the sanitizers are bound by host CPU, and the tests use little GPU memory). No run
# starts once GPU_SAN_BUDGET seconds have passed; each is capped at GPU_SAN_TIMEOUT.
# A run that reports errors passes only when every one is a CUDA API error returned inside NCCL
# (its own probing in ncclCommInitAll, e.g. cudaErrorNoKernelImageForDevice from
# cudaFuncGetAttributes: scripts/sanitizer-report.awk tells them apart by the first host frame
# outside libcuda) and every test passed: memory errors, leaks, races and hazards, and API errors
# of any other caller still fail.
san_one() {  # tool exe name shard shards [cap] -> one summary line on stdout
  local tool=$1 exe=$2 name=$3 shard=$4 shards=$5 cap=${6:-${GPU_SAN_TIMEOUT:-240}} log rc
  log="$LOG/san-$tool-$name-$shard.log"
  [ "$shards" = 1 ] && log="$LOG/san-$tool-$name.log"
  local rc_params="max_success=20"
  # --- fuzz: test_cuda_fuzz (issue 16, property_tests/fuzz) runs GPU_SAN_FUZZ_CASES (default 50) cases
  # per entry point under each tool (2,000 plainly; memcheck shows an access outside its arena)
  [ "$name" = test_cuda_fuzz ] && rc_params="max_success=${GPU_SAN_FUZZ_CASES:-50}"
  # --- end fuzz ---
  local api=()
  [ -n "${GPU_SAN_API_ERRORS:-}" ] && api=(--report-api-errors "$GPU_SAN_API_ERRORS")
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard RC_PARAMS="$rc_params" \
    timeout "$cap" compute-sanitizer --tool "$tool" --error-exitcode 9 "${api[@]}" \
    --print-limit "${GPU_SAN_PRINT_LIMIT:-200}" "$exe" --gtest_filter='-*Large*' >"$log" 2>&1
  rc=$?
  local what="sanitizer $tool $name" real=0 nccl=0 unprinted=0
  [ "$shards" = 1 ] || what="$what (shard $((shard + 1))/$shards)"
  if [ $rc = 9 ]; then
    read -r real nccl unprinted < <(awk -f scripts/sanitizer-report.awk "$log")
    if [ "$real" = 0 ] && [ "$unprinted" = 0 ] && [ "$nccl" -gt 0 ] &&
      grep -q '^\[  PASSED  \]' "$log" && ! grep -q '^\[  FAILED  \]' "$log"; then
      rc=0
    fi
  fi
  if [ $rc = 0 ]; then
    local noise=""
    [ "$nccl" -gt 0 ] && noise="; $nccl CUDA API errors inside NCCL (its own probing) not counted"
    echo "$what: clean ($(grep -c '^\[       OK' "$log") tests; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)$noise)"
  elif [ $rc = 124 ]; then
    # stopped by the time cap: not a pass; say how far it got and whether anything was reported
    echo "$what: TIMED OUT after $cap s ($(grep -c '^\[       OK' "$log") tests done, $(grep -cE 'Invalid|hazard|Race reported' "$log") errors reported); last: $(grep '^\[ RUN' "$log" | tail -1)"
  else
    local split=""
    [ $rc = 9 ] && split=" ($real errors besides $nccl CUDA API errors inside NCCL, $unprinted unprinted)"
    echo "$what: FAILED$split"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|FAILED|hazard|Program hit" "$log" | head -10
  fi
}
if [ "${GPU_SANITIZE:-1}" != 0 ] && command -v compute-sanitizer >/dev/null; then
  exes=${GPU_SAN_EXES:-$(find "$BUILD/tests" "$BUILD/property_tests" -maxdepth 4 -type f -perm -u+x -name 'test_cuda_*' -printf '%f\n' 2>/dev/null | sort -u)}
  shards=${GPU_SAN_SHARDS:-1}
  jobs=${GPU_SAN_JOBS:-1}
  san_start=$(date +%s)
  n=0
  for name in $exes; do
    # the newest of that name (a reused build folder may keep one from an older layout)
    exe=$(find "$BUILD" -type f -name "$name" -perm -u+x -printf '%T@ %p\n' | sort -nr | head -1 |
      cut -d' ' -f2-)
    [ -n "$exe" ] || continue
    # no more shards than tests (an empty shard makes compute-sanitizer fail: no CUDA call)
    ntests=$("$exe" --gtest_list_tests --gtest_filter='-*Large*' 2>/dev/null | grep -c '^  ')
    exe_shards=$(( ntests < shards ? (ntests > 0 ? ntests : 1) : shards ))
    for tool in ${GPU_SAN_TOOLS:-memcheck racecheck}; do
      for ((shard = 0; shard < exe_shards; ++shard)); do
        idx=$n
        n=$((n + 1))
        if [ $(( $(date +%s) - san_start )) -gt "${GPU_SAN_BUDGET:-420}" ]; then
          part=""
          [ "$exe_shards" = 1 ] || part=" (shard $((shard + 1))/$exe_shards)"
          echo "sanitizer $tool $name$part: NOT RUN (sanitizer time budget spent)" >"$LOG/san-$idx.line"
          continue
        fi
        while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n 2>/dev/null || sleep 1; done
        echo "$tool $exe $name $shard $exe_shards" >"$LOG/san-$idx.args"
        san_one "$tool" "$exe" "$name" "$shard" "$exe_shards" >"$LOG/san-$idx.line" &
      done
    done
  done
  wait
  # A run cut by the cap while sharing the host is re-run alone, with GPU_SAN_RETRY_TIMEOUT
  # (a slow test under racecheck can take minutes when 15 runs share 16 cores).
  for ((i = 0; i < n; ++i)); do
    if grep -q ": TIMED OUT" "$LOG/san-$i.line" 2>/dev/null && [ -f "$LOG/san-$i.args" ]; then
      read -r tool exe name shard exe_shards <"$LOG/san-$i.args"
      { san_one "$tool" "$exe" "$name" "$shard" "$exe_shards" "${GPU_SAN_RETRY_TIMEOUT:-400}" |
          sed 's/$/ [re-run alone after a timeout]/'; } >"$LOG/san-$i.retry"
      mv "$LOG/san-$i.retry" "$LOG/san-$i.line"
    fi
    rm -f "$LOG/san-$i.args"
  done
  for ((i = 0; i < n; ++i)); do
    tee -a "$SUMMARY" <"$LOG/san-$i.line"
    grep -qE ": (FAILED|TIMED OUT)" "$LOG/san-$i.line" && status=1
    rm -f "$LOG/san-$i.line"
  done
  say "sanitizers: $(( $(date +%s) - san_start )) s (${jobs} at once, ${shards} shard(s) per run)"
fi

# 4. benchmarks
if [ "${GPU_BENCH:-}" != none ]; then
  benches=${GPU_BENCH:-$(find "$BUILD/bench" -maxdepth 1 -type f -perm -u+x -name 'bench_*' -printf '%f\n' 2>/dev/null | sort)}
  for name in $benches; do
    exe="$BUILD/bench/$name"
    [ -x "$exe" ] || { say "bench $name: not built"; continue; }
    own="GPU_BENCH_ARGS_$name"
    own_args=${!own:-}
    # the MLA decode's full table takes minutes: its short table unless asked otherwise
    [ "$name" = bench_mla ] && [ -z "${!own+set}" ] && own_args=--quick
    # shellcheck disable=SC2086  # argument lists
    if "$exe" --csv "$LOG/$name.csv" ${GPU_BENCH_ARGS:-} $own_args >"$LOG/$name.txt" 2>&1; then
      say "bench $name: ok"; cat "$LOG/$name.txt" >>"$SUMMARY"
    else
      say "bench $name: FAILED"; tail -20 "$LOG/$name.txt" | tee -a "$SUMMARY"; status=1
    fi
    # the MLA decode's speculative rows (q_len 2, causal) on pages of 16 tokens
    if [ "$name" = bench_mla ]; then
      if "$exe" --quick --q-lens 2 --page 16 --csv "$LOG/$name-q2-page16.csv" >"$LOG/$name-q2-page16.txt" 2>&1; then
        say "bench $name --q-lens 2 --page 16: ok"; cat "$LOG/$name-q2-page16.txt" >>"$SUMMARY"
      else
        say "bench $name --q-lens 2 --page 16: FAILED"; tail -20 "$LOG/$name-q2-page16.txt" | tee -a "$SUMMARY"; status=1
      fi
    fi
    # the cascade again with the shared prefix's pages scattered over the pool
    if [ "$name" = bench_cascade ]; then
      if "$exe" --quick --lean --scatter --csv "$LOG/$name-scatter.csv" >"$LOG/$name-scatter.txt" 2>&1; then
        say "bench $name --scatter: ok"; cat "$LOG/$name-scatter.txt" >>"$SUMMARY"
      else
        say "bench $name --scatter: FAILED"; tail -20 "$LOG/$name-scatter.txt" | tee -a "$SUMMARY"; status=1
      fi
      # and with a logits soft cap of 50 in every level (beside the plain decode with the cap)
      if "$exe" --quick --soft-cap 50 --csv "$LOG/$name-softcap.csv" >"$LOG/$name-softcap.txt" 2>&1; then
        say "bench $name --soft-cap 50: ok"; cat "$LOG/$name-softcap.txt" >>"$SUMMARY"
      else
        say "bench $name --soft-cap 50: FAILED"; tail -20 "$LOG/$name-softcap.txt" | tee -a "$SUMMARY"; status=1
      fi
      # the sections: dtypes, head dims and variants at 32k/256/128 and 4k/64/16 (a cascade the
      # library refuses is a 'refused' row, not a failure)
      if "$exe" --sections --csv "$LOG/$name-sections.csv" >"$LOG/$name-sections.txt" 2>&1; then
        say "bench $name --sections: ok"; cat "$LOG/$name-sections.txt" >>"$SUMMARY"
      else
        say "bench $name --sections: FAILED"; tail -40 "$LOG/$name-sections.txt" | tee -a "$SUMMARY"; status=1
      fi
    fi
  done
fi

# 5. the Python package built with CUDA (python/run_tests.sh: pip into $BUILD-py, then pytest,
# the GPU tests included: torch, CuPy, JAX, graph capture, torch.compile, Triton, SDPA producers)
if [ "${GPU_PYTHON:-1}" = 1 ]; then
  t0=$(date +%s)
  PY_CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90a ${prefix[*]} ${dims[*]}" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    python/run_tests.sh "${GPU_PYTHON_EXE:-python3}" "$PWD/$BUILD-py" -rfEs >"$LOG/pytest.log" 2>&1 ||
    status=1
  say "pytest (CUDA package): $(tail -1 "$LOG/pytest.log") ($(( $(date +%s) - t0 )) s)"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$LOG/pytest.log" | head -40 | tee -a "$SUMMARY"
fi

say "== gpu-check status $status"
tar -czf "$OUT/gpu-check.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
exit $status
