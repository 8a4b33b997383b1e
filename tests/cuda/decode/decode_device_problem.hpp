/// @file decode_device_problem.hpp
/// @brief A host decode problem (decode_problem.hpp) copied to the device, with device views of
///        its queries and paged cache; shared by the CUDA decode tests and properties.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"
#include "cuda_test_utils.hpp"
#include "decode_problem.hpp"

namespace attnstate_test {

/// A host problem copied to the device.
struct DeviceProblem {
  DeviceBuffer<unsigned char> q, k, v;
  DeviceBuffer<std::int32_t> lens, indptr, indices, bt;
  explicit DeviceProblem(const DecodeProblemHost& p)
      : q(upload(p.q)),
        k(upload(p.k)),
        v(upload(p.v)),
        lens(upload(p.seq_lens)),
        indptr(upload(p.indptr)),
        indices(upload(p.indices)),
        bt(upload(p.block_table)) {}
  /// The paged cache view over the device copies.
  attnstate::PagedKvCache kv(const DecodeProblemHost& p) const {
    attnstate::PagedKvCache c = p.kv_view();
    c.k = k.get();
    c.v = v.get();
    c.seq_lens = lens.get();
    if (p.cfg.block_table) {
      c.block_table = bt.get();
    } else {
      c.page_indptr = indptr.get();
      c.page_indices = indices.get();
    }
    c.space = attnstate::MemorySpace::kDevice;
    return c;
  }
  /// The query view over the device copy.
  attnstate::ConstTensorView qv(const DecodeProblemHost& p) const {
    attnstate::ConstTensorView t = p.q_view();
    t.data = q.get();
    t.space = attnstate::MemorySpace::kDevice;
    return t;
  }
};

}  // namespace attnstate_test
