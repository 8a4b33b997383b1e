#!/usr/bin/env bash
# Unpacks what fi_cascade, fi_decode and fi_mla need (~46 MB) from the FlashInfer 0.7.2.post1
# wheel:
#   bash bench/peers/flashinfer/unpack-wheel.sh WHEEL [DEST]
# WHEEL: flashinfer_python-0.7.2.post1-py3-none-any.whl (README.md gives the pip download
# command); its sha256 is checked. DEST defaults to .peers/fi-0.7.2 at the repository root, where
# CMakeLists.txt and run-device.sh look for it; keep it git-ignored (/.peers/ in
# .git/info/exclude) and never commit it.
# Unpacked: FlashInfer's header-only kernels (data/include), the vendored libcudacxx and
# CUTLASS/CuTe headers its JIT puts on the include path (data/cccl/libcudacxx/include,
# data/cutlass/include, data/cutlass/tools/util/include; the JIT also adds the vendored cub and
# thrust, which no header these kernels include reads, so they are left out to keep the device
# carry small), the csrc glue and jinja templates the harness mirrors (for reference only), the
# Python wrappers it reproduces (for reference), the build metadata and the licenses.
set -euo pipefail
WHL=${1:?usage: unpack-wheel.sh path/to/flashinfer_python-0.7.2.post1-py3-none-any.whl [DEST]}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEST=${2:-${DEST:-$HERE/../../../.peers/fi-0.7.2}}
SHA=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
echo "$SHA  $WHL" | sha256sum -c -
mkdir -p "$DEST"
unzip -q -o "$WHL" -d "$DEST" \
  'flashinfer/data/include/*' \
  'flashinfer/data/cccl/libcudacxx/include/*' \
  'flashinfer/data/cutlass/include/*' \
  'flashinfer/data/cutlass/tools/util/include/*' \
  'flashinfer/data/csrc/batch_prefill_sm90.cu' \
  'flashinfer/data/csrc/batch_prefill_sm90_customize_config.jinja' \
  'flashinfer/data/csrc/batch_prefill_paged_sm90_kernel_inst.jinja' \
  'flashinfer/data/csrc/cascade.cu' \
  'flashinfer/data/csrc/batch_decode.cu' \
  'flashinfer/data/csrc/batch_decode_customize_config.jinja' \
  'flashinfer/data/csrc/batch_decode_kernel_inst.jinja' \
  'flashinfer/data/csrc/batch_prefill.cu' \
  'flashinfer/data/csrc/batch_prefill_paged.cuh' \
  'flashinfer/data/csrc/batch_prefill_paged_kernel_inst.jinja' \
  'flashinfer/data/csrc/batch_prefill_customize_config.jinja' \
  'flashinfer/data/csrc/batch_mla_sm90_plan.cu' 'flashinfer/data/csrc/batch_mla_sm90_run.cu' \
  'flashinfer/data/csrc/batch_mla_sm90_binding.cu' 'flashinfer/data/csrc/batch_mla_config.jinja' \
  'flashinfer/mla/_batch_mla/_backends/fa3_backend.py' \
  'flashinfer/mla/_batch_mla/_backends/_fa_common.py' \
  'flashinfer/cascade.py' 'flashinfer/prefill.py' 'flashinfer/decode.py' 'flashinfer/utils.py' \
  'flashinfer/jit/core.py' 'flashinfer/jit/cpp_ext.py' 'flashinfer/jit/env.py' \
  'flashinfer/jit/attention/modules.py' 'flashinfer/jit/attention/utils.py' \
  'flashinfer/_build_meta.py' 'flashinfer/version.py' \
  'flashinfer_python-0.7.2.post1.dist-info/METADATA' \
  'flashinfer_python-0.7.2.post1.dist-info/licenses/*'
{
  echo "FlashInfer 0.7.2.post1 wheel, sha256 $SHA"
  grep -h "__git_commit__ =" "$DEST/flashinfer/_build_meta.py" || true
  echo "unpacked by bench/peers/flashinfer/unpack-wheel.sh on $(date -u +%F)"
  echo "files: $(find "$DEST/flashinfer" -type f | wc -l), bytes: $(du -sb "$DEST" | cut -f1)"
} > "$DEST/MANIFEST"
cat "$DEST/MANIFEST"
