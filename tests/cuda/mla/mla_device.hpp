/// @file mla_device.hpp
/// @brief Device copies for the CUDA MLA tests: host vectors uploaded, host views moved onto
///        their device copies, and device output states poisoned with NaN.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/testing/host_state.hpp"
#include "cuda_test_utils.hpp"

namespace attnstate_test {

/// `p` (a pointer into the host buffer `host`) moved to the same offset of `dev`.
template <class T>
const void* moved(const void* p, const std::vector<T>& host, const DeviceBuffer<T>& dev) {
  return static_cast<const unsigned char*>(static_cast<const void*>(dev.get())) +
         (static_cast<const unsigned char*>(p) -
          static_cast<const unsigned char*>(static_cast<const void*>(host.data())));
}

/// Bytes of a host tensor's elements.
inline std::size_t bytes_of(const attnstate::testing::HostTensor& t) {
  return static_cast<std::size_t>(t.numel()) * attnstate::size_of(t.dtype());
}

/// A device output state `(tokens, heads, 512)`, poisoned with NaN.
struct DeviceState {
  DeviceBuffer<unsigned char> o;
  DeviceBuffer<float> lse;
  attnstate::StateView view;
  DeviceState(std::int64_t tokens, std::int64_t heads, std::int64_t dim, attnstate::DType dt,
              attnstate::LseBase base)
      : o(static_cast<std::size_t>(std::max<std::int64_t>(1, tokens * heads * dim)) *
          attnstate::size_of(dt)),
        lse(static_cast<std::size_t>(std::max<std::int64_t>(1, tokens * heads))) {
    o.poison();
    lse.poison();
    view = attnstate::make_state_view(o.get(), dt, lse.get(), tokens, heads, dim, base,
                                      attnstate::MemorySpace::kDevice);
  }
  attnstate::testing::HostState download() const {
    attnstate::testing::HostState s(view.tokens, view.heads, view.head_dim, view.dtype, view.base);
    const std::vector<unsigned char> o_raw = o.download();
    const std::vector<float> l = lse.download();
    std::copy(o_raw.begin(), o_raw.begin() + static_cast<std::ptrdiff_t>(bytes_of(s.o_tensor())),
              static_cast<unsigned char*>(s.o_tensor().data()));
    std::copy(l.begin(), l.begin() + static_cast<std::ptrdiff_t>(s.lse_values().size()),
              s.lse_values().begin());
    return s;
  }
};

}  // namespace attnstate_test
