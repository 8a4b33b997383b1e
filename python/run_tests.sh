#!/usr/bin/env bash
# Builds the Python package with the venv's pip into a build folder (no network: build isolation
# off, the build tools come from the venv) and runs its pytest suite against it.
#   python/run_tests.sh <python> <work-dir> [pytest args...]
# PY_CMAKE_ARGS: extra CMake arguments of the package build (e.g. -DATTNSTATE_ENABLE_CUDA=OFF).
# Exit 77 (CTest: skipped) when <python> lacks the build tools: run scripts/install-deps.sh.
set -euo pipefail
py=$1 work=$2
shift 2
src=$(cd "$(dirname "$0")/.." && pwd)
if ! "$py" -c "import nanobind, scikit_build_core, numpy, pytest" 2>/dev/null; then
  echo "python tests: $py lacks nanobind/scikit-build-core/numpy/pytest (scripts/install-deps.sh)"
  exit 77
fi
mkdir -p "$work"
# -C build-dir keeps the CMake build between runs (incremental rebuilds).
CMAKE_ARGS="${PY_CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
  "$py" -m pip install --no-deps --no-build-isolation --disable-pip-version-check -q --upgrade \
  --target "$work/site" -C build-dir="$work/build" "$src" >"$work/pip.log" 2>&1 ||
  { tail -50 "$work/pip.log"; echo "python tests: the package build failed"; exit 1; }
cd "$src"
PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m pytest -q -p no:cacheprovider "$@" python/tests
