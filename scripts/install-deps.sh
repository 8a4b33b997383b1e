#!/usr/bin/env bash
# Installs the Debian packages attnstate builds against, if any is missing (needs root; as a
# normal user it only reports what is missing). The CUDA toolkit (nvcc) is optional.
set -euo pipefail
pkgs=(cmake g++ make libgtest-dev librapidcheck-dev doxygen clang-format)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing Debian packages: ${missing[*]} (run as root to install them)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}"
