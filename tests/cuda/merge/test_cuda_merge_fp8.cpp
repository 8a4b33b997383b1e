/// @file test_cuda_merge_fp8.cpp
/// @brief The CUDA merges with an fp8 `o` (e4m3, e5m2) against the CPU merges on fresh random
///        inputs, the output poisoned first: every compiled dtype combination of `merge_state`,
///        `merge_state_inplace` (with and without a mask) and `merge_states` (both layouts,
///        aligned and not), scales 1, 2^-10, 2^8 and 0.37. The conversions and the identity are
///        compared bit for bit; merged fp8 outputs must be the CPU's encoding or an adjacent one
///        (the fp32 sums round differently on the two backends — a fused multiply-add on the
///        GPU — which can move a value across an fp8 rounding boundary), other outputs within the
///        tolerance of the other GPU merge tests. The dtype combinations that are not compiled,
///        and bad scales, get named errors (checked without a GPU: they throw before any launch).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cpu/merge.hpp"
#include "attnstate/cuda/merge.hpp"
#include "catalog/catalog.hpp"
#include "compiled_dims.hpp"
#include "cuda_test_utils.hpp"
#include "fp8_state.hpp"

namespace attnstate_test {
namespace {

namespace cpu = attnstate::cpu;
namespace gpu = attnstate::cuda;
namespace catalog = attnstate::catalog;
using attnstate::ConstStateStackView;
using attnstate::ConstStateView;
using attnstate::DType;
using attnstate::LseBase;
using attnstate::MemorySpace;
using attnstate::StackOrder;
using attnstate::StateView;
using attnstate::fp8_test::HostState;

const float kScales[] = {1.f, 0x1p-10f, 0x1p8f, 0.37f};
const std::vector<std::int64_t> kHeadDims = attnstate_test::merge_head_dims();
const DType kNonFp8[] = {DType::kF32, DType::kF16, DType::kBF16};
const DType kFp8[] = {DType::kE4M3, DType::kE5M2};

void sync() { ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize()); }

/// A host state with a device mirror (same layout, `o` shifted by `shift` elements on both).
struct DevState {
  HostState h;
  DeviceBuffer<std::uint8_t> o;
  DeviceBuffer<float> lse;
  DevState(std::int64_t tokens, std::int64_t heads, std::int64_t dim, DType dt, LseBase base,
           float scale)
      : h(tokens, heads, dim, dt, base, scale), o(h.o.size()), lse(h.lse.size()) {}
  void upload() {
    o.upload(h.o);
    lse.upload(h.lse);
  }
  void download() {
    h.o = o.download();
    h.lse = lse.download();
  }
  void poison() {
    o.poison();
    lse.poison();
  }
  StateView dev() {
    StateView v = h.view();
    v.o = o.get();
    v.lse = lse.get();
    v.space = MemorySpace::kDevice;
    return v;
  }
};

/// An fp8 encoding's position on the number line (adjacent encodings differ by one; ±0 are 0).
int ordinal(std::uint8_t b) { return (b & 0x80) ? -(b & 0x7F) : b; }

bool is_fp8_nan(DType dt, std::uint8_t b) {
  const int v = b & 0x7F;
  return dt == DType::kE4M3 ? v == 0x7F : v > 0x7C;
}

/// Relative tolerance of the non-fp8 outputs (one unit in the last place), as the other merge
/// tests.
double rel_tol(DType dt) {
  return dt == DType::kF16 ? 1.0 / 1024 : dt == DType::kBF16 ? 1.0 / 128 : 2e-5;
}

/// Compares the GPU output with the CPU's: LSEs within 1e-5 + 2e-6 |e|; an fp8 `o` the same
/// encoding or an adjacent one (NaN where NaN), another `o` within its ulp times the magnitude,
/// plus a few fp32 ulps of `amp`, the largest input magnitude: a weighted sum that cancels keeps
/// the absolute rounding error of its terms, and the two backends round the terms differently.
::testing::AssertionResult gpu_matches_cpu(const HostState& got, const HostState& want,
                                           double amp) {
  const DType dt = want.layout.dtype;
  int bad = 0;
  std::ostringstream msg;
  for (std::int64_t r = 0; r < want.rows(); ++r) {
    const float gl = got.lse[r], wl = want.lse[r];
    const bool lse_ok = std::isnan(wl)   ? std::isnan(gl)
                        : std::isinf(wl) ? gl == wl
                                         : std::fabs(gl - wl) <= 1e-5f + 2e-6f * std::fabs(wl);
    if (!lse_ok && bad++ < 5) msg << "lse[" << r << "]: got " << gl << " want " << wl << "\n";
    for (std::int64_t d = 0; d < want.dim(); ++d) {
      const std::int64_t i = r * want.dim() + d;
      bool ok;
      if (attnstate::is_fp8(dt)) {
        const std::uint8_t g = got.byte(i), w = want.byte(i);
        ok = is_fp8_nan(dt, w) ? is_fp8_nan(dt, g)
                               : !is_fp8_nan(dt, g) && std::abs(ordinal(g) - ordinal(w)) <= 1;
      } else {
        const double g = got.value(r, d), w = want.value(r, d);
        ok = std::isnan(w)
                 ? std::isnan(g)
                 : std::fabs(g - w) <= 1e-5 * (1 + std::fabs(w)) + rel_tol(dt) * std::fabs(w) +
                                           std::ldexp(amp, -21);
      }
      if (!ok && bad++ < 5)
        msg << "o[" << r << "," << d << "]: got " << got.value(r, d) << " want " << want.value(r, d)
            << "\n";
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " mismatches\n" << msg.str();
}

std::string describe(std::initializer_list<DType> dts, float scale, std::int64_t dim) {
  std::string s;
  for (DType d : dts) s += std::string(s.empty() ? "" : "->") + attnstate::to_string(d);
  return s + " scale " + std::to_string(scale) + " head_dim " + std::to_string(dim);
}

/// The (a, b, out) dtypes compiled with an fp8 `o`: one fp8 format, a and b of one dtype, or a of
/// out's dtype (kernels/merge/dispatch.cuh).
std::vector<std::vector<DType>> pair_combinations() {
  std::vector<std::vector<DType>> v;
  for (DType f : kFp8) {
    const std::vector<DType> with = {f, DType::kF32, DType::kF16, DType::kBF16};
    for (DType a : with)
      for (DType b : with)
        for (DType out : with) {
          const bool fp8 = a == f || b == f || out == f;
          if (fp8 && (a == b || a == out)) v.push_back({a, b, out});
        }
  }
  return v;
}

void check_pair(std::mt19937_64& gen, DType da, DType db, DType dout, float scale,
                std::int64_t dim) {
  SCOPED_TRACE(describe({da, db, dout}, scale, dim));
  DevState a(5, 3, dim, da, LseBase::kNatural, scale);
  DevState b(5, 3, dim, db, LseBase::kBase2, scale * 2.f);
  a.h.fill(gen, 100.f * scale);
  b.h.fill(gen, 100.f * scale);
  a.upload();
  b.upload();
  DevState got(5, 3, dim, dout, LseBase::kBase2, scale);
  HostState want(5, 3, dim, dout, LseBase::kBase2, scale);
  got.poison();
  gpu::merge_state(a.dev(), b.dev(), got.dev());
  sync();
  got.download();
  cpu::merge_state(a.h.view(), b.h.view(), want.view());
  EXPECT_TRUE(gpu_matches_cpu(got.h, want, 100.0 * scale));
}

TEST(CudaMergeFp8, MergeStateMatchesCpuForEveryCompiledCombination) {
  ATTNSTATE_REQUIRE_GPU();
  const std::uint64_t seed = std::random_device{}();
  std::mt19937_64 gen(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const auto& c : pair_combinations())
    for (float scale : kScales)
      check_pair(gen, c[0], c[1], c[2], scale, kHeadDims[gen() % kHeadDims.size()]);
}

TEST(CudaMergeFp8, MergeStateInplaceMatchesCpuWithAndWithoutMask) {
  ATTNSTATE_REQUIRE_GPU();
  const std::uint64_t seed = std::random_device{}();
  std::mt19937_64 gen(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::int64_t tokens = 9, heads = 4;
  for (const auto& c : pair_combinations()) {
    if (c[0] != c[2]) continue;  // in place: acc is a and out
    for (int masked = 0; masked < 2; ++masked) {
      const float scale = kScales[gen() % 4];
      const std::int64_t dim = kHeadDims[gen() % kHeadDims.size()];
      SCOPED_TRACE(describe({c[0], c[1]}, scale, dim) + (masked ? " masked" : ""));
      DevState acc(tokens, heads, dim, c[0], LseBase::kNatural, scale);
      DevState other(tokens, heads, dim, c[1], LseBase::kNatural, scale * 0.5f);
      acc.h.fill(gen, 100.f * scale);
      other.h.fill(gen, 100.f * scale);
      acc.upload();
      other.upload();
      std::vector<std::uint8_t> mask(tokens);
      for (auto& m : mask) m = static_cast<std::uint8_t>(gen() % 3 == 0 ? 0 : 1 + gen() % 200);
      DeviceBuffer<std::uint8_t> dmask(mask);
      HostState want = acc.h;
      cpu::merge_state_inplace(want.view(), other.h.view(), masked ? mask.data() : nullptr);
      gpu::merge_state_inplace(acc.dev(), other.dev(), masked ? dmask.get() : nullptr);
      sync();
      acc.download();
      EXPECT_TRUE(gpu_matches_cpu(acc.h, want, 100.0 * scale));
      if (masked) {  // masked-off tokens keep their bytes exactly
        const std::size_t row = static_cast<std::size_t>(heads * dim) * attnstate::size_of(c[0]);
        for (std::int64_t t = 0; t < tokens; ++t) {
          if (mask[t] == 0) {
            EXPECT_EQ(0, std::memcmp(acc.h.o.data() + t * row, want.o.data() + t * row, row));
          }
        }
      }
    }
  }
}

/// `merge_states` over `S` states of `din` into `dout`, the stack's `o` shifted by `shift`
/// elements (1: not aligned, the element path).
void check_stack(std::mt19937_64& gen, StackOrder order, std::int64_t states, DType din, DType dout,
                 float scale, std::int64_t dim, std::int64_t shift) {
  SCOPED_TRACE(describe({din, dout}, scale, dim) + " S " + std::to_string(states) +
               (order == StackOrder::kTokensMajor ? " tokens-major" : " states-major") + " shift " +
               std::to_string(shift));
  const std::int64_t tokens = 6, heads = 2;
  HostState stack(tokens * states, heads, dim, din, LseBase::kBase2, scale);
  stack.fill(gen, 100.f * scale, 0.2);
  const std::size_t pad = static_cast<std::size_t>(shift) * attnstate::size_of(din);
  std::vector<std::uint8_t> host_o(stack.o.size() + pad, 0xFF);
  std::copy(stack.o.begin(), stack.o.end(), host_o.begin() + static_cast<std::ptrdiff_t>(pad));
  DeviceBuffer<std::uint8_t> o(host_o);
  DeviceBuffer<float> lse(stack.lse);
  const auto view = [&](const void* p, const float* l, MemorySpace space) {
    ConstStateStackView v = attnstate::make_state_stack(p, din, l, order, tokens, states, heads,
                                                        dim, LseBase::kBase2, space);
    v.o_scale = stack.layout.o_scale;
    return v;
  };
  DevState got(tokens, heads, dim, dout, LseBase::kNatural, scale * 4.f);
  HostState want(tokens, heads, dim, dout, LseBase::kNatural, scale * 4.f);
  got.poison();
  gpu::merge_states(view(o.get() + pad, lse.get(), MemorySpace::kDevice), got.dev());
  sync();
  got.download();
  cpu::merge_states(view(stack.o.data(), stack.lse.data(), MemorySpace::kHost), want.view());
  EXPECT_TRUE(gpu_matches_cpu(got.h, want, 100.0 * scale));
}

TEST(CudaMergeFp8, MergeStatesMatchesCpuForEveryCompiledPair) {
  ATTNSTATE_REQUIRE_GPU();
  const std::uint64_t seed = std::random_device{}();
  std::mt19937_64 gen(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType f : kFp8) {
    const std::vector<DType> with = {f, DType::kF32, DType::kF16, DType::kBF16};
    for (DType din : with)
      for (DType dout : with) {
        if (din != f && dout != f) continue;  // no fp8: the other tests
        for (std::int64_t states : {1, 2, 5, 17}) {
          const float scale = kScales[gen() % 4];
          const std::int64_t dim = kHeadDims[gen() % kHeadDims.size()];
          const StackOrder order = gen() % 2 ? StackOrder::kTokensMajor : StackOrder::kStatesMajor;
          check_stack(gen, order, states, din, dout, scale, dim, 0);
          check_stack(gen, order, states, din, dout, scale, dim, 1);
        }
      }
  }
}

TEST(CudaMergeFp8, ConversionsMatchTheHostBitForBit) {
  ATTNSTATE_REQUIRE_GPU();
  for (DType f : kFp8) {
    SCOPED_TRACE(attnstate::to_string(f));
    // Every encoding as a row of 256 elements, merged with the empty state into f32: the
    // device's fp8 -> fp32 conversion, against the host's.
    DevState a(1, 1, 256, f, LseBase::kNatural, 1.f);
    for (int b = 0; b < 256; ++b) a.h.o[b] = static_cast<std::uint8_t>(b);
    a.h.lse[0] = 0.25f;
    // The empty side has a's dtype (a and b of one dtype, out f32: a compiled combination).
    DevState empty(1, 1, 256, f, LseBase::kNatural, 1.f);
    empty.h.lse[0] = -INFINITY;
    a.upload();
    empty.upload();
    DevState out(1, 1, 256, DType::kF32, LseBase::kNatural, 1.f);
    out.poison();
    gpu::merge_state(a.dev(), empty.dev(), out.dev());
    sync();
    out.download();
    for (int b = 0; b < 256; ++b) {
      const double want = a.h.value(0, b);
      const float got = reinterpret_cast<const float*>(out.h.o.data())[b];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << b;  // a NaN; its bits are the hardware's
      } else {
        EXPECT_EQ(static_cast<double>(got), want) << "encoding " << b;
        EXPECT_EQ(std::signbit(got), std::signbit(want)) << "encoding " << b;
      }
    }
    // fp32 -> fp8: floats around every fp8 value (ties, one ulp off, past the range, the
    // specials), merged with the empty state into fp8 at scale 1, against from_float.
    std::vector<float> xs = {0.f, -0.f, INFINITY, -INFINITY, NAN, 1e30f, -1e30f, 3e-30f};
    for (int b = 0; b < 0x7F; ++b) {
      const double v = a.h.value(0, b), next = a.h.value(0, b + 1);
      if (!std::isfinite(v)) continue;
      const float mid = static_cast<float>(std::isfinite(next) ? (v + next) / 2 : v * 1.1);
      for (float y :
           {static_cast<float>(v), mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY)}) {
        xs.push_back(y);
        xs.push_back(-y);
      }
    }
    std::mt19937 gen(7);
    while (xs.size() % 512 != 0)
      xs.push_back(std::ldexp(static_cast<float>(gen()) / 4e9f, static_cast<int>(gen() % 40) - 24));
    const std::int64_t n = static_cast<std::int64_t>(xs.size()) / 512;
    DevState x(n, 1, 512, DType::kF32, LseBase::kNatural, 1.f);
    std::memcpy(x.h.o.data(), xs.data(), xs.size() * 4);
    DevState e(n, 1, 512, DType::kF32, LseBase::kNatural, 1.f);
    for (std::int64_t t = 0; t < n; ++t) {
      x.h.lse[t] = 0.f;
      e.h.lse[t] = -INFINITY;
    }
    x.upload();
    e.upload();
    DevState q(n, 1, 512, f, LseBase::kNatural, 1.f);
    q.poison();
    gpu::merge_state(x.dev(), e.dev(), q.dev());
    sync();
    q.download();
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const std::uint8_t want = f == DType::kE4M3
                                    ? attnstate::from_float<attnstate::float8_e4m3_t>(xs[i]).bits
                                    : attnstate::from_float<attnstate::float8_e5m2_t>(xs[i]).bits;
      const std::uint8_t got = q.h.byte(static_cast<std::int64_t>(i));
      if (is_fp8_nan(f, want)) {
        EXPECT_TRUE(is_fp8_nan(f, got)) << xs[i];
      } else {
        EXPECT_EQ(int(got), int(want)) << "x = " << xs[i];
      }
    }
  }
}

TEST(CudaMergeFp8, EmptyIsTheIdentityBitwiseAndNanPropagates) {
  ATTNSTATE_REQUIRE_GPU();
  const std::uint64_t seed = std::random_device{}();
  std::mt19937_64 gen(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType f : kFp8)
    for (float scale : kScales) {
      SCOPED_TRACE(describe({f}, scale, 128));
      DevState a(4, 2, 128, f, LseBase::kNatural, scale);
      a.h.fill(gen, 100.f * scale, 0.0);
      a.h.o[5] = 0x7F;  // a NaN element in a non-empty row: propagates
      DevState empty(4, 2, 128, f, LseBase::kNatural, scale);  // o: 0xFF, NaN, never read
      for (auto& l : empty.h.lse) l = -INFINITY;
      a.upload();
      empty.upload();
      DevState out(4, 2, 128, f, LseBase::kNatural, scale);
      out.poison();
      gpu::merge_state(empty.dev(), a.dev(), out.dev());
      sync();
      out.download();
      for (std::size_t i = 0; i < a.h.o.size(); ++i) {
        if (i == 5)
          EXPECT_TRUE(is_fp8_nan(f, out.h.o[i]));
        else
          EXPECT_EQ(out.h.o[i], a.h.o[i]) << i;
      }
      EXPECT_EQ(0, std::memcmp(out.h.lse.data(), a.h.lse.data(), a.h.lse.size() * 4));
      // The n-ary merge of one state: the same bits.
      DevState out2(4, 2, 128, f, LseBase::kNatural, scale);
      out2.poison();
      ConstStateStackView one =
          attnstate::make_state_stack(a.o.get(), f, a.lse.get(), StackOrder::kTokensMajor, 4, 1, 2,
                                      128, LseBase::kNatural, MemorySpace::kDevice);
      one.o_scale = scale;  // the stack's stored values are a's
      gpu::merge_states(one, out2.dev());
      sync();
      out2.download();
      EXPECT_EQ(out2.h.o, out.h.o);
    }
}

// ---- Arguments (no GPU needed: every call below throws before it touches the device).

template <class Fn>
void expect_error(Fn&& fn, attnstate::Status status, const std::string& arg) {
  expect_named_error(fn, status, arg, "attnstate::cuda::");
}

/// A device view at a fake (aligned, never dereferenced) address.
StateView fake(DType dt, std::uintptr_t at, float scale = 1.f) {
  StateView v = attnstate::make_state_view(reinterpret_cast<void*>(at), dt,
                                           reinterpret_cast<float*>(at + (1u << 20)), 4, 2, 64,
                                           LseBase::kNatural, MemorySpace::kDevice);
  v.o_scale = scale;
  return v;
}

TEST(CudaMergeFp8, CombinationsNotCompiledAndBadScalesAreNamed) {
  using attnstate::Status;
  const std::uintptr_t a = 1u << 24, b = 2u << 24, o = 3u << 24;
  // a and b of different dtypes, a not of out's dtype: refused naming what the catalog holds
  expect_error(
      [&] { gpu::merge_state(fake(DType::kBF16, a), fake(DType::kF16, b), fake(DType::kE4M3, o)); },
      Status::kNotSupported, "b.dtype");
  {
    catalog::Query q;
    q.family = catalog::Family::kMergePair;
    q.q = catalog::mask(DType::kBF16);
    q.kv = catalog::mask(DType::kF16);
    q.out = catalog::mask(DType::kE4M3);
    ASSERT_FALSE(catalog::compiled(q));
    std::string what;
    try {
      gpu::merge_state(fake(DType::kBF16, a), fake(DType::kF16, b), fake(DType::kE4M3, o));
    } catch (const attnstate::Error& e) {
      what = e.what();
    }
    EXPECT_NE(what.find(catalog::not_supported_message(q)), std::string::npos) << what;
    EXPECT_NE(what.find("b of bf16 into"), std::string::npos) << what;
  }
  // Two fp8 formats in one call.
  expect_error(
      [&] {
        gpu::merge_state(fake(DType::kE4M3, a), fake(DType::kE4M3, b), fake(DType::kE5M2, o));
      },
      Status::kNotSupported, "a.dtype");
  ConstStateStackView s = attnstate::make_state_stack(
      reinterpret_cast<void*>(a), DType::kE5M2, reinterpret_cast<float*>(b),
      StackOrder::kTokensMajor, 4, 3, 2, 64, LseBase::kNatural, MemorySpace::kDevice);
  expect_error([&] { gpu::merge_states(s, fake(DType::kE4M3, o)); }, Status::kNotSupported,
               "in.dtype");
  // Operations without fp8.
  expect_error([&] { gpu::rebase(fake(DType::kE4M3, a), fake(DType::kF32, o)); },
               Status::kNotSupported, "in.dtype");
  const std::int32_t* indptr = reinterpret_cast<const std::int32_t*>(b + (4u << 20));
  expect_error(
      [&] { gpu::merge_states_ragged(fake(DType::kE4M3, a), indptr, fake(DType::kF32, o)); },
      Status::kNotSupported, "rows.dtype");
  // Scales.
  for (float bad : {0.f, -2.f, INFINITY, NAN}) {
    expect_error(
        [&] {
          gpu::merge_state(fake(DType::kE4M3, a, bad), fake(DType::kE4M3, b), fake(DType::kF32, o));
        },
        Status::kInvalidArgument, "a.o_scale");
    expect_error(
        [&] { gpu::merge_state_inplace(fake(DType::kE5M2, o, bad), fake(DType::kF32, a)); },
        Status::kInvalidArgument, "acc.o_scale");
  }
  expect_error(
      [&] {
        gpu::merge_state(fake(DType::kBF16, a), fake(DType::kBF16, b), fake(DType::kBF16, o, 0.5f));
      },
      Status::kInvalidArgument, "out.o_scale");
}

}  // namespace
}  // namespace attnstate_test
