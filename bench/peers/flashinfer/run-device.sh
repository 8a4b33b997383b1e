#!/usr/bin/env bash
# On the GPU machine, from the repository root, with the unpacked FlashInfer 0.7.2.post1 wheel at
# .peers/fi-0.7.2 (git-ignored, sent with the device call's carry [".peers"]):
#   bash bench/peers/flashinfer/run-device.sh [harness options]
# configures and builds fi_cascade into /tmp (Ninja when present, all cores), checks the host
# reference (--selftest), runs the harness (the default shapes unless the options say otherwise),
# writes $OUT/fi_cascade.csv and $OUT/fi_cascade.log (build output + the harness's stderr and
# stdout), then prints the CSV. Options go to the harness, e.g.
#   --shapes 32768:256:128,4096:64:16   --dtype f16   --head-dim 64   --soft-cap 50   --window 512
# Overridable: FI_ROOT (the unpacked wheel; default .peers/fi-0.7.2 at the repository root),
# BUILD (default /tmp/fi-cascade-build), OUT (default /tmp/fi-cascade-out when unset), and the
# instances to build: FI_DTYPES, FI_HEAD_DIMS, FI_VARIANTS (CMake lists, ';'-separated; default
# all: bf16;f16, 64;128;256, plain;soft_cap;window).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FI_ROOT=${FI_ROOT:-$HERE/../../../.peers/fi-0.7.2}
FI_ROOT=$(cd "$FI_ROOT" 2>/dev/null && pwd) || {
  echo "run-device.sh: no unpacked wheel at ${FI_ROOT} (bench/peers/flashinfer/unpack-wheel.sh;" \
       "set FI_ROOT)" >&2
  exit 1
}
BUILD=${BUILD:-/tmp/fi-cascade-build}
OUT=${OUT:-/tmp/fi-cascade-out}
mkdir -p "$OUT"
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
LOG="$OUT/fi_cascade.log"
if ! {
  echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null || true)"
  echo "# $(nvcc --version | grep -i release || true)"
  echo "# $(head -1 "$FI_ROOT/MANIFEST" 2>/dev/null || echo "no MANIFEST in the unpacked wheel")"
  echo "# harness options: $*"
  time {
    cmake -S "$HERE" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DFI_ROOT="$FI_ROOT" \
      -DFI_DTYPES="${FI_DTYPES:-bf16;f16}" -DFI_HEAD_DIMS="${FI_HEAD_DIMS:-64;128;256}" \
      -DFI_VARIANTS="${FI_VARIANTS:-plain;soft_cap;window}"
    cmake --build "$BUILD" --target fi_cascade -j "$(nproc)"
  }
} 2>&1 | sed -e '/warning #20012-D/d' -e '/__inline__ __attribute__/d' -e '/^ *\^$/d' \
          -e '/Remark: The warnings can be suppressed/d' -e '/^$/d' | tee "$LOG"; then
  echo "# build FAILED" | tee -a "$LOG"
  exit 1
fi
"$BUILD/fi_cascade" --selftest 2>&1 | tee -a "$LOG" || echo "# selftest FAILED" | tee -a "$LOG"
start=$(date +%s)
rc=0
"$BUILD/fi_cascade" --csv "$OUT/fi_cascade.csv" "$@" 2>&1 | tee -a "$LOG" || rc=$?
echo "# harness wall time: $(( $(date +%s) - start )) s, exit $rc" | tee -a "$LOG"
echo "===== fi_cascade.csv"
[ -f "$OUT/fi_cascade.csv" ] && cat "$OUT/fi_cascade.csv"
exit "$rc"
