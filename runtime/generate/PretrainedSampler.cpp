#include "runtime/generate/PretrainedSampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "runtime/generate/EntryRuns.h"
#include "runtime/generate/GenerationKeys.h"
#include "runtime/kernels/canvas_sample/GumbelNoise.h"
#include "support/Error.h"

namespace dgemma {

namespace {

// The id a pass picks from one position's logits: the argmax at temperature 0, else the Gumbel-max
// draw from softmax(z / T) whose noise for id v is word `first + v` of the pass's Philox stream.
// `excluded` (>= 0) is never picked.
int64_t pickToken(const float* logits, int64_t vocabSize, double temperature, uint64_t drawSeed, uint64_t first,
                  int64_t excluded) {
  int64_t best = -1;
  double bestScore = -std::numeric_limits<double>::infinity();
  for (int64_t v = 0; v < vocabSize; ++v) {
    if (v == excluded) continue;
    double score = logits[v];
    if (temperature > 0)
      score = score / temperature + canvas_sample::gumbelNoise(philoxWord(drawSeed, /*stream=*/0, /*offset=*/0,
                                                                          first + static_cast<uint64_t>(v)));
    if (best < 0 || score > bestScore) {
      best = v;
      bestScore = score;
    }
  }
  return best;
}

// softmax(z)[id] of one position's logits, in double.
double probabilityOf(const float* logits, int64_t vocabSize, int64_t id) {
  const double top = *std::max_element(logits, logits + vocabSize);
  double sum = 0;
  for (int64_t v = 0; v < vocabSize; ++v) sum += std::exp(static_cast<double>(logits[v]) - top);
  return std::exp(static_cast<double>(logits[id]) - top) / sum;
}

}  // namespace

const char* pretrainedObjectiveName(PretrainedObjective objective) {
  return objective == PretrainedObjective::MaskedDiffusion ? "masked-diffusion" : "autoregressive";
}

const char* pretrainedFinishName(PretrainedFinish finish) {
  switch (finish) {
    case PretrainedFinish::Stop: return "stop";
    case PretrainedFinish::Length: return "length";
    case PretrainedFinish::Sequence: return "sequence";
  }
  return "?";
}

std::vector<int64_t> tokensBeforeStop(const std::vector<int64_t>& newTokens, const std::vector<int64_t>& stopIds) {
  std::vector<int64_t> kept;
  for (int64_t id : newTokens) {
    if (std::find(stopIds.begin(), stopIds.end(), id) != stopIds.end()) break;
    kept.push_back(id);
  }
  return kept;
}

PretrainedSampler::PretrainedSampler(Session& session) : session_(session) {
  const ModelContract& names = session.model->contract();
  const Plan& plan = session.plan;
  std::vector<const EntryPoint*> entries;
  for (const EntryPoint& entry : plan.entryPoints)
    if (!names.packedLogitsEntry.empty() && entry.name == names.packedLogitsEntry) entries.push_back(&entry);
  if (entries.empty()) {
    const bool pretrainingTrain =
        std::any_of(plan.entryPoints.begin(), plan.entryPoints.end(), [&](const EntryPoint& e) {
          return e.name == names.trainStepEntry && e.bucket.count(names.sequenceLengthDimension);
        });
    throw InputError("--plan: " + session.planPath + " has no \"" + names.packedLogitsEntry + "\" entry: " +
                     (pretrainingTrain  ? "it is a pre-training train plan"
                      : plan.generation ? "it is a block-diffusion inference plan (dgemma-run generate runs it)"
                                        : "it is not a pre-training inference plan") +
                     "; compile one with dgemma-compile --mode infer --objective autoregressive|masked-diffusion "
                     "--seq-len S (docs/pretraining.md, \"Sampling\")");
  }
  // The objective is told by the inputs, as the trainer tells its steps apart: only masked diffusion's
  // attention reads which keys are real.
  objective_ = takesInput(*entries.front(), names.lossMask) ? PretrainedObjective::MaskedDiffusion
                                                            : PretrainedObjective::Autoregressive;
  for (const EntryPoint* entry : entries)
    maxSequenceLength_ = std::max(maxSequenceLength_, entry->bucket.at(names.sequenceLengthDimension));
  const ModelTokens tokens = session.model->tokens(plan, session.planPath);
  vocabSize_ = tokens.vocabSize;
  padId_ = tokens.padId;
  if (objective_ == PretrainedObjective::MaskedDiffusion) {
    // dgemma-compile records the mask token the plan was compiled with (--mask-token-id or the config's).
    const nlohmann::json objective = plan.metadata.value("objective", nlohmann::json::object());
    if (!objective.is_object() || !objective.contains("mask_token_id") ||
        !objective["mask_token_id"].is_number_integer())
      throw InputError("--plan: " + session.planPath +
                       ": metadata.objective.mask_token_id: expected the mask token id of a masked-diffusion plan, "
                       "got nothing (recompile it with dgemma-compile --mode infer --objective masked-diffusion)");
    maskTokenId_ = objective["mask_token_id"].get<int64_t>();
    if (maskTokenId_ < 0 || maskTokenId_ >= vocabSize_)
      throw InputError("--plan: " + session.planPath + ": metadata.objective.mask_token_id: expected an id in [0, " +
                       std::to_string(vocabSize_) + "), got " + std::to_string(maskTokenId_));
  }
}

void PretrainedSampler::checkPrompt(int64_t promptTokens, const PretrainedSamplingOptions& options,
                                    const std::string& what) const {
  const std::string limit = "the plan's largest seq_len " + std::to_string(maxSequenceLength_);
  if (objective_ == PretrainedObjective::Autoregressive) {
    if (promptTokens == 0)
      throw InputError(what +
                       ": expected a prompt of at least one token, got none (the autoregressive sampler "
                       "predicts from the prompt's last token)");
    if (promptTokens >= maxSequenceLength_)
      throw InputError(what + ": expected at most " + std::to_string(maxSequenceLength_ - 1) + " tokens (one below " +
                       limit + ", to leave room for a new token), got " + std::to_string(promptTokens) + " tokens");
    return;
  }
  if (promptTokens + options.maxNewTokens > maxSequenceLength_)
    throw InputError(what + ": " + std::to_string(promptTokens) + " tokens and " +
                     std::to_string(options.maxNewTokens) + " mask tokens (--max-new-tokens): expected at most " +
                     limit + " in all, got " + std::to_string(promptTokens + options.maxNewTokens));
}

std::vector<float> PretrainedSampler::documentLogits(const std::vector<int64_t>& tokens) {
  const ModelContract& names = session_.model->contract();
  const int64_t length = static_cast<int64_t>(tokens.size());
  const EntryPoint* entry =
      session_.plan.selectEntry(names.packedLogitsEntry, {{names.sequenceLengthDimension, length}});
  if (!entry)
    throw InputError("a document of " + std::to_string(length) + " tokens: longer than every " +
                     names.sequenceLengthDimension + " bucket of " + session_.planPath);
  const int64_t rows = entry->bucket.at(names.microBatchDimension);
  const int64_t columns = entry->bucket.at(names.sequenceLengthDimension);
  // Row 0 holds the document (document 0) and then padding (document 1, positions from 0); the other
  // rows are padding. Attention never crosses a document, so no real query reads a padded key.
  std::vector<int64_t> ids(rows * columns, padId_), positions(rows * columns), documents(rows * columns, 1);
  std::vector<float> real(rows * columns, 0.0f);
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t column = 0; column < columns; ++column) {
      const int64_t at = row * columns + column;
      const bool inDocument = row == 0 && column < length;
      positions[at] = inDocument || row > 0 ? column : column - length;
      if (!inDocument) continue;
      ids[at] = tokens[column];
      documents[at] = 0;
      real[at] = 1.0f;
    }
  std::map<std::string, HostTensor> inputs;
  inputs[names.batch.inputIds] = i64Tensor({rows, columns}, ids);
  inputs[names.batch.positionIds] = i64Tensor({rows, columns}, positions);
  inputs[names.documentIds] = i64Tensor({rows, columns}, documents);
  inputs[names.lossMask] = f32Tensor({rows, columns}, real);
  const HostTensor logits = entryOutput(runEntryPoint(session_, *entry, std::move(inputs)), names.logits, DType::F32,
                                        rows * columns * vocabSize_, *entry, session_.planPath);
  return std::vector<float>(logits.as<float>(), logits.as<float>() + length * vocabSize_);
}

PretrainedCompletion PretrainedSampler::complete(uint64_t request, const std::vector<int64_t>& prompt,
                                                 const PretrainedSamplingOptions& options, const std::string& what) {
  checkPrompt(static_cast<int64_t>(prompt.size()), options, what);
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocabSize_)
      throw InputError(what + ": token " + std::to_string(i) + ": expected an id in [0, " + std::to_string(vocabSize_) +
                       "), got " + std::to_string(prompt[i]));
  return objective_ == PretrainedObjective::Autoregressive ? completeAutoregressive(request, prompt, options)
                                                           : completeMaskedDiffusion(request, prompt, options);
}

// Each pass reruns the whole sequence so far (the plan has no cache): the next token is picked from
// the last real position's logits.
PretrainedCompletion PretrainedSampler::completeAutoregressive(uint64_t request, const std::vector<int64_t>& prompt,
                                                               const PretrainedSamplingOptions& options) {
  PretrainedCompletion completion;
  std::vector<int64_t> sequence = prompt;
  while (true) {
    if (static_cast<int64_t>(completion.newTokens.size()) >= options.maxNewTokens) {
      completion.finish = PretrainedFinish::Length;
      break;
    }
    if (static_cast<int64_t>(sequence.size()) >= maxSequenceLength_) {
      completion.finish = PretrainedFinish::Sequence;
      break;
    }
    const std::vector<float> logits = documentLogits(sequence);
    ++completion.passes;
    const uint64_t step = completion.newTokens.size();
    const int64_t token = pickToken(logits.data() + (sequence.size() - 1) * vocabSize_, vocabSize_, options.temperature,
                                    generationDrawSeed(options.seed, request, 0, step, DrawPurpose::Sample), 0, -1);
    sequence.push_back(token);
    completion.newTokens.push_back(token);
    if (std::find(options.stopIds.begin(), options.stopIds.end(), token) != options.stopIds.end()) {
      completion.finish = PretrainedFinish::Stop;
      break;
    }
  }
  return completion;
}

// LLaDA's low-confidence remasking: each pass predicts every masked position (never the mask token
// itself) and commits the ceil(masked / passes left) whose predicted token has the highest
// probability under the model (ties: the leftmost); committed tokens stay.
PretrainedCompletion PretrainedSampler::completeMaskedDiffusion(uint64_t request, const std::vector<int64_t>& prompt,
                                                                const PretrainedSamplingOptions& options) {
  PretrainedCompletion completion;
  const int64_t promptLength = static_cast<int64_t>(prompt.size());
  std::vector<int64_t> sequence = prompt;
  sequence.resize(promptLength + options.maxNewTokens, maskTokenId_);
  std::vector<int64_t> masked(options.maxNewTokens);
  std::iota(masked.begin(), masked.end(), promptLength);
  const int64_t passes = options.steps > 0 ? options.steps : options.maxNewTokens;
  for (int64_t pass = 0; pass < passes && !masked.empty(); ++pass) {
    const std::vector<float> logits = documentLogits(sequence);
    ++completion.passes;
    const uint64_t drawSeed =
        generationDrawSeed(options.seed, request, 0, static_cast<uint64_t>(pass), DrawPurpose::Sample);
    std::vector<std::pair<int64_t, double>> predicted;  // (token, confidence) per masked position
    for (int64_t position : masked) {
      const float* row = logits.data() + position * vocabSize_;
      const int64_t token = pickToken(row, vocabSize_, options.temperature, drawSeed,
                                      static_cast<uint64_t>(position * vocabSize_), maskTokenId_);
      predicted.push_back({token, probabilityOf(row, vocabSize_, token)});
    }
    const int64_t left = passes - pass;
    const int64_t commits = (static_cast<int64_t>(masked.size()) + left - 1) / left;
    std::vector<size_t> order(masked.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return predicted[a].second > predicted[b].second; });
    std::vector<bool> committed(masked.size(), false);
    for (int64_t i = 0; i < commits; ++i) {
      committed[order[i]] = true;
      sequence[masked[order[i]]] = predicted[order[i]].first;
    }
    std::vector<int64_t> stillMasked;
    for (size_t i = 0; i < masked.size(); ++i)
      if (!committed[i]) stillMasked.push_back(masked[i]);
    masked = std::move(stillMasked);
  }
  completion.newTokens.assign(sequence.begin() + promptLength, sequence.end());
  const bool stopped = std::any_of(completion.newTokens.begin(), completion.newTokens.end(), [&](int64_t id) {
    return std::find(options.stopIds.begin(), options.stopIds.end(), id) != options.stopIds.end();
  });
  completion.finish = stopped ? PretrainedFinish::Stop : PretrainedFinish::Length;
  return completion;
}

}  // namespace dgemma
