// Block-diffusion generation on an inference plan (docs/generation.md): the host loop that drives
// the plan's prefill, denoise and commit entry points (docs/inference-plan.md) over micro-batches
// of requests, with transformers' sampler semantics (DenoisingBatch, CanvasFinalization) and
// counter-based randomness (DrawSource).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "plan/Plan.h"
#include "runtime/data/image/Image.h"
#include "runtime/generate/DrawSource.h"
#include "runtime/generate/GenerationObserver.h"
#include "runtime/session/Session.h"

namespace dgemma {

struct GenerationRequest {
  int64_t id = 0;                   // keys the request's randomness: its index in the input
  std::vector<int64_t> promptIds;   // the tokenized prompt (chat template included), at least one id
  // A prompt with images (docs/generation.md, "dgemma-run generate"): 1 on its image soft tokens (mm_token_type_ids),
  // and its images, processed, in order of appearance. Empty for a text prompt.
  std::vector<int64_t> promptTokenTypes;
  std::vector<ProcessedImage> images;
};

enum class FinishReason { Eos, Length };
const char* finishReasonName(FinishReason reason);  // "eos" | "length"

struct GenerationResult {
  int64_t id = 0;
  // transformers' output after the prompt for this request alone: every canvas up to the one that
  // finished it (whole canvases, so pads follow the EOS), or all of them.
  std::vector<int64_t> newTokens;
  std::vector<int64_t> stepsPerCanvas;  // decoder passes of each canvas
  int64_t decoderPasses = 0;
  FinishReason finishReason = FinishReason::Length;
  double tokensPerForward = 0;  // non-pad new tokens / decoder passes (transformers' figure)
};

struct GeneratorOptions {
  int64_t maxNewTokens = 0;       // 0: the plan's; at most the plan's (the cache is sized for it)
  int64_t maxDenoisingSteps = 0;  // 0: the plan's max_denoising_steps
  // Multiplies the temperature schedule's t_min and t_max (docs/generation.md, "The algorithm"):
  // above 1 a flatter, more exploring sampler (dgemma-run rl --temperature), below 1 a sharper one.
  double temperatureScale = 1.0;
};

// Wall-clock seconds of a generation's host phases, summed over every generate() call: the entry
// runs (inputs fed, kernels run, outputs read back) and the sampler's host work between them
// (acceptance, renoise draws, stop rule, observer, EOS rule). `dgemma-run generate --profile` prints them.
struct GenerationPhaseTimes {
  double prefill = 0;
  double denoise = 0;
  double samplerHost = 0;
  double commit = 0;
  int64_t prefills = 0, denoisePasses = 0, commits = 0;  // entry runs
};

class Generator {
 public:
  // Throws InputError when the session's plan is not a single-rank inference plan (its generation
  // settings and the prefill, denoise and commit entries) or an option is out of range.
  Generator(Session& session, const GeneratorOptions& options);

  // The plan's settings with the options applied.
  const GenerationSettings& settings() const { return settings_; }
  int64_t microBatch() const { return microBatch_; }
  int64_t maxPromptLength() const { return maxPromptLength_; }  // the largest prefill bucket
  int64_t vocabSize() const { return vocabSize_; }
  // The image twins' images_per_example (prefill_images); 0 for a text-only plan.
  int64_t imagesPerExample() const { return imagesPerExample_; }
  const Gemma4ImageOptions& imageOptions() const { return imageOptions_; }
  int64_t canvases() const;  // ceil(max_new_tokens / canvas_length)
  const GenerationPhaseTimes& phaseTimes() const { return phaseTimes_; }

  // Generates every request, in micro-batches of consecutive requests of one modality (text
  // prompts, then prompts with images through prefill_images; a short last batch is padded with
  // rows whose outputs are dropped); results in request order. InputError naming the request when a
  // prompt is empty or longer than every prefill bucket, or has images the plan cannot take.
  std::vector<GenerationResult> generate(std::span<const GenerationRequest> requests, DrawSource& draws,
                                         GenerationObserver* observer = nullptr);

 private:
  void generateMicroBatch(std::span<const GenerationRequest> requests, DrawSource& draws, GenerationObserver* observer,
                          std::vector<GenerationResult>& results);

  Session& session_;
  GenerationSettings settings_;
  int64_t microBatch_ = 0;
  int64_t maxPromptLength_ = 0;
  int64_t vocabSize_ = 0;
  int64_t imagesPerExample_ = 0;
  Gemma4ImageOptions imageOptions_;
  const EntryPoint* denoise_ = nullptr;
  // A canvas's first pass (no self-conditioning signal); `denoise_` with a zero mask when the plan
  // predates the entry.
  const EntryPoint* denoiseFirst_ = nullptr;
  const EntryPoint* commit_ = nullptr;
  GenerationPhaseTimes phaseTimes_;
};

}  // namespace dgemma
