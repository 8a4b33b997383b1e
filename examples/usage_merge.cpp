/// @file usage_merge.cpp
/// @brief The first C++ code of the README and of docs/usage.md, run: two partial states of
///        disjoint key sets stored as their producers write them (FlashAttention: bf16 `o`,
///        natural-log LSE read head-major; FlashInfer: f32 `o`, base-2 LSE `[tokens, heads]`)
///        merged into one state, and S states stacked `[S, tokens, heads, D]` merged at once;
///        both checked against the one-pass state over all the keys.
///
/// Exits 0 only if both merges agree with the one-pass state.
//! [usage-include]
#include "attnstate/attnstate.hpp"
using namespace attnstate;
//! [usage-include]

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace {

constexpr std::int64_t kTokens = 4, kHeads = 32, kDim = 128, kKeys = 96;
constexpr std::int64_t kRows = kTokens * kHeads;

/// Writes the one-pass state of the queries `q` over keys `[first, last)` of `k`, `v` into `out`.
void state_of(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
              std::int64_t first, std::int64_t last, StateView out) {
  const std::int64_t n = last - first;
  cpu::attention_state(
      make_tensor_view(q.data(), DType::kF32, {kTokens, kHeads, kDim}),
      make_tensor_view(k.data() + first * kHeads * kDim, DType::kF32, {n, kHeads, kDim}),
      make_tensor_view(v.data() + first * kHeads * kDim, DType::kF32, {n, kHeads, kDim}), 0.f, out);
}

/// True when the natural-base state (o, lse) is within `o_tol` / 1e-4 of the reference; NaN
/// fails.
bool agrees(const char* what, const std::vector<float>& o, const std::vector<float>& lse,
            const std::vector<float>& o_ref, const std::vector<float>& lse_ref, float o_tol) {
  float o_diff = 0.f, lse_diff = 0.f;
  bool ok = true;
  for (std::size_t i = 0; i < o.size(); ++i) {
    const float d = std::fabs(o[i] - o_ref[i]);
    ok &= d <= o_tol;
    o_diff = std::fmax(o_diff, d);
  }
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const float d = std::fabs(lse[i] - lse_ref[i]);
    ok &= d <= 1e-4f;
    lse_diff = std::fmax(lse_diff, d);
  }
  std::printf("%-40s max |o diff| %.2e, max |lse diff| %.2e  %s\n", what, o_diff, lse_diff,
              ok ? "ok" : "WRONG");
  return ok;
}

}  // namespace

int main() {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  auto random = [&](std::int64_t n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = normal(rng);
    return x;
  };
  const std::vector<float> q = random(kRows * kDim), k = random(kKeys * kHeads * kDim),
                           v = random(kKeys * kHeads * kDim);

  // What the producers wrote. Keys [0, 40) as FlashAttention writes a state: bf16 o, natural-log
  // LSE [heads, tokens] (softmax_lse of one sequence of 4 query rows).
  std::vector<std::uint16_t> o_a(kRows * kDim);
  std::vector<float> lse_a(kRows);
  state_of(q, k, v, 0, 40,
           with_head_major_lse(make_state_view(o_a.data(), DType::kBF16, lse_a.data(), kTokens,
                                               kHeads, kDim, LseBase::kNatural)));
  // Keys [40, 96) as FlashInfer writes it: f32 o, base-2 LSE [tokens, heads].
  std::vector<float> o_b(kRows * kDim), lse_b(kRows);
  state_of(q, k, v, 40, kKeys,
           make_state_view(o_b.data(), DType::kF32, lse_b.data(), kTokens, kHeads, kDim,
                           LseBase::kBase2));
  // S = 3 states of keys [0, 32), [32, 64), [64, 96), stacked [S, tokens, heads, D], base 2.
  const std::int64_t S = 3;
  std::vector<float> o_parts(S * kRows * kDim), lse_parts(S * kRows);
  for (std::int64_t s = 0; s < S; ++s)
    state_of(q, k, v, s * 32, (s + 1) * 32,
             make_state_view(o_parts.data() + s * kRows * kDim, DType::kF32,
                             lse_parts.data() + s * kRows, kTokens, kHeads, kDim, LseBase::kBase2));
  // The one-pass state over all the keys.
  std::vector<float> o_ref(kRows * kDim), lse_ref(kRows);
  state_of(q, k, v, 0, kKeys,
           make_state_view(o_ref.data(), DType::kF32, lse_ref.data(), kTokens, kHeads, kDim,
                           LseBase::kNatural));
  std::vector<float> o_out(kRows * kDim), lse_out(kRows);

  //! [usage-merge]
  // Two partial states of the same 4 query rows x 32 heads x 128. One from FlashAttention for one
  // sequence of 4 query rows (softmax_lse [batch = 1, heads, seqlen_q = 4]: natural log, read
  // head-major; bf16 o), one from FlashInfer (base-2 LSE [tokens, heads], f32 o).
  ConstStateView a = with_head_major_lse(
      make_const_state_view(o_a.data(), DType::kBF16, lse_a.data(), 4, 32, 128, LseBase::kNatural));
  ConstStateView b =
      make_const_state_view(o_b.data(), DType::kF32, lse_b.data(), 4, 32, 128, LseBase::kBase2);
  // (FlashAttention writes lse = +inf for a row without keys; the algebra's empty state is
  // (0, -inf) and +inf is invalid input: map +inf to -inf before merging, in place, with
  // cpu::mark_empty_rows / attnstate::cuda::mark_empty_rows on a mutable view of the same memory.)

  // The merged state, written in f32 with a natural-log LSE. Bases are converted on load.
  StateView out =
      make_state_view(o_out.data(), DType::kF32, lse_out.data(), 4, 32, 128, LseBase::kNatural);
  cpu::merge_state(a, b, out);  // attnstate::cuda::merge_state(a, b, out, stream) on the GPU
  //! [usage-merge]
  // a's o is bf16: its rounding (2^-9 relative, here below 4e-3) bounds the merged o's error.
  bool ok =
      agrees("merge_state (bf16 natural + f32 base 2)", o_out, lse_out, o_ref, lse_ref, 4e-3f);

  //! [usage-merge-states]
  // S states per token stacked [S, tokens, heads, D] (e.g. KV splits), merged at once.
  ConstStateStackView parts =
      make_state_stack(o_parts.data(), DType::kF32, lse_parts.data(), StackOrder::kStatesMajor, 4,
                       S, 32, 128, LseBase::kBase2);
  cpu::merge_states(parts, out);

  // Same calls on the GPU, on your stream (device views: MemorySpace::kDevice).
  // attnstate::cuda::merge_states(device_parts, device_out, stream);
  //! [usage-merge-states]
  ok &= agrees("merge_states (S = 3, base 2)", o_out, lse_out, o_ref, lse_ref, 1e-5f);
  return ok ? 0 : 1;
}
