/// @file validate.hpp
/// @brief Argument checks shared by the CPU and CUDA backends (internal header).
///
/// Every public entry point validates every argument with these functions before it touches
/// memory. A violation throws `attnstate::Error` (via `detail::throw_argument`) whose message
/// names the argument, e.g. `"b.lse"`, `"out.o_stride_token"` or `"indptr[3]"`.
///
/// Rules for a state view `(tokens, heads, head_dim)` named `v`:
/// - `v.tokens >= 0`, `v.heads >= 1`, `v.head_dim >= 1`; `head_dim` is contiguous (stride 1,
///   implied by the view type);
/// - every stride `>= 0`, and the span of `o` and `lse` in elements fits in 62 bits;
/// - `v.dtype` is a known dtype (fp8 only for the operations that take it) and `v.base` a known
///   base; `v.o_scale` is 1, or finite and > 0 for an fp8 `o`; `v.space` is the backend's space;
/// - `v.o` and `v.lse` are non-null unless `v.tokens == 0`;
/// - output views (`check_output_state`) must not overlap themselves: the `(token, head)` rows
///   of `o` (each `head_dim` elements) and of `lse` (one element) are pairwise disjoint. Input
///   views may overlap themselves (e.g. a stride of 0 broadcasts one state over tokens);
/// - an output may alias an input only where the operation says so, and then exactly (same
///   pointers, strides and dtype: `check_alias`), otherwise not at all (`check_disjoint`).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <limits>
#include <sstream>
#include <string>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace detail {

/// `"name.field"` for error messages.
inline std::string arg_name(const char* name, const char* field) {
  return std::string(name) + "." + field;
}

/// Throws naming `name` unless `p` is non-null.
inline void check_not_null(const char* func, const char* name, const void* p) {
  if (p == nullptr) throw_argument(func, name, "a non-null pointer", "nullptr");
}

/// Throws naming `name` unless `p` (non-null) is aligned to `bytes` (the element size: a
/// misaligned element access would fault on the GPU, and is undefined on the host).
inline void check_aligned(const char* func, const char* name, const void* p, std::size_t bytes) {
  if (p != nullptr && reinterpret_cast<std::uintptr_t>(p) % bytes != 0) {
    throw_argument(func, name, "a pointer aligned to " + std::to_string(bytes) + " bytes",
                   "an address " + std::to_string(reinterpret_cast<std::uintptr_t>(p) % bytes) +
                       " bytes past a multiple");
  }
}

/// `check_aligned` for the field `field` of the argument `name` (the name `"name.field"` is built
/// only for the error).
inline void check_aligned(const char* func, const char* name, const char* field, const void* p,
                          std::size_t bytes) {
  if (p != nullptr && reinterpret_cast<std::uintptr_t>(p) % bytes != 0)
    check_aligned(func, arg_name(name, field).c_str(), p, bytes);
}

/// Throws naming `name` unless `dt` is f32, f16 or bf16, or, where the operation takes them
/// (`fp8`), e4m3 or e5m2: `kInvalidArgument` for a value that is no dtype, `kNotSupported` for
/// an fp8 dtype where the operation takes none.
inline void check_dtype(const char* func, const char* name, DType dt, bool fp8 = false) {
  if (!is_valid(dt)) {
    throw_argument(func, name, "a valid dtype (f32, f16, bf16, e4m3 or e5m2)",
                   "value " + std::to_string(static_cast<int>(dt)));
  }
  if (is_fp8(dt) && !fp8) {
    throw_argument(func, name,
                   "f32, f16 or bf16 (an fp8 o is taken by merge_state, merge_state_inplace and "
                   "merge_states)",
                   to_string(dt), Status::kNotSupported);
  }
}

/// Throws naming `q.dtype` unless the queries of a decode or cascade call are f32, f16 or bf16:
/// `kInvalidArgument` for a value that is no dtype, `kNotSupported` for fp8 (taken for the KV
/// cache only).
inline void check_query_dtype(const char* func, DType dt) {
  if (!is_valid(dt))
    throw_argument(func, "q.dtype", "f32, f16 or bf16",
                   "value " + std::to_string(static_cast<int>(dt)));
  if (is_fp8(dt))
    throw_argument(func, "q.dtype", "f32, f16 or bf16 (fp8 is taken for the KV cache only)",
                   to_string(dt), Status::kNotSupported);
}

/// Throws naming `name.o_scale` unless the scale of `v`'s `o` is finite and > 0 for an fp8
/// dtype, and exactly 1 for any other (a scale there would be silently ignored).
inline void check_o_scale(const char* func, const char* name, const StateLayout& v) {
  if (is_fp8(v.dtype)) {
    if (!(v.o_scale > 0.f) || !std::isfinite(v.o_scale))
      throw_argument(
          func, arg_name(name, "o_scale").c_str(),
          std::string("a finite value > 0 (the scale of the ") + to_string(v.dtype) + " o)",
          std::to_string(v.o_scale));
  } else if (v.o_scale != 1.f) {
    throw_argument(
        func, arg_name(name, "o_scale").c_str(),
        std::string("1 (a scale applies to an fp8 o only; this o is ") + to_string(v.dtype) + ")",
        std::to_string(v.o_scale));
  }
}

/// Throws naming `name` unless `base` is `kNatural` or `kBase2`.
inline void check_base(const char* func, const char* name, LseBase base) {
  if (base != LseBase::kNatural && base != LseBase::kBase2) {
    throw_argument(func, name, "a valid LSE base (natural or base2)",
                   "value " + std::to_string(static_cast<int>(base)));
  }
}

/// Throws naming `name` unless `got == expected`.
inline void check_space(const char* func, const char* name, MemorySpace got, MemorySpace expected) {
  if (got != expected) {
    throw_argument(func, name, std::string(to_string(expected)) + " memory",
                   std::string(to_string(got)) + " memory");
  }
}

/// Throws naming `name` unless `value >= min`.
inline void check_min(const char* func, const char* name, std::int64_t value, std::int64_t min) {
  if (value < min) {
    throw_argument(func, name, ">= " + std::to_string(min), std::to_string(value));
  }
}

/// Throws naming `name` unless `x` is finite.
inline void check_finite(const char* func, const char* name, float x) {
  if (!(x - x == 0.f)) throw_argument(func, name, "a finite value", std::to_string(x));
}

/// `elems` when `elems` elements of `elem_bytes` bytes fit in `kMaxSize` bytes, else -1.
inline std::int64_t if_bytes_fit(std::int64_t elems, std::size_t elem_bytes) {
  std::int64_t bytes = 0;
  return elems >= 0 && checked_mul(elems, static_cast<std::int64_t>(elem_bytes), &bytes) ? elems
                                                                                         : -1;
}

/// Elements of `o` spanned by a layout (0 when it has no tokens); -1 when the span, in elements
/// or in bytes, passes `kMaxSize`.
inline std::int64_t o_span(const StateLayout& v) {
  if (v.tokens <= 0) return 0;
  const std::int64_t inner = checked_span(v.heads, v.o_stride_head, v.head_dim);
  return inner < 0
             ? -1
             : if_bytes_fit(checked_span(v.tokens, v.o_stride_token, inner), size_of(v.dtype));
}

/// Elements of `lse` spanned by a layout (0 when it has no tokens); -1 as for `o_span`.
inline std::int64_t lse_span(const StateLayout& v) {
  if (v.tokens <= 0) return 0;
  const std::int64_t inner = checked_span(v.heads, v.lse_stride_head, 1);
  return inner < 0 ? -1 : if_bytes_fit(checked_span(v.tokens, v.lse_stride_token, inner), 4);
}

/// Throws for `n` items `stride` apart whose span does not fit in `kMaxSize` (elements and
/// bytes), naming the factor out of proportion: the extent (`n_field`) when it exceeds the
/// stride, else the stride (`s_field`); the other is given in the message.
[[noreturn]] inline void throw_span_overflow(const char* func, const char* name,
                                             const char* n_field, std::int64_t n,
                                             const char* s_field, std::int64_t stride) {
  const bool extent = n - 1 > stride;
  throw_argument(func, arg_name(name, extent ? n_field : s_field).c_str(),
                 std::string("a span of ") + n_field + " items " + s_field +
                     " apart within 2^62 elements and bytes",
                 std::to_string(extent ? n : stride) + " (with " + (extent ? s_field : n_field) +
                     " = " + std::to_string(extent ? stride : n) + ")");
}

/// Shape, strides, dtype (fp8 only where `fp8`), `o` scale, base and space of a state layout
/// named `name` (no pointers).
inline void check_layout(const char* func, const char* name, const StateLayout& v,
                         MemorySpace space, bool fp8 = false) {
  check_min(func, arg_name(name, "tokens").c_str(), v.tokens, 0);
  check_min(func, arg_name(name, "heads").c_str(), v.heads, 1);
  check_min(func, arg_name(name, "head_dim").c_str(), v.head_dim, 1);
  check_min(func, arg_name(name, "o_stride_token").c_str(), v.o_stride_token, 0);
  check_min(func, arg_name(name, "o_stride_head").c_str(), v.o_stride_head, 0);
  check_min(func, arg_name(name, "lse_stride_token").c_str(), v.lse_stride_token, 0);
  check_min(func, arg_name(name, "lse_stride_head").c_str(), v.lse_stride_head, 0);
  check_dtype(func, arg_name(name, "dtype").c_str(), v.dtype, fp8);
  check_o_scale(func, name, v);
  check_base(func, arg_name(name, "base").c_str(), v.base);
  check_space(func, arg_name(name, "space").c_str(), v.space, space);
  if (if_bytes_fit(v.head_dim, size_of(v.dtype)) < 0)
    throw_argument(func, arg_name(name, "head_dim").c_str(), "at most 2^62 bytes per row",
                   std::to_string(v.head_dim));
  if (o_span(v) < 0) {  // a token's own span (over its heads) first, then the tokens'
    if (if_bytes_fit(checked_span(v.heads, v.o_stride_head, v.head_dim), size_of(v.dtype)) < 0)
      throw_span_overflow(func, name, "heads", v.heads, "o_stride_head", v.o_stride_head);
    throw_span_overflow(func, name, "tokens", v.tokens, "o_stride_token", v.o_stride_token);
  }
  if (lse_span(v) < 0) {
    if (if_bytes_fit(checked_span(v.heads, v.lse_stride_head, 1), 4) < 0)
      throw_span_overflow(func, name, "heads", v.heads, "lse_stride_head", v.lse_stride_head);
    throw_span_overflow(func, name, "tokens", v.tokens, "lse_stride_token", v.lse_stride_token);
  }
}

/// An input state named `name`: `check_layout` plus non-null `o` and `lse` (unless empty); an
/// fp8 `o` only where `fp8`; a null `lse` where `lse_optional` (an output whose LSE the caller
/// does not want).
inline void check_state(const char* func, const char* name, const StateLayout& v, const void* o,
                        const float* lse, MemorySpace space, bool fp8 = false,
                        bool lse_optional = false) {
  check_layout(func, name, v, space, fp8);
  if (v.tokens > 0) {
    check_not_null(func, arg_name(name, "o").c_str(), o);
    if (!lse_optional) check_not_null(func, arg_name(name, "lse").c_str(), lse);
  }
  check_aligned(func, name, "o", o, size_of(v.dtype));
  check_aligned(func, name, "lse", lse, sizeof(float));
}

/// @copydoc check_state
inline void check_state(const char* func, const char* name, const ConstStateView& v,
                        MemorySpace space, bool fp8 = false) {
  check_state(func, name, v, v.o, v.lse, space, fp8);
}

/// Throws unless `tokens` rows of stride `s_tok` and `heads` rows of stride `s_head`, each an
/// `inner`-element block, are pairwise disjoint. Names the stride that is too small.
inline void check_rows_disjoint(const char* func, const char* name, const char* tok_field,
                                const char* head_field, std::int64_t tokens, std::int64_t s_tok,
                                std::int64_t heads, std::int64_t s_head, std::int64_t inner) {
  // Order the two dims by stride (heads first on ties), ignoring dims of extent 1.
  struct Dim {
    std::int64_t n, s;
    const char* field;
  };
  if (tokens <= 0) return;  // no rows (e.g. a head-major LSE view of 0 tokens: stride 0)
  Dim d[2] = {{heads, s_head, head_field}, {tokens, s_tok, tok_field}};
  if (d[1].s < d[0].s) {
    const Dim t = d[0];
    d[0] = d[1];
    d[1] = t;
  }
  std::int64_t block = inner;
  for (const Dim& x : d) {
    if (x.n <= 1) continue;
    if (x.s < block) {
      throw_argument(func, arg_name(name, x.field).c_str(),
                     ">= " + std::to_string(block) + " (rows of the output must not overlap)",
                     std::to_string(x.s));
    }
    block = checked_span(x.n, x.s, block);
  }
}

/// An output state named `name`: `check_state` plus pairwise-disjoint `(token, head)` rows.
inline void check_output_state(const char* func, const char* name, const StateLayout& v,
                               const void* o, const float* lse, MemorySpace space, bool fp8 = false,
                               bool lse_optional = false) {
  check_state(func, name, v, o, lse, space, fp8, lse_optional);
  check_rows_disjoint(func, name, "o_stride_token", "o_stride_head", v.tokens, v.o_stride_token,
                      v.heads, v.o_stride_head, v.head_dim);
  check_rows_disjoint(func, name, "lse_stride_token", "lse_stride_head", v.tokens,
                      v.lse_stride_token, v.heads, v.lse_stride_head, 1);
}

/// @copydoc check_output_state
inline void check_output_state(const char* func, const char* name, const ConstStateView& v,
                               MemorySpace space, bool fp8 = false, bool lse_optional = false) {
  check_output_state(func, name, v, v.o, v.lse, space, fp8, lse_optional);
}

/// A state named `name` of which only the LSEs are written (its `o` is neither read nor written,
/// and may be null): `check_layout`, a non-null aligned `lse` (unless empty) whose `(token, head)`
/// entries are pairwise disjoint. Any dtype of `o` (fp8 included) is accepted.
inline void check_output_lse(const char* func, const char* name, const StateView& v,
                             MemorySpace space) {
  check_layout(func, name, v, space, /*fp8=*/true);
  if (v.tokens > 0) check_not_null(func, arg_name(name, "lse").c_str(), v.lse);
  check_aligned(func, name, "lse", v.lse, sizeof(float));
  check_rows_disjoint(func, name, "lse_stride_token", "lse_stride_head", v.tokens,
                      v.lse_stride_token, v.heads, v.lse_stride_head, 1);
}

/// Throws naming `b_name.tokens`/`.heads`/`.head_dim` unless `b` has the shape of `a`.
inline void check_same_shape(const char* func, const char* a_name, const StateLayout& a,
                             const char* b_name, const StateLayout& b) {
  const auto check = [&](const char* field, std::int64_t va, std::int64_t vb) {
    if (va != vb) {
      throw_argument(func, arg_name(b_name, field).c_str(),
                     std::to_string(va) + " (as " + a_name + "." + field + ")", std::to_string(vb));
    }
  };
  check("tokens", a.tokens, b.tokens);
  check("heads", a.heads, b.heads);
  check("head_dim", a.head_dim, b.head_dim);
}

/// True when the byte ranges `[a, a + a_bytes)` and `[b, b + b_bytes)` intersect.
inline bool ranges_overlap(const void* a, std::int64_t a_bytes, const void* b,
                           std::int64_t b_bytes) {
  if (a == nullptr || b == nullptr || a_bytes <= 0 || b_bytes <= 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + static_cast<std::uintptr_t>(b_bytes) &&
         pb < pa + static_cast<std::uintptr_t>(a_bytes);
}

/// Bytes of `o` spanned by a (validated) layout.
inline std::int64_t o_bytes(const StateLayout& v) {
  return o_span(v) * static_cast<std::int64_t>(size_of(v.dtype));
}
/// Bytes of `lse` spanned by a (validated) layout.
inline std::int64_t lse_bytes(const StateLayout& v) { return lse_span(v) * 4; }

/// An output `out` that may alias the input `in` only exactly: their memory is either disjoint
/// or the same pointers, strides and dtype (checked separately for `o` and `lse`; `out.o` must
/// be disjoint from `in.lse` and `out.lse` from `in.o`). Both views must already be validated
/// and of the same shape.
inline void check_alias(const char* func, const char* out_name, const ConstStateView& out,
                        const char* in_name, const ConstStateView& in) {
  if (ranges_overlap(out.o, o_bytes(out), in.o, o_bytes(in))) {
    const bool exact = out.o == in.o && out.o_stride_token == in.o_stride_token &&
                       out.o_stride_head == in.o_stride_head && out.dtype == in.dtype;
    if (!exact) {
      throw_argument(func, arg_name(out_name, "o").c_str(),
                     std::string("memory disjoint from ") + in_name +
                         ".o or the same pointer, strides and dtype",
                     "a partial overlap");
    }
  }
  if (ranges_overlap(out.lse, lse_bytes(out), in.lse, lse_bytes(in))) {
    const bool exact = out.lse == in.lse && out.lse_stride_token == in.lse_stride_token &&
                       out.lse_stride_head == in.lse_stride_head;
    if (!exact) {
      throw_argument(
          func, arg_name(out_name, "lse").c_str(),
          std::string("memory disjoint from ") + in_name + ".lse or the same pointer and strides",
          "a partial overlap");
    }
  }
  // across the arrays: an output o over an input lse (or the reverse) is never an exact alias
  if (ranges_overlap(out.o, o_bytes(out), in.lse, lse_bytes(in))) {
    throw_argument(func, arg_name(out_name, "o").c_str(),
                   std::string("memory disjoint from ") + in_name + ".lse", "an overlap");
  }
  if (ranges_overlap(out.lse, lse_bytes(out), in.o, o_bytes(in))) {
    throw_argument(func, arg_name(out_name, "lse").c_str(),
                   std::string("memory disjoint from ") + in_name + ".o", "an overlap");
  }
}

/// Throws unless the memory of `out` is disjoint from the byte ranges of the input named
/// `in_name` (`in_o`/`in_o_bytes` and `in_lse`/`in_lse_bytes`).
inline void check_disjoint(const char* func, const char* out_name, const ConstStateView& out,
                           const char* in_name, const void* in_o, std::int64_t in_o_bytes,
                           const void* in_lse, std::int64_t in_lse_bytes) {
  if (ranges_overlap(out.o, o_bytes(out), in_o, in_o_bytes) ||
      ranges_overlap(out.o, o_bytes(out), in_lse, in_lse_bytes)) {
    throw_argument(func, arg_name(out_name, "o").c_str(),
                   std::string("memory disjoint from ") + in_name, "an overlap");
  }
  if (ranges_overlap(out.lse, lse_bytes(out), in_o, in_o_bytes) ||
      ranges_overlap(out.lse, lse_bytes(out), in_lse, in_lse_bytes)) {
    throw_argument(func, arg_name(out_name, "lse").c_str(),
                   std::string("memory disjoint from ") + in_name, "an overlap");
  }
}

/// The softmax scale of a call: `0` means `1/sqrt(head_dim)` (the one meaning of 0 in every
/// entry point and options struct); any other value must be finite. Throws naming `name`.
inline float resolve_scale(const char* func, const char* name, float scale, std::int64_t head_dim) {
  if (!std::isfinite(scale))
    throw_argument(func, name, "a finite value (0 means 1/sqrt(head_dim))", std::to_string(scale));
  return scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(head_dim));
}

/// The name of the largest of three factors (the one out of proportion when their product
/// overflows).
inline const char* largest_of(const char* na, std::int64_t a, const char* nb, std::int64_t b,
                              const char* nc, std::int64_t c) {
  return a >= b && a >= c ? na : (b >= c ? nb : nc);
}

/// Bytes spanned by the scales of `s` for `heads_kv` KV heads (0 without `data`); -1 when they
/// do not fit in `kMaxSize` (or the stride is negative).
inline std::int64_t kv_scale_bytes(const KvScale& s, std::int64_t heads_kv) {
  if (s.data == nullptr) return 0;
  const std::int64_t n = if_bytes_fit(checked_span(heads_kv, s.head_stride, 1), sizeof(float));
  return n < 0 ? -1 : n * 4;
}

/// A scale as an error message shows it (`1e-30`, not `0.000000`).
inline std::string scale_str(float x) {
  std::ostringstream ss;
  ss << std::setprecision(9) << x;
  return ss.str();
}

/// Throws naming `name` (`"kv.k_scale"` or `"kv.v_scale"`) or its field unless `s` is a valid
/// dequantisation scale (`KvScale`) of a pool of `dtype` with `heads_kv` KV heads (both checked):
/// the default for a pool that is not fp8; for an fp8 pool a finite `value > 0` without `data`
/// (and `head_stride` 0), or `data` with `value` 1, `head_stride >= 0`, a span of `heads_kv`
/// scales within `kMaxSize` bytes, 4-byte alignment. In host memory (`space` kHost: the CPU
/// backend reads them there) every scale `data[h · head_stride]` must be finite and > 0 too;
/// device scales are read by the kernels only. Whether `data` really lies in `space` is not
/// known here: the CUDA backend checks the memory side of a pointer itself.
inline void check_kv_scale(const char* func, const char* name, const KvScale& s, DType dtype,
                           std::int64_t heads_kv, MemorySpace space) {
  if (!is_fp8(dtype)) {
    if (!s.is_default())
      throw_argument(func, name,
                     std::string("the default (value 1, no data): a scale applies to an fp8 "
                                 "cache only, this one is ") +
                         to_string(dtype),
                     s.data != nullptr ? "a scale pointer" : "value " + scale_str(s.value));
    return;
  }
  const std::string what = std::string("the scale of the ") + to_string(dtype) + " pool";
  if (s.data == nullptr) {
    if (!(s.value > 0.f) || !std::isfinite(s.value))
      throw_argument(func, arg_name(name, "value").c_str(), "a finite value > 0 (" + what + ")",
                     scale_str(s.value));
    if (s.head_stride != 0)
      throw_argument(func, arg_name(name, "head_stride").c_str(),
                     "0 without data (value is the scale of every head)",
                     std::to_string(s.head_stride));
    return;
  }
  if (s.value != 1.f)
    throw_argument(func, arg_name(name, "value").c_str(),
                   "1 when data is set (the scale is read from data)", scale_str(s.value));
  check_min(func, arg_name(name, "head_stride").c_str(), s.head_stride, 0);
  if (kv_scale_bytes(s, heads_kv) < 0)
    throw_argument(
        func, arg_name(name, "head_stride").c_str(),
        "heads_kv scales head_stride apart within 2^62 bytes",
        std::to_string(s.head_stride) + " (with heads_kv = " + std::to_string(heads_kv) + ")");
  check_aligned(func, name, "data", s.data, sizeof(float));
  if (space != MemorySpace::kHost) return;
  const std::int64_t heads = s.head_stride == 0 ? 1 : heads_kv;
  for (std::int64_t h = 0; h < heads; ++h) {
    const float x = s.data[h * s.head_stride];
    if (!(x > 0.f) || !std::isfinite(x))
      throw_argument(
          func, (arg_name(name, "data") + "[" + std::to_string(h * s.head_stride) + "]").c_str(),
          "a finite value > 0 (" + what +
              (s.head_stride == 0 ? "" : ", KV head " + std::to_string(h)) + ")",
          scale_str(x));
  }
}

/// `check_kv_scale` of a scale of the pool `kv` (its dtype and KV heads).
inline void check_kv_scale(const char* func, const char* name, const KvScale& s,
                           const PagedKvCache& kv, MemorySpace space) {
  check_kv_scale(func, name, s, kv.dtype, kv.heads_kv, space);
}

/// Checks the scalar fields, the pointers and the size of the KV pool `kv` (named "kv"): valid
/// dtype (fp8 with valid scales, `check_kv_scale`; other dtypes with the default scales) and
/// layout, `num_pages >= 0`, `page_size`, `heads_kv`, `head_dim >= 1`, a page stride
/// of 0 (dense) or at least a page, each of the two pools at most `kMaxSize` bytes, `k` and `v`
/// non-null (when the pool has pages) and aligned to their element. Returns the bytes of one
/// pool (`num_pages * page_elems * size_of(dtype)`).
inline std::int64_t check_kv_pool(const char* func, const PagedKvCache& kv, MemorySpace space) {
  check_space(func, "kv.space", kv.space, space);
  if (!is_valid(kv.dtype))
    throw_argument(func, "kv.dtype", "f32, f16, bf16, e4m3 or e5m2",
                   "value " + std::to_string(static_cast<int>(kv.dtype)));
  if (kv.layout != KvLayout::kNHD && kv.layout != KvLayout::kHND)
    throw_argument(func, "kv.layout", "kNHD or kHND",
                   "value " + std::to_string(static_cast<int>(kv.layout)));
  check_min(func, "kv.num_pages", kv.num_pages, 0);
  check_min(func, "kv.page_size", kv.page_size, 1);
  check_min(func, "kv.heads_kv", kv.heads_kv, 1);
  check_min(func, "kv.head_dim", kv.head_dim, 1);
  const std::int64_t elem = static_cast<std::int64_t>(size_of(kv.dtype));
  std::int64_t dense = 0;
  if (!checked_mul(kv.page_size, kv.heads_kv, &dense) || !checked_mul(dense, kv.head_dim, &dense) ||
      if_bytes_fit(dense, size_of(kv.dtype)) < 0) {
    throw_argument(func,
                   largest_of("kv.page_size", kv.page_size, "kv.heads_kv", kv.heads_kv,
                              "kv.head_dim", kv.head_dim),
                   "page_size * heads_kv * head_dim within 2^62 bytes",
                   std::to_string(kv.page_size) + " * " + std::to_string(kv.heads_kv) + " * " +
                       std::to_string(kv.head_dim));
  }
  if (kv.page_stride != 0 && kv.page_stride < dense)
    throw_argument(func, "kv.page_stride",
                   "0 or >= page_size * heads_kv * head_dim = " + std::to_string(dense),
                   std::to_string(kv.page_stride));
  const std::int64_t page = kv.page_stride != 0 ? kv.page_stride : dense;
  std::int64_t pool = 0;
  if (!checked_mul(kv.num_pages, page, &pool) || !checked_mul(pool, elem, &pool)) {
    const bool pages = kv.num_pages > page;
    const char* stride = kv.page_stride != 0 ? "kv.page_stride" : "kv.page_size";
    throw_argument(
        func, pages ? "kv.num_pages" : stride, "a pool of num_pages pages within 2^62 bytes",
        std::to_string(kv.num_pages) + " pages of " + std::to_string(page) + " elements");
  }
  if (kv.num_pages > 0) {
    check_not_null(func, "kv.k", kv.k);
    check_not_null(func, "kv.v", kv.v);
  }
  check_aligned(func, "kv.k", kv.k, size_of(kv.dtype));
  check_aligned(func, "kv.v", kv.v, size_of(kv.dtype));
  check_kv_scale(func, "kv.k_scale", kv.k_scale, kv, space);
  check_kv_scale(func, "kv.v_scale", kv.v_scale, kv, space);
  return pool;
}

/// Throws unless the output `out` is disjoint from both pools of `kv` (`pool_bytes` each, from
/// `check_kv_pool`) and from their scales in memory: an output inside the cache would overwrite
/// it.
inline void check_disjoint_from_pool(const char* func, const char* out_name,
                                     const ConstStateView& out, const PagedKvCache& kv,
                                     std::int64_t pool_bytes) {
  check_disjoint(func, out_name, out, "kv.k", kv.k, pool_bytes, nullptr, 0);
  check_disjoint(func, out_name, out, "kv.v", kv.v, pool_bytes, nullptr, 0);
  check_disjoint(func, out_name, out, "kv.k_scale.data", kv.k_scale.data,
                 kv_scale_bytes(kv.k_scale, kv.heads_kv), nullptr, 0);
  check_disjoint(func, out_name, out, "kv.v_scale.data", kv.v_scale.data,
                 kv_scale_bytes(kv.v_scale, kv.heads_kv), nullptr, 0);
}

/// Throws naming `name` (a buffer the call writes, e.g. a workspace) unless its bytes
/// `[p, p + bytes)` are disjoint from the input named `in_name`.
inline void check_buffer_disjoint(const char* func, const char* name, const void* p,
                                  std::int64_t bytes, const char* in_name, const void* in,
                                  std::int64_t in_bytes) {
  if (ranges_overlap(p, bytes, in, in_bytes))
    throw_argument(func, name, std::string("memory disjoint from ") + in_name, "an overlap");
}

/// Throws naming `name` unless a buffer the call writes is disjoint from both pools of `kv`
/// (`pool_bytes` each, from `check_kv_pool`) and from their scales in memory.
inline void check_disjoint_from_pools(const char* func, const char* name, const void* p,
                                      std::int64_t bytes, const PagedKvCache& kv,
                                      std::int64_t pool_bytes) {
  check_buffer_disjoint(func, name, p, bytes, "kv.k", kv.k, pool_bytes);
  check_buffer_disjoint(func, name, p, bytes, "kv.v", kv.v, pool_bytes);
  check_buffer_disjoint(func, name, p, bytes, "kv.k_scale.data", kv.k_scale.data,
                        kv_scale_bytes(kv.k_scale, kv.heads_kv));
  check_buffer_disjoint(func, name, p, bytes, "kv.v_scale.data", kv.v_scale.data,
                        kv_scale_bytes(kv.v_scale, kv.heads_kv));
}

/// `check_disjoint_from_pools`, and disjoint from the decode's tables too (`seq_lens`,
/// `page_indptr`, `block_table` of `kv.batch` requests, already checked by
/// `validate_decode_args`).
inline void check_disjoint_from_kv(const char* func, const char* name, const void* p,
                                   std::int64_t bytes, const PagedKvCache& kv,
                                   std::int64_t pool_bytes) {
  check_disjoint_from_pools(func, name, p, bytes, kv, pool_bytes);
  if (kv.batch <= 0) return;
  check_buffer_disjoint(func, name, p, bytes, "kv.seq_lens", kv.seq_lens, kv.batch * 4);
  check_buffer_disjoint(func, name, p, bytes, "kv.page_indptr", kv.page_indptr, (kv.batch + 1) * 4);
  if (kv.block_table != nullptr)
    check_buffer_disjoint(func, name, p, bytes, "kv.block_table", kv.block_table,
                          kv.batch * kv.block_table_stride * 4);
}

/// Elements of `o` spanned by a stack (0 when it has no tokens); -1 on overflow (elements or
/// bytes).
inline std::int64_t stack_o_span(const StateStackLayout& v) {
  const std::int64_t per_state = o_span(v);
  if (per_state <= 0) return per_state;
  return if_bytes_fit(checked_span(v.num_states, v.o_stride_state, per_state), size_of(v.dtype));
}
/// Elements of `lse` spanned by a stack (0 when it has no tokens); -1 on overflow.
inline std::int64_t stack_lse_span(const StateStackLayout& v) {
  const std::int64_t per_state = lse_span(v);
  if (per_state <= 0) return per_state;
  return if_bytes_fit(checked_span(v.num_states, v.lse_stride_state, per_state), 4);
}

/// A stack of input states named `name`: `check_state` rules (an fp8 `o` only where `fp8`) plus
/// `num_states >= min_states` and non-negative state strides. A stack of no states has no
/// memory: its pointers may be null.
inline void check_stack(const char* func, const char* name, const ConstStateStackView& v,
                        MemorySpace space, bool fp8 = false, std::int64_t min_states = 1) {
  check_layout(func, name, v, space, fp8);
  check_min(func, arg_name(name, "num_states").c_str(), v.num_states, min_states);
  check_min(func, arg_name(name, "o_stride_state").c_str(), v.o_stride_state, 0);
  check_min(func, arg_name(name, "lse_stride_state").c_str(), v.lse_stride_state, 0);
  if (stack_o_span(v) < 0)
    throw_span_overflow(func, name, "num_states", v.num_states, "o_stride_state", v.o_stride_state);
  if (stack_lse_span(v) < 0)
    throw_span_overflow(func, name, "num_states", v.num_states, "lse_stride_state",
                        v.lse_stride_state);
  if (v.tokens > 0 && v.num_states > 0) {
    check_not_null(func, arg_name(name, "o").c_str(), v.o);
    check_not_null(func, arg_name(name, "lse").c_str(), v.lse);
  }
  check_aligned(func, name, "o", v.o, size_of(v.dtype));
  check_aligned(func, name, "lse", v.lse, sizeof(float));
}

/// Throws unless `out` is disjoint from the memory of the stack `in`.
inline void check_disjoint(const char* func, const char* out_name, const ConstStateView& out,
                           const char* in_name, const ConstStateStackView& in) {
  check_disjoint(func, out_name, out, in_name, in.o,
                 stack_o_span(in) * static_cast<std::int64_t>(size_of(in.dtype)), in.lse,
                 stack_lse_span(in) * 4);
}

/// A host `indptr` of `segments + 1` entries (reads `indptr[0..segments]`): non-null,
/// `indptr[0] >= 0`, non-decreasing, `indptr[segments] <= max_row`. Names e.g. `"indptr[3]"`.
inline void check_indptr_host(const char* func, const char* name, const std::int32_t* indptr,
                              std::int64_t segments, std::int64_t max_row) {
  check_not_null(func, name, indptr);
  const auto entry = [&](std::int64_t i) {
    return std::string(name) + "[" + std::to_string(i) + "]";
  };
  if (indptr[0] < 0) throw_argument(func, entry(0).c_str(), ">= 0", std::to_string(indptr[0]));
  for (std::int64_t i = 1; i <= segments; ++i) {
    if (indptr[i] < indptr[i - 1]) {
      throw_argument(func, entry(i).c_str(),
                     ">= " + std::to_string(indptr[i - 1]) + " (non-decreasing offsets)",
                     std::to_string(indptr[i]));
    }
  }
  if (indptr[segments] > max_row) {
    throw_argument(func, entry(segments).c_str(), "<= " + std::to_string(max_row),
                   std::to_string(indptr[segments]));
  }
}

/// An optional per-token mask over the `acc.tokens` tokens of `acc`, the state the operation
/// writes: a null `data` is allowed (every token); otherwise `stride >= 0` (0 broadcasts one
/// flag), a span that fits, and memory disjoint from `acc`.
inline void check_mask(const char* func, const char* name, const TokenMask& mask,
                       const char* acc_name, const ConstStateView& acc) {
  if (mask.data == nullptr) return;
  check_min(func, arg_name(name, "stride").c_str(), mask.stride, 0);
  if (acc.tokens == 0) return;
  const std::int64_t bytes = checked_span(acc.tokens, mask.stride, 1);
  if (bytes < 0) throw_span_overflow(func, name, "tokens", acc.tokens, "stride", mask.stride);
  if (ranges_overlap(mask.data, bytes, acc.o, o_bytes(acc)) ||
      ranges_overlap(mask.data, bytes, acc.lse, lse_bytes(acc))) {
    throw_argument(func, name, std::string("memory disjoint from ") + acc_name, "an overlap");
  }
}

/// Bytes spanned by a tensor view whose rank, shape and strides are valid (0 when a dimension is
/// empty); -1 when the span does not fit in 62 bits.
inline std::int64_t tensor_bytes(const ConstTensorView& t) {
  const int rank = t.rank < 0 ? 0 : (t.rank > 4 ? 4 : t.rank);
  for (int i = 0; i < rank; ++i)
    if (t.shape[i] == 0) return 0;
  std::int64_t span = 1;
  for (int i = rank - 1; i >= 0; --i) {
    span = checked_span(t.shape[i], t.stride[i], span);
    if (span < 0) return -1;
  }
  std::int64_t bytes = 0;
  return checked_mul_add(span, static_cast<std::int64_t>(size_of(t.dtype)), 0, &bytes) ? bytes : -1;
}

/// Throws for a tensor view named `name` whose span does not fit (`tensor_bytes(t) < 0`), naming
/// the dimension at which it stops fitting, from the innermost one outwards: its extent
/// (`name.shape[i]`) or its stride (`name.stride[i]`), whichever is out of proportion.
[[noreturn]] inline void throw_tensor_span(const char* func, const char* name,
                                           const ConstTensorView& t) {
  const int rank = t.rank < 1 ? 1 : (t.rank > 4 ? 4 : t.rank);
  std::int64_t span = 1;
  int i = rank - 1;
  for (; i > 0; --i) {
    const std::int64_t next = checked_span(t.shape[i], t.stride[i], span);
    if (if_bytes_fit(next, size_of(t.dtype)) < 0) break;
    span = next;
  }
  const std::string dim = "[" + std::to_string(i) + "]";
  const std::string shape = "shape" + dim, stride = "stride" + dim;
  throw_span_overflow(func, name, shape.c_str(), t.shape[i], stride.c_str(), t.stride[i]);
}

/// Bytes spanned by the tensor view named `name` (see `tensor_bytes`), whose rank, shape and
/// strides are already checked; throws as `throw_tensor_span` when it does not fit.
inline std::int64_t check_tensor_span(const char* func, const char* name,
                                      const ConstTensorView& t) {
  const std::int64_t bytes = tensor_bytes(t);
  if (bytes >= 0) return bytes;
  throw_tensor_span(func, name, t);
}

/// A tensor view named `name` of rank `rank`: non-null data (unless it has no elements), a
/// valid dtype, non-negative shape and strides, the last dimension contiguous, the given space.
inline void check_tensor(const char* func, const char* name, const ConstTensorView& t, int rank,
                         MemorySpace space) {
  if (t.rank != rank) {
    throw_argument(func, arg_name(name, "rank").c_str(), std::to_string(rank),
                   std::to_string(t.rank));
  }
  check_dtype(func, arg_name(name, "dtype").c_str(), t.dtype);
  check_space(func, arg_name(name, "space").c_str(), t.space, space);
  bool empty = false;
  for (int i = 0; i < rank; ++i) {
    const std::string dim = std::to_string(i);
    check_min(func, (std::string(name) + ".shape[" + dim + "]").c_str(), t.shape[i], 0);
    check_min(func, (std::string(name) + ".stride[" + dim + "]").c_str(), t.stride[i], 0);
    if (t.shape[i] == 0) empty = true;
  }
  if (t.stride[rank - 1] != 1 && t.shape[rank - 1] > 1) {
    throw_argument(func, (std::string(name) + ".stride[" + std::to_string(rank - 1) + "]").c_str(),
                   "1 (last dimension contiguous)", std::to_string(t.stride[rank - 1]));
  }
  if (empty) return;
  if (tensor_bytes(t) < 0) throw_tensor_span(func, name, t);
  check_not_null(func, arg_name(name, "data").c_str(), t.data);
  check_aligned(func, name, "data", t.data, size_of(t.dtype));
}

}  // namespace detail
}  // namespace attnstate
