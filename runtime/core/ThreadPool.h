// A fixed set of worker threads for data-parallel loops in CPU kernels. OpenBLAS keeps its own
// threads for GEMM; everything else (elementwise, norms, softmax, reductions) runs here.
#pragma once

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
  void workerLoop(int64_t index);
  // Runs one chunk, recording the first exception instead of letting it escape a worker.
  void runChunk(int64_t chunk);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(int64_t, int64_t)>* body_ = nullptr;
  int64_t count_ = 0;
  int64_t chunk_ = 0;
  int64_t numChunks_ = 0;
  int64_t nextChunk_ = 0;
  int64_t pendingChunks_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool stopping_ = false;
};

}  // namespace dgemma
