/// @file cascade_tma.hpp
/// @brief The tensor maps of a KV pool for the cascade's warp-specialised level kernel: the
///        driver's `cuTensorMapEncodeTiled`, looked up once through the runtime.
#pragma once

#include <cuda.h>

#include "attnstate/core/paged_kv.hpp"
#include "plan/cascade_plan.hpp"

namespace attnstate {
namespace cuda {
namespace detail {

/// True when the driver encodes tensor maps (its entry point is found; looked up once per
/// process).
bool tensor_maps_available();

/// Encodes the tensor maps of the pool's K and V as `layout` describes them
/// (`plan::describe_cascade_kv_maps`, which must be describable): boxes of `layout.box` keys of
/// one page into `k`, `v`, and with `layout.run > layout.box` the run maps into `k_run`, `v_run`
/// (else, or when the driver rejects those, copies of `k`, `v`; `*run` receives the run keys
/// then in use, 0 for none). False when the driver rejects the page maps (the maps embed the
/// pool's base addresses: a pointer-dependent failure the plan cannot foresee).
bool encode_cascade_kv_maps(const PagedKvCache& kv, const plan::CascadeTmaLayout& layout,
                            CUtensorMap* k, CUtensorMap* v, CUtensorMap* k_run, CUtensorMap* v_run,
                            int* run);

}  // namespace detail
}  // namespace cuda
}  // namespace attnstate
