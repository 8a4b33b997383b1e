/// @file host_state.cpp
/// @brief `HostState`: an owning attention state in host memory.
#include "attnstate/testing/host_state.hpp"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>

#include "attnstate/core/error.hpp"
#include "attnstate/core/merge_math.hpp"

namespace attnstate {
namespace testing {

HostState::HostState(std::int64_t tokens, std::int64_t heads, std::int64_t head_dim, DType dtype,
                     LseBase base)
    : tokens_(tokens),
      heads_(heads),
      head_dim_(head_dim),
      base_(base),
      o_(dtype, {tokens, heads, head_dim}),
      lse_(static_cast<std::size_t>(tokens * heads), -std::numeric_limits<float>::infinity()) {}

HostState HostState::from_view(const ConstStateView& v) {
  const char* fn = "HostState::from_view";
  if (v.space != MemorySpace::kHost) detail::throw_argument(fn, "view.space", "host", "device");
  if (v.tokens < 0 || v.heads < 0 || v.head_dim < 0) {
    detail::throw_argument(fn, "view", "non-negative extents");
  }
  HostState s(v.tokens, v.heads, v.head_dim, v.dtype, v.base);
  if (v.tokens * v.heads * v.head_dim > 0 && v.o == nullptr) {
    detail::throw_argument(fn, "view.o", "non-null");
  }
  if (v.tokens * v.heads > 0 && v.lse == nullptr)
    detail::throw_argument(fn, "view.lse", "non-null");
  for (std::int64_t t = 0; t < v.tokens; ++t) {
    for (std::int64_t h = 0; h < v.heads; ++h) {
      s.lse_[static_cast<std::size_t>(t * v.heads + h)] = v.lse[v.lse_offset(t, h)];
      const std::int64_t src = v.o_offset(t, h);
      const std::int64_t dst = (t * v.heads + h) * v.head_dim;
      std::memcpy(static_cast<unsigned char*>(s.o_.data()) + dst * size_of(v.dtype),
                  static_cast<const unsigned char*>(v.o) + src * size_of(v.dtype),
                  static_cast<std::size_t>(v.head_dim) * size_of(v.dtype));
    }
  }
  return s;
}

float HostState::o(std::int64_t t, std::int64_t h, std::int64_t d) const {
  return o_.get((t * heads_ + h) * head_dim_ + d);
}
void HostState::set_o(std::int64_t t, std::int64_t h, std::int64_t d, float x) {
  o_.set((t * heads_ + h) * head_dim_ + d, x);
}
float HostState::lse(std::int64_t t, std::int64_t h) const {
  return lse_[static_cast<std::size_t>(t * heads_ + h)];
}
void HostState::set_lse(std::int64_t t, std::int64_t h, float x) {
  lse_[static_cast<std::size_t>(t * heads_ + h)] = x;
}
bool HostState::is_empty_row(std::int64_t t, std::int64_t h) const {
  return math::is_empty_lse(lse(t, h));
}

StateView HostState::view() {
  return make_state_view(o_.data(), o_.dtype(), lse_.data(), tokens_, heads_, head_dim_, base_);
}
ConstStateView HostState::view() const {
  return make_const_state_view(o_.data(), o_.dtype(), lse_.data(), tokens_, heads_, head_dim_,
                               base_);
}

void HostState::poison() {
  o_.fill(std::numeric_limits<float>::quiet_NaN());
  for (float& x : lse_) x = std::numeric_limits<float>::quiet_NaN();
}

HostState HostState::converted(DType dtype, LseBase base) const {
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
