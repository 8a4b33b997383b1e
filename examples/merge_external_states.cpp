/// @file merge_external_states.cpp
/// @brief Merging attention states produced by other libraries: one in base 2 (as FlashInfer
///        returns its LSE) and one in natural log (as FlashAttention does), imported with their
///        base tags and merged exactly with `cpu::merge_state`; and the error that silently
///        mixing the two conventions would have caused. The FlashAttention-style state also has
///        FlashAttention's LSE layout, `[heads, tokens]` (`with_head_major_lse`).
///
/// The two "external" states are computed here with `cpu::attention_state` over two halves of
/// one KV cache, written in the other libraries' conventions (bf16 `o`, fp32 LSE); the state of
/// the whole cache computed in one pass is the ground truth. Exits non-zero if the tagged merge
/// is not within bf16 rounding of the truth, or if the mislabeled merge is not visibly wrong.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "attnstate/attnstate.hpp"

namespace {

using attnstate::bfloat16_t;
using attnstate::DType;
using attnstate::LseBase;

constexpr std::int64_t kTokens = 4, kHeadsQ = 8, kHeadsKv = 2, kHeadDim = 64, kKeys = 1000;
constexpr std::int64_t kSplit = 600;  // keys [0, 600) -> "FlashInfer", [600, 1000) -> "FA"

/// Raw buffers as another library hands them over: bf16 `o`, fp32 LSE, no base attached.
struct ExternalState {
  std::vector<bfloat16_t> o = std::vector<bfloat16_t>(kTokens * kHeadsQ * kHeadDim);
  std::vector<float> lse = std::vector<float>(kTokens * kHeadsQ);
};

/// Stands in for an external kernel: attention of `q` over keys [k0, k1), LSE in `base`, laid out
/// `[tokens, heads]` (FlashInfer) or `[heads, tokens]` (`head_major`, FlashAttention).
ExternalState external_kernel(const std::vector<bfloat16_t>& q, const std::vector<bfloat16_t>& k,
                              const std::vector<bfloat16_t>& v, std::int64_t k0, std::int64_t k1,
                              LseBase base, bool head_major) {
  ExternalState s;
  const std::int64_t row = kHeadsKv * kHeadDim;
  const auto kv = [&](const std::vector<bfloat16_t>& x) {
    return attnstate::make_tensor_view(x.data() + k0 * row, DType::kBF16,
                                       {k1 - k0, kHeadsKv, kHeadDim});
  };
  attnstate::StateView out = attnstate::make_state_view(s.o.data(), DType::kBF16, s.lse.data(),
                                                        kTokens, kHeadsQ, kHeadDim, base);
  if (head_major) out = attnstate::with_head_major_lse(out);
  attnstate::cpu::attention_state(
      attnstate::make_tensor_view(q.data(), DType::kBF16, {kTokens, kHeadsQ, kHeadDim}), kv(k),
      kv(v), 1.f / std::sqrt(float(kHeadDim)), out);
  return s;
}

/// Largest |a - b| over `o` relative to the largest |b|.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return num / den;
}

std::vector<bfloat16_t> random_bf16(std::size_t n, std::mt19937& rng, float amplitude) {
  std::uniform_real_distribution<float> uni(-amplitude, amplitude);
  std::vector<bfloat16_t> x(n);
  for (auto& e : x) e = attnstate::from_float<bfloat16_t>(uni(rng));
  return x;
}

}  // namespace

int main() {
  std::mt19937 rng(2026);
  const auto q = random_bf16(kTokens * kHeadsQ * kHeadDim, rng, 4.f);
  const auto k = random_bf16(kKeys * kHeadsKv * kHeadDim, rng, 1.f);
  const auto v = random_bf16(kKeys * kHeadsKv * kHeadDim, rng, 1.f);

  const ExternalState flashinfer = external_kernel(q, k, v, 0, kSplit, LseBase::kBase2, false);
  const ExternalState flashattn = external_kernel(q, k, v, kSplit, kKeys, LseBase::kNatural, true);

  //! [import-external-states]
  // Import each state with the base its producer uses: FlashInfer's LSE is log2, `[tokens, heads]`;
  // FlashAttention's is ln, here `[heads, tokens]`: the softmax_lse `[batch, heads, seqlen_q]` of
  // one batch element whose kTokens query rows are its seqlen_q (for batched decode, seqlen_q = 1,
  // it is `[tokens = batch, heads]`: the plain view, no with_head_major_lse). The tag and the
  // strides travel with the view; every merge converts on load. (FlashAttention writes
  // lse = +inf for a row without keys: make such rows empty before merging, in place, with
  // attnstate::cpu::mark_empty_rows or attnstate::cuda::mark_empty_rows on a mutable view.)
  const attnstate::ConstStateView a =
      attnstate::make_const_state_view(flashinfer.o.data(), DType::kBF16, flashinfer.lse.data(),
                                       kTokens, kHeadsQ, kHeadDim, LseBase::kBase2);
  const attnstate::ConstStateView b = attnstate::with_head_major_lse(
      attnstate::make_const_state_view(flashattn.o.data(), DType::kBF16, flashattn.lse.data(),
                                       kTokens, kHeadsQ, kHeadDim, LseBase::kNatural));
  //! [import-external-states]

  //! [merge-mixed-bases]
  // out = a ⊕ b, written in the output view's dtype (f32) and base (natural).
  std::vector<float> o(kTokens * kHeadsQ * kHeadDim), lse(kTokens * kHeadsQ);
  attnstate::cpu::merge_state(a, b,
                              attnstate::make_state_view(o.data(), DType::kF32, lse.data(), kTokens,
                                                         kHeadsQ, kHeadDim, LseBase::kNatural));
  //! [merge-mixed-bases]

  // Ground truth: one pass over all keys.
  std::vector<float> o_ref(o.size()), lse_ref(lse.size());
  attnstate::cpu::attention_state(
      attnstate::make_tensor_view(q.data(), DType::kBF16, {kTokens, kHeadsQ, kHeadDim}),
      attnstate::make_tensor_view(k.data(), DType::kBF16, {kKeys, kHeadsKv, kHeadDim}),
      attnstate::make_tensor_view(v.data(), DType::kBF16, {kKeys, kHeadsKv, kHeadDim}),
      1.f / std::sqrt(float(kHeadDim)),
      attnstate::make_state_view(o_ref.data(), DType::kF32, lse_ref.data(), kTokens, kHeadsQ,
                                 kHeadDim, LseBase::kNatural));

  // The classic bug: the base-2 LSE read as if it were natural (no tag, or the wrong one).
  attnstate::ConstStateView a_mislabeled = a;
  a_mislabeled.base = LseBase::kNatural;
  std::vector<float> o_bad(o.size()), lse_bad(lse.size());
  attnstate::cpu::merge_state(
      a_mislabeled, b,
      attnstate::make_state_view(o_bad.data(), DType::kF32, lse_bad.data(), kTokens, kHeadsQ,
                                 kHeadDim, LseBase::kNatural));

  double lse_err = 0, lse_err_bad = 0;
  for (std::size_t i = 0; i < lse.size(); ++i) {
    lse_err = std::max(lse_err, double(std::fabs(lse[i] - lse_ref[i])));
    lse_err_bad = std::max(lse_err_bad, double(std::fabs(lse_bad[i] - lse_ref[i])));
  }
  const double err_tagged = relative_error(o, o_ref);
  const double err_mixed = relative_error(o_bad, o);
  std::printf(
      "merge of a base-2 state (FlashInfer, keys [0, %lld)) and a natural-log state\n"
      "(FlashAttention, keys [%lld, %lld)), %lld heads x head_dim %lld, bf16 o:\n\n",
      (long long)kSplit, (long long)kSplit, (long long)kKeys, (long long)kHeadsQ,
      (long long)kHeadDim);
  std::printf("  %-44s %-22s %s\n", "merge", "rel. error of o", "max |lse error|");
  std::printf("  %-44s %-22.3e %.3e\n", "tagged bases (cpu::merge_state) vs one pass", err_tagged,
              lse_err);
  std::printf("  %-44s %-22.3e %.3e\n", "base 2 silently read as natural vs tagged", err_mixed,
              lse_err_bad);

  // bf16 inputs: the tagged merge agrees with one pass to bf16 rounding; the mixed one does not.
  const bool ok = err_tagged < 1e-2 && lse_err < 1e-4 && err_mixed > 10 * err_tagged;
  std::printf(
      "\n%s\n",
      ok ? "OK: tagged merge exact to bf16 rounding; mixing bases is visibly wrong" : "FAILED");
  return ok ? 0 : 1;
}
