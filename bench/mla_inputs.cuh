/// @file mla_inputs.cuh
/// @brief What the MLA decode benchmark (bench_mla.cu) and its FlashInfer peer
///        (peers/flashinfer/fi_mla.cu) share, so that both time the same problem and count it the
///        same way: the widths, the inputs (the counter hash of hash_fill.cuh: queries in
///        [-3, 3), the latent cache in [-1, 1), fp8 stored ×16 in e4m3 and dequantised by a
///        per-tensor 1/16, exact in both), the shape options and their grid, the bytes and FLOP
///        of a shape, and the check against a CPU reference. CUDA runtime only (no attnstate or
///        FlashInfer header).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "hash_fill.cuh"

namespace mla_inputs {

constexpr int kRank = 512;               ///< Latent width: values, and the first part of keys.
constexpr int kRope = 64;                ///< Rotary width: the last part of the keys.
constexpr int kKeyDim = kRank + kRope;   ///< 576.
constexpr float kQAmp = 3.f;             ///< Queries in [-3, 3): scores of std ~1 at 1/24.
constexpr float kFp8Amp = 16.f;          ///< fp8 latent values are stored ×16 ...
constexpr float kFp8Scale = 1.f / 16.f;  ///< ... and dequantised by 1/16 (both parts).
/// Seeds of the fills: latent part, rotary part, q_nope, q_pe.
constexpr std::uint32_t kSeedCkv = 1, kSeedKpe = 2, kSeedQNope = 3, kSeedQPe = 4;

/// p[i] = amp · bench_hash::unit(i, seed), as bf16 (kFp8 false) or e4m3 (saturated).
template <bool kFp8>
__global__ void fill_uniform(std::uint8_t* p, std::size_t n, std::uint32_t seed, float amp) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float f = amp * bench_hash::unit(i, seed);
    if constexpr (kFp8) {
      p[i] = static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
    } else {
      reinterpret_cast<std::uint16_t*>(p)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(f));
    }
  }
}

/// Fills `n` elements of `p` (bf16, or e4m3 when `fp8`) on `stream`; returns the launch's error.
inline cudaError_t fill_async(void* p, std::size_t n, bool fp8, std::uint32_t seed, float amp,
                              int sms, cudaStream_t stream) {
  auto* b = static_cast<std::uint8_t*>(p);
  if (fp8)
    fill_uniform<true><<<sms * 8, 512, 0, stream>>>(b, n, seed, amp);
  else
    fill_uniform<false><<<sms * 8, 512, 0, stream>>>(b, n, seed, amp);
  return cudaGetLastError();
}

/// Bytes a decode of the shape must move: the latent cache (576 elements a token), the queries
/// (bf16) and the output state (bf16 `o` and an fp32 LSE per row).
inline std::int64_t bytes_moved(int batch, int q_len, int heads, int ctx, int cache_elem_bytes) {
  const std::int64_t rows = std::int64_t{batch} * q_len * heads;
  return std::int64_t{batch} * ctx * kKeyDim * cache_elem_bytes + rows * kKeyDim * 2 +
         rows * (kRank * 2 + 4);
}

/// Useful FLOP of the shape: `2 · (576 + 512)` per (row, key it sees), row `i` of a request seeing
/// `ctx − q_len + 1 + i` keys (causal).
inline double useful_flop(int batch, int q_len, int heads, int ctx) {
  double visible = 0;
  for (int i = 0; i < q_len; ++i) visible += std::max(0, ctx - q_len + 1 + i);
  return 2.0 * (kKeyDim + kRank) * heads * visible * batch;
}

/// One row: `batch` requests of `ctx` tokens, `q_len` new tokens each, `heads` query heads, a
/// bf16 (or e4m3 when `fp8`) latent cache.
struct Shape {
  int heads, batch, ctx, q_len;
  bool fp8;
};

inline std::string ctx_str(int ctx) {
  return ctx % 1024 == 0 ? std::to_string(ctx / 1024) + "k" : std::to_string(ctx);
}

/// The items of a comma list.
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  for (std::size_t pos = 0; pos <= s.size();) {
    std::size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    v.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return v;
}

/// A comma list of integers in [lo, hi] (a `k` suffix multiplies by 1024); throws
/// std::invalid_argument naming `opt` on anything else.
inline std::vector<int> int_list(const std::string& opt, const std::string& s, long lo, long hi) {
  std::vector<int> v;
  for (const std::string& item : split_list(s)) {
    char* e = nullptr;
    long x = std::strtol(item.c_str(), &e, 10);
    if (e != item.c_str() && (*e == 'k' || *e == 'K')) {
      x *= 1024;
      ++e;
    }
    if (item.empty() || *e != '\0' || x < lo || x > hi)
      throw std::invalid_argument(opt + ": expected integers in [" + std::to_string(lo) + ", " +
                                  std::to_string(hi) + "], got '" + item + "'");
    v.push_back(static_cast<int>(x));
  }
  return v;
}

/// The options both executables take (`kShapeUsage`: the shapes, the timed calls, the CSV) and
/// the grid of shapes they give.
struct ShapeOptions {
  std::vector<int> heads{16, 128}, batches{1, 4, 16, 64, 128};
  std::vector<int> ctxs{1024, 4096, 16384, 65536}, q_lens{1, 2};
  std::vector<int> fp8{0, 1};  // latent cache dtypes: 0 bf16, 1 e4m3
  int page = 64, reps = 0;
  std::string csv;  // --csv: where to write the rows too (empty: nowhere)
  bool quick = false, set_batches = false, set_ctx = false, set_q = false;

  /// Consumes `argv[i]` (and its value, advancing `i`) when it is a shape option and returns
  /// true; false for any other argument. Throws std::invalid_argument naming the option on a
  /// missing or bad value.
  bool parse(int argc, char** argv, int& i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + ": expected a value");
      return argv[++i];
    };
    if (a == "--quick") {
      quick = true;
    } else if (a == "--heads") {
      heads = int_list(a, value(), 16, 128);
      for (int h : heads)
        if (h % 16 != 0)
          throw std::invalid_argument("--heads: expected multiples of 16, got " +
                                      std::to_string(h));
    } else if (a == "--batches") {
      batches = int_list(a, value(), 1, 4096);
      set_batches = true;
    } else if (a == "--ctx") {
      ctxs = int_list(a, value(), 1, 1 << 20);
      set_ctx = true;
    } else if (a == "--q-lens") {
      q_lens = int_list(a, value(), 1, 4);
      set_q = true;
    } else if (a == "--dtypes") {
      fp8.clear();
      for (const std::string& d : split_list(value())) {
        if (d != "bf16" && d != "e4m3")
          throw std::invalid_argument("--dtypes: expected bf16 or e4m3, got '" + d + "'");
        fp8.push_back(d == "e4m3" ? 1 : 0);
      }
    } else if (a == "--page") {
      page = int_list(a, value(), 1, 65536).at(0);
    } else if (a == "--reps") {
      reps = int_list(a, value(), 1, 100000).at(0);
    } else if (a == "--csv") {
      csv = value();
    } else {
      return false;
    }
    return true;
  }

  /// Timed calls per row: `--reps`, else 30 (15 with `--quick`).
  int reps_per_row() const { return reps > 0 ? reps : quick ? 15 : 30; }

  /// The rows, dtype-major then q_len, heads, batch, context (`--quick` narrows the lists not
  /// given: batch 1/32/128, context 4k/64k, q_len 1).
  std::vector<Shape> shapes() const {
    const std::vector<int> b = quick && !set_batches ? std::vector<int>{1, 32, 128} : batches;
    const std::vector<int> c = quick && !set_ctx ? std::vector<int>{4096, 65536} : ctxs;
    const std::vector<int> q = quick && !set_q ? std::vector<int>{1} : q_lens;
    std::vector<Shape> v;
    for (int f : fp8)
      for (int ql : q)
        for (int h : heads)
          for (int bb : b)
            for (int cc : c) v.push_back(Shape{h, bb, cc, ql, f != 0});
    return v;
  }
};

/// What the largest shape needs: pool tokens (request b owning pages [b·P, (b+1)·P), P the
/// pages of `ctx` tokens), query / output rows and requests.
struct Extents {
  std::int64_t tokens = 0, rows = 0;
  int batch = 1;
};

inline Extents extents(const std::vector<Shape>& shapes, int page) {
  Extents e;
  for (const Shape& s : shapes) {
    const std::int64_t pages = (s.ctx + page - 1) / page;
    e.tokens = std::max(e.tokens, std::int64_t{s.batch} * pages * page);
    e.rows = std::max(e.rows, std::int64_t{s.batch} * s.q_len * s.heads);
    e.batch = std::max(e.batch, s.batch);
  }
  return e;
}

/// The help text of the shape options.
constexpr const char* kShapeUsage =
    "  --quick            a short table (heads 16/128, batch 1/32/128, ctx 4k/64k, q_len 1)\n"
    "  --heads LIST       query heads, multiples of 16 up to 128 (default 16,128)\n"
    "  --batches LIST     requests (default 1,4,16,64,128)\n"
    "  --ctx LIST         tokens per request, k = 1024 (default 1k,4k,16k,64k)\n"
    "  --q-lens LIST      new tokens per request, 1..4 (default 1,2)\n"
    "  --dtypes LIST      latent cache dtypes: bf16, e4m3 (default bf16,e4m3)\n"
    "  --page N           tokens per page (default 64; e.g. 1 or 16)\n"
    "  --reps N           timed calls per row (default 30; --quick 15)\n"
    "  --csv FILE         also write the rows as CSV\n";

/// How request 0's rows compare with the reference.
struct CheckStats {
  bool ok = false;
  double max_do = 0, max_dlse = 0;
};

/// Compares `rows` rows of a bf16 output `o` (512 a row) and its LSEs with the reference's
/// (`o_ref`, `lse_ref`, any floating type). Passes when every value is finite, |Δo| ≤ 2e-3 +
/// 1e-2·|o_ref| per element (bf16 output, P rounded to bf16, values of magnitude ≤ 1) and
/// |Δlse| ≤ 2e-3 (fp32 scores and sums); a NaN fails.
template <class Ref>
CheckStats compare_rows(const std::uint16_t* o, const float* lse, const Ref* o_ref,
                        const Ref* lse_ref, std::size_t rows) {
  auto worse = [](double worst, double e) { return std::isnan(e) ? INFINITY : std::max(worst, e); };
  CheckStats c;
  bool within = true;
  for (std::size_t i = 0; i < rows * kRank; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(o[i]) << 16;
    float got;
    std::memcpy(&got, &bits, 4);
    const double ref = static_cast<double>(o_ref[i]), d = std::fabs(got - ref);
    c.max_do = worse(c.max_do, d);
    if (!(d <= 2e-3 + 1e-2 * std::fabs(ref))) within = false;
  }
  for (std::size_t i = 0; i < rows; ++i)
    c.max_dlse = worse(c.max_dlse, std::fabs(static_cast<double>(lse[i]) - lse_ref[i]));
  c.ok = within && c.max_dlse <= 2e-3;
  return c;
}

}  // namespace mla_inputs
