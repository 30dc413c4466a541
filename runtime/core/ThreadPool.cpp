#include "runtime/core/ThreadPool.h"

#include <algorithm>
#include <utility>

namespace dgemma {

ThreadPool::ThreadPool(int64_t numThreads) {
  if (numThreads <= 0) numThreads = std::max(1u, std::thread::hardware_concurrency());
  for (int64_t i = 1; i < numThreads; ++i) workers_.emplace_back([this, i] { workerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::parallelFor(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t numChunks = std::min<int64_t>(size(), (count + grain - 1) / grain);
  if (numChunks <= 1) {
    body(0, count);
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  body_ = &body;
  count_ = count;
  chunk_ = (count + numChunks - 1) / numChunks;
  numChunks_ = (count + chunk_ - 1) / chunk_;
  nextChunk_ = 0;
  pendingChunks_ = numChunks_;
  ++generation_;
  lock.unlock();
  wake_.notify_all();

  // The caller works too, then waits for the chunks the workers took.
  for (;;) {
    lock.lock();
    if (nextChunk_ >= numChunks_) break;
    int64_t chunk = nextChunk_++;
    lock.unlock();
    runChunk(chunk);
    lock.lock();
    --pendingChunks_;
    lock.unlock();
  }
  done_.wait(lock, [this] { return pendingChunks_ == 0; });
  body_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadPool::runChunk(int64_t chunk) {
  try {
    (*body_)(chunk * chunk_, std::min(count_, (chunk + 1) * chunk_));
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = std::current_exception();
    // Skip the chunks nobody started; the running ones (this one included) still count down.
    pendingChunks_ -= numChunks_ - nextChunk_;
    nextChunk_ = numChunks_;
  }
}

void ThreadPool::workerLoop(int64_t) {
  uint64_t seenGeneration = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || (generation_ != seenGeneration && body_ != nullptr); });
    if (stopping_) return;
    seenGeneration = generation_;
    while (body_ != nullptr && nextChunk_ < numChunks_) {
      int64_t chunk = nextChunk_++;
      lock.unlock();
      runChunk(chunk);
      lock.lock();
      if (--pendingChunks_ == 0) done_.notify_all();
    }
  }
}

}  // namespace dgemma
