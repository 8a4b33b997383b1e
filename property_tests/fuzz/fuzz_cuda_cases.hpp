/// @file fuzz_cuda_cases.hpp
/// @brief Fuzz cases of the CUDA producers: init_decode_workspace, run_decode (planned with
///        plan_decode), run_cascade / run_cascade_level / run_cascade_merge (planned with
///        plan_cascade), over a device arena (fuzz_harness.hpp) holding the pool, the tables and
///        the workspace. The merges reuse the generic builders of fuzz_merge_cases.hpp.
///
/// Device tables (seq_lens, page tables, segment lengths) are clamped on the device
/// (cuda/decode.hpp, cuda/cascade.hpp), so wrong contents are soft mutations: the call may
/// return and must then stay inside its outputs; memcheck checks that it never reads outside the
/// arena. Edited plan fields that run_* checks are hard; those it cannot check (tile and split
/// choices) are soft, as are the device request grouping edits of the cascade.
#pragma once

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "attnstate/cuda/cascade.hpp"
#include "attnstate/cuda/decode.hpp"
#include "compiled_dims.hpp"
#include "fuzz_producer_cases.hpp"
#include "plan/cascade_plan_access.hpp"
#include "plan/decode_plan_access.hpp"

namespace attnstate_fuzz {

// Findings of the CUDA fuzzer, each behind a flag: while a flag is true its mutations run as
// "uncertain" (the call may return or throw; memory must stay inside the arena) and the calls the
// library accepted are counted ("PENDING <tag>: accepted N"); false (fixed) makes them hard.
/// F4 (fixed): the run entry points check the workspace against the KV pool and the tables.
constexpr bool kPendingCudaWorkspaceOverInputs = false;
/// F5 (fixed): run_cascade checks `out` against the device level arrays whose extent it knows.
constexpr bool kPendingCudaCascadeOutOverLevels = false;

/// A hard mutation, or (pending a library fix) an uncertain one tagged for counting.
inline void reject_unless_pending(Ctx& c, bool pending, const char* tag, const std::string& what,
                                  std::vector<std::string> names, bool structural = true) {
  if (!pending) return c.reject(what, std::move(names), structural);
  c.uncertain = true;
  for (auto& n : names) c.blame.push_back(std::move(n));
  c.note(std::string("PENDING:") + tag + " " + what);
}

/// A soft mutation: the call may return (writing only its outputs) or be rejected.
inline void soft(Ctx& c, const std::string& what, std::vector<std::string> names = {}) {
  c.uncertain = true;
  for (auto& n : names) c.blame.push_back(std::move(n));
  c.note("soft: " + what);
}

/// A paged pool the CUDA kernels accept: f16/bf16, 16-byte aligned pools (the arena's offsets
/// are), pages of a multiple of 8 elements (head_dim is a multiple of 64).
inline PoolArg make_cuda_pool(Ctx& c, i64 hkv, i64 d, DType dt, i64 page_size, i64 num_pages) {
  Rng& r = c.rng;
  PoolArg p;
  attnstate::PagedKvCache& kv = p.kv;
  kv.dtype = dt;
  kv.layout = r.coin(50) ? attnstate::KvLayout::kNHD : attnstate::KvLayout::kHND;
  kv.num_pages = num_pages;
  kv.page_size = page_size;
  kv.heads_kv = hkv;
  kv.head_dim = d;
  kv.page_stride = r.coin(60) ? 0 : page_size * hkv * d + 8 * r.range(1, 2);
  kv.space = c.space;
  p.pool_bytes = kv.num_pages * kv.page_elems() * es(dt);
  p.k_off = c.alloc("kv.k", p.pool_bytes, true);
  p.v_off = c.alloc("kv.v", p.pool_bytes, true);
  fill_values(c, p.k_off, p.pool_bytes, dt);
  fill_values(c, p.v_off, p.pool_bytes, dt);
  kv.k = c.ptr(p.k_off);
  kv.v = c.ptr(p.v_off);
  return p;
}

/// A workspace of `bytes` in the arena, zeroed (the tickets start at zero, as after
/// init_decode_workspace; the bytes around it stay random canaries).
struct WorkspaceArg {
  void* p = nullptr;
  std::size_t bytes = 0;  ///< passed as workspace_bytes
  i64 off = -1, alloc = 0;
};
inline WorkspaceArg make_workspace(Ctx& c, std::size_t need) {
  WorkspaceArg w;
  w.alloc = static_cast<i64>(need) + (c.rng.coin(30) ? 16 * c.rng.range(1, 4) : 0);
  w.off = c.alloc("workspace", w.alloc, false);
  std::memset(c.image() + w.off, 0, static_cast<std::size_t>(w.alloc));
  w.p = c.ptr(w.off);
  w.bytes = static_cast<std::size_t>(w.alloc);
  if (need == 0 && c.rng.coin(50)) w.p = nullptr, w.bytes = 0;  // "may be null when 0"
  return w;
}

/// The workspace mutations shared by run_decode and run_cascade. `need` is the plan's size;
/// `checked` false where the call returns before looking at the workspace (decode batch 0).
/// `inputs` are the buffers it is never checked against (pending F4); q and out are checked.
inline std::vector<std::function<bool()>> workspace_mutations(
    Ctx& c, WorkspaceArg& w, std::size_t need, bool checked, bool q_checked, StateArg* out,
    const TensorArg* q, std::vector<std::pair<std::string, Range>> inputs) {
  Rng& r = c.rng;
  const auto hard = [&c, checked](const std::string& what, std::vector<std::string> names,
                                  bool structural) {
    if (checked)
      c.reject(what, std::move(names), structural);
    else
      soft(c, what + " (not looked at)", std::move(names));
  };
  // moves the workspace onto `target` (16-aligned, inside the arena), zeroing it there; it may
  // then cover later buffers too (out among them: an error may name out)
  const auto move_onto = [&c, &r, &w, need](const void* target, i64 bytes) {
    if (target == nullptr || bytes <= 0 || need == 0 || !c.touch("workspace#ptr")) return false;
    const i64 delta = r.range(0, std::max<i64>(0, bytes / 16 - 1)) * 16;
    void* p = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(target) + delta);
    if (!c.in_arena(p, static_cast<i64>(need))) return false;
    w.p = p;
    w.off = c.off_of(p);
    w.alloc = static_cast<i64>(need);
    w.bytes = std::min(w.bytes, need);  // a size already made too small stays too small
    std::memset(c.image() + w.off, 0, need);
    return true;
  };
  return {
      [&c, &r, &w, need, hard] {  // too small: kWorkspaceTooSmall naming workspace_bytes
        if (need == 0 || !c.touch("workspace#bytes")) return false;
        w.bytes = static_cast<std::size_t>(r.range(0, static_cast<i64>(need) - 1));
        hard("workspace_bytes = " + std::to_string(w.bytes) + " < " + std::to_string(need),
             {"workspace_bytes"}, true);
        return true;
      },
      [&c, &w, need, hard] {
        if (need == 0 || !c.touch("workspace#ptr")) return false;
        w.p = nullptr;
        hard("workspace = null", {"workspace"}, false);
        return true;
      },
      [&c, &r, &w, need, hard] {
        if (need == 0 || w.p == nullptr || !c.touch("workspace#ptr")) return false;
        w.p = static_cast<char*>(w.p) + r.pick<i64>({4, 8, 12});
        w.bytes -= 16;  // still inside its buffer, and large enough unless the size is exact
        if (w.bytes < need) w.bytes = need;
        hard("workspace misaligned", {"workspace"}, false);
        return true;
      },
      [&c, &w, need, checked, out] {  // out over the workspace (checked)
        // (the workspace then stays where it is: a later move would undo the overlap)
        if (need == 0 || !c.touch("workspace#ptr")) return false;
        const bool ok = mutate_overlap(c, *out, "workspace", w.p, static_cast<i64>(need));
        if (ok && !checked) soft(c, "out over workspace (not looked at)");
        return ok;
      },
      [&c, hard, checked, q_checked, q, move_onto] {  // the workspace over q
        if (!move_onto(q->t.data, tensor_bytes_small(q->t))) return false;
        if (q_checked || !checked)
          hard("workspace over q", {"workspace", "q", "out"}, false);
        else  // run_cascade_level does not check it
          reject_unless_pending(c, kPendingCudaWorkspaceOverInputs, "F4-workspace-over-inputs",
                                "workspace over q", {"workspace", "q", "out"}, false);
        return true;
      },
      [&c, &r, &w, checked, inputs, move_onto] {  // over the pool or a table (pending F4)
        if (inputs.empty()) return false;
        const auto& in =
            inputs[static_cast<std::size_t>(r.range(0, static_cast<i64>(inputs.size()) - 1))];
        if (!move_onto(in.second.p, in.second.bytes)) return false;
        if (checked)
          reject_unless_pending(c, kPendingCudaWorkspaceOverInputs, "F4-workspace-over-inputs",
                                "workspace over " + in.first, {"workspace", in.first, "out"},
                                false);
        else
          soft(c, "workspace over " + in.first + " (not looked at)", {"out"});
        return true;
      },
  };
}

inline float valid_scale(Ctx& c) {
  bool bad = false;
  const float s = draw_scale(c, &bad);
  return bad ? 0.5f : s;
}

// ---------------------------------------------------------------------------------------------
// Decode.

/// The arrays of a decode request set (CSR or block table), drawn and in the arena.
struct DecodeTables {
  bool csr = false;
  i64 width = 0, lens_off = -1, ip_off = -1, ix_off = -1, bt_off = -1;
  std::vector<std::int32_t> lens, indptr{0}, indices, table;
};

inline DecodeTables make_decode_tables(Ctx& c, attnstate::PagedKvCache& kv, i64 batch) {
  Rng& r = c.rng;
  DecodeTables t;
  t.csr = r.coin(50);
  t.width = r.range(1, 3);
  for (i64 b = 0; b < batch; ++b) {
    const i64 np = t.csr ? r.range(0, 3) : t.width;
    for (i64 i = 0; i < np; ++i)
      (t.csr ? t.indices : t.table)
          .push_back(static_cast<std::int32_t>(r.range(0, kv.num_pages - 1)));
    if (t.csr) t.indptr.push_back(static_cast<std::int32_t>(t.indices.size()));
    t.lens.push_back(static_cast<std::int32_t>(r.range(0, np * kv.page_size)));
  }
  t.lens_off = alloc_i32(c, "kv.seq_lens", t.lens);
  kv.seq_lens = static_cast<const std::int32_t*>(c.ptr(t.lens_off));
  if (t.csr) {
    t.ip_off = alloc_i32(c, "kv.page_indptr", t.indptr);
    t.ix_off = alloc_i32(c, "kv.page_indices",
                         t.indices.empty() ? std::vector<std::int32_t>{0} : t.indices);
    kv.page_indptr = static_cast<const std::int32_t*>(c.ptr(t.ip_off));
    kv.page_indices = static_cast<const std::int32_t*>(c.ptr(t.ix_off));
  } else {
    t.bt_off = alloc_i32(c, "kv.block_table", t.table);
    kv.block_table = static_cast<const std::int32_t*>(c.ptr(t.bt_off));
    kv.block_table_stride = t.width;
  }
  kv.batch = batch;
  return t;
}

/// Soft mutations of device table contents (clamped on the device): lengths past the pages,
/// negative or longer than planned, page ids outside the pool, broken CSR offsets.
inline std::vector<std::function<bool()>> device_table_mutations(Ctx& c, const DecodeTables& t,
                                                                 i64 batch, i64 num_pages) {
  Rng& r = c.rng;
  return {
      [&c, &r, &t, batch] {
        if (batch < 1) return false;
        const i64 b = r.range(0, batch - 1);
        const auto x = r.pick<std::int32_t>({-1, INT32_MIN, INT32_MAX, 1 << 20, 17, 1000});
        c.put<std::int32_t>(t.lens_off + 4 * b, x);
        soft(c, "device seq_lens[" + str(b) + "] = " + std::to_string(x));
        return true;
      },
      [&c, &r, &t, num_pages] {
        const bool csr = t.csr;
        const i64 n = static_cast<i64>(csr ? t.indices.size() : t.table.size());
        if (n < 1) return false;
        const i64 pos = r.range(0, n - 1);
        const auto x = static_cast<std::int32_t>(
            r.pick<i64>({-1, num_pages, num_pages + 1000, INT32_MAX, INT32_MIN}));
        c.put<std::int32_t>((csr ? t.ix_off : t.bt_off) + 4 * pos, x);
        soft(c, "device page id " + std::to_string(x) + " at " + str(pos));
        return true;
      },
      [&c, &r, &t, batch] {
        if (!t.csr) return false;
        const i64 i = r.range(0, batch);
        const auto x = r.pick<std::int32_t>({-1, INT32_MIN, INT32_MAX, 1 << 30, 3});
        c.put<std::int32_t>(t.ip_off + 4 * i, x);
        soft(c, "device page_indptr[" + str(i) + "] = " + std::to_string(x));
        return true;
      },
  };
}

/// run_decode on a plan from plan_decode (valid problem, real lengths). `num_sms` of the device.
inline Built build_cuda_decode(Ctx& c, int nmut, int num_sms) {
  Rng& r = c.rng;
  const i64 d = r.pick(attnstate_test::only_compiled({64, 128, 128, 256},
                                                     attnstate_test::decode_head_dims())),
            hkv = r.range(1, 2), hq = hkv * r.range(1, 2);
  const i64 batch = r.pick<i64>({0, 1, 1, 2, 3}), qlen = r.range(1, 3);
  const DType dt = r.coin(50) ? DType::kF16 : DType::kBF16;
  auto pool = std::make_shared<PoolArg>(
      make_cuda_pool(c, hkv, d, dt, r.pick<i64>({1, 2, 3, 8, 16}), r.range(1, 5)));
  attnstate::PagedKvCache& kv = pool->kv;
  auto tb = std::make_shared<DecodeTables>(make_decode_tables(c, kv, batch));
  if (batch == 0 && r.coin(30)) {  // no request: the tables are never read
    kv.seq_lens = nullptr;
    kv.page_indptr = kv.page_indices = kv.block_table = nullptr;
  }
  auto q = std::make_shared<TensorArg>(make_tensor(c, "q", {batch, qlen, hq, d}, dt));
  auto out = std::make_shared<StateArg>(
      make_state(c, "out", batch * qlen, hq, d, true, draw_dtype(r), draw_base(r)));
  attnstate::DecodeProblem pr;
  pr.batch = batch;
  pr.q_len = qlen;
  pr.heads_q = hq;
  pr.heads_kv = hkv;
  pr.head_dim = d;
  pr.q_dtype = pr.kv_dtype = dt;
  attnstate::DecodeOptions o;
  o.scale = valid_scale(c);
  o.policy = r.pick({attnstate::SplitPolicy::kAuto, attnstate::SplitPolicy::kFixedCount,
                     attnstate::SplitPolicy::kFixedSize});
  o.num_splits = static_cast<int>(r.range(1, 3));
  o.split_size = static_cast<int>(16 * r.range(1, 2));
  const int sms = r.coin(70) ? num_sms : static_cast<int>(r.range(1, 8));
  auto plan = std::make_shared<attnstate::cuda::DecodePlan>(
      attnstate::cuda::plan_decode(pr, tb->lens.data(), o, sms));
  const std::size_t need = plan->workspace_bytes();
  auto ws = std::make_shared<WorkspaceArg>(make_workspace(c, need));
  const bool checked = batch > 0;  // run_decode returns before the pool/workspace checks
  // every pool check comes before run_decode's return for batch 0: all hard
  std::vector<std::function<bool()>> muts = pool_mutations(c, pool, true);
  for (auto& m :
       decode_arg_mutations(c, r, q, out, kv, batch, {"q.shape[2]", "out.heads", "problem"}, true))
    muts.push_back(m);
  const std::vector<std::function<bool()>> more{
      [&] {  // both tables, or neither
        if (batch < 1 || !c.touch("kv#tables")) return false;
        if (tb->csr && r.coin(50)) {
          kv.block_table = kv.page_indices;
          kv.block_table_stride = 1;
        } else if (tb->csr) {
          kv.page_indptr = kv.page_indices = nullptr;
        } else {
          kv.block_table = nullptr;
        }
        c.reject("both or neither table", {"kv.block_table", "kv.page_indptr", "kv.page_indices"},
                 false);
        return true;
      },
      [&] {
        if (tb->csr || batch < 1 || !c.touch("kv#bts")) return false;
        kv.block_table_stride = r.pick<i64>({-1, kI64Min, k2p62 + 1});
        c.reject("kv.block_table_stride = " + str(kv.block_table_stride),
                 {"kv.block_table_stride", "kv.seq_lens", "kv.block_table", "kv.batch"});
        return true;
      },
      [&] {  // out over an input: q, the pool, the host-sized tables (checked); page ids (soft)
        const int w = static_cast<int>(r.range(0, 5));
        if (w == 0) return mutate_overlap(c, *out, "q", q->t.data, tensor_bytes_small(q->t));
        if (w == 1) return mutate_overlap(c, *out, "kv.k", kv.k, pool->pool_bytes);
        if (w == 2) return mutate_overlap(c, *out, "kv.v", kv.v, pool->pool_bytes);
        if (batch < 1) return false;
        if (w == 3) return mutate_overlap(c, *out, "kv.seq_lens", kv.seq_lens, batch * 4);
        if (!tb->csr)
          return mutate_overlap(c, *out, "kv.block_table", kv.block_table,
                                static_cast<i64>(tb->table.size()) * 4);
        if (w == 4)
          return mutate_overlap(c, *out, "kv.page_indptr", kv.page_indptr, (batch + 1) * 4);
        // the device page ids' extent (page_indptr[batch]) is unknown on the host
        const bool ok = mutate_overlap(c, *out, "kv.page_indices", kv.page_indices,
                                       static_cast<i64>(tb->indices.size()) * 4);
        if (ok && c.expect_reject && c.log.back().find("kv.page_indices") != std::string::npos) {
          c.expect_reject = false;
          soft(c, "out over kv.page_indices (device extent)");
        }
        return ok;
      },
      // plans that do not fit the run: what run_decode checks (a plan cannot be edited; a plan
      // of another problem, of another build or made by no planner can be passed)
      [&] {
        if (!c.touch("plan#problem")) return false;
        const int f = static_cast<int>(r.range(0, 4));
        attnstate::DecodeProblem p = pr;
        if (f == 0) {
          if (batch < 1) return false;
          p.batch = batch - 1;
        }
        if (f == 1) p.q_len = qlen == 8 ? 7 : qlen + 1;
        if (f == 2) p.heads_q = hq + hkv;
        if (f == 3) {
          const std::vector<i64> dims = attnstate_test::decode_head_dims();
          if (dims.size() < 2) return false;
          p.head_dim = dims[0] == d ? dims[1] : dims[0];
        }
        if (f == 4) p.kv_dtype = p.q_dtype = dt == DType::kF16 ? DType::kBF16 : DType::kF16;
        *plan = attnstate::cuda::plan_decode(p, tb->lens.data(), o, sms);
        c.reject("a plan of another problem (field " + std::to_string(f) + ")",
                 {"plan", "kv.batch", "q.shape", "kv.heads_kv", "kv.head_dim", "q.dtype",
                  "kv.dtype", "workspace", "workspace_bytes"});
        return true;
      },
      [&] {
        if (!c.touch("plan#problem")) return false;
        if (r.coin(50)) {
          attnstate::cuda::detail::DecodePlanAccess::data(*plan).catalog_fingerprint ^=
              std::uint64_t{1} << r.range(0, 63);
          c.reject("a plan of another kernel catalog (fingerprint forged)", {"plan"});
        } else {
          *plan = attnstate::cuda::DecodePlan{};
          c.reject("a default-constructed plan", {"plan"});
        }
        return true;
      },
      // the hand choices of the options: plans of the same layout, which must run
      [&] {
        if (!c.touch("plan#problem")) return false;
        attnstate::DecodeOptions h = o;
        const int f = static_cast<int>(r.range(0, 2));
        if (f == 0) h.programmatic_launch = true;
        if (f == 1) h.kernel = attnstate::DecodeKernel::kSplit;
        if (f == 2) h.split_cluster = 1;  // the workspace merge without groups
        *plan = attnstate::cuda::plan_decode(pr, tb->lens.data(), h, sms);
        c.note("plan with the hand choice " + std::to_string(f));
        return true;
      },
      [&] {  // more splits than the workspace was sized for
        if (plan->splits().max_splits >= 500 || !c.touch("plan#problem")) return false;
        attnstate::DecodeOptions more_splits = o;
        more_splits.policy = attnstate::SplitPolicy::kFixedCount;
        more_splits.num_splits = plan->splits().max_splits + static_cast<int>(r.range(1, 3));
        *plan = attnstate::cuda::plan_decode(pr, tb->lens.data(), more_splits, sms);
        if (plan->workspace_bytes() > ws->bytes && checked)
          c.reject("a plan of more splits than the workspace holds",
                   {"workspace_bytes", "workspace"}, false);
        else
          soft(c, "a plan of more splits");
        return true;
      },
  };
  muts.insert(muts.end(), more.begin(), more.end());
  for (auto& m : device_table_mutations(c, *tb, batch, kv.num_pages)) muts.push_back(m);
  std::vector<std::pair<std::string, Range>> inputs{{"kv.k", {kv.k, pool->pool_bytes}},
                                                    {"kv.v", {kv.v, pool->pool_bytes}}};
  if (batch > 0) inputs.push_back({"kv.seq_lens", {kv.seq_lens, batch * 4}});
  for (auto& m : workspace_mutations(c, *ws, need, checked, true, out.get(), q.get(), inputs))
    muts.push_back(m);
  apply_mutations(c, nmut, muts);
  maybe_wild(c, {[q](void* p) { q->t.data = p; }, [pool](void* p) { pool->kv.k = p; },
                 [pool](void* p) { pool->kv.v = p; }, [out](void* p) { out->v.o = p; },
                 [out](void* p) { out->v.lse = static_cast<float*>(p); }});
  if (!c.expect_reject) {
    allow_state(c, out->v, out->v.o, out->v.lse);
    if (ws->p != nullptr) c.allow(c.off_of(ws->p), static_cast<i64>(ws->bytes));
  }
  std::string ls;
  for (auto x : tb->lens) ls += " " + std::to_string(x);
  c.note(describe(kv, c) + " seq_lens (drawn):" + ls + (tb->csr ? " csr" : " block table"));
  c.note(describe(*q, c));
  c.note(describe(*out, c));
  c.note("plan: max_splits " + std::to_string(plan->splits().max_splits) + ", policy " +
         std::to_string(static_cast<int>(plan->splits().policy)) + ", " + plan->to_string() +
         ", workspace " + std::to_string(need) + " B @" + str(ws->p ? c.off_of(ws->p) : -1) +
         " passed " + std::to_string(ws->bytes));
  return {"attnstate::cuda::run_decode", [plan, q, pool, tb, out, ws] {
            attnstate::cuda::run_decode(*plan, q->t, pool->kv, out->v, ws->p, ws->bytes);
          }};
}

/// init_decode_workspace: writes only the workspace's tickets; too small or null is an error.
inline Built build_cuda_init_workspace(Ctx& c, int nmut, int num_sms) {
  Rng& r = c.rng;
  attnstate::DecodeProblem pr;
  pr.batch = r.coin(10) ? 0 : r.range(1, 3);
  pr.q_len = r.range(1, 8);
  pr.heads_kv = r.range(1, 2);
  pr.heads_q = pr.heads_kv * r.range(1, 4);
  pr.head_dim = r.pick(attnstate_test::decode_head_dims());
  pr.q_dtype = pr.kv_dtype = r.coin(50) ? DType::kF16 : DType::kBF16;
  std::vector<std::int32_t> lens(static_cast<std::size_t>(pr.batch));
  for (auto& x : lens) x = static_cast<std::int32_t>(r.range(0, 2000));
  attnstate::DecodeOptions o;
  o.policy = r.pick({attnstate::SplitPolicy::kAuto, attnstate::SplitPolicy::kFixedCount});
  o.num_splits = static_cast<int>(r.range(2, 4));
  auto plan = std::make_shared<attnstate::cuda::DecodePlan>(
      attnstate::cuda::plan_decode(pr, lens.data(), o, num_sms));
  const std::size_t need = plan->workspace_bytes();
  auto ws = std::make_shared<WorkspaceArg>();
  ws->alloc = static_cast<i64>(need) + 16 * r.range(0, 2);
  ws->off = c.alloc("workspace", ws->alloc, false);
  ws->p = c.ptr(ws->off);  // random bytes: init needs none
  ws->bytes = static_cast<std::size_t>(ws->alloc);
  if (need == 0) {
    c.accept_ok = true;  // nothing to do: any pointer, any size
    c.note("workspace_bytes() == 0");
  }
  apply_mutations(
      c, nmut,
      {[&] {
         if (!c.touch("ws#bytes")) return false;
         ws->bytes =
             need == 0 ? 0 : static_cast<std::size_t>(r.range(0, static_cast<i64>(need) - 1));
         if (need > 0) c.reject("workspace_bytes too small", {"workspace_bytes"});
         return true;
       },
       [&] {
         if (!c.touch("ws#ptr")) return false;
         ws->p = nullptr;
         if (need > 0) c.reject("workspace = null", {"workspace"}, false);
         return true;
       },
       [&] {  // documented as checked by run_decode, not here
         if (!c.touch("ws#ptr") || ws->bytes < 16) return false;
         ws->p = static_cast<char*>(ws->p) + 4;
         ws->bytes -= 16;
         if (ws->bytes < need)
           c.reject("workspace_bytes too small (misaligned)", {"workspace_bytes"});
         else
           soft(c, "workspace misaligned", {"workspace"});
         return true;
       }});
  if (!c.expect_reject && ws->p != nullptr)
    c.allow(c.off_of(ws->p), static_cast<i64>(std::min<std::size_t>(ws->bytes, need)));
  c.note("batch " + str(pr.batch) + ", q_len " + str(pr.q_len) + ", heads " + str(pr.heads_q) +
         "/" + str(pr.heads_kv) + ", head_dim " + str(pr.head_dim) + ", max_splits " +
         std::to_string(plan->splits().max_splits) + ", need " + std::to_string(need) +
         ", passed " + std::to_string(ws->bytes));
  return {"attnstate::cuda::init_decode_workspace",
          [plan, ws] { attnstate::cuda::init_decode_workspace(*plan, ws->p, ws->bytes); }};
}

// ---------------------------------------------------------------------------------------------
// Cascade.

/// Which cascade entry point a case calls.
enum class CascadeCall { kRun, kLevel, kMerge };

/// run_cascade (or one level, or the merge) on a plan from plan_cascade. `grouping`: also edit
/// the device request grouping, which the docs require to be the planned one (soft: it must not
/// make the kernels leave the arena).
inline Built build_cuda_cascade(Ctx& c, int nmut, int num_sms, CascadeCall call, bool grouping) {
  Rng& r = c.rng;
  namespace gpu = attnstate::cuda;
  gpu::CascadeShape sh;
  sh.batch = r.range(1, 3);
  sh.q_len = r.range(1, 3);
  sh.heads_kv = r.range(1, 2);
  sh.heads_q = sh.heads_kv * r.range(1, 2);
  sh.head_dim =
      r.pick(attnstate_test::only_compiled({64, 128, 128}, attnstate_test::cascade_head_dims()));
  sh.page_size = r.pick<i64>({1, 3, 8, 16, 32});
  sh.num_pages = r.range(1, 6);
  sh.dtype = r.coin(60) ? DType::kBF16 : DType::kF16;
  auto pool = std::make_shared<PoolArg>(
      make_cuda_pool(c, sh.heads_kv, sh.head_dim, sh.dtype, sh.page_size, sh.num_pages));
  attnstate::PagedKvCache& kv = pool->kv;
  attnstate::CascadeOptions opt;
  opt.causal = r.coin(60);
  opt.scale = valid_scale(c);
  const int nl = static_cast<int>(r.range(1, 3));
  struct Level {
    std::vector<std::int32_t> req, pip, pix, lens;
    i64 req_off = -1, pip_off = -1, pix_off = -1, lens_off = -1;
  };
  auto lv = std::make_shared<std::vector<Level>>(static_cast<std::size_t>(nl));
  std::vector<attnstate::CascadeLevel> host(static_cast<std::size_t>(nl));
  auto dev = std::make_shared<std::vector<attnstate::CascadeLevel>>(static_cast<std::size_t>(nl));
  for (int l = 0; l < nl; ++l) {
    Level& L = (*lv)[static_cast<std::size_t>(l)];
    // the last level often one segment per request (the decode-eligible unique suffixes)
    const bool unique = l == nl - 1 && r.coin(50);
    const i64 ns = unique ? sh.batch : r.range(1, 3);
    L.req = {0};
    for (i64 s = 1; s < ns; ++s)
      L.req.push_back(static_cast<std::int32_t>(unique ? s : r.range(L.req.back(), sh.batch)));
    L.req.push_back(static_cast<std::int32_t>(sh.batch));
    L.pip = {0};
    for (i64 s = 0; s < ns; ++s) {
      const bool used = L.req[static_cast<std::size_t>(s + 1)] > L.req[static_cast<std::size_t>(s)];
      const i64 lo = opt.causal && sh.q_len > 1 && l == nl - 1 && used ? sh.q_len - 1 : 0;
      const i64 np =
          std::max<i64>(r.range(unique ? 1 : 0, 3), (lo + sh.page_size - 1) / sh.page_size);
      for (i64 i = 0; i < np; ++i)
        L.pix.push_back(static_cast<std::int32_t>(r.range(0, sh.num_pages - 1)));
      L.pip.push_back(static_cast<std::int32_t>(L.pip.back() + np));
      L.lens.push_back(static_cast<std::int32_t>(r.range(lo, np * sh.page_size)));
    }
    const std::string p = "levels[" + std::to_string(l) + "]";
    L.req_off = alloc_i32(c, p + ".request_indptr", L.req);
    L.pip_off = alloc_i32(c, p + ".page_indptr", L.pip);
    L.pix_off =
        alloc_i32(c, p + ".page_indices", L.pix.empty() ? std::vector<std::int32_t>{0} : L.pix);
    L.lens_off = alloc_i32(c, p + ".seg_lens", L.lens);
    host[static_cast<std::size_t>(l)] = {ns, L.req.data(), L.pip.data(),
                                         L.pix.empty() ? nullptr : L.pix.data(), L.lens.data()};
    (*dev)[static_cast<std::size_t>(l)] = {ns, static_cast<const std::int32_t*>(c.ptr(L.req_off)),
                                           static_cast<const std::int32_t*>(c.ptr(L.pip_off)),
                                           static_cast<const std::int32_t*>(c.ptr(L.pix_off)),
                                           static_cast<const std::int32_t*>(c.ptr(L.lens_off))};
  }
  gpu::CascadeTuning tu;
  if (r.coin(40)) {
    tu.tile_rows = static_cast<int>(r.pick<i64>({0, 16, 64, 128}));
    tu.chunk = static_cast<int>(r.pick<i64>({0, 64, 128}));
    tu.kernel =
        r.pick({gpu::CascadeKernel::kAuto, gpu::CascadeKernel::kMma, gpu::CascadeKernel::kWgmma});
    tu.decode_last_level = r.coin(70);
    tu.decode_splits = static_cast<int>(r.pick<i64>({0, 1, 2, 3}));
    tu.decode_fold = static_cast<int>(r.range(-1, 1));
  }
  const int sms = r.coin(70) ? num_sms : static_cast<int>(r.range(1, 8));
  if (tu.decode_sms >= sms) tu.decode_sms = -1;
  auto plan =
      std::make_shared<gpu::CascadePlan>(gpu::plan_cascade(sh, host.data(), nl, opt, sms, tu));
  const std::size_t need = plan->workspace_bytes();
  auto ws = std::make_shared<WorkspaceArg>(make_workspace(c, need));
  // q: 16-byte aligned rows, strides multiples of 8 (run_cascade's requirement)
  auto q = std::make_shared<TensorArg>();
  q->name = "q";
  {
    attnstate::ConstTensorView& t = q->t;
    t.rank = 4;
    t.dtype = sh.dtype;
    t.space = c.space;
    const i64 shape[4] = {sh.batch, sh.q_len, sh.heads_q, sh.head_dim};
    i64 s = 1;
    for (int i = 3; i >= 0; --i) {
      t.shape[i] = shape[i];
      t.stride[i] = s;
      s = s * shape[i] + (i < 3 && r.coin(25) ? 8 * r.range(1, 2) : 0);
    }
    const i64 bytes = tensor_bytes_small(t);
    const i64 off = c.alloc("q", bytes, true);
    fill_values(c, off, bytes, sh.dtype);
    t.data = c.ptr(off);
  }
  const i64 tokens = sh.batch * sh.q_len;
  auto out = std::make_shared<StateArg>(
      make_state(c, "out", tokens, sh.heads_q, sh.head_dim, true, draw_dtype(r), draw_base(r)));
  auto num_levels = std::make_shared<int>(nl);
  auto dev_ptr = std::make_shared<const attnstate::CascadeLevel*>(dev->data());
  auto level = std::make_shared<int>(static_cast<int>(r.range(0, nl - 1)));
  const bool uses_q = call != CascadeCall::kMerge, uses_out = call != CascadeCall::kLevel;
  const auto lvl = [](int l, const char* f) { return "levels[" + std::to_string(l) + "]." + f; };
  // the levels a call reads
  const auto reads = [&](int l) { return call == CascadeCall::kRun || *level == l; };
  std::vector<std::function<bool()>> muts;
  if (uses_q) {
    muts = pool_mutations(c, pool, true);
    for (auto& m : muts)  // check_inputs also names 'q' (strides) and the planned fields
      m = [&c, m] {
        if (!m()) return false;
        for (const char* b : {"q", "kv.page_size", "kv.heads_kv", "kv.head_dim", "kv.dtype"})
          c.blame.push_back(b);
        return true;
      };
    const std::vector<std::function<bool()>> qm{
        [&] {
          const bool ok = mutate_tensor(c, *q, {{"q"}, {"q"}, {"q"}, {"q"}});
          if (ok) c.blame.push_back("q");
          return ok;
        },
        [&] {  // strides or pointer off the 16-byte grid
          if (!c.touch("q#align")) return false;
          if (r.coin(50))
            q->t.stride[static_cast<int>(r.range(0, 2))] += r.pick<i64>({1, 4});
          else
            q->t.data = static_cast<const char*>(q->t.data) + 2 * r.range(1, 7);
          c.reject("q off the 16-byte grid", {"q"}, false);
          return true;
        },
        [&] {  // a level's num_segments or arrays
          const int l = static_cast<int>(r.range(0, nl - 1));
          if (!reads(l) || !c.touch("lv#" + std::to_string(l))) return false;
          attnstate::CascadeLevel& d = (*dev)[static_cast<std::size_t>(l)];
          const int f = static_cast<int>(r.range(0, 3));
          if (f == 0) {
            d.num_segments = r.pick<i64>({0, -1, d.num_segments + 1, kI64Max});
            c.reject(lvl(l, "num_segments") + " edited", {lvl(l, "num_segments")});
            return true;
          }
          const std::int32_t** fields[3] = {&d.request_indptr, &d.page_indptr, &d.seg_lens};
          const char* names[3] = {"request_indptr", "page_indptr", "seg_lens"};
          *fields[f - 1] = nullptr;
          c.reject(lvl(l, names[f - 1]) + " = null",
                   {lvl(l, names[f - 1]), "kv.seq_lens", "kv.page_indptr"}, false);
          return true;
        },
        [&] {  // page_indices null where the plan saw pages
          const int l = static_cast<int>(r.range(0, nl - 1));
          if (!reads(l) || l >= plan->num_levels() || !plan->level(l).has_pages ||
              !c.touch("lv#" + std::to_string(l)))
            return false;
          (*dev)[static_cast<std::size_t>(l)].page_indices = nullptr;
          c.reject(lvl(l, "page_indices") + " = null", {lvl(l, "page_indices"), "kv.page_indices"},
                   false);
          return true;
        },
        [&] {  // device contents: clamped (soft)
          const int l = static_cast<int>(r.range(0, nl - 1));
          Level& L = (*lv)[static_cast<std::size_t>(l)];
          const int f = static_cast<int>(r.range(0, 2));
          if (f == 0) {
            if (L.pix.empty()) return false;
            const i64 pos = r.range(0, static_cast<i64>(L.pix.size()) - 1);
            const auto x = static_cast<std::int32_t>(
                r.pick<i64>({-1, sh.num_pages, sh.num_pages + 1000, INT32_MAX, INT32_MIN}));
            c.put<std::int32_t>(L.pix_off + 4 * pos, x);
            soft(c, lvl(l, "page_indices") + "[" + str(pos) + "] = " + std::to_string(x));
          } else if (f == 1) {
            const i64 s = r.range(0, static_cast<i64>(L.lens.size()) - 1);
            const auto x = r.pick<std::int32_t>({-1, INT32_MIN, INT32_MAX, 1 << 20, 200});
            c.put<std::int32_t>(L.lens_off + 4 * s, x);
            soft(c, lvl(l, "seg_lens") + "[" + str(s) + "] = " + std::to_string(x));
          } else {
            const i64 i = r.range(0, static_cast<i64>(L.pip.size()) - 1);
            const auto x = r.pick<std::int32_t>({-1, INT32_MIN, INT32_MAX, 1 << 30, 2});
            c.put<std::int32_t>(L.pip_off + 4 * i, x);
            soft(c, lvl(l, "page_indptr") + "[" + str(i) + "] = " + std::to_string(x));
          }
          return true;
        },
    };
    muts.insert(muts.end(), qm.begin(), qm.end());
    if (grouping)
      muts.push_back([&] {  // the device request grouping (the docs: must be the planned one)
        const int l = static_cast<int>(r.range(0, nl - 1));
        Level& L = (*lv)[static_cast<std::size_t>(l)];
        const i64 i = r.range(0, static_cast<i64>(L.req.size()) - 1);
        const auto x = r.pick<std::int32_t>(
            {-1, INT32_MIN, INT32_MAX, 1 << 20, static_cast<std::int32_t>(sh.batch + 1), 0});
        c.put<std::int32_t>(L.req_off + 4 * i, x);
        soft(c, lvl(l, "request_indptr") + "[" + str(i) + "] = " + std::to_string(x) +
                    " (device grouping)");
        return true;
      });
  }
  if (uses_out) {
    const std::vector<std::function<bool()>> om{
        [&] { return mutate_state(c, *out, {}); },
        [&] {
          const int f = static_cast<int>(r.range(0, 2));
          return mutate_mismatch(c, *out, {}, f);
        },
        [&] {  // out over q and the pool (checked by run_cascade), over the level arrays (F5)
          if (call != CascadeCall::kRun) return false;
          const int w = static_cast<int>(r.range(0, 3));
          if (w == 0) return mutate_overlap(c, *out, "q", q->t.data, tensor_bytes_small(q->t));
          if (w == 1) return mutate_overlap(c, *out, "kv.k", kv.k, pool->pool_bytes);
          if (w == 2) return mutate_overlap(c, *out, "kv.v", kv.v, pool->pool_bytes);
          const int l = static_cast<int>(r.range(0, nl - 1));
          const Level& L = (*lv)[static_cast<std::size_t>(l)];
          const int f = static_cast<int>(r.range(0, 2));
          const i64 off = f == 0 ? L.req_off : f == 1 ? L.pip_off : L.lens_off;
          const i64 n = static_cast<i64>(f == 0   ? L.req.size()
                                         : f == 1 ? L.pip.size()
                                                  : L.lens.size());
          const bool was = c.expect_reject, was_structural = c.structural_reject;
          const auto blame_size = c.blame.size();
          if (!mutate_overlap(c, *out, "levels[" + std::to_string(l) + "]", c.ptr(off), n * 4))
            return false;
          c.log.back() = "moved: " + c.log.back();
          c.expect_reject = was;
          c.structural_reject = was_structural;
          c.blame.resize(blame_size);
          reject_unless_pending(c, kPendingCudaCascadeOutOverLevels, "F5-out-over-levels",
                                "out over a level array of level " + std::to_string(l),
                                {"out", "levels"}, false);
          return true;
        },
    };
    muts.insert(muts.end(), om.begin(), om.end());
  }
  // plans that are not this build's planner's (a plan cannot be edited): refused by name
  muts.push_back([&] {
    if (!c.touch("plan#hard")) return false;
    if (r.coin(50)) {
      gpu::detail::CascadePlanAccess::data(*plan).catalog_fingerprint ^= std::uint64_t{1}
                                                                         << r.range(0, 63);
      c.reject("a plan of another kernel catalog (fingerprint forged)", {"plan"});
    } else {
      *plan = gpu::CascadePlan{};
      c.reject("a default-constructed plan", {"plan"});
    }
    return true;
  });
  muts.push_back([&] {  // the tunings that change no workspace: plans that must run
    if (!c.touch("plan#hard")) return false;
    gpu::CascadeTuning t = tu;
    t.overlap_levels = r.coin(50);
    t.prefetch_pages = r.coin(50);
    *plan = gpu::plan_cascade(sh, host.data(), nl, opt, sms, t);
    c.note("plan with overlap_levels " + std::to_string(t.overlap_levels) + ", prefetch_pages " +
           std::to_string(t.prefetch_pages));
    return true;
  });
  if (call == CascadeCall::kRun) {
    muts.push_back([&] {
      if (!c.touch("call#levels")) return false;
      if (r.coin(50)) {
        *num_levels = static_cast<int>(r.pick<i64>({0, -1, nl + 1, nl - 1, 9}));
        if (*num_levels == nl) return false;
        c.reject("num_levels = " + std::to_string(*num_levels), {"num_levels"});
      } else {
        *dev_ptr = nullptr;
        c.reject("device_levels = null", {"device_levels"}, false);
      }
      return true;
    });
  }
  if (call == CascadeCall::kLevel)
    muts.push_back([&] {
      if (!c.touch("call#level")) return false;
      *level = static_cast<int>(r.pick<i64>({-1, nl, 8, INT32_MIN}));
      c.reject("level = " + std::to_string(*level), {"level"});
      return true;
    });
  std::vector<std::pair<std::string, Range>> inputs;
  if (uses_q) {
    inputs = {{"kv.k", {kv.k, pool->pool_bytes}}, {"kv.v", {kv.v, pool->pool_bytes}}};
    const Level& L0 = (*lv)[0];
    if (reads(0))  // run_cascade_level knows only the arrays of the level it runs
      inputs.push_back(
          {"levels[0].seg_lens", {c.ptr(L0.lens_off), static_cast<i64>(L0.lens.size()) * 4}});
  }
  {
    auto wm = workspace_mutations(c, *ws, need, true, call == CascadeCall::kRun, out.get(), q.get(),
                                  inputs);
    // the merge reads the workspace (nothing to overlap but out); a level writes it beside q
    if (call == CascadeCall::kMerge) wm.erase(wm.begin() + 4, wm.end());
    if (call == CascadeCall::kLevel) wm.erase(wm.begin() + 3);  // no out
    muts.insert(muts.end(), wm.begin(), wm.end());
  }
  apply_mutations(c, nmut, muts);
  maybe_wild(c, {[q](void* p) { q->t.data = p; }, [pool](void* p) { pool->kv.k = p; },
                 [pool](void* p) { pool->kv.v = p; }, [out](void* p) { out->v.o = p; },
                 [out](void* p) { out->v.lse = static_cast<float*>(p); }});
  if (!c.expect_reject) {
    if (uses_out) allow_state(c, out->v, out->v.o, out->v.lse);
    // the merge only reads the workspace; the others write it
    if (call != CascadeCall::kMerge && ws->p != nullptr)
      c.allow(c.off_of(ws->p), static_cast<i64>(ws->bytes));
  }
  c.note(describe(kv, c));
  for (int l = 0; l < nl; ++l) {
    const Level& L = (*lv)[static_cast<std::size_t>(l)];
    std::string s = "level " + std::to_string(l) + ": request_indptr";
    for (auto x : L.req) s += " " + std::to_string(x);
    s += "; page_indptr";
    for (auto x : L.pip) s += " " + std::to_string(x);
    s += "; page_indices";
    for (auto x : L.pix) s += " " + std::to_string(x);
    s += "; seg_lens";
    for (auto x : L.lens) s += " " + std::to_string(x);
    if (l >= plan->num_levels()) {  // a plan no planner made
      c.note(s + " (as drawn)");
      continue;
    }
    const gpu::CascadeLevelPlan& lp = plan->level(l);
    s += " | plan: tile_rows " + std::to_string(lp.tile_rows) + ", chunk " +
         std::to_string(lp.chunk) + ", max_splits " + std::to_string(lp.max_splits) +
         (lp.decode ? ", decode" : "") + (lp.wgmma ? ", wgmma" : "");
    c.note(s + " (as drawn)");
  }
  c.note(describe(*q, c));
  c.note(describe(*out, c));
  c.note("workspace " + std::to_string(need) + " B @" + str(ws->p ? c.off_of(ws->p) : -1) +
         " passed " + std::to_string(ws->bytes) + "; call " +
         std::to_string(static_cast<int>(call)) + " level " + std::to_string(*level));
  if (call == CascadeCall::kLevel)
    return {"attnstate::cuda::run_", [plan, level, q, pool, dev, lv, ws] {
              const int l = *level;
              const attnstate::CascadeLevel& d = l >= 0 && l < static_cast<int>(dev->size())
                                                     ? (*dev)[static_cast<std::size_t>(l)]
                                                     : (*dev)[0];
              gpu::run_cascade_level(*plan, l, q->t, pool->kv, d, ws->p, ws->bytes);
            }};
  if (call == CascadeCall::kMerge)
    return {"attnstate::cuda::run_cascade_merge",
            [plan, out, ws] { gpu::run_cascade_merge(*plan, out->v, ws->p, ws->bytes); }};
  return {"attnstate::cuda::run_", [plan, q, pool, dev, lv, dev_ptr, num_levels, out, ws] {
            gpu::run_cascade(*plan, q->t, pool->kv, *dev_ptr, *num_levels, out->v, ws->p,
                             ws->bytes);
          }};
}

}  // namespace attnstate_fuzz
