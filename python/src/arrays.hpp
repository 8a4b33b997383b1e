/// @file arrays.hpp
/// @brief DLPack arrays (torch, CuPy, JAX, NumPy) to attnstate views, the caller's stream, and the
///        Python `State` value; shared by the bindings of the merges and of the plans.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/attnstate.hpp"

namespace attnstate {
namespace py {

namespace nb = nanobind;

/// An imported array. Imported read-only-capable: JAX and other producers may mark their
/// exports read-only, and most arguments are inputs; outputs are written through it.
using Array = nb::ndarray<nb::ro>;

/// How a state's LSE array is laid out: the caller names it, it is never inferred from strides
/// (a square LSE reads either way).
enum class LseLayout : std::uint8_t {
  kTokensHeads = 0,  ///< `(tokens, heads)`, any strides (FlashInfer's; a transposed view too).
  kHeadsTokens = 1,  ///< `(heads, tokens)`, any strides (FlashAttention's and vLLM's head-major).
};

/// Python name of a layout ("tokens_heads", "heads_tokens").
const char* to_string(LseLayout l);

/// `attnstate.State`: an attention state of any array library, with its LSE base, the scale of
/// an fp8 `o` and the layout of its LSE.
struct PyState {
  nb::object o;    ///< `(tokens, heads, head_dim)` (a stack: one more leading dimension).
  nb::object lse;  ///< fp32 LSEs in `lse_layout` (a stack: one more leading dimension), or None.
  LseBase base = LseBase::kNatural;
  float scale = 1.f;  ///< An fp8 `o`'s per-tensor scale (StateLayout::o_scale); 1 otherwise.
  LseLayout lse_layout = LseLayout::kTokensHeads;
};

/// Parses a base argument: an `attnstate.Base` or "natural" / "base2"; None is an error naming
/// `name` (the base is part of every state's value, it is never guessed).
LseBase parse_base(nb::handle base, const char* fn, const std::string& name);
/// Parses an LSE layout argument: "tokens_heads" or "heads_tokens" (an error naming `name`).
LseLayout parse_lse_layout(nb::handle layout, const char* fn, const std::string& name);

/// The arrays of one call: imports them, checks that they share one memory space and device,
/// and keeps them alive until the call returns.
class Call {
 public:
  explicit Call(const char* fn) : fn_(fn) { keep_.reserve(8); }
  const char* fn() const { return fn_; }

  /// Imports `h` (anything speaking DLPack or the buffer protocol) of rank `ndim`. NumPy arrays
  /// of ml_dtypes' bfloat16, float8_e4m3fn and float8_e5m2 (which NumPy cannot export) and torch
  /// fp8 tensors are read through a same-size integer view; an array without elements gets
  /// C-contiguous strides (NumPy 2 reports 0).
  Array array(nb::handle h, const std::string& name, int ndim);
  /// The `attnstate.State` `h` (an error naming `name` for anything else).
  const PyState& state_of(nb::handle h, const std::string& name) const;
  /// A state view of the State `h` (`o` of rank 3, `lse` of rank 2 with o's first two extents).
  StateView state(nb::handle h, const std::string& name);
  /// A stack view of the State `h` (`o` rank 4, `lse` rank 3) in `order` (the layout of its
  /// leading dimensions).
  ConstStateStackView stack(nb::handle h, StackOrder order, const std::string& name);
  /// A contiguous 1-D int32 array (indptr, lengths, tables), or null for None when `optional`.
  const std::int32_t* int32_vector(nb::handle h, const std::string& name, std::int64_t* size,
                                   bool optional = false);
  /// A contiguous 1-D float32 array (per-head logits), its extent in `size`.
  const float* float32_vector(nb::handle h, const std::string& name, std::int64_t* size);
  /// A contiguous 2-D int32 array (a block table), its extents in `rows` and `cols`.
  const std::int32_t* int32_matrix(nb::handle h, const std::string& name, std::int64_t* rows,
                                   std::int64_t* cols);
  /// A tensor view of rank `ndim` (queries, KV pools), last dimension contiguous.
  ConstTensorView tensor(nb::handle h, const std::string& name, int ndim);

  MemorySpace space() const { return space_; }
  int device() const { return device_; }

  /// The stream of a device call: `stream` itself (an int handle, an object with
  /// `__cuda_stream__`, `cuda_stream` or `ptr`), else the current stream of the first array's
  /// library (torch, CuPy); for host arrays `stream` must be None. Sets the current CUDA device
  /// to the arrays' device for the rest of the call.
  void* stream(nb::handle stream);

  /// Raises attnstate.Error naming `name` (the Python argument), in the library's message form.
  [[noreturn]] void fail(const std::string& name, const std::string& expected,
                         const std::string& got = std::string(),
                         Status status = Status::kInvalidArgument) const;

  ~Call();

 private:
  void place(const Array& a, nb::handle h, const std::string& name);
  bool import(nb::handle h, Array* a);
  /// The dtype of a state's `o` (named `name`) and its scale checked against it.
  DType o_dtype(const Array& o, const PyState& s, const std::string& name) const;

  const char* fn_;
  bool placed_ = false;
  MemorySpace space_ = MemorySpace::kHost;
  int device_ = -1;
  nb::handle first_;  // the first array: its library gives the default stream
  int restore_device_ = -1;
  std::vector<Array> keep_;
};

/// Maps a DLPack dtype to the library's (f32, f16, bf16, e4m3fn, e5m2); false for any other.
bool to_dtype(nb::dlpack::dtype dt, DType* out);
/// Python-facing name of a dlpack dtype ("float32", "bfloat16", "float8_e4m3fn", "int64", ...).
std::string dtype_name(nb::dlpack::dtype dt);
/// The dtypes a state's `o` may have, for messages.
extern const char* const kStateDTypes;

}  // namespace py
}  // namespace attnstate
