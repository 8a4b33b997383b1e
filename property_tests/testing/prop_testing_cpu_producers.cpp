/// @file prop_testing_cpu_producers.cpp
/// @brief `cpu::decode` and `cpu::cascade_attention` run through the testing kit's conformance
///        check (`check_state_kernel`): exactness against the double reference, split/merge,
///        the empty key set, the declared base, large logits and determinism; plain and
///        soft-capped problems, and problems with fp8 keys and values (e4m3, e5m2; their scales
///        passed as a host value, a pointer or per KV head).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"
#include "attnstate/testing/gtest.hpp"
#include "attnstate/testing/testing.hpp"

namespace {

using namespace attnstate;
using attnstate::testing::AttentionProblem;
using attnstate::testing::HostState;

constexpr std::int64_t kPage = 16;

/// The problem's scales of one fp8 pool as the cache takes them: per KV head, or one per tensor
/// given as a host value or (for odd seeds) through a pointer into `scales`.
KvScale scale_of(const std::vector<float>& scales, std::uint64_t seed) {
  if (scales.size() > 1) return KvScale::per_head(scales.data());
  if (scales.empty()) return KvScale{};
  return seed % 2 == 1 ? KvScale::per_tensor_at(scales.data()) : KvScale::per_tensor(scales[0]);
}

/// A host page pool holding `runs` of keys, each run starting on a fresh page (NHD pages of 16
/// tokens, the tail of each run's last page zero-filled).
struct Pool {
  std::vector<unsigned char> k, v;
  std::vector<std::int32_t> first_page;  // per run
  std::int64_t pages = 0;

  Pool(const AttentionProblem& p, const std::vector<std::pair<std::int64_t, std::int64_t>>& runs) {
    const std::size_t elem = size_of(p.k.dtype());
    const std::size_t row = std::size_t(p.heads_kv() * p.head_dim()) * elem;
    for (const auto& r : runs) {
      first_page.push_back(static_cast<std::int32_t>(pages));
      pages += (r.second - r.first + kPage - 1) / kPage;
    }
    const std::int64_t alloc = std::max<std::int64_t>(pages, 1);
    k.assign(std::size_t(alloc * kPage) * row, 0);
    v.assign(k.size(), 0);
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const std::size_t dst = std::size_t(first_page[i]) * kPage * row;
      const std::size_t src = std::size_t(runs[i].first) * row;
      const std::size_t bytes = std::size_t(runs[i].second - runs[i].first) * row;
      if (bytes == 0) continue;  // an empty run (the key tensors may have no storage at all)
      std::memcpy(k.data() + dst, static_cast<const unsigned char*>(p.k.data()) + src, bytes);
      std::memcpy(v.data() + dst, static_cast<const unsigned char*>(p.v.data()) + src, bytes);
    }
  }
  PagedKvCache view(const AttentionProblem& p) const {
    PagedKvCache kv;
    kv.k = k.data();
    kv.v = v.data();
    kv.dtype = p.k.dtype();
    if (p.has_fp8_kv()) {
      kv.k_scale = scale_of(p.k_scale, p.value_seed);
      kv.v_scale = scale_of(p.v_scale, p.value_seed);
    }
    kv.layout = KvLayout::kNHD;
    kv.num_pages = std::max<std::int64_t>(pages, 1);
    kv.page_size = kPage;
    kv.heads_kv = p.heads_kv();
    kv.head_dim = p.head_dim();
    return kv;
  }
};

ConstTensorView queries(const AttentionProblem& p) {
  return make_tensor_view(p.q.data(), p.q.dtype(), {p.tokens(), 1, p.heads_q(), p.head_dim()});
}

/// `cpu::decode`: every query row is one request over the selected keys (pages shared by all).
HostState cpu_decode_kernel(const AttentionProblem& full, const std::vector<std::int64_t>& keys) {
  const AttentionProblem p = attnstate::testing::select_keys(full, keys);
  const std::int64_t batch = p.tokens(), t = p.num_keys();
  const Pool pool(p, {{0, t}});
  std::vector<std::int32_t> table(std::size_t(batch * std::max<std::int64_t>(pool.pages, 1)), 0);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < pool.pages; ++i)
      table[std::size_t(b * pool.pages + i)] = static_cast<std::int32_t>(i);
  std::vector<std::int32_t> lens(std::size_t(batch), static_cast<std::int32_t>(t));
  PagedKvCache kv = pool.view(p);
  kv.block_table = table.data();
  kv.block_table_stride = std::max<std::int64_t>(pool.pages, 1);
  kv.seq_lens = lens.data();
  kv.batch = batch;
  DecodeOptions options;
  options.scale = p.scale;
  options.policy = SplitPolicy::kFixedSize;  // several splits even for short key sets
  options.split_size = 16;
  options.variant.logits_soft_cap = p.variant.logits_soft_cap;  // problems drawn soft-capped
  HostState out = attnstate::testing::make_output_state(p);
  cpu::decode(queries(p), kv, options, out.view());
  return out;
}

/// `cpu::cascade_attention` with two levels: the first half of the selected keys is one segment
/// shared by every request (read once), the second half each request's own segment.
HostState cpu_cascade_kernel(const AttentionProblem& full, const std::vector<std::int64_t>& keys) {
  const AttentionProblem p = attnstate::testing::select_keys(full, keys);
  const std::int64_t batch = p.tokens(), t = p.num_keys(), n0 = t / 2;
  const Pool pool(p, {{0, n0}, {n0, t}});
  const std::int32_t p0 = static_cast<std::int32_t>((n0 + kPage - 1) / kPage);
  const std::int32_t p1 = static_cast<std::int32_t>((t - n0 + kPage - 1) / kPage);

  std::vector<std::int32_t> req0 = {0, static_cast<std::int32_t>(batch)}, pind0 = {0, p0};
  std::vector<std::int32_t> ids0(std::size_t(std::max(p0, 1)), 0),
      len0 = {static_cast<std::int32_t>(n0)};
  for (std::int32_t i = 0; i < p0; ++i) ids0[std::size_t(i)] = pool.first_page[0] + i;
  std::vector<std::int32_t> req1, pind1, ids1, len1;
  for (std::int64_t b = 0; b <= batch; ++b) {
    req1.push_back(static_cast<std::int32_t>(b));
    pind1.push_back(static_cast<std::int32_t>(b * p1));
  }
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int32_t i = 0; i < p1; ++i) ids1.push_back(pool.first_page[1] + i);
    len1.push_back(static_cast<std::int32_t>(t - n0));
  }
  if (ids1.empty()) ids1.push_back(0);

  CascadeLevel levels[2];
  levels[0].num_segments = 1;
  levels[0].request_indptr = req0.data();
  levels[0].page_indptr = pind0.data();
  levels[0].page_indices = ids0.data();
  levels[0].seg_lens = len0.data();
  levels[1].num_segments = batch;
  levels[1].request_indptr = req1.data();
  levels[1].page_indptr = pind1.data();
  levels[1].page_indices = ids1.data();
  levels[1].seg_lens = len1.data();
  CascadeOptions options;
  options.scale = p.scale;
  options.variant.logits_soft_cap = p.variant.logits_soft_cap;
  HostState out = attnstate::testing::make_output_state(p);
  cpu::cascade_attention(queries(p), pool.view(p), levels, 2, options, out.view());
  return out;
}

attnstate::testing::KernelCheckOptions decode_options() {
  attnstate::testing::KernelCheckOptions o;
  o.problems = attnstate::testing::decode_problem_options();
  o.num_tests = 100;
  o.p_rounded_to_input = false;  // fp32 probabilities: held to fp32 precision before rounding o
  return o;
}

TEST(KitCpuProducers, CpuDecodePassesTheKit) {
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(cpu_decode_kernel, decode_options());
}

TEST(KitCpuProducers, CpuCascadePassesTheKit) {
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(cpu_cascade_kernel, decode_options());
}

/// Decode-shaped problems, half of them soft-capped (caps 5, 30, 50).
attnstate::testing::KernelCheckOptions soft_cap_options() {
  attnstate::testing::KernelCheckOptions o = decode_options();
  o.problems.soft_cap_percent = 50;
  return o;
}

TEST(KitCpuProducers, SoftCappedCpuDecodePassesTheKit) {
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(cpu_decode_kernel, soft_cap_options());
}

TEST(KitCpuProducers, SoftCappedCpuCascadePassesTheKit) {
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(cpu_cascade_kernel, soft_cap_options());
}

/// Decode-shaped problems over fp8 keys and values (`fp8_kv_problem_options`: e4m3 and e5m2,
/// scales 1, 2^-10 and 2^8, per tensor or per KV head, values at the formats' extremes).
attnstate::testing::KernelCheckOptions fp8_kv_options() {
  attnstate::testing::KernelCheckOptions o = decode_options();
  o.problems = attnstate::testing::fp8_kv_problem_options(o.problems);
  return o;
}

TEST(KitCpuProducers, Fp8KvCpuDecodePassesTheKit) {
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(cpu_decode_kernel, fp8_kv_options());
}

TEST(KitCpuProducers, Fp8KvCpuCascadePassesTheKit) {
  ATTNSTATE_EXPECT_KERNEL_CONFORMS(cpu_cascade_kernel, fp8_kv_options());
}

}  // namespace
