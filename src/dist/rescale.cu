// The rescale step of the all-gather context-parallel merge (CpAlgorithm::kAllGatherLse): each
// element of this rank's fp32 `o` times the weight of its LSE in the merged LSE of the ranks
// (math::rescale_weight, the CPU simulation's arithmetic).
#include "attnstate/core/merge_math.hpp"
#include "attnstate/cuda/check.hpp"
#include "dist/rescale.hpp"

namespace attnstate {
namespace dist {
namespace detail {
namespace {

constexpr int kBlock = 256;

__global__ void __launch_bounds__(kBlock)
    cp_rescale_kernel(ConstStateView local, ConstStateStackView gathered, StateView out) {
  const std::int64_t dim = out.head_dim, heads = out.heads;
  const std::int64_t total = out.tokens * heads * dim;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const std::int64_t row = i / dim, d = i - row * dim;
    const std::int64_t t = row / heads, h = row - t * heads;
    const float self = local.lse[local.lse_offset(t, h)];
    const math::RescaleResult r =
        math::rescale_weight(gathered.base, gathered.lse + gathered.lse_offset(t, h),
                             gathered.num_states, gathered.lse_stride_state, self);
    const float* src = static_cast<const float*>(local.o) + local.o_offset(t, h);
    float* dst = static_cast<float*>(out.o) + out.o_offset(t, h);
    dst[d] = math::is_empty_lse(self) ? 0.f : r.weight * src[d];
    if (d == 0) out.lse[out.lse_offset(t, h)] = r.lse;
  }
}

}  // namespace

void launch_cp_rescale(const ConstStateView& local, const ConstStateStackView& gathered,
                       const StateView& out, cudaStream_t stream) {
  const std::int64_t total = out.tokens * out.heads * out.head_dim;
  if (total == 0) return;
  const std::int64_t blocks = (total + kBlock - 1) / kBlock;
  cp_rescale_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), kBlock, 0, stream>>>(
      local, gathered, out);
  ATTNSTATE_CHECK_LAUNCH(stream, "cp_rescale_kernel");
}

}  // namespace detail
}  // namespace dist
}  // namespace attnstate
