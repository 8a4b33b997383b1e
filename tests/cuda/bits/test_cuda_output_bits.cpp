/// @file test_cuda_output_bits.cpp
/// @brief Bitwise regression of every CUDA kernel path: fixed-seed inputs, and a hash of each
///        output's bytes compared with the table recorded on the same GPU (bits_table.hpp).
///
/// Each case runs twice: both runs must give the same bits (no dependence on scheduling), and
/// their hash must match the recorded one. The cascade cases run with the default plan and with
/// every warp-specialised variant (`CascadeTuning::ws_variant` 0..4, named `@ws<n>`).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "attnstate/core/paged_kv.hpp"
#include "attnstate/core/state_view.hpp"
#include "attnstate/cuda/cascade.hpp"
#include "attnstate/cuda/decode.hpp"
#include "attnstate/cuda/merge.hpp"
#include "bits_table.hpp"
#include "cuda_test_utils.hpp"

namespace attnstate_test {
namespace {

using attnstate::DType;
using attnstate::KvLayout;
using attnstate::LseBase;
using attnstate::MemorySpace;
namespace acuda = attnstate::cuda;

constexpr MemorySpace kDev = MemorySpace::kDevice;

/// Skips unless a GPU is present and the recorded table applies to it; returns the device line.
std::string device_or_skip(bool* skip) {
  *skip = true;
  if (!gpu_available()) return "no CUDA device";
  int dev = 0;
  cudaDeviceProp prop{};
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  ATTNSTATE_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const std::string line =
      BitsTable::device_line(prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  const std::string why = BitsTable::get().mismatch(line);
  if (!why.empty()) return why;
  *skip = false;
  return line;
}

#define ATTNSTATE_BITS_SETUP(device)                 \
  bool skip_ = false;                                \
  const std::string device = device_or_skip(&skip_); \
  if (skip_) GTEST_SKIP() << device;                 \
  do {                                               \
  } while (0)

/// Runs `launch` twice into poisoned outputs (`outs`, raw device bytes), checks that both runs
/// give the same bits and records or compares their hash under `name`.
void check_bits(const std::string& device, const std::string& name,
                const std::vector<DeviceBuffer<unsigned char>*>& outs,
                const std::function<void()>& launch) {
  std::uint64_t hashes[2] = {};
  for (int run = 0; run < 2; ++run) {
    for (auto* b : outs) b->poison();
    launch();
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
    std::uint64_t h = fnv1a(nullptr, 0);
    for (auto* b : outs) {
      const auto bytes = b->download();
      h = fnv1a(bytes.data(), bytes.size(), h);
    }
    hashes[run] = h;
  }
  EXPECT_EQ(hashes[0], hashes[1]) << name << ": two runs gave different bits";
  BitsTable::get().check(name, hashes[0], device);
}

std::string dt_name(DType d) { return attnstate::to_string(d); }
std::string base_name(LseBase b) { return b == LseBase::kBase2 ? "b2" : "ln"; }

// ---------------------------------------------------------------------------------------------
// Merges

/// Device states `o (n, D)` and `lse (n)` of random values; about one LSE in 16 is `-inf` (an
/// empty state) and, with `pos_inf`, one in 32 `+inf` (FlashAttention's rows without keys).
struct DeviceStates {
  DeviceBuffer<unsigned char> o, lse;
  DeviceStates(BitsRng& rng, DType dt, std::int64_t n, std::int64_t dim, bool pos_inf = false)
      : o(random_values(rng, dt, n * dim + 8, -2.f, 2.f)) {
    std::vector<float> l(static_cast<std::size_t>(n));
    for (float& x : l) {
      x = rng.uniform(-8.f, 8.f);
      const std::int64_t r = rng.below(32);
      if (r < 2) x = -std::numeric_limits<float>::infinity();
      if (pos_inf && r == 2) x = std::numeric_limits<float>::infinity();
    }
    std::vector<unsigned char> raw(l.size() * 4);
    std::memcpy(raw.data(), l.data(), raw.size());
    lse = DeviceBuffer<unsigned char>(raw);
  }
  /// `o` starting `shift` elements in (1: not 16-byte aligned).
  void* o_at(DType dt, int shift) const { return o.get() + shift * attnstate::size_of(dt); }
  float* lse_ptr() const { return reinterpret_cast<float*>(lse.get()); }
};

/// Output buffers of `n` rows of `dim` elements of `dt` (plus slack for a shifted view).
struct DeviceOut {
  DeviceBuffer<unsigned char> o, lse;
  DeviceOut(DType dt, std::int64_t n, std::int64_t dim)
      : o(static_cast<std::size_t>(n * dim + 8) * attnstate::size_of(dt)),
        lse(static_cast<std::size_t>(n) * 4) {}
  attnstate::StateView view(DType dt, std::int64_t tokens, std::int64_t heads, std::int64_t dim,
                            LseBase base, int shift = 0) {
    return attnstate::make_state_view(o.get() + shift * attnstate::size_of(dt), dt,
                                      reinterpret_cast<float*>(lse.get()), tokens, heads, dim, base,
                                      kDev);
  }
};

struct PairCase {
  DType a, b, out;
  std::int64_t dim;
  int shift;  // 1: o not 16-byte aligned (the scalar path)
};

TEST(CudaOutputBits, MergeState) {
  ATTNSTATE_BITS_SETUP(device);
  const PairCase cases[] = {
      {DType::kBF16, DType::kBF16, DType::kBF16, 128, 0},
      {DType::kF16, DType::kF32, DType::kF16, 128, 0},
      {DType::kF32, DType::kF32, DType::kF32, 64, 0},
      {DType::kBF16, DType::kF16, DType::kF32, 256, 0},
      {DType::kF16, DType::kF16, DType::kBF16, 512, 0},
      {DType::kBF16, DType::kBF16, DType::kBF16, 128, 1},
      {DType::kF32, DType::kBF16, DType::kF16, 64, 1},
  };
  const std::int64_t tokens = 300, heads = 8;
  std::uint64_t seed = 100;
  for (const PairCase& c : cases) {
    BitsRng rng(++seed);
    const std::int64_t n = tokens * heads;
    DeviceStates a(rng, c.a, n, c.dim), b(rng, c.b, n, c.dim);
    DeviceOut out(c.out, n, c.dim);
    const auto av = attnstate::make_const_state_view(a.o_at(c.a, c.shift), c.a, a.lse_ptr(), tokens,
                                                     heads, c.dim, LseBase::kNatural, kDev);
    const auto bv = attnstate::make_const_state_view(b.o_at(c.b, c.shift), c.b, b.lse_ptr(), tokens,
                                                     heads, c.dim, LseBase::kBase2, kDev);
    for (LseBase ob : {LseBase::kNatural, LseBase::kBase2}) {
      const std::string name = "merge_state/" + dt_name(c.a) + "." + dt_name(c.b) + "." +
                               dt_name(c.out) + "/D" + std::to_string(c.dim) + "/shift" +
                               std::to_string(c.shift) + "/" + base_name(ob);
      check_bits(device, name, {&out.o, &out.lse}, [&] {
        acuda::merge_state(av, bv, out.view(c.out, tokens, heads, c.dim, ob, c.shift));
      });
    }
  }
}

TEST(CudaOutputBits, MergeStateInplace) {
  ATTNSTATE_BITS_SETUP(device);
  const std::int64_t tokens = 257, heads = 4;
  std::uint64_t seed = 200;
  for (const PairCase& c : {PairCase{DType::kBF16, DType::kF32, DType::kBF16, 128, 0},
                            PairCase{DType::kF32, DType::kF16, DType::kF32, 64, 0},
                            PairCase{DType::kF16, DType::kF16, DType::kF16, 256, 1}}) {
    for (bool masked : {false, true}) {
      BitsRng rng(++seed);
      const std::int64_t n = tokens * heads;
      DeviceStates acc0(rng, c.out, n, c.dim), other(rng, c.b, n, c.dim);
      std::vector<unsigned char> mask(static_cast<std::size_t>(tokens));
      for (auto& m : mask) m = rng.below(3) != 0 ? 1 : 0;
      DeviceBuffer<unsigned char> dmask(mask);
      // the accumulator is an output: copied from its initial value before each run
      DeviceOut acc(c.out, n, c.dim);
      const auto ov =
          attnstate::make_const_state_view(other.o_at(c.b, c.shift), c.b, other.lse_ptr(), tokens,
                                           heads, c.dim, LseBase::kBase2, kDev);
      const std::string name = "merge_state_inplace/" + dt_name(c.out) + "." + dt_name(c.b) + "/D" +
                               std::to_string(c.dim) + "/shift" + std::to_string(c.shift) +
                               (masked ? "/mask" : "/all");
      check_bits(device, name, {&acc.o, &acc.lse}, [&] {
        ATTNSTATE_CUDA_CHECK(
            cudaMemcpy(acc.o.get(), acc0.o.get(), acc.o.bytes(), cudaMemcpyDeviceToDevice));
        ATTNSTATE_CUDA_CHECK(
            cudaMemcpy(acc.lse.get(), acc0.lse.get(), acc.lse.bytes(), cudaMemcpyDeviceToDevice));
        acuda::merge_state_inplace(
            acc.view(c.out, tokens, heads, c.dim, LseBase::kNatural, c.shift), ov,
            masked ? dmask.get() : nullptr);
      });
    }
  }
}

struct StackCase {
  std::int64_t tokens, states, heads, dim;
  DType in, out;
  int shift;
  const char* what;  // the kernel the case is meant for
};

TEST(CudaOutputBits, MergeStates) {
  ATTNSTATE_BITS_SETUP(device);
  const StackCase cases[] = {
      {300, 1, 8, 128, DType::kBF16, DType::kBF16, 0, "few"},
      {300, 2, 8, 128, DType::kF16, DType::kF32, 0, "few"},
      {300, 3, 8, 64, DType::kF32, DType::kBF16, 0, "few"},
      {300, 4, 8, 256, DType::kBF16, DType::kF16, 0, "few"},
      {1024, 8, 32, 128, DType::kBF16, DType::kBF16, 0, "ring"},
      {512, 16, 32, 64, DType::kF32, DType::kF32, 0, "ring"},
      {512, 24, 16, 128, DType::kF16, DType::kBF16, 0, "ring"},
      {16, 8, 4, 128, DType::kBF16, DType::kBF16, 0, "general"},
      {64, 100, 4, 128, DType::kBF16, DType::kF32, 0, "general"},
      {200, 3, 8, 128, DType::kBF16, DType::kBF16, 1, "general"},
      {40, 7, 8, 512, DType::kF16, DType::kF16, 1, "general"},
  };
  std::uint64_t seed = 300;
  for (const StackCase& c : cases) {
    for (auto order : {attnstate::StackOrder::kTokensMajor, attnstate::StackOrder::kStatesMajor}) {
      BitsRng rng(++seed);
      const std::int64_t n = c.tokens * c.heads;
      DeviceStates in(rng, c.in, n * c.states, c.dim);
      DeviceOut out(c.out, n, c.dim);
      const auto stack =
          attnstate::make_state_stack(in.o_at(c.in, c.shift), c.in, in.lse_ptr(), order, c.tokens,
                                      c.states, c.heads, c.dim, LseBase::kBase2, kDev);
      const std::string name =
          std::string("merge_states/") + c.what + "/" + dt_name(c.in) + "." + dt_name(c.out) +
          "/T" + std::to_string(c.tokens) + "xS" + std::to_string(c.states) + "xH" +
          std::to_string(c.heads) + "xD" + std::to_string(c.dim) + "/shift" +
          std::to_string(c.shift) +
          (order == attnstate::StackOrder::kTokensMajor ? "/tokens_major" : "/states_major");
      check_bits(device, name, {&out.o, &out.lse}, [&] {
        acuda::merge_states(stack,
                            out.view(c.out, c.tokens, c.heads, c.dim, LseBase::kNatural, c.shift));
      });
    }
  }
}

TEST(CudaOutputBits, MergeStatesRagged) {
  ATTNSTATE_BITS_SETUP(device);
  std::uint64_t seed = 400;
  for (const auto& c : {StackCase{100, 0, 8, 128, DType::kBF16, DType::kBF16, 0, "ragged"},
                        StackCase{64, 0, 4, 64, DType::kF32, DType::kF16, 0, "ragged"},
                        StackCase{50, 0, 8, 256, DType::kF16, DType::kF32, 1, "ragged"}}) {
    BitsRng rng(++seed);
    // 0 to 9 rows per output token (0: the empty state)
    std::vector<std::int32_t> indptr(1, 0);
    for (std::int64_t t = 0; t < c.tokens; ++t)
      indptr.push_back(indptr.back() + static_cast<std::int32_t>(rng.below(10)));
    const std::int64_t rows = indptr.back();
    DeviceStates in(rng, c.in, rows * c.heads, c.dim);
    DeviceBuffer<std::int32_t> dptr(indptr);
    DeviceOut out(c.out, c.tokens * c.heads, c.dim);
    const auto rv = attnstate::make_const_state_view(in.o_at(c.in, c.shift), c.in, in.lse_ptr(),
                                                     rows, c.heads, c.dim, LseBase::kNatural, kDev);
    const std::string name = "merge_states_ragged/" + dt_name(c.in) + "." + dt_name(c.out) + "/T" +
                             std::to_string(c.tokens) + "xH" + std::to_string(c.heads) + "xD" +
                             std::to_string(c.dim) + "/shift" + std::to_string(c.shift);
    check_bits(device, name, {&out.o, &out.lse}, [&] {
      acuda::merge_states_ragged(
          rv, dptr.get(), out.view(c.out, c.tokens, c.heads, c.dim, LseBase::kBase2, c.shift));
    });
  }
}

TEST(CudaOutputBits, RebaseAndMarkEmpty) {
  ATTNSTATE_BITS_SETUP(device);
  const std::int64_t tokens = 333, heads = 8;
  std::uint64_t seed = 500;
  for (const PairCase& c : {PairCase{DType::kBF16, DType::kBF16, DType::kF32, 128, 0},
                            PairCase{DType::kF32, DType::kF32, DType::kF16, 64, 0},
                            PairCase{DType::kF16, DType::kF16, DType::kBF16, 256, 1}}) {
    for (LseBase from : {LseBase::kNatural, LseBase::kBase2}) {
      BitsRng rng(++seed);
      const std::int64_t n = tokens * heads;
      DeviceStates in(rng, c.a, n, c.dim, true);
      DeviceOut out(c.out, n, c.dim);
      const LseBase to = from == LseBase::kNatural ? LseBase::kBase2 : LseBase::kNatural;
      const auto iv = attnstate::make_const_state_view(in.o_at(c.a, c.shift), c.a, in.lse_ptr(),
                                                       tokens, heads, c.dim, from, kDev);
      const std::string tag = dt_name(c.a) + "." + dt_name(c.out) + "/D" + std::to_string(c.dim) +
                              "/shift" + std::to_string(c.shift) + "/" + base_name(from);
      check_bits(device, "rebase/" + tag, {&out.o, &out.lse},
                 [&] { acuda::rebase(iv, out.view(c.out, tokens, heads, c.dim, to, c.shift)); });
      // mark_empty_rows rewrites the +inf LSEs of a copy of the input in place
      DeviceOut st(c.a, n, c.dim);
      check_bits(device, "mark_empty_rows/" + tag, {&st.o, &st.lse}, [&] {
        ATTNSTATE_CUDA_CHECK(
            cudaMemcpy(st.o.get(), in.o.get(), st.o.bytes(), cudaMemcpyDeviceToDevice));
        ATTNSTATE_CUDA_CHECK(
            cudaMemcpy(st.lse.get(), in.lse.get(), st.lse.bytes(), cudaMemcpyDeviceToDevice));
        acuda::mark_empty_rows(st.view(c.a, tokens, heads, c.dim, from, c.shift));
      });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Paged pools

/// A paged K/V pool with shuffled page ids (or, `consecutive`, in allocation order) holding the
/// given segments; slots past a segment's end and spare pages hold random values too.
struct HostPool {
  std::int64_t page_size = 16, heads_kv = 1, head_dim = 128, num_pages = 0;
  DType dtype = DType::kBF16;
  KvLayout layout = KvLayout::kNHD;
  std::vector<std::vector<std::int32_t>> pages;  // page ids of each segment
  std::vector<unsigned char> k, v;

  HostPool(BitsRng& rng, const std::vector<std::int64_t>& seg_lens, std::int64_t ps,
           std::int64_t hkv, std::int64_t d, DType dt, KvLayout lay, bool consecutive)
      : page_size(ps), heads_kv(hkv), head_dim(d), dtype(dt), layout(lay) {
    std::int64_t used = 0;
    for (std::int64_t len : seg_lens) used += (len + ps - 1) / ps;
    num_pages = used + 3;
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_pages));
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>(i);
    if (!consecutive)
      for (std::size_t i = ids.size() - 1; i > 0; --i)
        std::swap(ids[i],
                  ids[static_cast<std::size_t>(rng.below(static_cast<std::int64_t>(i) + 1))]);
    std::size_t next = 0;
    for (std::int64_t len : seg_lens) {
      pages.emplace_back();
      for (std::int64_t p = 0; p < (len + ps - 1) / ps; ++p) pages.back().push_back(ids[next++]);
    }
    const std::int64_t elems = num_pages * ps * hkv * d;
    k = random_values(rng, dt, elems);
    v = random_values(rng, dt, elems);
  }
  attnstate::PagedKvCache view(const void* kd, const void* vd) const {
    attnstate::PagedKvCache kv;
    kv.k = kd;
    kv.v = vd;
    kv.dtype = dtype;
    kv.layout = layout;
    kv.num_pages = num_pages;
    kv.page_size = page_size;
    kv.heads_kv = heads_kv;
    kv.head_dim = head_dim;
    kv.space = kDev;
    return kv;
  }
};

// ---------------------------------------------------------------------------------------------
// Split-KV decode

struct DecodeCase {
  std::int64_t q_len, heads_q, heads_kv, dim, page_size;
  DType dtype, out;
  KvLayout layout;
  bool block_table;
  attnstate::SplitPolicy policy;
  int splits;  // num_splits (kFixedCount) or split_size (kFixedSize)
  std::vector<std::int64_t> lens;
  int expect_streamed;  // 1: the plan must pick the streamed kernel, 0: must not, -1: either

  std::string name() const {
    std::string s = "decode/q" + std::to_string(q_len) + "_hq" + std::to_string(heads_q) + "_hkv" +
                    std::to_string(heads_kv) + "_D" + std::to_string(dim) + "_page" +
                    std::to_string(page_size) + "/" + dt_name(dtype) + "." + dt_name(out) +
                    (layout == KvLayout::kHND ? "/HND" : "/NHD") + (block_table ? "/bt" : "/csr");
    s += policy == attnstate::SplitPolicy::kAuto         ? "/auto"
         : policy == attnstate::SplitPolicy::kFixedCount ? "/count" + std::to_string(splits)
                                                         : "/size" + std::to_string(splits);
    return s + "/B" + std::to_string(lens.size());
  }
};

/// `n` lengths: `base` plus a spread of `spread` keys, with a few special ones (0, 1).
std::vector<std::int64_t> lengths(BitsRng& rng, int n, std::int64_t base, std::int64_t spread,
                                  bool specials) {
  std::vector<std::int64_t> v;
  for (int i = 0; i < n; ++i) v.push_back(base + (spread > 0 ? rng.below(spread) : 0));
  if (specials && n >= 4) {
    v[1] = 0;
    v[2] = 1;
  }
  return v;
}

void run_decode_case(const std::string& device, DecodeCase c, std::uint64_t seed) {
  BitsRng rng(seed);
  // lengths below q_len would leave the first rows without keys: allowed (empty states)
  HostPool pool(rng, c.lens, c.page_size, c.heads_kv, c.dim, c.dtype, c.layout, false);
  const std::int64_t batch = static_cast<std::int64_t>(c.lens.size());
  std::vector<std::int32_t> lens32(c.lens.begin(), c.lens.end()), indptr(1, 0), indices, table;
  std::int64_t stride = 1;
  for (const auto& p : pool.pages) stride = std::max<std::int64_t>(stride, p.size() + 1);
  table.assign(static_cast<std::size_t>(batch * stride), 0);
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::size_t i = 0; i < pool.pages[b].size(); ++i) {
      indices.push_back(pool.pages[b][i]);
      table[b * stride + i] = pool.pages[b][i];
    }
    indptr.push_back(static_cast<std::int32_t>(indices.size()));
  }
  if (indices.empty()) indices.push_back(0);
  DeviceBuffer<unsigned char> dk(pool.k), dv(pool.v);
  DeviceBuffer<std::int32_t> dlens(lens32), dptr(indptr), didx(indices), dtab(table);
  const std::int64_t tokens = batch * c.q_len;
  DeviceBuffer<unsigned char> dq(
      random_values(rng, c.dtype, tokens * c.heads_q * c.dim, -2.f, 2.f));

  attnstate::DecodeProblem pr;
  pr.batch = batch;
  pr.q_len = c.q_len;
  pr.heads_q = c.heads_q;
  pr.heads_kv = c.heads_kv;
  pr.head_dim = c.dim;
  pr.q_dtype = pr.kv_dtype = c.dtype;
  attnstate::DecodeOptions opt;
  opt.policy = c.policy;
  if (c.policy == attnstate::SplitPolicy::kFixedCount) opt.num_splits = c.splits;
  if (c.policy == attnstate::SplitPolicy::kFixedSize) opt.split_size = c.splits;
  int dev = 0, sms = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const acuda::DecodePlan plan = acuda::plan_decode(pr, lens32.data(), opt, sms);
  if (c.expect_streamed >= 0) {
    ASSERT_EQ(plan.kernel() == attnstate::DecodeKernel::kStreamed, c.expect_streamed == 1)
        << c.name() << ": " << plan.to_string();
  }
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(16, plan.workspace_bytes()));

  attnstate::PagedKvCache kv = pool.view(dk.get(), dv.get());
  kv.seq_lens = dlens.get();
  kv.batch = batch;
  if (c.block_table) {
    kv.block_table = dtab.get();
    kv.block_table_stride = stride;
  } else {
    kv.page_indptr = dptr.get();
    kv.page_indices = didx.get();
  }
  const auto qv =
      attnstate::make_tensor_view(dq.get(), c.dtype, {batch, c.q_len, c.heads_q, c.dim}, kDev);
  for (LseBase ob : {LseBase::kNatural, LseBase::kBase2}) {
    DeviceOut out(c.out, tokens * c.heads_q, c.dim);
    check_bits(device, c.name() + "/" + base_name(ob), {&out.o, &out.lse}, [&] {
      acuda::init_decode_workspace(plan, ws.get(), ws.bytes());
      acuda::run_decode(plan, qv, kv, out.view(c.out, tokens, c.heads_q, c.dim, ob), ws.get(),
                        ws.bytes());
    });
  }
}

TEST(CudaOutputBits, DecodeSplitKv) {
  ATTNSTATE_BITS_SETUP(device);
  using P = attnstate::SplitPolicy;
  BitsRng lr(600);
  const DecodeCase cases[] = {
      // few long requests: many splits, merged in clusters or through the workspace
      {1, 32, 8, 128, 16, DType::kBF16, DType::kBF16, KvLayout::kNHD, false, P::kAuto, 0,
       lengths(lr, 2, 20000, 3000, false), 0},
      {1, 8, 8, 128, 16, DType::kF16, DType::kF32, KvLayout::kNHD, false, P::kAuto, 0,
       lengths(lr, 3, 9000, 5000, false), 0},
      {1, 16, 2, 64, 64, DType::kBF16, DType::kF16, KvLayout::kHND, true, P::kAuto, 0,
       lengths(lr, 4, 6000, 4000, false), 0},
      {1, 16, 4, 256, 16, DType::kBF16, DType::kBF16, KvLayout::kNHD, false, P::kAuto, 0,
       lengths(lr, 3, 7000, 2000, false), 0},
      // fixed splits, ragged lengths with empty and one-key requests
      {1, 4, 4, 128, 16, DType::kBF16, DType::kBF16, KvLayout::kNHD, false, P::kFixedCount, 7,
       lengths(lr, 9, 500, 1500, true), 0},
      {1, 32, 4, 128, 1, DType::kF16, DType::kF16, KvLayout::kNHD, true, P::kFixedCount, 3,
       lengths(lr, 6, 100, 400, true), 0},
      {1, 8, 1, 64, 5, DType::kBF16, DType::kF32, KvLayout::kHND, false, P::kFixedSize, 64,
       lengths(lr, 7, 200, 900, true), 0},
      {1, 64, 4, 128, 32, DType::kBF16, DType::kBF16, KvLayout::kNHD, false, P::kFixedSize, 256,
       lengths(lr, 5, 1000, 3000, true), 0},
      {1, 16, 8, 256, 16, DType::kF16, DType::kBF16, KvLayout::kHND, true, P::kFixedCount, 20,
       lengths(lr, 3, 3000, 100, false), 0},
      // speculative decode (q_len > 1): rows of several tokens, a second row tile
      {3, 8, 2, 128, 16, DType::kBF16, DType::kBF16, KvLayout::kNHD, false, P::kAuto, 0,
       lengths(lr, 8, 300, 3000, true), -1},
      {8, 16, 4, 64, 16, DType::kF16, DType::kF32, KvLayout::kNHD, true, P::kFixedCount, 4,
       lengths(lr, 5, 10, 700, true), 0},
      {4, 32, 2, 128, 64, DType::kBF16, DType::kF16, KvLayout::kHND, false, P::kFixedSize, 128,
       lengths(lr, 4, 2, 1200, true), 0},
      {2, 40, 8, 256, 16, DType::kBF16, DType::kBF16, KvLayout::kNHD, false, P::kAuto, 0,
       lengths(lr, 6, 1500, 500, false), -1},
      // many requests: one split each on the split kernel (pages not of 16 keys)
      {1, 32, 8, 128, 8, DType::kBF16, DType::kBF16, KvLayout::kNHD, false, P::kAuto, 0,
       lengths(lr, 256, 40, 300, true), -1},
      // D 128 many CTAs: the short pipeline configuration
      {1, 16, 8, 128, 16, DType::kBF16, DType::kBF16, KvLayout::kNHD, false, P::kFixedCount, 4,
       lengths(lr, 96, 600, 600, false), 0},
  };
  std::uint64_t seed = 700;
  for (const DecodeCase& c : cases) run_decode_case(device, c, ++seed);
}

TEST(CudaOutputBits, DecodeStreamed) {
  ATTNSTATE_BITS_SETUP(device);
  using P = attnstate::SplitPolicy;
  BitsRng lr(800);
  const DecodeCase cases[] = {
      {1, 32, 8, 128, 16, DType::kBF16, DType::kBF16, KvLayout::kNHD, false, P::kAuto, 0,
       lengths(lr, 256, 30, 300, true), 1},
      {1, 32, 8, 64, 16, DType::kF16, DType::kF32, KvLayout::kHND, true, P::kAuto, 0,
       lengths(lr, 256, 60, 500, true), 1},
      {1, 64, 16, 128, 32, DType::kF16, DType::kBF16, KvLayout::kNHD, true, P::kAuto, 0,
       lengths(lr, 160, 10, 200, true), 1},
      {2, 32, 8, 64, 64, DType::kBF16, DType::kF16, KvLayout::kNHD, false, P::kAuto, 0,
       lengths(lr, 300, 100, 200, true), 1},
  };
  std::uint64_t seed = 900;
  for (const DecodeCase& c : cases) run_decode_case(device, c, ++seed);
}

// ---------------------------------------------------------------------------------------------
// Cascade

struct CascadeCase {
  const char* name;
  std::int64_t q_len, heads_q, heads_kv, dim, page_size;
  DType dtype, out;
  KvLayout layout;
  bool causal, consecutive;
  std::vector<std::vector<std::pair<int, int>>> levels;  // per level: (requests, len) segments
  acuda::CascadeTuning tuning;
  bool staged;  // run_cascade_level per level, then run_cascade_merge
};

acuda::CascadeTuning tune(int tile_rows, acuda::CascadeKernel k, bool decode_last = true,
                          int chunk = 0) {
  acuda::CascadeTuning t;
  t.tile_rows = tile_rows;
  t.kernel = k;
  t.decode_last_level = decode_last;
  t.chunk = chunk;
  return t;
}

/// Levels: one prefix of `prefix` keys shared by all `batch` requests, then unique suffixes.
std::vector<std::vector<std::pair<int, int>>> two_levels(int batch, int prefix, int suffix) {
  std::vector<std::vector<std::pair<int, int>>> l(2);
  l[0].push_back({batch, prefix});
  for (int b = 0; b < batch; ++b) l[1].push_back({1, suffix + (b * 37) % 91});
  return l;
}

void run_cascade_case(const std::string& device, const CascadeCase& c, std::uint64_t seed) {
  BitsRng rng(seed);
  std::vector<std::int64_t> seg_lens;
  for (const auto& lv : c.levels)
    for (const auto& s : lv) seg_lens.push_back(s.second);
  HostPool pool(rng, seg_lens, c.page_size, c.heads_kv, c.dim, c.dtype, c.layout, c.consecutive);
  int batch = 0;
  for (const auto& s : c.levels[0]) batch += s.first;
  // level arrays, host and device
  std::vector<std::vector<std::int32_t>> host(4 * c.levels.size());
  std::vector<DeviceBuffer<std::int32_t>> dbufs;
  std::vector<attnstate::CascadeLevel> hl, dl;
  std::size_t seg = 0;
  for (std::size_t l = 0; l < c.levels.size(); ++l) {
    auto& rq = host[4 * l];
    auto& pp = host[4 * l + 1];
    auto& pi = host[4 * l + 2];
    auto& sl = host[4 * l + 3];
    rq.push_back(0);
    pp.push_back(0);
    for (const auto& s : c.levels[l]) {
      rq.push_back(rq.back() + s.first);
      for (std::int32_t id : pool.pages[seg]) pi.push_back(id);
      pp.push_back(static_cast<std::int32_t>(pi.size()));
      sl.push_back(s.second);
      ++seg;
    }
    attnstate::CascadeLevel h;
    h.num_segments = static_cast<std::int64_t>(sl.size());
    h.request_indptr = rq.data();
    h.page_indptr = pp.data();
    h.page_indices = pi.empty() ? nullptr : pi.data();
    h.seg_lens = sl.data();
    hl.push_back(h);
  }
  for (auto& v : host) dbufs.emplace_back(std::max<std::size_t>(1, v.size()));
  for (std::size_t i = 0; i < host.size(); ++i)
    if (!host[i].empty()) dbufs[i].upload(host[i]);
  for (std::size_t l = 0; l < c.levels.size(); ++l) {
    attnstate::CascadeLevel d = hl[l];
    d.request_indptr = dbufs[4 * l].get();
    d.page_indptr = dbufs[4 * l + 1].get();
    d.page_indices = hl[l].page_indices != nullptr ? dbufs[4 * l + 2].get() : nullptr;
    d.seg_lens = dbufs[4 * l + 3].get();
    dl.push_back(d);
  }
  DeviceBuffer<unsigned char> dk(pool.k), dv(pool.v);
  const std::int64_t tokens = static_cast<std::int64_t>(batch) * c.q_len;
  DeviceBuffer<unsigned char> dq(
      random_values(rng, c.dtype, tokens * c.heads_q * c.dim, -2.f, 2.f));

  acuda::CascadeShape shape;
  shape.batch = batch;
  shape.q_len = c.q_len;
  shape.heads_q = c.heads_q;
  shape.heads_kv = c.heads_kv;
  shape.head_dim = c.dim;
  shape.page_size = c.page_size;
  shape.num_pages = pool.num_pages;
  shape.dtype = c.dtype;
  attnstate::CascadeOptions opt;
  opt.causal = c.causal;
  int dev = 0, sms = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const int nl = static_cast<int>(hl.size());
  const acuda::CascadePlan plan = acuda::plan_cascade(shape, hl.data(), nl, opt, sms, c.tuning);
  DeviceBuffer<unsigned char> ws(std::max<std::size_t>(16, plan.workspace_bytes()));
  const attnstate::PagedKvCache kv = pool.view(dk.get(), dv.get());
  const auto qv =
      attnstate::make_tensor_view(dq.get(), c.dtype, {batch, c.q_len, c.heads_q, c.dim}, kDev);
  std::string name = std::string("cascade/") + c.name + "/q" + std::to_string(c.q_len) + "_hq" +
                     std::to_string(c.heads_q) + "_hkv" + std::to_string(c.heads_kv) + "_D" +
                     std::to_string(c.dim) + "_page" + std::to_string(c.page_size) + "/" +
                     dt_name(c.dtype) + "." + dt_name(c.out) +
                     (c.layout == KvLayout::kHND ? "/HND" : "/NHD") +
                     (c.causal ? "/causal" : "/full") + (c.staged ? "/staged" : "");
  if (c.tuning.ws_variant >= 0) name += "@ws" + std::to_string(c.tuning.ws_variant);
  DeviceOut out(c.out, tokens * c.heads_q, c.dim);
  const auto ov = out.view(c.out, tokens, c.heads_q, c.dim, LseBase::kBase2);
  check_bits(device, name, {&out.o, &out.lse}, [&] {
    // the workspace's tickets start at zero (the plan's documented precondition)
    ATTNSTATE_CUDA_CHECK(cudaMemset(ws.get(), 0, ws.bytes()));
    if (c.staged) {
      for (int l = 0; l < nl; ++l)
        acuda::run_cascade_level(plan, l, qv, kv, dl[l], ws.get(), ws.bytes());
      acuda::run_cascade_merge(plan, ov, ws.get(), ws.bytes());
    } else {
      acuda::run_cascade(plan, qv, kv, dl.data(), nl, ov, ws.get(), ws.bytes());
    }
  });
}

TEST(CudaOutputBits, Cascade) {
  ATTNSTATE_BITS_SETUP(device);
  using K = acuda::CascadeKernel;
  const DType bf = DType::kBF16, f16 = DType::kF16;
  const KvLayout nhd = KvLayout::kNHD, hnd = KvLayout::kHND;
  const CascadeCase cases[] = {
      // mma.sync: tiles of 16, 64 and 128 rows, head dims 64 and 128, f16 and bf16
      {"mma_t16", 1, 8, 2, 64, 16, bf, bf, nhd, true, false, two_levels(2, 700, 40),
       tune(16, K::kMma, false), false},
      {"mma_t64", 2, 16, 4, 64, 16, f16, f16, nhd, true, false, two_levels(8, 900, 30),
       tune(64, K::kMma, false), false},
      {"mma_t128", 1, 32, 4, 128, 16, bf, DType::kF32, hnd, true, false, two_levels(16, 1100, 20),
       tune(128, K::kMma, true), false},
      {"mma_auto_f16", 4, 16, 2, 128, 32, f16, bf, nhd, true, false, two_levels(12, 1500, 50),
       tune(0, K::kAuto, true), false},
      {"mma_page5", 1, 16, 2, 64, 5, bf, bf, nhd, false, false, two_levels(10, 333, 17),
       tune(0, K::kAuto, false), true},
      // wgmma over cp.async copies: bf16, head dim 128, pages without a bulk-copy box
      {"wgmma_t64_page5", 1, 16, 2, 128, 5, bf, bf, nhd, true, false, two_levels(8, 800, 25),
       tune(64, K::kWgmma, true), false},
      {"wgmma_t128_page96", 2, 16, 2, 128, 96, bf, f16, hnd, true, false, two_levels(16, 1300, 40),
       tune(128, K::kWgmma, false), false},
      {"wgmma_auto_page3", 1, 32, 4, 128, 3, bf, DType::kF32, nhd, true, false,
       two_levels(20, 600, 9), tune(0, K::kAuto, true), true},
      // warp-specialised (bulk copies on mbarriers): page sizes 16 (runs when consecutive), 64, 128
      {"ws_t128_page16", 1, 32, 4, 128, 16, bf, bf, nhd, true, false, two_levels(16, 2000, 30),
       tune(128, K::kAuto, true), false},
      {"ws_t128_page16_runs", 1, 32, 4, 128, 16, bf, bf, nhd, true, true, two_levels(16, 2000, 30),
       tune(128, K::kAuto, true), false},
      {"ws_t64_page64", 2, 16, 4, 128, 64, bf, DType::kF32, nhd, true, false,
       two_levels(8, 1700, 60), tune(64, K::kAuto, false), false},
      {"ws_t128_page128", 1, 64, 8, 128, 128, bf, f16, hnd, true, false, two_levels(8, 3000, 45),
       tune(128, K::kAuto, true), true},
      {"ws_t64_page8_chunk", 3, 8, 2, 128, 8, bf, bf, nhd, false, true, two_levels(10, 1200, 70),
       tune(64, K::kAuto, false, 256), false},
  };
  // three levels: a shared prefix, shared middles of two requests each, unique suffixes
  std::vector<std::vector<std::pair<int, int>>> three(3);
  three[0].push_back({16, 1500});
  for (int i = 0; i < 8; ++i) three[1].push_back({2, 100 + 23 * i});
  for (int i = 0; i < 16; ++i) three[2].push_back({1, 20 + 5 * i});
  const CascadeCase three_cases[] = {
      {"three_levels", 2, 32, 4, 128, 16, bf, bf, nhd, true, false, three, tune(0, K::kAuto, true),
       false},
      {"three_levels_mma", 1, 16, 2, 64, 16, f16, DType::kF32, nhd, true, false, three,
       tune(0, K::kMma, false), false},
  };
  // the default plan (-1) and every warp-specialised variant, each case on its own seed
  for (int ws = -1; ws <= 4; ++ws) {
    std::uint64_t seed = 1000;
    for (const CascadeCase* group : {static_cast<const CascadeCase*>(cases), three_cases}) {
      const std::size_t n = group == three_cases ? 2 : sizeof(cases) / sizeof(cases[0]);
      for (std::size_t i = 0; i < n; ++i) {
        CascadeCase c = group[i];
        c.tuning.ws_variant = ws;
        run_cascade_case(device, c, ++seed);
      }
    }
  }
}

}  // namespace
}  // namespace attnstate_test
