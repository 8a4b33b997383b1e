/// @file fuzz_mla_cases.hpp
/// @brief Fuzz cases of the CPU MLA decode: a paged latent cache (two parts of their own dtypes,
///        strides and fp8 scales) with its tables, the two query views and the output, mutated.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attnstate/core/mla.hpp"
#include "attnstate/cpu/mla.hpp"
#include "fuzz_producer_cases.hpp"

namespace attnstate_fuzz {

/// One part of a latent pool (`ckv` or `kpe`) in the arena.
struct MlaPartArg {
  i64 off = 0, bytes = 0, width = 0;
};

/// Draws a part named `kv.<part>` of `width` columns: a dtype (fp8 with a per-tensor scale, a
/// host value or a pointer into the arena), dense or padded strides, its pool in the arena.
inline MlaPartArg make_mla_part(Ctx& c, attnstate::MlaKvCache& kv, const std::string& part,
                                i64 width, const void** ptr, DType* dtype,
                                attnstate::KvScale* scale, i64* token_stride, i64* page_stride) {
  Rng& r = c.rng;
  MlaPartArg a;
  a.width = width;
  *dtype = r.pick({DType::kF32, DType::kF16, DType::kBF16, DType::kE4M3, DType::kE5M2});
  if (attnstate::is_fp8(*dtype)) {
    const float v = r.pick<float>({1.f, 0x1p-10f, 0x1p8f, 0.37f});
    if (r.coin(50)) {
      *scale = attnstate::KvScale::per_tensor(v);
    } else {
      const i64 off = c.alloc("kv." + part + "_scale", 4, true);
      c.put<float>(off, v);
      *scale = attnstate::KvScale::per_tensor_at(static_cast<const float*>(c.ptr(off)));
    }
  }
  *token_stride = r.coin(60) ? 0 : width + r.range(0, 3);
  const i64 row = *token_stride != 0 ? *token_stride : width;
  *page_stride = r.coin(60) ? 0 : kv.page_size * row + r.range(0, 5);
  const i64 page = *page_stride != 0 ? *page_stride : kv.page_size * row;
  a.bytes = ((kv.num_pages - 1) * page + (kv.page_size - 1) * row + width) * es(*dtype);
  a.off = c.alloc("kv." + part, a.bytes, true);
  fill_values(c, a.off, a.bytes, *dtype);
  *ptr = c.ptr(a.off);
  return a;
}

/// An MLA decode call: q_nope, q_pe, a latent cache with tables, out; `explicit_layout` picks the
/// overload (the options overload with attention sinks in about half the cases).
inline Built build_mla(Ctx& c, int nmut, bool explicit_layout) {
  Rng& r = c.rng;
  const i64 rank = r.range(1, 8), rope = r.range(1, 4), heads = r.range(1, 3);
  const i64 batch = r.pick<i64>({0, 1, 1, 2, 3}), qlen = r.range(1, 3);
  auto kv = std::make_shared<attnstate::MlaKvCache>();
  kv->space = c.space;
  kv->kv_lora_rank = rank;
  kv->rope_dim = rope;
  kv->num_pages = r.range(1, 5);
  kv->page_size = r.range(1, 4);
  auto ckv = std::make_shared<MlaPartArg>(
      make_mla_part(c, *kv, "ckv", rank, &kv->ckv, &kv->ckv_dtype, &kv->ckv_scale,
                    &kv->ckv_token_stride, &kv->ckv_page_stride));
  auto kpe = std::make_shared<MlaPartArg>(
      make_mla_part(c, *kv, "kpe", rope, &kv->kpe, &kv->kpe_dtype, &kv->kpe_scale,
                    &kv->kpe_token_stride, &kv->kpe_page_stride));
  const std::shared_ptr<TablesArg> tab = draw_tables(c, *kv, batch);
  const DType qdt = draw_dtype(r);
  auto qn = std::make_shared<TensorArg>(make_tensor(c, "q_nope", {batch, qlen, heads, rank}, qdt));
  auto qp = std::make_shared<TensorArg>(make_tensor(c, "q_pe", {batch, qlen, heads, rope}, qdt));
  auto out = std::make_shared<StateArg>(
      make_state(c, "out", batch * qlen, heads, rank, true, draw_dtype(r), draw_base(r)));
  bool bad = false;
  auto scale = std::make_shared<float>(draw_scale(c, &bad));
  if (bad) c.reject("scale = " + std::to_string(*scale), {"scale", "options.scale"});
  auto splits = std::make_shared<attnstate::SplitLayout>();
  auto options = std::make_shared<attnstate::DecodeOptions>();
  options->scale = *scale;
  if (explicit_layout) {
    splits->policy = attnstate::SplitPolicy::kFixedCount;
    splits->num_splits = static_cast<std::int32_t>(r.range(1, 4));
    splits->max_splits = splits->num_splits;
  } else {
    options->policy = r.pick({attnstate::SplitPolicy::kAuto, attnstate::SplitPolicy::kFixedCount,
                              attnstate::SplitPolicy::kFixedSize});
    options->num_splits = static_cast<int>(r.range(1, 4));
    options->split_size = static_cast<int>(16 * r.range(1, 3));
  }
  auto sinks = explicit_layout ? std::make_shared<SinksArg>() : draw_sinks(c, heads);
  const std::vector<std::string> b0{"kv.batch", "q_nope.shape[0]", "q_pe.shape[0]", "out.tokens"};
  const std::vector<std::string> b1{"q_nope.shape[1]", "q_pe.shape[1]", "out.tokens"};
  const std::vector<std::string> b2{"q_nope.shape[2]", "q_pe.shape[2]", "out.heads"};
  std::vector<std::function<bool()>> muts = table_mutations(c, *kv, tab, batch);
  for (auto& m : sink_mutations(c, sinks, out)) muts.push_back(m);
  const std::vector<std::function<bool()>> own{
      [&] {
        return mutate_tensor(c, *qn, {b0, b1, b2, {"kv.kv_lora_rank", "out.head_dim"}});
      },
      [&] {
        return mutate_tensor(c, *qp, {b0, b1, b2, {"kv.rope_dim"}});
      },
      [&] { return mutate_state(c, *out, {}); },
      [&] {
        const int f = static_cast<int>(r.range(0, 2));
        return mutate_mismatch(c, *out,
                               {f == 0   ? "q_nope"
                                : f == 1 ? "q_nope.shape[2]"
                                         : "q_nope.shape[3]",
                                "kv.kv_lora_rank"},
                               f);
      },
      [&] {
        if (!c.touch("q_pe#dtype")) return false;  // (mutate_tensor's key for q_pe's dtype)
        qp->t.dtype = qdt == DType::kF32 ? DType::kBF16 : DType::kF32;
        c.reject("q_pe.dtype != q_nope.dtype", {"q_pe.dtype", "q_pe.data"});
        return true;
      },
      [&] {
        if (!c.touch("kv#batch")) return false;
        kv->batch = r.pick<i64>({-1, kI64Min, batch + 1, k2p62 + 1});
        c.reject("kv.batch = " + str(kv->batch),
                 {"kv.batch", "q_nope.shape[0]", "kv.seq_lens", "kv.block_table", "kv.page_indptr",
                  "kv.page_indices"});
        return true;
      },
      [&] {  // a part's strides below its width or its page, or past 2^62
        const bool latent = r.coin(50);
        const std::string p = latent ? "kv.ckv" : "kv.kpe";
        i64& ts = latent ? kv->ckv_token_stride : kv->kpe_token_stride;
        i64& ps = latent ? kv->ckv_page_stride : kv->kpe_page_stride;
        if (!c.touch(p + "#strides")) return false;
        if (r.coin(50)) {
          ts = r.pick<i64>({-1, kI64Min, (latent ? rank : rope) > 1 ? 1 : -2});
          c.reject(p + "_token_stride = " + str(ts), {p + "_token_stride"});
        } else {
          // past 2^62 only overflows the span with a second page
          ps = kv->num_pages > 1 ? r.pick<i64>({-1, kI64Min, k2p62 + 1})
                                 : r.pick<i64>({-1, kI64Min});
          c.reject(p + "_page_stride = " + str(ps), {p + "_page_stride", "kv.num_pages"});
        }
        return true;
      },
      [&] {  // widths, pages
        if (!c.touch("kv#shape")) return false;
        const int f = static_cast<int>(r.range(0, 3));
        if (f == 0) kv->kv_lora_rank = r.pick<i64>({0, -1, kI64Min});
        if (f == 1) kv->rope_dim = r.pick<i64>({0, -1, k2p62 + 1});
        if (f == 2) kv->page_size = r.pick<i64>({0, -1, kI64Min});
        if (f == 3) kv->num_pages = r.pick<i64>({-1, kI64Min});
        c.reject("kv shape field",
                 {"kv.kv_lora_rank", "kv.rope_dim", "kv.page_size", "kv.num_pages",
                  "q_nope.shape[3]", "q_pe.shape[3]", "kv.ckv", "kv.kpe", "out.head_dim"});
        return true;
      },
      [&] {  // a part's dtype or scale
        const bool latent = r.coin(50);
        const std::string p = latent ? "kv.ckv" : "kv.kpe";
        if (!c.touch(p + "#dtype")) return false;
        DType& dt = latent ? kv->ckv_dtype : kv->kpe_dtype;
        attnstate::KvScale& s = latent ? kv->ckv_scale : kv->kpe_scale;
        if (r.coin(30)) {
          dt = static_cast<DType>(r.range(5, 255));
          c.reject(p + "_dtype invalid", {p + "_dtype"});
        } else if (!attnstate::is_fp8(dt)) {
          s = attnstate::KvScale::per_tensor(2.f);
          c.reject(p + "_scale on a part that is not fp8", {p + "_scale"});
        } else {
          s = attnstate::KvScale::per_tensor(r.pick<float>({0.f, -1.f, NAN, INFINITY}));
          c.reject(p + "_scale.value invalid", {p + "_scale"});
        }
        return true;
      },
      [&] {  // a part's pointer null or misaligned
        const bool latent = r.coin(50);
        const std::string p = latent ? "kv.ckv" : "kv.kpe";
        if (!c.touch(p + "#ptr")) return false;
        const void*& ptr = latent ? kv->ckv : kv->kpe;
        const DType dt = latent ? kv->ckv_dtype : kv->kpe_dtype;
        if (r.coin(50) || es(dt) < 2) {
          ptr = nullptr;
          c.reject(p + " = null", {p}, false);
        } else {
          ptr = static_cast<const std::uint8_t*>(ptr) + 1;
          c.reject(p + " misaligned", {p}, false);
        }
        return true;
      },
      [&] {  // out over an input
        const int w = static_cast<int>(r.range(0, 6));
        if (w == 0) return mutate_overlap(c, *out, "q_nope", qn->t.data, tensor_bytes_small(qn->t));
        if (w == 1) return mutate_overlap(c, *out, "q_pe", qp->t.data, tensor_bytes_small(qp->t));
        if (w == 2) return mutate_overlap(c, *out, "kv.ckv", kv->ckv, ckv->bytes);
        if (w == 3) return mutate_overlap(c, *out, "kv.kpe", kv->kpe, kpe->bytes);
        return mutate_table_overlap(c, *out, *kv, *tab, batch, w - 4);
      },
      [&] {
        if (explicit_layout) {
          splits->max_splits = static_cast<std::int32_t>(r.pick<i64>({0, -1, 513, INT32_MAX}));
          c.reject("bad split layout", {"splits"});
        } else if (r.coin(50)) {
          options->variant.logits_soft_cap = 30.f;
          c.reject("a soft cap", {"options.variant"});
        } else {
          options->policy = attnstate::SplitPolicy::kFixedSize;
          options->split_size = static_cast<int>(r.pick<i64>({0, -16, 17, INT32_MIN}));
          c.reject("options.split_size", {"options.split_size"});
        }
        return true;
      },
  };
  muts.insert(muts.end(), own.begin(), own.end());
  apply_mutations(c, nmut, muts);
  maybe_wild(c, {[qn](void* p) { qn->t.data = p; }, [qp](void* p) { qp->t.data = p; },
                 [kv](void* p) { kv->ckv = p; }, [kv](void* p) { kv->kpe = p; },
                 [out](void* p) { out->v.o = p; },
                 [out](void* p) { out->v.lse = static_cast<float*>(p); }});
  if (!c.expect_reject) allow_state(c, out->v, out->v.o, out->v.lse);
  c.note("mla: rank " + str(kv->kv_lora_rank) + " rope " + str(kv->rope_dim) + " pages " +
         str(kv->num_pages) + "x" + str(kv->page_size) + " ckv " +
         attnstate::to_string(kv->ckv_dtype) + " strides " + str(kv->ckv_token_stride) + "/" +
         str(kv->ckv_page_stride) + " kpe " + attnstate::to_string(kv->kpe_dtype) + " strides " +
         str(kv->kpe_token_stride) + "/" + str(kv->kpe_page_stride) + describe_tables(*tab));
  c.note(describe(*qn, c));
  c.note(describe(*qp, c));
  c.note(describe(*out, c));
  c.note(sinks->off < 0 ? "no sinks" : "sinks @" + str(c.off_of(sinks->s.logits)));
  const char* fn = "attnstate::cpu::mla_decode";
  if (explicit_layout)
    return {fn, [qn, qp, kv, splits, scale, out] {
              attnstate::cpu::mla_decode(qn->t, qp->t, *kv, *splits, *scale, out->v);
            }};
  return {fn, [qn, qp, kv, options, sinks, out] {
            attnstate::cpu::mla_decode(qn->t, qp->t, *kv, *options, sinks->s, out->v);
          }};
}

}  // namespace attnstate_fuzz
