/// @file split_merge_demo.cpp
/// @brief The main demo: a decode-sized attention problem computed in one pass and as S KV splits
///        merged with ⊕ (both LSE bases, random merge orders), on the CPU and, when present, the
///        GPU.
///
/// Prints one table row per configuration with the largest errors against the one-pass state and
/// the time taken; exits non-zero if any configuration disagrees beyond tolerance.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "attnstate/attnstate.hpp"

#if defined(ATTNSTATE_HAS_CUDA)
#include <cuda_runtime.h>

#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/merge.hpp"
#endif

namespace {

using attnstate::ConstStateView;
using attnstate::DType;
using attnstate::LseBase;
using attnstate::StateView;
using Clock = std::chrono::steady_clock;

constexpr std::int64_t kHeadsQ = 32, kHeadsKv = 8, kHeadDim = 128, kKeys = 32768;
constexpr float kTolO = 2e-5f, kTolLse = 2e-5f;

/// An owning fp32 state `(1 token, heads, head_dim)`.
struct OwnedState {
  std::vector<float> o, lse;
  LseBase base;
  explicit OwnedState(LseBase b) : o(kHeadsQ * kHeadDim), lse(kHeadsQ), base(b) {}
  StateView view() {
    return attnstate::make_state_view(o.data(), DType::kF32, lse.data(), 1, kHeadsQ, kHeadDim,
                                      base);
  }
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Largest |o - ref.o| and |lse - ref.lse| (LSEs compared in natural log).
std::pair<double, double> max_errors(const OwnedState& s, const OwnedState& ref) {
  double eo = 0, el = 0;
  for (std::size_t i = 0; i < s.o.size(); ++i)
    eo = std::max(eo, double(std::fabs(s.o[i] - ref.o[i])));
  for (std::size_t i = 0; i < s.lse.size(); ++i) {
    const float a = attnstate::math::convert_lse(s.lse[i], s.base, LseBase::kNatural);
    const float b = attnstate::math::convert_lse(ref.lse[i], ref.base, LseBase::kNatural);
    el = std::max(el, double(std::fabs(a - b)));
  }
  return {eo, el};
}

bool report(const char* where, const char* how, int splits, LseBase base, const OwnedState& s,
            const OwnedState& ref, double ms) {
  const auto [eo, el] = max_errors(s, ref);
  const bool ok = eo <= kTolO && el <= kTolLse;
  std::printf("| %-4s | %-22s | %6d | %-7s | %9.2e | %9.2e | %9.3f | %-4s |\n", where, how, splits,
              attnstate::to_string(base), eo, el, ms, ok ? "ok" : "FAIL");
  return ok;
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> q(kHeadsQ * kHeadDim), k(kKeys * kHeadsKv * kHeadDim), v(k.size());
  for (auto& x : q) x = normal(rng);
  for (auto& x : k) x = normal(rng);
  for (auto& x : v) x = normal(rng);
  const float scale = 1.f / std::sqrt(float(kHeadDim));

  auto kv_view = [&](const std::vector<float>& t, std::int64_t begin, std::int64_t end) {
    return attnstate::make_tensor_view(t.data() + begin * kHeadsKv * kHeadDim, DType::kF32,
                                       {end - begin, kHeadsKv, kHeadDim});
  };
  const auto qv = attnstate::make_tensor_view(q.data(), DType::kF32, {1, kHeadsQ, kHeadDim});

  std::printf(
      "split_merge_demo: 1 query token, H_q/H_kv = %lld/%lld, head_dim %lld, %lld keys, f32\n\n",
      (long long)kHeadsQ, (long long)kHeadsKv, (long long)kHeadDim, (long long)kKeys);
  std::printf(
      "| where | how                    | splits | base    | max|do|   | max|dlse| | time ms   | "
      "ok   |\n");
  std::printf(
      "|------|------------------------|--------|---------|-----------|-----------|-----------|----"
      "--|\n");

  OwnedState whole(LseBase::kNatural);
  auto t0 = Clock::now();
  attnstate::cpu::attention_state(qv, kv_view(k, 0, kKeys), kv_view(v, 0, kKeys), scale,
                                  whole.view());
  bool ok = report("cpu", "one pass", 1, LseBase::kNatural, whole, whole, seconds_since(t0) * 1e3);

  for (int splits : {1, 2, 7, 29, 128}) {
    for (LseBase base : {LseBase::kNatural, LseBase::kBase2}) {
      // Split states in `base`, stacked [S, 1, heads, D] (states-major).
      std::vector<float> so(std::size_t(splits) * kHeadsQ * kHeadDim),
          slse(std::size_t(splits) * kHeadsQ);
      t0 = Clock::now();
      for (int s = 0; s < splits; ++s) {
        const std::int64_t b = kKeys * s / splits, e = kKeys * (s + 1) / splits;
        auto part = attnstate::make_state_view(so.data() + std::size_t(s) * kHeadsQ * kHeadDim,
                                               DType::kF32, slse.data() + std::size_t(s) * kHeadsQ,
                                               1, kHeadsQ, kHeadDim, base);
        attnstate::cpu::attention_state(qv, kv_view(k, b, e), kv_view(v, b, e), scale, part);
      }
      //! [merge-splits]
      // The S split states as one stack [S, tokens = 1, heads, D], merged into one state.
      const auto stack = attnstate::make_state_stack(so.data(), DType::kF32, slse.data(),
                                                     attnstate::StackOrder::kStatesMajor, 1, splits,
                                                     kHeadsQ, kHeadDim, base);
      OwnedState merged(base);
      attnstate::cpu::merge_states(stack, merged.view());
      //! [merge-splits]
      ok &= report("cpu", "split + merge_states", splits, base, merged, whole,
                   seconds_since(t0) * 1e3);

      // The same parts merged pairwise in a random order: ⊕ is associative and commutative.
      std::vector<int> order(splits);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      OwnedState acc(base);
      std::fill(acc.o.begin(), acc.o.end(), 0.f);
      std::fill(acc.lse.begin(), acc.lse.end(), -INFINITY);  // the empty state: the identity
      t0 = Clock::now();
      for (int s : order) {
        auto part = attnstate::make_const_state_view(
            so.data() + std::size_t(s) * kHeadsQ * kHeadDim, DType::kF32,
            slse.data() + std::size_t(s) * kHeadsQ, 1, kHeadsQ, kHeadDim, base);
        attnstate::cpu::merge_state_inplace(acc.view(), part);
      }
      ok &=
          report("cpu", "random pairwise order", splits, base, acc, whole, seconds_since(t0) * 1e3);

      // Rebase to natural log: the same state in the other convention.
      OwnedState natural(LseBase::kNatural);
      attnstate::cpu::rebase(merged.view(), natural.view());
      if (base == LseBase::kBase2)
        ok &= report("cpu", "merge in base2, rebase", splits, base, natural, whole, 0.0);

#if defined(ATTNSTATE_HAS_CUDA)
      int devices = 0;
      if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
        float *d_o = nullptr, *d_lse = nullptr, *d_out_o = nullptr, *d_out_lse = nullptr;
        ATTNSTATE_CUDA_CHECK(cudaMalloc(&d_o, so.size() * 4));
        ATTNSTATE_CUDA_CHECK(cudaMalloc(&d_lse, slse.size() * 4));
        ATTNSTATE_CUDA_CHECK(cudaMalloc(&d_out_o, kHeadsQ * kHeadDim * 4));
        ATTNSTATE_CUDA_CHECK(cudaMalloc(&d_out_lse, kHeadsQ * 4));
        ATTNSTATE_CUDA_CHECK(cudaMemcpy(d_o, so.data(), so.size() * 4, cudaMemcpyHostToDevice));
        ATTNSTATE_CUDA_CHECK(
            cudaMemcpy(d_lse, slse.data(), slse.size() * 4, cudaMemcpyHostToDevice));
        ATTNSTATE_CUDA_CHECK(cudaMemset(d_out_o, 0xFF, kHeadsQ * kHeadDim * 4));  // NaN poison
        auto dstack = attnstate::make_state_stack(
            d_o, DType::kF32, d_lse, attnstate::StackOrder::kStatesMajor, 1, splits, kHeadsQ,
            kHeadDim, base, attnstate::MemorySpace::kDevice);
        auto dout = attnstate::make_state_view(d_out_o, DType::kF32, d_out_lse, 1, kHeadsQ,
                                               kHeadDim, base, attnstate::MemorySpace::kDevice);
        attnstate::cuda::merge_states(dstack, dout);  // warm-up
        ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
        t0 = Clock::now();
        attnstate::cuda::merge_states(dstack, dout);
        ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
        const double ms = seconds_since(t0) * 1e3;
        OwnedState gpu(base);
        ATTNSTATE_CUDA_CHECK(
            cudaMemcpy(gpu.o.data(), d_out_o, gpu.o.size() * 4, cudaMemcpyDeviceToHost));
        ATTNSTATE_CUDA_CHECK(
            cudaMemcpy(gpu.lse.data(), d_out_lse, gpu.lse.size() * 4, cudaMemcpyDeviceToHost));
        ok &= report("gpu", "cuda::merge_states", splits, base, gpu, whole, ms);
        cudaFree(d_o);
        cudaFree(d_lse);
        cudaFree(d_out_o);
        cudaFree(d_out_lse);
      }
#endif
    }
  }
  std::printf("\n%s\n", ok ? "all configurations agree with the one-pass state" : "MISMATCH");
  return ok ? 0 : 1;
}
