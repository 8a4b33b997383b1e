#!/usr/bin/env bash
# Installs the Debian packages attnstate builds against, if any is missing (needs root; as a
# normal user it only reports what is missing), then the Python package's build and test tools
# into the virtual environment .venv (PyPI). The CUDA toolkit (nvcc) is optional.
set -euo pipefail
pkgs=(cmake g++ make libgtest-dev librapidcheck-dev doxygen clang-format python3-dev python3-venv)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing Debian packages: ${missing[*]} (run as root to install them)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}"
fi

# Python package (python/): its build and test tools go into a virtual environment at .venv
# (never into the system Python). ATTNSTATE_VENV overrides the place; ATTNSTATE_NO_VENV=1 skips.
if [ "${ATTNSTATE_NO_VENV:-0}" != 1 ]; then
  venv=${ATTNSTATE_VENV:-"$(cd "$(dirname "$0")/.." && pwd)/.venv"}
  py_pkgs=("nanobind>=2.4" "scikit-build-core>=0.10" "numpy>=1.24" "ml_dtypes>=0.4" "pytest>=7")
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  if ! "$venv/bin/python" -c "import nanobind, scikit_build_core, numpy, ml_dtypes, pytest" 2>/dev/null; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${py_pkgs[@]}"
  fi
  # NCCL for attnstate::dist (the context-parallel merge): the CUDA toolkit's when it ships one,
  # else NVIDIA's wheel in the venv (cmake/AttnstateNccl.cmake finds either). Only with nvcc.
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  if [ -x "$nvcc" ] && [ "${ATTNSTATE_NO_NCCL:-0}" != 1 ]; then
    cuda_root=$(cd "$(dirname "$nvcc")/.." && pwd)
    if [ ! -f "$cuda_root/include/nccl.h" ] && [ ! -f /usr/include/nccl.h ] &&
       ! "$venv/bin/python" -c "import nvidia.nccl" 2>/dev/null; then
      major=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
      "$venv/bin/python" -m pip install -q --disable-pip-version-check "nvidia-nccl-cu${major:-13}"
    fi
  fi
fi
