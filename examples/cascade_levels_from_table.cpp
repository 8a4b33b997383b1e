/// @file cascade_levels_from_table.cpp
/// @brief Cascade levels found in a page table: eight requests that share a system prompt, few-shot
///        blocks by group and forks of one conversation, listed in no particular order, with two
///        new tokens each (speculative decode). `build_cascade_levels` finds the levels, the
///        queries are gathered into their order, the CPU cascade runs, its state is scattered
///        back and compared with `cpu::decode` over the same table. Exits non-zero if the
///        answers differ beyond rounding.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "attnstate/core/cascade_levels.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"

namespace {

using namespace attnstate;

constexpr std::int64_t kPage = 16, kHeadsKv = 2, kHeadsQ = 8, kHeadDim = 64, kQLen = 2;

/// A CSR page table being filled: pages are handed out in order.
struct Table {
  std::vector<std::int32_t> indptr{0}, ids, lens;
  std::int32_t next = 0;

  std::vector<std::int32_t> alloc(int n) {
    std::vector<std::int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(next++);
    return p;
  }
  /// A request holding `parts` (whole pages) then `own` tokens of its own.
  void add(const std::vector<std::vector<std::int32_t>>& parts, int own) {
    std::int32_t len = 0;
    for (const auto& part : parts) {
      ids.insert(ids.end(), part.begin(), part.end());
      len += static_cast<std::int32_t>(part.size() * kPage);
    }
    const std::vector<std::int32_t> mine = alloc(static_cast<int>((own + kPage - 1) / kPage));
    ids.insert(ids.end(), mine.begin(), mine.end());
    indptr.push_back(static_cast<std::int32_t>(ids.size()));
    lens.push_back(len + own);
  }
};

}  // namespace

int main() {
  Table t;
  const auto prompt = t.alloc(8), shots_a = t.alloc(4), shots_b = t.alloc(2);
  const auto chat = t.alloc(3), fork = t.alloc(2);
  t.add({prompt, shots_a}, 5);
  t.add({prompt, shots_b}, 17);
  t.add({prompt, chat}, 20);
  t.add({prompt, shots_a}, 1);
  t.add({prompt, chat, fork}, 9);
  t.add({prompt, shots_a}, 33);
  t.add({prompt, shots_b}, 2);
  t.add({prompt, chat, fork}, 30);
  const std::int64_t batch = static_cast<std::int64_t>(t.lens.size());

  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> k(static_cast<std::size_t>(t.next * kPage * kHeadsKv * kHeadDim)), v(k.size());
  std::vector<float> q(static_cast<std::size_t>(batch * kQLen * kHeadsQ * kHeadDim));
  for (auto* vec : {&k, &v, &q})
    for (float& x : *vec) x = uni(rng);
  const std::size_t rows = static_cast<std::size_t>(batch * kQLen * kHeadsQ);
  std::vector<float> lv_o(rows * kHeadDim), lv_lse(rows), o(rows * kHeadDim), lse(rows);
  const ConstTensorView q_view =
      make_tensor_view(q.data(), DType::kF32, {batch, kQLen, kHeadsQ, kHeadDim});
  const StateView out_lv = make_state_view(lv_o.data(), DType::kF32, lv_lse.data(), batch * kQLen,
                                           kHeadsQ, kHeadDim, LseBase::kNatural);
  const StateView out = make_state_view(o.data(), DType::kF32, lse.data(), batch * kQLen, kHeadsQ,
                                        kHeadDim, LseBase::kNatural);

  //! [levels-from-table]
  PagedKvCache kv;  // the pool and its page table, as for cpu::decode
  kv.k = k.data();
  kv.v = v.data();
  kv.dtype = DType::kF32;
  kv.num_pages = t.next;
  kv.page_size = kPage;
  kv.heads_kv = kHeadsKv;
  kv.head_dim = kHeadDim;
  kv.page_indptr = t.indptr.data();
  kv.page_indices = t.ids.data();
  kv.seq_lens = t.lens.data();
  kv.batch = batch;

  CascadeLevelsOptions options;
  options.q_len = kQLen;  // every remainder keeps the new tokens (the causal rule)
  const CascadeLevels levels = build_cascade_levels(kv, options);
  std::printf("%s\n", to_string(levels).c_str());

  // The requests of a segment are contiguous in the levels' order: run the cascade in it.
  std::vector<float> q_in_order(q.size());
  const ConstTensorView q_lv = gather_queries(levels, q_view, q_in_order.data(),
                                              static_cast<std::int64_t>(q_in_order.size() * 4));
  cpu::cascade_attention(q_lv, kv, levels.levels(), levels.num_levels(), CascadeOptions{}, out_lv);
  scatter_state(levels, out_lv, out);  // back to the table's request order
  //! [levels-from-table]

  std::vector<float> ref_o(o.size()), ref_lse(lse.size());
  cpu::decode(q_view, kv, DecodeOptions{},
              make_state_view(ref_o.data(), DType::kF32, ref_lse.data(), batch * kQLen, kHeadsQ,
                              kHeadDim, LseBase::kNatural));
  double diff = 0;  // a NaN anywhere counts as infinitely far
  const auto widen = [&diff](double a, double b) {
    const double d = std::fabs(a - b);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
  };
  for (std::size_t i = 0; i < o.size(); ++i) widen(o[i], ref_o[i]);
  for (std::size_t i = 0; i < lse.size(); ++i) widen(lse[i], ref_lse[i]);
  const bool ok = diff < 1e-4 && levels.num_levels() == 4;
  std::printf("cascade vs decode: largest difference %.2e (%s); keys read %lld of %lld\n", diff,
              ok ? "ok" : "MISMATCH", static_cast<long long>(levels.keys_read()),
              static_cast<long long>(levels.keys_total()));
  return ok ? 0 : 1;
}
