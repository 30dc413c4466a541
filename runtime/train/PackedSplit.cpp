#include "runtime/train/PackedSplit.h"

#include <algorithm>
#include <sstream>

#include "runtime/data/pretrain/IndexedDocuments.h"
#include "support/Error.h"

namespace dgemma {

namespace {

std::string describeDataPath(const PackedSplitOptions& options) {
  std::string text = options.flag;
  for (const DataPathEntry& entry : options.dataPath) {
    if (options.dataPath.size() > 1) {
      std::ostringstream weight;
      weight << entry.weight;
      text += " " + weight.str();
    }
    text += " " + entry.prefix;
  }
  return text + " (" + splitPartName(options.part) + " part of --split " + formatSplit(options.split) + ")";
}

// One epoch of every source's part, in whole micro-batches: what an evaluation without
// --eval-batches reads.
int64_t oneEpochSamples(const std::vector<BlendSource>& sources, const PackedSplitOptions& options) {
  int64_t samples = 0;
  for (const BlendSource& source : sources) {
    const DocumentRange range =
        splitDocumentRanges(options.split, source.documents->sequenceCount())[static_cast<size_t>(options.part)];
    int64_t tokens = 0;
    for (int64_t document = range.begin; document < range.end; ++document)
      tokens += source.documents->sequenceLength(document);
    samples += std::max<int64_t>(tokens - 1, 0) / options.sequenceLength;
  }
  const int64_t microBatches = std::max<int64_t>((samples + options.microBatch - 1) / options.microBatch, 1);
  return microBatches * options.microBatch;
}

}  // namespace

PackedSplit::PackedSplit(const PackedSplitOptions& options, const ModelContract& names, std::ostream* log)
    : options_(options), names_(names), path_(describeDataPath(options)) {
  if (options.sequenceLength < 1 || options.microBatch < 1)
    throw InputError(path_ + ": the plan's packed length and micro-batch must be at least 1");
  std::vector<BlendSource> sources;
  for (const DataPathEntry& entry : options.dataPath)
    sources.push_back({std::make_shared<IndexedDocuments>(entry.prefix), entry.weight});
  BlendOptions blend;
  blend.sequenceLength = options.sequenceLength;
  blend.seed = options.seed;
  blend.split = options.split;
  blend.part = options.part;
  blend.cacheDirectory = options.cacheDirectory;
  blend.numSamples = options.trainingSamples > 0          ? options.trainingSamples
                     : options.evaluationMicroBatches > 0 ? options.evaluationMicroBatches * options.microBatch
                                                          : oneEpochSamples(sources, options);
  try {
    blend_ = std::make_unique<BlendedDataset>(sources, blend, log);
  } catch (const InputError& error) {
    throw InputError(path_ + ": " + error.what());
  }
}

nlohmann::json PackedSplit::orderState(int64_t consumedSamples) const {
  return {{"sampler", "packed"},
          {"seed", options_.seed},
          {"samples", blend_->size()},
          {"sequence_length", options_.sequenceLength},
          {"split", formatSplit(options_.split)},
          {"blend_index", blend_->cacheKey()},
          {"position", consumedSamples}};
}

int64_t PackedSplit::tokensBefore(int64_t consumedSamples, const std::string& where) {
  int64_t tokens = 0;
  if (__builtin_mul_overflow(consumedSamples, options_.sequenceLength, &tokens))
    throw InputError(where + ": consumed_samples: " + std::to_string(consumedSamples) + " samples of " + path_ +
                     " hold more than 2^63 tokens");
  return tokens;
}

MicroBatch PackedSplit::assemble(int64_t index) {
  const int64_t B = options_.microBatch, S = options_.sequenceLength;
  const int64_t first = index * B;
  MicroBatch batch;
  HostTensor inputIds(DType::I64, {B, S}), positionIds(DType::I64, {B, S}), documentIds(DType::I64, {B, S});
  HostTensor labels(DType::I64, {B, S}), lossMask(DType::F32, {B, S});
  for (int64_t row = 0; row < B; ++row) {
    const int64_t global = first + row;
    const PackedSample sample = blend_->sample(global);
    if (static_cast<int64_t>(sample.tokens.size()) != S + 1)
      throw InputError(path_ + ": sample " + std::to_string(global) + " has " + std::to_string(sample.tokens.size()) +
                       " tokens, expected " + std::to_string(S + 1));
    for (int64_t position = 0; position <= S; ++position) {
      const int64_t token = sample.tokens[position];
      if (token < 0 || token >= options_.vocabSize)
        throw InputError(path_ + ": sample " + std::to_string(global) + ": token id " + std::to_string(token) +
                         " of document " + std::to_string(sample.segmentDocuments[sample.segmentIds[position]]) +
                         " is out of range for vocab_size " + std::to_string(options_.vocabSize) +
                         " (preprocessed with another tokenizer?)");
    }
    const std::vector<float> autoregressiveMask =
        options_.objective == TrainObjective::Autoregressive ? autoregressiveLossMask(sample) : std::vector<float>();
    for (int64_t position = 0; position < S; ++position) {
      const int64_t at = row * S + position;
      inputIds.as<int64_t>()[at] = sample.tokens[position];
      positionIds.as<int64_t>()[at] = sample.positionIds[position];
      documentIds.as<int64_t>()[at] = sample.segmentIds[position];
      labels.as<int64_t>()[at] = sample.tokens[position + 1];
      // Masked and block diffusion score every token: a packed sample has no padding.
      lossMask.as<float>()[at] = autoregressiveMask.empty() ? 1.0f : autoregressiveMask[position];
    }
    batch.samples.push_back(global);
  }
  batch.tokens = B * S;
  batch.fields[names_.batch.inputIds] = std::move(inputIds);
  batch.fields[names_.batch.positionIds] = std::move(positionIds);
  batch.fields[names_.documentIds] = std::move(documentIds);
  batch.fields[names_.lossMask] = std::move(lossMask);
  if (options_.objective == TrainObjective::Autoregressive) batch.fields[names_.labels] = std::move(labels);
  batch.where = path_ + ": samples " + std::to_string(first) + ".." + std::to_string(first + B - 1);
  return batch;
}

}  // namespace dgemma
