/// @file cuda_cascade_validate.hpp
/// @brief The argument checks of the CUDA cascade's run entry points against their plan
///        (host-only: pointers, shapes and extents, no CUDA call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "attnstate/core/cascade.hpp"
#include "attnstate/cuda/cascade_plan.hpp"
#include "common/cascade_validate.hpp"
#include "common/validate.hpp"

namespace attnstate {
namespace detail {

/// The workspace: at least `need` bytes (`plan.workspace_bytes()`), 16-byte aligned, and
/// disjoint from `out` (written while the workspace is read) and from `q` (read while the
/// workspace is written) when they are given.
inline void check_cascade_workspace(const char* func, std::size_t need, const void* ws,
                                    std::size_t bytes, const StateView* out = nullptr,
                                    const ConstTensorView* q = nullptr) {
  if (bytes < need)
    throw_argument(func, "workspace_bytes", ">= plan.workspace_bytes() = " + std::to_string(need),
                   std::to_string(bytes), Status::kWorkspaceTooSmall);
  if (need > 0 && ws == nullptr) throw_argument(func, "workspace", "a non-null pointer", "nullptr");
  check_aligned(func, "workspace", ws, 16);
  const auto need_bytes = static_cast<std::int64_t>(need);
  if (out != nullptr) check_disjoint(func, "out", *out, "workspace", ws, need_bytes, nullptr, 0);
  if (q != nullptr && ranges_overlap(q->data, tensor_bytes(*q), ws, need_bytes))
    throw_argument(func, "workspace", "memory disjoint from q", "an overlap");
}

/// Checks the queries and the device pool of a level run against the plan; returns the bytes
/// of each KV pool.
inline std::int64_t check_cascade_inputs(const char* func, const cuda::CascadeChoice& plan,
                                         const ConstTensorView& q, const PagedKvCache& kv) {
  const cuda::CascadeShape& s = plan.shape();
  const std::int64_t pool_bytes = check_cascade_pool(func, kv, MemorySpace::kDevice);
  if (kv.dtype != s.pool_dtype())
    throw_argument(func, "kv.dtype", std::string("the planned ") + to_string(s.pool_dtype()),
                   to_string(kv.dtype));
  if (kv.page_size != s.page_size)
    throw_argument(func, "kv.page_size", "the planned " + cascade_str(s.page_size),
                   cascade_str(kv.page_size));
  if (kv.heads_kv != s.heads_kv)
    throw_argument(func, "kv.heads_kv", "the planned " + cascade_str(s.heads_kv),
                   cascade_str(kv.heads_kv));
  if (kv.head_dim != s.head_dim)
    throw_argument(func, "kv.head_dim", "the planned " + cascade_str(s.head_dim),
                   cascade_str(kv.head_dim));
  if (kv.num_pages < 1) throw_argument(func, "kv.num_pages", ">= 1", cascade_str(kv.num_pages));
  // the plan checked the host levels' page ids against its pool; a smaller pool at run would
  // clamp some of them (the kernels' bound) instead of reading the planned pages
  if (kv.num_pages < s.num_pages)
    throw_argument(func, "kv.num_pages",
                   ">= the planned shape.num_pages = " + cascade_str(s.num_pages),
                   cascade_str(kv.num_pages));
  check_aligned(func, "kv.k", kv.k, 16);  // the kernels' 16-byte copies
  check_aligned(func, "kv.v", kv.v, 16);
  const std::int64_t chunk = 16 / static_cast<std::int64_t>(size_of(kv.dtype));
  if (kv.page_elems() % chunk != 0)
    throw_argument(
        func, "kv.page_stride",
        "a page stride that is a multiple of " + cascade_str(chunk) + " elements (16 bytes)",
        cascade_str(kv.page_elems()));
  check_cascade_query(func, q, kv, MemorySpace::kDevice);
  if (q.dtype != s.dtype)
    throw_argument(func, "q.dtype", std::string("the planned ") + to_string(s.dtype),
                   to_string(q.dtype));
  if (q.shape[0] != s.batch || q.shape[1] != s.q_len || q.shape[2] != s.heads_q)
    throw_argument(func, "q.shape",
                   "the planned (batch, q_len, heads_q) = (" + cascade_str(s.batch) + ", " +
                       cascade_str(s.q_len) + ", " + cascade_str(s.heads_q) + ")",
                   "(" + cascade_str(q.shape[0]) + ", " + cascade_str(q.shape[1]) + ", " +
                       cascade_str(q.shape[2]) + ")");
  if (reinterpret_cast<std::uintptr_t>(q.data) % 16 != 0 || q.stride[0] % 8 != 0 ||
      q.stride[1] % 8 != 0 || q.stride[2] % 8 != 0)
    throw_argument(func, "q", "a 16-byte aligned pointer and strides that are multiples of 8",
                   "address % 16 = " + cascade_str(reinterpret_cast<std::uintptr_t>(q.data) % 16) +
                       ", strides (" + cascade_str(q.stride[0]) + ", " + cascade_str(q.stride[1]) +
                       ", " + cascade_str(q.stride[2]) + ")");
  return pool_bytes;
}

/// Checks device level `l` against the plan: the planned segment count, non-null arrays (the
/// page ids too when the planned level uses pages).
inline void check_cascade_device_level(const char* func, const cuda::CascadeChoice& plan, int l,
                                       const CascadeLevel& lv) {
  if (lv.num_segments != plan.level(l).num_segments)
    throw_argument(func, cascade_level_arg(l, "num_segments").c_str(),
                   "the planned " + cascade_str(plan.level(l).num_segments),
                   cascade_str(lv.num_segments));
  check_level_arrays(func, l, lv, plan.level(l).has_pages);
}

/// Checks the output view (and, when given, that it does not overlap the queries).
inline void check_cascade_plan_out(const char* func, const cuda::CascadeChoice& plan,
                                   const StateView& out, const ConstTensorView* q = nullptr) {
  check_cascade_out(func, out, plan.shape().batch * plan.shape().q_len, plan.shape().heads_q,
                    plan.shape().head_dim, MemorySpace::kDevice, q);
}

}  // namespace detail
}  // namespace attnstate
