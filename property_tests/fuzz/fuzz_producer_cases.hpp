/// @file fuzz_producer_cases.hpp
/// @brief Fuzz cases of the producers of the CPU backend: attention_state, decode (both
///        overloads, the options one sometimes with attention sinks) and cascade_attention
///        (sometimes with sinks), over a paged KV pool and tables in the arena.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attnstate/cpu/attention.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"
#include "fuzz_merge_cases.hpp"

namespace attnstate_fuzz {

/// Mutations of a decode call's arguments shared by the CPU and CUDA fuzzers: q's and out's shapes
/// and strides, their mismatch with the pool, `kv.batch`, a null `seq_lens`. `heads` names what a
/// wrong head count may be reported as; `once` guards the batch edit (two would cancel).
inline std::vector<std::function<bool()>> decode_arg_mutations(
    Ctx& c, Rng& r, std::shared_ptr<TensorArg> q, std::shared_ptr<StateArg> out,
    attnstate::PagedKvCache& kv, i64 batch, std::vector<std::string> heads, bool once) {
  const std::vector<std::string> b0{"kv.batch", "q.shape[0]", "out.tokens"};
  const std::vector<std::string> dm{"q.shape[3]", "out.head_dim"};
  return {
      [&c, q, b0, heads, dm] {
        return mutate_tensor(c, *q, {b0, {"q.shape[1]", "out.tokens"}, heads, dm});
      },
      [&c, out] { return mutate_state(c, *out, {}); },
      [&c, &r, out] {
        const int f = static_cast<int>(r.range(0, 2));
        return mutate_mismatch(c, *out,
                               {f == 0   ? "q"
                                : f == 1 ? "q.shape[2]"
                                         : "q.shape[3]",
                                "kv.head_dim"},
                               f);
      },
      [&c, &r, &kv, batch, once] {
        if (once && !c.touch("kv#batch")) return false;
        kv.batch = r.pick<i64>({-1, kI64Min, batch + 1, k2p62 + 1});
        // (tables left null for batch 0 may then be named)
        c.reject("kv.batch = " + str(kv.batch),
                 {"kv.batch", "q.shape[0]", "kv.seq_lens", "kv.block_table", "kv.page_indptr",
                  "kv.page_indices"});
        return true;
      },
      [&c, &kv, batch] {
        if (batch < 1) return false;
        kv.seq_lens = nullptr;
        c.reject("kv.seq_lens null", {"kv.seq_lens"}, false);
        return true;
      },
  };
}

inline float draw_scale(Ctx& c, bool* bad) {
  *bad = false;
  const i64 k = c.rng.range(0, 99);
  if (k < 8) return 0.f;
  if (k < 12) return *bad = true, NAN;
  if (k < 16) return *bad = true, (c.rng.coin(50) ? INFINITY : -INFINITY);
  return static_cast<float>(c.rng.range(-300, 300)) / 100.f + 0.001f;
}

inline Built build_attention_state(Ctx& c, int nmut) {
  Rng& r = c.rng;
  const i64 d = r.range(1, 8), hkv = r.range(1, 2), hq = hkv * r.range(1, 2);
  const i64 tq = r.range(0, 3), tk = r.range(0, 4);
  const DType kvdt = draw_dtype(r);
  auto q = std::make_shared<TensorArg>(make_tensor(c, "q", {tq, hq, d}, draw_dtype(r)));
  auto k = std::make_shared<TensorArg>(make_tensor(c, "k", {tk, hkv, d}, kvdt));
  auto v = std::make_shared<TensorArg>(make_tensor(c, "v", {tk, hkv, d}, kvdt));
  auto out = std::make_shared<StateArg>(
      make_state(c, "out", tq, hq, d, true, draw_dtype(r), draw_base(r)));
  bool bad = false;
  auto scale = std::make_shared<float>(draw_scale(c, &bad));
  if (bad) c.reject("scale = " + std::to_string(*scale), {"scale"});
  if (*scale == 0.f) c.note("scale = 0");
  const std::vector<std::string> tok{"out.tokens"}, heads{"k.shape[1]", "out.heads", "q.shape[1]"},
      dim{"k.shape[2]", "v.shape[2]", "out.head_dim", "q.shape[2]"};
  apply_mutations(c, nmut,
                  {[&] {
                     return mutate_tensor(c, *q, {tok, heads, dim});
                   },
                   [&] {
                     return mutate_tensor(c, *k, {{"v.shape[0]"}, heads, dim});
                   },
                   [&] {
                     return mutate_tensor(
                         c, *v, {{"v.shape[0]", "k.shape[0]"}, {"k.shape[1]", "v.shape[1]"}, dim});
                   },
                   [&] { return mutate_state(c, *out, {"q"}); },
                   [&] {
                     const int f = static_cast<int>(r.range(0, 2));
                     return mutate_mismatch(c, *out,
                                            {f == 0   ? "q.shape[0]"
                                             : f == 1 ? "q.shape[1]"
                                                      : "q.shape[2]"},
                                            f);
                   },
                   [&] {  // GQA: heads_q not a multiple of heads_kv
                     if (hkv < 2) return false;
                     q->t.shape[1] = hq + 1;
                     out->v.heads = hq + 1;
                     c.reject("q heads not a multiple of k heads", {"k.shape[1]", "q.shape[1]"});
                     return true;
                   },
                   [&] {
                     const ConstTensorView& in = r.coin(34) ? q->t : r.coin(50) ? k->t : v->t;
                     return mutate_overlap(c, *out,
                                           in.data == q->t.data   ? "q"
                                           : in.data == k->t.data ? "k"
                                                                  : "v",
                                           in.data, tensor_bytes_small(in));
                   }});
  maybe_wild(c, {[q](void* p) { q->t.data = p; }, [k](void* p) { k->t.data = p; },
                 [v](void* p) { v->t.data = p; }, [out](void* p) { out->v.o = p; },
                 [out](void* p) { out->v.lse = static_cast<float*>(p); }});
  if (!c.expect_reject) allow_state(c, out->v, out->v.o, out->v.lse);
  c.note(describe(*q, c));
  c.note(describe(*k, c));
  c.note(describe(*v, c));
  c.note(describe(*out, c));
  c.note("scale " + std::to_string(*scale));
  return {"attnstate::cpu::attention_state", [q, k, v, scale, out] {
            attnstate::cpu::attention_state(q->t, k->t, v->t, *scale, out->v);
          }};
}

/// A paged KV pool in the arena (K and V), with the page-table fields unset.
struct PoolArg {
  attnstate::PagedKvCache kv;
  i64 k_off = 0, v_off = 0, pool_bytes = 0;
};

/// Valid dequantisation scales of an fp8 pool (`PoolArg::kv` already fp8): for each of K and V a
/// host value, a pointer to one scale or per-head scales (stride 1 or 2), the pointed-to ones
/// written into the arena as inputs.
inline void draw_kv_scales(Ctx& c, PoolArg& p) {
  Rng& r = c.rng;
  const char* names[2] = {"kv.k_scale", "kv.v_scale"};
  attnstate::KvScale* scales[2] = {&p.kv.k_scale, &p.kv.v_scale};
  for (int i = 0; i < 2; ++i) {
    const i64 kind = r.range(0, 2), stride = kind == 2 ? r.range(1, 2) : 0;
    const auto value = [&r] { return r.pick<float>({1.f, 0x1p-10f, 0x1p8f, 0.37f}); };
    if (kind == 0) {
      *scales[i] = attnstate::KvScale::per_tensor(value());
      continue;
    }
    const i64 n = kind == 1 ? 1 : (p.kv.heads_kv - 1) * stride + 1;
    const i64 off = c.alloc(names[i], 4 * n, true);
    for (i64 j = 0; j < n; ++j) c.put(off + 4 * j, value());
    *scales[i] = attnstate::KvScale{1.f, static_cast<const float*>(c.ptr(off)), stride};
  }
}

inline PoolArg make_pool(Ctx& c, i64 hkv, i64 d) {
  Rng& r = c.rng;
  PoolArg p;
  attnstate::PagedKvCache& kv = p.kv;
  kv.dtype = draw_dtype(r);
  kv.layout = r.coin(50) ? attnstate::KvLayout::kNHD : attnstate::KvLayout::kHND;
  kv.num_pages = r.range(1, 5);
  kv.page_size = r.range(1, 4);
  kv.heads_kv = hkv;
  kv.head_dim = d;
  kv.page_stride = r.coin(60) ? 0 : kv.page_size * hkv * d + r.range(0, 5);
  kv.space = c.space;
  if (r.coin(25)) kv.dtype = r.pick({DType::kE4M3, DType::kE5M2});  // an fp8 cache, scaled
  if (attnstate::is_fp8(kv.dtype)) draw_kv_scales(c, p);
  p.pool_bytes = kv.num_pages * kv.page_elems() * es(kv.dtype);
  p.k_off = c.alloc("kv.k", p.pool_bytes, true);
  p.v_off = c.alloc("kv.v", p.pool_bytes, true);
  fill_values(c, p.k_off, p.pool_bytes, kv.dtype);
  fill_values(c, p.v_off, p.pool_bytes, kv.dtype);
  kv.k = c.ptr(p.k_off);
  kv.v = c.ptr(p.v_off);
  return p;
}

/// Bytes of the scales a pool points to (0 for none).
inline i64 scale_bytes(const attnstate::KvScale& s, i64 heads_kv) {
  return s.data == nullptr ? 0 : 4 * ((heads_kv - 1) * s.head_stride + 1);
}

/// Hard mutations of a pool's dequantisation scales (CPU decode and cascade): an invalid host
/// value, a scale on a pool that is not fp8, an invalid pointed-to scale (read on the host), a
/// negative head stride, a value beside a pointer, out over the scales.
inline std::vector<std::function<bool()>> scale_mutations(Ctx& c, std::shared_ptr<PoolArg> p,
                                                          std::shared_ptr<StateArg> out) {
  Rng& r = c.rng;
  attnstate::PagedKvCache& kv = p->kv;
  const auto pick = [&r, &kv](const char** name) {
    const bool k = r.coin(50);
    *name = k ? "kv.k_scale" : "kv.v_scale";
    return k ? &kv.k_scale : &kv.v_scale;
  };
  std::vector<std::function<bool()>> muts = {
      [&c, &r, &kv, pick] {
        if (!attnstate::is_fp8(kv.dtype)) return false;
        const char* name = nullptr;
        *pick(&name) =
            attnstate::KvScale::per_tensor(r.pick<float>({0.f, -0.f, -1.f, NAN, INFINITY}));
        c.reject(std::string(name) + ".value invalid", {name});
        return true;
      },
      [&c, &r, &kv, pick] {
        if (attnstate::is_fp8(kv.dtype)) return false;
        const char* name = nullptr;
        attnstate::KvScale* s = pick(&name);
        if (r.coin(50)) {
          s->value = r.pick<float>({2.f, 0.5f, 0x1p-10f});
        } else {
          s->data = static_cast<const float*>(kv.k);  // any readable float: never read
          s->head_stride = r.range(0, 1);
        }
        c.reject(std::string(name) + " on a pool that is not fp8", {name});
        return true;
      },
      [&c, &r, &kv, pick] {
        const char* name = nullptr;
        attnstate::KvScale* s = pick(&name);
        if (!attnstate::is_fp8(kv.dtype) || s->data == nullptr ||
            c.space != attnstate::MemorySpace::kHost || kv.heads_kv < 1 || kv.heads_kv > 64)
          return false;
        const i64 h = s->head_stride == 0 ? 0 : r.range(0, kv.heads_kv - 1);
        c.put_at(s->data + h * s->head_stride, r.pick<float>({0.f, -2.f, NAN, -INFINITY}));
        c.reject(std::string(name) + ".data[" + str(h * s->head_stride) + "] invalid", {name},
                 false);
        return true;
      },
      [&c, &r, &kv, pick] {
        const char* name = nullptr;
        attnstate::KvScale* s = pick(&name);
        if (!attnstate::is_fp8(kv.dtype)) return false;
        if (s->data == nullptr) {  // any stride without data
          s->head_stride = r.pick<i64>({-1, kI64Min, 1, 2});
          c.reject(std::string(name) + ".head_stride without data", {name});
        } else if (r.coin(50)) {  // negative, or a span past 2^62 bytes
          s->head_stride = r.pick<i64>({-1, kI64Min, k2p62, kI64Max});
          if (kv.heads_kv == 1 && s->head_stride > 0) return false;  // one head: never stepped
          c.reject(std::string(name) + ".head_stride = " + str(s->head_stride),
                   {name, "kv.heads_kv"});
        } else {  // a value beside the pointer
          s->value = r.pick<float>({2.f, 0.f, NAN});
          c.reject(std::string(name) + ".value beside data", {name});
        }
        return true;
      },
      [&c, &r, &kv, out] {
        const attnstate::KvScale& s = r.coin(50) ? kv.k_scale : kv.v_scale;
        if (kv.heads_kv < 1 || kv.heads_kv > 64) return false;
        // A stride another mutation made invalid is rejected for itself; its span would overflow.
        if (s.data != nullptr && (s.head_stride < 0 || s.head_stride > (i64{1} << 32)))
          return false;
        return mutate_overlap(c, *out, s.data == kv.k_scale.data ? "kv.k_scale" : "kv.v_scale",
                              s.data, scale_bytes(s, kv.heads_kv));
      },
  };
  for (std::size_t i = 0; i < muts.size(); ++i)
    muts[i] = [&c, i, m = muts[i]] { return c.touch("scale#" + std::to_string(i)) && m(); };
  return muts;
}

/// Hard mutations of a pool's shape fields (shared by decode and cascade).
inline std::vector<std::function<bool()>> pool_mutations(Ctx& c, std::shared_ptr<PoolArg> p,
                                                         bool q_checked_against_heads) {
  Rng& r = c.rng;
  attnstate::PagedKvCache& kv = p->kv;
  std::vector<std::function<bool()>> muts = {
      [&c, &r, &kv] {  // a pool past 2^62 bytes even of 1-byte (fp8) elements: rejected, not read
        const int f = static_cast<int>(r.range(0, 2));
        if (f == 0) kv.num_pages = r.pick<i64>({k2p62 + 1, kI64Max});
        if (f == 1) kv.page_stride = r.pick<i64>({k2p62 + 1, kI64Max});
        if (f == 2) kv.page_size = r.pick<i64>({k2p62 + 1, kI64Max});
        c.reject(std::string("kv.") +
                     (f == 0   ? "num_pages"
                      : f == 1 ? "page_stride"
                               : "page_size") +
                     " huge (pool past 2^62 bytes)",
                 {f == 0   ? "kv.num_pages"
                  : f == 1 ? "kv.page_stride"
                           : "kv.page_size",
                  "kv.page_stride"});
        return true;
      },
      [&c, &r, &kv] {
        kv.num_pages = r.pick<i64>({-1, kI64Min});
        c.reject("kv.num_pages < 0", {"kv.num_pages"});
        return true;
      },
      [&c, &r, &kv] {
        kv.page_size = r.pick<i64>({0, -1, kI64Min});
        c.reject("kv.page_size < 1", {"kv.page_size"});
        return true;
      },
      [&c, &r, &kv, q_checked_against_heads] {
        kv.heads_kv = r.pick<i64>({0, -1, kI64Min, k2p62 + 1});
        c.reject("kv.heads_kv = " + str(kv.heads_kv),
                 {"kv.heads_kv", "kv.page_stride", "q.shape[2]"});
        (void)q_checked_against_heads;
        return true;
      },
      [&c, &r, &kv] {
        kv.head_dim = r.pick<i64>({0, -1, kI64Min, k2p62 + 1, kv.head_dim + 1});
        c.reject("kv.head_dim = " + str(kv.head_dim),
                 {"kv.head_dim", "kv.page_stride", "q.shape[3]", "out.head_dim"});
        return true;
      },
      [&c, &r, &kv] {
        if (kv.page_size < 1 || kv.page_size > 64 || kv.heads_kv < 1 || kv.heads_kv > 64 ||
            kv.head_dim < 1 || kv.head_dim > 64 || kv.page_size * kv.heads_kv * kv.head_dim < 2 ||
            !c.touch("kv#page_stride"))
          return false;
        kv.page_stride = r.range(1, kv.page_size * kv.heads_kv * kv.head_dim - 1);
        c.reject("kv.page_stride < a page", {"kv.page_stride"});
        return true;
      },
      [&c, &r, &kv] {
        kv.page_stride = r.pick<i64>({-1, kI64Min});
        c.reject("kv.page_stride < 0", {"kv.page_stride"});
        return true;
      },
      [&c, &r, &kv] {
        kv.dtype = static_cast<DType>(r.range(5, 255));
        c.reject("kv.dtype invalid", {"kv.dtype"});
        return true;
      },
      [&c, &r, &kv] {
        kv.layout = static_cast<attnstate::KvLayout>(r.range(2, 255));
        c.reject("kv.layout invalid", {"kv.layout"});
        return true;
      },
      [&c, &r, &kv] {
        kv.space = r.coin(70) ? c.other_space() : static_cast<MemorySpace>(r.range(2, 255));
        c.reject("kv.space", {"kv.space"});
        return true;
      },
      [&c, &r, &kv] {
        if (es(kv.dtype) < 2) return false;
        const bool k = r.coin(50);
        (k ? kv.k : kv.v) =
            reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(k ? kv.k : kv.v) + 1);
        c.reject(std::string(k ? "kv.k" : "kv.v") + " misaligned", {k ? "kv.k" : "kv.v"}, false);
        return true;
      },
  };
  // each at most once per case, so that two never cancel
  for (std::size_t i = 0; i < muts.size(); ++i)
    muts[i] = [&c, i, m = muts[i]] { return c.touch("kv#" + std::to_string(i)) && m(); };
  return muts;
}

inline std::string describe(const attnstate::PagedKvCache& kv, const Ctx& c) {
  std::ostringstream os;
  os << "kv{dtype " << static_cast<int>(kv.dtype) << ", layout " << static_cast<int>(kv.layout)
     << ", num_pages " << kv.num_pages << ", page_size " << kv.page_size << ", heads_kv "
     << kv.heads_kv << ", head_dim " << kv.head_dim << ", page_stride " << kv.page_stride
     << ", batch " << kv.batch << ", k @" << c.off_of(kv.k) << ", v @" << c.off_of(kv.v)
     << ", indptr @" << c.off_of(kv.page_indptr) << ", indices @" << c.off_of(kv.page_indices)
     << ", block_table @" << c.off_of(kv.block_table) << " stride " << kv.block_table_stride
     << ", seq_lens @" << c.off_of(kv.seq_lens) << ", space " << static_cast<int>(kv.space);
  for (const attnstate::KvScale* s : {&kv.k_scale, &kv.v_scale})
    os << (s == &kv.k_scale ? ", k_scale {" : ", v_scale {") << s->value << ", @"
       << (s->data != nullptr ? c.off_of(s->data) : -1) << ", stride " << s->head_stride << "}";
  os << "}";
  return os.str();
}

/// The attention sinks of a decode or cascade call over `heads` query heads: none in about half
/// the cases, else `heads` finite logits in the arena.
struct SinksArg {
  attnstate::AttentionSinks s;
  i64 heads = 0;
  i64 off = -1;  ///< Of the logits in the arena (-1: none).
};

inline std::shared_ptr<SinksArg> draw_sinks(Ctx& c, i64 heads) {
  auto a = std::make_shared<SinksArg>();
  a->heads = heads;
  if (c.rng.coin(50)) return a;
  a->off = c.alloc("sinks.logits", heads * 4, true);
  for (i64 h = 0; h < heads; ++h)
    c.put<float>(a->off + 4 * h, c.rng.coin(10)
                                     ? static_cast<float>(c.rng.pick<i64>({-80, 80}))
                                     : static_cast<float>(c.rng.range(-500, 500)) / 100.f);
  a->s.logits = static_cast<const float*>(c.ptr(a->off));
  return a;
}

/// Hard mutations of the sinks: a NaN or infinite logit (-inf too: none() passes no sinks), a
/// misaligned pointer, `out` over the logits.
inline std::vector<std::function<bool()>> sink_mutations(Ctx& c, std::shared_ptr<SinksArg> a,
                                                         std::shared_ptr<StateArg> out) {
  return {
      [&c, a] {
        if (a->off < 0) return false;
        const i64 h = c.rng.range(0, a->heads - 1);
        const float x = c.rng.pick<float>({NAN, INFINITY, -INFINITY});
        c.put<float>(a->off + 4 * h, x);
        c.reject("sinks.logits[" + str(h) + "] = " + std::to_string(x), {"sinks.logits"});
        return true;
      },
      [&c, a] {
        if (a->off < 0 || !c.touch("sinks#ptr")) return false;
        a->s.logits = static_cast<const float*>(c.ptr(a->off + c.rng.range(1, 3)));
        c.reject("sinks.logits misaligned", {"sinks.logits"}, false);
        return true;
      },
      [&c, a, out] {
        if (a->off < 0) return false;
        return mutate_overlap(c, *out, "sinks.logits", a->s.logits, a->heads * 4);
      },
  };
}

/// The page tables of a paged cache drawn into the arena: CSR (`indptr` and `indices`) or a
/// block table of `width` columns, each request a few pages of the pool and a length within them.
struct TablesArg {
  bool csr = false;
  i64 width = 0;
  std::vector<std::int32_t> lens, indptr{0}, indices, table;
  i64 lens_off = -1, ip_off = -1, ix_off = -1, bt_off = -1;
};

/// Draws the tables of `batch` requests over `kv`'s pool (`num_pages`, `page_size` set) and
/// points `kv`'s table fields at them (a `PagedKvCache` or an `MlaKvCache`: the same fields).
template <class Cache>
std::shared_ptr<TablesArg> draw_tables(Ctx& c, Cache& kv, i64 batch) {
  Rng& r = c.rng;
  auto t = std::make_shared<TablesArg>();
  kv.batch = batch;
  // per request: its pages and a length within them
  t->csr = r.coin(50);
  t->lens.resize(static_cast<std::size_t>(batch));
  t->width = r.range(1, 3);
  for (i64 b = 0; b < batch; ++b) {
    const i64 np = t->csr ? r.range(0, 3) : t->width;
    for (i64 i = 0; i < np; ++i) {
      const auto id = static_cast<std::int32_t>(r.range(0, kv.num_pages - 1));
      (t->csr ? t->indices : t->table).push_back(id);
    }
    if (t->csr) t->indptr.push_back(static_cast<std::int32_t>(t->indices.size()));
    t->lens[static_cast<std::size_t>(b)] = static_cast<std::int32_t>(r.range(0, np * kv.page_size));
  }
  t->lens_off = alloc_i32(c, "kv.seq_lens", t->lens);
  kv.seq_lens = static_cast<const std::int32_t*>(c.ptr(t->lens_off));
  if (t->csr) {
    t->ip_off = alloc_i32(c, "kv.page_indptr", t->indptr);
    t->ix_off = alloc_i32(c, "kv.page_indices", t->indices);
    kv.page_indptr = static_cast<const std::int32_t*>(c.ptr(t->ip_off));
    kv.page_indices = static_cast<const std::int32_t*>(c.ptr(t->ix_off));
  } else {
    t->bt_off = alloc_i32(c, "kv.block_table", t->table);
    kv.block_table = static_cast<const std::int32_t*>(c.ptr(t->bt_off));
    kv.block_table_stride = t->width;
  }
  if (batch == 0 && r.coin(30)) {  // no request: the tables are never read
    kv.seq_lens = nullptr;
    kv.page_indptr = kv.page_indices = kv.block_table = nullptr;
  }
  return t;
}

/// Hard mutations of drawn tables: a negative length, a length past the request's pages, a page
/// id outside the pool, bad CSR offsets, both tables or neither, a bad block-table stride.
template <class Cache>
std::vector<std::function<bool()>> table_mutations(Ctx& c, Cache& kv, std::shared_ptr<TablesArg> t,
                                                   i64 batch) {
  return {
      [&c, &kv, t, batch] {
        Rng& r = c.rng;
        if (batch < 1) return false;
        const i64 b = r.range(0, batch - 1);
        c.put<std::int32_t>(t->lens_off + 4 * b, r.pick<std::int32_t>({-1, INT32_MIN}));
        c.reject("seq_lens[" + str(b) + "] < 0", {"kv.seq_lens"});
        return true;
      },
      [&c, &kv, t, batch] {  // a length past the request's pages
        Rng& r = c.rng;
        if (batch < 1 || kv.page_size < 1 || kv.page_size > 64) return false;
        const i64 b = r.range(0, batch - 1);
        const i64 np = t->csr ? t->indptr[static_cast<std::size_t>(b + 1)] -
                                    t->indptr[static_cast<std::size_t>(b)]
                              : t->width;
        c.put<std::int32_t>(
            t->lens_off + 4 * b,
            static_cast<std::int32_t>(np * kv.page_size + r.pick<i64>({1, 100, 1 << 30})));
        c.reject("seq_lens[" + str(b) + "] past its pages",
                 {"kv.seq_lens", "kv.block_table_stride", "kv.page_indptr"});
        return true;
      },
      [&c, &kv, t, batch] {  // a page id outside the pool (in a page the request uses)
        Rng& r = c.rng;
        if (batch < 1) return false;
        const i64 b = r.range(0, batch - 1);
        const i64 len = t->lens[static_cast<std::size_t>(b)];
        if (len < 1 || kv.page_size < 1 || kv.page_size > 64) return false;
        const i64 first = t->csr ? t->indptr[static_cast<std::size_t>(b)] : b * t->width;
        const i64 used = (len + kv.page_size - 1) / kv.page_size;
        const i64 pos = first + r.range(0, used - 1);
        const std::int32_t bad_id = static_cast<std::int32_t>(r.pick<i64>(
            {-1, std::min<i64>(kv.num_pages, INT32_MAX),
             std::min<i64>(kv.num_pages, INT32_MAX - 1000) + 1000, INT32_MAX, INT32_MIN}));
        c.put<std::int32_t>((t->csr ? t->ix_off : t->bt_off) + 4 * pos, bad_id);
        c.reject("page id " + std::to_string(bad_id) + " at " + str(pos),
                 {t->csr ? "kv.page_indices" : "kv.block_table"});
        return true;
      },
      [&c, &kv, t, batch] {  // non-monotone CSR offsets, or [0] != 0
        Rng& r = c.rng;
        if (!t->csr || batch < 1) return false;
        const i64 i = r.range(0, batch);
        c.put<std::int32_t>(t->ip_off + 4 * i,
                            i == 0 ? static_cast<std::int32_t>(r.pick<i64>({1, -1, 1000}))
                                   : t->indptr[static_cast<std::size_t>(i - 1)] -
                                         static_cast<std::int32_t>(r.range(1, 3)));
        c.reject("page_indptr[" + str(i) + "] bad", {"kv.page_indptr", "kv.seq_lens"});
        return true;
      },
      [&c, &kv, t, batch] {  // both tables, or neither (once: a second draw would undo the first)
        Rng& r = c.rng;
        if (batch < 1 || !c.touch("kv#tables")) return false;
        if (t->csr && r.coin(50)) {
          kv.block_table = kv.page_indices;
          kv.block_table_stride = 1;
        } else if (t->csr) {
          kv.page_indptr = kv.page_indices = nullptr;
        } else {
          kv.block_table = nullptr;
        }
        c.reject("both or neither table", {"kv.block_table", "kv.page_indptr", "kv.page_indices"},
                 false);
        return true;
      },
      [&c, &kv, t, batch] {
        Rng& r = c.rng;
        if (t->csr || batch < 1) return false;
        kv.block_table_stride = r.pick<i64>({-1, kI64Min, k2p62 + 1});
        c.reject("kv.block_table_stride = " + str(kv.block_table_stride),
                 {"kv.block_table_stride", "kv.seq_lens", "kv.block_table"});
        return true;
      },
  };
}

/// `out` over one of the tables (`which` 0: the lengths, 1, 2: the CSR arrays or the block table).
template <class Cache>
bool mutate_table_overlap(Ctx& c, StateArg& out, const Cache& kv, const TablesArg& t, i64 batch,
                          int which) {
  if (which == 0) return mutate_overlap(c, out, "kv.seq_lens", kv.seq_lens, batch * 4);
  if (t.csr)
    return which == 1 ? mutate_overlap(c, out, "kv.page_indptr", kv.page_indptr, (batch + 1) * 4)
                      : mutate_overlap(c, out, "kv.page_indices", kv.page_indices,
                                       static_cast<i64>(t.indices.size()) * 4);
  return mutate_overlap(c, out, "kv.block_table", kv.block_table,
                        static_cast<i64>(t.table.size()) * 4);
}

/// The drawn lengths and the table kind, for the case log.
inline std::string describe_tables(const TablesArg& t) {
  std::string ls;
  for (auto x : t.lens) ls += " " + std::to_string(x);
  return " seq_lens (drawn):" + ls + (t.csr ? " csr" : " block table");
}

/// A decode call: q, a paged cache with tables, out; `explicit_layout` picks the overload (the
/// options overload with attention sinks in about half the cases).
inline Built build_decode(Ctx& c, int nmut, bool explicit_layout) {
  Rng& r = c.rng;
  const i64 d = r.range(1, 8), hkv = r.range(1, 2), hq = hkv * r.range(1, 2);
  const i64 batch = r.pick<i64>({0, 1, 1, 2, 3}), qlen = r.range(1, 3);
  auto pool = std::make_shared<PoolArg>(make_pool(c, hkv, d));
  attnstate::PagedKvCache& kv = pool->kv;
  const std::shared_ptr<TablesArg> tab = draw_tables(c, kv, batch);
  const bool csr = tab->csr;
  auto q = std::make_shared<TensorArg>(make_tensor(c, "q", {batch, qlen, hq, d}, draw_dtype(r)));
  auto out = std::make_shared<StateArg>(
      make_state(c, "out", batch * qlen, hq, d, true, draw_dtype(r), draw_base(r)));
  bool bad = false;
  auto scale = std::make_shared<float>(draw_scale(c, &bad));
  if (bad) c.reject("scale = " + std::to_string(*scale), {"scale", "options.scale"});
  if (*scale == 0.f) c.uncertain = true, c.note("scale = 0 (1/sqrt(d) by the issue)");
  auto splits = std::make_shared<attnstate::SplitLayout>();
  auto options = std::make_shared<attnstate::DecodeOptions>();
  options->scale = *scale;
  if (explicit_layout) {
    if (r.coin(50)) {
      splits->policy = attnstate::SplitPolicy::kFixedCount;
      splits->num_splits = static_cast<std::int32_t>(r.range(1, 4));
      splits->max_splits = splits->num_splits;
    } else {
      splits->policy = attnstate::SplitPolicy::kFixedSize;
      splits->split_size = static_cast<std::int32_t>(16 * r.range(1, 2));
      splits->max_splits = static_cast<std::int32_t>(r.range(1, 3));
    }
  } else {
    options->policy = r.pick({attnstate::SplitPolicy::kAuto, attnstate::SplitPolicy::kFixedCount,
                              attnstate::SplitPolicy::kFixedSize});
    options->num_splits = static_cast<int>(r.range(1, 4));
    options->split_size = static_cast<int>(16 * r.range(1, 3));
  }
  std::vector<std::function<bool()>> muts = pool_mutations(c, pool, true);
  for (auto& m : scale_mutations(c, pool, out)) muts.push_back(m);
  auto sinks = explicit_layout ? std::make_shared<SinksArg>() : draw_sinks(c, hq);
  for (auto& m : sink_mutations(c, sinks, out)) muts.push_back(m);
  auto tables = decode_arg_mutations(c, r, q, out, kv, batch, {"q.shape[2]", "out.heads"}, false);
  std::vector<std::function<bool()>> own{
      [&] {
        q->t.shape[1] = r.pick<i64>({0, 9, -1});
        c.reject("q_len out of 1..8", {"q.shape[1]", "out.tokens"});
        return true;
      },
      [&] {  // out over any input: q, the pool, the tables
        const int w = static_cast<int>(r.range(0, 5));
        if (w == 0) return mutate_overlap(c, *out, "q", q->t.data, tensor_bytes_small(q->t));
        if (w == 1) return mutate_overlap(c, *out, "kv.k", kv.k, pool->pool_bytes);
        if (w == 2) return mutate_overlap(c, *out, "kv.v", kv.v, pool->pool_bytes);
        return mutate_table_overlap(c, *out, kv, *tab, batch, w - 3);
      },
  };
  tables.insert(tables.end(), own.begin(), own.end());
  for (auto& m : table_mutations(c, kv, tab, batch)) tables.push_back(m);
  if (explicit_layout) {
    tables.push_back([&] {
      const int f = static_cast<int>(r.range(0, 3));
      if (f == 0)
        splits->max_splits = static_cast<std::int32_t>(r.pick<i64>({0, -1, 513, INT32_MAX}));
      if (f == 1)
        splits->policy = r.coin(50) ? attnstate::SplitPolicy::kAuto
                                    : static_cast<attnstate::SplitPolicy>(r.range(3, 255));
      if (f == 2) {
        splits->policy = attnstate::SplitPolicy::kFixedCount;
        splits->num_splits = static_cast<std::int32_t>(r.pick<i64>({0, -1, 513}));
      }
      if (f == 3) {
        splits->policy = attnstate::SplitPolicy::kFixedSize;
        splits->split_size = static_cast<std::int32_t>(r.pick<i64>({0, -16, 17, 8}));
      }
      c.reject("bad split layout", {"splits"});
      return true;
    });
  } else {
    tables.push_back([&] {
      const int f = static_cast<int>(r.range(0, 2));
      if (f == 0) {
        options->policy = static_cast<attnstate::SplitPolicy>(r.range(3, 255));
        c.reject("options.policy invalid", {"options.policy"});
      } else if (f == 1) {
        options->policy = attnstate::SplitPolicy::kFixedCount;
        options->num_splits = static_cast<int>(r.pick<i64>({0, -1, 513, INT32_MIN}));
        c.reject("options.num_splits", {"options.num_splits"});
      } else {
        options->policy = attnstate::SplitPolicy::kFixedSize;
        options->split_size = static_cast<int>(r.pick<i64>({0, -16, 17, INT32_MIN}));
        c.reject("options.split_size", {"options.split_size"});
      }
      return true;
    });
  }
  muts.insert(muts.end(), tables.begin(), tables.end());
  apply_mutations(c, nmut, muts);
  maybe_wild(c, {[q](void* p) { q->t.data = p; }, [pool](void* p) { pool->kv.k = p; },
                 [pool](void* p) { pool->kv.v = p; }, [out](void* p) { out->v.o = p; },
                 [out](void* p) { out->v.lse = static_cast<float*>(p); }});
  if (!c.expect_reject) allow_state(c, out->v, out->v.o, out->v.lse);
  c.note(describe(kv, c) + describe_tables(*tab));
  c.note(describe(*q, c));
  c.note(describe(*out, c));
  c.note("scale " + std::to_string(*scale) + ", split policy " +
         std::to_string(static_cast<int>(explicit_layout ? splits->policy : options->policy)));
  c.note(sinks->off < 0 ? "no sinks" : "sinks @" + str(c.off_of(sinks->s.logits)));
  if (explicit_layout)
    return {"attnstate::cpu::decode", [q, pool, splits, scale, out] {
              attnstate::cpu::decode(q->t, pool->kv, *splits, *scale, out->v);
            }};
  if (sinks->off < 0)
    return {"attnstate::cpu::decode",
            [q, pool, options, out] { attnstate::cpu::decode(q->t, pool->kv, *options, out->v); }};
  return {"attnstate::cpu::decode", [q, pool, options, sinks, out] {
            attnstate::cpu::decode(q->t, pool->kv, *options, sinks->s, out->v);
          }};
}

/// A cascade call: q, a pool, 1-3 levels of segments with their tables in the arena, out;
/// attention sinks in about half the cases.
inline Built build_cascade(Ctx& c, int nmut) {
  Rng& r = c.rng;
  const i64 d = r.range(1, 8), hkv = r.range(1, 2), hq = hkv * r.range(1, 2);
  const i64 batch = r.pick<i64>({0, 1, 1, 2, 3}), qlen = r.range(1, 3);
  auto pool = std::make_shared<PoolArg>(make_pool(c, hkv, d));
  attnstate::PagedKvCache& kv = pool->kv;
  auto options = std::make_shared<attnstate::CascadeOptions>();
  options->causal = r.coin(60);
  bool bad = false;
  options->scale = draw_scale(c, &bad);
  if (bad) c.reject("options.scale", {"options.scale"});
  if (batch == 0) {  // a no-op by issue 16: it may ignore the level tables
    c.uncertain = c.accept_ok = true;
    c.note("batch 0 (a no-op by the issue)");
  }
  const int nl = static_cast<int>(r.range(1, 3));
  auto levels =
      std::make_shared<std::vector<attnstate::CascadeLevel>>(static_cast<std::size_t>(nl));
  struct LevelOffs {
    i64 req, pip, pix, lens;
    std::vector<std::int32_t> req_v, pip_v, pix_v, lens_v;
  };
  auto offs = std::make_shared<std::vector<LevelOffs>>(static_cast<std::size_t>(nl));
  for (int l = 0; l < nl; ++l) {
    LevelOffs& o = (*offs)[static_cast<std::size_t>(l)];
    const i64 ns = r.range(1, 3);
    o.req_v = {0};
    for (i64 s = 1; s < ns; ++s)
      o.req_v.push_back(static_cast<std::int32_t>(r.range(o.req_v.back(), batch)));
    o.req_v.push_back(static_cast<std::int32_t>(batch));
    o.pip_v = {static_cast<std::int32_t>(r.coin(90) ? 0 : 1)};
    if (o.pip_v[0] != 0) {  // the docs allow it ("[0] >= 0"), the lead's checks demand 0
      c.uncertain = true;
      c.blame.push_back("levels[" + std::to_string(l) + "].page_indptr");
      c.note("page_indptr[0] = 1");
    }
    for (i64 i = 0; i < o.pip_v[0]; ++i)
      o.pix_v.push_back(static_cast<std::int32_t>(r.range(0, kv.num_pages - 1)));
    for (i64 s = 0; s < ns; ++s) {
      const i64 np = r.range(0, 2);
      for (i64 i = 0; i < np; ++i)
        o.pix_v.push_back(static_cast<std::int32_t>(r.range(0, kv.num_pages - 1)));
      o.pip_v.push_back(static_cast<std::int32_t>(o.pip_v.back() + np));
      i64 lo = 0;
      const bool used =
          o.req_v[static_cast<std::size_t>(s + 1)] > o.req_v[static_cast<std::size_t>(s)];
      if (options->causal && qlen > 1 && l == nl - 1 && used) lo = qlen - 1;
      const i64 hi = np * kv.page_size;
      if (lo > hi) {  // too few pages for the causal tail: take one more page or two
        const i64 more = (lo - hi + kv.page_size - 1) / kv.page_size;
        for (i64 i = 0; i < more; ++i)
          o.pix_v.push_back(static_cast<std::int32_t>(r.range(0, kv.num_pages - 1)));
        o.pip_v.back() = static_cast<std::int32_t>(o.pip_v.back() + more);
        o.lens_v.push_back(static_cast<std::int32_t>(r.range(lo, (np + more) * kv.page_size)));
      } else {
        o.lens_v.push_back(static_cast<std::int32_t>(r.range(lo, hi)));
      }
    }
    const std::string p = "levels[" + std::to_string(l) + "]";
    o.req = alloc_i32(c, p + ".request_indptr", o.req_v);
    o.pip = alloc_i32(c, p + ".page_indptr", o.pip_v);
    o.pix =
        alloc_i32(c, p + ".page_indices", o.pix_v.empty() ? std::vector<std::int32_t>{0} : o.pix_v);
    o.lens = alloc_i32(c, p + ".seg_lens", o.lens_v);
    attnstate::CascadeLevel& lv = (*levels)[static_cast<std::size_t>(l)];
    lv.num_segments = ns;
    lv.request_indptr = static_cast<const std::int32_t*>(c.ptr(o.req));
    lv.page_indptr = static_cast<const std::int32_t*>(c.ptr(o.pip));
    lv.page_indices = static_cast<const std::int32_t*>(c.ptr(o.pix));
    lv.seg_lens = static_cast<const std::int32_t*>(c.ptr(o.lens));
  }
  auto q = std::make_shared<TensorArg>(make_tensor(c, "q", {batch, qlen, hq, d}, draw_dtype(r)));
  auto out = std::make_shared<StateArg>(
      make_state(c, "out", batch * qlen, hq, d, true, draw_dtype(r), draw_base(r)));
  auto num_levels = std::make_shared<int>(nl);
  auto levels_ptr = std::make_shared<const attnstate::CascadeLevel*>(levels->data());
  std::vector<std::function<bool()>> muts = pool_mutations(c, pool, true);
  for (auto& m : scale_mutations(c, pool, out)) muts.push_back(m);
  auto sinks = draw_sinks(c, hq);
  for (auto& m : sink_mutations(c, sinks, out)) muts.push_back(m);
  const auto lvl = [&](int l, const char* f) { return "levels[" + std::to_string(l) + "]." + f; };
  const std::vector<std::string> b0{"q.shape[0]", "out.tokens", "levels"};
  std::vector<std::function<bool()>> more{
      [&] {
        return mutate_tensor(c, *q,
                             {b0,
                              {"q.shape[1]", "out.tokens", "levels"},
                              {"q.shape[2]", "out.heads"},
                              {"q.shape[3]", "out.head_dim"}});
      },
      [&] { return mutate_state(c, *out, {}); },
      [&] {
        const int f = static_cast<int>(r.range(0, 2));
        return mutate_mismatch(c, *out, {f == 0 ? "q" : f == 1 ? "q.shape[2]" : "q.shape[3]"}, f);
      },
      [&] {
        *num_levels = static_cast<int>(r.pick<i64>({0, -1, 9, INT32_MAX, INT32_MIN}));
        c.reject("num_levels = " + std::to_string(*num_levels), {"num_levels"});
        return true;
      },
      [&] {
        *levels_ptr = nullptr;
        c.reject("levels = null", {"levels"}, false);
        return true;
      },
      [&] {
        const int l = static_cast<int>(r.range(0, nl - 1));
        attnstate::CascadeLevel& lv = (*levels)[static_cast<std::size_t>(l)];
        lv.num_segments = r.pick<i64>({0, -1, kI64Min, (i64{1} << 31), kI64Max});
        c.reject(lvl(l, "num_segments") + " = " + str(lv.num_segments), {lvl(l, "num_segments")});
        return true;
      },
      [&] {
        const int l = static_cast<int>(r.range(0, nl - 1));
        attnstate::CascadeLevel& lv = (*levels)[static_cast<std::size_t>(l)];
        const int f = static_cast<int>(r.range(0, 3));
        const char* names[4] = {"request_indptr", "page_indptr", "page_indices", "seg_lens"};
        if (f == 2 && (*offs)[static_cast<std::size_t>(l)].pip_v.back() == 0) return false;
        const std::int32_t** fields[4] = {&lv.request_indptr, &lv.page_indptr, &lv.page_indices,
                                          &lv.seg_lens};
        *fields[f] = nullptr;
        c.reject(lvl(l, names[f]) + " = null", {lvl(l, names[f])}, false);
        return true;
      },
      [&] {  // request grouping: [0] != 0, [ns] != batch, or a decrease
        const int l = static_cast<int>(r.range(0, nl - 1));
        LevelOffs& o = (*offs)[static_cast<std::size_t>(l)];
        const i64 ns = static_cast<i64>(o.lens_v.size());
        const i64 i = r.range(0, ns);
        const std::int32_t old = o.req_v[static_cast<std::size_t>(i)];
        // [0] != 0, [ns] != batch, or an interior decrease (a change within bounds stays valid)
        const std::int32_t x = static_cast<std::int32_t>(
            i == 0    ? r.pick<i64>({1, -1, 1 << 30})
            : i == ns ? batch + r.pick<i64>({1, -1})
                      : o.req_v[static_cast<std::size_t>(i - 1)] - r.range(1, 3));
        c.put<std::int32_t>(o.req + 4 * i, x);
        c.reject(lvl(l, "request_indptr") + "[" + str(i) + "] " + std::to_string(old) + " -> " +
                     std::to_string(x),
                 {lvl(l, "request_indptr")});
        return true;
      },
      [&] {  // page offsets: negative start or a decrease
        const int l = static_cast<int>(r.range(0, nl - 1));
        LevelOffs& o = (*offs)[static_cast<std::size_t>(l)];
        const i64 ns = static_cast<i64>(o.lens_v.size());
        const i64 i = r.range(0, ns);
        const std::int32_t x = i == 0 ? -1 : o.pip_v[static_cast<std::size_t>(i - 1)] - 1;
        c.put<std::int32_t>(o.pip + 4 * i, x);
        c.reject(lvl(l, "page_indptr") + "[" + str(i) + "] = " + std::to_string(x),
                 {lvl(l, "page_indptr"), lvl(l, "seg_lens")});
        return true;
      },
      [&] {  // a segment longer than its pages, or negative
        const int l = static_cast<int>(r.range(0, nl - 1));
        LevelOffs& o = (*offs)[static_cast<std::size_t>(l)];
        const i64 s = r.range(0, static_cast<i64>(o.lens_v.size()) - 1);
        if (kv.page_size < 1 || kv.page_size > 64) return false;
        const i64 pages =
            o.pip_v[static_cast<std::size_t>(s + 1)] - o.pip_v[static_cast<std::size_t>(s)];
        const std::int32_t x = static_cast<std::int32_t>(
            r.coin(50) ? -1 : pages * kv.page_size + r.pick<i64>({1, 1 << 30}));
        c.put<std::int32_t>(o.lens + 4 * s, x);
        c.reject(lvl(l, "seg_lens") + "[" + str(s) + "] = " + std::to_string(x),
                 {lvl(l, "seg_lens")});
        return true;
      },
      [&] {  // a page id outside the pool in a page a segment uses
        const int l = static_cast<int>(r.range(0, nl - 1));
        LevelOffs& o = (*offs)[static_cast<std::size_t>(l)];
        const i64 s = r.range(0, static_cast<i64>(o.lens_v.size()) - 1);
        const i64 len = o.lens_v[static_cast<std::size_t>(s)];
        if (len < 1 || kv.page_size < 1 || kv.page_size > 64) return false;
        const i64 pos = o.pip_v[static_cast<std::size_t>(s)] +
                        r.range(0, (len + kv.page_size - 1) / kv.page_size - 1);
        const std::int32_t x =
            static_cast<std::int32_t>(r.pick<i64>({-1, kv.num_pages, INT32_MAX, INT32_MIN}));
        c.put<std::int32_t>(o.pix + 4 * pos, x);
        c.reject(lvl(l, "page_indices") + "[" + str(pos) + "] = " + std::to_string(x),
                 {lvl(l, "page_indices")});
        return true;
      },
      [&] {  // out over an input: q, the pool (the data-loss bug of issue 16), a level's arrays
        const int w = static_cast<int>(r.range(0, 3));
        if (w == 0) return mutate_overlap(c, *out, "q", q->t.data, tensor_bytes_small(q->t));
        if (w == 1) return mutate_overlap(c, *out, "kv.k", kv.k, pool->pool_bytes);
        if (w == 2) return mutate_overlap(c, *out, "kv.v", kv.v, pool->pool_bytes);
        const int l = static_cast<int>(r.range(0, nl - 1));
        LevelOffs& o = (*offs)[static_cast<std::size_t>(l)];
        const int f = static_cast<int>(r.range(0, 3));
        // a level without pages has no page_indices (the arena's placeholder word is no input)
        if (f == 2 && o.pix_v.empty()) return false;
        const i64 off = f == 0 ? o.req : f == 1 ? o.pip : f == 2 ? o.pix : o.lens;
        const i64 n = f == 0   ? static_cast<i64>(o.req_v.size())
                      : f == 1 ? static_cast<i64>(o.pip_v.size())
                      : f == 2 ? static_cast<i64>(o.pix_v.size())
                               : static_cast<i64>(o.lens_v.size());
        const bool ok =
            mutate_overlap(c, *out, "levels[" + std::to_string(l) + "]", c.ptr(off), n * 4);
        if (ok) c.blame.push_back("levels");
        return ok;
      },
  };
  muts.insert(muts.end(), more.begin(), more.end());
  apply_mutations(c, nmut, muts);
  maybe_wild(c, {[q](void* p) { q->t.data = p; }, [pool](void* p) { pool->kv.k = p; },
                 [pool](void* p) { pool->kv.v = p; }, [out](void* p) { out->v.o = p; },
                 [out](void* p) { out->v.lse = static_cast<float*>(p); }});
  if (!c.expect_reject) allow_state(c, out->v, out->v.o, out->v.lse);
  c.note(describe(kv, c));
  for (int l = 0; l < nl; ++l) {
    const LevelOffs& o = (*offs)[static_cast<std::size_t>(l)];
    std::string s = "level " + std::to_string(l) + ": request_indptr";
    for (auto x : o.req_v) s += " " + std::to_string(x);
    s += "; page_indptr";
    for (auto x : o.pip_v) s += " " + std::to_string(x);
    s += "; page_indices";
    for (auto x : o.pix_v) s += " " + std::to_string(x);
    s += "; seg_lens";
    for (auto x : o.lens_v) s += " " + std::to_string(x);
    c.note(s + " (as drawn)");
  }
  c.note(describe(*q, c));
  c.note(describe(*out, c));
  c.note("scale " + std::to_string(options->scale) + (options->causal ? ", causal" : ""));
  c.note(sinks->off < 0 ? "no sinks" : "sinks @" + str(c.off_of(sinks->s.logits)));
  if (sinks->off < 0)
    return {"attnstate::cpu::cascade_attention",
            [q, pool, levels, levels_ptr, num_levels, options, out] {
              attnstate::cpu::cascade_attention(q->t, pool->kv, *levels_ptr, *num_levels, *options,
                                                out->v);
            }};
  return {"attnstate::cpu::cascade_attention",
          [q, pool, levels, levels_ptr, num_levels, options, sinks, out] {
            attnstate::cpu::cascade_attention(q->t, pool->kv, *levels_ptr, *num_levels, *options,
                                              sinks->s, out->v);
          }};
}

}  // namespace attnstate_fuzz
