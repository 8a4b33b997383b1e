/// @file decode_plan.cpp
/// @brief The host-only decode planner: split layout, kernel, pipeline depth and cluster.
#include "plan/decode_plan.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "catalog/catalog.hpp"

namespace attnstate {
namespace plan {
namespace {

using attnstate::detail::throw_argument;

std::string str(std::int64_t v) { return std::to_string(v); }

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

std::int64_t max_length(const DecodeProblem& problem, const std::int32_t* seq_lens) {
  std::int64_t max_len = 0;
  for (std::int64_t i = 0; i < problem.batch; ++i)
    max_len = std::max<std::int64_t>(max_len, seq_lens[i]);
  return max_len;
}

/// Clusters of `cluster` CTAs resident at once at depth `stages` (0 for sizes never used).
int resident(const DecodeFacts& f, int stages, int cluster) {
  if (cluster < 2 || cluster > kMaxCluster) return 0;
  return f.resident_clusters[stages == f.stages ? 0 : 1][cluster];
}

}  // namespace

namespace {

using catalog::Family;
using catalog::mask;

/// The split kernel's rows at `head_dim` (0: any) for these query and K/V dtypes.
catalog::Query split_query(std::int64_t head_dim, catalog::DTypeMask q, catalog::DTypeMask kv,
                           catalog::Variants variants = catalog::kPlain) {
  catalog::Query c;
  c.family = Family::kDecodeSplit;
  c.head_dim = head_dim;
  c.q = q;
  c.kv = kv;
  c.variants = variants;
  return c;
}

/// The K/V dtypes of the split kernel's rows, the fp8 ones (`fp8`) or the others.
catalog::DTypeMask kv_dtypes(bool fp8) {
  const catalog::DTypeMask all =
      catalog::dtypes(split_query(0, catalog::kAnyDType, catalog::kAnyDType), true);
  catalog::DTypeMask m = 0;
  for (int d = 0; d < 5; ++d)
    if ((all & (1u << d)) != 0 && is_fp8(static_cast<DType>(d)) == fp8)
      m = static_cast<catalog::DTypeMask>(m | (1u << d));
  return m;
}

}  // namespace

bool decode_head_dim_supported(std::int64_t head_dim) {
  return head_dim != 0 &&
         catalog::compiled(split_query(head_dim, catalog::kAnyDType, kv_dtypes(false)));
}

bool decode_dtype_supported(DType dt) { return (kv_dtypes(false) & mask(dt)) != 0; }

DecodeFacts decode_kernel_facts(std::int64_t head_dim, int kv_bytes) {
  DecodeFacts f;  // the shape and tuning constants are its defaults
  f.ctas_per_sm = catalog::decode_ctas_per_sm(static_cast<int>(head_dim), f.stages, kv_bytes);
  f.stream_warps = catalog::stream_warps(static_cast<int>(head_dim));
  // the floor was measured on 16-bit caches only (fp8 splits stream half the bytes per key)
  if (kv_bytes != 2) f.wave_min_split_tokens = 0;
  return f;
}

void check_decode_problem(const char* fn, const DecodeProblem& pr) {
  if (pr.batch < 0) throw_argument(fn, "problem.batch", ">= 0", str(pr.batch));
  if (pr.q_len < 1 || pr.q_len > 8) throw_argument(fn, "problem.q_len", "1..8", str(pr.q_len));
  if (pr.heads_kv < 1) throw_argument(fn, "problem.heads_kv", ">= 1", str(pr.heads_kv));
  if (pr.heads_q < 1 || pr.heads_q % pr.heads_kv != 0)
    throw_argument(fn, "problem.heads_q", "a positive multiple of heads_kv", str(pr.heads_q));
  // the head dim, the K/V dtype and the query dtype against the catalog's split-kernel rows
  const catalog::Query any = split_query(0, catalog::kAnyDType, kv_dtypes(false));
  if (!decode_head_dim_supported(pr.head_dim))
    throw_argument(fn, "problem.head_dim", catalog::head_dims_string(any), str(pr.head_dim),
                   Status::kNotSupported);
  if (is_fp8(pr.kv_dtype) && is_valid(pr.kv_dtype)) {
    const catalog::DTypeMask fp8 = kv_dtypes(true);
    const std::string cache = std::string(" over an ") + to_string(pr.kv_dtype) + " cache";
    if ((fp8 & mask(pr.kv_dtype)) == 0)
      throw_argument(fn, "problem.kv_dtype", catalog::dtypes_string(fp8), to_string(pr.kv_dtype),
                     Status::kNotSupported);
    const catalog::Query kv = split_query(pr.head_dim, catalog::kAnyDType, mask(pr.kv_dtype));
    if (!catalog::compiled(kv))
      throw_argument(fn, "problem.head_dim", catalog::head_dims_string(kv) + cache,
                     str(pr.head_dim), Status::kNotSupported);
    if (!catalog::compiled(split_query(pr.head_dim, mask(pr.q_dtype), mask(pr.kv_dtype))))
      throw_argument(fn, "problem.q_dtype",
                     catalog::dtypes_string(catalog::dtypes(kv, false)) + cache,
                     to_string(pr.q_dtype), Status::kNotSupported);
    return;
  }
  if (!decode_dtype_supported(pr.kv_dtype))
    throw_argument(fn, "problem.kv_dtype",
                   catalog::dtypes_string(kv_dtypes(false)) +
                       " (queries of the same dtype), or an fp8 cache: " +
                       catalog::dtypes_string(kv_dtypes(true)),
                   to_string(pr.kv_dtype), Status::kNotSupported);
  if (!catalog::compiled(split_query(pr.head_dim, mask(pr.q_dtype), mask(pr.kv_dtype))))
    throw_argument(fn, "problem.q_dtype", std::string("the KV dtype ") + to_string(pr.kv_dtype),
                   to_string(pr.q_dtype), Status::kNotSupported);
}

int decode_row_tiles(const DecodeProblem& problem, int tile_rows) {
  const std::int64_t rows = problem.q_len * problem.group();
  return static_cast<int>((rows + tile_rows - 1) / tile_rows);
}

bool short_candidate(const DecodeFacts& f, const int (&split_ids)[2], const SplitLayout& splits) {
  return split_ids[1] >= 0 && f.short_tokens > 0 && f.short_stages != f.stages &&
         splits.policy == SplitPolicy::kFixedSize && splits.split_size <= f.short_tokens;
}

double layout_cost(const std::int32_t* seq_lens, std::int64_t batch, std::int64_t ctas,
                   std::int64_t chunk, std::int64_t max_splits, std::int64_t slots,
                   const DecodeFacts& f) {
  if (batch <= 0 || ctas <= 0 || chunk <= 0 || max_splits <= 0) return 0.0;
  slots = std::max<std::int64_t>(1, slots);
  // every split of `chunk` keys but each request's last, which holds the rest
  std::int64_t full = 0, empty = 0;
  std::vector<std::int64_t> rest;
  rest.reserve(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t len = std::max<std::int32_t>(0, seq_lens[b]);
    if (len == 0) {
      empty += max_splits;
      continue;
    }
    const std::int64_t k = std::min(max_splits, (len + chunk - 1) / chunk);
    full += k - 1;
    empty += max_splits - k;
    rest.push_back(len - (k - 1) * chunk);
  }
  std::sort(rest.begin(), rest.end(), [](std::int64_t a, std::int64_t b) { return a > b; });
  // waves of `slots` CTAs, longest first: a wave lasts as long as its first (longest) CTA
  double t = 0.0;
  std::int64_t placed = 0;  // CTAs placed so far
  auto take = [&](std::int64_t count, std::int64_t keys) {
    const double wave = static_cast<double>(keys + f.cta_cost_tokens);
    const std::int64_t open = placed % slots == 0 ? 0 : slots - placed % slots;
    const std::int64_t into_open = std::min(count, open);
    placed += into_open;
    count -= into_open;
    const std::int64_t waves = (count + slots - 1) / slots;
    t += static_cast<double>(waves) * wave;
    placed += count;
  };
  if (full > 0) take(full * ctas, chunk);
  for (std::int64_t r : rest) take(ctas, r);
  t += static_cast<double>(empty) * static_cast<double>(ctas) * f.empty_cta_tokens /
       static_cast<double>(slots);
  if (max_splits > 1) {
    if (f.stack_merge_splits > 0 && max_splits >= f.stack_merge_splits)
      t += f.stack_merge_tokens + 2.0 * f.merge_split_tokens *
                                      static_cast<double>(batch * ctas * max_splits) /
                                      static_cast<double>(slots);
    else
      t += f.merge_cost_tokens + static_cast<double>(f.merge_split_tokens) * max_splits;
  }
  return t;
}

SplitLayout balanced_layout(const DecodeProblem& problem, const std::int32_t* seq_lens,
                            std::int64_t slots, int row_tiles, const DecodeFacts& f) {
  const std::int64_t max_len = max_length(problem, seq_lens);
  const std::int64_t ctas = problem.heads_kv * row_tiles;
  SplitLayout best;
  best.policy = SplitPolicy::kFixedSize;
  // split sizes stay int32: the largest multiple of 16 below 2^31
  constexpr std::int64_t kMaxChunk = 0x7FFFFFFF / kSplitGranularity * kSplitGranularity;
  const auto chunk_of = [&](std::int64_t s) {
    return std::min(kMaxChunk, round_up((max_len + s - 1) / s, kSplitGranularity));
  };
  best.split_size = static_cast<std::int32_t>(chunk_of(1));
  best.max_splits = 1;
  if (max_len <= 0) {
    best.split_size = kSplitGranularity;
    return best;
  }
  best.max_splits = static_cast<std::int32_t>((max_len + best.split_size - 1) / best.split_size);
  double best_cost =
      layout_cost(seq_lens, problem.batch, ctas, best.split_size, best.max_splits, slots, f);
  // split counts of the longest request: every count up to 16, then steps of about 1/8
  std::int64_t last_chunk = best.split_size;
  for (std::int64_t s = 2; s <= kMaxSplits; s = s < 16 ? s + 1 : s + s / 8) {
    const std::int64_t chunk = chunk_of(s);
    if (chunk < f.min_split_tokens) break;
    if (chunk == last_chunk) continue;
    last_chunk = chunk;
    const std::int64_t n = (max_len + chunk - 1) / chunk;
    if (n > kMaxSplits) break;
    const double c = layout_cost(seq_lens, problem.batch, ctas, chunk, n, slots, f);
    if (c < best_cost) {
      best_cost = c;
      best.split_size = static_cast<std::int32_t>(chunk);
      best.max_splits = static_cast<std::int32_t>(n);
    }
  }
  return best;
}

SplitLayout auto_layout(const char* fn, const DecodeProblem& problem, const std::int32_t* seq_lens,
                        const DecodeOptions& options, std::int64_t slots, int row_tiles,
                        const DecodeFacts& f) {
  SplitLayout l = plan_split_layout(problem, seq_lens, options, slots, problem.heads_kv * row_tiles,
                                    fn, "seq_lens_host", "options");
  const std::int64_t max_len = max_length(problem, seq_lens);
  // few requests: the heuristic fills every slot with splits of a long request, however short;
  // beyond a cluster's worth of them, shorter splits are raised to `wave_min_split_tokens`
  const std::int64_t min_chunk = round_up(f.wave_min_split_tokens, kSplitGranularity);
  bool floored = false;
  if (min_chunk > 0 && l.policy == SplitPolicy::kFixedSize && l.split_size < min_chunk &&
      max_len > static_cast<std::int64_t>(f.max_cluster) * f.cluster_tokens) {
    const std::int64_t n = (max_len + min_chunk - 1) / min_chunk;
    if (n <= kMaxSplits) {
      l.split_size = static_cast<std::int32_t>(min_chunk);
      l.max_splits = static_cast<std::int32_t>(n);
      floored = true;
    }
  }
  // lengths that differ (or any, with `balance_uniform`): the layout balanced over all of them,
  // when the model says it is faster than the one sized from the longest request alone
  const bool ragged =
      problem.batch > 1 && std::any_of(seq_lens + 1, seq_lens + problem.batch,
                                       [&](std::int32_t len) { return len != seq_lens[0]; });
  if (ragged || f.balance_uniform) {
    const std::int64_t ctas = problem.heads_kv * row_tiles;
    const SplitLayout b = balanced_layout(problem, seq_lens, slots, row_tiles, f);
    const double cost_b =
        layout_cost(seq_lens, problem.batch, ctas, b.split_size, b.max_splits, slots, f);
    const double cost_l =
        layout_cost(seq_lens, problem.batch, ctas, l.split_size, l.max_splits, slots, f);
    if (cost_b < 0.97 * cost_l) {
      l = b;
      floored = false;
    }
  }
  // short requests: at most a cluster's worth of splits, merged in distributed shared memory,
  // rather than many tiny splits merged through the workspace
  if (f.max_cluster > 1 && l.max_splits > f.max_cluster) {
    const std::int64_t chunk =
        round_up((max_len + f.max_cluster - 1) / f.max_cluster, kSplitGranularity);
    if (chunk > 0 && chunk <= f.cluster_tokens) {
      l.split_size = static_cast<std::int32_t>(chunk);
      l.max_splits = static_cast<std::int32_t>((max_len + chunk - 1) / chunk);
    }
  }
  // long ones: a split count that groups of splits can share a cluster with, within one wave
  const int mult = f.split_multiple;
  if (mult > 1 && l.policy == SplitPolicy::kFixedSize && l.max_splits > f.max_cluster &&
      l.max_splits % mult != 0) {
    const std::int64_t target = round_up(l.max_splits, mult);
    const std::int64_t grid = problem.batch * problem.heads_kv * row_tiles * target;
    const std::int64_t chunk = round_up((max_len + target - 1) / target, kSplitGranularity);
    // a floored layout keeps its floor: the rounding would only shorten its splits again
    const bool keeps_floor = !floored || chunk >= min_chunk;
    if (target <= kMaxSplits && grid <= slots && chunk > 0 && keeps_floor &&
        (max_len + chunk - 1) / chunk == target) {
      l.split_size = static_cast<std::int32_t>(chunk);
      l.max_splits = static_cast<std::int32_t>(target);
    }
  }
  return l;
}

SplitLaunch resolve_split_launch(const DecodeFacts& f, const int (&split_ids)[2],
                                 const SplitLayout& splits, int num_sms, std::int64_t grid,
                                 int forced_stages, int forced_cluster) {
  const int S = splits.max_splits;
  int cluster = S > 1 && S <= f.max_cluster ? S : 1;
  SplitLaunch l;
  l.stages = f.stages;
  if (forced_stages != 0) {
    l.stages = forced_stages;
  } else if (short_candidate(f, split_ids, splits)) {
    // one more CTA per SM: when the grid exceeds one wave of the default depth, or when only it
    // keeps every cluster resident
    bool use_short = grid > static_cast<std::int64_t>(num_sms) * f.ctas_per_sm;
    if (!use_short && cluster > 1) {
      const std::int64_t clusters = grid / cluster;
      use_short = clusters > resident(f, f.stages, cluster) &&
                  clusters <= resident(f, f.short_stages, cluster);
    }
    if (use_short) l.stages = f.short_stages;
  }
  // the cluster merge pays off only when every cluster is resident at once (one wave)
  if (cluster > 1 && grid / cluster > resident(f, l.stages, cluster)) cluster = 1;
  // workspace merge: groups of consecutive splits in clusters (the largest size that divides the
  // split count and keeps every cluster resident), so that the last group's CTAs share the merge
  if (cluster == 1 && S > 1) {
    for (int c = std::min(f.ws_group, S - 1); c >= 2; --c) {
      if (S % c == 0 && grid / c <= resident(f, l.stages, c)) {
        cluster = c;
        break;
      }
    }
  }
  l.cluster = forced_cluster != 0 ? forced_cluster : cluster;
  return l;
}

bool split_launch_valid(const DecodeFacts& f, const int (&split_ids)[2], const SplitLayout& splits,
                        const SplitLaunch& launch, const char** why) {
  // the other row's depth: the short-split one, or one a hand choice named
  const bool other =
      split_ids[1] >= 0 &&
      (launch.stages == f.short_stages ||
       (split_ids[1] < catalog::kNumRows &&
        launch.stages == catalog::kRows[static_cast<std::size_t>(split_ids[1])].stages));
  if (launch.stages != f.stages && !other) {
    *why = "a compiled pipeline depth";
    return false;
  }
  const int S = splits.max_splits;
  const int c = launch.cluster;
  const bool ok = c == 1 || (c == S && S <= f.max_cluster) ||
                  (c >= 2 && c <= std::min(f.ws_group, S - 1) && S % c == 0);
  if (!ok) {
    *why = "1, splits.max_splits (at most 8) or a divisor of it";
    return false;
  }
  return true;
}

namespace {

/// True when every streamed row falls back on the split kernel: the rows a decode plan holds
/// for a fallback (`split_ids`).
constexpr bool streamed_rows_fall_back_on_split() {
  for (const catalog::Row& r : catalog::kRows)
    if (r.family == Family::kDecodeStream && r.fallback != Family::kDecodeSplit) return false;
  return true;
}
static_assert(streamed_rows_fall_back_on_split(),
              "a decode plan holds split rows only for its streamed row's fallback");

}  // namespace

Family decode_run_family(int kernel_id, catalog::Variants variants, int prior_count, bool q_aligned,
                         std::int64_t page_size) {
  if (kernel_id < 0 || kernel_id >= catalog::kNumRows)
    throw_argument("attnstate::plan::decode_run_family", "kernel_id",
                   "a catalog row (0.." + str(catalog::kNumRows - 1) + ")", str(kernel_id));
  const catalog::Row& r = catalog::kRows[static_cast<std::size_t>(kernel_id)];
  const catalog::Needs met = static_cast<catalog::Needs>(
      (q_aligned ? catalog::kNeedsAlignedQ : 0) |
      (r.tile_keys > 0 && page_size % r.tile_keys == 0 ? catalog::kNeedsPageTileKeys : 0));
  return catalog::family_that_runs(
      r, met,
      static_cast<catalog::Variants>(variants | (prior_count > 0 ? catalog::kPriorStates : 0)));
}

const char* to_string(DecodeReason r) {
  switch (r) {
    case DecodeReason::kStreamedAuto:
      return "the automatic policy: one split per request, enough items for the streamed "
             "kernel's warps, no request longer than its cap";
    case DecodeReason::kStreamedAsked:
      return "options.kernel = kStreamed";
    case DecodeReason::kSplitAsked:
      return "options.kernel = kSplit";
    case DecodeReason::kSplitPolicy:
      return "a fixed split policy (only the automatic policy takes the streamed kernel)";
    case DecodeReason::kSplitRequests:
      return "requests are split";
    case DecodeReason::kSplitNoStreamed:
      return "no streamed kernel in the catalog for the head dim, dtypes and variant";
    case DecodeReason::kSplitFewItems:
      return "too few items to keep the streamed kernel's warps busy";
    case DecodeReason::kSplitLongRequest:
      return "a request longer than the streamed kernel's cap";
  }
  return "unknown reason";
}

int DecodeChoice::kernel_id() const {
  return streamed ? stream_id : split_ids[split.stages == catalog::kDecodeStages ? 0 : 1];
}

namespace {

/// "kAuto", "kSplit", "kStreamed" (or the value).
std::string kernel_str(DecodeKernel k) {
  switch (k) {
    case DecodeKernel::kAuto:
      return "kAuto";
    case DecodeKernel::kSplit:
      return "kSplit";
    case DecodeKernel::kStreamed:
      return "kStreamed";
  }
  return "value " + str(static_cast<int>(k));
}

/// The depths of the split rows answering `split` (any depth): the default `f.stages` first,
/// then the others ascending, as "3, 2 or 4".
std::string depths_string(const catalog::Query& split, const DecodeFacts& f) {
  std::vector<int> depths;
  for (const catalog::Row* r = catalog::find(split); r != nullptr; r = catalog::find_next(split, r))
    if (std::find(depths.begin(), depths.end(), r->stages) == depths.end())
      depths.push_back(r->stages);
  std::sort(depths.begin(), depths.end(), [&](int a, int b) {
    return a == f.stages ? b != f.stages : b == f.stages ? false : a < b;
  });
  std::string s;
  for (std::size_t i = 0; i < depths.size(); ++i)
    s += std::string(i == 0 ? "" : i + 1 == depths.size() ? " or " : ", ") + str(depths[i]);
  return s;
}

/// Checks the split launch `options` asks for (`split_stages`, `split_cluster`; 0 = the rule's)
/// against the compiled split rows (`c.split_ids`: the default depth's and the other one's, the
/// rows answering `split`) and the layout, naming the field.
void check_forced_launch(const char* fn, const DecodeOptions& options, const DecodeFacts& f,
                         const catalog::Query& split, DecodeChoice& c) {
  if (options.split_stages != 0) {
    const bool ok =
        (options.split_stages == f.stages && c.split_ids[0] >= 0) ||
        (c.split_ids[1] >= 0 &&
         options.split_stages == catalog::kRows[static_cast<std::size_t>(c.split_ids[1])].stages);
    if (!ok)
      throw_argument(
          fn, "options.split_stages",
          "0 (the planner's) or a depth compiled for the problem: " + depths_string(split, f),
          str(options.split_stages));
    c.forced_stages = options.split_stages;
  }
  if (options.split_cluster != 0) {
    SplitLaunch l;
    l.stages = c.forced_stages != 0 ? c.forced_stages : f.stages;
    l.cluster = options.split_cluster;
    const char* why = nullptr;
    if (options.split_cluster < 0 || !split_launch_valid(f, c.split_ids, c.splits, l, &why))
      throw_argument(fn, "options.split_cluster",
                     std::string("0 (the planner's) or ") +
                         (why != nullptr ? why : "1, splits.max_splits or a divisor of it"),
                     str(options.split_cluster) + " for max_splits " + str(c.splits.max_splits));
    c.forced_cluster = options.split_cluster;
  }
}

}  // namespace

DecodeChoice resolve_decode(const char* fn, const DecodeProblem& problem,
                            const std::int32_t* seq_lens_host, const DecodeOptions& options,
                            int num_sms, const DecodeFacts& f) {
  check_decode_problem(fn, problem);
  if (num_sms < 1) throw_argument(fn, "num_sms", ">= 1", str(num_sms));
  // a variant some split instance of these dtypes takes
  const catalog::Variants variants =
      catalog::variants_of(options.variant.window_left, options.variant.logits_soft_cap);
  const catalog::Query split =
      split_query(problem.head_dim, mask(problem.q_dtype), mask(problem.kv_dtype), variants);
  if (!catalog::compiled(split))
    throw_argument(fn, "options.variant", catalog::not_supported_message(split),
                   catalog::variants_string(variants), Status::kNotSupported);
  // the slots the automatic layout fills: the kernel's occupancy, or fewer CTAs per SM asked
  if (options.plan_ctas_per_sm != 0) {
    if (options.policy != SplitPolicy::kAuto)
      throw_argument(fn, "options.plan_ctas_per_sm",
                     "0 unless options.policy is kAuto (the slots size the automatic layout)",
                     str(options.plan_ctas_per_sm));
    if (options.plan_ctas_per_sm < 0 || options.plan_ctas_per_sm > f.ctas_per_sm)
      throw_argument(fn, "options.plan_ctas_per_sm",
                     "0 (the planner's) or 1.." + str(f.ctas_per_sm) +
                         " (the split kernel's CTAs per SM at head dim " + str(problem.head_dim) +
                         ")",
                     str(options.plan_ctas_per_sm));
  }
  int per_sm = options.plan_ctas_per_sm != 0 ? options.plan_ctas_per_sm
               : f.plan_ctas_per_sm > 0      ? std::min(f.plan_ctas_per_sm, f.ctas_per_sm)
                                             : f.ctas_per_sm;
  // a depth asked by hand that keeps fewer CTAs resident (the paired configuration): no more
  // slots than it has (a depth the catalog lacks is refused below)
  if (options.split_stages > 0)
    per_sm = std::min(per_sm, catalog::decode_ctas_per_sm(static_cast<int>(problem.head_dim),
                                                          options.split_stages,
                                                          is_fp8(problem.kv_dtype) ? 1 : 2));
  DecodeChoice c;
  c.row_tiles = decode_row_tiles(problem, f.tile_rows);
  const std::int64_t slots = static_cast<std::int64_t>(num_sms) * per_sm;
  c.splits =
      options.policy == SplitPolicy::kAuto
          ? auto_layout(fn, problem, seq_lens_host, options, slots, c.row_tiles, f)
          : plan_split_layout(problem, seq_lens_host, options, slots,
                              problem.heads_kv * c.row_tiles, fn, "seq_lens_host", "options");
  const std::int64_t grid = problem.batch * problem.heads_kv * c.row_tiles * c.splits.max_splits;
  if (grid > 0x7FFFFFFF) throw_argument(fn, "problem", "at most 2^31-1 CTAs", str(grid));
  // the split rows at both depths (the variant's instance when there is one)
  catalog::Query depth = split;
  depth.stages = f.stages;
  c.split_ids[0] = catalog::find_id(depth);
  // the plan's other depth: the short-split one, or the one `options.split_stages` names
  depth.stages = options.split_stages > 0 && options.split_stages != f.stages ? options.split_stages
                                                                              : f.short_stages;
  c.split_ids[1] = depth.stages != f.stages ? catalog::find_id(depth) : -1;
  // Automatic policy, one split each, requests up to the cap and enough items to keep at least
  // 3/4 of the streamed kernel's warps busy on every SM: the streamed kernel (its warps' copies
  // run on from one item into the next). With fewer items its SMs hold too few warps to hide
  // the latency of their arithmetic (bench/RESULTS.md, the streamed kernel's section).
  catalog::Query stream = split;
  stream.family = Family::kDecodeStream;
  const int stream_id = catalog::find_id(stream);
  switch (options.kernel) {
    case DecodeKernel::kAuto:
      c.reason = options.policy != SplitPolicy::kAuto ? DecodeReason::kSplitPolicy
                 : c.splits.max_splits != 1           ? DecodeReason::kSplitRequests
                 : stream_id < 0                      ? DecodeReason::kSplitNoStreamed
                 : 4 * grid < 3 * static_cast<std::int64_t>(num_sms) * f.stream_warps
                     ? DecodeReason::kSplitFewItems
                 : max_length(problem, seq_lens_host) > f.stream_max_tokens
                     ? DecodeReason::kSplitLongRequest
                     : DecodeReason::kStreamedAuto;
      break;
    case DecodeKernel::kSplit:
      c.reason = DecodeReason::kSplitAsked;
      break;
    case DecodeKernel::kStreamed:
      if (c.splits.max_splits != 1)
        throw_argument(fn, "options.kernel",
                       "kAuto or kSplit when requests are split (kStreamed takes one split per "
                       "request)",
                       "kStreamed with max_splits = " + str(c.splits.max_splits));
      if (stream_id < 0)
        throw_argument(fn, "options.kernel", catalog::not_supported_message(stream), "kStreamed",
                       Status::kNotSupported);
      c.reason = DecodeReason::kStreamedAsked;
      break;
    default:
      throw_argument(fn, "options.kernel", "kAuto, kSplit or kStreamed",
                     kernel_str(options.kernel));
  }
  c.streamed = c.reason == DecodeReason::kStreamedAuto || c.reason == DecodeReason::kStreamedAsked;
  c.stream_id = c.streamed ? stream_id : -1;
  check_forced_launch(fn, options, f, split, c);
  c.grid = grid;
  c.split = resolve_split_launch(f, c.split_ids, c.splits, num_sms, grid, c.forced_stages,
                                 c.forced_cluster);
  return c;
}

}  // namespace plan
}  // namespace attnstate
