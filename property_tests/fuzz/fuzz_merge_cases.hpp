/// @file fuzz_merge_cases.hpp
/// @brief Fuzz cases of the merge family (merge_state, merge_state_inplace, merge_states,
///        merge_states_ragged, rebase, mark_empty_rows), generic over the backend `B`:
///        `B::kPrefix` ("attnstate::cpu::"), `B::draw_dim(rng)`, `B::kHostTables` (indptr
///        contents are checked on the host, not clamped on the device) and the entry points.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <typeinfo>
#include <vector>

#include "fuzz_harness.hpp"

namespace attnstate_fuzz {

/// A built case: the function it calls and the call.
struct Built {
  std::string func;
  std::function<void()> call;
};

/// Applies `n` mutations, each drawn from `muts` until one applies.
inline void apply_mutations(Ctx& c, int n, const std::vector<std::function<bool()>>& muts) {
  for (int i = 0; i < n; ++i)
    for (int tries = 0; tries < 20; ++tries)
      if (muts[static_cast<std::size_t>(c.rng.range(0, static_cast<i64>(muts.size()) - 1))]())
        break;
}

/// True when `out.o` / `out.lse` alias `in`'s exactly (the form merge_state and rebase allow).
inline bool exact_o(const StateArg& out, const StateLayout& in, const void* in_o) {
  return out.v.o == in_o && out.v.o_stride_token == in.o_stride_token &&
         out.v.o_stride_head == in.o_stride_head && out.v.dtype == in.dtype;
}
inline bool exact_lse(const StateArg& out, const StateLayout& in, const float* in_lse) {
  return out.v.lse == in_lse && out.v.lse_stride_token == in.lse_stride_token &&
         out.v.lse_stride_head == in.lse_stride_head;
}

/// Moves `out` over the input `in` (o or lse); exact aliases are soft where `alias_ok`, and so
/// is a placement that overlaps no input at all.
inline bool overlap_state(Ctx& c, StateArg& out, const StateArg& in, bool alias_ok) {
  const bool on_o = c.rng.coin(50);
  const Range r = on_o ? o_range(in.v, in.v.o) : lse_range(in.v, in.v.lse);
  const std::size_t mark = c.log.size();
  const bool was_reject = c.expect_reject;
  const auto blame_size = c.blame.size();
  if (!mutate_overlap(c, out, in.name + (on_o ? ".o" : ".lse"), r.p, r.bytes)) return false;
  const bool moved_o = c.log.back().find(out.name + ".o placed") != std::string::npos;
  const Range mine = moved_o ? o_range(out.v, out.v.o) : lse_range(out.v, out.v.lse);
  const bool exact = moved_o ? exact_o(out, in.v, in.v.o) : exact_lse(out, in.v, in.v.lse);
  const Range same = moved_o ? o_range(in.v, in.v.o) : lse_range(in.v, in.v.lse);
  bool other_overlap = false;  // any input buffer other than the exactly aliased one
  for (const Region& g : c.regions) {
    if (!g.input) continue;
    const Range gr{c.ptr(g.off), g.bytes};
    if (alias_ok && exact && gr.p == same.p) continue;
    if (overlap(mine, gr)) other_overlap = true;
  }
  if (!other_overlap) {
    c.expect_reject = was_reject;
    c.blame.resize(blame_size);
    c.log.resize(mark);
    c.note(std::string("soft: ") + out.name + (moved_o ? ".o" : ".lse") + " over " + in.name +
           (exact ? " (exact alias)" : " (no overlap)"));
    // placed at an input that was itself misaligned, the moved pointer is misaligned too
    const i64 align = moved_o ? es(out.v.dtype) : 4;
    if (reinterpret_cast<std::uintptr_t>(mine.p) % static_cast<std::uintptr_t>(align) != 0)
      c.reject(out.name + (moved_o ? ".o" : ".lse") + " misaligned (moved)",
               {out.name + (moved_o ? ".o" : ".lse")}, false);
  }
  return true;
}

inline void draw_state_shape(Ctx& c, i64 dim, i64* t, i64* h) {
  *t = c.rng.pick<i64>({0, 1, 1, 2, 2, 3});
  *h = c.rng.range(1, 3);
  (void)dim;
}

inline std::vector<std::function<void(void*)>> state_setters(std::initializer_list<StateArg*> xs) {
  std::vector<std::function<void(void*)>> s;
  for (StateArg* x : xs) {
    s.push_back([x](void* p) { x->v.o = p; });
    s.push_back([x](void* p) { x->v.lse = static_cast<float*>(p); });
  }
  return s;
}

/// An output that aliases `in` exactly (when `in`'s rows are disjoint, as an output's must be).
inline bool alias_output(StateArg& out, const StateArg& in) {
  const StateView& v = in.v;
  if (v.tokens >= 2 && (v.o_stride_token == 0 || v.lse_stride_token == 0)) return false;
  const LseBase base = out.v.base;
  out.v = v;
  out.v.base = base;  // the base may differ: only the memory must be the same
  return true;
}

// ---------------------------------------------------------------------------------------------
// Token masks: `TokenMask{data, stride}`, any stride >= 0 (0 broadcasts one flag), disjoint from
// the state the call writes; read-only inputs may hold it.

/// A mask argument over `tokens` tokens (the tokens as drawn: a call whose shapes are mutated is
/// rejected before its mask is looked at).
struct MaskArg {
  attnstate::TokenMask m;  ///< `m.data` null: no mask
  i64 tokens = 0;
  bool stride_bad = false;  ///< a mutation made the stride invalid (the call is rejected)
  std::string at = "mask";  ///< the buffer holding it (for the log)
};

/// Bytes a mask over `t` tokens spans: 1 for stride 0, `(t - 1) * stride + 1` otherwise, 0
/// without tokens (clamped to 2^63 - 1; 0 for a negative stride).
inline i64 mask_span(i64 t, i64 stride) {
  if (t <= 0 || stride < 0) return 0;
  return clamp128(static_cast<i128>(t - 1) * stride + 1);
}

/// 0, 1, 2, 3 mostly, sometimes larger; one token reads only its flag whatever the stride.
inline i64 draw_mask_stride(Rng& r, i64 t) {
  const i64 k = r.range(0, 99);
  if (k < 20) return 0;
  if (k < 45) return 1;
  if (k < 60) return 2;
  if (k < 75) return 3;
  if (t == 1 && k < 82) return r.pick<i64>({k2p62, kI64Max});
  return r.pick<i64>({4, 7, 16, 64, 255, 1000});
}

/// In `pct`% of the cases a mask of a drawn stride, exactly its span allocated (a third of the
/// time at the arena's end, so that reading past it leaves the allocation), flags 0, 1 or 2.
inline MaskArg make_mask(Ctx& c, i64 t, int pct) {
  MaskArg m;
  m.tokens = t;
  if (!c.rng.coin(pct)) return m;
  m.m.stride = draw_mask_stride(c.rng, t);
  const i64 bytes = mask_span(t, m.m.stride);
  const i64 off =
      t > 0 && c.rng.coin(33) ? c.alloc_tail("mask", bytes, true) : c.alloc("mask", bytes, true);
  for (i64 i = 0; i < t; ++i)
    c.put<std::uint8_t>(off + i * m.m.stride, static_cast<std::uint8_t>(c.rng.range(0, 2)));
  m.m.data = static_cast<const std::uint8_t*>(c.ptr(off));
  return m;
}

/// The region named `name`, or null.
inline const Region* find_region(const Ctx& c, const std::string& name) {
  for (const Region& g : c.regions)
    if (g.name == name) return &g;
  return nullptr;
}

/// The mask's hard mutations of its stride: negative, or a span past 2^62.
inline bool mutate_mask_stride(Ctx& c, MaskArg& m) {
  if (m.m.data == nullptr) return false;  // a null mask is no mask: its stride is never read
  const bool negative = c.rng.coin(50);
  if (!negative && m.tokens < 2) return false;  // one flag: any stride spans one byte
  if (!c.touch("mask#stride")) return false;
  m.m.stride = negative ? c.rng.pick<i64>({-1, -2, -1000, kI64Min})
                        : c.rng.pick<i64>({k2p62, k2p62 + 1, kI64Max});
  m.stride_bad = true;
  c.reject("mask.stride = " + str(m.m.stride) + (negative ? "" : " (span overflows)"),
           {"mask.stride"});
  return true;
}

/// Moves the mask (drawing a stride when there was none) so that its span meets `out`'s o or
/// lse; `settle_mask` then expects the rejection.
inline bool mask_over_output(Ctx& c, MaskArg& m, const StateArg& out) {
  if (out.v.tokens < 1 || m.tokens < 1) return false;
  const i64 stride = m.m.data == nullptr ? draw_mask_stride(c.rng, m.tokens) : m.m.stride;
  const bool on_o = c.rng.coin(50);
  const Range r = on_o ? o_range(out.v, out.v.o) : lse_range(out.v, out.v.lse);
  const i64 span = mask_span(m.tokens, stride);
  if (r.p == nullptr || r.bytes < 1 || !c.in_arena(r.p, r.bytes) || span > c.size()) return false;
  // the span starts up to span - 1 bytes before the buffer or anywhere inside it
  const i64 lo = std::max<i64>(-(span - 1), -c.off_of(r.p));
  const i64 delta = c.rng.range(lo, r.bytes - 1);
  const void* p = reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(r.p) + delta);
  if (!c.in_arena(p, span) || !c.touch("mask#ptr") || !c.touch(out.name + "#ptr")) return false;
  m.m.stride = stride;
  m.m.data = static_cast<const std::uint8_t*>(p);
  m.at = out.name + (on_o ? ".o" : ".lse") + "+" + str(delta);
  c.note("mask (stride " + str(m.m.stride) + ") placed over " + m.at);
  return true;
}

/// Moves the mask inside the buffer of a read-only input (`in.o` or `in.lse` as allocated): no
/// error, unless that memory is also the output's (`settle_mask` decides).
inline bool mask_over_input(Ctx& c, MaskArg& m, const StateArg& in) {
  if (m.tokens < 1) return false;
  const i64 stride = m.m.data == nullptr ? draw_mask_stride(c.rng, m.tokens) : m.m.stride;
  const std::string buf = in.name + (c.rng.coin(50) ? ".o" : ".lse");
  const Region* g = find_region(c, buf);
  const i64 span = mask_span(m.tokens, stride);
  if (g == nullptr || g->bytes < span || !c.touch("mask#ptr")) return false;
  m.m.stride = stride;
  const i64 delta = c.rng.range(0, g->bytes - span);
  m.m.data = static_cast<const std::uint8_t*>(c.ptr(g->off + delta));
  m.at = buf + "+" + str(delta);
  c.note("soft: mask (stride " + str(m.m.stride) + ") inside " + m.at);
  return true;
}

/// After the mutations: a mask whose span meets the written state's o or lse (placed there, or
/// inside an input the output aliases) must be rejected. Returns which tokens the call selects
/// (every one without a mask), as the flags stand in the arena.
inline std::vector<bool> settle_mask(Ctx& c, const MaskArg& m, const StateArg& out) {
  std::vector<bool> sel(static_cast<std::size_t>(std::max<i64>(m.tokens, 0)), true);
  if (m.m.data == nullptr || m.stride_bad) return sel;
  const Range mr{m.m.data, mask_span(m.tokens, m.m.stride)};
  if (overlap(mr, o_range(out.v, out.v.o)) || overlap(mr, lse_range(out.v, out.v.lse)))
    c.reject("mask over " + out.name + " (at " + m.at + ")", {"mask", out.name}, false);
  if (c.in_arena(mr.p, mr.bytes))
    for (i64 t = 0; t < m.tokens; ++t)
      sel[static_cast<std::size_t>(t)] = c.get<std::uint8_t>(m.m.data + t * m.m.stride) != 0;
  return sel;
}

inline std::string describe(const MaskArg& m, const Ctx& c) {
  if (m.m.data == nullptr) return "mask none (stride " + str(m.m.stride) + ")";
  return "mask{@" + str(c.off_of(m.m.data)) + " (" + m.at + "), stride " + str(m.m.stride) +
         ", tokens " + str(m.tokens) + "}";
}

template <class B>
Built build_merge_state(Ctx& c, int nmut) {
  const i64 d = B::draw_dim(c.rng);
  i64 t, h;
  draw_state_shape(c, d, &t, &h);
  auto* a = new StateArg(make_state(c, "a", t, h, d, false, draw_dtype(c.rng), draw_base(c.rng)));
  auto* b = new StateArg(make_state(c, "b", t, h, d, false, draw_dtype(c.rng), draw_base(c.rng)));
  auto* out =
      new StateArg(make_state(c, "out", t, h, d, true, draw_dtype(c.rng), draw_base(c.rng)));
  out->lse_optional = true;  // merge_state writes no LSE into an output without one
  if (c.rng.coin(15) && alias_output(*out, c.rng.coin(50) ? *a : *b))
    c.note("out aliases an input");
  // the masked overload: with a mask, or without one (a null mask of any stride >= 0 is none)
  auto* mask = new MaskArg(make_mask(c, t, 40));
  bool masked = mask->m.data != nullptr || c.rng.coin(25);
  if (masked && mask->m.data == nullptr) mask->m.stride = draw_mask_stride(c.rng, t);
  apply_mutations(c, nmut,
                  {[&] {
                     return mutate_state(c, *a, {"b", "out"});
                   },
                   [&] {
                     return mutate_state(c, *b, {"a", "out"});
                   },
                   [&] {
                     return mutate_state(c, *out, {"a", "b"});
                   },
                   [&] {
                     return mutate_mismatch(c, *b, {"a", "out"});
                   },
                   [&] {
                     return mutate_mismatch(c, *out, {"a", "b"});
                   },
                   [&] { return overlap_state(c, *out, *a, true); },
                   [&] { return overlap_state(c, *out, *b, true); },
                   [&] { return masked && mutate_mask_stride(c, *mask); },
                   [&] { return mask_over_output(c, *mask, *out) && (masked = true); },
                   [&] { return mask_over_input(c, *mask, *a) && (masked = true); },
                   [&] { return mask_over_input(c, *mask, *b) && (masked = true); }});
  settle_mask(c, *mask, *out);  // out = a where the mask leaves a token out: every row written
  maybe_wild(c, state_setters({a, b, out}));
  if (!c.expect_reject) allow_state(c, out->v, out->v.o, out->v.lse);
  c.note(describe(*a, c));
  c.note(describe(*b, c));
  c.note(describe(*out, c));
  if (masked) c.note(describe(*mask, c));
  std::shared_ptr<StateArg> sa(a), sb(b), so(out);
  std::shared_ptr<MaskArg> sm(mask);
  if (!masked)
    return {std::string(B::kPrefix) + "merge_state",
            [sa, sb, so] { B::merge_state(sa->v, sb->v, so->v); }};
  return {std::string(B::kPrefix) + "merge_state",
          [sa, sb, so, sm] { B::merge_state(sa->v, sb->v, so->v, sm->m); }};
}

template <class B>
Built build_merge_state_inplace(Ctx& c, int nmut) {
  const i64 d = B::draw_dim(c.rng);
  i64 t, h;
  draw_state_shape(c, d, &t, &h);
  auto acc = std::make_shared<StateArg>(
      make_state(c, "acc", t, h, d, true, draw_dtype(c.rng), draw_base(c.rng)));
  auto other = std::make_shared<StateArg>(
      make_state(c, "other", t, h, d, false, draw_dtype(c.rng), draw_base(c.rng)));
  if (c.rng.coin(10)) {
    other->v = acc->v;
    c.note("other aliases acc");
    c.uncertain = true;  // not said either way by the docs
    // so a call rejected for another reason may be refused for the alias first
    c.blame.push_back("acc");
    c.blame.push_back("other");
  }
  auto mask = std::make_shared<MaskArg>(make_mask(c, t, 60));
  apply_mutations(c, nmut,
                  {[&] { return mutate_state(c, *acc, {"other"}); },
                   [&] { return mutate_state(c, *other, {"acc"}); },
                   [&] { return mutate_mismatch(c, *other, {"acc"}); },
                   [&] { return overlap_state(c, *acc, *other, true); },
                   [&] { return mutate_mask_stride(c, *mask); },
                   [&] { return mask_over_output(c, *mask, *acc); },
                   [&] { return mask_over_input(c, *mask, *other); }});
  // tokens the mask leaves out are not written
  const std::vector<bool> written = settle_mask(c, *mask, *acc);
  {
    auto setters = state_setters({acc.get()});
    setters.push_back([other](void* p) { other->v.o = p; });
    setters.push_back([other](void* p) { other->v.lse = static_cast<float*>(p); });
    maybe_wild(c, setters);
  }
  if (!c.expect_reject) allow_state(c, acc->v, acc->v.o, acc->v.lse, false, &written);
  c.note(describe(*acc, c));
  c.note(describe(*other, c));
  c.note(describe(*mask, c));
  return {std::string(B::kPrefix) + "merge_state_inplace",
          [acc, other, mask] { B::merge_state_inplace(acc->v, other->v, mask->m); }};
}

struct StackArg {
  std::string name = "states";
  ConstStateStackView v;
};

template <class B>
Built build_merge_states(Ctx& c, int nmut) {
  const i64 d = B::draw_dim(c.rng);
  i64 t, h;
  draw_state_shape(c, d, &t, &h);
  const i64 S = c.rng.range(1, 3);
  const DType dt = draw_dtype(c.rng);
  auto st = std::make_shared<StackArg>();
  ConstStateStackView& v = st->v;
  v = attnstate::make_state_stack(
      nullptr, dt, nullptr,
      c.rng.coin(50) ? attnstate::StackOrder::kTokensMajor : attnstate::StackOrder::kStatesMajor, t,
      S, h, d, draw_base(c.rng), c.space);
  if (c.rng.coin(10)) v.o_stride_state = 0, v.lse_stride_state = 0;  // one state repeated
  const i64 ob = t > 0 ? ((t - 1) * v.o_stride_token + (S - 1) * v.o_stride_state +
                          (h - 1) * v.o_stride_head + d) *
                             es(dt)
                       : 0;
  const i64 lb = t > 0 ? ((t - 1) * v.lse_stride_token + (S - 1) * v.lse_stride_state +
                          (h - 1) * v.lse_stride_head + 1) *
                             4
                       : 0;
  const i64 o_off = c.alloc("states.o", ob, true), l_off = c.alloc("states.lse", lb, true);
  fill_values(c, o_off, ob, dt);
  fill_lses(c, l_off, lb / 4);
  v.o = c.ptr(o_off);
  v.lse = static_cast<const float*>(c.ptr(l_off));
  auto out = std::make_shared<StateArg>(
      make_state(c, "out", t, h, d, true, draw_dtype(c.rng), draw_base(c.rng)));
  out->lse_optional = true;
  Rng& r = c.rng;
  apply_mutations(c, nmut,
                  {[&] { return mutate_layout(c, "states", v, v.o, v.lse, false, {"out"}); },
                   [&] { return mutate_state(c, *out, {"states"}); },
                   [&] { return mutate_mismatch(c, *out, {"states"}); },
                   [&] {
                     v.num_states = r.pick<i64>({-1, kI64Min});  // 0: the empty state
                     c.reject("states.num_states = " + str(v.num_states), {"states.num_states"});
                     return true;
                   },
                   [&] {  // a stride past 2^62 between 2+ states
                     if (v.num_states < 2 || v.tokens < 1) return false;
                     const bool o = r.coin(50);
                     (o ? v.o_stride_state : v.lse_stride_state) = r.pick<i64>({k2p62, kI64Max});
                     c.reject(std::string("states.") + (o ? "o" : "lse") + "_stride_state huge",
                              {std::string("states.") + (o ? "o" : "lse") + "_stride_state"});
                     return true;
                   },
                   [&] {
                     const bool o = r.coin(50);
                     (o ? v.o_stride_state : v.lse_stride_state) = r.pick<i64>({-1, kI64Min});
                     c.reject(std::string("states.") + (o ? "o" : "lse") + "_stride_state negative",
                              {std::string("states.") + (o ? "o" : "lse") + "_stride_state"});
                     return true;
                   },
                   [&] {  // num_states past 2^62 (state strides >= 1)
                     if (v.tokens < 1) return false;
                     v.num_states = r.pick<i64>({k2p62 + 1, kI64Max});
                     std::vector<std::string> b{"states.num_states"};
                     if (v.o_stride_state == 0)
                       v.o_stride_state = 1, b.push_back("states.o_stride_state");
                     if (v.lse_stride_state == 0)
                       v.lse_stride_state = 1, b.push_back("states.lse_stride_state");
                     c.reject("states.num_states = " + str(v.num_states), b);
                     return true;
                   },
                   [&] {
                     const bool o = r.coin(50);
                     return mutate_overlap(c, *out, o ? "states" : "states",
                                           o ? v.o : static_cast<const void*>(v.lse), o ? ob : lb);
                   }});
  {
    auto setters = state_setters({out.get()});
    setters.push_back([st](void* p) { st->v.o = p; });
    setters.push_back([st](void* p) { st->v.lse = static_cast<const float*>(p); });
    maybe_wild(c, setters);
  }
  if (!c.expect_reject) allow_state(c, out->v, out->v.o, out->v.lse);
  c.note("states{tokens " + str(v.tokens) + ", S " + str(v.num_states) + ", heads " + str(v.heads) +
         ", head_dim " + str(v.head_dim) + ", strides o (" + str(v.o_stride_token) + ", " +
         str(v.o_stride_state) + ", " + str(v.o_stride_head) + "), lse (" +
         str(v.lse_stride_token) + ", " + str(v.lse_stride_state) + ", " + str(v.lse_stride_head) +
         ")}");
  c.note(describe(*out, c));
  return {std::string(B::kPrefix) + "merge_states", [st, out] { B::merge_states(st->v, out->v); }};
}

template <class B>
Built build_merge_states_ragged(Ctx& c, int nmut) {
  const i64 d = B::draw_dim(c.rng);
  const i64 h = c.rng.range(1, 3);
  const i64 R = c.rng.range(0, 5), T = c.rng.range(0, 3);
  auto rows = std::make_shared<StateArg>(
      make_state(c, "rows", R, h, d, false, draw_dtype(c.rng), draw_base(c.rng)));
  auto out = std::make_shared<StateArg>(
      make_state(c, "out", T, h, d, true, draw_dtype(c.rng), draw_base(c.rng)));
  out->lse_optional = true;
  std::vector<std::int32_t> ip(static_cast<std::size_t>(T + 1));
  ip[0] = static_cast<std::int32_t>(c.rng.coin(80) ? 0 : c.rng.range(0, R));
  for (i64 i = 1; i <= T; ++i)
    ip[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(c.rng.range(ip[i - 1], R));
  const i64 ip_off = alloc_i32(c, "indptr", ip);
  auto indptr =
      std::make_shared<const std::int32_t*>(static_cast<const std::int32_t*>(c.ptr(ip_off)));
  Rng& r = c.rng;
  // on the GPU the offsets are read on the device and clamped: wrong contents are not errors
  const auto table = [&](const std::string& what, std::vector<std::string> b) {
    if (B::kHostTables) {
      c.reject(what, std::move(b));
    } else {
      c.note("soft (clamped on the device): " + what);
    }
  };
  apply_mutations(
      c, nmut,
      {[&] { return mutate_state(c, *rows, {"out"}); },
       [&] { return mutate_state(c, *out, {"rows"}); },
       [&] { return mutate_mismatch(c, *rows, {"out"}, static_cast<int>(r.range(1, 2))); },
       [&] {
         *indptr = nullptr;
         c.reject("indptr = null", {"indptr"}, false);
         return true;
       },
       [&] {
         *indptr = reinterpret_cast<const std::int32_t*>(c.ptr(ip_off + r.range(1, 3)));
         c.reject("indptr misaligned", {"indptr"}, false);
         return true;
       },
       [&] {
         c.put<std::int32_t>(ip_off, r.pick<std::int32_t>({-1, INT32_MIN}));
         table("indptr[0] < 0", {"indptr"});
         return true;
       },
       [&] {
         if (T < 1) return false;
         const i64 i = r.range(1, T);
         c.put<std::int32_t>(ip_off + 4 * i, ip[static_cast<std::size_t>(i - 1)] - r.range(1, 5));
         table("indptr decreases at " + str(i), {"indptr"});
         return true;
       },
       [&] {
         c.put<std::int32_t>(ip_off + 4 * T,
                             static_cast<std::int32_t>(R + r.pick<i64>({1, 7, 1 << 30})));
         table("indptr[T] > rows.tokens", {"indptr", "rows.tokens"});
         return true;
       },
       [&] { return mutate_overlap(c, *out, "indptr", c.ptr(ip_off), (T + 1) * 4); },
       [&] { return overlap_state(c, *out, *rows, false); }});
  {
    auto setters = state_setters({out.get()});
    setters.push_back([rows](void* p) { rows->v.o = p; });
    setters.push_back([rows](void* p) { rows->v.lse = static_cast<float*>(p); });
    maybe_wild(c, setters);
  }
  if (!c.expect_reject) allow_state(c, out->v, out->v.o, out->v.lse);
  std::string ips;
  for (auto x : ip) ips += " " + std::to_string(x);
  c.note(describe(*rows, c));
  c.note(describe(*out, c));
  c.note("indptr (as drawn):" + ips);
  return {std::string(B::kPrefix) + "merge_states_ragged",
          [rows, out, indptr] { B::merge_states_ragged(rows->v, *indptr, out->v); }};
}

template <class B>
Built build_rebase(Ctx& c, int nmut) {
  const i64 d = B::draw_dim(c.rng);
  i64 t, h;
  draw_state_shape(c, d, &t, &h);
  auto in = std::make_shared<StateArg>(
      make_state(c, "in", t, h, d, false, draw_dtype(c.rng), draw_base(c.rng)));
  auto out = std::make_shared<StateArg>(
      make_state(c, "out", t, h, d, true, draw_dtype(c.rng), draw_base(c.rng)));
  if (c.rng.coin(20) && alias_output(*out, *in)) c.note("out is in (in place)");
  apply_mutations(
      c, nmut,
      {[&] { return mutate_state(c, *in, {"out"}); }, [&] { return mutate_state(c, *out, {"in"}); },
       [&] { return mutate_mismatch(c, *out, {"in"}); },
       [&] { return overlap_state(c, *out, *in, true); }});
  maybe_wild(c, state_setters({in.get(), out.get()}));
  if (!c.expect_reject) allow_state(c, out->v, out->v.o, out->v.lse);
  c.note(describe(*in, c));
  c.note(describe(*out, c));
  return {std::string(B::kPrefix) + "rebase", [in, out] { B::rebase(in->v, out->v); }};
}

template <class B>
Built build_mark_empty_rows(Ctx& c, int nmut) {
  const i64 d = B::draw_dim(c.rng);
  i64 t, h;
  draw_state_shape(c, d, &t, &h);
  auto s = std::make_shared<StateArg>(
      make_state(c, "state", t, h, d, true, draw_dtype(c.rng), draw_base(c.rng)));
  // o is never read or written: a wild o must be harmless
  if (c.rng.coin(20)) s->v.o = c.wild(), c.note("state.o wild (never touched)");
  apply_mutations(c, nmut, {[&] { return mutate_state(c, *s, {}, true); }});
  if (c.structural_reject && c.rng.coin(30)) s->v.lse = static_cast<float*>(c.wild());
  // only the LSEs may be written
  if (!c.expect_reject) allow_state(c, s->v, s->v.o, s->v.lse, true);
  c.note(describe(*s, c));
  return {std::string(B::kPrefix) + "mark_empty_rows", [s] { B::mark_empty_rows(s->v); }};
}

/// Runs one built case against the oracle; returns "" or the failure.
template <class B>
std::string run_case(Ctx& c, const Built& built, bool any_func_prefix = false) {
  std::vector<std::uint8_t> before(c.image(), c.image() + c.size());
  // FUZZ_VERBOSE=1 prints every case before its call (for a crash, which prints no log)
  static const bool verbose = std::getenv("FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "CASE %s%s\n", built.func.c_str(), case_log(c).c_str());
  B::upload(c);
  bool returned = false;
  std::string err;
  try {
    built.call();
    B::sync();
    returned = true;
  } catch (const attnstate::Error& e) {
    err = check_error(c, e, built.func, any_func_prefix);
  } catch (const std::exception& e) {
    err = std::string("threw a non-attnstate exception (") + typeid(e).name() + "): " + e.what();
  } catch (...) {
    err = "threw something that is not a std::exception";
  }
  B::download(c);
  if (returned && c.expect_reject && !c.accept_ok) err = "accepted a call that must be rejected";
  const std::string arena = check_arena(c, before, c.image(), returned);
  if (!arena.empty()) err += (err.empty() ? "" : "; ") + arena;
  if (err.empty()) return "";
  return built.func + ": " + err + case_log(c);
}

}  // namespace attnstate_fuzz
