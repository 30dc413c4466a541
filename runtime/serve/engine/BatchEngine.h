// Continuous batching of block-diffusion generation (docs/serving.md, "Continuous batching"): the
// plan's micro-batch rows are slots; a request takes a free slot, is prefilled into that row of the
// plan's cache (the entries' write_rows), denoises and commits canvas after canvas, and leaves its
// slot when it ends, while the other slots go on. Every engine step runs at most one prompt-encoding
// entry per modality, one canvas-encoding entry and one decoder pass over all the slots that need them.
//
// A request's tokens depend on its prompt, its seed and its options only: every draw is keyed by
// (seed, the job's draw request, canvas, step) as in `dgemma-run generate` (docs/generation.md,
// "Randomness"), positions are the request's own (0 .. prompt length - 1, then its canvases), and a
// row's computation does not read the other rows. So a request gives `dgemma-run generate --prompt
// ... --seed S`'s text whatever else is in the batch.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan/Plan.h"
#include "runtime/serve/engine/GenerationJob.h"
#include "runtime/session/Session.h"

namespace dgemma::serve {

// The queue is full: the caller answers 503 with Retry-After.
class EngineFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A submitted job's handle: cancel() ends it (JobEnd::Cancelled) within one engine step, freeing its
// slot or its place in the queue.
class JobHandle {
 public:
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

 private:
  std::atomic<bool> cancelled_{false};
};

// One entry run of an engine step, for the metrics.
struct EngineStepRecord {
  std::string entry;       // the entry point's name (the model contract's)
  bool denoising = false;  // a decoder pass over the canvases (else a prompt or canvas encoded)
  double seconds = 0;
  int64_t rows = 0;        // the slots the run worked for
};

struct EngineOptions {
  int64_t maxQueued = 256;  // jobs waiting for a slot; beyond, submit() throws EngineFull
  std::function<void(const EngineStepRecord&)> onStep;  // engine thread; may be empty
};

class BatchEngine {
 public:
  // Throws InputError when the session's plan is not a single-rank inference plan whose prefill
  // and commit entries take write_rows (a plan compiled before it: recompile).
  BatchEngine(Session& session, EngineOptions options);
  ~BatchEngine();

  int64_t slots() const { return slots_; }
  int64_t maxPromptLength() const { return maxPromptLength_; }
  int64_t maxNewTokens() const { return settings_.maxNewTokens; }
  int64_t canvasLength() const { return settings_.canvasLength; }
  int64_t vocabSize() const { return vocabSize_; }
  int64_t imagesPerExample() const { return imagesPerExample_; }
  const Gemma4ImageOptions& imageOptions() const { return imageOptions_; }
  const GenerationSettings& settings() const { return settings_; }

  // Thread-safe. Checks the job (InputError naming what is wrong: an empty or too long prompt, an id
  // outside the vocabulary, images the plan cannot take, options out of range) and queues it.
  // Throws EngineFull when maxQueued jobs wait, or when the engine is stopping.
  std::shared_ptr<JobHandle> submit(GenerationJob job);

  // Runs engine steps on the calling thread until stop() and until every queued and active job has
  // ended.
  void run();
  // Thread-safe: no job is accepted after it; run() returns when the queued and active jobs end.
  void stop();

  int64_t queued() const;       // jobs waiting for a slot
  int64_t activeSlots() const;  // slots holding a job

 private:
  struct Slot;
  struct Queued;

  void step();
  void admit();
  void endCancelled();
  void prefill(bool images);
  void commit();
  void denoise();
  void applyPass(Slot& slot, const int64_t* sampled, const int64_t* argmax, const float* entropy);
  void finishCanvas(Slot& slot);
  void startCanvas(Slot& slot);
  void end(Slot& slot, JobEnd end, const std::string& error = "");
  void record(const EntryPoint& entry, bool denoising, double seconds, int64_t rows);

  Session& session_;
  EngineOptions options_;
  GenerationSettings settings_;
  int64_t slots_ = 0;
  int64_t maxPromptLength_ = 0;
  int64_t vocabSize_ = 0;
  int64_t imagesPerExample_ = 0;
  Gemma4ImageOptions imageOptions_;
  const EntryPoint* denoise_ = nullptr;
  const EntryPoint* denoiseFirst_ = nullptr;
  const EntryPoint* commit_ = nullptr;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Queued>> queue_;
  bool stopping_ = false;
  std::atomic<int64_t> active_{0};
  std::vector<std::unique_ptr<Slot>> rows_;  // one per slot; null when free (engine thread only)
};

}  // namespace dgemma::serve
