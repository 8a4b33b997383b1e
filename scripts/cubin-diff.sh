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
# kernel in exactly one of them; NEW paths may be absolute, e.g. CMake-generated units), and
# several old units regrouped into new ones as OLD_1+OLD_2+...=NEW_1+NEW_2+... (an absolute OLD
# path, e.g. a unit generated from a template both revisions share, is compiled with REV's
# headers).
#
# A change that renames kernels (a template parameter added with its old value as default)
# compares them under their new names with CUBIN_DIFF_RENAME='REGEX=>REPLACEMENT' (Python `re`
# syntax, applied to each old kernel name), e.g. for a fifth parameter of value 128:
#   CUBIN_DIFF_RENAME='(CascadeWsTileILi\d+ELi\d+ELi\d+ELi\d+E)EE=>\1Li128EEE'
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
  name=$(basename "${old_src%%+*}" .cu)
  old_cubins=()
  IFS='+' read -r -a old_srcs <<< "$old_src"
  for i in "${!old_srcs[@]}"; do
    old_path=${old_srcs[$i]}
    [[ $old_path = /* ]] || old_path="$work/old/$old_path"
    nvcc "${flags[@]}" -I "$work/old/include" -I "$work/old/src" "$old_path" \
      -o "$work/$name.old.$i.cubin"
    old_cubins+=("$work/$name.old.$i.cubin")
  done
  new_cubins=()
  IFS='+' read -r -a new_srcs <<< "$new_src"
  for i in "${!new_srcs[@]}"; do
    nvcc "${flags[@]}" -I include -I src "${new_srcs[$i]}" -o "$work/$name.new.$i.cubin"
    new_cubins+=("$work/$name.new.$i.cubin")
  done
  python3 - "${#old_cubins[@]}" "${old_cubins[@]}" "$new_src" "${new_cubins[@]}" <<'EOF' \
    || status=1
import os, re, struct, sys

# a kernel in an anonymous namespace carries a hash of its file's path: the same kernel in the
# old worktree and in the tree differs only there
def normalise(name):
    return re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GLOBAL__N__", name)

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
            out[normalise(n[6:])] = data[h[4]:h[4] + h[5]]
    return out

n_old = int(sys.argv[1])
src = sys.argv[2 + n_old]
bad = 0

def union(paths, side):
    global bad
    out = {}
    for path in paths:
        for k, v in text_sections(path).items():
            if k in out:
                print(f"{src}: in two {side} units: {k}")
                bad = 1
            out[k] = v
    return out

old = union(sys.argv[2:2 + n_old], "old")
rename = os.environ.get("CUBIN_DIFF_RENAME", "")
if rename:
    pattern, _, replacement = rename.partition("=>")
    old = {re.sub(pattern, replacement, k): v for k, v in old.items()}
new = union(sys.argv[3 + n_old:], "new")
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
