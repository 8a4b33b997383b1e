/// @file probe_hooks.hpp
/// @brief Hooks into the library for the benchmarks, present only in a build configured with
///        `-DATTNSTATE_BUILD_PROBES=ON` (never for shipping): the decode without its cross-split
///        merge (to time the merge's share) and the decode kernel's per-CTA timeline stamps.
#pragma once

#if ATTNSTATE_PROBES
#include <cuda_runtime_api.h>

#include <cstddef>

#include "attnstate/cuda/decode.hpp"

namespace attnstate {
namespace cuda {
namespace probe {

/// `run_decode` with the cross-split merge skipped: the outputs of split requests are left
/// unwritten (only the time means anything).
void run_decode_skip_combine(const DecodePlan& plan, const ConstTensorView& q,
                             const PagedKvCache& kv, StateView out, void* workspace,
                             std::size_t workspace_bytes, cudaStream_t stream);

}  // namespace probe
}  // namespace cuda
}  // namespace attnstate

/// Copies the per-CTA timeline stamps of the last decode (8 per CTA, `ctas` CTAs) to `host` and
/// clears them.
extern "C" void attnstate_decode_timeline(unsigned long long* host, int ctas);
#endif
