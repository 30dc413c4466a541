// A fixed set of worker threads for data-parallel loops in CPU kernels: elementwise, norms,
// softmax, reductions, and the products that BlasThreading.h hands to the pool.
//
// A training step runs about 1700 kernels, most of them a few tens of microseconds long, and each
// parallelFor hands out work and waits for it. Waking a worker blocked on a condition variable takes
// 10 to 20 microseconds on a 2-core VM, as long as many of those kernels themselves. So between
// loops a worker spins for a while (kSpin in ThreadPool.cpp) watching for the next one, yielding its
// core to any other runnable thread as it goes, and only then blocks; the caller spins likewise
// while the last chunks finish. The chunks are those of a blocking pool: how a kernel's work is cut
// does not change, so neither do its results.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dgemma {

class ThreadPool {
 public:
  // numThreads <= 0: std::thread::hardware_concurrency().
  explicit ThreadPool(int64_t numThreads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int64_t size() const { return static_cast<int64_t>(workers_.size()) + 1; }

  // Calls body(begin, end) on disjoint chunks covering [0, count), each at least `grain` long
  // (except the last), on the workers and the calling thread; returns when all chunks are done.
  // An exception thrown by a body is rethrown here once every started chunk has finished (the
  // remaining chunks are skipped). Not reentrant: a body must not call parallelFor on the same pool.
  void parallelFor(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

 private:
  void workerLoop();
  // Runs chunks of the loop `generation` until none is left to claim.
  void runChunks(uint64_t generation);
  // Claims every chunk of `generation` that no thread has started, as done (after an exception).
  void skipRemainingChunks(uint64_t generation);
  void finishChunks(int64_t finished);

  std::vector<std::thread> workers_;

  // One loop at a time. Its body and geometry are written before `claims_` announces it and stay
  // unchanged until its last chunk is done, which is before the next loop can start.
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t count_ = 0;
  int64_t chunk_ = 0;
  // The loop's generation (high 32 bits), its number of chunks (16 bits) and the next unclaimed
  // chunk (low 16 bits), in one word, so that a thread can only claim a chunk of the loop it saw.
  std::atomic<uint64_t> claims_{0};
  std::atomic<int64_t> pendingChunks_{0};

  // Blocking, once spinning has gone on for kSpin.
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::atomic<int64_t> sleepingWorkers_{0};
  bool callerSleeping_ = false;  // guarded by mutex_
  std::exception_ptr error_;     // guarded by mutex_
  std::atomic<bool> stopping_{false};
};

}  // namespace dgemma
