/// @file cascade_shared_prompt.cpp
/// @brief A batch of requests that share a system prompt: cascade attention (the prompt as one
///        shared level, each request's own tokens as a second level) against plain decode over
///        each request's whole cache. Prints the largest difference and the speedup, on the CPU
///        and, when the CUDA backend is built and a GPU is present, on the GPU. Exits non-zero
///        if the answers differ beyond rounding.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "attnstate/core/decode_split.hpp"
#include "attnstate/core/paged_kv.hpp"
#include "attnstate/cpu/cascade.hpp"
#include "attnstate/cpu/decode.hpp"

#if defined(ATTNSTATE_HAS_CUDA)
#include <cuda_runtime_api.h>

#include "attnstate/cuda/cascade.hpp"
#include "attnstate/cuda/check.hpp"
#include "attnstate/cuda/decode.hpp"
#endif

namespace {

using namespace attnstate;

constexpr int kHeadsQ = 32, kHeadsKv = 8, kHeadDim = 128, kPage = 16;

/// The paged cache of the example: one shared prompt, a suffix per request.
struct SharedPromptBatch {
  int batch, prompt;
  std::vector<int> suffix;
  std::int64_t num_pages = 0;
  std::vector<bfloat16_t> k, v, q;
  // level 0: the prompt; level 1: the suffixes; plain: each request's concatenated page list
  std::vector<std::int32_t> l0_req, l0_pind, l0_ids, l0_len;
  std::vector<std::int32_t> l1_req, l1_pind, l1_ids, l1_len;
  std::vector<std::int32_t> plain_pind, plain_ids, plain_len;

  SharedPromptBatch(int b, int p, int max_suffix, unsigned seed) : batch(b), prompt(p) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> suf(1, max_suffix);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    const int pp = (prompt + kPage - 1) / kPage;
    for (int i = 0; i < pp; ++i) l0_ids.push_back(static_cast<std::int32_t>(num_pages++));
    l0_req = {0, batch};
    l0_pind = {0, pp};
    l0_len = {prompt};
    l1_req.push_back(0);
    l1_pind.push_back(0);
    plain_pind.push_back(0);
    for (int r = 0; r < batch; ++r) {
      suffix.push_back(suf(rng));
      const int sp = (suffix.back() + kPage - 1) / kPage;
      l1_req.push_back(r + 1);
      plain_ids.insert(plain_ids.end(), l0_ids.begin(), l0_ids.end());
      for (int i = 0; i < sp; ++i) {
        l1_ids.push_back(static_cast<std::int32_t>(num_pages));
        plain_ids.push_back(static_cast<std::int32_t>(num_pages++));
      }
      l1_pind.push_back(static_cast<std::int32_t>(l1_ids.size()));
      l1_len.push_back(suffix.back());
      plain_pind.push_back(static_cast<std::int32_t>(plain_ids.size()));
      plain_len.push_back(prompt + suffix.back());
    }
    const std::size_t pool = static_cast<std::size_t>(num_pages) * kPage * kHeadsKv * kHeadDim;
    k.resize(pool);
    v.resize(pool);
    q.resize(static_cast<std::size_t>(batch) * kHeadsQ * kHeadDim);
    for (auto* vec : {&k, &v, &q})
      for (bfloat16_t& x : *vec) x = from_float<bfloat16_t>(uni(rng));
  }

  //! [cascade-levels]
  std::vector<CascadeLevel> levels(const std::int32_t* const* arrays) const {
    std::vector<CascadeLevel> l(2);
    l[0].num_segments = 1;
    l[1].num_segments = batch;
    l[0].request_indptr = arrays[0];
    l[0].page_indptr = arrays[1];
    l[0].page_indices = arrays[2];
    l[0].seg_lens = arrays[3];
    l[1].request_indptr = arrays[4];
    l[1].page_indptr = arrays[5];
    l[1].page_indices = arrays[6];
    l[1].seg_lens = arrays[7];
    return l;
  }
  //! [cascade-levels]
  std::vector<CascadeLevel> host_levels() const {
    const std::int32_t* a[8] = {l0_req.data(), l0_pind.data(), l0_ids.data(), l0_len.data(),
                                l1_req.data(), l1_pind.data(), l1_ids.data(), l1_len.data()};
    return levels(a);
  }
  PagedKvCache pool(const void* kp, const void* vp, MemorySpace space) const {
    PagedKvCache kv;
    kv.k = kp;
    kv.v = vp;
    kv.dtype = DType::kBF16;
    kv.num_pages = num_pages;
    kv.page_size = kPage;
    kv.heads_kv = kHeadsKv;
    kv.head_dim = kHeadDim;
    kv.space = space;
    return kv;
  }
};

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool run_cpu(const SharedPromptBatch& s) {
  const std::size_t n = s.q.size();
  std::vector<float> o_c(n), o_p(n), lse_c(n / kHeadDim), lse_p(n / kHeadDim);
  const ConstTensorView q =
      make_tensor_view(s.q.data(), DType::kBF16, {s.batch, 1, kHeadsQ, kHeadDim});
  const auto levels = s.host_levels();
  const PagedKvCache pool = s.pool(s.k.data(), s.v.data(), MemorySpace::kHost);
  const double t_c = seconds([&] {
    cpu::cascade_attention(q, pool, levels.data(), 2, CascadeOptions{},
                           make_state_view(o_c.data(), DType::kF32, lse_c.data(), s.batch, kHeadsQ,
                                           kHeadDim, LseBase::kNatural));
  });
  PagedKvCache plain = pool;
  plain.page_indptr = s.plain_pind.data();
  plain.page_indices = s.plain_ids.data();
  plain.seq_lens = s.plain_len.data();
  plain.batch = s.batch;
  const double t_p = seconds([&] {
    cpu::decode(q, plain, DecodeOptions{},
                make_state_view(o_p.data(), DType::kF32, lse_p.data(), s.batch, kHeadsQ, kHeadDim,
                                LseBase::kNatural));
  });
  const double d = std::max(max_diff(o_c, o_p), max_diff(lse_c, lse_p));
  std::printf("CPU: cascade %.1f ms, plain decode %.1f ms, speedup %.2fx, max |diff| %.2e\n",
              t_c * 1e3, t_p * 1e3, t_p / t_c, d);
  return d < 1e-3;
}

#if defined(ATTNSTATE_HAS_CUDA)
template <class T>
T* to_device(const std::vector<T>& h) {
  T* p = nullptr;
  ATTNSTATE_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&p), std::max<std::size_t>(h.size(), 1) * sizeof(T)));
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

bool run_gpu(const SharedPromptBatch& s) {
  int dev = 0, sms = 0;
  ATTNSTATE_CUDA_CHECK(cudaGetDevice(&dev));
  ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  std::vector<void*> owned;
  auto up = [&](const auto& h) {
    auto* p = to_device(h);
    owned.push_back(p);
    return p;
  };
  const std::int32_t* a[8] = {up(s.l0_req), up(s.l0_pind), up(s.l0_ids), up(s.l0_len),
                              up(s.l1_req), up(s.l1_pind), up(s.l1_ids), up(s.l1_len)};
  const auto d_levels = s.levels(a);
  const PagedKvCache pool = s.pool(up(s.k), up(s.v), MemorySpace::kDevice);
  const ConstTensorView q = make_tensor_view(up(s.q), DType::kBF16, {s.batch, 1, kHeadsQ, kHeadDim},
                                             MemorySpace::kDevice);
  const std::size_t n = s.q.size();
  float* o = nullptr;
  float* lse = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&o), 2 * n * sizeof(float)));
  ATTNSTATE_CUDA_CHECK(
      cudaMalloc(reinterpret_cast<void**>(&lse), 2 * (n / kHeadDim) * sizeof(float)));
  const StateView out_c = make_state_view(o, DType::kF32, lse, s.batch, kHeadsQ, kHeadDim,
                                          LseBase::kNatural, MemorySpace::kDevice);
  const StateView out_p = make_state_view(o + n, DType::kF32, lse + n / kHeadDim, s.batch, kHeadsQ,
                                          kHeadDim, LseBase::kNatural, MemorySpace::kDevice);
  // cascade: plan on the host from the host arrays, run from the device arrays
  //! [cascade-plan]
  attnstate::cuda::CascadeShape shape;
  shape.batch = s.batch;
  shape.heads_q = kHeadsQ;
  shape.heads_kv = kHeadsKv;
  shape.head_dim = kHeadDim;
  shape.page_size = kPage;
  shape.num_pages = s.num_pages;
  shape.dtype = DType::kBF16;
  const auto h_levels = s.host_levels();  // the levels' arrays in host memory
  const attnstate::cuda::CascadePlan plan =
      attnstate::cuda::plan_cascade(shape, h_levels.data(), 2, {}, sms);
  //! [cascade-plan]
  void* ws = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&ws, std::max<std::size_t>(plan.workspace_bytes(), 1)));
  // plain decode over each request's whole page list
  DecodeProblem prob;
  prob.batch = s.batch;
  prob.heads_q = kHeadsQ;
  prob.heads_kv = kHeadsKv;
  prob.head_dim = kHeadDim;
  const cuda::DecodePlan dplan = cuda::plan_decode(prob, s.plain_len.data(), DecodeOptions{}, sms);
  void* dws = nullptr;
  ATTNSTATE_CUDA_CHECK(cudaMalloc(&dws, std::max<std::size_t>(dplan.workspace_bytes(), 1)));
  cuda::init_decode_workspace(dplan, dws, dplan.workspace_bytes());
  PagedKvCache plain = pool;
  plain.page_indptr = up(s.plain_pind);
  plain.page_indices = up(s.plain_ids);
  plain.seq_lens = up(s.plain_len);
  plain.batch = s.batch;

  cudaEvent_t e[3];
  for (auto& ev : e) ATTNSTATE_CUDA_CHECK(cudaEventCreate(&ev));
  const int reps = 20;
  cuda::run_cascade(plan, q, pool, d_levels.data(), 2, out_c, ws, plan.workspace_bytes());
  cuda::run_decode(dplan, q, plain, out_p, dws, dplan.workspace_bytes());
  ATTNSTATE_CUDA_CHECK(cudaEventRecord(e[0]));
  for (int i = 0; i < reps; ++i)
    cuda::run_cascade(plan, q, pool, d_levels.data(), 2, out_c, ws, plan.workspace_bytes());
  ATTNSTATE_CUDA_CHECK(cudaEventRecord(e[1]));
  for (int i = 0; i < reps; ++i)
    cuda::run_decode(dplan, q, plain, out_p, dws, dplan.workspace_bytes());
  ATTNSTATE_CUDA_CHECK(cudaEventRecord(e[2]));
  ATTNSTATE_CUDA_CHECK(cudaEventSynchronize(e[2]));
  float ms_c = 0, ms_p = 0;
  ATTNSTATE_CUDA_CHECK(cudaEventElapsedTime(&ms_c, e[0], e[1]));
  ATTNSTATE_CUDA_CHECK(cudaEventElapsedTime(&ms_p, e[1], e[2]));
  std::vector<float> h(2 * n), hl(2 * (n / kHeadDim));
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(h.data(), o, h.size() * 4, cudaMemcpyDeviceToHost));
  ATTNSTATE_CUDA_CHECK(cudaMemcpy(hl.data(), lse, hl.size() * 4, cudaMemcpyDeviceToHost));
  const double d = std::max(max_diff(std::vector<float>(h.begin(), h.begin() + n),
                                     std::vector<float>(h.begin() + n, h.end())),
                            max_diff(std::vector<float>(hl.begin(), hl.begin() + n / kHeadDim),
                                     std::vector<float>(hl.begin() + n / kHeadDim, hl.end())));
  std::printf("GPU: cascade %.1f us, plain decode %.1f us, speedup %.2fx, max |diff| %.2e\n",
              1e3 * ms_c / reps, 1e3 * ms_p / reps, ms_p / ms_c, d);
  for (auto& ev : e) ATTNSTATE_CUDA_CHECK(cudaEventDestroy(ev));
  for (void* p : owned) ATTNSTATE_CUDA_CHECK(cudaFree(p));
  for (void* p : {static_cast<void*>(o), static_cast<void*>(lse), ws, dws})
    ATTNSTATE_CUDA_CHECK(cudaFree(p));
  return d < 2e-2;
}
#endif

}  // namespace

int main() {
  bool ok = true;
  try {
    {
      const SharedPromptBatch cpu_batch(8, 2048, 256, 1);
      std::printf("CPU batch: %d requests sharing a %d-token prompt, suffixes of 1..256 tokens\n",
                  cpu_batch.batch, cpu_batch.prompt);
      ok = run_cpu(cpu_batch) && ok;
    }
#if defined(ATTNSTATE_HAS_CUDA)
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
      const SharedPromptBatch gpu_batch(128, 8192, 512, 2);
      std::printf("GPU batch: %d requests sharing a %d-token prompt, suffixes of 1..512 tokens\n",
                  gpu_batch.batch, gpu_batch.prompt);
      ok = run_gpu(gpu_batch) && ok;
    } else {
      (void)cudaGetLastError();
      std::printf("GPU: no device, skipped\n");
    }
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cascade_shared_prompt: %s\n", e.what());
    return 1;
  }
  std::printf(ok ? "same answer\n" : "ANSWERS DIFFER\n");
  return ok ? 0 : 1;
}
