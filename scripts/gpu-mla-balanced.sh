#!/usr/bin/env bash
# The balanced wgmma MLA decode (MlaDecodeKernel::kWgmmaBalanced: both consumer warpgroups
# compute scores) against the wgmma kernel on a GPU in one command: builds the MLA tests and
# bench_mla (head dim 128 only, into build-bal), runs the MLA GPU tests (every kernel, the
# balanced one included, against the CPU reference on fresh random inputs, outputs NaN-poisoned
# first), then bench_mla --heads 128 --batches 64,128 --ctx 4k,16k --q-lens 1 --dtypes bf16,e4m3
# --kernel balanced-ab (wgmma then balanced on each row: the A/B on one machine). Time caps on
# every step.
#
#   scripts/gpu-mla-balanced.sh            (BUILD_DIR, JOBS override build-bal, 12)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
build=${BUILD_DIR:-build-bal}
jobs=${JOBS:-12}
timeout 1200 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DATTNSTATE_CUDA_HEAD_DIMS=128 -DATTNSTATE_BUILD_DOCS=OFF \
  -DCMAKE_PREFIX_PATH="$PWD/.deps/usr"
timeout 1800 cmake --build "$build" -j "$jobs" \
  --target test_cuda_mla test_cuda_mla_block_scale bench_mla
exe() { find "$build" -name "$1" -type f -perm -u+x | head -n 1; }
status=0
timeout 240 "$(exe test_cuda_mla)" || status=1
timeout 120 "$(exe test_cuda_mla_block_scale)" || status=1
timeout 300 "$(exe bench_mla)" --heads 128 --batches 64,128 --ctx 4k,16k --q-lens 1 \
  --dtypes bf16,e4m3 --kernel balanced-ab || status=1
exit $status
