#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "runtime/core/ThreadPool.h"

namespace dgemma {
namespace {

// Every index is visited exactly once, whatever the count/grain/thread combination.
TEST(ThreadPool, CoversEveryIndexOnce) {
  for (int64_t threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t count : {0, 1, 7, 64, 1000}) {
      for (int64_t grain : {1, 3, 100}) {
        std::vector<std::atomic<int>> visits(count);
        pool.parallelFor(count, grain, [&](int64_t begin, int64_t end) {
          ASSERT_LE(begin, end);
          for (int64_t i = begin; i < end; ++i) visits[i]++;
        });
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(visits[i].load(), 1) << "count " << count << " grain " << grain;
      }
    }
  }
}

TEST(ThreadPool, ManySuccessiveLoops) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  for (int round = 0; round < 500; ++round)
    pool.parallelFor(100, 10, [&](int64_t begin, int64_t end) { total += end - begin; });
  EXPECT_EQ(total.load(), 500 * 100);
}

// Each chunk waits until the other has started, so the loop finishes only if the worker takes
// one: whether it is still spinning from the last loop or has gone to sleep on the condition
// variable (after a pause longer than its spin), it must see the new loop. A lost wake-up would
// hang here; the wait gives up after ten seconds and fails instead.
TEST(ThreadPool, WorkersJoinEveryLoopWhetherSpinningOrAsleep) {
  ThreadPool pool(2);
  for (int round = 0; round < 40; ++round) {
    if (round % 4 == 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::atomic<int> started{0};
    std::atomic<bool> timedOut{false};
    pool.parallelFor(2, 1, [&](int64_t, int64_t) {
      ++started;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (started.load() < 2)
        if (std::chrono::steady_clock::now() > deadline) {
          timedOut = true;
          return;
        }
    });
    ASSERT_FALSE(timedOut.load()) << "round " << round << ": the worker never took the second chunk";
  }
}

TEST(ThreadPool, UsesSeveralThreadsForLargeWork) {
  ThreadPool pool(2);
  std::atomic<int> chunks{0};
  pool.parallelFor(1000, 100, [&](int64_t, int64_t) { chunks++; });
  EXPECT_EQ(chunks.load(), 2);  // one chunk per thread
}

}  // namespace
}  // namespace dgemma

namespace dgemma {
namespace {

// A throwing body neither crashes a worker nor leaves the pool stuck: the exception reaches the
// caller and the pool keeps working.
TEST(ThreadPool, RethrowsTheBodysException) {
  ThreadPool pool(3);
  for (int64_t failing : {0, 5, 99}) {
    EXPECT_THROW(pool.parallelFor(100, 1,
                                  [&](int64_t begin, int64_t end) {
                                    if (begin <= failing && failing < end) throw std::runtime_error("chunk failed");
                                  }),
                 std::runtime_error);
  }
  std::atomic<int64_t> total{0};
  pool.parallelFor(100, 1, [&](int64_t begin, int64_t end) { total += end - begin; });
  EXPECT_EQ(total.load(), 100);
}

}  // namespace
}  // namespace dgemma
