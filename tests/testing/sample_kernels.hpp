/// @file sample_kernels.hpp
/// @brief Small attention kernels written the way a user would, used to check that the testing
///        kit tells correct kernels from broken ones: a direct fp32 kernel (correct, and with
///        three classic defects) and a CPU model of a tensor-core flash kernel (correct, and with
///        two accumulator defects and two sink defects).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/problem.hpp"

namespace attnstate_test {

using attnstate::LseBase;
using attnstate::testing::AttentionProblem;
using attnstate::testing::HostState;

/// The defect a sample kernel carries.
enum class Defect {
  kNone,                  ///< Correct: max-subtracted, empty set gives (0, -inf), LSE in the
                          ///< requested base.
  kNoMaxSubtraction,      ///< Exponentiates raw scores: overflows for scores above ~88.
  kEmptyZeroOverZero,     ///< Normalises an empty key set by 0/0 (NaN in o).
  kBase2DeclaredNatural,  ///< Always computes a base-2 LSE but declares the requested base.
};

/// A direct fp32 implementation of attention over `keys` with the given defect.
inline HostState sample_kernel(const AttentionProblem& p, const std::vector<std::int64_t>& keys,
                               Defect defect) {
  HostState out = attnstate::testing::make_output_state(p);
  const std::int64_t dim = p.head_dim();
  std::vector<float> s(keys.size());
  std::vector<float> acc(static_cast<std::size_t>(dim));
  for (std::int64_t t = 0; t < p.tokens(); ++t) {
    for (std::int64_t h = 0; h < p.heads_q(); ++h) {
      const std::int64_t g = h / p.group_size();
      float m = -INFINITY;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        float dot = 0.f;
        for (std::int64_t d = 0; d < dim; ++d) {
          dot += p.q.get((t * p.heads_q() + h) * dim + d) *
                 p.k.get((keys[i] * p.heads_kv() + g) * dim + d);
        }
        s[i] = dot * p.scale;
        m = std::fmax(m, s[i]);
      }
      if (defect == Defect::kNoMaxSubtraction) m = 0.f;
      float sum = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (std::size_t i = 0; i < keys.size(); ++i) {
        const float w = std::exp(s[i] - m);
        sum += w;
        for (std::int64_t d = 0; d < dim; ++d) {
          acc[static_cast<std::size_t>(d)] += w * p.v.get((keys[i] * p.heads_kv() + g) * dim + d);
        }
      }
      const bool empty = keys.empty();
      for (std::int64_t d = 0; d < dim; ++d) {
        float o = acc[static_cast<std::size_t>(d)] / sum;  // 0/0 when empty
        if (empty && defect != Defect::kEmptyZeroOverZero) o = 0.f;
        out.set_o(t, h, d, o);
      }
      float lse_natural = empty ? -INFINITY : m + std::log(sum);
      float lse =
          p.base == LseBase::kBase2 ? lse_natural * attnstate::constants::kLog2e : lse_natural;
      if (defect == Defect::kBase2DeclaredNatural) lse = lse_natural * attnstate::constants::kLog2e;
      out.set_lse(t, h, lse);
    }
  }
  return out;
}

/// How `flash_kernel` applies the problem's attention sinks (`AttentionProblem::sinks`).
enum class SinkMode {
  kOnce,      ///< Correct: each row merged once with its sink, after the splits are merged.
  kIgnore,    ///< DEFECT: the sinks are not applied.
  kPerSplit,  ///< DEFECT: the sink is merged into every split's state (counted once per split).
};

/// How `flash_kernel` computes: a CPU model of a tensor-core flash / split-KV decode kernel.
struct FlashConfig {
  std::int64_t block = 64;  ///< Keys per block: the running max (and the accumulator's rescale)
                            ///< is updated once per block.
  int splits = 1;           ///< Split-KV: the keys are cut into this many contiguous chunks, each
                            ///< reduced to an fp32 state, merged in fp32 (max-subtracted, base 2).
  bool round_p = true;      ///< Round the probabilities P to the input dtype before P·V, as a
                            ///< tensor-core MMA with 16-bit operands does (FlashAttention).
  bool acc_in_input_dtype = false;  ///< DEFECT: the P·V accumulator is kept in the input dtype
                                    ///< (rounded after every key) instead of fp32.
  bool forget_rescale = false;      ///< DEFECT: the accumulator is not multiplied by
                                    ///< `2^(m_old - m_new)` when a block raises the running max.
  /// How the problem's sinks are applied (correct: once, after the splits).
  SinkMode sinks = SinkMode::kOnce;
};

/// Merges the fp32 state `(o, lse2)` (base 2) with the sink state `(0, sink · log2(e))` in fp32,
/// in place (`math::pair_weights`, max-subtracted; an empty state becomes `(0, s)`).
inline void merge_sink_fp32(std::vector<float>& o, float& lse2, float sink) {
  namespace math = attnstate::math;
  const math::PairWeights w = math::pair_weights(
      LseBase::kBase2, lse2, math::convert_lse(sink, LseBase::kNatural, LseBase::kBase2));
  for (float& x : o) x = math::pair_combine(w, x, 0.f);
  lse2 = w.lse;
}

/// `x` rounded to `dt` (round to nearest even) and widened back to fp32.
inline float round_to(attnstate::DType dt, float x) {
  switch (dt) {
    case attnstate::DType::kF16:
      return attnstate::to_float(attnstate::from_float<attnstate::half_t>(x));
    case attnstate::DType::kBF16:
      return attnstate::to_float(attnstate::from_float<attnstate::bfloat16_t>(x));
    default:
      return x;
  }
}

/// A tensor-core style kernel, computed the way the library's CUDA decode/cascade kernels
/// compute: scores in fp32 from the stored 16-bit `q`, `k` (exact products, fp32 sums), scaled
/// by `scale · log2(e)` in fp32; the online softmax in base 2 (`math::OnlineSoftmax`), one max
/// per block; the running sum of P in fp32 from the unrounded probabilities; P rounded to the
/// input dtype for P·V (`round_p`); the accumulator in fp32; split states merged in fp32;
/// `o = acc / l` rounded once to the output dtype. `config` may plant an accumulator defect.
inline HostState flash_kernel(const AttentionProblem& p, const std::vector<std::int64_t>& keys,
                              const FlashConfig& config) {
  namespace math = attnstate::math;
  HostState out = attnstate::testing::make_output_state(p);
  const attnstate::DType in = p.v.dtype();
  const std::int64_t dim = p.head_dim(), n = static_cast<std::int64_t>(keys.size());
  const std::vector<float> q = p.q.to_floats(), k = p.k.to_floats(), v = p.v.to_floats();
  const float s2_scale = math::base2_score_scale(p.scale);
  const std::int64_t splits = std::max<std::int64_t>(1, std::min<std::int64_t>(config.splits, n));
  const std::int64_t block = std::max<std::int64_t>(1, config.block);
  std::vector<float> s2, acc(static_cast<std::size_t>(dim)), o(acc.size());
  std::vector<std::vector<float>> split_o(static_cast<std::size_t>(splits));
  std::vector<float> split_lse(static_cast<std::size_t>(splits));
  for (std::int64_t t = 0; t < p.tokens(); ++t) {
    for (std::int64_t h = 0; h < p.heads_q(); ++h) {
      const std::int64_t g = h / p.group_size();
      const float* qr = &q[static_cast<std::size_t>((t * p.heads_q() + h) * dim)];
      for (std::int64_t sp = 0; sp < splits; ++sp) {
        const std::int64_t lo = n * sp / splits, hi = n * (sp + 1) / splits;
        math::OnlineSoftmax os;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (std::int64_t b0 = lo; b0 < hi; b0 += block) {
          const std::int64_t b1 = std::min(hi, b0 + block);
          s2.assign(static_cast<std::size_t>(b1 - b0), 0.f);
          float bm = -INFINITY;
          for (std::int64_t i = b0; i < b1; ++i) {
            const float* kr = &k[static_cast<std::size_t>((keys[i] * p.heads_kv() + g) * dim)];
            float dot = 0.f;
            for (std::int64_t d = 0; d < dim; ++d) dot += qr[d] * kr[d];
            s2[static_cast<std::size_t>(i - b0)] = dot * s2_scale;
            bm = math::nan_max(bm, s2[static_cast<std::size_t>(i - b0)]);
          }
          const float alpha = os.rescale(bm);
          if (!config.forget_rescale) {
            for (float& a : acc) a *= alpha;
          }
          float psum = 0.f;
          for (std::int64_t i = b0; i < b1; ++i) {
            const float pv = os.prob(s2[static_cast<std::size_t>(i - b0)]);
            const float pr = config.round_p ? round_to(in, pv) : pv;
            psum += pv;
            const float* vr = &v[static_cast<std::size_t>((keys[i] * p.heads_kv() + g) * dim)];
            for (std::int64_t d = 0; d < dim; ++d) {
              float& a = acc[static_cast<std::size_t>(d)];
              a += pr * vr[d];
              if (config.acc_in_input_dtype) a = round_to(in, a);
            }
          }
          os.add(psum);
        }
        std::vector<float>& so = split_o[static_cast<std::size_t>(sp)];
        so.resize(acc.size());
        for (std::size_t d = 0; d < acc.size(); ++d) so[d] = acc[d] * os.inv_sum();
        split_lse[static_cast<std::size_t>(sp)] = os.lse(LseBase::kBase2);
        if (p.has_sinks() && config.sinks == SinkMode::kPerSplit) {
          merge_sink_fp32(so, split_lse[static_cast<std::size_t>(sp)],
                          p.sinks[static_cast<std::size_t>(h)]);
        }
      }
      // Merge the splits in fp32 (base 2), then round o once.
      float m = -INFINITY;
      for (float l : split_lse) m = math::nan_max(m, l);
      float sum = 0.f;
      std::fill(o.begin(), o.end(), 0.f);
      for (std::int64_t sp = 0; sp < splits; ++sp) {
        const float l = split_lse[static_cast<std::size_t>(sp)];
        if (math::is_empty_lse(l)) continue;
        const float w = math::merge_weight(LseBase::kBase2, l, m);
        sum += w;
        for (std::size_t d = 0; d < o.size(); ++d)
          o[d] += w * split_o[static_cast<std::size_t>(sp)][d];
      }
      const math::MergeResult r = math::merge_finalize(LseBase::kBase2, m, sum);
      for (float& x : o) x *= r.inv_sum;
      float lse2 = r.lse;
      // The sink once, after every split: one more merge, before o is rounded.
      if (p.has_sinks() && config.sinks == SinkMode::kOnce) {
        merge_sink_fp32(o, lse2, p.sinks[static_cast<std::size_t>(h)]);
      }
      for (std::int64_t d = 0; d < dim; ++d) out.set_o(t, h, d, o[static_cast<std::size_t>(d)]);
      out.set_lse(t, h, math::convert_lse(lse2, LseBase::kBase2, p.base));
    }
  }
  return out;
}

}  // namespace attnstate_test
