// One request's generation as the serving engine runs it (docs/serving.md, "Continuous batching"):
// its prompt, its sampling options, an optional structured-output rule over its canvases, and the
// sink that hears about its drafts, committed canvases and end.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/data/image/Image.h"

namespace dgemma::serve {

// What a constrained request's canvases go through (docs/serving.md, "Structured output"). Called
// on the engine thread only.
class CanvasConstraint {
 public:
  virtual ~CanvasConstraint() = default;
  // Before a canvas of `length` positions starts.
  virtual void beginCanvas(int64_t length) = 0;
  // Of the positions the entropy rule accepted (`candidates`, lowest entropy first) in the sampled
  // canvas `tokens`, those the rule keeps; the others are renoised.
  virtual std::vector<int64_t> filterAccepted(std::span<const int64_t> tokens, std::span<const int64_t> candidates) = 0;
  // Rewrites the canvas about to be committed (`tokens`, the argmax canvas) into a valid continuation,
  // preferring `alternative` (the sampled canvas) where the argmax breaks the rule. True when the
  // canvas ends the request.
  virtual bool commitCanvas(std::span<int64_t> tokens, std::span<const int64_t> alternative) = 0;
};

struct SamplingOptions {
  uint64_t seed = 0;         // the run seed of every draw (docs/generation.md, "Randomness")
  int64_t drawRequest = 0;   // the request id of the draws: a choice's index, so choice i of seed s is reproducible
  int64_t maxTokens = 0;     // completion tokens, 1 .. the engine's maxNewTokens()
  // Scales the plan's temperature schedule (1: the model's own); 0 commits the argmax as the sample.
  double temperature = 1.0;
  int64_t denoisingSteps = 0;  // 0: the plan's max_denoising_steps
  double entropyBound = 0;     // 0: the plan's entropy_bound
  bool drafts = false;         // report every denoising pass's canvas (JobSink::onDraft)
};

enum class JobEnd { Eos, Length, Cancelled, Failed };
const char* jobEndName(JobEnd end);  // "eos" | "length" | "cancelled" | "failed"

struct JobSummary {
  JobEnd end = JobEnd::Length;
  int64_t completionTokens = 0;  // committed tokens up to the budget, the EOS included, pads not
  int64_t decoderPasses = 0;
  std::string error;  // JobEnd::Failed
};

// Called on the engine thread; must not block (queue the work elsewhere).
class JobSink {
 public:
  virtual ~JobSink() = default;
  // The canvas after denoising pass `step` of canvas `canvas` (SamplingOptions::drafts only).
  virtual void onDraft(int64_t canvas, int64_t step, std::span<const int64_t> canvasIds) {
    (void)canvas;
    (void)step;
    (void)canvasIds;
  }
  // A committed canvas's text tokens: the EOS rule applied, cut at the EOS (excluded) and at the budget.
  virtual void onCanvas(int64_t canvas, std::span<const int64_t> tokens) = 0;
  // Once, last.
  virtual void onEnd(const JobSummary& summary) = 0;
};

struct GenerationJob {
  std::vector<int64_t> promptIds;         // the tokenized prompt, chat template included
  std::vector<int64_t> promptTokenTypes;  // 1 on image soft tokens; empty for a text prompt
  std::vector<ProcessedImage> images;
  SamplingOptions sampling;
  std::unique_ptr<CanvasConstraint> constraint;  // null: unconstrained
  std::shared_ptr<JobSink> sink;
};

}  // namespace dgemma::serve
