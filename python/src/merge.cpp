/// @file merge.cpp
/// @brief Bindings of the merges: each imports its arrays, builds the views, resolves the stream
///        and calls attnstate::cpu or attnstate::cuda (the checks are the library's own).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "arrays.hpp"

namespace attnstate {
namespace py {

namespace {

#if defined(ATTNSTATE_HAS_CUDA)
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
#endif

/// The optional `(tokens,)` mask of bool or (u)int8 flags, any stride (0: one flag broadcast).
TokenMask parse_mask(Call& c, nb::handle mask, std::int64_t tokens) {
  if (mask.is_none()) return {};
  Array a = c.array(mask, "mask", 1);
  const nb::dlpack::dtype dt = a.dtype();
  const bool bytes = dt.lanes == 1 && dt.bits == 8 &&
                     (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::UInt) ||
                      dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int) ||
                      dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bool));
  if (!bytes) c.fail("mask", "dtype bool or uint8", dtype_name(dt));
  if (static_cast<std::int64_t>(a.shape(0)) != tokens)
    c.fail("mask", "shape (" + std::to_string(tokens) + ",) (the states' tokens)",
           "(" + std::to_string(a.shape(0)) + ",)");
  // a one-element or empty array has no meaningful stride: read as contiguous
  const std::int64_t stride = a.shape(0) > 1 ? static_cast<std::int64_t>(a.stride(0)) : 1;
  return TokenMask(static_cast<const std::uint8_t*>(a.data()), stride);
}

void merge_state(nb::handle a, nb::handle b, nb::handle out, nb::handle mask, nb::handle stream) {
  Call c("attnstate.merge_state");
  const StateView va = c.state(a, "a"), vb = c.state(b, "b"), vo = c.state(out, "out");
  const TokenMask m = parse_mask(c, mask, va.tokens);
  [[maybe_unused]] void* s = c.stream(stream);
  if (c.space() == MemorySpace::kHost) {
    nb::gil_scoped_release unlocked;
    cpu::merge_state(va, vb, vo, m);
    return;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  cuda::merge_state(va, vb, vo, m, as_stream(s));
#endif
}

void merge_state_inplace(nb::handle acc, nb::handle other, nb::handle mask, nb::handle stream) {
  Call c("attnstate.merge_state_");
  const StateView va = c.state(acc, "acc"), vo = c.state(other, "other");
  const TokenMask m = parse_mask(c, mask, va.tokens);
  [[maybe_unused]] void* s = c.stream(stream);
  if (c.space() == MemorySpace::kHost) {
    nb::gil_scoped_release unlocked;
    cpu::merge_state_inplace(va, vo, m);
    return;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  cuda::merge_state_inplace(va, vo, m, as_stream(s));
#endif
}

StackOrder parse_order(const Call& c, const std::string& order) {
  if (order == "tokens_major") return StackOrder::kTokensMajor;
  if (order == "states_major") return StackOrder::kStatesMajor;
  c.fail("order", "\"tokens_major\" or \"states_major\"", "\"" + order + "\"");
}

void merge_states(nb::handle states, const std::string& order, nb::handle out, nb::handle stream) {
  Call c("attnstate.merge_states");
  const ConstStateStackView vs = c.stack(states, parse_order(c, order), "states");
  const StateView vo = c.state(out, "out");
  [[maybe_unused]] void* s = c.stream(stream);
  if (c.space() == MemorySpace::kHost) {
    nb::gil_scoped_release unlocked;
    cpu::merge_states(vs, vo);
    return;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  cuda::merge_states(vs, vo, as_stream(s));
#endif
}

void merge_states_ragged(nb::handle rows, nb::handle indptr, nb::handle out, nb::handle stream) {
  Call c("attnstate.merge_states_ragged");
  const StateView vr = c.state(rows, "rows");
  std::int64_t n = 0;
  const std::int32_t* ip = c.int32_vector(indptr, "indptr", &n);
  const StateView vo = c.state(out, "out");
  if (n != vo.tokens + 1)
    c.fail("indptr", "shape (" + std::to_string(vo.tokens + 1) + ",) (out's tokens + 1)",
           "(" + std::to_string(n) + ",)");
  [[maybe_unused]] void* s = c.stream(stream);
  if (c.space() == MemorySpace::kHost) {
    nb::gil_scoped_release unlocked;
    cpu::merge_states_ragged(vr, ip, vo);
    return;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  cuda::merge_states_ragged(vr, ip, vo, as_stream(s));
#endif
}

void rebase(nb::handle in, nb::handle out, nb::handle stream) {
  Call c("attnstate.rebase");
  const StateView vi = c.state(in, "state"), vo = c.state(out, "out");
  [[maybe_unused]] void* s = c.stream(stream);
  if (c.space() == MemorySpace::kHost) {
    nb::gil_scoped_release unlocked;
    cpu::rebase(vi, vo);
    return;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  cuda::rebase(vi, vo, as_stream(s));
#endif
}

void mark_empty_rows(nb::handle state, nb::handle stream) {
  Call c("attnstate.mark_empty_rows");
  const StateView v = c.state(state, "state");
  [[maybe_unused]] void* s = c.stream(stream);
  if (c.space() == MemorySpace::kHost) {
    nb::gil_scoped_release unlocked;
    cpu::mark_empty_rows(v);
    return;
  }
#if defined(ATTNSTATE_HAS_CUDA)
  cuda::mark_empty_rows(v, as_stream(s));
#endif
}

}  // namespace

void bind_merge(nb::module_& m) {
  using nb::arg;
  m.def("merge_state", &merge_state, arg("a"), arg("b"), arg("out"), arg("mask").none(),
        arg("stream").none());
  m.def("merge_state_", &merge_state_inplace, arg("acc"), arg("other"), arg("mask").none(),
        arg("stream").none());
  m.def("merge_states", &merge_states, arg("states"), arg("order"), arg("out"),
        arg("stream").none());
  m.def("merge_states_ragged", &merge_states_ragged, arg("rows"), arg("indptr"), arg("out"),
        arg("stream").none());
  m.def("rebase", &rebase, arg("state"), arg("out"), arg("stream").none());
  m.def("mark_empty_rows", &mark_empty_rows, arg("state"), arg("stream").none());
  m.def("set_num_threads", &cpu::set_num_threads, arg("n"),
        "Worker threads of the CPU backend (>= 1; 0 restores the hardware concurrency).");
  m.def("num_threads", &cpu::num_threads, "Worker threads of the CPU backend.");
}

}  // namespace py
}  // namespace attnstate
