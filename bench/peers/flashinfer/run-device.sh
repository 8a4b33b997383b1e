#!/usr/bin/env bash
# On the GPU machine, from the repository root, with the unpacked FlashInfer 0.7.2.post1 wheel at
# .peers/fi-0.7.2 (git-ignored, sent with the device call's carry [".peers/fi-0.7.2"]):
#   [FI_TARGETS="fi_decode fi_cascade"] bash bench/peers/flashinfer/run-device.sh [harness options]
# configures and builds the harnesses of FI_TARGETS (default: fi_cascade) into one build folder
# (Ninja when present, all cores), then for each in turn checks its host reference (--selftest),
# runs it, writes $OUT/<harness>.csv and $OUT/<harness>.log (the build output + the harness's
# stderr and stdout) and prints the CSV. The options are given to every harness run; options for
# one harness only go in FI_DECODE_ARGS / FI_CASCADE_ARGS (split on spaces, before the options),
# e.g.
#   bash bench/peers/flashinfer/run-device.sh --shapes 32768:256:128 --soft-cap 50
#   FI_TARGETS=fi_decode bash bench/peers/flashinfer/run-device.sh --uniform --serving
#   FI_TARGETS="fi_decode fi_cascade" FI_DECODE_ARGS="--uniform --quick" \
#     FI_CASCADE_ARGS="--shapes 32768:256:128" bash bench/peers/flashinfer/run-device.sh
# Overridable: FI_ROOT (the unpacked wheel; default .peers/fi-0.7.2 at the repository root),
# BUILD (default /tmp/fi-build; a git-ignored folder of the repository, e.g. build-fi, is kept on
# a warm device machine between calls), OUT (default /tmp/fi-out when unset), FI_BUILD_ONLY=1
# (build, run nothing), and the instances to build (CMake lists, ';'-separated): FI_DTYPES
# (bf16;f16), FI_HEAD_DIMS (64;128;256), FI_VARIANTS (cascade; plain;soft_cap;window),
# FI_DECODE_PATHS (cuda_core;tensor_core), FI_DECODE_MASKS (none;causal); defaults as given.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FI_ROOT=${FI_ROOT:-$HERE/../../../.peers/fi-0.7.2}
FI_ROOT=$(cd "$FI_ROOT" 2>/dev/null && pwd) || {
  echo "run-device.sh: no unpacked wheel at ${FI_ROOT} (bench/peers/flashinfer/unpack-wheel.sh;" \
       "set FI_ROOT)" >&2
  exit 1
}
read -r -a targets <<<"${FI_TARGETS:-fi_cascade}"
for t in "${targets[@]}"; do
  case "$t" in
    fi_decode | fi_cascade) ;;
    *) echo "run-device.sh: FI_TARGETS: '$t' is not fi_decode or fi_cascade" >&2; exit 2 ;;
  esac
done
[ "${#targets[@]}" -gt 0 ] || { echo "run-device.sh: FI_TARGETS names no harness" >&2; exit 2; }
BUILD=${BUILD:-/tmp/fi-build}
OUT=${OUT:-/tmp/fi-out}
mkdir -p "$OUT"
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
BUILD_LOG="$OUT/fi_build.log"
if ! {
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true)"
  echo "# $(nvcc --version | grep -i release || true)"
  echo "# $(head -1 "$FI_ROOT/MANIFEST" 2>/dev/null || echo "no MANIFEST in the unpacked wheel")"
  echo "# harnesses: ${targets[*]}; options: $*"
  time {
    cmake -S "$HERE" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DFI_ROOT="$FI_ROOT" \
      -DFI_DTYPES="${FI_DTYPES:-bf16;f16}" -DFI_HEAD_DIMS="${FI_HEAD_DIMS:-64;128;256}" \
      -DFI_VARIANTS="${FI_VARIANTS:-plain;soft_cap;window}" \
      -DFI_DECODE_PATHS="${FI_DECODE_PATHS:-cuda_core;tensor_core}" \
      -DFI_DECODE_MASKS="${FI_DECODE_MASKS:-none;causal}"
    cmake --build "$BUILD" --target "${targets[@]}" -j "$(nproc)"
  }
} 2>&1 | sed -e '/warning #20012-D/d' -e '/__inline__ __attribute__/d' -e '/^ *\^$/d' \
          -e '/Remark: The warnings can be suppressed/d' -e '/^$/d' | tee "$BUILD_LOG"; then
  echo "# build FAILED" | tee -a "$BUILD_LOG"
  exit 1
fi
[ "${FI_BUILD_ONLY:-0}" = 1 ] && exit 0
rc=0
for t in "${targets[@]}"; do
  LOG="$OUT/$t.log"
  cp "$BUILD_LOG" "$LOG"
  own=()
  if [ "$t" = fi_decode ]; then
    read -r -a own <<<"${FI_DECODE_ARGS:-}"
  else
    read -r -a own <<<"${FI_CASCADE_ARGS:-}"
  fi
  "$BUILD/$t" --selftest 2>&1 | tee -a "$LOG" || echo "# selftest FAILED" | tee -a "$LOG"
  start=$(date +%s)
  trc=0
  "$BUILD/$t" --csv "$OUT/$t.csv" "${own[@]}" "$@" 2>&1 | tee -a "$LOG" || trc=$?
  echo "# $t wall time: $(( $(date +%s) - start )) s, exit $trc" | tee -a "$LOG"
  echo "===== $t.csv"
  [ -f "$OUT/$t.csv" ] && cat "$OUT/$t.csv"
  [ "$trc" = 0 ] || rc=$trc
done
exit "$rc"
