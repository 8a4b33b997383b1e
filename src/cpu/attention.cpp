/// @file attention.cpp
/// @brief CPU backend: the one-pass producer `attention_state(q, k, v, scale[, variant], out)`,
///        multi-threaded over (token, KV head) items that serve the KV head's group of query
///        heads (GQA), fp32 online softmax (math::OnlineSoftmax).
#include "attnstate/cpu/attention.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "attnstate/core/merge_math.hpp"
#include "attnstate/core/online_softmax.hpp"
#include "attnstate/core/variant.hpp"
#include "common/validate.hpp"
#include "cpu/loader.hpp"
#include "cpu/parallel.hpp"

namespace attnstate {
namespace cpu {
namespace {

namespace v = attnstate::detail;
constexpr MemorySpace kHost = MemorySpace::kHost;
/// Keys scored per online-softmax block.
constexpr std::int64_t kKeyBlock = 64;

/// Width of the partial sums of a dot product.
constexpr std::int64_t kLanes = 8;
/// Keys ahead whose K and V rows are prefetched (rows of one KV head are a stride apart).
constexpr std::int64_t kPrefetchKeys = 4;

/// `q · k` in fp32 with `kLanes` interleaved partial sums combined in a fixed order (the same
/// result on every run; vectorises, unlike one serial chain).
float dot(const float* q, const float* k, std::int64_t dim) {
  float part[kLanes] = {};
  std::int64_t d = 0;
  for (; d + kLanes <= dim; d += kLanes)
    for (std::int64_t l = 0; l < kLanes; ++l) part[l] += q[d + l] * k[d + l];
  for (std::int64_t l = 0; d < dim; ++d, ++l) part[l] += q[d] * k[d];
  return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

/// Hints the cache to load `bytes` from `p` (a no-op where the builtin is unavailable).
void prefetch(const void* p, std::int64_t bytes) {
#if defined(__GNUC__) || defined(__clang__)
  const char* c = static_cast<const char*>(p);
  for (std::int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, 3);
#else
  (void)p;
  (void)bytes;
#endif
}

/// Per-thread buffers of one (token, KV head) item: its `group` query heads.
struct Scratch {
  std::vector<float> q, acc, s2, kf, vf, p_sum;  // (group, dim) / (group, kKeyBlock) / (dim)
  std::vector<math::OnlineSoftmax> sm;           // (group)
};

/// Items `[i0, i1)`, item = token * H_kv + kv_head: every query head of the KV head's group
/// runs its own online softmax over the keys in blocks of `kKeyBlock`; each K and V row is
/// loaded (and converted to fp32) once for the whole group.
template <class Tq, class Tkv, class To>
void attend_items(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& val,
                  const math::ScoreMap& score, const StateView& out, std::int64_t i0,
                  std::int64_t i1, Scratch& sc) {
  const std::int64_t heads_kv = k.shape[1], dim = q.shape[2], keys = k.shape[0];
  const std::int64_t group = q.shape[1] / heads_kv;
  const detail::Loader<Tq> load_q;
  const detail::Loader<Tkv> load_kv;
  sc.q.resize(group * dim);
  sc.acc.resize(group * dim);
  sc.s2.resize(group * kKeyBlock);
  sc.kf.resize(dim);
  sc.vf.resize(dim);
  sc.p_sum.resize(group);
  sc.sm.resize(group);
  const Tkv* kbase = static_cast<const Tkv*>(k.data);
  const Tkv* vbase = static_cast<const Tkv*>(val.data);
  const std::int64_t row_bytes = dim * static_cast<std::int64_t>(sizeof(Tkv));
  for (std::int64_t item = i0; item < i1; ++item) {
    const std::int64_t t = item / heads_kv, g = item % heads_kv;
    for (std::int64_t j = 0; j < group; ++j) {
      const Tq* qr =
          static_cast<const Tq*>(q.data) + t * q.stride[0] + (g * group + j) * q.stride[1];
      for (std::int64_t d = 0; d < dim; ++d) sc.q[j * dim + d] = load_q(qr[d]);
      sc.sm[j] = math::OnlineSoftmax{};
    }
    std::fill(sc.acc.begin(), sc.acc.end(), 0.f);
    for (std::int64_t b0 = 0; b0 < keys; b0 += kKeyBlock) {
      const std::int64_t n = std::min(kKeyBlock, keys - b0);
      // Scores of the block for every query head of the group.
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t key = b0 + i;
        if (key + kPrefetchKeys < keys) {
          prefetch(kbase + (key + kPrefetchKeys) * k.stride[0] + g * k.stride[1], row_bytes);
        }
        const Tkv* kr = kbase + key * k.stride[0] + g * k.stride[1];
        for (std::int64_t d = 0; d < dim; ++d) sc.kf[d] = load_kv(kr[d]);
        for (std::int64_t j = 0; j < group; ++j)
          sc.s2[j * kKeyBlock + i] = score(dot(sc.q.data() + j * dim, sc.kf.data(), dim));
      }
      for (std::int64_t j = 0; j < group; ++j) {
        float block_max = math::neg_inf();
        for (std::int64_t i = 0; i < n; ++i)
          block_max = math::nan_max(block_max, sc.s2[j * kKeyBlock + i]);
        const float alpha = sc.sm[j].rescale(block_max);
        if (alpha != 1.f) {
          for (std::int64_t d = 0; d < dim; ++d) sc.acc[j * dim + d] *= alpha;
        }
        sc.p_sum[j] = 0.f;
      }
      // Probabilities and the weighted sum of V.
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t key = b0 + i;
        if (key + kPrefetchKeys < keys) {
          prefetch(vbase + (key + kPrefetchKeys) * val.stride[0] + g * val.stride[1], row_bytes);
        }
        const Tkv* vr = vbase + key * val.stride[0] + g * val.stride[1];
        for (std::int64_t d = 0; d < dim; ++d) sc.vf[d] = load_kv(vr[d]);
        for (std::int64_t j = 0; j < group; ++j) {
          const float p = sc.sm[j].prob(sc.s2[j * kKeyBlock + i]);
          sc.p_sum[j] += p;
          float* acc = sc.acc.data() + j * dim;
          for (std::int64_t d = 0; d < dim; ++d) acc[d] += p * sc.vf[d];
        }
      }
      for (std::int64_t j = 0; j < group; ++j) sc.sm[j].add(sc.p_sum[j]);
    }
    for (std::int64_t j = 0; j < group; ++j) {
      const std::int64_t h = g * group + j;
      const float inv = sc.sm[j].inv_sum();
      To* oo = static_cast<To*>(out.o) + out.o_offset(t, h);
      for (std::int64_t d = 0; d < dim; ++d) oo[d] = from_float<To>(sc.acc[j * dim + d] * inv);
      out.lse[out.lse_offset(t, h)] = sc.sm[j].lse(out.base);
    }
  }
}

}  // namespace

void attention_state(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& val,
                     float scale, StateView out) {
  attention_state(q, k, val, scale, AttentionVariant{}, out);
}

void attention_state(const ConstTensorView& q, const ConstTensorView& k, const ConstTensorView& val,
                     float scale, const AttentionVariant& variant, StateView out) {
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
  scale = v::resolve_scale(kFunc, "scale", scale, q.shape[2]);
  v::check_variant(kFunc, "variant", variant);
  if (variant.window_left != kNoWindow) {
    // One segment without positions: a window has nothing to be measured from.
    v::throw_argument(kFunc, "variant.window_left",
                      "kNoWindow (-1): attention_state has no key positions (decode and "
                      "cascade_attention take a window)",
                      std::to_string(variant.window_left));
  }
  const math::ScoreMap score = math::make_score_map(scale, variant.logits_soft_cap);
  v::check_output_state(kFunc, "out", out, kHost);
  const auto same = [&](const char* field, std::int64_t want, std::int64_t got, const char* what) {
    if (want != got)
      v::throw_argument(kFunc, field, std::to_string(want) + what, std::to_string(got));
  };
  same("out.tokens", q.shape[0], out.tokens, " (q.shape[0])");
  same("out.heads", q.shape[1], out.heads, " (q.shape[1])");
  same("out.head_dim", q.shape[2], out.head_dim, " (q.shape[2])");
  v::check_disjoint(kFunc, "out", out, "q", q.data, v::tensor_bytes(q), nullptr, 0);
  v::check_disjoint(kFunc, "out", out, "k", k.data, v::tensor_bytes(k), nullptr, 0);
  v::check_disjoint(kFunc, "out", out, "v", val.data, v::tensor_bytes(val), nullptr, 0);

  const std::int64_t items = out.tokens * k.shape[1];  // (token, KV head)
  if (items == 0) return;
  // keys x group x head_dim x 2 flops per item, saturated (the grain only needs its magnitude)
  std::int64_t work = std::max<std::int64_t>(1, k.shape[0]);
  if (!checked_mul(work, q.shape[1] / k.shape[1], &work) ||
      !checked_mul(work, q.shape[2] * 2, &work))
    work = kMaxSize;
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 16) / work);
  dispatch_dtype(q.dtype, [&](auto tq) {
    dispatch_dtype(k.dtype, [&](auto tkv) {
      dispatch_dtype(out.dtype, [&](auto to) {
        using Tq = decltype(tq);
        using Tkv = decltype(tkv);
        using To = decltype(to);
        detail::parallel_for(0, items, grain, [&](std::int64_t i0, std::int64_t i1) {
          thread_local Scratch sc;
          attend_items<Tq, Tkv, To>(q, k, val, score, out, i0, i1, sc);
        });
      });
    });
  });
}

}  // namespace cpu
}  // namespace attnstate
