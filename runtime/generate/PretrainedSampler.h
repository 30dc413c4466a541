// Text from a pre-trained checkpoint (docs/pretraining.md, "Sampling"): the loops that drive a
// pre-training inference plan's logits entry (dgemma-compile --mode infer --objective autoregressive |
// masked-diffusion). Autoregressive: one token per pass after the prompt. Masked diffusion: the prompt
// followed by N mask tokens, unmasked over K passes by LLaDA's low-confidence remasking.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/session/Session.h"

namespace dgemma {

enum class PretrainedObjective { Autoregressive, MaskedDiffusion };
const char* pretrainedObjectiveName(PretrainedObjective objective);  // "autoregressive" | "masked-diffusion"

struct PretrainedSamplingOptions {
  int64_t maxNewTokens = 32;
  // 0: the argmax (lowest id on ties); above 0: a draw from softmax(logits / T) by the Gumbel-max
  // trick, its noise from Philox under (seed, request, pass) (runtime/generate/GenerationKeys.h).
  double temperature = 0;
  uint64_t seed = 0;
  int64_t steps = 0;  // masked diffusion: passes K (0: maxNewTokens); at most maxNewTokens are used
  // Autoregressive: the ids that end a completion (kept as its last token). Masked diffusion fills
  // all N positions; its text ends at the first of them (completionText).
  std::vector<int64_t> stopIds;
};

enum class PretrainedFinish {
  Stop,      // a stop id was generated
  Length,    // maxNewTokens were generated
  Sequence,  // autoregressive: prompt and completion fill the plan's seq_len
};
const char* pretrainedFinishName(PretrainedFinish finish);  // "stop" | "length" | "sequence"

struct PretrainedCompletion {
  std::vector<int64_t> newTokens;
  PretrainedFinish finish = PretrainedFinish::Length;
  int64_t passes = 0;  // runs of the logits entry
};

class PretrainedSampler {
 public:
  // Reads the session's logits entries; InputError naming the plan when it has none (another kind
  // of plan), or a masked-diffusion plan records no mask token.
  explicit PretrainedSampler(Session& session);

  PretrainedObjective objective() const { return objective_; }
  int64_t maxSequenceLength() const { return maxSequenceLength_; }  // the largest seq_len bucket
  int64_t vocabSize() const { return vocabSize_; }
  int64_t maskTokenId() const { return maskTokenId_; }  // masked diffusion's; -1 otherwise

  // InputError naming `what` (e.g. "--prompt 2") when a prompt of `promptTokens` tokens cannot run:
  // empty for the autoregressive loop (nothing to predict from), no room left in the largest
  // seq_len, or (masked diffusion) prompt + maxNewTokens above it.
  void checkPrompt(int64_t promptTokens, const PretrainedSamplingOptions& options, const std::string& what) const;

  // One completion of `prompt`; `request` keys its draws, so a prompt's completion does not depend
  // on what ran before it. Throws as checkPrompt.
  PretrainedCompletion complete(uint64_t request, const std::vector<int64_t>& prompt,
                                const PretrainedSamplingOptions& options, const std::string& what);

  // The soft-capped logits [length(tokens), V] of `tokens` as one document (positions 0, 1, ...; a
  // masked-diffusion row's keys are its tokens), in the smallest seq_len bucket that holds it, the
  // rest of the row and the other rows padding in a document of their own that no real query reads.
  std::vector<float> documentLogits(const std::vector<int64_t>& tokens);

 private:
  PretrainedCompletion completeAutoregressive(uint64_t request, const std::vector<int64_t>& prompt,
                                              const PretrainedSamplingOptions& options);
  PretrainedCompletion completeMaskedDiffusion(uint64_t request, const std::vector<int64_t>& prompt,
                                               const PretrainedSamplingOptions& options);

  Session& session_;
  PretrainedObjective objective_ = PretrainedObjective::Autoregressive;
  int64_t maxSequenceLength_ = 0;
  int64_t vocabSize_ = 0;
  int64_t padId_ = 0;
  int64_t maskTokenId_ = -1;
};

// A completion's tokens before the first stop id: what its text is decoded from.
std::vector<int64_t> tokensBeforeStop(const std::vector<int64_t>& newTokens, const std::vector<int64_t>& stopIds);

}  // namespace dgemma
