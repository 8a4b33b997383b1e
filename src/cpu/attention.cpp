/// @file attention.cpp
/// @brief CPU backend: the one-pass producer `attention_state(q, k, v, scale, out)`,
///        multi-threaded over (token, query head), fp32 online softmax (math::OnlineSoftmax).
#include "attnstate/cpu/attention.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "common/validate.hpp"
#include "cpu/parallel.hpp"

namespace attnstate {
namespace cpu {
namespace {

namespace v = attnstate::detail;
constexpr MemorySpace kHost = MemorySpace::kHost;
/// Keys scored per online-softmax block.
constexpr std::int64_t kKeyBlock = 64;

/// Bytes spanned by a validated tensor view (0 when it has no elements).
std::int64_t tensor_bytes(const ConstTensorView& t) {
  std::int64_t span = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] == 0) return 0;
    span = v::span_of(t.shape[i], t.stride[i], span);
  }
  return span * static_cast<std::int64_t>(size_of(t.dtype));
}

template <class Tq, class Tkv, class To>
void attend_rows(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& val,
                 float scale, const StateView& out, std::int64_t r0, std::int64_t r1) {
  const std::int64_t heads_q = q.shape[1], dim = q.shape[2], keys = k.shape[0];
  const std::int64_t group = heads_q / k.shape[1];
  const float s2_scale = math::base2_score_scale(scale);
  std::vector<float> qf(dim), acc(dim), s2(kKeyBlock);
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t t = r / heads_q, h = r % heads_q, g = h / group;
    const Tq* qr = static_cast<const Tq*>(q.data) + t * q.stride[0] + h * q.stride[1];
    for (std::int64_t d = 0; d < dim; ++d) qf[d] = to_float(qr[d]);
    std::fill(acc.begin(), acc.end(), 0.f);
    math::OnlineSoftmax sm;
    for (std::int64_t i0 = 0; i0 < keys; i0 += kKeyBlock) {
      const std::int64_t n = std::min(kKeyBlock, keys - i0);
      float block_max = math::neg_inf();
      for (std::int64_t i = 0; i < n; ++i) {
        const Tkv* kr = static_cast<const Tkv*>(k.data) + (i0 + i) * k.stride[0] + g * k.stride[1];
        float dot = 0.f;
        for (std::int64_t d = 0; d < dim; ++d) dot += qf[d] * to_float(kr[d]);
        s2[i] = dot * s2_scale;
        block_max = math::nan_max(block_max, s2[i]);
      }
      const float alpha = sm.rescale(block_max);
      if (alpha != 1.f) {
        for (std::int64_t d = 0; d < dim; ++d) acc[d] *= alpha;
      }
      float p_sum = 0.f;
      for (std::int64_t i = 0; i < n; ++i) {
        const float p = sm.prob(s2[i]);
        p_sum += p;
        const Tkv* vr =
            static_cast<const Tkv*>(val.data) + (i0 + i) * val.stride[0] + g * val.stride[1];
        for (std::int64_t d = 0; d < dim; ++d) acc[d] += p * to_float(vr[d]);
      }
      sm.add(p_sum);
    }
    const float inv = sm.inv_sum();
    To* oo = static_cast<To*>(out.o) + out.o_offset(t, h);
    for (std::int64_t d = 0; d < dim; ++d) oo[d] = from_float<To>(acc[d] * inv);
    out.lse[out.lse_offset(t, h)] = sm.lse(out.base);
  }
}

}  // namespace

void attention_state(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& val,
                     float scale, StateView out) {
  static const char* const kFunc = "attnstate::cpu::attention_state";
  v::check_tensor(kFunc, "q", q, 3, kHost);
  v::check_tensor(kFunc, "k", k, 3, kHost);
  v::check_tensor(kFunc, "v", val, 3, kHost);
  v::check_min(kFunc, "q.shape[1]", q.shape[1], 1);
  v::check_min(kFunc, "q.shape[2]", q.shape[2], 1);
  v::check_min(kFunc, "k.shape[1]", k.shape[1], 1);
  if (k.shape[2] != q.shape[2]) {
    v::throw_argument(kFunc, "k.shape[2]", std::to_string(q.shape[2]) + " (q's head_dim)",
                      std::to_string(k.shape[2]));
  }
  if (q.shape[1] % k.shape[1] != 0) {
    v::throw_argument(kFunc, "k.shape[1]",
                      "a divisor of q's heads " + std::to_string(q.shape[1]) + " (GQA)",
                      std::to_string(k.shape[1]));
  }
  for (int i = 0; i < 3; ++i) {
    if (val.shape[i] != k.shape[i]) {
      const std::string name = "v.shape[" + std::to_string(i) + "]";
      v::throw_argument(kFunc, name.c_str(), std::to_string(k.shape[i]) + " (as k)",
                        std::to_string(val.shape[i]));
    }
  }
  if (val.dtype != k.dtype) {
    v::throw_argument(kFunc, "v.dtype", std::string(to_string(k.dtype)) + " (as k.dtype)",
                      to_string(val.dtype));
  }
  v::check_finite(kFunc, "scale", scale);
  v::check_output_state(kFunc, "out", out, kHost);
  const auto same = [&](const char* field, std::int64_t want, std::int64_t got, const char* what) {
    if (want != got)
      v::throw_argument(kFunc, field, std::to_string(want) + what, std::to_string(got));
  };
  same("out.tokens", q.shape[0], out.tokens, " (q.shape[0])");
  same("out.heads", q.shape[1], out.heads, " (q.shape[1])");
  same("out.head_dim", q.shape[2], out.head_dim, " (q.shape[2])");
  v::check_disjoint(kFunc, "out", out, "q", q.data, tensor_bytes(q), nullptr, 0);
  v::check_disjoint(kFunc, "out", out, "k", k.data, tensor_bytes(k), nullptr, 0);
  v::check_disjoint(kFunc, "out", out, "v", val.data, tensor_bytes(val), nullptr, 0);

  const std::int64_t rows = out.tokens * out.heads;
  if (rows == 0) return;
  const std::int64_t work = std::max<std::int64_t>(1, k.shape[0]) * q.shape[2] * 2;
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 16) / work);
  dispatch_dtype(q.dtype, [&](auto tq) {
    dispatch_dtype(k.dtype, [&](auto tkv) {
      dispatch_dtype(out.dtype, [&](auto to) {
        using Tq = decltype(tq);
        using Tkv = decltype(tkv);
        using To = decltype(to);
        detail::parallel_for(0, rows, grain, [&](std::int64_t r0, std::int64_t r1) {
          attend_rows<Tq, Tkv, To>(q, k, val, scale, out, r0, r1);
        });
      });
    });
  });
}

}  // namespace cpu
}  // namespace attnstate
