#include "attnstate/core/context_parallel.hpp"

#include <string>

#include "attnstate/core/checked.hpp"
#include "attnstate/core/error.hpp"
#include "common/validate.hpp"

namespace attnstate {
namespace {

constexpr const char* kPlanFn = "attnstate::plan_cp_merge";
constexpr std::int64_t kRegionAlign = 256;
constexpr std::int64_t kPartAlign = 16;

// Rounds `x` (>= 0, at most kMaxSize) up to a multiple of `a`; -1 past kMaxSize.
std::int64_t round_up(std::int64_t x, std::int64_t a) {
  std::int64_t r = 0;
  if (x < 0 || !checked_add(x, a - 1, &r)) return -1;
  r = r / a * a;
  return r > kMaxSize ? -1 : r;
}

// a * b * c (each >= 0), -1 past kMaxSize.
std::int64_t product(std::int64_t a, std::int64_t b, std::int64_t c = 1) {
  std::int64_t r = 0;
  if (!checked_mul(a, b, &r) || !checked_mul(r, c, &r) || r > kMaxSize) return -1;
  return r;
}

[[noreturn]] void throw_size(const CpMergeShape& s) {
  detail::throw_argument(kPlanFn, "shape.tokens",
                         "sizes within 2^62 bytes (tokens x heads x head_dim)",
                         std::to_string(s.tokens) + " x " + std::to_string(s.heads) + " x " +
                             std::to_string(s.head_dim));
}

// A bump allocator of 256-byte-aligned regions, overflow-checked.
struct Layout {
  const CpMergeShape& shape;
  std::int64_t end = 0;
  std::int64_t take(std::int64_t bytes) {
    if (bytes < 0) throw_size(shape);
    const std::int64_t at = end;
    std::int64_t next = 0;
    if (!checked_add(end, bytes, &next)) throw_size(shape);
    end = round_up(next, kRegionAlign);
    if (end < 0) throw_size(shape);
    return at;
  }
};

void check_shape(const CpMergeShape& s) {
  const char* fn = kPlanFn;
  if (s.world_size < 1 || s.world_size > kMaxCpWorldSize)
    detail::throw_argument(fn, "shape.world_size", "1.." + std::to_string(kMaxCpWorldSize),
                           std::to_string(s.world_size));
  if (s.rank < 0 || s.rank >= s.world_size)
    detail::throw_argument(fn, "shape.rank", "0.." + std::to_string(s.world_size - 1),
                           std::to_string(s.rank));
  detail::check_min(fn, "shape.tokens", s.tokens, 0);
  if (s.heads < s.world_size)
    detail::throw_argument(
        fn, "shape.heads",
        ">= shape.world_size = " + std::to_string(s.world_size) + " (every rank owns a head)",
        std::to_string(s.heads));
  // r * heads (a head slice's bound) must fit for every r <= world_size, also with no tokens.
  constexpr std::int64_t kMaxHeads = kMaxSize / kMaxCpWorldSize;
  if (s.heads > kMaxHeads)
    detail::throw_argument(fn, "shape.heads", "<= 2^52", std::to_string(s.heads));
  detail::check_min(fn, "shape.head_dim", s.head_dim, 1);
  detail::check_dtype(fn, "shape.dtype", s.dtype);
  detail::check_dtype(fn, "shape.out_dtype", s.out_dtype);
  detail::check_base(fn, "shape.wire_base", s.wire_base);
  if (s.algorithm != CpAlgorithm::kAllToAll && s.algorithm != CpAlgorithm::kAllGatherLse)
    detail::throw_argument(fn, "shape.algorithm", "kAllToAll or kAllGatherLse",
                           "value " + std::to_string(static_cast<int>(s.algorithm)));
  if (s.output != CpOutput::kHeadSharded && s.output != CpOutput::kReplicated)
    detail::throw_argument(fn, "shape.output", "kHeadSharded or kReplicated",
                           "value " + std::to_string(static_cast<int>(s.output)));
  if (s.algorithm == CpAlgorithm::kAllGatherLse && s.output == CpOutput::kHeadSharded &&
      s.heads % s.world_size != 0)
    detail::throw_argument(fn, "shape.heads",
                           "a multiple of shape.world_size = " + std::to_string(s.world_size) +
                               " (kAllGatherLse's reduce-scatter gives every rank as many "
                               "heads; kAllToAll takes any count)",
                           std::to_string(s.heads));
}

}  // namespace

std::int64_t CpMergePlan::chunk_lse_offset(std::int64_t h, DType dtype) const {
  const std::int64_t elems = product(shape.tokens, h, shape.head_dim);
  const std::int64_t bytes =
      elems < 0 ? -1 : product(elems, static_cast<std::int64_t>(size_of(dtype)));
  return bytes < 0 ? -1 : round_up(bytes, kPartAlign);
}

std::int64_t CpMergePlan::chunk_bytes(std::int64_t h, DType dtype) const {
  const std::int64_t o = chunk_lse_offset(h, dtype);
  const std::int64_t lse = product(shape.tokens, h, 4);
  const std::int64_t lse_padded = lse < 0 ? -1 : round_up(lse, kPartAlign);
  std::int64_t total = 0;
  if (o < 0 || lse_padded < 0 || !checked_add(o, lse_padded, &total) || total > kMaxSize) return -1;
  return total;
}

std::int64_t CpMergePlan::send_chunk_offset(int p) const {
  std::int64_t at = 0;
  for (int r = 0; r < p; ++r) at += chunk_bytes(heads_of(r), shape.dtype);
  return at;
}

std::int64_t CpMergePlan::gather_chunk_offset(int s) const {
  std::int64_t at = 0;
  for (int r = 0; r < s; ++r) at += chunk_bytes(heads_of(r), shape.out_dtype);
  return at;
}

std::int64_t CpMergePlan::scaled_chunk_offset(int r) const {
  return product(shape.tokens, head_begin(r), shape.head_dim) * 4;
}

CpMergePlan plan_cp_merge(const CpMergeShape& shape) {
  check_shape(shape);
  CpMergePlan plan;
  plan.shape = shape;
  const CpMergeShape& s = shape;
  // Every size below is at most the whole state's (tokens x heads x head_dim x 4 bytes, plus
  // the LSEs, plus padding per rank) times world_size: check that product once.
  const std::int64_t o_elems = product(s.tokens, s.heads, s.head_dim);
  const std::int64_t rows = product(s.tokens, s.heads);
  std::int64_t state = 0;  // o_elems + rows + 64, which may pass 2^63 (both up to 2^62)
  if (o_elems < 0 || rows < 0 || !checked_add(o_elems, rows, &state) ||
      !checked_add(state, 64, &state) || product(state, 4, s.world_size + 1) < 0)
    throw_size(s);
  Layout ws{s};
  const int n = s.world_size;
  const std::int64_t mine = plan.heads_of(s.rank);
  if (s.algorithm == CpAlgorithm::kAllToAll) {
    plan.send_bytes = plan.send_chunk_offset(n);
    plan.send_offset = ws.take(plan.send_bytes);
    plan.recv_bytes = product(n, plan.chunk_bytes(mine, s.dtype));
    plan.recv_offset = ws.take(plan.recv_bytes);
    plan.wire_bytes_sent = plan.send_bytes - plan.chunk_bytes(mine, s.dtype);
    if (s.output == CpOutput::kReplicated) {
      plan.mine_offset = ws.take(plan.chunk_bytes(mine, s.out_dtype));
      plan.gather_bytes = plan.gather_chunk_offset(n);
      plan.gather_offset = ws.take(plan.gather_bytes);
      plan.wire_bytes_sent += (n - 1) * plan.chunk_bytes(mine, s.out_dtype);
    }
  } else {
    plan.o32_offset = ws.take(o_elems * 4);
    plan.lse_offset = ws.take(rows * 4);
    plan.gathered_offset = ws.take(product(n, rows, 4));
    plan.lse_merged_offset = ws.take(rows * 4);
    plan.scaled_bytes = o_elems * 4;
    plan.scaled_offset = ws.take(plan.scaled_bytes);
    if (s.output == CpOutput::kHeadSharded)
      plan.sum_offset = ws.take(product(s.tokens, mine, s.head_dim) * 4);
    // The all-gather sends this rank's LSEs to each peer; a reduce-scatter or all-reduce (ring)
    // sends about (n - 1) / n of the buffer, twice for the all-reduce.
    const std::int64_t ring = n == 1 ? 0 : plan.scaled_bytes / n * (n - 1);
    plan.wire_bytes_sent = (n - 1) * rows * 4 + (s.output == CpOutput::kReplicated ? 2 : 1) * ring;
  }
  plan.zeros_offset = ws.take(product(s.head_dim, 4));
  plan.workspace_bytes = ws.end;
  return plan;
}

void check_cp_plans_agree(const CpMergeShape& a, const CpMergeShape& b, int b_rank) {
  const std::string at = "plans[" + std::to_string(b_rank) + "].shape.";
  const auto field = [&](const char* name, std::int64_t va, std::int64_t vb) {
    if (va != vb)
      detail::throw_argument("attnstate::check_cp_plans_agree", (at + name).c_str(),
                             std::to_string(va) + " (as on the other ranks)", std::to_string(vb));
  };
  field("world_size", a.world_size, b.world_size);
  field("tokens", a.tokens, b.tokens);
  field("heads", a.heads, b.heads);
  field("head_dim", a.head_dim, b.head_dim);
  field("dtype", static_cast<int>(a.dtype), static_cast<int>(b.dtype));
  field("out_dtype", static_cast<int>(a.out_dtype), static_cast<int>(b.out_dtype));
  field("wire_base", static_cast<int>(a.wire_base), static_cast<int>(b.wire_base));
  field("algorithm", static_cast<int>(a.algorithm), static_cast<int>(b.algorithm));
  field("output", static_cast<int>(a.output), static_cast<int>(b.output));
}

std::string to_string(const CpMergePlan& plan) {
  const CpMergeShape& s = plan.shape;
  return std::string("cp_merge ") + to_string(s.algorithm) + " " + to_string(s.output) + ": rank " +
         std::to_string(s.rank) + " of " + std::to_string(s.world_size) + ", " +
         std::to_string(s.tokens) + " tokens x " + std::to_string(s.heads) + " heads x " +
         std::to_string(s.head_dim) + " (" + to_string(s.dtype) + " -> " + to_string(s.out_dtype) +
         "), heads " + std::to_string(plan.head_begin(s.rank)) + ".." +
         std::to_string(plan.head_end(s.rank)) + ", " + std::to_string(plan.wire_bytes_sent) +
         " bytes sent, workspace " + std::to_string(plan.workspace_bytes) + " bytes";
}

}  // namespace attnstate
