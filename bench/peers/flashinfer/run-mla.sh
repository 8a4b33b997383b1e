#!/usr/bin/env bash
# On the GPU machine (H100 or H200), from the repository root, with the unpacked FlashInfer
# 0.7.2.post1 wheel at .peers/fi-0.7.2 (git-ignored, sent with the device call's carry
# [".peers/fi-0.7.2"]):
#   bash bench/peers/flashinfer/run-mla.sh [shape options]
# builds attnstate's bench_mla and FlashInfer's fi_mla (the Hopper MLA decode, fi_mla_kernel.cu)
# side by side, then in one call runs bench_mla and fi_mla on the same shapes (the options are
# given to both: --quick, --heads, --batches, --ctx, --q-lens, --dtypes, --page, --reps; see
# `bench_mla --help`), and prints per row attnstate's speed ÷ FlashInfer's (FlashInfer's median
# µs ÷ attnstate's: ≥ 1 where attnstate is faster) with both checks. Writes to $OUT (default
# /tmp/mla-out): bench_mla.{csv,txt}, fi_mla.{csv,txt}, mla_vs_fi.csv, build logs.
# Examples:
#   bash bench/peers/flashinfer/run-mla.sh --quick
#   bash bench/peers/flashinfer/run-mla.sh --dtypes bf16 --q-lens 1
#   bash bench/peers/flashinfer/run-mla.sh --quick --page 16
# Each step has its own time cap (seconds): AS_BUILD_TIMEOUT and FI_BUILD_TIMEOUT (both builds run
# at once; default 300 each), AS_RUN_TIMEOUT and FI_RUN_TIMEOUT (default 140 each), so that one
# call stays inside the device command's 600 s; for longer tables build in one call
# (MLA_BUILD_ONLY=1), then run with MLA_SKIP_BUILD=1 and run caps of up to 280 each, the full
# table in parts (e.g. one --dtypes at a time). Overridable: FI_ROOT (default .peers/fi-0.7.2),
# AS_BUILD (default build-mla-as, git-ignored: kept on a warm machine between calls), FI_BUILD
# (default build-mla-fi), OUT, MLA_BUILD_ONLY=1 (build, run nothing), MLA_SKIP_BUILD=1 (run the
# binaries already in AS_BUILD and FI_BUILD), MLA_JOBS (compile jobs per build; default nproc),
# FI_MLA_KV / FI_MLA_MASKS (the FlashInfer instances, CMake lists; default bf16;e4m3 and
# none;causal).
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
FI_ROOT=${FI_ROOT:-$REPO/.peers/fi-0.7.2}
FI_ROOT=$(cd "$FI_ROOT" 2>/dev/null && pwd) || {
  echo "run-mla.sh: no unpacked wheel at ${FI_ROOT} (bench/peers/flashinfer/unpack-wheel.sh;" \
       "set FI_ROOT)" >&2
  exit 1
}
AS_BUILD=${AS_BUILD:-$REPO/build-mla-as}
FI_BUILD=${FI_BUILD:-$REPO/build-mla-fi}
OUT=${OUT:-/tmp/mla-out}
mkdir -p "$OUT"
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
# Ninja when present, for a new build folder (a configured one keeps its generator)
gen_as=() gen_fi=()
if command -v ninja >/dev/null 2>&1; then
  [ -f "$AS_BUILD/CMakeCache.txt" ] || gen_as=(-G Ninja)
  [ -f "$FI_BUILD/CMakeCache.txt" ] || gen_fi=(-G Ninja)
fi
jobs=${MLA_JOBS:-$(nproc)}  # per build (the two run at once)
{
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true)"
  echo "# $(nvcc --version | grep -i release || true)"
  echo "# commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo none); $(head -1 "$FI_ROOT/MANIFEST" 2>/dev/null || echo "no MANIFEST in the unpacked wheel")"
  echo "# options: $*"
} | tee "$OUT/mla_run.log"

# 1. both builds at once, each capped (MLA_SKIP_BUILD=1: use the binaries already built)
if [ "${MLA_SKIP_BUILD:-0}" != 1 ]; then
(
  timeout "${AS_BUILD_TIMEOUT:-300}" cmake -S "$REPO" -B "$AS_BUILD" "${gen_as[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNSTATE_CUDA_HEAD_DIMS=128 \
    -DATTNSTATE_BUILD_BENCH=ON -DATTNSTATE_BUILD_TESTS=OFF -DATTNSTATE_BUILD_EXAMPLES=OFF \
    -DATTNSTATE_BUILD_PYTHON=OFF -DATTNSTATE_ENABLE_NCCL=OFF -DATTNSTATE_BUILD_TESTING_KIT=OFF \
    -DATTNSTATE_BUILD_DOCS=OFF -DATTNSTATE_INSTALL=OFF &&
    timeout "${AS_BUILD_TIMEOUT:-300}" cmake --build "$AS_BUILD" --target bench_mla -j "$jobs"
) >"$OUT/bench_mla_build.log" 2>&1 &
as_pid=$!
(
  set -o pipefail
  (
    timeout "${FI_BUILD_TIMEOUT:-300}" cmake -S "$HERE" -B "$FI_BUILD" "${gen_fi[@]}" \
      -DCMAKE_BUILD_TYPE=Release -DFI_ROOT="$FI_ROOT" -DFI_MLA_KV="${FI_MLA_KV:-bf16;e4m3}" \
      -DFI_MLA_MASKS="${FI_MLA_MASKS:-none;causal}" &&
      timeout "${FI_BUILD_TIMEOUT:-300}" cmake --build "$FI_BUILD" --target fi_mla -j "$jobs"
  ) 2>&1 | sed -e '/warning #20012-D/d' -e '/__inline__ __attribute__/d' -e '/^ *\^$/d' \
               -e '/Remark: The warnings can be suppressed/d' -e '/^$/d' >"$OUT/fi_mla_build.log"
) &
fi_pid=$!
t0=$(date +%s)
wait "$as_pid"; as_rc=$?
wait "$fi_pid"; fi_rc=$?
echo "# builds: bench_mla exit $as_rc, fi_mla exit $fi_rc ($(( $(date +%s) - t0 )) s)" |
  tee -a "$OUT/mla_run.log"
[ "$as_rc" = 0 ] || tail -30 "$OUT/bench_mla_build.log"
[ "$fi_rc" = 0 ] || tail -30 "$OUT/fi_mla_build.log"
[ "$as_rc" = 0 ] && [ "$fi_rc" = 0 ] || exit 1
fi
[ "${MLA_BUILD_ONLY:-0}" = 1 ] && exit 0

# 2. attnstate, then FlashInfer, in this one device call
rc=0
# run_one NAME EXE TIMEOUT ARGS...: runs EXE --csv $OUT/NAME.csv ARGS under TIMEOUT into
# $OUT/NAME.txt; a failure (a FAIL row, a crash, the cap) makes the script's status non-zero.
run_one() {
  local name=$1 exe=$2 cap=$3 start r
  shift 3
  start=$(date +%s)
  timeout "$cap" "$exe" --csv "$OUT/$name.csv" "$@" 2>&1 | tee "$OUT/$name.txt"
  r=${PIPESTATUS[0]}
  echo "# $name exit $r ($(( $(date +%s) - start )) s)" | tee -a "$OUT/mla_run.log"
  [ "$r" = 0 ] || rc=$r
}
run_one bench_mla "$AS_BUILD/bench/bench_mla" "${AS_RUN_TIMEOUT:-140}" "$@"
run_one fi_mla "$FI_BUILD/fi_mla" "${FI_RUN_TIMEOUT:-140}" "$@"

# 3. the rows side by side: key (heads, q_len, kv dtype, batch, ctx, page)
if [ -f "$OUT/bench_mla.csv" ] && [ -f "$OUT/fi_mla.csv" ]; then
  awk -F, -v OFS=, '
    FNR == 1 { next }
    FILENAME ~ /bench_mla.csv$/ {
      k = $1 FS $2 FS $3 FS $4 FS $5 FS $6
      as_us[k] = $8; as_frac[k] = $11; as_peak[k] = $13; as_floor[k] = $15; as_chk[k] = $19
      order[++n] = k; next
    }
    $1 == "fi_mla" {
      k = $2 FS $3 FS $4 FS $5 FS $6 FS $7
      fi_us[k] = $8; fi_frac[k] = $12; fi_chk[k] = $14
    }
    END {
      print "heads,q_len,kv_dtype,batch,ctx,page,attnstate_us,attnstate_frac_copy," \
            "attnstate_frac_peak,attnstate_x_floor,attnstate_check,flashinfer_us," \
            "flashinfer_frac_copy,flashinfer_check,speed_attnstate_over_flashinfer" > out
      printf "%5s %2s %5s %6s %6s %5s %10s %6s %10s %6s %8s\n", "heads", "q", "kv", "batch",
             "ctx", "page", "attn_us", "check", "fi_us", "check", "attn/fi" 
      for (i = 1; i <= n; ++i) {
        k = order[i]; split(k, f, FS)
        r = (k in fi_us && fi_us[k] != "" && as_us[k] > 0) ? fi_us[k] / as_us[k] : ""
        if (r != "") { ++m; lsum += log(r); if (r < 1.0) ++slow }
        print k, as_us[k], as_frac[k], as_peak[k], as_floor[k], as_chk[k], fi_us[k], fi_frac[k],
              fi_chk[k], (r == "" ? "" : sprintf("%.3f", r)) > out
        printf "%5s %2s %5s %6s %6s %5s %10s %6s %10s %6s %8s\n", f[1], f[2], f[3], f[4], f[5],
               f[6], as_us[k], as_chk[k], (k in fi_us ? fi_us[k] : "-"),
               (k in fi_chk ? fi_chk[k] : "-"), (r == "" ? "-" : sprintf("%.2fx", r))
      }
      if (m > 0)
        printf "# %d rows compared: geometric mean attnstate/FlashInfer speed %.3fx; " \
               "%d row(s) below 1.0x\n", m, exp(lsum / m), slow
    }' out="$OUT/mla_vs_fi.csv" "$OUT/bench_mla.csv" "$OUT/fi_mla.csv" | tee -a "$OUT/mla_run.log"
fi
exit "$rc"
