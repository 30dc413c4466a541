#include "runtime/core/ThreadPool.h"

#include <algorithm>
#include <chrono>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dgemma {
namespace {

// How long a thread spins for the next loop (a worker) or for the last chunks (the caller) before
// it blocks. Longer than most gaps between a step's kernels, short enough that an idle pool soon
// sleeps.
constexpr std::chrono::microseconds kSpin{200};
// Spins between looks at the clock; each look also yields the core to a runnable thread, so
// spinning costs little where threads outnumber cores (ranks as threads in one process).
constexpr int kSpinsPerYield = 64;

void pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Spins until ready() or for kSpin; returns ready().
template <typename Ready>
bool spinUntil(Ready ready) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    for (int i = 0; i < kSpinsPerYield; ++i) {
      if (ready()) return true;
      pause();
    }
    if (std::chrono::steady_clock::now() - start > kSpin) return ready();
    std::this_thread::yield();
  }
}

constexpr uint64_t kChunkBits = 16, kChunkMask = (uint64_t{1} << kChunkBits) - 1;
constexpr uint64_t kGenerationMask = (uint64_t{1} << 32) - 1;
uint64_t generationOf(uint64_t claims) { return claims >> (2 * kChunkBits); }
int64_t chunksOf(uint64_t claims) { return static_cast<int64_t>((claims >> kChunkBits) & kChunkMask); }
int64_t nextChunkOf(uint64_t claims) { return static_cast<int64_t>(claims & kChunkMask); }
uint64_t claimsWord(uint64_t generation, int64_t chunks, int64_t next) {
  return (generation << (2 * kChunkBits)) | (static_cast<uint64_t>(chunks) << kChunkBits) | static_cast<uint64_t>(next);
}

}  // namespace

ThreadPool::ThreadPool(int64_t numThreads) {
  if (numThreads <= 0) numThreads = std::max(1u, std::thread::hardware_concurrency());
  // A loop has at most size() chunks, and the claims word counts them in 16 bits.
  numThreads = std::min<int64_t>(numThreads, kChunkMask);
  for (int64_t i = 1; i < numThreads; ++i) workers_.emplace_back([this] { workerLoop(); });
}

ThreadPool::~ThreadPool() {
  stopping_.store(true);
  // A worker between its predicate check and its wait holds the mutex: taking it here makes the
  // notification come after that wait, as parallelFor does for a new loop.
  {
    std::lock_guard<std::mutex> lock(mutex_);
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::parallelFor(int64_t count, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t numChunks = std::min<int64_t>(size(), (count + grain - 1) / grain);
  if (numChunks <= 1) {
    body(0, count);
    return;
  }
  body_ = &body;
  count_ = count;
  chunk_ = (count + numChunks - 1) / numChunks;
  const int64_t chunks = (count + chunk_ - 1) / chunk_;
  pendingChunks_.store(chunks);
  // The generation field wraps after 2^32 loops (a long training run gets there), so it is masked:
  // the claims word's and this loop's generation must compare equal.
  const uint64_t generation = (generationOf(claims_.load()) + 1) & kGenerationMask;
  claims_.store(claimsWord(generation, chunks, 0));
  // A worker that counted itself as sleeping holds the mutex until it waits, so taking it here
  // orders this notification after that wait; one that counts itself later sees the new claims.
  if (sleepingWorkers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }

  // The caller works too, then waits for the chunks the workers took.
  runChunks(generation);
  if (!spinUntil([this] { return pendingChunks_.load() == 0; })) {
    std::unique_lock<std::mutex> lock(mutex_);
    callerSleeping_ = true;
    done_.wait(lock, [this] { return pendingChunks_.load() == 0; });
    callerSleeping_ = false;
  }
  body_ = nullptr;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error = std::exchange(error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::runChunks(uint64_t generation) {
  for (;;) {
    uint64_t claims = claims_.load();
    if (generationOf(claims) != generation || nextChunkOf(claims) >= chunksOf(claims)) return;
    if (!claims_.compare_exchange_weak(claims, claims + 1)) continue;
    const int64_t chunk = nextChunkOf(claims);
    try {
      (*body_)(chunk * chunk_, std::min(count_, (chunk + 1) * chunk_));
    } catch (...) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      skipRemainingChunks(generation);
    }
    finishChunks(1);
  }
}

void ThreadPool::skipRemainingChunks(uint64_t generation) {
  uint64_t claims = claims_.load();
  while (generationOf(claims) == generation && nextChunkOf(claims) < chunksOf(claims)) {
    const int64_t skipped = chunksOf(claims) - nextChunkOf(claims);
    if (claims_.compare_exchange_weak(claims, claimsWord(generation, chunksOf(claims), chunksOf(claims)))) {
      finishChunks(skipped);
      return;
    }
  }
}

void ThreadPool::finishChunks(int64_t finished) {
  if (pendingChunks_.fetch_sub(finished) != finished) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (callerSleeping_) done_.notify_one();
}

void ThreadPool::workerLoop() {
  // Generation 0 is the pool's construction, before any loop: a worker that starts late must still
  // see the first loop as new.
  uint64_t seen = 0;
  auto announced = [&] { return stopping_.load() || generationOf(claims_.load()) != seen; };
  for (;;) {
    if (!spinUntil(announced)) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleepingWorkers_.fetch_add(1);
      wake_.wait(lock, announced);
      sleepingWorkers_.fetch_sub(1);
    }
    if (stopping_.load()) return;
    seen = generationOf(claims_.load());
    runChunks(seen);
  }
}

}  // namespace dgemma
