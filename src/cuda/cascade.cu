/// @file cascade.cu
/// @brief CUDA cascade attention: planning (tiles, splits, workspace), argument checks, and the
///        launches of the level kernels and the merge.
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cuda/cascade.hpp"
#include "attnstate/cuda/check.hpp"
#include "common/cascade_validate.hpp"
#include "cuda/decode_prior.hpp"
#include "cuda/kernels/cascade/launch.cuh"
#include "cuda/kernels/cascade/merge.cuh"

namespace attnstate {
namespace cuda {
namespace {

using ::attnstate::detail::cascade_str;
using ::attnstate::detail::throw_argument;

constexpr int kKvTile = 64;          // keys per KV tile (CascadeTile::BN)
constexpr int kMaxLevelSplits = 64;  // splits per segment the level heuristic may choose
constexpr std::size_t kAlign = 256;

std::size_t align_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

/// The pool scalars of a shape, for the shared level checks.
PagedKvCache pool_of(const CascadeShape& s) {
  PagedKvCache kv;
  kv.page_size = s.page_size;
  kv.num_pages = s.num_pages;
  kv.heads_kv = s.heads_kv;
  kv.head_dim = s.head_dim;
  kv.dtype = s.dtype;
  return kv;
}

/// Keys per bulk-copy box of the warp-specialised kernel for a page size: a divisor of the
/// 64-key tile granule that never straddles a page (the page size itself when it divides 64,
/// 64 when 64 divides the page size); 0 when no such box exists (that level keeps the cp.async
/// kernels).
int tma_box_rows(std::int64_t page_size) {
  if (page_size >= kKvTile) return page_size % kKvTile == 0 ? kKvTile : 0;
  return page_size >= 8 && kKvTile % page_size == 0 ? static_cast<int>(page_size) : 0;
}

/// Keys per run box of the warp-specialised kernel for a page size (0: no run boxes): pages
/// shorter than 64 keys whose ids follow one another are copied 64 keys per box. On the H200 the
/// prefix level of 32k/256/128 (16-key pages) took 120 µs in boxes of one page, 117-118 in runs
/// of 32 or 64 keys (with boxes of one page and one half of head_dim each: 156 µs).
int tma_run_keys(std::int64_t page_size) {
  const int keys = kKvTile;
  const int box = tma_box_rows(page_size);
  return box > 0 && box < keys && keys % box == 0 && kKvTile % keys == 0 ? keys : 0;
}

/// The warp-specialised kernel variant a tuning asks for (`kernels::CascadeWsVariant`; 0 =
/// never use it, the levels then run on the cp.async kernels; -1 = the default).
int resolve_ws_variant(int asked) {
  return asked < 0 ? static_cast<int>(kernels::CascadeWsVariant::kKv128) : asked;
}

/// Stages of the 16-row cp.async tile for a level whose splits hold `chunk` keys: 3 when a CTA
/// streams many KV tiles (a long unique suffix), else 2 (more CTAs per SM for short ones).
int small_stages(int chunk) { return chunk >= 8 * kKvTile ? 3 : 2; }

/// True when a `wgmma` level of this shape runs on the warp-specialised kernel (bf16,
/// head_dim 128, tiles of 64 or 128 rows, a page size with a bulk-copy box).
bool ws_level(const CascadeShape& s, const CascadeLevelPlan& lp, int ws_variant) {
  return lp.wgmma && (lp.tile_rows == 64 || lp.tile_rows == 128) && s.head_dim == 128 &&
         s.dtype == DType::kBF16 && tma_box_rows(s.page_size) > 0 && ws_variant != 0;
}

/// Chooses the KV split (tokens per split) of a level by wave efficiency: the fewest splits
/// whose CTAs fill the machine in the fewest, fullest waves (`ctas_per_sm` resident at once).
int choose_chunk(const std::int64_t* tiles, const std::int32_t* lens, std::int64_t nseg,
                 std::int64_t max_len, std::int64_t heads_kv, int ctas_per_sm, int num_sms,
                 std::int64_t rows_total, std::int64_t head_dim, std::int64_t granule) {
  if (max_len <= 0) return kKvTile;
  const std::int64_t slots = static_cast<std::int64_t>(num_sms) * ctas_per_sm;
  std::int64_t best_chunk = ceil_div(max_len, granule) * granule;
  double best_cost = std::numeric_limits<double>::infinity();
  std::int64_t prev = -1;
  for (int n = 1; n <= kMaxLevelSplits; ++n) {
    const std::int64_t chunk = ceil_div(ceil_div(max_len, n), granule) * granule;
    if (chunk == prev) continue;
    prev = chunk;
    const std::int64_t splits = ceil_div(max_len, chunk);
    // partial states beyond 1 GiB of workspace are not worth it
    if (splits > 1 && rows_total * splits * head_dim * 4 > (std::int64_t{1} << 30)) break;
    std::int64_t ctas = 0;
    for (std::int64_t s = 0; s < nseg; ++s)
      ctas += tiles[s] * std::max<std::int64_t>(1, ceil_div(lens[s], chunk));
    ctas *= heads_kv;
    const std::int64_t waves = ceil_div(ctas, slots);
    // a CTA costs its keys plus a fixed start-up; each split adds partial-state traffic
    const double cost = static_cast<double>(waves) * static_cast<double>(chunk + 2 * kKvTile) +
                        4.0 * static_cast<double>(splits);
    if (cost < best_cost) {
      best_cost = cost;
      best_chunk = chunk;
    }
    if (chunk == granule) break;
  }
  return static_cast<int>(best_chunk);
}

/// Plans a unique last level on the split-KV decode (`plan.last_decode`, the level's plan).
void plan_decode_level(CascadePlan& plan, const CascadeLevel& lv, const CascadeTuning& tuning,
                       int num_sms) {
  const CascadeShape& shape = plan.shape;
  DecodeProblem dp;
  dp.batch = shape.batch;
  dp.q_len = shape.q_len;
  dp.heads_q = shape.heads_q;
  dp.heads_kv = shape.heads_kv;
  dp.head_dim = shape.head_dim;
  dp.q_dtype = shape.dtype;
  dp.kv_dtype = shape.dtype;
  DecodeOptions dopt;
  dopt.scale = plan.scale;
  if (tuning.decode_splits > 0) {
    dopt.policy = SplitPolicy::kFixedCount;
    dopt.num_splits = tuning.decode_splits;
  }
  plan.last_decode = plan_decode(dp, lv.seg_lens, dopt, num_sms);
  CascadeLevelPlan& lp = plan.levels[plan.num_levels - 1];
  lp.decode = true;
  lp.tile_rows = 16;
  lp.max_tiles = plan.last_decode.row_tiles;
  lp.chunk = plan.last_decode.splits.policy == SplitPolicy::kFixedSize
                 ? plan.last_decode.splits.split_size
                 : 0;
  lp.max_splits = plan.last_decode.splits.max_splits;
}

/// Shared levels this long or shorter (keys) are latency-bound: they leave SMs to the decode of
/// the last level (see `reserved_sms`).
constexpr std::int64_t kReserveMaxSharedKeys = 8192;
/// Resident decode CTAs per SM assumed when reserving SMs for them.
constexpr std::int64_t kReserveDecodeCtasPerSm = 2;
/// A decode level of at most this many waves (of `kReserveDecodeCtasPerSm` CTAs on every SM)
/// folds the shared levels' states (see `CascadeTuning::decode_fold`).
constexpr std::int64_t kFoldMaxDecodeWaves = 2;

/// CTAs of the last level's decode (`plan.last_decode`).
std::int64_t decode_ctas(const CascadePlan& plan) {
  const DecodePlan& d = plan.last_decode;
  return plan.shape.batch * plan.shape.heads_kv * d.row_tiles *
         std::max<std::int64_t>(1, d.splits.max_splits);
}

/// SMs the shared levels leave to the decode of the last level (`CascadeTuning::decode_sms`):
/// automatically, enough for every decode CTA at once when they take at most half of the SMs
/// and every shared segment is short (a latency-bound level loses little to fewer SMs, and the
/// decode then runs entirely beside it instead of after it); else none.
int reserved_sms(const CascadePlan& plan, const CascadeLevel* host_levels,
                 const CascadeTuning& tuning, int num_sms) {
  if (plan.num_levels < 2) return 0;  // no shared level to run beside
  if (tuning.decode_sms >= 0) return std::min(tuning.decode_sms, num_sms - 1);
  const std::int64_t need = ceil_div(decode_ctas(plan), kReserveDecodeCtasPerSm);
  if (need > num_sms / 2) return 0;
  for (int l = 0; l + 1 < plan.num_levels; ++l) {
    const CascadeLevel& lv = host_levels[l];
    for (std::int64_t s = 0; s < lv.num_segments; ++s)
      if (lv.seg_lens[s] > kReserveMaxSharedKeys) return 0;
  }
  return static_cast<int>(need);
}

/// Bytes of the partial states `(num_slots, rows, head_dim)` and their LSEs in the workspace.
std::size_t partials_bytes(const CascadePlan& plan) {
  const std::size_t slots_rows =
      static_cast<std::size_t>(plan.num_slots) * static_cast<std::size_t>(plan.rows());
  return align_up(slots_rows * static_cast<std::size_t>(plan.shape.head_dim) * sizeof(float)) +
         align_up(slots_rows * sizeof(float));
}

/// Bytes of the last level's decode workspace (0 unless that level runs on the decode).
std::size_t decode_bytes(const CascadePlan& plan) {
  return plan.num_levels > 0 && plan.levels[plan.num_levels - 1].decode
             ? plan.last_decode.workspace_bytes()
             : 0;
}

/// True when level `l` of `num_levels` can run on the split-KV decode: the last level, every
/// segment owned by exactly one request in request order (segment `b` is request `b`), keys that
/// exist, and causal new tokens (the decode's masking) or a single one.
bool decode_eligible(const CascadeShape& shape, const CascadeLevel& lv, int l, int num_levels,
                     const CascadeOptions& options, const CascadeTuning& tuning) {
  if (!tuning.decode_last_level || l != num_levels - 1 || lv.num_segments != shape.batch)
    return false;
  if (shape.q_len > 1 && !options.causal) return false;
  if (lv.page_indptr[lv.num_segments] <= 0) return false;
  for (std::int64_t s = 0; s <= lv.num_segments; ++s)
    if (lv.request_indptr[s] != s) return false;
  return true;
}

/// The workspace: large enough, 16-byte aligned, and disjoint from `out` (written while the
/// workspace is read) and from `q` (read while the workspace is written) when they are given.
void check_workspace(const char* func, const CascadePlan& plan, const void* ws, std::size_t bytes,
                     const StateView* out = nullptr, const ConstTensorView* q = nullptr) {
  const std::size_t need = plan.workspace_bytes();
  if (bytes < need)
    throw_argument(func, "workspace_bytes", ">= plan.workspace_bytes() = " + std::to_string(need),
                   std::to_string(bytes), Status::kWorkspaceTooSmall);
  if (need > 0 && ws == nullptr) throw_argument(func, "workspace", "a non-null pointer", "nullptr");
  ::attnstate::detail::check_aligned(func, "workspace", ws, 16);
  const auto need_bytes = static_cast<std::int64_t>(need);
  if (out != nullptr)
    ::attnstate::detail::check_disjoint(func, "out", *out, "workspace", ws, need_bytes, nullptr, 0);
  if (q != nullptr && ::attnstate::detail::ranges_overlap(
                          q->data, ::attnstate::detail::tensor_bytes(*q), ws, need_bytes))
    throw_argument(func, "workspace", "memory disjoint from q", "an overlap");
}

/// Largest GQA group (`heads_q / heads_kv`) of a cascade (`CascadeShape::heads_q`).
constexpr std::int64_t kMaxCascadeGroup = 64;

void check_plan(const char* func, const CascadePlan& plan) {
  if (plan.num_levels < 1 || plan.num_levels > kMaxCascadeLevels || plan.num_slots < 1 ||
      plan.shape.batch < 1 || plan.scale == 0.f || !std::isfinite(plan.scale))
    throw_argument(func, "plan", "a plan made by plan_cascade",
                   "num_levels " + cascade_str(plan.num_levels) + ", num_slots " +
                       cascade_str(plan.num_slots) + ", shape.batch " +
                       cascade_str(plan.shape.batch) + ", scale " + std::to_string(plan.scale));
  if (plan.ws_variant < 0 || plan.ws_variant > 4)
    throw_argument(func, "plan.ws_variant", "0..4", cascade_str(plan.ws_variant));
  // The plan is a public struct: its per-level fields must still describe slots inside the
  // workspace and launchable kernels (checked before anything is queued).
  int slots = 0;
  for (int l = 0; l < plan.num_levels; ++l) {
    const CascadeLevelPlan& lp = plan.levels[l];
    const auto bad = [&](const char* field, const std::string& want, std::int64_t got) {
      throw_argument(func, ("plan.levels[" + std::to_string(l) + "]." + field).c_str(), want,
                     cascade_str(got));
    };
    if (lp.num_segments < 1) bad("num_segments", ">= 1", lp.num_segments);
    if (lp.slot_offset != slots)
      bad("slot_offset", "the slots of the levels before it = " + cascade_str(slots),
          lp.slot_offset);
    if (lp.decode) {
      if (l != plan.num_levels - 1) bad("decode", "false except on the last level", 1);
      if (plan.last_decode.problem.batch != plan.shape.batch ||
          plan.last_decode.problem.heads_q != plan.shape.heads_q ||
          plan.last_decode.problem.heads_kv != plan.shape.heads_kv ||
          plan.last_decode.problem.head_dim != plan.shape.head_dim ||
          plan.last_decode.problem.q_len != plan.shape.q_len)
        throw_argument(func, "plan.last_decode.problem", "the shape of plan.shape",
                       "a different batch, heads, head_dim or q_len");
      slots += 1;
      continue;
    }
    if (!kernels::cascade_tile_supported(lp.tile_rows))
      bad("tile_rows", "16, 64 or 128", lp.tile_rows);
    if (lp.chunk < 1) bad("chunk", ">= 1", lp.chunk);
    if (lp.max_tiles < 1) bad("max_tiles", ">= 1", lp.max_tiles);
    if (lp.max_splits < 1 || lp.max_splits > plan.num_slots - slots)
      bad("max_splits", "1.." + cascade_str(plan.num_slots - slots) + " (slots left)",
          lp.max_splits);
    if (lp.num_segments * lp.max_tiles * lp.max_splits >= (std::int64_t{1} << 31))
      bad("max_splits", "a grid of fewer than 2^31 blocks",
          lp.num_segments * lp.max_tiles * lp.max_splits);
    slots += lp.max_splits;
  }
  if (slots != plan.num_slots)
    throw_argument(func, "plan.num_slots", "the slots of its levels = " + cascade_str(slots),
                   cascade_str(plan.num_slots));
}

/// Checks the tensors of a level run against the plan; returns the bytes of each KV pool.
std::int64_t check_inputs(const char* func, const CascadePlan& plan, const ConstTensorView& q,
                          const PagedKvCache& kv) {
  const CascadeShape& s = plan.shape;
  const std::int64_t pool_bytes =
      ::attnstate::detail::check_cascade_pool(func, kv, MemorySpace::kDevice);
  if (kv.dtype != s.dtype)
    throw_argument(func, "kv.dtype", std::string("the planned ") + to_string(s.dtype),
                   to_string(kv.dtype));
  if (kv.page_size != s.page_size)
    throw_argument(func, "kv.page_size", "the planned " + cascade_str(s.page_size),
                   cascade_str(kv.page_size));
  if (kv.heads_kv != s.heads_kv)
    throw_argument(func, "kv.heads_kv", "the planned " + cascade_str(s.heads_kv),
                   cascade_str(kv.heads_kv));
  if (kv.head_dim != s.head_dim)
    throw_argument(func, "kv.head_dim", "the planned " + cascade_str(s.head_dim),
                   cascade_str(kv.head_dim));
  if (kv.num_pages < 1) throw_argument(func, "kv.num_pages", ">= 1", cascade_str(kv.num_pages));
  ::attnstate::detail::check_aligned(func, "kv.k", kv.k, 16);  // the kernels' 16-byte copies
  ::attnstate::detail::check_aligned(func, "kv.v", kv.v, 16);
  if (kv.page_elems() % 8 != 0)
    throw_argument(func, "kv.page_stride", "a page stride that is a multiple of 8 elements",
                   cascade_str(kv.page_elems()));
  ::attnstate::detail::check_cascade_query(func, q, kv, MemorySpace::kDevice);
  if (q.dtype != s.dtype)
    throw_argument(func, "q.dtype", std::string("the planned ") + to_string(s.dtype),
                   to_string(q.dtype));
  if (q.shape[0] != s.batch || q.shape[1] != s.q_len || q.shape[2] != s.heads_q)
    throw_argument(func, "q.shape",
                   "the planned (batch, q_len, heads_q) = (" + cascade_str(s.batch) + ", " +
                       cascade_str(s.q_len) + ", " + cascade_str(s.heads_q) + ")",
                   "(" + cascade_str(q.shape[0]) + ", " + cascade_str(q.shape[1]) + ", " +
                       cascade_str(q.shape[2]) + ")");
  if (reinterpret_cast<std::uintptr_t>(q.data) % 16 != 0 || q.stride[0] % 8 != 0 ||
      q.stride[1] % 8 != 0 || q.stride[2] % 8 != 0)
    throw_argument(func, "q", "a 16-byte aligned pointer and strides that are multiples of 8",
                   "address % 16 = " + cascade_str(reinterpret_cast<std::uintptr_t>(q.data) % 16) +
                       ", strides (" + cascade_str(q.stride[0]) + ", " + cascade_str(q.stride[1]) +
                       ", " + cascade_str(q.stride[2]) + ")");
  return pool_bytes;
}

void check_device_level(const char* func, const CascadePlan& plan, int l, const CascadeLevel& lv) {
  using ::attnstate::detail::cascade_level_arg;
  if (lv.num_segments != plan.levels[l].num_segments)
    throw_argument(func, cascade_level_arg(l, "num_segments").c_str(),
                   "the planned " + cascade_str(plan.levels[l].num_segments),
                   cascade_str(lv.num_segments));
  ::attnstate::detail::check_level_arrays(func, l, lv, plan.levels[l].has_pages);
}

/// True when the `wgmma` level kernels can run on the current device: an sm_90 part, and the
/// code the runtime loaded for it was built for sm_90a (a build for plain `90` has none; the
/// level then runs on the `mma.sync` kernels). Cached per device ordinal (neither changes).
bool wgmma_available() {
  constexpr int kMaxDevices = 64;
  static std::atomic<signed char> known[kMaxDevices] = {};  // 0 unknown, 1 no, 2 yes
  int dev = 0, major = 0, minor = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= 0 && dev < kMaxDevices) {
    const signed char k = known[dev].load(std::memory_order_relaxed);
    if (k != 0) return k == 2;
  }
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  const bool yes = major == 9 && minor == 0 && kernels::sm90a_code_loaded();
  if (dev >= 0 && dev < kMaxDevices) known[dev].store(yes ? 2 : 1, std::memory_order_relaxed);
  return yes;
}

/// `cuTensorMapEncodeTiled` of the driver, looked up once through the runtime (no link to the
/// driver library); null when unavailable.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn encode_tiled_fn() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();  // not an error of the caller's: fall back to cp.async kernels
      return static_cast<EncodeTiledFn>(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

/// Encodes the tensor maps of the pool's K and V (`kernels::CascadeTmaMaps`, head_dim 128) as
/// 5-D tensors whose boxes land in the KV tile layout of the warp-specialised kernel: boxes of
/// `*box` keys of one page with both halves of head_dim, and with `*run` > `*box` the run maps
/// (boxes of `*run` keys of consecutive whole pages, NHD pools only). `*coords` receives the
/// dims' kind: 0 NHD, 1 unpadded HND (page and KV head as one dim), 2 padded HND (boxes of 8
/// keys: `*box` becomes 8). `*run` becomes 0 when there are no run maps. False when the pool
/// cannot be described (the caller falls back to the cp.async kernels).
bool encode_kv_maps(const PagedKvCache& kv, int* box, int* run, int* coords,
                    kernels::CascadeTmaMaps* maps) {
  const EncodeTiledFn fn = encode_tiled_fn();
  if (fn == nullptr || kv.head_dim != 128 || kv.page_size % 8 != 0 ||
      kv.num_pages > std::numeric_limits<std::int32_t>::max())
    return false;
  const std::int64_t e = 2;  // bytes per element (bf16)
  const std::int64_t S = kv.page_size, H = kv.heads_kv, D = kv.head_dim, P = kv.num_pages;
  const std::int64_t page_bytes = kv.page_elems() * e;
  const void* ptrs[2] = {kv.k, kv.v};
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  // K and V into `k_map` and `v_map`: sizes `d` of the 5 dims, byte strides `st` of dims 1-4,
  // boxes `bx`
  auto encode = [&](const std::int64_t* d, const std::int64_t* st, const std::int64_t* bx,
                    CUtensorMap* k_map, CUtensorMap* v_map) {
    cuuint64_t dims[5], strides[4];
    cuuint32_t box_dims[5];
    for (int i = 0; i < 5; ++i) {
      dims[i] = static_cast<cuuint64_t>(d[i]);
      box_dims[i] = static_cast<cuuint32_t>(bx[i]);
    }
    for (int i = 0; i < 4; ++i) {
      if (st[i] % 16 != 0 || st[i] >= (std::int64_t{1} << 40)) return false;
      strides[i] = static_cast<cuuint64_t>(st[i]);
    }
    CUtensorMap* out[2] = {k_map, v_map};
    for (int i = 0; i < 2; ++i)
      if (fn(out[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, const_cast<void*>(ptrs[i]), dims, strides,
             box_dims, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return false;
    return true;
  };
  std::int64_t dims[5], st[4];
  if (kv.layout == KvLayout::kNHD) {
    *coords = 0;  // (64 of head_dim, 8 slots, KV head · 2 + half, slot / 8, page)
    const std::int64_t d[5] = {64, 8, 2 * H, S / 8, P};
    const std::int64_t t[4] = {H * D * e, 64 * e, 8 * H * D * e, page_bytes};
    std::copy(d, d + 5, dims);
    std::copy(t, t + 4, st);
  } else if (page_bytes == H * S * D * e && P * H <= std::numeric_limits<std::int32_t>::max()) {
    *coords = 1;  // (64, 8 slots, half, slot / 8, page · heads_kv + KV head)
    *run = 0;
    const std::int64_t d[5] = {64, 8, 2, S / 8, P * H};
    const std::int64_t t[4] = {D * e, 64 * e, 8 * D * e, S * D * e};
    std::copy(d, d + 5, dims);
    std::copy(t, t + 4, st);
  } else {
    *coords = 2;  // (64, slot, half, KV head, page): boxes of 8 slots
    *box = 8;
    *run = 0;
    const std::int64_t d[5] = {64, S, 2, H, P};
    const std::int64_t t[4] = {D * e, 64 * e, S * D * e, page_bytes};
    std::copy(d, d + 5, dims);
    std::copy(t, t + 4, st);
  }
  const std::int64_t G = *box;
  const std::int64_t page_box[5] = {64, 8, 2, *coords == 2 ? 1 : G / 8, 1};
  if (!encode(dims, st, page_box, &maps->k, &maps->v)) return false;
  maps->k_run = maps->k;
  maps->v_run = maps->v;
  const std::int64_t run_box[5] = {64, 8, 2, G / 8, *run / G};
  if (*run > G && !encode(dims, st, run_box, &maps->k_run, &maps->v_run)) {
    *run = 0;
    maps->k_run = maps->k;
    maps->v_run = maps->v;
  }
  return true;
}

/// Launches level `l`; with `overlap` as a programmatic dependent launch that may run beside
/// the previous level's kernel (levels write disjoint workspace slots; the merge waits for all).
/// How `launch_decode_level` runs the decode of a unique last level.
enum class DecodeLevelMode {
  kSlot,        ///< Its state to its workspace slot, stream-ordered (the stage-by-stage API).
  kSlotBeside,  ///< The same, launched beside the previous kernel (never waits for it).
  kFold,        ///< Folds the earlier levels' slots into `out` (waits for them before that).
};

/// Runs level `l` (a unique last level) with the split-KV decode: the segments' page lists are
/// the requests' page table, their lengths the sequence lengths. `kSlot` and `kSlotBeside` write
/// the state to the level's workspace slot (fp32, base 2) for the merge; `kSlotBeside` as a
/// programmatic dependent launch that reads nothing of the previous kernel's (it may run on the
/// SMs a shared level leaves while that one still runs; its grid completes after it, so the
/// merge launched next sees both). `kFold` folds the earlier levels' partial states (workspace
/// slots before this level's) into its own merge and writes the final state to `out`, so no merge
/// launch follows. With `zero_tickets` the decode's tickets are zeroed first (one small memset;
/// `run_cascade` issues it before the first level instead, so that the decode can start beside
/// the level before it), so the cascade's workspace needs no initialisation.
void launch_decode_level(const CascadePlan& plan, int l, const ConstTensorView& q,
                         const PagedKvCache& kv, const CascadeLevel& lv, void* workspace,
                         DecodeLevelMode mode, const StateView* out, bool zero_tickets,
                         cudaStream_t stream, bool check_only = false) {
  const CascadeShape& s = plan.shape;
  PagedKvCache table = kv;
  table.page_indptr = lv.page_indptr;
  table.page_indices = lv.page_indices;
  table.block_table = nullptr;
  table.block_table_stride = 0;
  table.seq_lens = lv.seg_lens;
  table.batch = s.batch;
  table.space = MemorySpace::kDevice;
  const std::int64_t rows = plan.rows();
  char* ws = static_cast<char*>(workspace);
  float* slot_o = reinterpret_cast<float*>(ws) +
                  static_cast<std::int64_t>(plan.levels[l].slot_offset) * rows * s.head_dim;
  float* slot_lse =
      reinterpret_cast<float*>(ws + align_up(static_cast<std::size_t>(plan.num_slots) * rows *
                                             s.head_dim * sizeof(float))) +
      static_cast<std::int64_t>(plan.levels[l].slot_offset) * rows;
  const StateView slot =
      make_state_view(slot_o, DType::kF32, slot_lse, s.batch * s.q_len, s.heads_q, s.head_dim,
                      LseBase::kBase2, MemorySpace::kDevice);
  const std::size_t dbytes = decode_bytes(plan);
  void* dws = dbytes > 0 ? ws + partials_bytes(plan) : nullptr;
  if (dbytes > 0 && zero_tickets && !check_only)
    init_decode_workspace(plan.last_decode, dws, dbytes, stream);
  const auto run = [&](const StateView& o, const detail::PriorStates& p) {
    if (check_only)
      detail::check_decode_with_prior(plan.last_decode, q, table, o, dws, dbytes, p);
    else
      detail::run_decode_with_prior(plan.last_decode, q, table, o, dws, dbytes, p, stream);
  };
  if (mode == DecodeLevelMode::kSlot) return run(slot, detail::PriorStates{});
  if (mode == DecodeLevelMode::kSlotBeside) {
    detail::PriorStates none;
    none.beside_previous = true;
    return run(slot, none);
  }
  detail::PriorStates prior;
  prior.o = reinterpret_cast<const float*>(ws);
  prior.lse = slot_lse - static_cast<std::int64_t>(plan.levels[l].slot_offset) * rows;
  prior.count = plan.levels[l].slot_offset;
  prior.rows = rows;
  run(*out, prior);
}

void launch_level(const CascadePlan& plan, int l, const ConstTensorView& q, const PagedKvCache& kv,
                  const CascadeLevel& lv, void* workspace, bool overlap, cudaStream_t stream) {
  const CascadeShape& s = plan.shape;
  const CascadeLevelPlan& lp = plan.levels[l];
  if (lp.decode) {
    launch_decode_level(plan, l, q, kv, lv, workspace, DecodeLevelMode::kSlot, nullptr, true,
                        stream);
    return;
  }
  kernels::CascadeLevelParams p{};
  p.q = q.data;
  p.q_stride_b = q.stride[0];
  p.q_stride_t = q.stride[1];
  p.q_stride_h = q.stride[2];
  p.k = kv.k;
  p.v = kv.v;
  p.page_elems = kv.page_elems();
  p.num_pages = kv.num_pages;
  p.page_size = static_cast<int>(kv.page_size);
  p.page_shift = -1;
  for (int b = 0; b < 31; ++b)
    if ((std::int64_t{1} << b) == kv.page_size) p.page_shift = b;
  p.prefetch_pages = plan.prefetch_pages ? 1 : 0;
  p.heads_kv = static_cast<int>(kv.heads_kv);
  p.hnd = kv.layout == KvLayout::kHND ? 1 : 0;
  p.request_indptr = lv.request_indptr;
  p.page_indptr = lv.page_indptr;
  p.page_indices = lv.page_indices;
  p.seg_lens = lv.seg_lens;
  p.num_segments = static_cast<int>(lp.num_segments);
  p.batch = static_cast<int>(s.batch);
  p.q_len = static_cast<int>(s.q_len);
  p.group = static_cast<int>(s.heads_q / s.heads_kv);
  p.heads_q = static_cast<int>(s.heads_q);
  p.chunk = lp.chunk;
  p.max_splits = lp.max_splits;
  p.max_tiles = lp.max_tiles;
  p.causal_tail = (plan.causal && s.q_len > 1 && l == plan.num_levels - 1) ? 1 : 0;
  p.s2_scale = math::base2_score_scale(plan.scale);
  const std::int64_t rows = plan.rows();
  p.ws_o = static_cast<float*>(workspace);
  p.ws_lse = reinterpret_cast<float*>(
      static_cast<char*>(workspace) +
      align_up(static_cast<std::size_t>(plan.num_slots) * rows * s.head_dim * sizeof(float)));
  p.rows_total = rows;
  p.slot_offset = lp.slot_offset;
  p.small_stages = small_stages(lp.chunk);
  const dim3 grid(static_cast<unsigned>(lp.num_segments * lp.max_tiles * lp.max_splits),
                  static_cast<unsigned>(s.heads_kv));
  const bool wgmma = lp.wgmma && lp.tile_rows >= 64 && wgmma_available();
  if (wgmma && ws_level(s, lp, plan.ws_variant)) {
    p.tma_box = tma_box_rows(s.page_size);
    const int variant = plan.ws_variant;
    p.ws_pingpong = variant == static_cast<int>(kernels::CascadeWsVariant::kKv128Turns) ||
                            variant == static_cast<int>(kernels::CascadeWsVariant::kKv64Turns)
                        ? 1
                        : 0;
    p.tma_run = tma_run_keys(s.page_size);
    kernels::CascadeTmaMaps maps;
    if (encode_kv_maps(kv, &p.tma_box, &p.tma_run, &p.tma_coords, &maps)) {
      kernels::launch_cascade_level_ws_bf16(p, maps, lp.tile_rows,
                                            static_cast<kernels::CascadeWsVariant>(variant), grid,
                                            overlap, stream);
      return;
    }
  }
  if (s.dtype == DType::kBF16)
    kernels::launch_cascade_level_bf16(p, lp.tile_rows, static_cast<int>(s.head_dim), wgmma, grid,
                                       overlap, stream);
  else
    kernels::launch_cascade_level_f16(p, lp.tile_rows, static_cast<int>(s.head_dim), wgmma, grid,
                                      overlap, stream);
}

/// Launches the merge for head dim `D`; `programmatic`: as a programmatic dependent launch (its
/// CTAs may be placed while the previous kernel finishes; they wait for it before reading).
template <int D>
void launch_merge_d(const kernels::CascadeMergeParams& p, DType out_dt, bool programmatic,
                    cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(ceil_div(p.rows, kernels::kCascadeMergeWarps)));
  cfg.blockDim = dim3(32 * kernels::kCascadeMergeWarps);
  cfg.stream = stream;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = programmatic ? &attr : nullptr;
  cfg.numAttrs = programmatic ? 1 : 0;
  switch (out_dt) {
    case DType::kF16:
      ATTNSTATE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernels::cascade_merge_kernel<D, half_t>, p));
      break;
    case DType::kBF16:
      ATTNSTATE_CUDA_CHECK(
          cudaLaunchKernelEx(&cfg, kernels::cascade_merge_kernel<D, bfloat16_t>, p));
      break;
    default:
      ATTNSTATE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernels::cascade_merge_kernel<D, float>, p));
      break;
  }
  ATTNSTATE_CHECK_LAUNCH(stream, "cascade_merge_kernel");
}

void launch_merge(const CascadePlan& plan, StateView out, const void* workspace, bool programmatic,
                  cudaStream_t stream) {
  const std::int64_t rows = plan.rows();
  kernels::CascadeMergeParams p{};
  p.ws_o = static_cast<const float*>(workspace);
  p.ws_lse = reinterpret_cast<const float*>(static_cast<const char*>(workspace) +
                                            align_up(static_cast<std::size_t>(plan.num_slots) *
                                                     rows * plan.shape.head_dim * sizeof(float)));
  p.rows = rows;
  p.num_slots = plan.num_slots;
  p.heads_q = static_cast<int>(plan.shape.heads_q);
  p.out_o = out.o;
  p.out_lse = out.lse;
  p.o_stride_token = out.o_stride_token;
  p.o_stride_head = out.o_stride_head;
  p.lse_stride_token = out.lse_stride_token;
  p.lse_stride_head = out.lse_stride_head;
  p.base = out.base;
  if (plan.shape.head_dim == 64)
    launch_merge_d<64>(p, out.dtype, programmatic, stream);
  else
    launch_merge_d<128>(p, out.dtype, programmatic, stream);
}

/// Checks the output view (and, when given, that it does not overlap the queries).
void check_out(const char* func, const CascadePlan& plan, const StateView& out,
               const ConstTensorView* q = nullptr) {
  ::attnstate::detail::check_cascade_out(func, out, plan.shape.batch * plan.shape.q_len,
                                         plan.shape.heads_q, plan.shape.head_dim,
                                         MemorySpace::kDevice, q);
}

}  // namespace

std::size_t CascadePlan::workspace_bytes() const {
  return partials_bytes(*this) + align_up(decode_bytes(*this));
}

CascadePlan plan_cascade(const CascadeShape& shape, const CascadeLevel* host_levels, int num_levels,
                         const CascadeOptions& options, int num_sms, const CascadeTuning& tuning) {
  const char* func = "attnstate::cuda::plan_cascade";
  if (shape.batch < 1 || shape.batch > (std::int64_t{1} << 24))
    throw_argument(func, "shape.batch", "1..2^24", cascade_str(shape.batch));
  if (shape.q_len < 1 || shape.q_len > kMaxCascadeQueryLen)
    throw_argument(func, "shape.q_len", "1.." + cascade_str(kMaxCascadeQueryLen),
                   cascade_str(shape.q_len));
  if (shape.heads_kv < 1 || shape.heads_kv > 65535)
    throw_argument(func, "shape.heads_kv", "1..65535", cascade_str(shape.heads_kv));
  if (shape.heads_q < 1 || shape.heads_q % shape.heads_kv != 0 ||
      shape.heads_q / shape.heads_kv > kMaxCascadeGroup)
    throw_argument(func, "shape.heads_q",
                   "a positive multiple of heads_kv, at most " + cascade_str(kMaxCascadeGroup) +
                       " times it (the GQA group)",
                   cascade_str(shape.heads_q));
  // the kernels index query rows with 32-bit integers
  if (shape.batch * shape.q_len * shape.heads_q > 0x7FFFFFFF)
    throw_argument(func, "shape.batch", "batch * q_len * heads_q < 2^31",
                   cascade_str(shape.batch * shape.q_len * shape.heads_q));
  if (shape.page_size < 1 || shape.page_size > (1 << 20))
    throw_argument(func, "shape.page_size", "1..2^20", cascade_str(shape.page_size));
  if (shape.num_pages < 0)
    throw_argument(func, "shape.num_pages", ">= 0", cascade_str(shape.num_pages));
  if (shape.dtype != DType::kF16 && shape.dtype != DType::kBF16)
    throw_argument(func, "shape.dtype", "f16 or bf16", to_string(shape.dtype),
                   Status::kNotSupported);
  if (!kernels::cascade_head_dim_supported(shape.head_dim))
    throw_argument(func, "shape.head_dim", "64 or 128", cascade_str(shape.head_dim),
                   Status::kNotSupported);
  if (num_sms < 1) throw_argument(func, "num_sms", ">= 1", cascade_str(num_sms));
  if (tuning.tile_rows != 0 && !kernels::cascade_tile_supported(tuning.tile_rows))
    throw_argument(func, "tuning.tile_rows", "0, 16, 64 or 128", cascade_str(tuning.tile_rows));
  if (tuning.kernel != CascadeKernel::kAuto && tuning.kernel != CascadeKernel::kMma &&
      tuning.kernel != CascadeKernel::kWgmma)
    throw_argument(func, "tuning.kernel", "kAuto, kMma or kWgmma",
                   "value " + cascade_str(static_cast<int>(tuning.kernel)));
  if (tuning.chunk < 0 || tuning.chunk % kKvTile != 0)
    throw_argument(func, "tuning.chunk", "0 or a positive multiple of 64",
                   cascade_str(tuning.chunk));
  if (tuning.decode_sms < -1 || tuning.decode_sms >= num_sms)
    throw_argument(func, "tuning.decode_sms", "-1 (automatic) or 0..num_sms - 1",
                   cascade_str(tuning.decode_sms));
  if (tuning.ws_variant < -1 || tuning.ws_variant > 4)
    throw_argument(func, "tuning.ws_variant", "-1 (automatic) or 0..4",
                   cascade_str(tuning.ws_variant));
  if (tuning.decode_fold < -1 || tuning.decode_fold > 1)
    throw_argument(func, "tuning.decode_fold", "-1 (automatic), 0 or 1",
                   cascade_str(tuning.decode_fold));
  // a fixed split count of the decode level goes to plan_decode, which takes 1..kMaxSplits
  if (tuning.decode_splits < 0 || tuning.decode_splits > ::attnstate::kMaxSplits)
    throw_argument(func, "tuning.decode_splits",
                   "0 (automatic) or 1.." + cascade_str(::attnstate::kMaxSplits),
                   cascade_str(tuning.decode_splits));
  const PagedKvCache kv = pool_of(shape);
  ::attnstate::detail::check_cascade_levels(func, host_levels, num_levels, shape.batch, shape.q_len,
                                            options.causal, kv, true);
  CascadePlan plan;
  plan.shape = shape;
  plan.num_levels = num_levels;
  plan.scale = ::attnstate::detail::cascade_scale(func, options, shape.head_dim);
  plan.ws_variant = resolve_ws_variant(tuning.ws_variant);
  plan.causal = options.causal;
  plan.num_sms = num_sms;
  const std::int64_t group = shape.heads_q / shape.heads_kv;
  const std::int64_t rows_per_req = shape.q_len * group;
  // A last level on the decode is planned first: the shared levels may leave it some SMs.
  const int last = num_levels - 1;
  const bool decode_last =
      decode_eligible(shape, host_levels[last], last, num_levels, options, tuning);
  if (decode_last) plan_decode_level(plan, host_levels[last], tuning, num_sms);
  plan.decode_sms = decode_last ? reserved_sms(plan, host_levels, tuning, num_sms) : 0;
  // The decode folds the shared levels' states (no merge launch) when its CTAs wait beside them
  // on SMs of their own, or when it is a wave or two: then few CTAs hold their slots while they
  // wait. A larger decode runs ahead on whatever SMs the shared levels leave and a merge launch
  // follows (H200, 20 benchmark shapes: the merge launch won by 1-16 us at batch 128 and 256,
  // the fold by up to 5 us at batch 16 and 64).
  plan.decode_fold =
      !decode_last || num_levels == 1 || tuning.decode_fold == 1 ||
      (tuning.decode_fold == -1 &&
       (plan.decode_sms > 0 ||
        decode_ctas(plan) <= kFoldMaxDecodeWaves * kReserveDecodeCtasPerSm * num_sms));
  std::int64_t slots = 0;
  for (int l = 0; l < num_levels; ++l) {
    const CascadeLevel& lv = host_levels[l];
    CascadeLevelPlan& lp = plan.levels[l];
    lp.num_segments = lv.num_segments;
    lp.has_pages = lv.page_indptr[lv.num_segments] > 0;
    if (l == last && decode_last) {
      lp.slot_offset = static_cast<int>(slots);
      slots += 1;  // the decode merges its own splits: one state per row
      continue;
    }
    std::int64_t max_rows = 0, max_len = 0;
    for (std::int64_t s = 0; s < lv.num_segments; ++s) {
      const std::int64_t rows = (lv.request_indptr[s + 1] - lv.request_indptr[s]) * rows_per_req;
      max_rows = std::max(max_rows, rows);
      if (rows > 0) max_len = std::max<std::int64_t>(max_len, lv.seg_lens[s]);
    }
    lp.tile_rows = tuning.tile_rows != 0 ? tuning.tile_rows
                   : max_rows <= 16      ? 16
                   : max_rows <= 64      ? 64
                                         : 128;
    std::vector<std::int64_t> tiles(static_cast<std::size_t>(lv.num_segments));
    std::int64_t max_tiles = 1;
    for (std::int64_t s = 0; s < lv.num_segments; ++s) {
      tiles[s] =
          ceil_div((lv.request_indptr[s + 1] - lv.request_indptr[s]) * rows_per_req, lp.tile_rows);
      max_tiles = std::max(max_tiles, tiles[s]);
    }
    lp.max_tiles = static_cast<int>(max_tiles);
    // wgmma for bf16 at head_dim 128 (the configurations validated on the H200); f16 and
    // head_dim 64 run on mma.sync
    lp.wgmma = tuning.kernel != CascadeKernel::kMma && lp.tile_rows >= 64 &&
               shape.head_dim == 128 && shape.dtype == DType::kBF16;
    // the warp-specialised kernel holds one CTA per SM, the cp.async kernels one of 128 rows
    // or two of fewer
    const bool ws = ws_level(shape, lp, plan.ws_variant);
    const int ctas_per_sm = ws || lp.tile_rows >= 128 ? 1 : 2;
    // splits of whole KV tiles of the kernel (128 keys for the warp-specialised 128-key tiles)
    const int v = plan.ws_variant;
    const std::int64_t granule =
        ws && v != static_cast<int>(kernels::CascadeWsVariant::kKv64) &&
                v != static_cast<int>(kernels::CascadeWsVariant::kKv64Turns)
            ? 2 * kKvTile
            : kKvTile;
    lp.chunk = tuning.chunk != 0
                   ? tuning.chunk
                   : choose_chunk(tiles.data(), lv.seg_lens, lv.num_segments, max_len,
                                  shape.heads_kv, ctas_per_sm, num_sms - plan.decode_sms,
                                  plan.rows(), shape.head_dim, granule);
    lp.max_splits = static_cast<int>(std::max<std::int64_t>(1, ceil_div(max_len, lp.chunk)));
    lp.slot_offset = static_cast<int>(slots);
    slots += lp.max_splits;
    const std::int64_t grid = lv.num_segments * lp.max_tiles * lp.max_splits;
    if (grid >= (std::int64_t{1} << 31) || slots > (1 << 20))
      throw_argument(func, ::attnstate::detail::cascade_level_arg(l, "num_segments").c_str(),
                     "a level of fewer than 2^31 (segment, tile, split) blocks", cascade_str(grid),
                     Status::kNotSupported);
  }
  plan.num_slots = static_cast<int>(slots);
  return plan;
}

void run_cascade_level(const CascadePlan& plan, int level, const ConstTensorView& q,
                       const PagedKvCache& kv, const CascadeLevel& device_level, void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream) {
  const char* func = "attnstate::cuda::run_cascade_level";
  check_plan(func, plan);
  if (level < 0 || level >= plan.num_levels)
    throw_argument(func, "level", "0.." + cascade_str(plan.num_levels - 1), cascade_str(level));
  const std::int64_t pool_bytes = check_inputs(func, plan, q, kv);
  check_device_level(func, plan, level, device_level);
  check_workspace(func, plan, workspace, workspace_bytes, nullptr, &q);
  // the level writes its partial states into the workspace while it reads the cache and tables
  const auto ws_bytes = static_cast<std::int64_t>(plan.workspace_bytes());
  ::attnstate::detail::check_disjoint_from_pools(func, "workspace", workspace, ws_bytes, kv,
                                                 pool_bytes);
  ::attnstate::detail::check_disjoint_from_level(func, "workspace", workspace, ws_bytes, level,
                                                 device_level, false);
  launch_level(plan, level, q, kv, device_level, workspace, false, stream);
}

void run_cascade_merge(const CascadePlan& plan, StateView out, const void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream) {
  const char* func = "attnstate::cuda::run_cascade_merge";
  check_plan(func, plan);
  check_out(func, plan, out);
  check_workspace(func, plan, workspace, workspace_bytes, &out);
  launch_merge(plan, out, workspace, false, stream);
}

void run_cascade(const CascadePlan& plan, const ConstTensorView& q, const PagedKvCache& kv,
                 const CascadeLevel* device_levels, int num_levels, StateView out, void* workspace,
                 std::size_t workspace_bytes, cudaStream_t stream) {
  const char* func = "attnstate::cuda::run_cascade";
  check_plan(func, plan);
  if (device_levels == nullptr)
    throw_argument(func, "device_levels", "a non-null pointer", "nullptr");
  if (num_levels != plan.num_levels)
    throw_argument(func, "num_levels", "the planned " + cascade_str(plan.num_levels),
                   cascade_str(num_levels));
  const std::int64_t pool_bytes = check_inputs(func, plan, q, kv);
  for (int l = 0; l < num_levels; ++l) check_device_level(func, plan, l, device_levels[l]);
  check_out(func, plan, out, &q);
  ::attnstate::detail::check_disjoint_from_pool(func, "out", out, kv, pool_bytes);
  ::attnstate::detail::check_out_disjoint_from_levels(func, out, device_levels, num_levels, false);
  check_workspace(func, plan, workspace, workspace_bytes, &out, &q);
  const auto ws_bytes = static_cast<std::int64_t>(plan.workspace_bytes());
  ::attnstate::detail::check_disjoint_from_pools(func, "workspace", workspace, ws_bytes, kv,
                                                 pool_bytes);
  for (int l = 0; l < num_levels; ++l)
    ::attnstate::detail::check_disjoint_from_level(func, "workspace", workspace, ws_bytes, l,
                                                   device_levels[l], false);
  // A last level on the decode starts beside the last shared level: either it merges the other
  // levels' states itself (no merge launch) or it runs ahead into its workspace slot and the
  // merge follows as a programmatic launch. Its tickets are zeroed before the first level so
  // that nothing stands between the last shared level and the decode.
  const int last = num_levels - 1;
  const bool decode = plan.levels[last].decode;
  const std::size_t dbytes = decode_bytes(plan);
  // the decode level's own checks (plan, tables, workspace) before anything is queued
  if (decode)
    launch_decode_level(plan, last, q, kv, device_levels[last], workspace,
                        plan.decode_fold ? DecodeLevelMode::kFold : DecodeLevelMode::kSlotBeside,
                        &out, false, stream, true);
  if (decode && dbytes > 0)
    init_decode_workspace(plan.last_decode, static_cast<char*>(workspace) + partials_bytes(plan),
                          dbytes, stream);
  for (int l = 0; l < (decode ? last : num_levels); ++l)
    launch_level(plan, l, q, kv, device_levels[l], workspace, plan.overlap_levels && l > 0, stream);
  if (!decode) {
    launch_merge(plan, out, workspace, false, stream);
  } else if (plan.decode_fold) {
    launch_decode_level(plan, last, q, kv, device_levels[last], workspace, DecodeLevelMode::kFold,
                        &out, false, stream);
  } else {
    launch_decode_level(plan, last, q, kv, device_levels[last], workspace,
                        DecodeLevelMode::kSlotBeside, nullptr, false, stream);
    launch_merge(plan, out, workspace, true, stream);
  }
}

}  // namespace cuda
}  // namespace attnstate
