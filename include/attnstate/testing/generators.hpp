/// @file generators.hpp
/// @brief RapidCheck generators for states, key subsets, partitions and attention problems.
///
/// Shapes, dtypes, bases and the kind of every LSE are drawn by RapidCheck and shrink towards
/// small, simple cases; bulk values (`o`, `q`, `k`, `v`) are drawn from a generated 64-bit seed,
/// so a counterexample prints compactly and still reproduces exactly.
#pragma once

#include <rapidcheck.h>

#include <cstdint>
#include <ostream>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/problem.hpp"

namespace attnstate {
namespace testing {

/// The extents of a state `(tokens, heads, head_dim)`.
struct StateShape {
  std::int64_t tokens = 1;    ///< Number of tokens.
  std::int64_t heads = 1;     ///< Heads per token.
  std::int64_t head_dim = 1;  ///< Elements of `o` per (token, head).
};

/// What `gen_state` may produce.
struct StateGenOptions {
  std::int64_t max_tokens = 3;    ///< Tokens drawn from `[1, max_tokens]`.
  std::int64_t max_heads = 3;     ///< Heads drawn from `[1, max_heads]`.
  std::int64_t max_head_dim = 8;  ///< head_dim drawn from `[1, max_head_dim]`.
  std::vector<DType> dtypes = {DType::kF32, DType::kF16, DType::kBF16};  ///< `o` dtypes.
  std::vector<LseBase> bases = {LseBase::kNatural, LseBase::kBase2};     ///< LSE bases.
  bool empty_rows = true;      ///< Some rows are empty (`lse = -inf`).
  bool nan_in_empty_o = true;  ///< An empty row's `o` may hold NaN or garbage (never read).
  bool extreme_lse = true;     ///< Some LSEs lie within ±30 of ±`lse_magnitude`.
  double lse_magnitude = 1e4;  ///< Magnitude of the extreme LSEs.
  bool nan_rows = false;       ///< Some non-empty rows hold NaN in `o` or `lse`.
};

/// A random state shape within `options`' limits.
/// @param options  the limits (`max_tokens`, `max_heads`, `max_head_dim`, each ≥ 1).
/// @return a generator of shapes, shrinking towards `(1, 1, 1)`.
/// @throws attnstate::Error (`kInvalidArgument`) naming the field when a limit is below 1 or the
///         largest shape passes 2^62 elements.
rc::Gen<StateShape> gen_state_shape(const StateGenOptions& options = {});

/// States of random shape, dtype and base: each row's LSE is ordinary (`[-20, 20]`), extreme
/// (near ±`lse_magnitude`), or empty (`-inf`, with NaN or garbage in `o` when
/// `nan_in_empty_o`); `o` of non-empty rows lies in `[-1, 1]`, rounded to the dtype.
/// @param options  what may be drawn.
/// @return a generator of states.
/// @throws attnstate::Error (`kInvalidArgument`) naming the field (e.g. `options.dtypes`) when
///         `options` is invalid: an empty dtype or base list, a limit below 1, limits whose
///         largest state passes 2^62 elements.
rc::Gen<HostState> gen_state(const StateGenOptions& options = {});
/// States of the given shape (dtype, base and values random as above).
/// @param shape    the shape of every state drawn.
/// @param options  what may be drawn (the shape limits are ignored).
/// @return a generator of states of `shape`.
/// @throws attnstate::Error (`kInvalidArgument`) naming the field of `shape` that is negative
///         or makes it pass 2^62 elements (likewise `gen_empty_state`).
/// @throws attnstate::Error (`kInvalidArgument`) as `gen_state(const StateGenOptions&)`.
rc::Gen<HostState> gen_state(const StateShape& shape, const StateGenOptions& options = {});
/// Empty states `(o = garbage or NaN, lse = -inf)` of the given shape, random dtype and base.
/// @param shape    the shape of every state drawn.
/// @param options  the dtypes and bases drawn, and whether `o` holds garbage or NaN.
/// @return a generator of empty states of `shape`.
/// @throws attnstate::Error (`kInvalidArgument`) as `gen_state(const StateGenOptions&)`.
rc::Gen<HostState> gen_empty_state(const StateShape& shape, const StateGenOptions& options = {});
/// Between `min_count` and `max_count` states (≥ 1) of one shape (random per list).
/// @param min_count  fewest states (values below 1 count as 1).
/// @param max_count  most states (values below `min_count` count as `min_count`).
/// @param options    what may be drawn.
/// @return a generator of non-empty lists of states sharing one shape.
/// @throws attnstate::Error (`kInvalidArgument`) as `gen_state(const StateGenOptions&)`.
rc::Gen<std::vector<HostState>> gen_states(int min_count, int max_count,
                                           const StateGenOptions& options = {});

/// A random subset of `[0, n_keys)`, sorted; may be empty or the whole set.
/// @param n_keys  the number of keys (≥ 0).
/// @return a generator of sorted key indices.
/// @throws attnstate::Error (`kInvalidArgument`) naming `n_keys` when it is negative (likewise
///         `gen_disjoint_pair` and `gen_partition`).
rc::Gen<std::vector<std::int64_t>> gen_key_subset(std::int64_t n_keys);
/// Two disjoint random subsets of `[0, n_keys)` (each sorted, either may be empty): each key is
/// in the first, the second or neither with probability 1/3, whatever RapidCheck's size.
/// @param n_keys  the number of keys (≥ 0).
/// @return a generator of pairs of disjoint, sorted key-index lists.
rc::Gen<std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>> gen_disjoint_pair(
    std::int64_t n_keys);
/// A random partition of `[0, n_keys)` into 1 to `max_parts` parts, each sorted. Parts may be
/// empty or hold a single key; their union is the whole set and they are pairwise disjoint.
/// The part count and each key's part are uniform whatever RapidCheck's size (so even the first,
/// small cases of a property split the keys), and shrink towards one part.
/// @param n_keys     the number of keys (≥ 0).
/// @param max_parts  most parts (values below 1 count as 1).
/// @return a generator of partitions (lists of sorted key-index lists).
rc::Gen<std::vector<std::vector<std::int64_t>>> gen_partition(std::int64_t n_keys, int max_parts);

/// What `gen_attention_problem` may produce. Every list must be non-empty and
/// `min_keys <= max_keys`: the generators and `check_state_kernel` throw `attnstate::Error`
/// (`kInvalidArgument`) naming the field otherwise.
struct ProblemGenOptions {
  std::int64_t max_tokens = 3;    ///< Query rows drawn from `[1, max_tokens]`.
  std::int64_t min_keys = 0;      ///< Keys drawn uniformly from `[min_keys, max_keys]`.
  std::int64_t max_keys = 300;    ///< See `min_keys`. The default crosses 64-, 128- and 256-key
                                  ///< tiles (a missed rescale between tiles, an fp16/bf16
                                  ///< accumulator show up only over many keys).
  std::int64_t max_heads_kv = 2;  ///< `H_kv` drawn from `[1, max_heads_kv]`.
  std::vector<std::int64_t> group_sizes = {1, 2, 4};           ///< `H_q / H_kv` choices (GQA).
  std::vector<std::int64_t> head_dims = {1, 2, 4, 8, 16, 32};  ///< head_dim choices.
  std::vector<DType> input_dtypes = {DType::kF32, DType::kF16, DType::kBF16};   ///< q/k/v.
  std::vector<DType> output_dtypes = {DType::kF32, DType::kF16, DType::kBF16};  ///< out `o`.
  std::vector<LseBase> bases = {LseBase::kNatural, LseBase::kBase2};  ///< Requested bases.
  int large_logits_percent = 20;    ///< Share of problems with `q` amplified (0 to 100).
  float large_logit_factor = 40.f;  ///< The amplification: scores reach the hundreds.
  int offset_values_percent = 50;   ///< Share of problems whose values have a non-zero mean per
                                    ///< channel (0 to 100), as real V caches do: a sum of many
                                    ///< same-signed terms, where an accumulator kept in 16 bits
                                    ///< drifts (with zero-mean values its errors mostly cancel).
  int soft_cap_percent = 0;         ///< Share of problems with a logits soft cap (0 to 100), drawn
                                    ///< from `soft_caps`. 0 (the default) draws nothing for it, so
                                    ///< the problems of a seed stay those drawn before variants.
  std::vector<float> soft_caps = {5.f, 30.f, 50.f};  ///< Caps drawn (finite, > 0; non-empty
                                                     ///< when `soft_cap_percent > 0`): 5 bends
                                                     ///< ordinary scores, 30 and 50 are the
                                                     ///< models' values and bend large logits.
  int window_percent = 0;  ///< Share of problems whose query rows have positions (0 to 100),
                           ///< hence a causal rule and, mostly, a sliding window (see
                           ///< `gen_attention_problem`). 0 (the default) draws nothing for it.
  /// Dtypes of `k` and `v`: empty (the default: the input dtype drawn for `q`, and nothing drawn
  /// for it, so the problems of a seed stay those drawn before), else one drawn per problem;
  /// e4m3 and e5m2 give fp8 keys and values with scales (see `gen_attention_problem`).
  std::vector<DType> kv_dtypes;
  /// Scales drawn for fp8 keys and values (finite, > 0; non-empty when `kv_dtypes` lists an
  /// fp8 dtype): 1, a tiny one and a large one.
  std::vector<float> kv_scales = {1.f, 0x1p-10f, 0x1p8f};
  /// Share of problems with attention sinks (0 to 100): `AttentionProblem::sinks`, one logit per
  /// query head drawn uniformly in `[sink_min, sink_max]`. 0 (the default) draws nothing for it,
  /// so the problems of a seed stay those drawn before sinks.
  int sink_percent = 0;
  /// Least sink logit drawn (natural base, finite, at most `sink_max`). The default range
  /// `[-4, 12]` lies around the LSEs of ordinary rows (0 to about 6 for up to 300 keys): some
  /// sinks dominate their rows (`o` scaled by up to e^-12), some barely count.
  float sink_min = -4.f;
  float sink_max = 12.f;            ///< Largest sink logit drawn (finite).
  int per_head_scale_percent = 50;  ///< Share of fp8 problems with one scale per KV head
                                    ///< (0 to 100); the others have one per tensor.
  int fp8_extremes_percent = 25;    ///< Share of fp8 problems with elements of `k` and `v` at the
                                    ///< format's extremes (0 to 100): ±largest finite, ±smallest
                                    ///< normal, ±smallest subnormal, ±0.
};

/// Decode-shaped problems: 1 to 8 query rows (speculative decode), GQA groups 4 and 8,
/// head_dim 64 or 128, up to 300 keys, f16/bf16 inputs.
/// @return those options (outputs still f32, f16 or bf16, both bases).
ProblemGenOptions decode_problem_options();

/// `options` drawing fp8 keys and values: `kv_dtypes = {e4m3, e5m2}` (queries in the input dtypes
/// of `options`, f16 and bf16 by default), with the default scales, per-head scales and
/// extremes.
/// @param options  the options to extend (default: `decode_problem_options()`).
/// @return `options` with `kv_dtypes = {kE4M3, kE5M2}`.
ProblemGenOptions fp8_kv_problem_options(ProblemGenOptions options = decode_problem_options());

/// `options` drawing the variants too: half the problems soft-capped, half windowed (a kernel
/// that implements both; leave the other percentage at 0 for a kernel with one of them).
/// @param options  the options to extend (default: `ProblemGenOptions{}`).
/// @return `options` with `soft_cap_percent = window_percent = 50`.
ProblemGenOptions variant_problem_options(ProblemGenOptions options = {});

/// `options` drawing attention sinks too: half the problems get one sink logit per query head
/// (`sink_percent = 50`), in the default range `[-4, 12]`.
/// @param options  the options to extend (default: `ProblemGenOptions{}`).
/// @return `options` with `sink_percent = 50`.
ProblemGenOptions sink_problem_options(ProblemGenOptions options = {});

/// Random attention problems: `q`, `k`, `v` uniform in `[-1, 1]` rounded to the input dtype
/// (`q` multiplied by `large_logit_factor` in `large_logits_percent`% of problems; in
/// `offset_values_percent`% of problems each (KV head, element) of `v` is instead uniform around
/// a mean `c` drawn in `[-0.9, 0.9]`: `c + (1 - |c|) · u`, still within `[-1, 1]`), key counts
/// uniform in `[min_keys, max_keys]` whatever RapidCheck's size, scale `1/sqrt(head_dim)` or 1,
/// a random output dtype and base.
///
/// Variants, when asked for: in `soft_cap_percent`% of problems `variant.logits_soft_cap` is one
/// of `soft_caps`; in `window_percent`% the rows get `positions` and `variant.window_left` is
/// drawn among no window (causal only), 0 (one key), a few keys, up to the key count and more
/// than the key count; the positions are those of decode's new tokens (the last `tokens` of the
/// keys, some before position 0 when the keys are fewer), random in `[-2, num_keys + 2)`, or
/// past the window (rows that see none of the keys: the empty state). In `sink_percent`% of
/// problems `sinks` holds `H_q` logits uniform in `[sink_min, sink_max]` (from the problem's value
/// seed; drawn after everything else, so the rest of the problem is the one drawn without sinks).
///
/// Keys and values in a dtype of `kv_dtypes`, when listed: a dtype that is not fp8 stores the
/// same values in it. An fp8 dtype (an fp8 cache "at a chosen scale"): the stored values are the
/// drawn values in `[-1, 1]` times a stored amplitude (1, or half the largest finite value: 224
/// for e4m3, 28672 for e5m2), rounded once to fp8; in `fp8_extremes_percent`% of problems about
/// one element in eight of `k` and `v` is instead an extreme encoding (±largest finite, ±smallest
/// normal, ±smallest subnormal, ±0); the scales of `k` and of `v` are drawn from `kv_scales`,
/// one per KV head in `per_head_scale_percent`% of problems, else one per tensor. The real
/// values are `stored × scale`; `q` is divided by the largest real `|k|` (at most multiplied by
/// 256), so the scores keep the magnitude of the plain problems whatever the scale, and an f16
/// output is replaced by f32 when a real `|v|` passes 65504 (f16 would overflow).
/// @param options  what may be drawn.
/// @return a generator of problems, shrinking towards one token, one head, head_dim and key
///         count at their minimum, the first listed dtypes and base, no variant.
/// @throws attnstate::Error (`kInvalidArgument`) naming the field (e.g. `options.bases`) when
///         `options` is invalid: an empty list, `min_keys > max_keys`, a limit below 1, limits
///         whose largest `q` or `k` passes 2^62 elements, a percentage outside [0, 100], a cap
///         or an fp8 scale that is not finite and > 0, a sink range that is not finite or has
///         `sink_min > sink_max`, an fp8 dtype among `input_dtypes` or
///         `output_dtypes` (`kNotSupported`).
rc::Gen<AttentionProblem> gen_attention_problem(const ProblemGenOptions& options = {});

/// A problem and a partition of its keys into up to `max_parts` parts.
struct PartitionedProblem {
  AttentionProblem problem;                      ///< The problem.
  std::vector<std::vector<std::int64_t>> parts;  ///< Disjoint parts covering all its keys.
};
/// A random problem with a random partition of its keys (see `gen_partition`).
/// @param options    what problems may be drawn.
/// @param max_parts  most parts (values below 1 count as 1).
/// @return a generator of problems with a partition of their keys.
/// @throws attnstate::Error (`kInvalidArgument`) as `gen_attention_problem`.
rc::Gen<PartitionedProblem> gen_partitioned_problem(const ProblemGenOptions& options,
                                                    int max_parts);
/// RapidCheck's hook for showing a partitioned problem.
/// @param value  the problem and its partition.
/// @param os     the stream written to.
void showValue(const PartitionedProblem& value, std::ostream& os);
/// RapidCheck's hook for showing a shape.
/// @param shape  the shape, printed as `(tokens, heads, head_dim)`.
/// @param os     the stream written to.
void showValue(const StateShape& shape, std::ostream& os);

}  // namespace testing
}  // namespace attnstate

namespace attnstate {
/// RapidCheck's hook for showing a dtype in a counterexample ("f32", "f16", "bf16").
/// @param dtype  the dtype.
/// @param os     the stream written to.
inline void showValue(DType dtype, std::ostream& os) { os << to_string(dtype); }
/// RapidCheck's hook for showing an LSE base in a counterexample ("natural", "base2").
/// @param base  the base.
/// @param os    the stream written to.
inline void showValue(LseBase base, std::ostream& os) { os << to_string(base); }
}  // namespace attnstate

namespace rc {
/// `rc::gen::arbitrary<DType>()`: f32, f16 or bf16 (shrinks towards f32).
template <>
struct Arbitrary<attnstate::DType> {
  /// @return the generator.
  static Gen<attnstate::DType> arbitrary() {
    return gen::element(attnstate::DType::kF32, attnstate::DType::kF16, attnstate::DType::kBF16);
  }
};
/// `rc::gen::arbitrary<LseBase>()`: natural or base 2 (shrinks towards natural).
template <>
struct Arbitrary<attnstate::LseBase> {
  /// @return the generator.
  static Gen<attnstate::LseBase> arbitrary() {
    return gen::element(attnstate::LseBase::kNatural, attnstate::LseBase::kBase2);
  }
};
/// `rc::gen::arbitrary<HostState>()`: `attnstate::testing::gen_state()` with default options.
template <>
struct Arbitrary<attnstate::testing::HostState> {
  /// @return the generator.
  static Gen<attnstate::testing::HostState> arbitrary() { return attnstate::testing::gen_state(); }
};
}  // namespace rc
