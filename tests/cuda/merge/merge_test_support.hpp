/// @file merge_test_support.hpp
/// @brief Helpers of the CUDA merge tests: states held on the host and mirrored on the device
///        (any dtype, base and strides), random fills, and tolerance comparisons against the
///        CPU reference.
#pragma once

// cuda_runtime.h (not only cuda_runtime_api.h) for the typed cudaMalloc that DeviceBuffer uses.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/state_view.hpp"
#include "cuda_test_utils.hpp"

namespace attnstate {
namespace cuda {
namespace detail {
/// Test hook defined in src/cuda/merge_states.cu: true when `merge_states(states, out)` runs a
/// fast kernel (not the general one) on the current device.
bool merge_states_fast_path(const ConstStateStackView& states, const StateView& out);
/// Test hook defined in src/cuda/merge.cu: true when `merge_state(a, b, out)` (or the in-place
/// merge of `out` with `b`, `a` being `out`) runs the whole-row kernel, not the general one.
bool merge_state_whole_path(const ConstStateView& a, const ConstStateView& b, const StateView& out);
}  // namespace detail
}  // namespace cuda
}  // namespace attnstate

namespace attnstate_test {

using attnstate::ConstStateStackView;
using attnstate::ConstStateView;
using attnstate::DType;
using attnstate::LseBase;
using attnstate::MemorySpace;
using attnstate::StackOrder;
using attnstate::StateLayout;
using attnstate::StateView;

/// The three dtypes of `o`.
inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> v = {DType::kF32, DType::kF16, DType::kBF16};
  return v;
}

/// A random engine seeded freshly for each test; the seed is printed on failure.
class Rng {
 public:
  Rng() : Rng(std::random_device{}()) {}
  /// A deterministic engine (e.g. seeded by a property-test generator).
  explicit Rng(std::uint64_t seed) : seed_(seed), gen_(seed) {}
  /// The seed, for failure messages.
  std::uint64_t seed() const { return seed_; }
  /// Uniform in [lo, hi).
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(gen_); }
  /// Uniform integer in [lo, hi].
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(gen_);
  }
  /// True with probability p.
  bool chance(double p) { return std::bernoulli_distribution(p)(gen_); }
  /// A random base.
  LseBase base() { return chance(0.5) ? LseBase::kBase2 : LseBase::kNatural; }

 private:
  std::uint64_t seed_;
  std::mt19937_64 gen_;
};

/// Stores `x` rounded to `dt` at element `i` of `p`.
inline void store_elem(void* p, DType dt, std::int64_t i, float x) {
  switch (dt) {
    case DType::kF32:
      static_cast<float*>(p)[i] = x;
      break;
    case DType::kF16:
      static_cast<attnstate::half_t*>(p)[i] = attnstate::from_float<attnstate::half_t>(x);
      break;
    case DType::kBF16:
      static_cast<attnstate::bfloat16_t*>(p)[i] = attnstate::from_float<attnstate::bfloat16_t>(x);
      break;
    case DType::kE4M3:
      static_cast<attnstate::float8_e4m3_t*>(p)[i] =
          attnstate::from_float<attnstate::float8_e4m3_t>(x);
      break;
    case DType::kE5M2:
      static_cast<attnstate::float8_e5m2_t*>(p)[i] =
          attnstate::from_float<attnstate::float8_e5m2_t>(x);
      break;
  }
}
/// Element `i` of `p` (of dtype `dt`) as float.
inline float load_elem(const void* p, DType dt, std::int64_t i) {
  switch (dt) {
    case DType::kF16:
      return attnstate::to_float(static_cast<const attnstate::half_t*>(p)[i]);
    case DType::kBF16:
      return attnstate::to_float(static_cast<const attnstate::bfloat16_t*>(p)[i]);
    case DType::kE4M3:
      return attnstate::to_float(static_cast<const attnstate::float8_e4m3_t*>(p)[i]);
    case DType::kE5M2:
      return attnstate::to_float(static_cast<const attnstate::float8_e5m2_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

/// Host bytes with a device mirror of the same size.
struct Blob {
  std::vector<unsigned char> host;
  DeviceBuffer<unsigned char> dev;
  explicit Blob(std::size_t bytes = 0) : host(bytes), dev(bytes) {}
  void upload() { dev.upload(host); }
  void download() { host = dev.download(); }
};

/// Extra elements between rows, to build strided views.
struct Padding {
  std::int64_t head = 0;       ///< Extra `o` elements after each head.
  std::int64_t token = 0;      ///< Extra `o` elements after each token.
  std::int64_t lse_head = 0;   ///< Extra LSE elements after each head.
  std::int64_t lse_token = 0;  ///< Extra LSE elements after each token.
};

/// A state `(tokens, heads, head_dim)` on the host and on the device, same layout on both.
class TestState {
 public:
  TestState(std::int64_t tokens, std::int64_t heads, std::int64_t head_dim, DType dtype,
            LseBase base, Padding pad = {})
      : pad_(pad) {
    layout_.tokens = tokens;
    layout_.heads = heads;
    layout_.head_dim = head_dim;
    layout_.o_stride_head = head_dim + pad.head;
    layout_.o_stride_token = heads * layout_.o_stride_head + pad.token;
    layout_.lse_stride_head = 1 + pad.lse_head;
    layout_.lse_stride_token = heads * layout_.lse_stride_head + pad.lse_token;
    layout_.dtype = dtype;
    layout_.base = base;
    o_ = Blob(static_cast<std::size_t>(std::max<std::int64_t>(tokens, 1) * layout_.o_stride_token) *
              attnstate::size_of(dtype));
    lse_ = Blob(
        static_cast<std::size_t>(std::max<std::int64_t>(tokens, 1) * layout_.lse_stride_token) * 4);
    fill_nan();
  }

  TestState(const TestState&) = delete;
  TestState& operator=(const TestState&) = delete;
  TestState(TestState&&) = default;

  /// A copy of the host data and layout, uploaded to a fresh device mirror.
  TestState clone() const {
    TestState c(tokens(), heads(), head_dim(), dtype(), base(), pad_);
    c.o_.host = o_.host;
    c.lse_.host = lse_.host;
    c.upload();
    return c;
  }

  const StateLayout& layout() const { return layout_; }
  std::int64_t tokens() const { return layout_.tokens; }
  std::int64_t heads() const { return layout_.heads; }
  std::int64_t head_dim() const { return layout_.head_dim; }
  DType dtype() const { return layout_.dtype; }
  LseBase base() const { return layout_.base; }

  float o(std::int64_t t, std::int64_t h, std::int64_t d) const {
    return load_elem(o_.host.data(), layout_.dtype, layout_.o_offset(t, h) + d);
  }
  void set_o(std::int64_t t, std::int64_t h, std::int64_t d, float x) {
    store_elem(o_.host.data(), layout_.dtype, layout_.o_offset(t, h) + d, x);
  }
  float lse(std::int64_t t, std::int64_t h) const { return lse_ptr()[layout_.lse_offset(t, h)]; }
  void set_lse(std::int64_t t, std::int64_t h, float x) { lse_ptr()[layout_.lse_offset(t, h)] = x; }

  /// Random `o` in [-1, 1) and LSEs in [lse_lo, lse_hi); each row empty with `p_empty` (its
  /// `o` then holds NaN, which must never be read).
  void fill_random(Rng& rng, float lse_lo = -8.f, float lse_hi = 8.f, double p_empty = 0.0) {
    fill_nan();  // padding stays NaN
    for (std::int64_t t = 0; t < tokens(); ++t) {
      for (std::int64_t h = 0; h < heads(); ++h) {
        const bool empty = rng.chance(p_empty);
        set_lse(t, h, empty ? -INFINITY : rng.uniform(lse_lo, lse_hi));
        for (std::int64_t d = 0; d < head_dim(); ++d)
          set_o(t, h, d, empty ? NAN : rng.uniform(-1.f, 1.f));
      }
    }
    upload();
  }
  /// Every byte 0xFF (NaN) on the host.
  void fill_nan() {
    std::memset(o_.host.data(), 0xFF, o_.host.size());
    std::memset(lse_.host.data(), 0xFF, lse_.host.size());
  }
  void upload() {
    o_.upload();
    lse_.upload();
  }
  void download() {
    o_.download();
    lse_.download();
  }
  /// Fills the device copy with NaN (0xFF bytes).
  void poison_device() {
    o_.dev.poison();
    lse_.dev.poison();
  }

  StateView host_view() { return view(o_.host.data(), lse_ptr(), MemorySpace::kHost); }
  StateView dev_view() {
    return view(o_.dev.get(), reinterpret_cast<float*>(lse_.dev.get()), MemorySpace::kDevice);
  }

 private:
  float* lse_ptr() { return reinterpret_cast<float*>(lse_.host.data()); }
  const float* lse_ptr() const { return reinterpret_cast<const float*>(lse_.host.data()); }
  StateView view(void* o, float* lse, MemorySpace space) {
    StateView v;
    static_cast<StateLayout&>(v) = layout_;
    v.o = o;
    v.lse = lse;
    v.space = space;
    return v;
  }

  Padding pad_;
  StateLayout layout_;
  Blob o_;
  Blob lse_;
};

/// A stack `(tokens, S, heads, head_dim)` in one of the two layouts, host and device: dense, or
/// with `head_pad` unused elements after each head's `o`, or with `o` starting `o_shift` elements
/// into its buffer (so not 16-byte aligned for a shift of 1). Unused elements hold NaN.
class TestStack {
 public:
  TestStack(StackOrder order, std::int64_t tokens, std::int64_t states, std::int64_t heads,
            std::int64_t head_dim, DType dtype, LseBase base, std::int64_t head_pad = 0,
            std::int64_t o_shift = 0)
      : order_(order),
        tokens_(tokens),
        states_(states),
        heads_(heads),
        head_dim_(head_dim),
        head_pad_(head_pad),
        o_shift_(o_shift),
        dtype_(dtype),
        base_(base),
        o_(static_cast<std::size_t>(tokens * states * heads * (head_dim + head_pad) + o_shift) *
           attnstate::size_of(dtype)),
        lse_(static_cast<std::size_t>(tokens * states * heads) * 4) {
    if (head_pad > 0 || o_shift > 0) std::memset(o_.host.data(), 0xFF, o_.host.size());
  }

  ConstStateStackView host_view() const {
    return make(o_.host.data(), lse_.host.data(), MemorySpace::kHost);
  }
  ConstStateStackView dev_view() const {
    return make(o_.dev.get(), lse_.dev.get(), MemorySpace::kDevice);
  }

  std::int64_t o_index(std::int64_t t, std::int64_t s, std::int64_t h, std::int64_t d) const {
    const ConstStateStackView v = host_view();
    return o_shift_ + t * v.o_stride_token + s * v.o_stride_state + h * v.o_stride_head + d;
  }
  std::int64_t lse_index(std::int64_t t, std::int64_t s, std::int64_t h) const {
    const ConstStateStackView v = host_view();
    return t * v.lse_stride_token + s * v.lse_stride_state + h * v.lse_stride_head;
  }
  void set_o(std::int64_t t, std::int64_t s, std::int64_t h, std::int64_t d, float x) {
    store_elem(o_.host.data(), dtype_, o_index(t, s, h, d), x);
  }
  void set_lse(std::int64_t t, std::int64_t s, std::int64_t h, float x) {
    reinterpret_cast<float*>(lse_.host.data())[lse_index(t, s, h)] = x;
  }
  /// Random states as in `TestState::fill_random`.
  void fill_random(Rng& rng, float lse_lo = -8.f, float lse_hi = 8.f, double p_empty = 0.0) {
    for (std::int64_t t = 0; t < tokens_; ++t)
      for (std::int64_t s = 0; s < states_; ++s)
        for (std::int64_t h = 0; h < heads_; ++h) {
          const bool empty = rng.chance(p_empty);
          set_lse(t, s, h, empty ? -INFINITY : rng.uniform(lse_lo, lse_hi));
          for (std::int64_t d = 0; d < head_dim_; ++d)
            set_o(t, s, h, d, empty ? NAN : rng.uniform(-1.f, 1.f));
        }
    upload();
  }
  void upload() {
    o_.upload();
    lse_.upload();
  }

 private:
  ConstStateStackView make(const void* o, const void* lse, MemorySpace space) const {
    ConstStateStackView v =
        attnstate::make_state_stack(o, dtype_, static_cast<const float*>(lse), order_, tokens_,
                                    states_, heads_, head_dim_, base_, space);
    const std::int64_t row = head_dim_ + head_pad_;  // o elements per head, padding included
    v.o = static_cast<const unsigned char*>(o) +
          static_cast<std::size_t>(o_shift_) * attnstate::size_of(dtype_);
    v.o_stride_head = row;
    if (order_ == StackOrder::kTokensMajor) {
      v.o_stride_state = heads_ * row;
      v.o_stride_token = states_ * heads_ * row;
    } else {
      v.o_stride_token = heads_ * row;
      v.o_stride_state = tokens_ * heads_ * row;
    }
    return v;
  }
  StackOrder order_;
  std::int64_t tokens_, states_, heads_, head_dim_, head_pad_, o_shift_;
  DType dtype_;
  LseBase base_;
  Blob o_;
  Blob lse_;
};

/// Relative tolerance of an output rounded to `dt` (one unit in the last place, plus fp32
/// accumulation differences for f32).
inline float rel_tol(DType dt) {
  switch (dt) {
    case DType::kF16:
      return 1.f / 1024.f;
    case DType::kBF16:
      return 1.f / 128.f;
    case DType::kE4M3:  // one rounding of 3 mantissa bits
      return 1.f / 8.f;
    case DType::kE5M2:
      return 1.f / 4.f;
    default:
      return 2e-5f;
  }
}

/// True when `got` matches `want` within `atol + rtol |want|`, NaN matching NaN and infinities
/// matching exactly.
inline bool close(float got, float want, float atol, float rtol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) return got == want;
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

/// Compares every element of `got` (downloaded from the device) with `want` (the CPU
/// reference); reports the first few mismatches. LSEs compare in `want`'s base.
inline ::testing::AssertionResult states_close(const TestState& got, const TestState& want,
                                               float o_atol = 1e-5f) {
  const float rtol = rel_tol(got.dtype());
  int bad = 0;
  std::ostringstream msg;
  for (std::int64_t t = 0; t < want.tokens(); ++t) {
    for (std::int64_t h = 0; h < want.heads(); ++h) {
      const float lg = got.lse(t, h), lw = want.lse(t, h);
      if (!close(lg, lw, 1e-5f, 2e-6f)) {
        if (bad++ < 5) msg << "lse[" << t << "," << h << "]: got " << lg << " want " << lw << "\n";
      }
      for (std::int64_t d = 0; d < want.head_dim(); ++d) {
        const float og = got.o(t, h, d), ow = want.o(t, h, d);
        if (!close(og, ow, o_atol, rtol)) {
          if (bad++ < 5)
            msg << "o[" << t << "," << h << "," << d << "]: got " << og << " want " << ow << "\n";
        }
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " mismatches\n" << msg.str();
}

/// Poisons `got` on the device, runs `gpu(got's device view)` and `cpu(want's host view)`, and
/// compares the two (`states_close`).
template <class Gpu, class Cpu>
::testing::AssertionResult gpu_matches_cpu(TestState& got, TestState& want, Gpu&& gpu, Cpu&& cpu) {
  got.poison_device();
  gpu(got.dev_view());
  ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  got.download();
  cpu(want.host_view());
  return states_close(got, want);
}

/// True when `a` and `b` hold bitwise-identical rows (o and lse, padding ignored).
inline bool rows_bitwise_equal(const TestState& a, const TestState& b) {
  for (std::int64_t t = 0; t < a.tokens(); ++t)
    for (std::int64_t h = 0; h < a.heads(); ++h) {
      const float la = a.lse(t, h), lb = b.lse(t, h);
      if (std::memcmp(&la, &lb, 4) != 0) return false;
      for (std::int64_t d = 0; d < a.head_dim(); ++d) {
        const float oa = a.o(t, h, d), ob = b.o(t, h, d);
        if (std::memcmp(&oa, &ob, 4) != 0) return false;
      }
    }
  return true;
}

/// A short description of a dtype combination, for SCOPED_TRACE.
inline std::string describe(std::initializer_list<DType> dts) {
  std::string s;
  for (DType d : dts) s += std::string(s.empty() ? "" : "->") + attnstate::to_string(d);
  return s;
}

}  // namespace attnstate_test
