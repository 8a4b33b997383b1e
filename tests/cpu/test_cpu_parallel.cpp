/// @file test_cpu_parallel.cpp
/// @brief The CPU backend's thread pool: parallel_for covers a range exactly once for any grain
///        and thread count, runs nested calls inline, rethrows exceptions; thread-count setters.
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

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
  EXPECT_EQ(cpu::num_threads(), hw == 0 ? 1 : static_cast<int>(hw));
}

}  // namespace
}  // namespace attnstate
