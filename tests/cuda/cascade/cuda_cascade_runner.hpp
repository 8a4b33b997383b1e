/// @file cuda_cascade_runner.hpp
/// @brief Test support: a cascade problem uploaded to the GPU, planned and run into a
///        NaN-poisoned output, with the result downloaded for comparison.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "attnstate/cuda/cascade.hpp"
#include "cascade_case.hpp"
#include "cuda_test_utils.hpp"

namespace attnstate_test {

/// A `CascadeCase` in device memory with a plan, a workspace and an output.
struct GpuCascade {
  const CascadeCase* c = nullptr;
  DeviceBuffer<std::uint8_t> q, k, v, o;
  DeviceBuffer<float> lse;
  std::vector<DeviceBuffer<std::int32_t>> arrays;  // 4 per level
  std::vector<attnstate::CascadeLevel> levels;     // device views
  attnstate::cuda::CascadePlan plan;
  DeviceBuffer<std::uint8_t> workspace;
  attnstate::DType out_dtype;
  attnstate::LseBase out_base;
  attnstate::AttentionSinks sinks;  ///< Device sink logits for `launch`/`run_stages` (or none).
  DeviceBuffer<float> k_scales, v_scales;  ///< An fp8 case's per-head scales (device copies).

  GpuCascade(const CascadeCase& cc, attnstate::DType out_dt, attnstate::LseBase base,
             const attnstate::cuda::CascadeTuning& tuning = {}, int num_sms = 0)
      : c(&cc),
        q(cc.q_raw),
        k(cc.k_raw),
        v(cc.v_raw),
        o(static_cast<std::size_t>(cc.out_elems()) * attnstate::size_of(out_dt)),
        lse(static_cast<std::size_t>(cc.lse_elems())),
        out_dtype(out_dt),
        out_base(base) {
    upload_levels(cc);
    if (cc.spec.k_scale.size() > 1) k_scales = DeviceBuffer<float>(cc.spec.k_scale);
    if (cc.spec.v_scale.size() > 1) v_scales = DeviceBuffer<float>(cc.spec.v_scale);
    if (num_sms == 0) {
      int dev = 0;
      ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
      ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev));
    }
    const auto host = cc.host_levels();
    plan = attnstate::cuda::plan_cascade(shape(), host.data(), static_cast<int>(host.size()),
                                         cc.options(), num_sms, tuning);
    workspace = DeviceBuffer<std::uint8_t>(plan.workspace_bytes());
  }

  /// (Re)uploads the level arrays of `cc` (same sizes as the planned ones).
  void upload_levels(const CascadeCase& cc) {
    arrays.clear();
    levels.clear();
    auto buf = [](const std::vector<std::int32_t>& v) {
      return v.empty() ? DeviceBuffer<std::int32_t>() : DeviceBuffer<std::int32_t>(v);
    };
    for (const HostLevel& h : cc.levels) {
      arrays.push_back(buf(h.request_indptr));
      arrays.push_back(buf(h.page_indptr));
      arrays.push_back(buf(h.page_indices));
      arrays.push_back(buf(h.seg_lens));
      attnstate::CascadeLevel l;
      l.num_segments = static_cast<std::int64_t>(h.seg_lens.size());
      const std::size_t n = arrays.size();
      l.request_indptr = arrays[n - 4].get();
      l.page_indptr = arrays[n - 3].get();
      l.page_indices = arrays[n - 2].get();
      l.seg_lens = arrays[n - 1].get();
      levels.push_back(l);
    }
  }

  attnstate::cuda::CascadeShape shape() const {
    attnstate::cuda::CascadeShape s;
    s.batch = c->batch;
    s.q_len = c->spec.q_len;
    s.heads_q = c->spec.heads_q;
    s.heads_kv = c->spec.heads_kv;
    s.head_dim = c->spec.head_dim;
    s.page_size = c->spec.page_size;
    s.num_pages = c->num_pages;
    s.dtype = c->spec.dtype;
    s.kv_dtype = c->spec.kv_dtype;
    return s;
  }
  attnstate::ConstTensorView qv() const {
    return c->query(q.get(), attnstate::MemorySpace::kDevice);
  }
  attnstate::PagedKvCache kv() const {
    return c->pool(k.get(), v.get(), attnstate::MemorySpace::kDevice, k_scales.get(),
                   v_scales.get());
  }
  attnstate::StateView out() {
    return attnstate::make_state_view(o.get(), out_dtype, lse.get(), c->tokens(), c->spec.heads_q,
                                      c->spec.head_dim, out_base, attnstate::MemorySpace::kDevice);
  }
  /// Launches the whole cascade on `stream`.
  void launch(cudaStream_t stream = nullptr) {
    if (sinks.none())
      attnstate::cuda::run_cascade(plan, qv(), kv(), levels.data(), static_cast<int>(levels.size()),
                                   out(), workspace.get(), workspace.bytes(), stream);
    else
      attnstate::cuda::run_cascade(plan, qv(), kv(), levels.data(), static_cast<int>(levels.size()),
                                   sinks, out(), workspace.get(), workspace.bytes(), stream);
  }
  /// Poisons the output, runs, synchronises.
  void run() {
    o.poison();
    lse.poison();
    launch();
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  /// Poisons the output and the workspace (NaN), runs every level with `run_cascade_level` and
  /// then `run_cascade_merge`, synchronises.
  void run_stages() {
    o.poison();
    lse.poison();
    workspace.poison();
    for (int l = 0; l < static_cast<int>(levels.size()); ++l)
      attnstate::cuda::run_cascade_level(plan, l, qv(), kv(), levels[l], workspace.get(),
                                         workspace.bytes());
    if (sinks.none())
      attnstate::cuda::run_cascade_merge(plan, out(), workspace.get(), workspace.bytes());
    else
      attnstate::cuda::run_cascade_merge(plan, sinks, out(), workspace.get(), workspace.bytes());
    ATTNSTATE_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<float> o_host() const {
    const auto raw = o.download();
    return decode(raw.data(), out_dtype, static_cast<std::size_t>(c->out_elems()));
  }
  std::vector<float> lse_host() const { return lse.download(); }
  /// Compares the last result with the case's reference.
  ::testing::AssertionResult check(const CascadeCase& ref) const {
    return matches_reference(ref, o_host(), lse_host(), out_base,
                             o_tolerance(ref.spec.dtype, out_dtype), 1e-3);
  }
};

}  // namespace attnstate_test
