/// @file problem.hpp
/// @brief `AttentionProblem`: queries, keys and values on the host, plus helpers that restrict
///        a problem to a subset of its keys and allocate the matching output state.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <vector>

#include "attnstate/core/dtype.hpp"
#include "attnstate/core/lse_base.hpp"
#include "attnstate/core/sink.hpp"
#include "attnstate/core/variant.hpp"
#include "attnstate/testing/host_state.hpp"
#include "attnstate/testing/host_tensor.hpp"

namespace attnstate {
namespace testing {

/// One attention problem: query rows against one KV segment.
///
/// `q (tokens, H_q, head_dim)`, `k` and `v (num_keys, H_kv, head_dim)` with `H_q` a multiple
/// of `H_kv` (query head `h` reads KV head `h / (H_q / H_kv)`), scores `s = scale · q·k`. The
/// state a kernel should return has `o` stored in `out_dtype` and its LSE in `base`.
///
/// fp8 keys and values: `k` and `v` may be stored in e4m3 or e5m2 (`q` stays f32, f16 or bf16),
/// with dequantisation scales `k_scale`, `v_scale`: the real value of a stored element of KV head
/// `g` is `stored × k_scale_at(g)` (`real_keys`, `real_values`), and the reference computes over
/// these real values, in double. A kernel reads an fp8 problem as it would an fp8 KV cache: the
/// stored bytes of `k`/`v` and one scale per tensor or per KV head (`PagedKvCache::k_scale`).
///
/// Variants (off by default, so a plain problem is as before): `variant.logits_soft_cap > 0`
/// turns every score into `cap · tanh(s / cap)`; `positions` gives each query row a position,
/// and then row `t` sees only the keys at positions `[window_begin(positions[t],
/// variant.window_left), positions[t]]`: causal, and inside the sliding window when
/// `variant.window_left != kNoWindow`. A kernel asked for a key set `K` returns, for row `t`,
/// the state over the keys of `K` the row sees (`visible_keys`), the empty state when it sees
/// none: a window restricts the key set, so the laws of states hold unchanged.
///
/// Attention sinks (off by default): `sinks` holds one logit `s_h` per query head (natural base,
/// as models store them). A sink is the state `(o = 0, lse = s_h)`, merged exactly once into each
/// output row after everything else (every split, level or rank): the state a kernel returns for
/// a problem with sinks over a key set `K` is `state(K) ⊕ (0, s_h)`, its LSE including the
/// sink's mass (`reference_state`). A partial state (a split, a cascade level) is sink-free: it
/// is the state of `without_sinks(problem)`, and the sink is merged after the partials.
struct AttentionProblem {
  HostTensor q;                      ///< Queries `(tokens, H_q, head_dim)`.
  HostTensor k;                      ///< Keys `(num_keys, H_kv, head_dim)`.
  HostTensor v;                      ///< Values, same shape and dtype as `k`.
  float scale = 1.f;                 ///< Softmax scale applied to `q·k`.
  DType out_dtype = DType::kF32;     ///< Storage dtype requested for the output `o`.
  LseBase base = LseBase::kNatural;  ///< LSE base requested for the output.
  bool large_logits = false;         ///< True when `q` was amplified so that scores reach the
                                     ///< hundreds (informational).
  bool offset_values = false;        ///< True when `v` has a non-zero mean per channel
                                     ///< (informational).
  std::uint64_t value_seed = 0;      ///< Seed the values were drawn from (informational).
  /// Soft cap and sliding window (default: plain attention). A window needs `positions`.
  AttentionVariant variant;
  /// Positions of the query rows (`tokens` values, any sign: a row before position 0 sees no
  /// key), or empty: every row sees every key it is given.
  std::vector<std::int64_t> positions;
  /// Positions of the keys (`num_keys` values), or empty: key `i` is at position `i`. Read only
  /// when `positions` is set; `select_keys` keeps each selected key's position.
  std::vector<std::int64_t> key_positions;
  /// Dequantisation scales of an fp8 `k`: empty (every scale 1), one value (the tensor's) or
  /// `H_kv` values (one per KV head), each finite and > 0. Empty unless `k` is fp8.
  std::vector<float> k_scale;
  /// Dequantisation scales of an fp8 `v`, as `k_scale`.
  std::vector<float> v_scale;
  /// Attention sinks: empty (none), or `H_q` logits, natural base, one per query head, each
  /// finite or `-inf` (a head without a sink: `(0, -inf)` is the identity). Query head `h`'s
  /// rows are merged once with `(0, sinks[h])` after everything else; a kernel reads them as
  /// `attention_sinks()` (the library's `AttentionSinks` argument) or directly. `select_keys`
  /// keeps them (they belong to the query heads, not to the keys); `without_sinks` drops them.
  std::vector<float> sinks;

  /// @return the number of query rows.
  std::int64_t tokens() const { return q.dim(0); }
  /// @return the query heads `H_q`.
  std::int64_t heads_q() const { return q.dim(1); }
  /// @return the KV heads `H_kv`.
  std::int64_t heads_kv() const { return k.dim(1); }
  /// @return the elements per head.
  std::int64_t head_dim() const { return q.dim(2); }
  /// @return the keys in the segment (`T`).
  std::int64_t num_keys() const { return k.dim(0); }
  /// @return `H_q / H_kv`.
  std::int64_t group_size() const { return heads_q() / heads_kv(); }
  /// @return true when the query rows have positions (a causal or windowed problem).
  bool has_positions() const { return !positions.empty(); }
  /// @return true when `k` and `v` are stored in fp8 (e4m3 or e5m2).
  bool has_fp8_kv() const { return is_fp8(k.dtype()); }
  /// @return true when the problem has attention sinks (`sinks` not empty).
  bool has_sinks() const { return !sinks.empty(); }
  /// The sinks as the library's decode and cascade calls take them (host memory, valid while
  /// `sinks` is unchanged).
  /// @return `{sinks.data()}`, or `{nullptr}` (none) when `sinks` is empty.
  AttentionSinks attention_sinks() const {
    AttentionSinks s;
    s.logits = sinks.empty() ? nullptr : sinks.data();
    return s;
  }
  /// The scale of KV head `g` of `k`: 1 when `k_scale` is empty, its one value, or `k_scale[g]`.
  /// @param g  a KV head, in `[0, heads_kv())`.
  /// @return the scale.
  /// @throws attnstate::Error (`kInvalidArgument`) naming `g` out of range or `k_scale` of a
  ///         size other than 0, 1 or `H_kv`.
  float k_scale_at(std::int64_t g) const;
  /// The scale of KV head `g` of `v`, as `k_scale_at`.
  /// @param g  a KV head, in `[0, heads_kv())`.
  /// @return the scale.
  /// @throws attnstate::Error (`kInvalidArgument`) as `k_scale_at`, naming `v_scale`.
  float v_scale_at(std::int64_t g) const;
};

/// The real values of `problem.k`, row-major `(num_keys, H_kv, head_dim)`: each stored element
/// times the scale of its KV head (`k_scale_at`), in double (exact: an fp8 value times a float).
/// @param problem  the problem.
/// @return `problem.k.numel()` values (the stored values themselves for a k that is not fp8).
/// @throws attnstate::Error (`kInvalidArgument`) naming the problem's inconsistent field.
std::vector<double> real_keys(const AttentionProblem& problem);
/// The real values of `problem.v`, as `real_keys` (with `v_scale`).
/// @param problem  the problem.
/// @return `problem.v.numel()` values.
/// @throws attnstate::Error (`kInvalidArgument`) naming the problem's inconsistent field.
std::vector<double> real_values(const AttentionProblem& problem);

/// `problem` with its keys and values stored in the fp8 `kv_dtype` with the given scales: the
/// real value `x` of an element of KV head `g` (`real_keys` / `real_values` of `problem`) is
/// stored as `from_float(x / scale(g))` (the quotient rounded to fp32, then once to fp8, to
/// nearest even, saturating to the largest finite value, NaN staying NaN), so the new problem's
/// real value is `stored × scale(g)`. Everything else (queries, scale, variant, positions,
/// sinks) is kept.
/// @param problem   the problem (any dtype of k and v, fp8 included).
/// @param kv_dtype  e4m3 or e5m2.
/// @param k_scale   scales of the new `k`: empty (1), one value or `H_kv` values, finite, > 0.
/// @param v_scale   scales of the new `v`, likewise.
/// @return the quantised problem.
/// @throws attnstate::Error (`kInvalidArgument`) naming `kv_dtype` when it is not fp8, `k_scale`
///         or `v_scale` (`v_scale[i]`) of a wrong size or value, or the problem's inconsistent
///         field.
AttentionProblem quantize_kv(const AttentionProblem& problem, DType kv_dtype,
                             std::vector<float> k_scale, std::vector<float> v_scale);

/// The position of key `key` of `problem`: `key_positions[key]`, or `key` when there are none.
/// @param problem  the problem.
/// @param key      an index into `[0, problem.num_keys())`.
/// @return the key's position.
/// @throws attnstate::Error (`kInvalidArgument`) naming `key` out of range, or the problem's
///         field that is inconsistent (as every kit function taking a problem).
std::int64_t key_position(const AttentionProblem& problem, std::int64_t key);

/// The keys of `keys` that query row `token` sees: all of them without `positions`; else those
/// at positions in `[window_begin(p, variant.window_left), p]`, `p = positions[token]`, in the
/// order given.
/// @param problem  the problem.
/// @param token    a query row, in `[0, problem.tokens())`.
/// @param keys     indices into `[0, problem.num_keys())`.
/// @return the visible subset of `keys`.
/// @throws attnstate::Error (`kInvalidArgument`) naming `token` or `keys[i]` out of range, or
///         the problem's inconsistent field.
std::vector<std::int64_t> visible_keys(const AttentionProblem& problem, std::int64_t token,
                                       const std::vector<std::int64_t>& keys);

/// Builds a problem from float values (each rounded once to `dtype`).
///
/// @param tokens     query rows.
/// @param heads_q    query heads `H_q`, a multiple of `heads_kv`.
/// @param heads_kv   KV heads `H_kv` (≥ 1).
/// @param head_dim   elements per head (≥ 1).
/// @param num_keys   keys `T` (≥ 0).
/// @param dtype      storage dtype of `q`, `k` and `v` (f32, f16 or bf16; for fp8 keys and
///                   values, `quantize_kv` the result).
/// @param q          `(tokens, H_q, head_dim)` row-major values.
/// @param k          `(num_keys, H_kv, head_dim)` row-major values.
/// @param v          same shape as `k`.
/// @param scale      softmax scale applied to `q·k`.
/// @param out_dtype  dtype requested for the output `o`.
/// @param base       LSE base requested for the output.
/// @return the problem.
/// @throws attnstate::Error (`kInvalidArgument`) when the sizes do not match the extents or
///         `H_q % H_kv != 0`; `kNotSupported` naming `dtype` for fp8.
AttentionProblem make_problem(std::int64_t tokens, std::int64_t heads_q, std::int64_t heads_kv,
                              std::int64_t head_dim, std::int64_t num_keys, DType dtype,
                              const std::vector<float>& q, const std::vector<float>& k,
                              const std::vector<float>& v, float scale, DType out_dtype,
                              LseBase base);

/// The same problem with only the keys (and values) at indices `keys`, in that order.
///
/// @param problem  the problem to restrict.
/// @param keys  indices into `[0, problem.num_keys())`; may be empty (a `T = 0` segment).
/// @return a problem with the same queries, scale, output dtype, base, variant, query
///         positions, sinks and fp8 scales and `keys.size()` keys (each keeping its position when
///         the problem has query positions).
/// @throws attnstate::Error (`kInvalidArgument`) for an index out of range.
AttentionProblem select_keys(const AttentionProblem& problem,
                             const std::vector<std::int64_t>& keys);

/// The problem of a partial state: `problem` without its sinks (every other field kept). The
/// state of a split, a cascade level or a GPU's shard is sink-free; the sinks are merged once,
/// after the partials (`apply_sinks`).
/// @param problem  the problem.
/// @return a copy of `problem` with `sinks` empty.
/// @throws attnstate::Error (`kInvalidArgument`) naming the problem's inconsistent field.
AttentionProblem without_sinks(const AttentionProblem& problem);

/// A state shaped for `problem`'s output, poisoned with NaN so that any value a kernel fails to
/// write shows up.
/// @param problem  the problem.
/// @return a `(tokens, H_q, head_dim)` state in `problem.out_dtype` and `problem.base`.
HostState make_output_state(const AttentionProblem& problem);

/// The indices `0 .. n-1`.
/// @param n  the number of keys.
/// @return `{0, 1, ..., n-1}` (empty for `n <= 0`).
std::vector<std::int64_t> all_keys(std::int64_t n);

/// Prints the problem's shape, dtypes, base, scale, fp8 scales, value seed, variant and sinks
/// (not the values of q, k and v).
/// @param os       the stream written to.
/// @param problem  the problem.
/// @return `os`.
std::ostream& operator<<(std::ostream& os, const AttentionProblem& problem);
/// RapidCheck's hook for showing a problem in a counterexample.
/// @param problem  the problem.
/// @param os       the stream written to.
void showValue(const AttentionProblem& problem, std::ostream& os);

}  // namespace testing
}  // namespace attnstate
