/// @file kernels/merge/dispatch.cuh
/// @brief The merges' use of the one dispatch (`common/dispatch.hpp`): the dtypes of each `o`
///        (`compiled::MergeDTypes`) as storage types.
///
/// Kernels are templated on the storage dtypes only (f32, f16, bf16 for each input and the
/// output, every combination; the fp8 dtypes of `compiled::MergeFp8DTypes` in the combinations
/// `dispatch_pair` and `dispatch_stack` list); head_dim is a runtime value, any >= 1 (the ring
/// kernel, templated on it, is compiled for `compiled::MergeHeadDims` and dispatches on that
/// list; other head dims take the other kernels).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"
#include "common/compiled.hpp"

namespace attnstate {
namespace cuda {
namespace kernels {

/// Calls `f(TIn{}, TOut{})` with the storage types of `in` and `out` (errors name `func`).
template <class F>
void dispatch_in_out(const char* func, DType in, DType out, F&& f) {
  compiled::dispatch_storage(func, "in.dtype", in, compiled::MergeDTypes{}, [&](auto ti) {
    compiled::dispatch_storage(func, "out.dtype", out, compiled::MergeDTypes{},
                               [&](auto to) { f(ti, to); });
  });
}

/// The dtypes one call with the fp8 format `kF` may mix: `kF` and `compiled::MergeDTypes`.
template <DType kF>
using WithFp8 = compiled::DTypeList<kF, DType::kF32, DType::kF16, DType::kBF16>;

/// The fp8 format of a call whose `o` dtypes are `dts` (the first fp8 one); throws
/// `kNotSupported` naming the argument of a second, different fp8 format.
inline DType fp8_format(const char* func,
                        std::initializer_list<std::pair<const char*, DType>> dts) {
  DType fmt = DType::kF32;
  for (const auto& d : dts) {
    if (!is_fp8(d.second)) continue;
    if (!is_fp8(fmt)) {
      fmt = d.second;
    } else if (d.second != fmt) {
      attnstate::detail::throw_argument(
          func, d.first,
          std::string("f32, f16, bf16 or ") + to_string(fmt) + " (one fp8 format per call)",
          to_string(d.second), Status::kNotSupported);
    }
  }
  return fmt;
}

/// Calls `f(TIn{}, TOut{})` for an n-ary merge (`merge_states`): `dispatch_in_out`, and with an
/// fp8 `o` every pairing of one fp8 format with f32, f16, bf16 or itself.
template <class F>
void dispatch_stack(const char* func, DType in, DType out, F&& f) {
  if (!is_fp8(in) && !is_fp8(out)) return dispatch_in_out(func, in, out, f);
  const DType fmt = fp8_format(func, {{"out.dtype", out}, {"in.dtype", in}});
  compiled::dispatch(func, "out.dtype", fmt, compiled::MergeFp8DTypes{}, [&](auto t8) {
    using List = WithFp8<decltype(t8)::value>;
    compiled::dispatch_storage(func, "in.dtype", in, List{}, [&](auto ti) {
      compiled::dispatch_storage(func, "out.dtype", out, List{}, [&](auto to) { f(ti, to); });
    });
  });
}

/// Calls `f(TA{}, TB{}, TOut{})` with the storage types of `a`, `b` and `out`: every
/// combination of `compiled::MergeDTypes`, and with an fp8 `o` (one format, with those dtypes)
/// the combinations where `a` and `b` have one dtype (the fp8 output of two states, or two fp8
/// states merged into another dtype) or `a` has the output's (the in-place `acc ⊕ other`).
template <class F>
void dispatch_pair(const char* func, DType a, DType b, DType out, F&& f) {
  if (!is_fp8(a) && !is_fp8(b) && !is_fp8(out)) {
    compiled::dispatch_storage(func, "a.dtype", a, compiled::MergeDTypes{}, [&](auto ta) {
      dispatch_in_out(func, b, out, [&](auto tb, auto to) { f(ta, tb, to); });
    });
    return;
  }
  const DType fmt = fp8_format(func, {{"out.dtype", out}, {"a.dtype", a}, {"b.dtype", b}});
  if (a != b && a != out) {
    attnstate::detail::throw_argument(
        func, "b.dtype",
        std::string(to_string(a)) + " (as a.dtype; with an fp8 o the CUDA merges compile a and " +
            "b of one dtype, or a of out's dtype)",
        to_string(b), Status::kNotSupported);
  }
  compiled::dispatch(func, "out.dtype", fmt, compiled::MergeFp8DTypes{}, [&](auto t8) {
    using List = WithFp8<decltype(t8)::value>;
    compiled::dispatch_storage(func, "a.dtype", a, List{}, [&](auto ta) {
      if (a == b) {
        compiled::dispatch_storage(func, "out.dtype", out, List{}, [&](auto to) { f(ta, ta, to); });
      } else {
        compiled::dispatch_storage(func, "b.dtype", b, List{}, [&](auto tb) { f(ta, tb, ta); });
      }
    });
  });
}

}  // namespace kernels
}  // namespace cuda
}  // namespace attnstate
