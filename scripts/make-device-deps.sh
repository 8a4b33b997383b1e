#!/usr/bin/env bash
# Packs this machine's GoogleTest and RapidCheck (Debian packages) into .deps/usr so a GPU
# machine without them can build the tests: pass .deps in the device call's carry list and
# CMAKE_PREFIX_PATH=$PWD/.deps/usr there. .deps is ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/usr/include .deps/usr/lib/x86_64-linux-gnu/cmake
for pkg in libgtest-dev librapidcheck-dev; do
  dpkg -L "$pkg" | while read -r f; do
    [ -f "$f" ] || continue
    case "$f" in
      /usr/include/*|/usr/lib/x86_64-linux-gnu/*) mkdir -p ".deps$(dirname "$f")"; cp -a "$f" ".deps$f" ;;
    esac
  done
done
du -sh .deps
