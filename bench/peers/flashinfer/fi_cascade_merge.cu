/// @file fi_cascade_merge.cu
/// @brief FlashInfer 0.7.2.post1's `merge_state_in_place` (csrc/cascade.cu, the cascade JIT
///        module): MergeStateInPlace of flashinfer/attention/cascade.cuh for bf16 and f16, what
///        `MultiLevelCascadeAttentionWrapper.run` calls after each level but the last, with no
///        mask. Registers one merge function per dtype for the harness.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <flashinfer/attention/cascade.cuh>

#include "fi_cascade.hpp"

namespace fi_merge {

template <class T>
void merge(void* v, float* s, const void* v_other, const float* s_other, std::uint32_t seq_len,
           std::uint32_t num_heads, std::uint32_t head_dim, cudaStream_t stream) {
  cudaError_t e;
  try {
    e = flashinfer::MergeStateInPlace(static_cast<T*>(v), s,
                                      static_cast<T*>(const_cast<void*>(v_other)),
                                      const_cast<float*>(s_other), seq_len, num_heads, head_dim,
                                      /*mask=*/nullptr, stream);
  } catch (const flashinfer::Error& err) {
    throw fic::Unsupported(fic::refusal_text(err.what()));
  }
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("MergeStateInPlace: ") + cudaGetErrorString(e));
}

const fic::MergeRegistrar bf16(fic::DType::kBF16, &merge<nv_bfloat16>);
const fic::MergeRegistrar f16(fic::DType::kF16, &merge<half>);

}  // namespace fi_merge
