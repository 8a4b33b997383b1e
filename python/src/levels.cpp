/// @file levels.cpp
/// @brief `attnstate.cascade_levels`: the shared prefixes of a page table as cascade levels
///        (core/cascade_levels.hpp) and the cascade-or-decode decision over them
///        (core/cascade_decision.hpp), for host arrays of any DLPack library.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "attnstate/core/cascade_decision.hpp"
#include "attnstate/core/cascade_levels.hpp"
#include "numpy_owned.hpp"

namespace attnstate {
namespace py {
namespace {

using nb::arg;

/// A NumPy int32 copy of `v`.
nb::object numpy_int32(const std::vector<std::int32_t>& v) {
  return nb::cast(owned(v, {v.size()}));
}

CascadeLevels find_levels(nb::handle seq_lens, std::int64_t page_size, std::int64_t num_pages,
                          nb::handle page_indptr, nb::handle page_indices, nb::handle block_table,
                          std::int64_t min_shared_tokens, int max_levels, std::int64_t q_len) {
  Call c("attnstate.cascade_levels");
  PagedKvCache t;
  t.seq_lens = c.int32_vector(seq_lens, "seq_lens", &t.batch);
  if (c.space() != MemorySpace::kHost)
    c.fail("seq_lens", "a host array (the levels are found on the host)", "a CUDA array");
  const bool csr = !page_indptr.is_none() || !page_indices.is_none();
  if (csr == !block_table.is_none())
    c.fail("page_indptr", "either page_indptr and page_indices or block_table",
           csr ? "both tables" : "neither");
  if (csr) {
    std::int64_t n_indptr = 0, n_indices = 0;
    t.page_indptr = c.int32_vector(page_indptr, "page_indptr", &n_indptr);
    t.page_indices = c.int32_vector(page_indices, "page_indices", &n_indices);
    if (n_indptr != t.batch + 1)
      c.fail("page_indptr", "len(seq_lens) + 1 = " + std::to_string(t.batch + 1) + " entries",
             std::to_string(n_indptr));
    // the finder reads page_indices[page_indptr[b] ...]: the entries must be in the array
    if (t.page_indptr[t.batch] < 0 || t.page_indptr[t.batch] > n_indices)
      c.fail("page_indices",
             "at least page_indptr[-1] = " + std::to_string(t.page_indptr[t.batch]) + " entries",
             std::to_string(n_indices));
  } else {
    std::int64_t rows = 0;
    t.block_table = c.int32_matrix(block_table, "block_table", &rows, &t.block_table_stride);
    if (rows < t.batch)
      c.fail("block_table", "at least len(seq_lens) = " + std::to_string(t.batch) + " rows",
             std::to_string(rows));
  }
  t.page_size = page_size;
  t.num_pages = num_pages;
  t.space = MemorySpace::kHost;
  CascadeLevelsOptions o;
  o.min_shared_tokens = min_shared_tokens;
  o.max_levels = max_levels;
  o.q_len = q_len;
  return build_cascade_levels(t, o);
}

CascadeDecision decide(const CascadeLevels& lv, std::int64_t heads_q, std::int64_t heads_kv,
                       std::int64_t head_dim, std::int64_t q_len, DType kv_dtype, double copy_gbps,
                       double tensor_tflops) {
  CascadeCostShape s;
  s.q_len = q_len;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.head_dim = head_dim;
  s.kv_dtype = kv_dtype;
  CascadeCostModel m;
  m.copy_gbps = copy_gbps;
  m.tensor_tflops = tensor_tflops;
  return decide_cascade(lv, s, m);
}

}  // namespace

void bind_levels(nb::module_& m) {
  nb::class_<CascadeLevels>(m, "CascadeLevels",
                            "The levels of a cascade found in a page table (see "
                            "attnstate.cascade_levels).")
      .def_prop_ro(
          "levels",
          [](const CascadeLevels& lv) {
            std::vector<nb::tuple> out;
            for (int l = 0; l < lv.num_levels(); ++l) {
              const CascadeLevels::Arrays& a = lv.arrays(l);
              out.push_back(nb::make_tuple(numpy_int32(a.request_indptr),
                                           numpy_int32(a.page_indptr), numpy_int32(a.page_indices),
                                           numpy_int32(a.seg_lens)));
            }
            return out;
          },
          "Per level (request_indptr, page_indptr, page_indices, seg_lens), NumPy int32: what "
          "Cascade.plan and Cascade.run take (copy them to the device for a CUDA run).")
      .def_prop_ro(
          "order", [](const CascadeLevels& lv) { return numpy_int32(lv.order()); },
          "order[i]: the request of the page table at position i of the levels; give the "
          "cascade q[order] and read request order[i]'s state at row i.")
      .def_prop_ro("identity_order", &CascadeLevels::identity_order,
                   "True when order is 0, 1, 2, ... (no reordering needed).")
      .def_prop_ro("num_levels", &CascadeLevels::num_levels)
      .def_prop_ro("batch", &CascadeLevels::batch)
      .def_prop_ro("page_size", &CascadeLevels::page_size)
      .def_prop_ro("keys_total", &CascadeLevels::keys_total,
                   "Tokens of all the requests (what a plain decode reads per KV head).")
      .def_prop_ro("keys_read", &CascadeLevels::keys_read,
                   "Tokens the cascade reads per KV head (each shared segment once).")
      .def("__repr__", [](const CascadeLevels& lv) { return to_string(lv); });

  nb::class_<CascadeDecision>(m, "CascadeDecision",
                              "The cascade-or-plain-decode choice (see attnstate.decide_cascade).")
      .def_ro("use_cascade", &CascadeDecision::use_cascade)
      .def_ro("shared_levels", &CascadeDecision::shared_levels)
      .def_ro("cascade_us", &CascadeDecision::cascade_us)
      .def_ro("decode_us", &CascadeDecision::decode_us)
      .def_ro("cascade_bytes", &CascadeDecision::cascade_bytes)
      .def_ro("decode_bytes", &CascadeDecision::decode_bytes)
      .def_ro("reason", &CascadeDecision::reason)
      .def("__repr__", [](const CascadeDecision& d) { return d.reason; });

  m.def("decide_cascade", &decide, arg("levels"), arg("heads_q"), arg("heads_kv"), arg("head_dim"),
        arg("q_len"), arg("kv_dtype"), arg("copy_gbps"), arg("tensor_tflops"));
  m.def("find_cascade_levels", &find_levels, arg("seq_lens"), arg("page_size"), arg("num_pages"),
        arg("page_indptr").none(), arg("page_indices").none(), arg("block_table").none(),
        arg("min_shared_tokens"), arg("max_levels"), arg("q_len"));
}

}  // namespace py
}  // namespace attnstate
