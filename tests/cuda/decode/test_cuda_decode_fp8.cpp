/// @file test_cuda_decode_fp8.cpp
/// @brief The CUDA split-KV decode over fp8 KV caches (e4m3, e5m2) against the testing kit's
///        double reference over the dequantised cache, the output poisoned first: both formats,
///        bf16 and f16 queries, the three kinds of scale (a host value, a device scalar, per KV
///        head), scales 1, 2^-10 and 2^8, stored values over the whole format range, every split
///        policy, pages of 1, 5, 16 and 32 tokens (NHD and HND, CSR and block table), ragged
///        lengths with empty and one-token requests, q_len up to 4, at the planner's depth and, at
///        head dim 128, at the paired configuration's (`split_stages` 4 and 6: 32 keys a warp's
///        step, also in the variant and NaN cases); NaN encodings propagate; a
///        graph replays with the scale its device buffer holds at replay; runs are bitwise
///        repeatable; windows and soft caps (the fp8 variant instance) match the CPU decode; the
///        cases not compiled and bad scale pointers get named errors.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/error.hpp"
#include "attnstate/cpu/decode.hpp"
#include "attnstate/cuda/decode.hpp"
#include "catalog/catalog.hpp"
#include "common/compiled.hpp"
#include "cuda_test_utils.hpp"
#include "decode_device_problem.hpp"
#include "decode_problem.hpp"

namespace attnstate_test {
namespace {

namespace cuda = attnstate::cuda;
using attnstate::DecodeOptions;
using attnstate::DecodeProblem;
using attnstate::KvScale;
using attnstate::LseBase;
using attnstate::MemorySpace;
using attnstate::SplitPolicy;
using attnstate::StateView;

int num_sms() {
  int dev = 0, n = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

/// How a case gives its scales.
enum class ScaleKind { kHostValue, kDeviceScalar, kPerHead };

std::uint8_t encode(DType f, float x) {
  return f == DType::kE4M3 ? attnstate::from_float<attnstate::float8_e4m3_t>(x).bits
                           : attnstate::from_float<attnstate::float8_e5m2_t>(x).bits;
}
float decode(DType f, std::uint8_t b) {
  if (f == DType::kE4M3) {
    attnstate::float8_e4m3_t v;
    v.bits = b;
    return attnstate::to_float(v);
  }
  attnstate::float8_e5m2_t v;
  v.bits = b;
  return attnstate::to_float(v);
}
bool is_nan_code(DType f, std::uint8_t b) {
  return f == DType::kE4M3 ? (b & 0x7F) == 0x7F : (b & 0x7F) > 0x7C;
}

/// An fp8 problem: `real` holds the dequantised cache in f32 pools (the reference's input; unused
/// slots NaN), `fp8` the same tables with the stored bytes, `scales` the per-head K and V scales.
struct Fp8Problem {
  DecodeProblemHost real;
  DecodeProblemHost fp8;
  std::vector<float> k_scales, v_scales;  // [heads_kv]
};

/// KV head of pool element `i` of `p`'s layout.
std::int64_t head_of(const DecodeConfig& c, std::int64_t i) {
  return c.layout == attnstate::KvLayout::kNHD ? (i / c.head_dim) % c.heads_kv
                                               : (i / (c.page_size * c.head_dim)) % c.heads_kv;
}

/// Builds the problem: `cfg`'s shape with an f32 pool of random values, then every element stored
/// as `fmt` at its head's scale (`scale`, times 1 + 0.37 h per head for `kPerHead`). `full_range`
/// draws the stored codes uniformly over every finite code instead (subnormals to the largest),
/// the real values then `code × scale`.
Fp8Problem make_fp8_problem(DecodeConfig cfg, DType fmt, float scale, ScaleKind kind,
                            bool full_range, std::uint64_t seed) {
  Fp8Problem p;
  const DType q_dtype = cfg.q_dtype;
  cfg.kv_dtype = DType::kF32;
  p.real = make_decode_problem(cfg, seed);
  for (std::int64_t h = 0; h < cfg.heads_kv; ++h) {
    const float f = kind == ScaleKind::kPerHead ? 1.f + 0.37f * static_cast<float>(h) : 1.f;
    p.k_scales.push_back(scale * f);
    p.v_scales.push_back(scale * f * 0.5f);
  }
  p.fp8 = p.real;
  p.fp8.cfg.kv_dtype = fmt;
  p.fp8.cfg.q_dtype = q_dtype;
  const std::int64_t n = static_cast<std::int64_t>(p.real.k.size() / 4);
  p.fp8.k.assign(static_cast<std::size_t>(n), 0);
  p.fp8.v.assign(static_cast<std::size_t>(n), 0);
  std::mt19937_64 rng(seed ^ 0x5bd1e995u);
  const float amp = fmt == DType::kE4M3 ? 448.f : 57344.f;
  for (int pool = 0; pool < 2; ++pool) {
    std::vector<unsigned char>& real = pool == 0 ? p.real.k : p.real.v;
    std::vector<unsigned char>& bytes = pool == 0 ? p.fp8.k : p.fp8.v;
    const std::vector<float>& sc = pool == 0 ? p.k_scales : p.v_scales;
    for (std::int64_t i = 0; i < n; ++i) {
      float x;
      std::memcpy(&x, real.data() + 4 * i, 4);
      const float s = sc[static_cast<std::size_t>(head_of(cfg, i))];
      std::uint8_t b;
      if (std::isnan(x)) {
        b = encode(fmt, x);  // unused slots stay NaN
      } else if (full_range) {
        do {
          b = static_cast<std::uint8_t>(rng() & 0xFF);
        } while (is_nan_code(fmt, b) || std::isinf(decode(fmt, b)));
        // keep the scores bounded: the largest codes only in V, K within ±amp / 64
        if (pool == 0 && std::fabs(decode(fmt, b)) > amp / 64) b = encode(fmt, decode(fmt, b) / 64);
      } else {
        b = encode(fmt, x / s);
      }
      bytes[static_cast<std::size_t>(i)] = b;
      const float deq = decode(fmt, b) * s;
      std::memcpy(real.data() + 4 * i, &deq, 4);
    }
  }
  return p;
}

/// The device side of a case: the problem's buffers, its scales, an output poisoned per run.
struct Fp8Run {
  const Fp8Problem& p;
  ScaleKind kind;
  DeviceProblem d;
  DeviceBuffer<float> k_scales, v_scales;
  DeviceBuffer<unsigned char> o, ws;
  DeviceBuffer<float> lse;
  cuda::DecodePlan plan;

  Fp8Run(const Fp8Problem& prob, ScaleKind k, const DecodeOptions& opt)
      : p(prob),
        kind(k),
        d(prob.fp8),
        k_scales(upload(prob.k_scales)),
        v_scales(upload(prob.v_scales)),
        o(std::max<std::int64_t>(1,
                                 prob.fp8.tokens() * prob.fp8.cfg.heads_q * prob.fp8.cfg.head_dim) *
          4),
        ws(1),
        lse(std::max<std::int64_t>(1, prob.fp8.tokens() * prob.fp8.cfg.heads_q)) {
    plan = cuda::plan_decode(p.fp8.problem(), p.fp8.seq_lens.data(), opt, num_sms());
    ws = DeviceBuffer<unsigned char>(std::max<std::size_t>(1, plan.workspace_bytes()));
    cuda::init_decode_workspace(plan, ws.get(), ws.bytes());
  }
  attnstate::PagedKvCache kv() const {
    attnstate::PagedKvCache c = d.kv(p.fp8);
    if (kind == ScaleKind::kHostValue) {
      c.k_scale = KvScale::per_tensor(p.k_scales[0]);
      c.v_scale = KvScale::per_tensor(p.v_scales[0]);
    } else if (kind == ScaleKind::kDeviceScalar) {
      c.k_scale = KvScale::per_tensor_at(k_scales.get());
      c.v_scale = KvScale::per_tensor_at(v_scales.get());
    } else {
      c.k_scale = KvScale::per_head(k_scales.get());
      c.v_scale = KvScale::per_head(v_scales.get());
    }
    return c;
  }
  StateView out() {
    return attnstate::make_state_view(o.get(), DType::kF32, lse.get(), p.fp8.tokens(),
                                      p.fp8.cfg.heads_q, p.fp8.cfg.head_dim, LseBase::kNatural,
                                      MemorySpace::kDevice);
  }
  void launch(cudaStream_t stream = nullptr) {
    cuda::run_decode(plan, d.qv(p.fp8), kv(), out(), ws.get(), ws.bytes(), stream);
  }
  /// One run into a poisoned output: (o bytes, lse).
  std::pair<std::vector<unsigned char>, std::vector<float>> run() {
    o.poison();
    lse.poison();
    launch();
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
    return {o.download(), lse.download()};
  }
};

/// The f16-operand decode's bound (P and the queries are f16 operands on the tensor cores).
constexpr double kOTol = 4e-3;

/// "" when the plan of `r` runs the split kernel at the depth `opt` names (when it names one).
std::string check_depth(const Fp8Run& r, const DecodeOptions& opt) {
  if (opt.split_stages == 0) return "";
  const attnstate::catalog::Row& row =
      attnstate::catalog::kRows[static_cast<std::size_t>(r.plan.kernel_id())];
  return row.family == attnstate::catalog::Family::kDecodeSplit && row.stages == opt.split_stages
             ? ""
             : "the plan holds another kernel: " + r.plan.to_string();
}

std::string check_case(const Fp8Problem& p, ScaleKind kind, const DecodeOptions& opt) {
  Fp8Run r(p, kind, opt);
  if (!check_depth(r, opt).empty()) return check_depth(r, opt);
  const auto got = r.run();
  const auto again = r.run();
  if (got.first != again.first || got.second != again.second) return "not bitwise repeatable";
  return compare_decode(reference_decode(p.real, r.plan.scale()), got.first.data(), DType::kF32,
                        got.second.data(), LseBase::kNatural, decode_tolerance(kOTol, 5e-5));
}

/// As `check_case` against the CPU decode of the dequantised cache with `opt`'s variant (the
/// plan's split layout and scale); `kernel`: the kernel the plan must hold.
std::string check_variant_case(const Fp8Problem& p, ScaleKind kind, const DecodeOptions& opt,
                               attnstate::DecodeKernel kernel) {
  Fp8Run r(p, kind, opt);
  if (r.plan.kernel() != kernel) return "the plan holds another kernel";
  if (!check_depth(r, opt).empty()) return check_depth(r, opt);
  const auto got = r.run();
  const auto again = r.run();
  if (got.first != again.first || got.second != again.second) return "not bitwise repeatable";
  HostState c(p.real.tokens(), p.real.cfg.heads_q, p.real.cfg.head_dim, DType::kF32,
              LseBase::kNatural);
  attnstate::cpu::decode(p.real.q_view(), p.real.kv_view(), r.plan.splits(), r.plan.scale(),
                         opt.variant, c.view);
  const attnstate::testing::ReferenceState ref = attnstate::testing::to_reference(
      attnstate::testing::HostState::from_view(attnstate::ConstStateView(c.view)));
  return compare_decode(ref, got.first.data(), DType::kF32, got.second.data(), LseBase::kNatural,
                        decode_tolerance(kOTol, 2e-4));
}

DecodeOptions policy(SplitPolicy pol, int n) {
  DecodeOptions o;
  o.policy = pol;
  if (pol == SplitPolicy::kFixedCount) o.num_splits = n;
  if (pol == SplitPolicy::kFixedSize) o.split_size = n;
  return o;
}

/// The split kernel's depths a case runs at head dim `D`: the planner's (0), and the paired
/// configuration's (32 keys a warp's step, rings of 4 and 6 tiles) where it is compiled.
std::vector<int> depths(std::int64_t D) {
  namespace catalog = attnstate::catalog;
  std::vector<int> d = {0};
  if (D == catalog::kDecodePairHeadDim &&
      attnstate::compiled::contains(attnstate::compiled::DecodeFp8HeadDims{}, D)) {
    d.push_back(catalog::kDecodePairStages);
    d.push_back(catalog::kDecodePairDeepStages);
  }
  return d;
}

/// `o` at the split kernel's depth `depth` (0: the planner's; else the split kernel asked for
/// at that depth).
DecodeOptions at_depth(DecodeOptions o, int depth) {
  if (depth != 0) {
    o.kernel = attnstate::DecodeKernel::kSplit;
    o.split_stages = depth;
  }
  return o;
}

TEST(CudaDecodeFp8, MatchesTheDequantisedReference) {
  ATTNSTATE_REQUIRE_GPU();
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  struct Case {
    std::int64_t q_len, hq, hkv, D, page;
    attnstate::KvLayout layout;
    bool bt;
  };
  const Case cases[] = {
      {1, 32, 8, 128, 16, attnstate::KvLayout::kNHD, true},
      {1, 8, 1, 128, 1, attnstate::KvLayout::kNHD, false},
      {2, 16, 2, 256, 5, attnstate::KvLayout::kHND, true},
      {4, 28, 4, 128, 32, attnstate::KvLayout::kHND, false},
      {1, 64, 8, 256, 16, attnstate::KvLayout::kNHD, false},
      {3, 16, 4, 128, 5, attnstate::KvLayout::kHND, true},
  };
  const float scales[] = {1.f, 0x1p-10f, 0x1p8f};
  int n = 0;
  for (const Case& c : cases) {
    // a build of fewer head dims (ATTNSTATE_CUDA_HEAD_DIMS) runs the cases it compiled
    if (!attnstate::compiled::contains(attnstate::compiled::DecodeFp8HeadDims{}, c.D)) continue;
    for (DType fmt : {DType::kE4M3, DType::kE5M2})
      for (DType qd : {DType::kBF16, DType::kF16}) {
        DecodeConfig cfg =
            shape_config(c.q_len, c.hq, c.hkv, c.D, c.page, c.layout, c.bt, qd, DType::kF32);
        cfg.seq_lens = {0,  1, static_cast<std::int32_t>(gen() % 3000 + 17),    700,
                        64, 4, static_cast<std::int32_t>(gen() % 200 + c.q_len)};
        const ScaleKind kind = static_cast<ScaleKind>(n % 3);
        const bool full = n % 4 == 3;
        // full-range codes at the scale that maps the format's largest value to 1
        const float scale = full ? (fmt == DType::kE4M3 ? 1.f / 448 : 1.f / 57344) : scales[n % 3];
        const Fp8Problem p = make_fp8_problem(cfg, fmt, scale, kind, full, gen());
        for (const int depth : depths(c.D))
          for (const DecodeOptions& pol :
               {policy(SplitPolicy::kAuto, 0), policy(SplitPolicy::kFixedCount, 3),
                policy(SplitPolicy::kFixedSize, 64)}) {
            const DecodeOptions opt = at_depth(pol, depth);
            SCOPED_TRACE(p.fp8.cfg.name() + " scale " + std::to_string(scale) + " kind " +
                         std::to_string(static_cast<int>(kind)) + (full ? " full-range" : "") +
                         " policy " + std::to_string(static_cast<int>(opt.policy)) + " depth " +
                         std::to_string(depth));
            EXPECT_EQ(check_case(p, kind, opt), "");
          }
        ++n;
      }
  }
  EXPECT_GT(n, 0) << "no fp8 head dim of the cases compiled";
}

TEST(CudaDecodeFp8, WindowsAndSoftCapsMatchTheCpuDecodeOfTheDequantisedCache) {
  // The split kernel's fp8 variant instance: windows (none, 0, 37, 300) x soft caps (none, 5, 30)
  // x split policies, both formats, bf16 and f16 queries (bf16 rows scaled into the f16 range
  // before the cap sees their dot products), per-head scales of 2^-4 and 2^6, q_len 1 and 3,
  // pages of 16 and 5, ragged lengths with empty and one-key requests: against the CPU decode of
  // the dequantised cache with the same layout and variant, outputs poisoned first.
  ATTNSTATE_REQUIRE_GPU();
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  int n = 0;
  for (const std::int64_t D : {128, 256}) {
    if (!attnstate::compiled::contains(attnstate::compiled::DecodeFp8VariantHeadDims{}, D))
      continue;
    for (DType fmt : {DType::kE4M3, DType::kE5M2})
      for (DType qd : {DType::kBF16, DType::kF16}) {
        const std::int64_t q_len = n % 2 == 0 ? 1 : 3, page = n % 2 == 0 ? 16 : 5;
        DecodeConfig cfg = shape_config(q_len, 32, 8, D, page, attnstate::KvLayout::kNHD,
                                        page == 16, qd, DType::kF32);
        cfg.q_gain = 4.f;  // large scores, so that the cap matters
        cfg.seq_lens = {static_cast<std::int32_t>(gen() % 3000 + 300), 0, 1, 700, 17};
        const float scale = n % 3 == 0 ? 0x1p-4f : 0x1p6f;
        const Fp8Problem p = make_fp8_problem(cfg, fmt, scale, ScaleKind::kPerHead, false, gen());
        ++n;
        for (std::int64_t window :
             {attnstate::kNoWindow, std::int64_t{0}, std::int64_t{37}, std::int64_t{300}})
          for (float cap : {0.f, 5.f, 30.f}) {
            if (window == attnstate::kNoWindow && cap == 0.f) continue;  // the plain instance
            for (const int depth : depths(D))
              for (const DecodeOptions& pol :
                   {policy(SplitPolicy::kAuto, 0), policy(SplitPolicy::kFixedCount, 3),
                    policy(SplitPolicy::kFixedSize, 64)}) {
                DecodeOptions opt = at_depth(pol, depth);
                opt.variant.window_left = window;
                opt.variant.logits_soft_cap = cap;
                SCOPED_TRACE(p.fp8.cfg.name() + " window " + std::to_string(window) + " cap " +
                             std::to_string(cap) + " policy " +
                             std::to_string(static_cast<int>(opt.policy)) + " depth " +
                             std::to_string(depth));
                EXPECT_EQ(check_variant_case(p, ScaleKind::kPerHead, opt,
                                             attnstate::DecodeKernel::kSplit),
                          "");
              }
          }
      }
  }
}

TEST(CudaDecodeFp8, TheStreamedKernelMatchesTheCpuDecode) {
  // The streamed kernel over fp8 caches (head dim 128): many short requests, one split each
  // (asked for, and chosen by the automatic plan of a batch wide enough), both formats, bf16 and
  // f16 queries, the three kinds of scale, q_len 1 and 2, block-table NHD pages of 16 and CSR HND
  // pages of 32, plain, windowed and capped: against the CPU decode of the dequantised cache,
  // outputs poisoned first.
  ATTNSTATE_REQUIRE_GPU();
  if (!attnstate::compiled::contains(attnstate::compiled::DecodeStreamFp8HeadDims{}, 128))
    GTEST_SKIP() << "no streamed fp8 kernel compiled";
  const std::uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 gen(seed);
  int n = 0;
  for (DType fmt : {DType::kE4M3, DType::kE5M2})
    for (DType qd : {DType::kBF16, DType::kF16}) {
      const bool nhd = n % 2 == 0;
      DecodeConfig cfg = shape_config(nhd ? 1 : 2, 32, 8, 128, nhd ? 16 : 32,
                                      nhd ? attnstate::KvLayout::kNHD : attnstate::KvLayout::kHND,
                                      nhd, qd, DType::kF32);
      cfg.q_gain = 4.f;  // large scores, so that the cap matters
      cfg.seq_lens.clear();
      for (int b = 0; b < 128; ++b)
        cfg.seq_lens.push_back(b == 0   ? 0
                               : b == 1 ? 1
                                        : static_cast<std::int32_t>(gen() % 700 + 2));
      const ScaleKind kind = static_cast<ScaleKind>(n % 3);
      const Fp8Problem p =
          make_fp8_problem(cfg, fmt, n % 2 == 0 ? 0x1p-4f : 0x1p3f, kind, false, gen());
      ++n;
      for (const auto& v : {std::pair<std::int64_t, float>{attnstate::kNoWindow, 0.f},
                            {37, 0.f},
                            {attnstate::kNoWindow, 30.f},
                            {300, 5.f}}) {
        for (const bool automatic : {true, false}) {
          DecodeOptions opt =
              automatic ? policy(SplitPolicy::kAuto, 0) : policy(SplitPolicy::kFixedCount, 1);
          if (!automatic) opt.kernel = attnstate::DecodeKernel::kStreamed;
          opt.variant.window_left = v.first;
          opt.variant.logits_soft_cap = v.second;
          SCOPED_TRACE(p.fp8.cfg.name() + " kind " + std::to_string(static_cast<int>(kind)) +
                       " window " + std::to_string(v.first) + " cap " + std::to_string(v.second) +
                       (automatic ? " automatic" : " asked"));
          EXPECT_EQ(check_variant_case(p, kind, opt, attnstate::DecodeKernel::kStreamed), "");
        }
      }
    }
}

TEST(CudaDecodeFp8, NanEncodingsPropagateToTheRowsThatSeeThem) {
  ATTNSTATE_REQUIRE_GPU();
  // at every depth (the paired ones: a NaN in either tile of a step)
  for (const int depth : depths(128))
    for (DType fmt : {DType::kE4M3, DType::kE5M2}) {
      SCOPED_TRACE(std::string(attnstate::to_string(fmt)) + " depth " + std::to_string(depth));
      DecodeConfig cfg = shape_config(1, 16, 2, 128, 16, attnstate::KvLayout::kNHD, false,
                                      DType::kBF16, DType::kF32);
      cfg.seq_lens = {300, 90, 1000};
      Fp8Problem p = make_fp8_problem(cfg, fmt, 0.5f, ScaleKind::kHostValue, false, 11);
      const DecodeOptions opt =
          at_depth(policy(SplitPolicy::kFixedSize, 64), depth);  // rows depend on their own request
      Fp8Run clean(p, ScaleKind::kHostValue, opt);
      const auto base = clean.run();
      // a NaN code in key 37 of request 0's K (KV head 1), and in key 5 of request 2's V (head 0)
      Fp8Problem bad = p;
      bad.fp8.k[static_cast<std::size_t>(bad.fp8.kv_offset(0, 37, 1) + 3)] = 0x7F | 0x80;
      bad.fp8.v[static_cast<std::size_t>(bad.fp8.kv_offset(2, 5, 0) + 9)] = 0x7F;
      Fp8Run r(bad, ScaleKind::kHostValue, opt);
      const auto got = r.run();
      const std::int64_t hq = cfg.heads_q, D = cfg.head_dim, group = hq / cfg.heads_kv;
      const float* go = reinterpret_cast<const float*>(got.first.data());
      const float* bo = reinterpret_cast<const float*>(base.first.data());
      for (std::int64_t b = 0; b < 3; ++b)
        for (std::int64_t h = 0; h < hq; ++h) {
          const bool nan_row = (b == 0 && h / group == 1) || (b == 2 && h / group == 0);
          const std::int64_t row = b * hq + h;
          for (std::int64_t d = 0; d < D; ++d) {
            const float x = go[row * D + d];
            if (nan_row) {
              // V's NaN reaches column 9 only; K's NaN score reaches every column
              if (b == 0 || d == 9) {
                EXPECT_TRUE(std::isnan(x)) << b << " " << h << " " << d;
              }
            } else {
              EXPECT_EQ(std::memcmp(&x, &bo[row * D + d], 4), 0) << b << " " << h << " " << d;
            }
          }
        }
    }
}

TEST(CudaDecodeFp8, AGraphReplaysWithTheScaleItsBufferHolds) {
  ATTNSTATE_REQUIRE_GPU();
  DecodeConfig cfg =
      shape_config(1, 32, 8, 128, 16, attnstate::KvLayout::kNHD, true, DType::kBF16, DType::kF32);
  cfg.seq_lens = {5000, 77, 1200};
  const Fp8Problem p =
      make_fp8_problem(cfg, DType::kE4M3, 0.25f, ScaleKind::kDeviceScalar, false, 3);
  Fp8Run r(p, ScaleKind::kDeviceScalar, policy(SplitPolicy::kAuto, 0));
  cudaStream_t stream;
  ATTNSTATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  ATTNSTATE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  r.launch(stream);
  ATTNSTATE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  ATTNSTATE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (float f : {1.f, 2.f, 0.125f}) {
    SCOPED_TRACE("scale factor " + std::to_string(f));
    // new scales in the device buffers; the reference over the cache dequantised with them
    Fp8Problem q = p;
    const std::vector<float> ks = {p.k_scales[0] * f}, vs = {p.v_scales[0] * f};
    r.k_scales.upload(ks);
    r.v_scales.upload(vs);
    const std::int64_t n = static_cast<std::int64_t>(q.fp8.k.size());
    for (std::int64_t i = 0; i < n; ++i) {
      const float kx = decode(DType::kE4M3, q.fp8.k[static_cast<std::size_t>(i)]) * ks[0];
      const float vx = decode(DType::kE4M3, q.fp8.v[static_cast<std::size_t>(i)]) * vs[0];
      std::memcpy(q.real.k.data() + 4 * i, &kx, 4);
      std::memcpy(q.real.v.data() + 4 * i, &vx, 4);
    }
    r.o.poison();
    r.lse.poison();
    ATTNSTATE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    ATTNSTATE_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto o = r.o.download();
    const auto lse = r.lse.download();
    EXPECT_EQ(compare_decode(reference_decode(q.real, r.plan.scale()), o.data(), DType::kF32,
                             lse.data(), LseBase::kNatural, decode_tolerance(kOTol, 5e-5)),
              "");
  }
  ATTNSTATE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  ATTNSTATE_CUDA_CHECK(cudaGraphDestroy(graph));
  ATTNSTATE_CUDA_CHECK(cudaStreamDestroy(stream));
}

template <class Fn>
void expect_error(Fn&& fn, attnstate::Status status, const std::string& arg) {
  expect_named_error(fn, status, arg);
}

TEST(CudaDecodeFp8, ThePairedDepthsAreTakenOnlyByHand) {
  // No GPU needed: single-split plans make no device query. The automatic plan keeps 16-key
  // steps; split_stages 4 and 6 plan the paired rows (32 keys a warp's step), named in words.
  namespace catalog = attnstate::catalog;
  if (depths(128).size() < 3) GTEST_SKIP() << "no paired fp8 rows in this build";
  DecodeProblem pr;
  pr.batch = 2;
  pr.heads_q = 32;
  pr.heads_kv = 8;
  pr.head_dim = 128;
  pr.q_dtype = DType::kBF16;
  pr.kv_dtype = DType::kE4M3;
  const std::vector<std::int32_t> lens = {900, 40};
  DecodeOptions o = policy(SplitPolicy::kFixedCount, 1);
  o.kernel = attnstate::DecodeKernel::kSplit;
  const cuda::DecodePlan a = cuda::plan_decode(pr, lens.data(), o, 132);
  EXPECT_EQ(catalog::kRows[static_cast<std::size_t>(a.kernel_id())].tile_keys,
            catalog::kDecodeTileRows);
  EXPECT_EQ(a.to_string().find("paired"), std::string::npos) << a.to_string();
  for (const int depth : {catalog::kDecodePairStages, catalog::kDecodePairDeepStages}) {
    const cuda::DecodePlan b = cuda::plan_decode(pr, lens.data(), at_depth(o, depth), 132);
    const catalog::Row& r = catalog::kRows[static_cast<std::size_t>(b.kernel_id())];
    EXPECT_EQ(r.tile_keys, catalog::kDecodePairKeys);
    EXPECT_EQ(r.stages, depth);
    EXPECT_EQ(b.split_launch().stages, depth);
    EXPECT_NE(b.to_string().find("32 keys a warp's step (paired)"), std::string::npos)
        << b.to_string();
    EXPECT_NE(b.to_string().find("options.split_stages = " + std::to_string(depth)),
              std::string::npos)
        << b.to_string();
  }
  // not over a 16-bit cache
  pr.kv_dtype = DType::kBF16;
  expect_error([&] { cuda::plan_decode(pr, lens.data(), at_depth(o, 4), 132); },
               attnstate::Status::kInvalidArgument, "options.split_stages");
}

TEST(CudaDecodeFp8, UnsupportedCasesAndBadScalesAreNamed) {
  using attnstate::Status;
  DecodeProblem pr;
  pr.batch = 1;
  pr.heads_q = 8;
  pr.heads_kv = 2;
  pr.head_dim = 128;
  pr.q_dtype = DType::kBF16;
  pr.kv_dtype = DType::kE4M3;
  const std::int32_t len = 100;
  // (no device needed: the problem is refused before any query)
  DecodeProblem d64 = pr;
  d64.head_dim = 64;
  expect_error([&] { cuda::plan_decode(d64, &len, DecodeOptions{}, 132); }, Status::kNotSupported,
               "problem.head_dim");
  DecodeProblem f32q = pr;
  f32q.q_dtype = DType::kF32;
  expect_error([&] { cuda::plan_decode(f32q, &len, DecodeOptions{}, 132); }, Status::kNotSupported,
               "problem.q_dtype");
  ATTNSTATE_REQUIRE_GPU();
  // a scale pointer in host memory, for a kernel that reads it on the device
  DecodeConfig cfg =
      shape_config(1, 8, 2, 128, 16, attnstate::KvLayout::kNHD, false, DType::kBF16, DType::kF32);
  cfg.seq_lens = {40};
  const Fp8Problem p = make_fp8_problem(cfg, DType::kE4M3, 1.f, ScaleKind::kDeviceScalar, false, 5);
  Fp8Run r(p, ScaleKind::kDeviceScalar, DecodeOptions{});
  attnstate::PagedKvCache kv = r.kv();
  const float host_scale = 1.f;
  kv.v_scale = KvScale::per_tensor_at(&host_scale);
  expect_error(
      [&] { cuda::run_decode(r.plan, r.d.qv(p.fp8), kv, r.out(), r.ws.get(), r.ws.bytes()); },
      Status::kInvalidArgument, "kv.v_scale.data");
  kv = r.kv();
  kv.k_scale = KvScale::per_tensor(0.f);
  expect_error(
      [&] { cuda::run_decode(r.plan, r.d.qv(p.fp8), kv, r.out(), r.ws.get(), r.ws.bytes()); },
      Status::kInvalidArgument, "kv.k_scale.value");
}

}  // namespace
}  // namespace attnstate_test
