/// @file numpy_owned.hpp
/// @brief A NumPy array that owns a copy of host values (for results the bindings build on the
///        host: the testing kit's problems and references, the cascade levels' arrays).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace attnstate {
namespace py {

/// `values` as a C-contiguous NumPy array of `shape`, owning them.
template <class T>
nanobind::ndarray<nanobind::numpy, T, nanobind::c_contig> owned(
    std::vector<T> values, const std::vector<std::size_t>& shape) {
  auto* held = new std::vector<T>(std::move(values));
  nanobind::capsule owner(held, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nanobind::ndarray<nanobind::numpy, T, nanobind::c_contig>(held->data(), shape.size(),
                                                                   shape.data(), owner);
}

}  // namespace py
}  // namespace attnstate
