/// @file cascade_decision.cpp
/// @brief `decide_cascade`: the cost model of core/cascade_decision.hpp.
#include "attnstate/core/cascade_decision.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "attnstate/core/cascade.hpp"
#include "attnstate/core/error.hpp"

namespace attnstate {
namespace {

constexpr const char* kFn = "attnstate::decide_cascade";

void check_positive(const char* name, std::int64_t v) {
  if (v < 1) detail::throw_argument(kFn, name, ">= 1", std::to_string(v));
}

void check_constant(const char* name, double v) {
  if (!(v > 0) || !std::isfinite(v))
    detail::throw_argument(kFn, name, "a finite value > 0", std::to_string(v));
}

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

}  // namespace

CascadeDecision decide_cascade(const CascadeLevels& levels, const CascadeCostShape& shape,
                               const CascadeCostModel& model) {
  check_positive("shape.q_len", shape.q_len);
  if (shape.q_len > kMaxCascadeQueryLen)
    detail::throw_argument(kFn, "shape.q_len", "<= " + std::to_string(kMaxCascadeQueryLen),
                           std::to_string(shape.q_len));
  check_positive("shape.heads_q", shape.heads_q);
  check_positive("shape.heads_kv", shape.heads_kv);
  check_positive("shape.head_dim", shape.head_dim);
  if (shape.heads_q % shape.heads_kv != 0)
    detail::throw_argument(kFn, "shape.heads_q",
                           "a multiple of shape.heads_kv = " + std::to_string(shape.heads_kv),
                           std::to_string(shape.heads_q));
  if (!is_valid(shape.kv_dtype))
    detail::throw_argument(kFn, "shape.kv_dtype", "a dtype attnstate knows",
                           std::to_string(static_cast<int>(shape.kv_dtype)));
  check_constant("model.copy_gbps", model.copy_gbps);
  check_constant("model.tensor_tflops", model.tensor_tflops);
  check_constant("model.decode_efficiency", model.decode_efficiency);
  check_constant("model.decode_fixed_us", model.decode_fixed_us);
  check_constant("model.level_byte_efficiency", model.level_byte_efficiency);
  check_constant("model.level_flop_efficiency", model.level_flop_efficiency);
  check_constant("model.level_fixed_us", model.level_fixed_us);
  check_constant("model.last_level_efficiency", model.last_level_efficiency);
  check_constant("model.last_level_fixed_us", model.last_level_fixed_us);
  check_constant("model.merge_fixed_us", model.merge_fixed_us);
  if (!(model.margin > 0 && model.margin <= 1))
    detail::throw_argument(kFn, "model.margin", "in (0, 1]", std::to_string(model.margin));

  // All in double: token counts up to 2^31 per request and 2^30 requests stay exact enough.
  const double token_bytes = 2.0 * static_cast<double>(shape.heads_kv) *
                             static_cast<double>(shape.head_dim) *
                             static_cast<double>(size_of(shape.kv_dtype));
  const double rows_per_request = static_cast<double>(shape.q_len * shape.heads_q);
  const double bytes_per_us = model.copy_gbps * 1e3;  // GB/s -> bytes per µs
  const double flops_per_us = model.tensor_tflops * 1e6;
  const int n_levels = levels.num_levels();
  const std::int64_t batch = levels.batch();

  // keys[l][p]: tokens of level l's segment serving position p (0 where none does)
  std::vector<std::vector<double>> keys(static_cast<std::size_t>(n_levels),
                                        std::vector<double>(static_cast<std::size_t>(batch), 0));
  std::vector<double> level_bytes(static_cast<std::size_t>(n_levels), 0);
  std::vector<double> level_flops(static_cast<std::size_t>(n_levels), 0);
  for (int l = 0; l < n_levels; ++l) {
    const CascadeLevels::Arrays& a = levels.arrays(l);
    for (std::size_t i = 0; i < a.seg_lens.size(); ++i) {
      const std::int32_t r0 = a.request_indptr[i], r1 = a.request_indptr[i + 1];
      const double len = a.seg_lens[i];
      if (r1 <= r0 || len == 0) continue;
      for (std::int32_t p = r0; p < r1; ++p) keys[l][static_cast<std::size_t>(p)] = len;
      level_bytes[l] += len * token_bytes;
      level_flops[l] +=
          4.0 * (r1 - r0) * rows_per_request * len * static_cast<double>(shape.head_dim);
    }
  }

  CascadeDecision d;
  for (std::int64_t p = 0; p < batch; ++p)
    for (int l = 0; l < n_levels; ++l) d.decode_bytes += keys[l][p] * token_bytes;
  d.decode_us = d.decode_bytes / (bytes_per_us * model.decode_efficiency) + model.decode_fixed_us;

  // the cascade keeping shared levels [0, s), the ones below folded into the remainders
  const double rows = static_cast<double>(batch) * rows_per_request;
  const double out_bytes = rows * static_cast<double>(shape.head_dim) * 2.0;
  double best = 0;
  int best_s = 0;
  double best_bytes = 0;
  double shared_us = 0, shared_bytes = 0;
  for (int s = 1; s < n_levels; ++s) {
    const int l = s - 1;  // the level this option adds as shared
    shared_us += std::fmax(level_bytes[l] / (bytes_per_us * model.level_byte_efficiency),
                           level_flops[l] / (flops_per_us * model.level_flop_efficiency)) +
                 model.level_fixed_us;
    shared_bytes += level_bytes[l];
    double own_bytes = 0;  // what each request then reads itself
    for (std::int64_t p = 0; p < batch; ++p)
      for (int k = s; k < n_levels; ++k) own_bytes += keys[k][p] * token_bytes;
    const double last_us =
        own_bytes / (bytes_per_us * model.last_level_efficiency) + model.last_level_fixed_us;
    const double states = rows * (s + 1) * (static_cast<double>(shape.head_dim) + 1) * 4.0;
    const double merge_us = (states + out_bytes) / bytes_per_us + model.merge_fixed_us;
    const double total = shared_us + last_us + merge_us;
    if (best_s == 0 || total < best) {
      best = total;
      best_s = s;
      best_bytes = shared_bytes + own_bytes;
    }
  }
  d.cascade_us = best;
  d.cascade_bytes = best_bytes;
  const std::string bytes =
      fmt("reads %.3g GB instead of %.3g GB", best_bytes / 1e9, d.decode_bytes / 1e9);
  if (best_s == 0) {
    d.reason = fmt("plain decode: nothing is shared (est %.1f us)", d.decode_us);
  } else if (best <= model.margin * d.decode_us) {
    d.use_cascade = true;
    d.shared_levels = best_s;
    d.reason = "cascade with " + std::to_string(best_s) + " shared level" +
               (best_s > 1 ? "s" : "") +
               fmt(": est %.1f us against %.1f us for plain decode; ", best, d.decode_us) + bytes;
  } else {
    d.reason =
        fmt("plain decode: est %.1f us against %.1f us for the best cascade (", d.decode_us, best) +
        std::to_string(best_s) + " shared level" + (best_s > 1 ? "s" : "") + ", which " + bytes +
        ")";
  }
  return d;
}

}  // namespace attnstate
