// The rescale kernel of the all-gather context-parallel merge (internal; see rescale.cu).
#pragma once

#include <cuda_runtime.h>

#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace dist {
namespace detail {

/// `out.lse = ⊕ gathered LSEs`, `out.o = local.o · weight` (0 where `local.lse = -inf`), every
/// view fp32 device memory of the plan's workspace, the LSEs in one base; queued on `stream`.
void launch_cp_rescale(const ConstStateView& local, const ConstStateStackView& gathered,
                       const StateView& out, cudaStream_t stream);

}  // namespace detail
}  // namespace dist
}  // namespace attnstate
