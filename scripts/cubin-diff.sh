#!/usr/bin/env bash
# Compares the sm_90a machine code of CUDA translation units between a git revision and the
# working tree, kernel by kernel (the .text section of every kernel in the cubin). A refactor
# that leaves every kernel's code byte-identical cannot change results or speed. No GPU needed.
#
#   scripts/cubin-diff.sh REV src/cuda/decode.cu [more .cu files...]
#
# Prints one line per kernel (same / DIFFERENT / only-old / only-new) and exits 1 when any
# kernel differs. A file compiled in the tree but missing at REV (or the reverse) is compared
# with the other side's file of the same name given as OLD_PATH=NEW_PATH. A translation unit
# split into several is compared with all of them together: OLD_PATH=NEW_1+NEW_2+... (each
# kernel in exactly one of them; NEW paths may be absolute, e.g. CMake-generated units).
set -euo pipefail
rev=${1:?usage: cubin-diff.sh REV file.cu...}
shift
root=$(git rev-parse --show-toplevel)
cd "$root"
export PATH="$PATH:/usr/local/cuda/bin"
work=$(mktemp -d /tmp/cubin-diff.XXXXXX)
trap 'git worktree remove --force "$work/old" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/old" "$rev" >/dev/null 2>&1
flags=(-O3 -DNDEBUG -DATTNSTATE_HAS_CUDA=1 -arch=sm_90a -cubin --expt-relaxed-constexpr -std=c++17)
status=0
for spec in "$@"; do
  old_src=${spec%%=*}
  new_src=${spec#*=}
  name=$(basename "$old_src" .cu)
  nvcc "${flags[@]}" -I "$work/old/include" -I "$work/old/src" "$work/old/$old_src" \
    -o "$work/$name.old.cubin"
  new_cubins=()
  IFS='+' read -r -a new_srcs <<< "$new_src"
  for i in "${!new_srcs[@]}"; do
    nvcc "${flags[@]}" -I include -I src "${new_srcs[$i]}" -o "$work/$name.new.$i.cubin"
    new_cubins+=("$work/$name.new.$i.cubin")
  done
  python3 - "$work/$name.old.cubin" "$new_src" "${new_cubins[@]}" <<'EOF' || status=1
import struct, sys

def text_sections(path):
    data = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx]
    def name(off):
        start = strtab[4] + off
        return data[start:data.index(b"\0", start)].decode()
    out = {}
    for h in heads:
        n = name(h[0])
        if n.startswith(".text."):
            out[n[6:]] = data[h[4]:h[4] + h[5]]
    return out

old, src = text_sections(sys.argv[1]), sys.argv[2]
new, bad = {}, 0
for path in sys.argv[3:]:
    for k, v in text_sections(path).items():
        if k in new:
            print(f"{src}: in two new units: {k}")
            bad = 1
        new[k] = v
for k in sorted(set(old) | set(new)):
    if k not in new:
        state, bad = "only-old", 1
    elif k not in old:
        state, bad = "only-new", 1
    elif old[k] == new[k]:
        state = "same"
    else:
        state, bad = "DIFFERENT", 1
    print(f"{src}: {state:9} {k}")
print(f"{src}: {len(new)} kernels, {'all identical' if not bad else 'differences found'}")
sys.exit(bad)
EOF
done
exit $status
