/// @file mla.hpp
/// @brief Multi-head latent attention (MLA, absorbed form) in the testing kit: `MlaProblem`
///        (queries and a latent key segment on the host), its double-precision reference, its
///        tolerance and a RapidCheck generator, so that an MLA kernel is checked against the
///        algebra of states like any other producer.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/host_tensor.hpp"
#include "attnstate/testing/reference.hpp"
#include "attnstate/testing/tolerance.hpp"

namespace attnstate {
namespace testing {

/// One MLA problem: query rows of `heads` heads against one segment of latent tokens.
///
/// `q_nope (tokens, heads, kv_lora_rank)` and `q_pe (tokens, heads, rope_dim)` in one dtype
/// (f32, f16 or bf16); `ckv (num_keys, kv_lora_rank)` and `kpe (num_keys, rope_dim)`, each in
/// f32, f16, bf16 or fp8 (e4m3, e5m2) with a per-tensor dequantisation scale (`ckv_scale`,
/// `kpe_scale`: the real value of a stored element is `stored × scale`; 1 for other dtypes). An
/// fp8 `ckv` may instead carry per-token scales of blocks of columns (`ckv_block_scales`,
/// FlashMLA's fp8 rows): the real value of `ckv[i][d]` is then `stored ×
/// ckv_block_scales[i · blocks + d / ckv_block_cols]`, with `blocks = kv_lora_rank /
/// ckv_block_cols` and `ckv_scale` 1.
/// Row `(t, h)` scores key `i` as `scale · (q_nope[t,h] · ckv[i] + q_pe[t,h] · kpe[i])` (real
/// values) and its state is `(o, lse)` with `o = Σ_i w_i ckv[i]` (`kv_lora_rank` wide): every
/// head attends to the one shared latent head. The state a kernel should return has `o` stored
/// in `out_dtype` and its LSE in `base`.
///
/// Attention sinks (off by default) are as in `AttentionProblem`: `sinks` holds one natural-base
/// logit per head, merged once into each row after all its keys (`reference_mla_state`); a
/// partial state (a split, a GPU's shard) is the state of `without_sinks(problem)`.
struct MlaProblem {
  HostTensor q_nope;      ///< Latent queries `(tokens, heads, kv_lora_rank)`.
  HostTensor q_pe;        ///< Rotary queries `(tokens, heads, rope_dim)`.
  HostTensor ckv;         ///< Latent keys and values `(num_keys, kv_lora_rank)`.
  HostTensor kpe;         ///< Rotary keys `(num_keys, rope_dim)`.
  float ckv_scale = 1.f;  ///< Scale of an fp8 `ckv` (finite, > 0; 1 otherwise).
  float kpe_scale = 1.f;  ///< Scale of an fp8 `kpe` (finite, > 0; 1 otherwise).
  /// Per-token block scales of an fp8 `ckv`: empty (none), or `num_keys × blocks` finite values
  /// > 0, key-major (`ckv_scale` then 1).
  std::vector<float> ckv_block_scales;
  std::int64_t ckv_block_cols = 0;   ///< Latent columns per block scale (divides kv_lora_rank).
  float scale = 1.f;                 ///< Softmax scale applied to the dot products.
  DType out_dtype = DType::kF32;     ///< Storage dtype requested for the output `o`.
  LseBase base = LseBase::kNatural;  ///< LSE base requested for the output.
  std::uint64_t value_seed = 0;      ///< Seed the values were drawn from (informational).
  /// Attention sinks: empty (none), or `heads` logits, natural base, each finite or `-inf`.
  std::vector<float> sinks;

  /// @return the number of query rows.
  std::int64_t tokens() const { return q_nope.dim(0); }
  /// @return the query heads.
  std::int64_t heads() const { return q_nope.dim(1); }
  /// @return the latent width (of `o` too).
  std::int64_t kv_lora_rank() const { return q_nope.dim(2); }
  /// @return the rotary width.
  std::int64_t rope_dim() const { return q_pe.dim(2); }
  /// @return the latent tokens (keys) of the segment.
  std::int64_t num_keys() const { return ckv.dim(0); }
  /// @return true when the problem has attention sinks.
  bool has_sinks() const { return !sinks.empty(); }
  /// The sinks as the library's calls take them (host memory, valid while `sinks` is unchanged).
  /// @return `{sinks.data()}`, or `{nullptr}` (none) when `sinks` is empty.
  AttentionSinks attention_sinks() const {
    AttentionSinks s;
    s.logits = sinks.empty() ? nullptr : sinks.data();
    return s;
  }
};

/// Builds an MLA problem from float values, each rounded once to its dtype (an fp8 part stores
/// `from_float(x)`, saturating; its real value is then `stored × scale`).
/// @param tokens        query rows (≥ 0).
/// @param heads         query heads (≥ 1).
/// @param kv_lora_rank  latent width (≥ 1).
/// @param rope_dim      rotary width (≥ 1).
/// @param num_keys      latent tokens (≥ 0).
/// @param q_dtype       dtype of both query parts (f32, f16 or bf16).
/// @param ckv_dtype     dtype of `ckv` (f32, f16, bf16, e4m3 or e5m2).
/// @param kpe_dtype     dtype of `kpe` (likewise).
/// @param q_nope        `(tokens, heads, kv_lora_rank)` row-major values.
/// @param q_pe          `(tokens, heads, rope_dim)` row-major values.
/// @param ckv           `(num_keys, kv_lora_rank)` row-major stored values.
/// @param kpe           `(num_keys, rope_dim)` row-major stored values.
/// @param scale         softmax scale.
/// @param out_dtype     dtype requested for the output `o`.
/// @param base          LSE base requested for the output.
/// @return the problem (scales 1: set `ckv_scale` / `kpe_scale` for fp8 parts, or
///         `ckv_block_scales` and `ckv_block_cols` for an fp8 `ckv` scaled in blocks).
/// @throws attnstate::Error (`kInvalidArgument`) naming the argument whose size does not match
///         the extents, or a bad extent or dtype (`kNotSupported` for fp8 queries or output).
MlaProblem make_mla_problem(std::int64_t tokens, std::int64_t heads, std::int64_t kv_lora_rank,
                            std::int64_t rope_dim, std::int64_t num_keys, DType q_dtype,
                            DType ckv_dtype, DType kpe_dtype, const std::vector<float>& q_nope,
                            const std::vector<float>& q_pe, const std::vector<float>& ckv,
                            const std::vector<float>& kpe, float scale, DType out_dtype,
                            LseBase base);

/// The same problem with only the latent tokens at indices `keys`, in that order (queries,
/// scales, output dtype, base and sinks kept; the block scales of the kept tokens).
/// @param problem  the problem.
/// @param keys     indices into `[0, problem.num_keys())`; may be empty.
/// @return the restricted problem.
/// @throws attnstate::Error (`kInvalidArgument`) naming `keys[i]` out of range or the problem's
///         inconsistent field.
MlaProblem select_keys(const MlaProblem& problem, const std::vector<std::int64_t>& keys);

/// The problem of a partial state: `problem` without its sinks.
/// @param problem  the problem.
/// @return a copy with `sinks` empty.
/// @throws attnstate::Error (`kInvalidArgument`) naming the problem's inconsistent field.
MlaProblem without_sinks(const MlaProblem& problem);

/// A state shaped for `problem`'s output `(tokens, heads, kv_lora_rank)` in `out_dtype` and
/// `base`, poisoned with NaN so that any value a kernel fails to write shows up.
/// @param problem  the problem.
/// @return the state.
/// @throws attnstate::Error (`kInvalidArgument`) naming the problem's inconsistent field.
HostState make_output_state(const MlaProblem& problem);

/// The MLA state of each query row over latent tokens of its own, in double: row `(t, h)` over
/// the keys `keys_per_token[t]` (in any order; an empty list gives `(0, -inf)`): scores
/// `s_i = scale · (q_nope[t,h] · ckv[i] + q_pe[t,h] · kpe[i])` over the real values (fp8: stored
/// × scale, exact in double), `m = max s_i`, `o = Σ e^{s_i - m} ckv[i] / Σ e^{s_i - m}`,
/// `lse = m + ln Σ e^{s_i - m}` (converted to `base`), `o_magnitude = Σ e^{s_i - m} |ckv[i]| /
/// Σ e^{s_i - m}`; then each row merged once with its head's sink `(0, sinks[h])` when the
/// problem has sinks (`apply_sinks`). A paged decode's reference: the request's tokens for each
/// of its rows, causal among its new tokens. Cost `O(Σ_t heads · |keys_t| · (rank + rope))`.
/// @param problem         the queries, latent tokens and scale.
/// @param keys_per_token  `problem.tokens()` lists of indices into `[0, problem.num_keys())`.
/// @param base            the base of the returned LSEs.
/// @return the `(tokens, heads, kv_lora_rank)` state in double.
/// @throws attnstate::Error (`kInvalidArgument`) naming `keys_per_token` (one list per token),
///         `keys_per_token[t][i]` out of range, `base`, or the problem's inconsistent field.
ReferenceState reference_mla_state_per_token(
    const MlaProblem& problem, const std::vector<std::vector<std::int64_t>>& keys_per_token,
    LseBase base);

/// The MLA state of every query row over the same keys `keys`, in double (as
/// `reference_mla_state_per_token` with `keys` for every row), sinks included.
/// @param problem  the queries, latent tokens and scale.
/// @param keys     indices into `[0, problem.num_keys())` (any order; may be empty).
/// @param base     the base of the returned LSEs.
/// @return the state in double.
/// @throws attnstate::Error (`kInvalidArgument`) naming `keys[i]` out of range, `base`, or the
///         problem's inconsistent field.
ReferenceState reference_mla_state(const MlaProblem& problem, const std::vector<std::int64_t>& keys,
                                   LseBase base);

/// The largest `|scale| · (Σ_d |q_nope[t,h,d] ckv[i,d]| + Σ_d |q_pe[t,h,d] kpe[i,d]|)` over all
/// (row, head, key) (real values): the bound of every score's magnitude.
/// @param problem  the problem.
/// @return that bound (0 without keys).
/// @throws attnstate::Error (`kInvalidArgument`) naming the problem's inconsistent field.
double max_abs_score(const MlaProblem& problem);

/// Tolerance of an MLA state computed for `problem` (any subset of its keys, any split) by a
/// kernel that keeps the numerics contract: the model of `tolerance_for(const AttentionProblem&,
/// bool)` with `D = kv_lora_rank + rope_dim` (the width of the dot products), `V` the largest
/// real `|ckv|` (at least 1), `S = max_abs_score(problem)`, and the queries' dtype as the
/// dtype `P` may be rounded to when the cache is fp8 (else `ckv`'s).
/// @param problem             the problem.
/// @param p_rounded_to_input  whether the kernel may round `P` to the 16-bit input dtype.
/// @return the tolerance for comparing with `reference_mla_state(...)`.
/// @throws attnstate::Error (`kInvalidArgument`) naming the problem's inconsistent field.
Tolerance tolerance_for(const MlaProblem& problem, bool p_rounded_to_input = true);

/// What `gen_mla_problem` may produce. Every list must be non-empty and `min_keys <= max_keys`.
struct MlaGenOptions {
  std::int64_t max_tokens = 4;                      ///< Query rows drawn from `[1, max_tokens]`.
  std::int64_t min_keys = 0;                        ///< Latent tokens drawn from
  std::int64_t max_keys = 200;                      ///< `[min_keys, max_keys]`.
  std::vector<std::int64_t> heads = {1, 16};        ///< Head counts drawn.
  std::vector<std::int64_t> kv_lora_ranks = {512};  ///< Latent widths drawn.
  std::vector<std::int64_t> rope_dims = {64};       ///< Rotary widths drawn.
  std::vector<DType> q_dtypes = {DType::kBF16, DType::kF16, DType::kF32};  ///< Query dtypes.
  /// Dtypes of `ckv` (fp8 included: stored values times a scale drawn from `kv_scales`).
  std::vector<DType> ckv_dtypes = {DType::kBF16, DType::kF16, DType::kF32, DType::kE4M3};
  /// Dtypes of `kpe`; empty: `ckv`'s dtype, or bf16 when that is fp8 (FlashMLA's fp8 layout).
  std::vector<DType> kpe_dtypes;
  std::vector<DType> output_dtypes = {DType::kF32, DType::kF16, DType::kBF16};  ///< Out `o`.
  std::vector<LseBase> bases = {LseBase::kNatural, LseBase::kBase2};  ///< Requested bases.
  std::vector<float> kv_scales = {1.f, 0x1p-10f, 0x1p8f};  ///< Scales drawn for fp8 parts.
  /// Share of problems with an fp8 `ckv` that get per-token block scales instead of a per-tensor
  /// one (0 to 100): each block's scale the drawn scale × 2^-k, k in 0..3.
  int block_scale_percent = 0;
  /// Block widths drawn for them (each ≥ 1; one that does not divide the latent width gives
  /// one block a token).
  std::vector<std::int64_t> block_cols = {128};
  int large_logits_percent = 20;    ///< Share of problems with the queries × `large_logit_factor`.
  float large_logit_factor = 40.f;  ///< The amplification: scores reach the hundreds.
  int sink_percent = 0;             ///< Share of problems with sinks (0 to 100).
  float sink_min = -4.f;            ///< Least sink logit drawn.
  float sink_max = 12.f;            ///< Largest sink logit drawn.
};

/// Random MLA problems: queries and stored latent tokens uniform in `[-1, 1]` rounded to their
/// dtypes (an fp8 part stored × an amplitude of 1 or half the format's largest finite value,
/// read × a scale from `kv_scales`; the queries then divided by the largest real key element,
/// at most multiplied by 256, so the scores keep their magnitude), the queries × the large-logit
/// factor in `large_logits_percent`% of problems, scale `1/sqrt(kv_lora_rank + rope_dim)`,
/// random output dtype and base, and sinks in `sink_percent`% of problems (drawn last).
/// @param options  what may be drawn.
/// @return a generator of problems, shrinking towards one token, the first listed head count,
///         widths and dtypes, fewest keys.
/// @throws attnstate::Error (`kInvalidArgument`) naming the field of `options` that is invalid.
rc::Gen<MlaProblem> gen_mla_problem(const MlaGenOptions& options = {});

/// Prints the problem's shape, dtypes, scales, base, value seed and sinks (not the values).
/// @param os       the stream written to.
/// @param problem  the problem.
/// @return `os`.
std::ostream& operator<<(std::ostream& os, const MlaProblem& problem);
/// RapidCheck's hook for showing a problem in a counterexample.
/// @param problem  the problem.
/// @param os       the stream written to.
void showValue(const MlaProblem& problem, std::ostream& os);

}  // namespace testing
}  // namespace attnstate
