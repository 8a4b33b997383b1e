#!/usr/bin/env bash
# The two-CTA narrow MLA decode (MlaDecodeKernel::kWgmmaNarrow2, issue 34) against the narrow
# kernel on a GPU in one command: builds the MLA tests and bench_mla (head dim 128 only, into
# build-n2), runs the MLA GPU tests (every kernel, both narrow ones included, against the CPU
# reference on fresh random inputs, outputs NaN-poisoned first), then
# bench_mla --quick --heads 16 --q-lens 1,2 --kernel all (mma.sync, wgmma, narrow and narrow2 on
# each row: the A/B of one CTA per SM against two). Time caps on every step.
#
#   scripts/gpu-mla-narrow2.sh            (BUILD_DIR, JOBS override build-n2, 12)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
build=${BUILD_DIR:-build-n2}
jobs=${JOBS:-12}
timeout 1200 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNSTATE_CUDA_HEAD_DIMS=128 -DATTNSTATE_BUILD_DOCS=OFF \
  -DCMAKE_PREFIX_PATH="$PWD/.deps/usr"
timeout 1800 cmake --build "$build" -j "$jobs" \
  --target test_cuda_mla test_cuda_mla_block_scale bench_mla
exe() { find "$build" -name "$1" -type f -perm -u+x | head -n 1; }
status=0
timeout 180 "$(exe test_cuda_mla)" || status=1
timeout 120 "$(exe test_cuda_mla_block_scale)" || status=1
timeout 300 "$(exe bench_mla)" --quick --heads 16 --q-lens 1,2 --kernel all || status=1
exit $status
