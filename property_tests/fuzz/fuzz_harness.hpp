/// @file fuzz_harness.hpp
/// @brief The API fuzzer's machinery, shared by the CPU and CUDA fuzz tests: one bounded arena
///        per case, argument builders that describe buffers inside it, mutations that make a call
///        invalid (and say which arguments may be blamed), and the oracle.
///
/// Soundness rule: a call with no hard mutation describes only memory inside the arena (every
/// buffer is allocated there with its exact span), so a library that reads or writes outside it
/// is wrong. Hard mutations (negative or overflowing extents, null/misaligned pointers, overlaps,
/// bad enums, bad tables, ...) must be rejected by the library before it touches memory; only
/// then may the fuzzer also point data buffers at a wild (never mapped) address.
///
/// Oracle: the call throws `attnstate::Error` with status kInvalidArgument / kNotSupported /
/// kWorkspaceTooSmall, a message `"<func>: argument '<name>': expected <what>, got <value>"`
/// naming an argument a mutation broke, and the arena unchanged; or it returns, the call had no
/// hard mutation, and every arena byte outside the described outputs is unchanged.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate_fuzz {

using attnstate::ConstStateStackView;
using attnstate::ConstStateView;
using attnstate::ConstTensorView;
using attnstate::DType;
using attnstate::LseBase;
using attnstate::MemorySpace;
using attnstate::StateLayout;
using attnstate::StateView;
using attnstate::TokenMask;
using i64 = std::int64_t;

constexpr i64 kI64Max = std::numeric_limits<i64>::max();
constexpr i64 kI64Min = std::numeric_limits<i64>::min();
constexpr i64 k2p62 = i64{1} << 62;

/// xorshift64*: the cases' bulk randomness (RapidCheck draws only the seed and the mutation
/// count, so a case costs a few RapidCheck draws, not hundreds).
struct Rng {
  std::uint64_t s = 1;
  std::uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  /// Uniform in [lo, hi].
  i64 range(i64 lo, i64 hi) {
    if (hi <= lo) return lo;
    return lo + static_cast<i64>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  bool coin(int pct) { return range(0, 99) < pct; }
  template <class T>
  T pick(std::initializer_list<T> xs) {
    return *(xs.begin() + range(0, static_cast<i64>(xs.size()) - 1));
  }
  /// As `pick` over a list built at run time (a build's head dims; never empty).
  template <class T>
  T pick(const std::vector<T>& xs) {
    return xs[static_cast<std::size_t>(range(0, static_cast<i64>(xs.size()) - 1))];
  }
};

inline i64 es(DType dt) { return static_cast<i64>(attnstate::size_of(dt)); }

/// A buffer of the arena (for diagnostics).
struct Region {
  std::string name;
  i64 off, bytes;
  bool input;
};

/// One case: the arena image, the call's description and its expectations.
class Ctx {
 public:
  /// `image` is `size` bytes of host memory holding the arena's contents; `base` the address the
  /// callee sees for byte 0 (the image itself on the CPU, the device copy on the GPU).
  Ctx(std::uint8_t* image, i64 size, std::uintptr_t base, std::uintptr_t wild, MemorySpace space,
      std::uint64_t seed)
      : image_(image), size_(size), base_(base), wild_(wild), space(space) {
    rng.s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (rng.s == 0) rng.s = 1;
    // Every byte random: bytes outside the buffers are the canaries.
    for (i64 i = 0; i + 8 <= size_; i += 8) {
      const std::uint64_t r = rng.next();
      std::memcpy(image_ + i, &r, 8);
    }
  }

  Rng rng;
  bool expect_reject = false;  ///< A hard mutation was applied: the call must throw.
  bool accept_ok = false;      ///< Returning is fine too (e.g. a no-op call that reads nothing).
  std::vector<std::string> touched;  ///< Fields already mutated (mutations never cancel).
  /// False when `key` was already mutated; else marks it.
  bool touch(const std::string& key) {
    for (const auto& t : touched)
      if (t == key) return false;
    touched.push_back(key);
    return true;
  }
  bool structural_reject = false;  ///< A hard mutation independent of pointer values.
  bool uncertain = false;          ///< Validity is not settled by the docs: throwing is accepted.
  std::vector<std::string> blame;  ///< Argument names (prefixes) an error may name.
  std::vector<std::string> log;    ///< What was drawn (printed on failure).
  std::vector<Region> regions;

  MemorySpace other_space() const {
    return space == MemorySpace::kHost ? MemorySpace::kDevice : MemorySpace::kHost;
  }

  /// `bytes` (>= 0) at a random 16-aligned offset after a random canary gap.
  i64 alloc(const std::string& name, i64 bytes, bool input) {
    const i64 gap = rng.range(16, 48);
    const i64 off = (used_ + gap + 15) / 16 * 16;
    if (bytes < 0 || off + bytes + 128 > size_)
      throw std::logic_error("fuzzer: arena exhausted (" + name + ")");
    used_ = off + bytes;
    regions.push_back({name, off, bytes, input});
    return off;
  }
  /// `bytes` (>= 0) ending exactly at the arena's last byte, so that a read past them leaves the
  /// allocation (ASan, compute-sanitizer); no buffer can follow it.
  i64 alloc_tail(const std::string& name, i64 bytes, bool input) {
    const i64 off = size_ - bytes;
    if (bytes < 0 || off < used_ + 16)
      throw std::logic_error("fuzzer: arena exhausted (" + name + ")");
    used_ = size_;
    regions.push_back({name, off, bytes, input});
    return off;
  }
  void* ptr(i64 off) const {
    return reinterpret_cast<void*>(base_ + static_cast<std::uintptr_t>(off));
  }
  /// A never-mapped address (aligned to 256), only used when the call must be rejected.
  void* wild() {
    return reinterpret_cast<void*>(wild_ + 256 * static_cast<std::uintptr_t>(rng.range(0, 15)));
  }
  i64 off_of(const void* p) const {
    return static_cast<i64>(reinterpret_cast<std::uintptr_t>(p) - base_);
  }
  bool in_arena(const void* p, i64 bytes) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    return a >= base_ && bytes >= 0 &&
           a - base_ + static_cast<std::uint64_t>(bytes) <= static_cast<std::uint64_t>(size_);
  }
  std::uint8_t* image() { return image_; }
  i64 size() const { return size_; }

  template <class T>
  void put(i64 off, T v) {
    std::memcpy(image_ + off, &v, sizeof(T));
  }
  template <class T>
  T get(const void* p) const {
    T v;
    std::memcpy(&v, image_ + off_of(p), sizeof(T));
    return v;
  }
  template <class T>
  void put_at(const void* p, T v) {
    put(off_of(p), v);
  }

  /// Records a hard mutation: the call must be rejected naming one of `names`.
  /// `structural`: the reason does not depend on a pointer value (not a null, misaligned or
  /// overlapping pointer), so data pointers may then go wild without making the call valid.
  void reject(const std::string& what, std::vector<std::string> names, bool structural = true) {
    expect_reject = true;
    structural_reject = structural_reject || structural;
    log.push_back("HARD: " + what);
    for (auto& n : names) blame.push_back(std::move(n));
  }
  void note(const std::string& what) { log.push_back(what); }

  /// Marks the bytes `[off, off + bytes)` writable.
  void allow(i64 off, i64 bytes) {
    if (allowed_.empty()) allowed_.assign(static_cast<std::size_t>(size_), 0);
    for (i64 i = std::max<i64>(off, 0); i < std::min(off + bytes, size_); ++i)
      allowed_[static_cast<std::size_t>(i)] = 1;
  }
  bool allowed(i64 i) const { return !allowed_.empty() && allowed_[static_cast<std::size_t>(i)]; }
  /// The name of the buffer (or canary gap) holding byte `i`.
  std::string where(i64 i) const {
    for (const Region& r : regions)
      if (i >= r.off && i < r.off + r.bytes)
        return r.name + "+" + std::to_string(i - r.off) + (r.input ? " (input)" : " (output)");
    return "canary byte " + std::to_string(i);
  }

 private:
  std::uint8_t* image_;
  i64 size_;
  std::uintptr_t base_;
  std::uintptr_t wild_;

 public:
  MemorySpace space;

 private:
  i64 used_ = 0;
  std::vector<std::uint8_t> allowed_;
};

inline std::string str(i64 v) { return std::to_string(v); }

// ---------------------------------------------------------------------------------------------
// Data filling.

/// Finite LSEs mostly, with -inf (empty), +inf and NaN rows.
inline float draw_lse(Rng& r) {
  const i64 k = r.range(0, 99);
  if (k < 15) return -INFINITY;
  if (k < 20) return INFINITY;
  if (k < 25) return NAN;
  return static_cast<float>(r.range(-3000, 3000)) / 100.f;
}

inline void fill_values(Ctx& c, i64 off, i64 bytes, DType dt) {
  if (c.rng.coin(20)) return;  // keep the random bits (NaNs and infs included)
  const i64 n = bytes / es(dt);
  for (i64 i = 0; i < n; ++i) {
    const float x = static_cast<float>(c.rng.range(-200, 200)) / 100.f;
    if (attnstate::is_fp8(dt)) {
      c.put(off + i, dt == DType::kE4M3 ? attnstate::from_float<attnstate::float8_e4m3_t>(x).bits
                                        : attnstate::from_float<attnstate::float8_e5m2_t>(x).bits);
    } else if (dt == DType::kF32) {
      c.put(off + 4 * i, x);
    } else {
      std::uint32_t u;
      std::memcpy(&u, &x, 4);
      c.put(off + 2 * i,
            static_cast<std::uint16_t>(
                dt == DType::kBF16 ? u >> 16 : attnstate::detail::float_to_half_bits(x)));
    }
  }
}

inline void fill_lses(Ctx& c, i64 off, i64 count) {
  for (i64 i = 0; i < count; ++i) c.put(off + 4 * i, draw_lse(c.rng));
}

// ---------------------------------------------------------------------------------------------
// State arguments.

/// Elements spanned by a state layout (clamped to 2^63 - 1 for mutated, huge layouts; strides
/// and extents are taken as non-negative).
__extension__ typedef __int128 i128;  // (GCC, Clang) exact sums of i64 products

inline i64 clamp128(i128 x) { return x > kI64Max ? kI64Max : x < 0 ? 0 : static_cast<i64>(x); }
inline i64 small_o_span(const StateLayout& v) {
  if (v.tokens <= 0 || v.heads <= 0 || v.head_dim <= 0) return 0;
  return clamp128(static_cast<i128>(v.tokens - 1) * std::max<i64>(0, v.o_stride_token) +
                  static_cast<i128>(v.heads - 1) * std::max<i64>(0, v.o_stride_head) + v.head_dim);
}
inline i64 small_lse_span(const StateLayout& v) {
  if (v.tokens <= 0 || v.heads <= 0) return 0;
  return clamp128(static_cast<i128>(v.tokens - 1) * std::max<i64>(0, v.lse_stride_token) +
                  static_cast<i128>(v.heads - 1) * std::max<i64>(0, v.lse_stride_head) + 1);
}

/// A state argument: its view (pointers as the callee sees them) and its name.
struct StateArg {
  std::string name;
  StateView v;
  bool output = false;
  bool lse_optional = false;  ///< An output whose LSE may be null (then not written).
};

inline std::string describe(const StateArg& s, const Ctx& c) {
  std::ostringstream os;
  os << s.name << "{tokens " << s.v.tokens << ", heads " << s.v.heads << ", head_dim "
     << s.v.head_dim << ", o_stride (" << s.v.o_stride_token << ", " << s.v.o_stride_head
     << "), lse_stride (" << s.v.lse_stride_token << ", " << s.v.lse_stride_head << "), dtype "
     << static_cast<int>(s.v.dtype) << ", base " << static_cast<int>(s.v.base) << ", space "
     << static_cast<int>(s.v.space) << ", o @" << c.off_of(s.v.o) << ", lse @" << c.off_of(s.v.lse)
     << "}";
  return os.str();
}

inline DType draw_dtype(Rng& r) { return r.pick({DType::kF32, DType::kF16, DType::kBF16}); }
inline LseBase draw_base(Rng& r) { return r.pick({LseBase::kNatural, LseBase::kBase2}); }

/// A valid state of the given shape inside the arena: contiguous (often through
/// `make_state_view`), padded, head-major o or LSE, or (inputs) broadcast over tokens.
inline StateArg make_state(Ctx& c, const std::string& name, i64 tokens, i64 heads, i64 dim,
                           bool output, DType dt, LseBase base) {
  StateArg s;
  s.name = name;
  s.output = output;
  Rng& r = c.rng;
  StateView& v = s.v;
  const bool factory = r.coin(30);
  if (factory) {
    v = attnstate::make_state_view(nullptr, dt, nullptr, tokens, heads, dim, base, c.space);
  } else {
    v.tokens = tokens;
    v.heads = heads;
    v.head_dim = dim;
    v.dtype = dt;
    v.base = base;
    v.space = c.space;
    const i64 pad = r.coin(30) ? r.range(1, 3) : 0;
    if (r.coin(15)) {  // head-major o
      v.o_stride_token = dim + pad;
      v.o_stride_head = tokens * v.o_stride_token + (r.coin(50) ? r.range(0, 2) : 0);
    } else {
      v.o_stride_head = dim + pad;
      v.o_stride_token = heads * v.o_stride_head + (r.coin(30) ? r.range(0, 3) : 0);
    }
    v.lse_stride_head = r.coin(20) ? r.range(1, 3) : 1;
    v.lse_stride_token = heads * v.lse_stride_head + (r.coin(20) ? r.range(0, 2) : 0);
    if (!output && r.coin(10)) {  // one state broadcast over every token
      v.o_stride_token = 0;
      v.lse_stride_token = 0;
    }
  }
  if (r.coin(20)) v = attnstate::with_head_major_lse(v, r.coin(50) ? 0 : tokens + r.range(0, 2));
  const i64 ob = small_o_span(v) * es(dt), lb = small_lse_span(v) * 4;
  const i64 o_off = c.alloc(name + ".o", ob, !output);
  const i64 l_off = c.alloc(name + ".lse", lb, !output);
  fill_values(c, o_off, ob, dt);
  fill_lses(c, l_off, lb / 4);
  v.o = c.ptr(o_off);
  v.lse = static_cast<float*>(c.ptr(l_off));
  if (tokens == 0 && r.coin(30)) {  // an empty view's pointers are never used
    v.o = r.coin(50) ? nullptr : c.wild();
    v.lse = r.coin(50) ? nullptr : static_cast<float*>(c.wild());
  }
  return s;
}

/// Marks the rows described by an output state writable (o too unless `lse_only`); with
/// `written`, only the rows of the tokens `t` with `written[t]` (a masked in-place update).
inline void allow_state(Ctx& c, const StateLayout& v, const void* o, const float* lse,
                        bool lse_only = false, const std::vector<bool>* written = nullptr) {
  for (i64 t = 0; t < v.tokens; ++t)
    for (i64 h = 0; h < v.heads; ++h) {
      if (written != nullptr && !(*written)[static_cast<std::size_t>(t)]) continue;
      if (!lse_only)
        c.allow(c.off_of(o) + (t * v.o_stride_token + h * v.o_stride_head) * es(v.dtype),
                v.head_dim * es(v.dtype));
      c.allow(c.off_of(lse) + (t * v.lse_stride_token + h * v.lse_stride_head) * 4, 4);
    }
}

/// Byte range `[lo, hi)` of a small state's o / lse.
struct Range {
  const void* p;
  i64 bytes;
};
inline Range o_range(const StateLayout& v, const void* o) {
  return {o, clamp128(static_cast<i128>(small_o_span(v)) * es(v.dtype))};
}
inline Range lse_range(const StateLayout& v, const void* lse) {
  return {lse, clamp128(static_cast<i128>(small_lse_span(v)) * 4)};
}
inline bool overlap(Range a, Range b) {
  if (a.p == nullptr || b.p == nullptr || a.bytes <= 0 || b.bytes <= 0) return false;
  const auto x = reinterpret_cast<std::uintptr_t>(a.p), y = reinterpret_cast<std::uintptr_t>(b.p);
  return x < y + static_cast<std::uint64_t>(b.bytes) && y < x + static_cast<std::uint64_t>(a.bytes);
}

/// The shape fields a mismatch mutation may change.
inline const char* const kShapeFields[3] = {"tokens", "heads", "head_dim"};

/// One hard mutation of the layout or pointers of a state-like argument (a state view or a
/// stack: `L` has StateLayout's fields, `o`/`lse` the pointers). `peers` are the arguments whose
/// shape must equal this one's (a mismatch may be reported on them). Returns false when the
/// drawn mutation does not apply (the caller draws again).
template <class L, class OPtr, class LPtr>
bool mutate_layout(Ctx& c, const std::string& n, L& v, OPtr& o, LPtr& lse, bool output,
                   const std::vector<std::string>& peers, bool o_unused = false,
                   bool lse_optional = false) {
  Rng& r = c.rng;
  const auto peer_names = [&](const char* field) {
    std::vector<std::string> out{n + "." + field};
    for (const auto& p : peers) out.push_back(p + "." + field);
    return out;
  };
  const int k = static_cast<int>(r.range(0, 13));
  // one mutation per argument and kind of field, so that two never cancel
  static const char* const kKeys[14] = {"tokens", "heads", "head_dim", "stride", "stride",
                                        "tokens", "heads", "head_dim", "ptr",    "ptr",
                                        "dtype",  "base",  "space",    "stride"};
  if (!c.touch(n + "#" + kKeys[k])) return false;
  // o-only mutations of a view whose o is never touched (mark_empty_rows) are not errors.
  const auto hard_or_soft = [&](bool is_o, const std::string& what, std::vector<std::string> b,
                                bool structural = true) {
    if (is_o && o_unused) {
      c.uncertain = true;
      c.note("soft (o unused): " + what);
      for (auto& x : b) c.blame.push_back(std::move(x));  // a library may still name it
    } else {
      c.reject(what, std::move(b), structural);
    }
  };
  switch (k) {
    case 0:
      v.tokens = r.pick<i64>({-1, -7, kI64Min, -k2p62});
      c.reject(n + ".tokens = " + str(v.tokens), peer_names("tokens"));
      return true;
    case 1:
      v.heads = r.pick<i64>({0, -1, kI64Min});
      c.reject(n + ".heads = " + str(v.heads), peer_names("heads"));
      return true;
    case 2:
      v.head_dim = r.pick<i64>({0, -1, kI64Min});
      c.reject(n + ".head_dim = " + str(v.head_dim), peer_names("head_dim"));
      return true;
    case 3: {
      const int f = static_cast<int>(r.range(0, 3));
      const i64 x = r.pick<i64>({-1, -16, kI64Min});
      const char* names[4] = {"o_stride_token", "o_stride_head", "lse_stride_token",
                              "lse_stride_head"};
      i64* fields[4] = {&v.o_stride_token, &v.o_stride_head, &v.lse_stride_token,
                        &v.lse_stride_head};
      *fields[f] = x;
      hard_or_soft(f < 2, n + "." + names[f] + " = " + str(x), {n + "." + names[f]});
      return true;
    }
    case 4: {  // a stride past 2^62 on a dimension of extent >= 2: the span overflows
      const i64 x = r.pick<i64>({k2p62, k2p62 + 1, kI64Max});
      const int f = static_cast<int>(r.range(0, 3));
      const bool tok = f % 2 == 0;
      if (tok ? v.tokens < 2 : (v.heads < 2 || v.tokens < 1)) return false;
      const char* names[4] = {"o_stride_token", "o_stride_head", "lse_stride_token",
                              "lse_stride_head"};
      i64* fields[4] = {&v.o_stride_token, &v.o_stride_head, &v.lse_stride_token,
                        &v.lse_stride_head};
      *fields[f] = x;
      hard_or_soft(f < 2, n + "." + names[f] + " = " + str(x), {n + "." + names[f]});
      return true;
    }
    case 5: {  // tokens past 2^62: with a token stride >= 1 the span overflows
      if (v.tokens < 1) return false;
      v.tokens = r.pick<i64>({k2p62 + 1, kI64Max, k2p62 + (i64{1} << 40)});
      auto b = peer_names("tokens");
      if (v.o_stride_token == 0) v.o_stride_token = 1, b.push_back(n + ".o_stride_token");
      if (v.lse_stride_token == 0) v.lse_stride_token = 1, b.push_back(n + ".lse_stride_token");
      c.reject(n + ".tokens = " + str(v.tokens), b);
      return true;
    }
    case 6: {  // heads past 2^62
      if (v.tokens < 1) return false;
      v.heads = r.pick<i64>({k2p62 + 1, kI64Max});
      auto b = peer_names("heads");
      if (v.o_stride_head == 0) v.o_stride_head = 1, b.push_back(n + ".o_stride_head");
      if (v.lse_stride_head == 0) v.lse_stride_head = 1, b.push_back(n + ".lse_stride_head");
      c.reject(n + ".heads = " + str(v.heads), b);
      return true;
    }
    case 7: {  // head_dim past 2^62: one row's span overflows
      if (v.tokens < 1) return false;
      v.head_dim = r.pick<i64>({k2p62 + 1, kI64Max});
      hard_or_soft(true, n + ".head_dim = " + str(v.head_dim), peer_names("head_dim"));
      return true;
    }
    case 8:
      if (v.tokens < 1) return false;
      if (r.coin(50)) {
        o = nullptr;
        hard_or_soft(true, n + ".o = null", {n + ".o"}, false);
      } else {
        lse = nullptr;
        if (lse_optional) {
          c.note(n + ".lse = null (an output without an LSE: valid, nothing written there)");
        } else {
          c.reject(n + ".lse = null", {n + ".lse"}, false);
        }
      }
      return true;
    case 9: {  // misaligned by a few bytes (inside the arena)
      if (v.tokens < 1 || o == nullptr || lse == nullptr) return false;
      if (r.coin(50)) {
        const i64 e = es(v.dtype);
        if (e < 2) return false;
        o = reinterpret_cast<OPtr>(reinterpret_cast<std::uintptr_t>(o) + r.range(1, e - 1));
        hard_or_soft(true, n + ".o misaligned", {n + ".o"}, false);
      } else {
        lse = reinterpret_cast<LPtr>(reinterpret_cast<std::uintptr_t>(lse) + r.range(1, 3));
        c.reject(n + ".lse misaligned", {n + ".lse"}, false);
      }
      return true;
    }
    case 10:
      v.dtype = static_cast<DType>(r.range(5, 255));
      hard_or_soft(true, n + ".dtype = " + str(static_cast<int>(v.dtype)), {n + ".dtype"});
      return true;
    case 11:
      v.base = static_cast<LseBase>(r.range(2, 255));
      c.reject(n + ".base = " + str(static_cast<int>(v.base)), {n + ".base"});
      return true;
    case 12:
      v.space = r.coin(70) ? c.other_space() : static_cast<MemorySpace>(r.range(2, 255));
      c.reject(n + ".space = " + str(static_cast<int>(v.space)), {n + ".space"});
      return true;
    case 13: {  // an output whose rows overlap
      if (!output) return false;
      if (v.heads >= 2 && v.tokens >= 1 && v.head_dim >= 1 && v.head_dim <= 64 && r.coin(50)) {
        if (r.coin(50) || o_unused) {
          v.lse_stride_head = 0;
          c.reject(n + ".lse_stride_head = 0 (rows overlap)",
                   {n + ".lse_stride_head", n + ".lse_stride_token"});
        } else {
          v.o_stride_head = r.range(0, v.head_dim - 1);
          c.reject(n + ".o_stride_head = " + str(v.o_stride_head) + " < head_dim",
                   {n + ".o_stride_head", n + ".o_stride_token"});
        }
        return true;
      }
      if (v.tokens >= 2) {
        v.lse_stride_token = 0;
        v.lse_stride_head = std::min<i64>(v.lse_stride_head, 1);
        c.reject(n + ".lse_stride_token = 0 (rows overlap)",
                 {n + ".lse_stride_token", n + ".lse_stride_head"});
        return true;
      }
      return false;
    }
  }
  return false;
}

inline bool mutate_state(Ctx& c, StateArg& s, const std::vector<std::string>& peers,
                         bool o_unused = false) {
  void* o = s.v.o;
  float* lse = s.v.lse;
  const bool ok = mutate_layout(c, s.name, s.v, o, lse, s.output, peers, o_unused, s.lse_optional);
  s.v.o = o;
  s.v.lse = lse;
  return ok;
}

/// A shape mismatch: one field of `s` changed to another small value.
inline bool mutate_mismatch(Ctx& c, StateArg& s, const std::vector<std::string>& peers,
                            int field = -1) {
  Rng& r = c.rng;
  const int f = field >= 0 ? field : static_cast<int>(r.range(0, 2));
  i64* x = f == 0 ? &s.v.tokens : f == 1 ? &s.v.heads : &s.v.head_dim;
  const i64 old = *x;
  // always upwards, so two mismatches of one field never cancel; the view may then extend past
  // its buffer, which a library rejecting the mismatch never reads
  if (old > 64 || old < (f == 0 ? 0 : 1) || !c.touch(s.name + "#" + kShapeFields[f])) return false;
  *x = old + r.range(1, 2);
  std::vector<std::string> b{s.name + "." + kShapeFields[f], s.name + ".o", s.name + ".lse"};
  for (const auto& p : peers) b.push_back(p + "." + kShapeFields[f]), b.push_back(p);
  // a view whose rows then overlap (its stride no longer fits) may be reported as such
  b.push_back(s.name + ".o_stride");
  b.push_back(s.name + ".lse_stride");
  c.reject(s.name + "." + kShapeFields[f] + " " + str(old) + " -> " + str(*x) + " (mismatch)", b);
  return true;
}

/// Moves `out.o` or `out.lse` onto the buffer `target` (an input of `target_bytes` bytes at
/// `target`) at an aligned offset. Hard when the ranges then overlap, unless `exact_ok` and the
/// placement is an exact alias (which the caller decides).
inline bool mutate_overlap(Ctx& c, StateArg& out, const std::string& target_name,
                           const void* target, i64 target_bytes) {
  if (target == nullptr || target_bytes <= 0 || out.v.tokens < 1) return false;
  if (!c.touch(out.name + "#ptr")) return false;
  Rng& r = c.rng;
  const bool on_o = r.coin(60);
  const i64 align = on_o ? es(out.v.dtype) : 4;
  const i64 delta = r.range(0, std::max<i64>(0, target_bytes / align - 1)) * align;
  const void* p = reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(target) + delta);
  const Range mine = on_o ? o_range(out.v, p) : lse_range(out.v, p);
  if (!c.in_arena(p, mine.bytes)) return false;
  if (on_o)
    out.v.o = const_cast<void*>(p);
  else
    out.v.lse = static_cast<float*>(const_cast<void*>(p));
  c.reject(out.name + (on_o ? ".o" : ".lse") + " placed at " + target_name + "+" + str(delta),
           {out.name, target_name}, false);
  return true;
}

/// Replaces data pointers of a call that must be rejected by wild ones (never dereferenced by a
/// library that validates first). Tables (indptrs, page ids, lengths, masks) are read by the
/// checks themselves, so only o/lse/q/k/v pointers go wild.
inline void maybe_wild(Ctx& c, const std::vector<std::function<void(void*)>>& setters) {
  if (!c.structural_reject || setters.empty() || !c.rng.coin(30)) return;
  const auto i = static_cast<std::size_t>(c.rng.range(0, static_cast<i64>(setters.size()) - 1));
  setters[i](c.wild());
  c.note("wild data pointer #" + std::to_string(i));
}

// ---------------------------------------------------------------------------------------------
// Tensor arguments.

struct TensorArg {
  std::string name;
  ConstTensorView t;
};

/// A valid tensor of the given shape inside the arena (row-major, sometimes padded; sometimes
/// through `make_tensor_view`).
inline TensorArg make_tensor(Ctx& c, const std::string& name, std::vector<i64> shape, DType dt) {
  TensorArg a;
  a.name = name;
  ConstTensorView& t = a.t;
  const int rank = static_cast<int>(shape.size());
  bool contiguous = c.rng.coin(40);
  if (contiguous && rank == 3) {
    t = attnstate::make_tensor_view(nullptr, dt, {shape[0], shape[1], shape[2]}, c.space);
  } else if (contiguous && rank == 4) {
    t = attnstate::make_tensor_view(nullptr, dt, {shape[0], shape[1], shape[2], shape[3]}, c.space);
  } else {
    t.dtype = dt;
    t.space = c.space;
    t.rank = rank;
    i64 s = 1;
    for (int i = rank - 1; i >= 0; --i) {
      t.shape[i] = shape[static_cast<std::size_t>(i)];
      t.stride[i] = s;
      s = s * t.shape[i] + (i < rank - 1 && c.rng.coin(25) ? c.rng.range(1, 3) : 0);
      if (i == rank - 1 && c.rng.coin(20)) s += c.rng.range(1, 3);
    }
  }
  i64 span = 1;
  bool empty = false;
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] == 0) empty = true;
    span += (t.shape[i] - 1) * t.stride[i];
  }
  const i64 bytes = empty ? 0 : span * es(dt);
  const i64 off = c.alloc(name, bytes, true);
  fill_values(c, off, bytes, dt);
  t.data = c.ptr(off);
  if (empty && c.rng.coin(30)) t.data = c.rng.coin(50) ? nullptr : c.wild();
  return a;
}

inline i64 tensor_bytes_small(const ConstTensorView& t) {
  i128 span = 1;
  for (int i = 0; i < std::min(std::max(t.rank, 0), 4); ++i) {
    if (t.shape[i] <= 0) return 0;
    span += static_cast<i128>(t.shape[i] - 1) * std::max<i64>(0, t.stride[i]);
  }
  return clamp128(span * es(t.dtype));
}

/// One hard mutation of a tensor argument. `peers[i]` names arguments whose dimension `i` is
/// tied to this one's (a mismatch may be reported there, e.g. "kv.batch" for q's dimension 0).
inline bool mutate_tensor(Ctx& c, TensorArg& a,
                          const std::vector<std::vector<std::string>>& peers) {
  Rng& r = c.rng;
  ConstTensorView& t = a.t;
  const std::string& n = a.name;
  if (t.rank < 1 || t.rank > 4) return false;
  const int d = static_cast<int>(r.range(0, t.rank - 1));
  const std::string ds = "[" + std::to_string(d) + "]";
  bool nonempty = true;
  for (int i = 0; i < t.rank; ++i) nonempty = nonempty && t.shape[i] > 0;
  auto dim_blame = [&]() {
    std::vector<std::string> b{n + ".shape" + ds};
    if (static_cast<std::size_t>(d) < peers.size())
      for (const auto& p : peers[static_cast<std::size_t>(d)]) b.push_back(p);
    return b;
  };
  const int k = static_cast<int>(r.range(0, 9));
  static const char* const kKeys[10] = {"shape", "shape", "stride", "stride", "stride",
                                        "ptr",   "ptr",   "dtype",  "space",  "rank"};
  if (!c.touch(n + "#" + kKeys[k] + (k < 5 ? ds : ""))) return false;
  switch (k) {
    case 0:
      t.shape[d] = r.pick<i64>({-1, kI64Min});
      c.reject(n + ".shape" + ds + " = " + str(t.shape[d]), dim_blame());
      return true;
    case 1: {  // an extent past 2^62 (its stride >= 1): the span overflows
      if (!nonempty) return false;
      t.shape[d] = r.pick<i64>({k2p62 + 1, kI64Max});
      auto b = dim_blame();
      if (t.stride[d] == 0) t.stride[d] = 1, b.push_back(n + ".stride" + ds);
      c.reject(n + ".shape" + ds + " = " + str(t.shape[d]), b);
      return true;
    }
    case 2:
      if (!nonempty || t.shape[d] < 2 || d == t.rank - 1) return false;
      t.stride[d] = r.pick<i64>({k2p62, kI64Max});
      c.reject(n + ".stride" + ds + " = " + str(t.stride[d]), {n + ".stride" + ds});
      return true;
    case 3:
      t.stride[d] = r.pick<i64>({-1, kI64Min});
      c.reject(n + ".stride" + ds + " = " + str(t.stride[d]), {n + ".stride" + ds});
      return true;
    case 4:
      if (!nonempty || t.shape[t.rank - 1] < 2) return false;
      t.stride[t.rank - 1] = r.pick<i64>({0, 2, 3});
      c.reject(n + ".stride[last] = " + str(t.stride[t.rank - 1]),
               {n + ".stride[" + std::to_string(t.rank - 1) + "]"});
      return true;
    case 5:
      if (!nonempty) return false;
      t.data = nullptr;
      c.reject(n + ".data = null", {n + ".data", n}, false);
      return true;
    case 6:
      if (!nonempty || es(t.dtype) < 2 || t.data == nullptr) return false;
      t.data = reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(t.data) + 1);
      c.reject(n + ".data misaligned", {n + ".data"}, false);
      return true;
    case 7:
      t.dtype = static_cast<DType>(r.range(5, 255));
      c.reject(n + ".dtype = " + str(static_cast<int>(t.dtype)), {n + ".dtype"});
      return true;
    case 8:
      t.space = r.coin(70) ? c.other_space() : static_cast<MemorySpace>(r.range(2, 255));
      c.reject(n + ".space = " + str(static_cast<int>(t.space)), {n + ".space"});
      return true;
    case 9: {
      const int old = t.rank;
      t.rank = static_cast<int>(r.pick<i64>({0, -1, 5, 1000, old - 1, old + 1}));
      if (t.rank == old) return false;
      c.reject(n + ".rank = " + std::to_string(t.rank), {n + ".rank", n});
      return true;
    }
  }
  return false;
}

inline std::string describe(const TensorArg& a, const Ctx& c) {
  std::ostringstream os;
  os << a.name << "{rank " << a.t.rank << ", shape (";
  for (int i = 0; i < 4; ++i) os << (i ? ", " : "") << a.t.shape[i];
  os << "), stride (";
  for (int i = 0; i < 4; ++i) os << (i ? ", " : "") << a.t.stride[i];
  os << "), dtype " << static_cast<int>(a.t.dtype) << ", space " << static_cast<int>(a.t.space)
     << ", data @" << c.off_of(a.t.data) << "}";
  return os.str();
}

// ---------------------------------------------------------------------------------------------
// Index arrays.

inline i64 alloc_i32(Ctx& c, const std::string& name, const std::vector<std::int32_t>& xs) {
  const i64 off = c.alloc(name, static_cast<i64>(xs.size()) * 4, true);
  for (std::size_t i = 0; i < xs.size(); ++i) c.put(off + 4 * static_cast<i64>(i), xs[i]);
  return off;
}

// ---------------------------------------------------------------------------------------------
// The oracle.

/// Checks a caught `attnstate::Error` against the case: status, message form, blamed argument.
/// Returns "" when it is acceptable.
inline std::string check_error(const Ctx& c, const attnstate::Error& e, const std::string& func,
                               bool any_func_prefix = false) {
  const attnstate::Status st = e.status();
  const std::string msg = e.what();
  if (st != attnstate::Status::kInvalidArgument && st != attnstate::Status::kNotSupported &&
      st != attnstate::Status::kWorkspaceTooSmall)
    return std::string("status ") + attnstate::to_string(st) + " (" + msg + ")";
  const std::string head = func + ": argument '";
  const std::size_t start = any_func_prefix ? msg.find(": argument '") : 0;
  if (any_func_prefix ? (msg.rfind(func, 0) != 0 || start == std::string::npos)
                      : msg.rfind(head, 0) != 0)
    return "message does not start with \"" + head + "\": " + msg;
  const std::size_t name_begin = msg.find('\'', start) + 1;
  const std::size_t name_end = msg.find("': expected ", name_begin);
  if (name_end == std::string::npos) return "message without \"': expected \": " + msg;
  if (msg.find(", got ", name_end) == std::string::npos)
    return "message without \", got \": " + msg;
  const std::string name = msg.substr(name_begin, name_end - name_begin);
  if (!c.expect_reject) {
    if (c.uncertain) return "";
    return "rejected a call the fuzzer believes valid: " + msg;
  }
  for (const std::string& b : c.blame) {
    if (name == b) return "";
    if (name.size() > b.size() && name.compare(0, b.size(), b) == 0 &&
        (name[b.size()] == '.' || name[b.size()] == '[' || name[b.size()] == '_'))
      return "";
  }
  std::string bl;
  for (const auto& b : c.blame) bl += (bl.empty() ? "" : ", ") + b;
  return "named argument '" + name + "', not one the mutations broke {" + bl + "}: " + msg;
}

/// Compares the arena after a call with its snapshot. `returned`: the call returned (writes in
/// the allowed bytes are fine); else it threw (nothing may have changed).
inline std::string check_arena(const Ctx& c, const std::vector<std::uint8_t>& before,
                               const std::uint8_t* after, bool returned) {
  std::string out;
  int shown = 0;
  i64 count = 0;
  for (i64 i = 0; i < c.size(); ++i) {
    if (after[i] == before[static_cast<std::size_t>(i)]) continue;
    if (returned && c.allowed(i)) continue;
    ++count;
    if (shown < 4) {
      out += (shown ? "; " : "") + c.where(i);
      ++shown;
    }
  }
  if (count == 0) return "";
  return std::string(returned ? "wrote outside its outputs: " : "threw after writing: ") +
         str(count) + " bytes, e.g. " + out;
}

inline std::string case_log(const Ctx& c) {
  std::string s;
  for (const auto& l : c.log) s += "\n  " + l;
  return s;
}

/// A case's seed and mutation count (0 in about 30% of cases: valid calls), drawn by RapidCheck
/// so that a failure shrinks to fewer mutations.
struct Draw {
  std::uint64_t seed;
  int nmut;
};
inline Draw draw() {
  Draw d;
  d.seed = *rc::gen::arbitrary<std::uint64_t>();
  d.nmut = *rc::gen::weightedElement<int>({{30, 0}, {45, 1}, {15, 2}, {10, 3}});
  return d;
}

}  // namespace attnstate_fuzz
