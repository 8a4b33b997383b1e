/// @file cascade_tma.cpp
/// @brief Tensor-map encoding of a KV pool for the cascade's warp-specialised level kernel.
#include "cuda/cascade_tma.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace attnstate {
namespace cuda {
namespace detail {
namespace {

/// `cuTensorMapEncodeTiled` of the driver, looked up once through the runtime (no link to the
/// driver library); null when unavailable.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn encode_tiled_fn() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)
          cudaGetLastError();  // not an error of the caller's: the plan takes the cp.async kernels
      return static_cast<EncodeTiledFn>(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

/// Encodes K and V (5 dims; 16-bit with the 128-byte swizzle, fp8 as bytes unswizzled: the
/// kernel converts them into its swizzled tiles) with boxes `bx` into `k_map`, `v_map`.
bool encode_pair(const PagedKvCache& kv, const plan::CascadeTmaLayout& t, const std::int64_t* bx,
                 CUtensorMap* k_map, CUtensorMap* v_map) {
  const EncodeTiledFn fn = encode_tiled_fn();
  if (fn == nullptr) return false;
  cuuint64_t dims[5], strides[4];
  cuuint32_t box_dims[5];
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < 5; ++i) {
    dims[i] = static_cast<cuuint64_t>(t.dims[i]);
    box_dims[i] = static_cast<cuuint32_t>(bx[i]);
  }
  for (int i = 0; i < 4; ++i) strides[i] = static_cast<cuuint64_t>(t.strides[i]);
  const void* ptrs[2] = {kv.k, kv.v};
  CUtensorMap* out[2] = {k_map, v_map};
  // (bf16 for f16 pools too: the copies move 16-bit elements without converting them)
  const bool fp8 = is_fp8(kv.dtype);
  for (int i = 0; i < 2; ++i)
    if (fn(out[i], fp8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5,
           const_cast<void*>(ptrs[i]), dims, strides, box_dims, elem_strides,
           CU_TENSOR_MAP_INTERLEAVE_NONE,
           fp8 ? CU_TENSOR_MAP_SWIZZLE_NONE : CU_TENSOR_MAP_SWIZZLE_128B,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
      return false;
  return true;
}

}  // namespace

bool tensor_maps_available() { return encode_tiled_fn() != nullptr; }

bool encode_cascade_kv_maps(const PagedKvCache& kv, const plan::CascadeTmaLayout& layout,
                            CUtensorMap* k, CUtensorMap* v, CUtensorMap* k_run, CUtensorMap* v_run,
                            int* run) {
  *run = layout.run;
  if (!layout.describable || !encode_pair(kv, layout, layout.page_box, k, v)) return false;
  *k_run = *k;
  *v_run = *v;
  if (layout.run > layout.box && !encode_pair(kv, layout, layout.run_box, k_run, v_run)) {
    *run = 0;
    *k_run = *k;
    *v_run = *v;
  }
  return true;
}

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
