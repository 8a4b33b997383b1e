/// @file mla.hpp
/// @brief CUDA backend: split-KV decode of multi-head latent attention (MLA, absorbed form) over
///        a paged latent cache (`MlaKvCache`, core/mla.hpp), plan/run like the GQA decode.
///
/// Call shape: `plan_mla_decode` (host, once per shape: the splits from the real lengths, the
/// workspace size) → allocate `plan.workspace_bytes()` of device memory, 16-byte aligned, and zero
/// its tickets once (`init_mla_decode_workspace`) → `run_mla_decode` (any number of times, on the
/// caller's stream: never allocates, never synchronises, capturable in a CUDA graph). A
/// workspace serves one plan and one run at a time (as the decode's: two runs in flight on one
/// workspace race on its tickets).
///
/// What runs: one CTA per (request, tile of 64 query rows, split); the rows of a request are its
/// `q_len × heads` (token-major), so 16 heads at q_len 1 fill one tile with 48 rows masked, and
/// 128 heads at q_len 2 take four tiles. Each CTA stages its query tile (576 bf16 columns a row)
/// in shared memory and streams its split's latent tokens in tiles of 32 (both parts of a token,
/// from their own pools, into one row of 576 columns) through a double-buffered cp.async
/// pipeline; an fp8 part lands as stored and is converted to bf16 (exact) in shared memory.
/// `S = Q Kᵀ` and `O += P V` run on mma.sync m16n8k16 (bf16, fp32 accumulators), the online
/// softmax in base 2; each of the 8 warps owns 16 rows and half (256) of the 512 output columns.
/// A request with one split writes its output state directly; split states (fp32 `o`, base-2 LSE)
/// go to the workspace and the CTA holding the request's last ticket merges them in split order
/// (the decode's max-subtracted fold), the sinks merged once after. The kernel reads `seq_lens`
/// and the page table on the device: a plan made for the maximum lengths and batch replays for
/// shorter requests, fewer requests or empty ones (`seq_len = 0`: the state `(0, -inf)`).
///
/// Numerics: fp32 accumulation, `P` rounded to bf16 for `O += P V`, fp8 dequantisation scales
/// folded exactly (K's into the scores of its part, V's into the output); results differ from
/// `cpu::mla_decode` by rounding only. Limits (refused by name): bf16 queries; `kv_lora_rank`
/// 512 and `rope_dim` 64; `heads` a multiple of 16 up to 128; `q_len` 1..4; a bf16 latent part
/// with a bf16 rotary part, or an fp8 (e4m3, e5m2) latent part with a bf16 rotary part or one of
/// the same format; 16-byte aligned pools, query rows and strides (the copies are 16 bytes); no
/// window or soft cap.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/dtype.hpp"
#include "attnstate/core/mla.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/state_view.hpp"

namespace attnstate {
namespace cuda {

/// The shape of an MLA decode: what `plan_mla_decode` plans for (the maximum batch).
struct MlaDecodeProblem {
  std::int64_t batch = 0;                      ///< Requests (≥ 0).
  std::int64_t q_len = 1;                      ///< New tokens per request, 1..4 (causal).
  std::int64_t heads = 0;                      ///< Query heads: a multiple of 16, 16..128.
  std::int64_t kv_lora_rank = kMlaKvLoraRank;  ///< Latent width: 512.
  std::int64_t rope_dim = kMlaRopeDim;         ///< Rotary width: 64.
  DType q_dtype = DType::kBF16;                ///< Queries (both parts): bf16.
  DType ckv_dtype = DType::kBF16;              ///< Latent part: bf16, e4m3 or e5m2.
  DType kpe_dtype = DType::kBF16;              ///< Rotary part: bf16, or `ckv_dtype` when fp8.
};

class MlaDecodePlan;

namespace detail {

struct MlaDecodePlanAccess;

/// What an MLA decode plan records (the planner writes it, the runner reads it).
struct MlaDecodePlanData {
  MlaDecodeProblem problem;
  SplitLayout splits;
  float scale = 0.f;
  /// The catalog's fingerprint of the build that made the plan (0: no planner made it).
  std::uint64_t catalog_fingerprint = 0;
  int kernel_id = -1;  ///< The catalog row that runs.
  int row_tiles = 1;   ///< Tiles of 64 query rows per request.
  int num_sms = 0;     ///< SMs planned for.
};

}  // namespace detail

/// An MLA decode plan: everything `run_mla_decode` needs besides the tensors (a small host value).
/// Only `plan_mla_decode` makes one (a default-constructed plan is refused by name); it records the
/// split layout, the kernel (its catalog row, with the catalog's fingerprint) and the scale.
class MlaDecodePlan {
 public:
  MlaDecodePlan() = default;

  const MlaDecodeProblem& problem() const { return d_.problem; }  ///< The (maximum) shape planned.
  const SplitLayout& splits() const { return d_.splits; }  ///< How requests are cut into splits.
  float scale() const { return d_.scale; }                 ///< Softmax scale (resolved: never 0).
  int kernel_id() const { return d_.kernel_id; }  ///< The catalog row that runs (docs/catalog.md).
  int row_tiles() const { return d_.row_tiles; }  ///< `ceil(q_len · heads / 64)`.
  int num_sms() const { return d_.num_sms; }      ///< SMs the plan was made for.
  /// The kernel, its dtypes and the splits, in words (for logs and benchmarks).
  std::string to_string() const;
  /// Bytes of device workspace `run_mla_decode` needs (0 when `splits().max_splits == 1`): fp32
  /// partial states `o (batch, row_tiles, max_splits, 64, 512)` and their base-2 LSEs, plus one
  /// int32 ticket per (request, row tile), each section rounded up to 256 bytes. With
  /// `tiles = batch · row_tiles` and `parts = tiles · max_splits · 64`:
  /// `round256(parts · 2048) + round256(parts · 4) + round256(tiles · 4)`.
  std::size_t workspace_bytes() const;

 private:
  friend struct detail::MlaDecodePlanAccess;
  detail::MlaDecodePlanData d_;
};

/// The kernel of an MLA decode plan (`plan_mla_decode`'s hand choice, for comparisons and tests;
/// each gives the same results up to rounding).
enum class MlaDecodeKernel : std::uint8_t {
  /// On a device that runs the wgmma kernels (sm_90a): for at most 16 query rows, the narrow
  /// kernel over a bf16 latent cache, and over an fp8 one the two-CTA narrow kernel where its
  /// automatic split layout cuts no request into splits shorter than 512 keys; for at least 32
  /// rows of a bf16 latent cache the balanced wgmma kernel; otherwise the wgmma kernel.
  /// Elsewhere `kMma`.
  kAuto = 0,
  kMma = 1,    ///< `cp.async` + `mma.sync` m16n8k16, 32-key tiles (every architecture built).
  kWgmma = 2,  ///< Hopper `wgmma`, warp-specialised, 64-key tiles (a run on a device without
               ///< sm_90a code is refused: `Status::kNotSupported`).
  /// Hopper `wgmma` for requests of at most 32 query rows (`heads · q_len`; more are refused by
  /// name), the products transposed so that 64 keys, not the few rows, fill the instruction's M
  /// (a run on a device without sm_90a code is refused, as `kWgmma`); `kAuto`'s choice as above.
  kWgmmaNarrow = 3,
  /// `kWgmmaNarrow`'s requests and products in a configuration of two CTAs per SM (a query tile
  /// of 32 rows, a one-stage ring of 64-key tiles: one CTA's fixed costs and compute overlap the
  /// other's copies); refused as `kWgmmaNarrow`; `kAuto`'s choice for few rows of an fp8 latent
  /// cache (above).
  kWgmmaNarrow2 = 4,
  /// `kWgmma`'s CTAs and tiles with its two consumer warpgroups balanced: each computes the
  /// scores of half of every 64-key tile (the two exchange their rows' maxima, so the online
  /// softmax stays exact, and their probabilities), then `P V` over its 256 output columns;
  /// refused as `kWgmma`; `kAuto`'s choice for at least 32 rows of a bf16 latent cache.
  kWgmmaBalanced = 5,
};

/// Plans an MLA decode on the host: the split layout of `options.policy` from the real lengths
/// (`kAuto`: the decode's length-aware chooser over the SMs, with the MLA kernel's costs), the
/// scale and the catalog row (of `kernel`; `kAuto` asks the current device, once, cached,
/// whether it runs the wgmma kernel: no device, no wgmma; the other choices make no CUDA call).
///
/// @param problem        the shape (see `MlaDecodeProblem`; unsupported dtypes or widths:
///                       `Status::kNotSupported` naming the field).
/// @param seq_lens_host  host array `(batch)`: the (maximum) lengths the plan must serve (≥ 0).
/// @param options        scale (0 → `1/sqrt(kv_lora_rank + rope_dim)`), split policy; the variant
///                       must be plain (`options.variant`), and the GQA decode's hand choices
///                       (`options.kernel`, `options.split_stages`, `options.split_cluster`,
///                       `options.programmatic_launch`, `options.plan_ctas_per_sm`) left at
///                       their defaults: each is refused by name (`kNotSupported`).
/// @param num_sms        SMs of the device, ≥ 1.
/// @param kernel         the kernel (`MlaDecodeKernel`).
/// @throws Error naming the argument on a violation.
MlaDecodePlan plan_mla_decode(const MlaDecodeProblem& problem, const std::int32_t* seq_lens_host,
                              const DecodeOptions& options, int num_sms,
                              MlaDecodeKernel kernel = MlaDecodeKernel::kAuto);

/// Zeroes the ticket counters of a workspace on `stream` (one `cudaMemsetAsync`; nothing when
/// the plan needs no workspace). Call once after allocating it, after a failed run, or before
/// using it with another plan; every `run_mla_decode` leaves them zero again.
/// @param plan             the plan the workspace serves.
/// @param workspace        device memory of at least `plan.workspace_bytes()`.
/// @param workspace_bytes  its size in bytes.
/// @param stream           the caller's stream.
/// @throws Error (`kInvalidArgument`, `kWorkspaceTooSmall`, `kCudaError`).
void init_mla_decode_workspace(const MlaDecodePlan& plan, void* workspace,
                               std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// Runs a planned MLA decode on `stream`: checks every argument (against the plan too), then
/// launches the plan's kernel once.
///
/// Row `i` of request `b` (the `i`-th of its `q_len` new tokens, the last `q_len` of its
/// `seq_lens[b]` keys) attends to keys `[0, seq_lens[b] − q_len + i]`; when `seq_lens[b] < q_len`
/// the first `q_len − seq_lens[b]` rows see no key and get `(0, -inf)`.
///
/// @param plan       from `plan_mla_decode`; `kv.batch` may be smaller than the planned batch.
/// @param q_nope     device latent queries `(batch, q_len, heads, 512)`, bf16, last dim
///                   contiguous, data 16-byte aligned and the other strides multiples of 8.
/// @param q_pe       device rotary queries `(batch, q_len, heads, 64)`, likewise (a FlashMLA
///                   query `(..., 576)` is the view of its columns 512..575).
/// @param kv         device latent cache (`kv.space == kDevice`) of the planned dtypes, widths
///                   512 and 64; `ckv`, `kpe` 16-byte aligned with token and page strides of
///                   whole 16 bytes; CSR or block table and `seq_lens` in device memory; fp8
///                   scales as host values or device pointers (read when the kernel runs).
///                   Lengths are clamped to the pages each request owns, page ids to the pool.
/// @param out        device state `(batch·q_len, heads, 512)` (token `b·q_len + i`), f32, f16
///                   or bf16, either base, disjoint from every input.
/// @param workspace  device memory of at least `plan.workspace_bytes()`, 16-byte aligned,
///                   initialised once with `init_mla_decode_workspace` (null when the size is 0).
/// @param workspace_bytes  its size in bytes.
/// @param stream     the caller's stream.
/// @throws Error naming the argument on a violation (`kInvalidArgument`, `kNotSupported`,
///         `kWorkspaceTooSmall`), `kCudaError` when the launch fails.
void run_mla_decode(const MlaDecodePlan& plan, const ConstTensorView& q_nope,
                    const ConstTensorView& q_pe, const MlaKvCache& kv, StateView out,
                    void* workspace, std::size_t workspace_bytes, cudaStream_t stream = nullptr);

/// `run_mla_decode` with attention sinks: each output row `(token, h)` is merged once with
/// `(0, sinks.logits[h])` after every split (a row with no keys gets `(0, sinks.logits[h])`).
/// `sinks.logits`: `heads` fp32 natural-base logits in device memory, read when the kernel runs;
/// `sinks.none()`: exactly the overload above. Other arguments as above.
void run_mla_decode(const MlaDecodePlan& plan, const ConstTensorView& q_nope,
                    const ConstTensorView& q_pe, const MlaKvCache& kv, const AttentionSinks& sinks,
                    StateView out, void* workspace, std::size_t workspace_bytes,
                    cudaStream_t stream = nullptr);

}  // namespace cuda
}  // namespace attnstate
