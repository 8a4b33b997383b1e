/// @file host_state.cpp
/// @brief `HostState`: an owning attention state in host memory.
#include "attnstate/testing/host_state.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>

#include "arg_checks.hpp"
#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/merge_math.hpp"

namespace attnstate {
namespace testing {

HostState::HostState(std::int64_t tokens, std::int64_t heads, std::int64_t head_dim, DType dtype,
                     LseBase base) {
  // Every argument checked before anything is sized: tokens * heads alone may overflow even
  // when head_dim = 0 makes o empty.
  const char* fn = "attnstate::testing::HostState";
  kit::check_extent(tokens, fn, "tokens");
  kit::check_extent(heads, fn, "heads");
  kit::check_extent(head_dim, fn, "head_dim");
  kit::check_dtype(dtype, fn, "dtype");
  kit::check_base(base, fn, "base");
  const std::int64_t rows = kit::mul_or_throw(tokens, heads, fn, "heads", "tokens x heads");
  kit::mul_or_throw(rows, static_cast<std::int64_t>(sizeof(float)), fn, "heads",
                    "LSE bytes (tokens x heads x 4)");
  std::int64_t elems = 0;
  if (!checked_mul(rows, head_dim, &elems)) {
    detail::throw_argument(
        fn, "head_dim", "tokens x heads x head_dim of at most 2^62",
        std::to_string(rows) + " x " + std::to_string(head_dim) + " (overflows)");
  }
  o_ = HostTensor(dtype, {tokens, heads, head_dim});  // checks the bytes of o
  kit::assign_or_throw(lse_, rows, -std::numeric_limits<float>::infinity(), fn, "heads");
  tokens_ = tokens;
  heads_ = heads;
  head_dim_ = head_dim;
  base_ = base;
}

HostState HostState::from_view(const ConstStateView& v) {
  const char* fn = "attnstate::testing::HostState::from_view";
  if (v.space != MemorySpace::kHost) {
    detail::throw_argument(fn, "view.space", "host",
                           v.space == MemorySpace::kDevice
                               ? std::string("device")
                               : "value " + std::to_string(static_cast<int>(v.space)));
  }
  kit::check_extent(v.tokens, fn, "view.tokens");
  kit::check_extent(v.heads, fn, "view.heads");
  kit::check_extent(v.head_dim, fn, "view.head_dim");
  kit::check_dtype(v.dtype, fn, "view.dtype");
  kit::check_base(v.base, fn, "view.base");
  kit::check_extent(v.o_stride_token, fn, "view.o_stride_token");
  kit::check_extent(v.o_stride_head, fn, "view.o_stride_head");
  kit::check_extent(v.lse_stride_token, fn, "view.lse_stride_token");
  kit::check_extent(v.lse_stride_head, fn, "view.lse_stride_head");
  // The largest offsets read must not overflow; an overflow names the stride that causes it.
  const bool any_row = v.tokens > 0 && v.heads > 0;
  if (any_row) {
    const auto check_span = [&](std::int64_t inner, std::int64_t head_stride,
                                std::int64_t token_stride, const char* inner_name,
                                const char* head_name, const char* token_name) {
      const std::int64_t head_span = checked_span(v.heads, head_stride, inner);
      if (head_span >= 0 && checked_span(v.tokens, token_stride, head_span) >= 0) return;
      const char* culprit = head_name;
      std::int64_t got = head_stride;
      if (head_span >= 0) {
        // the tokens' span overflows: its own stride when that alone overflows, else the larger
        // part of one token's span (a huge head stride or inner extent)
        const bool token_alone = checked_span(v.tokens, token_stride, 1) < 0;
        const bool inner_larger = head_span - inner < inner;
        culprit = token_alone ? token_name : inner_larger ? inner_name : head_name;
        got = token_alone ? token_stride : inner_larger ? inner : head_stride;
      }
      detail::throw_argument(fn, culprit, "a stride whose span is at most 2^62 elements",
                             std::to_string(got) + " (overflows)");
    };
    check_span(v.head_dim, v.o_stride_head, v.o_stride_token, "view.head_dim", "view.o_stride_head",
               "view.o_stride_token");
    check_span(1, v.lse_stride_head, v.lse_stride_token, "view.lse_stride_head",
               "view.lse_stride_head", "view.lse_stride_token");
  }
  HostState s(v.tokens, v.heads, v.head_dim, v.dtype, v.base);
  if (any_row && v.head_dim > 0 && v.o == nullptr) {
    detail::throw_argument(fn, "view.o", "non-null", "null");
  }
  if (any_row && v.lse == nullptr) detail::throw_argument(fn, "view.lse", "non-null", "null");
  // an element access through a misaligned pointer is undefined: reject it
  const auto aligned = [&](const char* name, const void* p, std::size_t bytes) {
    const auto off = reinterpret_cast<std::uintptr_t>(p) % bytes;
    if (p != nullptr && off != 0)
      detail::throw_argument(fn, name, "a pointer aligned to " + std::to_string(bytes) + " bytes",
                             "an address " + std::to_string(off) + " bytes past a multiple");
  };
  aligned("view.o", v.o, size_of(v.dtype));
  aligned("view.lse", v.lse, sizeof(float));
  const std::size_t elem = size_of(v.dtype);
  for (std::int64_t t = 0; t < v.tokens; ++t) {
    for (std::int64_t h = 0; h < v.heads; ++h) {
      s.lse_[static_cast<std::size_t>(t * v.heads + h)] = v.lse[v.lse_offset(t, h)];
      if (v.head_dim == 0) continue;
      const std::int64_t src = v.o_offset(t, h);
      const std::int64_t dst = (t * v.heads + h) * v.head_dim;
      std::memcpy(static_cast<unsigned char*>(s.o_.data()) + static_cast<std::size_t>(dst) * elem,
                  static_cast<const unsigned char*>(v.o) + static_cast<std::size_t>(src) * elem,
                  static_cast<std::size_t>(v.head_dim) * elem);
    }
  }
  return s;
}

std::int64_t HostState::o_index(std::int64_t t, std::int64_t h, std::int64_t d,
                                const char* func) const {
  kit::check_index(t, tokens_, func, "t");
  kit::check_index(h, heads_, func, "h");
  kit::check_index(d, head_dim_, func, "d");
  return (t * heads_ + h) * head_dim_ + d;
}

std::size_t HostState::lse_index(std::int64_t t, std::int64_t h, const char* func) const {
  kit::check_index(t, tokens_, func, "t");
  kit::check_index(h, heads_, func, "h");
  const std::size_t i = static_cast<std::size_t>(t * heads_ + h);
  if (i >= lse_.size()) check_storage(func);
  return i;
}

void HostState::check_storage(const char* func) const {
  const std::int64_t rows = tokens_ * heads_;  // checked by the constructor
  if (static_cast<std::int64_t>(lse_.size()) != rows) {
    detail::throw_argument(func, "this", std::to_string(rows) + " LSEs (tokens x heads)",
                           std::to_string(lse_.size()) + " (lse_values() was resized)");
  }
  const std::vector<std::int64_t> shape = {tokens_, heads_, head_dim_};
  if (o_.shape() != shape) {
    detail::throw_argument(func, "this", "o_tensor() of shape (tokens, heads, head_dim)",
                           "another shape (o_tensor() was replaced)");
  }
}

float HostState::o(std::int64_t t, std::int64_t h, std::int64_t d) const {
  return o_.get(o_index(t, h, d, "attnstate::testing::HostState::o"));
}
void HostState::set_o(std::int64_t t, std::int64_t h, std::int64_t d, float x) {
  o_.set(o_index(t, h, d, "attnstate::testing::HostState::set_o"), x);
}
float HostState::lse(std::int64_t t, std::int64_t h) const {
  return lse_[lse_index(t, h, "attnstate::testing::HostState::lse")];
}
void HostState::set_lse(std::int64_t t, std::int64_t h, float x) {
  lse_[lse_index(t, h, "attnstate::testing::HostState::set_lse")] = x;
}
bool HostState::is_empty_row(std::int64_t t, std::int64_t h) const {
  return math::is_empty_lse(lse_[lse_index(t, h, "attnstate::testing::HostState::is_empty_row")]);
}

void HostState::relabel_base(LseBase base) {
  kit::check_base(base, "attnstate::testing::HostState::relabel_base", "base");
  base_ = base;
}

StateView HostState::view() {
  check_storage("attnstate::testing::HostState::view");
  return make_state_view(o_.data(), o_.dtype(), lse_.data(), tokens_, heads_, head_dim_, base_);
}
ConstStateView HostState::view() const {
  check_storage("attnstate::testing::HostState::view");
  return make_const_state_view(o_.data(), o_.dtype(), lse_.data(), tokens_, heads_, head_dim_,
                               base_);
}

void HostState::poison() {
  o_.fill(std::numeric_limits<float>::quiet_NaN());
  for (float& x : lse_) x = std::numeric_limits<float>::quiet_NaN();
}

HostState HostState::converted(DType dtype, LseBase base) const {
  const char* fn = "attnstate::testing::HostState::converted";
  kit::check_dtype(dtype, fn, "dtype");
  kit::check_base(base, fn, "base");
  check_storage(fn);
  HostState out(tokens_, heads_, head_dim_, dtype, base);
  for (std::int64_t i = 0; i < o_.numel(); ++i) out.o_.set(i, o_.get(i));
  for (std::size_t i = 0; i < lse_.size(); ++i)
    out.lse_[i] = math::convert_lse(lse_[i], base_, base);
  return out;
}

bool bitwise_equal(const HostState& a, const HostState& b) {
  if (a.tokens() != b.tokens() || a.heads() != b.heads() || a.head_dim() != b.head_dim() ||
      a.dtype() != b.dtype() || a.base() != b.base()) {
    return false;
  }
  a.view();  // view() checks that each storage matches its shape (the memcmp relies on it)
  b.view();
  const std::size_t o_bytes = static_cast<std::size_t>(a.o_tensor().numel()) * size_of(a.dtype());
  if (o_bytes && std::memcmp(a.o_tensor().data(), b.o_tensor().data(), o_bytes) != 0) return false;
  const std::size_t l_bytes = a.lse_values().size() * sizeof(float);
  return l_bytes == 0 || std::memcmp(a.lse_values().data(), b.lse_values().data(), l_bytes) == 0;
}

void showValue(const HostState& s, std::ostream& os) {
  std::ostringstream ss;
  ss << std::setprecision(9);
  ss << "HostState(tokens=" << s.tokens() << ", heads=" << s.heads()
     << ", head_dim=" << s.head_dim() << ", o " << to_string(s.dtype()) << ", lse "
     << to_string(s.base()) << ")";
  constexpr std::int64_t kMaxRows = 12;
  constexpr std::int64_t kMaxElems = 8;
  std::int64_t shown = 0;
  for (std::int64_t t = 0; t < s.tokens(); ++t) {
    for (std::int64_t h = 0; h < s.heads(); ++h) {
      if (shown++ == kMaxRows) {
        ss << "\n  ...";
        t = s.tokens();
        break;
      }
      ss << "\n  [" << t << "," << h << "] lse=" << s.lse(t, h) << " o=[";
      for (std::int64_t d = 0; d < s.head_dim() && d < kMaxElems; ++d) {
        ss << (d ? ", " : "") << s.o(t, h, d);
      }
      if (s.head_dim() > kMaxElems) ss << ", ...";
      ss << "]";
    }
  }
  os << ss.str();
}

std::ostream& operator<<(std::ostream& os, const HostState& state) {
  showValue(state, os);
  return os;
}

}  // namespace testing
}  // namespace attnstate
