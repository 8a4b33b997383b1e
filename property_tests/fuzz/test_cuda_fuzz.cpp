/// @file test_cuda_fuzz.cpp
/// @brief The API fuzzer over the CUDA backend (issue 16 item 2): the generators of the CPU
///        fuzzer (fuzz_merge_cases.hpp) and the CUDA producers' (fuzz_cuda_cases.hpp) drive every
///        `attnstate::cuda` entry point over one cudaMalloc'd arena filled with random bytes.
///        After each call the device is synchronised and the whole arena copied back: canaries
///        and inputs must be unchanged, outputs changed only inside their rows. 2,000 cases per
///        entry point by default; scripts/gpu-check.sh runs it under compute-sanitizer with
///        RC_PARAMS=max_success=50 (memcheck: no access outside the arena). Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <stdexcept>

#include "attnstate/cuda/merge.hpp"
#include "attnstate/testing/rapidcheck_support.hpp"
#include "compiled_dims.hpp"
#include "cuda_test_utils.hpp"
#include "fuzz_cuda_cases.hpp"
#include "rc_defaults.hpp"

ATTNSTATE_RC_DEFAULT_PARAMS("max_success=2000");

namespace {

using namespace attnstate_fuzz;  // NOLINT(google-build-using-namespace): test file
namespace gpu = attnstate::cuda;

constexpr i64 kArenaBytes = 1 << 20;

/// Set once a CUDA call failed after a case (a sticky error: the context is lost).
bool g_context_lost = false;
std::string g_cuda_error;

/// The device arena (one cudaMalloc), its pinned host image, and a freed device range for
/// wild pointers (only ever passed in calls that must be rejected before any access).
struct DeviceArena {
  std::uint8_t* dev = nullptr;
  std::uint8_t* host = nullptr;
  std::uintptr_t wild = 0;
  int num_sms = 1;
  DeviceArena() {
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&dev, kArenaBytes));
    ATTNSTATE_CUDA_CHECK(cudaMallocHost(&host, kArenaBytes));
    void* w = nullptr;
    ATTNSTATE_CUDA_CHECK(cudaMalloc(&w, 1 << 16));
    wild = reinterpret_cast<std::uintptr_t>(w);
    ATTNSTATE_CUDA_CHECK(cudaFree(w));
    int d = 0;
    ATTNSTATE_CUDA_CHECK(cudaGetDevice(&d));
    ATTNSTATE_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, d));
  }
};
DeviceArena& arena() {
  static DeviceArena a;
  return a;
}

void note_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  g_context_lost = true;
  g_cuda_error = std::string(what) + ": " + cudaGetErrorName(e) + " " + cudaGetErrorString(e);
}

struct CudaBackend {
  static constexpr const char* kPrefix = "attnstate::cuda::";
  static constexpr bool kHostTables = false;  // indptr contents are clamped on the device
  static i64 draw_dim(Rng& r) { return r.pick(attnstate_test::merge_head_dims()); }
  static void upload(Ctx& c) {
    note_cuda(cudaMemcpy(arena().dev, c.image(), static_cast<std::size_t>(c.size()),
                         cudaMemcpyHostToDevice),
              "upload");
  }
  static void download(Ctx& c) {
    if (g_context_lost) return;  // the image stays the snapshot: the case reports the error
    note_cuda(cudaMemcpy(c.image(), arena().dev, static_cast<std::size_t>(c.size()),
                         cudaMemcpyDeviceToHost),
              "download");
  }
  /// Inside run_case's try: an asynchronous kernel fault becomes a reported failure.
  static void sync() {
    const cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      note_cuda(e, "cudaDeviceSynchronize after the call");
      throw std::runtime_error(g_cuda_error);
    }
  }
  static void merge_state(ConstStateView a, ConstStateView b, StateView out) {
    gpu::merge_state(a, b, out);
  }
  static void merge_state(ConstStateView a, ConstStateView b, StateView out, TokenMask m) {
    gpu::merge_state(a, b, out, m);
  }
  static void merge_state_inplace(StateView acc, ConstStateView o, TokenMask m) {
    gpu::merge_state_inplace(acc, o, m);
  }
  static void merge_states(ConstStateStackView s, StateView out) { gpu::merge_states(s, out); }
  static void merge_states_ragged(ConstStateView rows, const std::int32_t* ip, StateView out) {
    gpu::merge_states_ragged(rows, ip, out);
  }
  static void rebase(ConstStateView in, StateView out) { gpu::rebase(in, out); }
  static void mark_empty_rows(StateView s) { gpu::mark_empty_rows(s); }
};

/// Per property: cases, valid ones, failures (all collected: one device run should show every
/// kind of failure, not stop at the first), and how often each pending finding was accepted.
struct Counts {
  long cases = 0, valid = 0, returned = 0, failures = 0;
  std::vector<std::string> first_failures;
  std::map<std::string, long> pending_accepted, pending_drawn;
};
Counts g_counts;

template <class Build>
void fuzz_one(Build build) {
  const Draw d = draw();
  DeviceArena& a = arena();
  Ctx c(a.host, kArenaBytes, reinterpret_cast<std::uintptr_t>(a.dev), a.wild, MemorySpace::kDevice,
        d.seed);
  std::string err;
  bool returned = false;
  try {
    const Built b = build(c, d.nmut);
    const Built wrapped{b.func, [&b, &returned] {
                          b.call();
                          returned = true;
                        }};
    err = run_case<CudaBackend>(c, wrapped, b.func.back() == '_');
  } catch (const std::exception& e) {  // a builder's plan_* call rejected a valid problem
    // a draw whose buffers do not fit the arena is no case at all
    if (std::string(e.what()).rfind("fuzzer: arena exhausted", 0) == 0) return;
    err = std::string("builder threw: ") + e.what() + case_log(c);
  }
  ++g_counts.cases;
  if (!c.expect_reject) ++g_counts.valid;
  if (returned) ++g_counts.returned;
  for (const auto& l : c.log)
    if (l.rfind("PENDING:", 0) == 0) {
      const std::string tag = l.substr(8, l.find(' ') - 8);
      ++g_counts.pending_drawn[tag];
      if (returned) ++g_counts.pending_accepted[tag];
    }
  if (!err.empty()) {
    ++g_counts.failures;
    if (g_counts.first_failures.size() < 5) g_counts.first_failures.push_back(err);
  }
  if (g_context_lost) {  // nothing after this can run: report and stop the process
    std::fprintf(stderr, "FATAL: CUDA context lost (%s) in case:\n%s\n", g_cuda_error.c_str(),
                 err.c_str());
    std::fflush(stderr);
    std::_Exit(3);
  }
}

/// Runs a property over every case and checks the outcome: no failure, and 15-60% valid calls.
template <class Build>
void run_property(const char* name, Build build) {
  ATTNSTATE_REQUIRE_GPU();
  g_counts = {};
  const auto result = rc::check(name, [&] { fuzz_one(build); });
  EXPECT_TRUE(result) << name;
  std::string pend;
  for (const auto& p : g_counts.pending_drawn)
    pend += " PENDING " + p.first + ": accepted " +
            std::to_string(g_counts.pending_accepted[p.first]) + " of " + std::to_string(p.second) +
            ";";
  std::printf("[ FUZZ     ] %s: %ld cases, %ld valid, %ld returned, %ld failures;%s\n", name,
              g_counts.cases, g_counts.valid, g_counts.returned, g_counts.failures, pend.c_str());
  EXPECT_EQ(g_counts.failures, 0) << name;
  for (const auto& f : g_counts.first_failures) ADD_FAILURE() << f;
  if (g_counts.cases >= 1000) {
    const double f = static_cast<double>(g_counts.valid) / static_cast<double>(g_counts.cases);
    EXPECT_GE(f, 0.15) << name << ": too few valid calls";
    EXPECT_LE(f, 0.6) << name << ": too few invalid calls";
  }
}

int sms() { return arena().num_sms; }

// --- the merge family (the CPU fuzzer's builders) ----------------------------------------------

TEST(FuzzCuda, MergeState) { run_property("cuda merge_state", build_merge_state<CudaBackend>); }
TEST(FuzzCuda, MergeStateInplace) {
  run_property("cuda merge_state_inplace", build_merge_state_inplace<CudaBackend>);
}
TEST(FuzzCuda, MergeStates) { run_property("cuda merge_states", build_merge_states<CudaBackend>); }
TEST(FuzzCuda, MergeStatesRagged) {
  run_property("cuda merge_states_ragged", build_merge_states_ragged<CudaBackend>);
}
TEST(FuzzCuda, Rebase) { run_property("cuda rebase", build_rebase<CudaBackend>); }
TEST(FuzzCuda, MarkEmptyRows) {
  run_property("cuda mark_empty_rows", build_mark_empty_rows<CudaBackend>);
}

// --- decode and cascade --------------------------------------------------------------------------

TEST(FuzzCuda, InitDecodeWorkspace) {
  run_property("cuda init_decode_workspace",
               [](Ctx& c, int n) { return build_cuda_init_workspace(c, n, sms()); });
}
TEST(FuzzCuda, RunDecode) {
  run_property("cuda run_decode", [](Ctx& c, int n) { return build_cuda_decode(c, n, sms()); });
}
TEST(FuzzCuda, RunCascade) {
  run_property("cuda run_cascade", [](Ctx& c, int n) {
    return build_cuda_cascade(c, n, sms(), CascadeCall::kRun, false);
  });
}
TEST(FuzzCuda, RunCascadeLevel) {
  run_property("cuda run_cascade_level", [](Ctx& c, int n) {
    return build_cuda_cascade(c, n, sms(), CascadeCall::kLevel, false);
  });
}
TEST(FuzzCuda, RunCascadeMerge) {
  run_property("cuda run_cascade_merge", [](Ctx& c, int n) {
    return build_cuda_cascade(c, n, sms(), CascadeCall::kMerge, false);
  });
}
/// The device request grouping edited (the docs require the planned one): soft, but it must
/// not take the kernels outside the arena.
TEST(FuzzCuda, RunCascadeDeviceGrouping) {
  run_property("cuda run_cascade (device grouping)", [](Ctx& c, int n) {
    return build_cuda_cascade(c, n, sms(), CascadeCall::kRun, true);
  });
}

// --- the device harness's own negative tests -----------------------------------------------------

/// A broken merge_state: a cudaMemset into the canary after out's LSEs, or into a.o (an input),
/// or accepts a call it must reject. The device oracle must flag each.
struct BrokenCudaBackend : CudaBackend {
  static int mode;
  static void merge_state(ConstStateView a, ConstStateView b, StateView out, TokenMask m = {}) {
    if (mode == 2) return;  // accepts everything, writes nothing
    gpu::merge_state(a, b, out, m);
    if (out.tokens == 0) return;
    if (mode == 0)
      ATTNSTATE_CUDA_CHECK(cudaMemset(out.lse + (out.tokens - 1) * out.lse_stride_token +
                                          (out.heads - 1) * out.lse_stride_head + 1 + 4,
                                      0x5A, 4));
    if (mode == 1) ATTNSTATE_CUDA_CHECK(cudaMemset(const_cast<void*>(a.o), 0x5A, 1));
  }
};
int BrokenCudaBackend::mode = 0;

TEST(FuzzCudaHarness, CatchesDeviceWritesOutsideOutputsAndAcceptedInvalidCalls) {
  ATTNSTATE_REQUIRE_GPU();
  for (int mode = 0; mode < 3; ++mode) {
    BrokenCudaBackend::mode = mode;
    int flagged = 0, eligible = 0;
    for (std::uint64_t seed = 1; seed <= 200; ++seed) {
      Ctx c(arena().host, kArenaBytes, reinterpret_cast<std::uintptr_t>(arena().dev), arena().wild,
            MemorySpace::kDevice, seed);
      const Built b = build_merge_state<BrokenCudaBackend>(c, mode == 2 ? 1 : 0);
      // mode 2 must be caught on invalid calls, the others on valid ones with rows
      if (mode == 2 ? c.expect_reject : !c.expect_reject) ++eligible;
      if (!run_case<BrokenCudaBackend>(c, b).empty()) ++flagged;
    }
    ASSERT_FALSE(g_context_lost) << g_cuda_error;
    EXPECT_GT(flagged, eligible / 2) << "mode " << mode;
    EXPECT_GT(eligible, 30) << "mode " << mode;
  }
}

/// Without a device the whole executable skips (CI): this test says so explicitly.
TEST(FuzzCudaHarness, SkipsWithoutGpu) {
  if (!attnstate_test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  EXPECT_GE(arena().num_sms, 1);
}

}  // namespace
