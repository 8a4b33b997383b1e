#!/usr/bin/env bash
# The narrow wgmma MLA decode (MlaDecodeKernel::kWgmmaNarrow, issue 34) on a GPU in one command:
# builds the MLA tests and bench_mla (head dim 128 only, into build-narrow), runs the MLA GPU tests
# (every kernel against the CPU reference on fresh random inputs, outputs NaN-poisoned first;
# the narrow kernel on the problems of at most 32 rows), memcheck and racecheck over
# test_cuda_mla (its *Large* tests skipped), then bench_mla --quick --heads 16 --q-lens 1,2
# --kernel all (mma.sync, wgmma and narrow on each row: 16 and 32 query rows). Summary and logs:
# scripts/gpu-check.sh's.
#
#   scripts/gpu-mla-narrow.sh
#
# Racecheck's hazards in the wgmma kernel (mla_decode_ws_kernel) are an open item of main
# (docs/mla.md); those naming mla_decode_narrow_kernel are this kernel's.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
export GPU_HEAD_DIMS=128
export GPU_TARGETS="test_cuda_mla test_cuda_mla_block_scale bench_mla"
export GPU_TESTS='^MlaCuda'
export GPU_SAN_EXES=test_cuda_mla
export GPU_BENCH=bench_mla
export GPU_BENCH_ARGS_bench_mla="--quick --heads 16 --q-lens 1,2 --kernel all"
export GPU_PYTHON=0
export BUILD_DIR=${BUILD_DIR:-build-narrow}
exec scripts/gpu-check.sh "$@"
