/// @file test_cpu_parallel.cpp
/// @brief The CPU backend's thread pool: parallel_for covers a range exactly once for any grain
///        and thread count, runs nested calls inline, rethrows exceptions; thread-count setters.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "attnstate/core/error.hpp"
#include "attnstate/cpu/merge.hpp"
#include "cpu/parallel.hpp"

namespace attnstate {
namespace {

using cpu::detail::parallel_for;

TEST(ParallelFor, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 5}) {
    cpu::set_num_threads(threads);
    for (std::int64_t n : {0, 1, 7, 100, 10007})
      for (std::int64_t grain : {1, 3, 64, 100000}) {
        std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n) + 10);
        for (auto& h : hits) h = 0;
        parallel_for(10, 10 + n, grain, [&](std::int64_t b, std::int64_t e) {
          EXPECT_LE(10, b);
          EXPECT_LE(e, 10 + n);
          EXPECT_LT(b, e);
          for (std::int64_t i = b; i < e; ++i) ++hits[static_cast<std::size_t>(i - 10)];
        });
        for (std::int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[static_cast<std::size_t>(i)].load(), 1)
              << "i=" << i << " n=" << n << " grain=" << grain << " threads=" << threads;
      }
  }
  cpu::set_num_threads(0);
}

TEST(ParallelFor, ChunksRespectTheGrain) {
  cpu::set_num_threads(4);
  std::atomic<std::int64_t> smallest{1 << 30};
  std::atomic<int> short_chunks{0};
  parallel_for(0, 1000, 50, [&](std::int64_t b, std::int64_t e) {
    if (e - b < 50 && e != 1000) ++short_chunks;
    std::int64_t cur = smallest.load();
    while (e - b < cur && !smallest.compare_exchange_weak(cur, e - b)) {
    }
  });
  EXPECT_EQ(short_chunks.load(), 0);
  cpu::set_num_threads(0);
}

TEST(ParallelFor, NestedCallsRunInlineAndComplete) {
  cpu::set_num_threads(3);
  std::atomic<std::int64_t> total{0};
  parallel_for(0, 64, 1, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i)
      parallel_for(0, 100, 1, [&](std::int64_t b2, std::int64_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 64 * 100);
  cpu::set_num_threads(0);
}

TEST(ParallelFor, ConcurrentCallersBothComplete) {
  cpu::set_num_threads(3);
  std::atomic<std::int64_t> total{0};
  auto work = [&] {
    for (int rep = 0; rep < 50; ++rep)
      parallel_for(0, 1000, 10, [&](std::int64_t b, std::int64_t e) { total += e - b; });
  };
  std::thread t1(work), t2(work);
  t1.join();
  t2.join();
  EXPECT_EQ(total.load(), 2 * 50 * 1000);
  cpu::set_num_threads(0);
}

TEST(ParallelFor, ExceptionReachesTheCaller) {
  cpu::set_num_threads(4);
  EXPECT_THROW(parallel_for(0, 1000, 1,
                            [](std::int64_t b, std::int64_t) {
                              if (b == 0) throw std::runtime_error("chunk failed");
                            }),
               std::runtime_error);
  // The pool is still usable afterwards.
  std::atomic<std::int64_t> total{0};
  parallel_for(0, 1000, 1, [&](std::int64_t b, std::int64_t e) { total += e - b; });
  EXPECT_EQ(total.load(), 1000);
  cpu::set_num_threads(0);
}

TEST(ThreadCount, SetAndRestoreDefault) {
  cpu::set_num_threads(3);
  EXPECT_EQ(cpu::num_threads(), 3);
  cpu::set_num_threads(1);
  EXPECT_EQ(cpu::num_threads(), 1);
  cpu::set_num_threads(0);
  const unsigned hw = std::thread::hardware_concurrency();
  EXPECT_EQ(cpu::num_threads(), hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, 256)));
}

TEST(ThreadCount, RejectsCountsOutsideTheBound) {
  cpu::set_num_threads(cpu::kMaxThreads);
  EXPECT_EQ(cpu::num_threads(), cpu::kMaxThreads);
  cpu::set_num_threads(0);
  for (int n : {-1, cpu::kMaxThreads + 1, 100000}) {
    try {
      cpu::set_num_threads(n);
      ADD_FAILURE() << "set_num_threads(" << n << ") was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.status(), Status::kInvalidArgument);
      EXPECT_EQ(std::string(e.what()),
                "attnstate::cpu::set_num_threads: argument 'n': expected 0..256 (0: the default), "
                "got " +
                    std::to_string(n));
    }
  }
  const unsigned hw = std::thread::hardware_concurrency();
  EXPECT_EQ(cpu::num_threads(), hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, 256)));
}

/// Threads of this process (the `Threads:` line of /proc/self/status), or -1.
int process_threads() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return -1;
}

/// Virtual memory of this process in bytes (`VmSize:`), or -1.
long long process_vm_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmSize:", 0) == 0) return std::atoll(line.c_str() + 7) * 1024;
  return -1;
}

// In a fresh process (death-test style "threadsafe" re-runs the binary) whose address space is
// capped just above its current size, so that the workers' stacks cannot be mapped.
[[maybe_unused]] void run_with_no_room_for_threads() {  // (unused under AddressSanitizer)
  rlimit lim{};
  lim.rlim_cur = lim.rlim_max = static_cast<rlim_t>(process_vm_bytes() + (16ll << 20));
  if (setrlimit(RLIMIT_AS, &lim) != 0) std::exit(3);
  const int before = process_threads();
  cpu::set_num_threads(64);
  try {
    parallel_for(0, 1 << 20, 1, [](std::int64_t, std::int64_t) {});
    std::exit(4);  // 63 workers of 8 MiB stacks in 16 MiB: the call must not succeed
  } catch (const Error& e) {
    if (e.status() != Status::kResourceExhausted) std::exit(5);
  } catch (...) {
    std::exit(6);  // anything but attnstate::Error
  }
  if (process_threads() != before) std::exit(7);  // a worker left behind
  // the pool still works: one thread runs inline
  cpu::set_num_threads(1);
  std::int64_t sum = 0;
  parallel_for(0, 1000, 1, [&](std::int64_t b, std::int64_t e) { sum += e - b; });
  std::exit(sum == 1000 ? 0 : 8);
}

TEST(ThreadCount, WorkersThatCannotStartGiveAnErrorAndLeaveNoThread) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "an address-space cap also starves AddressSanitizer's own allocator";
#else
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_with_no_room_for_threads(), testing::ExitedWithCode(0), "");
#endif
}

}  // namespace
}  // namespace attnstate
