// A split of pre-training data as the Trainer reads it (docs/pretraining.md, "Training"): packed
// samples of S + 1 tokens from Megatron indexed datasets, blended by weight (BlendedDataset), in the
// blend's global order: micro-batch g holds global samples [g·B, (g+1)·B), for training and for an
// evaluation alike (the evaluation's blend is built for its own sample count). Each sample becomes
// one row of the plan's pre-training step: input_ids, position_ids and document_ids over its first
// S tokens and, for the autoregressive objective, the next tokens as labels with the loss mask that
// drops a label in another document; masked diffusion scores every token (a packed sample has no
// padding).
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/data/pretrain/BlendedDataset.h"
#include "runtime/data/pretrain/DataPath.h"
#include "runtime/data/pretrain/DocumentSplit.h"
#include "runtime/model/ModelAdapter.h"
#include "runtime/train/TrainPlan.h"
#include "runtime/train/TrainSplit.h"

namespace dgemma {

struct PackedSplitOptions {
  std::string flag;                      // "--data-path", for messages
  std::vector<DataPathEntry> dataPath;   // the sources and their weights
  SplitWeights split;                    // --split
  SplitPart part = SplitPart::Train;
  int64_t sequenceLength = 0;            // S: the plan's packed length
  int64_t microBatch = 0;                // B: the plan's global micro-batch
  // The samples to build: a training run's steps × global batch; 0 for an evaluation, whose count
  // is `evaluationMicroBatches` × B, or one epoch of every source's part rounded up to whole
  // micro-batches when that is 0.
  int64_t trainingSamples = 0;
  int64_t evaluationMicroBatches = 0;
  uint64_t seed = 0;
  std::string cacheDirectory;            // empty: the index caches go beside the data
  TrainObjective objective = TrainObjective::Autoregressive;
  int64_t vocabSize = 0;                 // every token id must lie in [0, vocabSize)
};

class PackedSplit final : public TrainSplit {
 public:
  // Opens every prefix of the data path and the blend of this part. Throws InputError naming the
  // prefix for a missing or corrupt file, or a part without tokens. Messages (an index built or
  // rebuilt) go to `log` when not null.
  PackedSplit(const PackedSplitOptions& options, const ModelContract& names, std::ostream* log);

  const std::string& path() const override { return path_; }
  int64_t items() const override { return blend_->size(); }
  MicroBatch trainingMicroBatch(int64_t index) override { return assemble(index); }
  int64_t evaluationMicroBatches() const override { return blend_->size() / options_.microBatch; }
  MicroBatch evaluationMicroBatch(int64_t index) override { return assemble(index); }
  nlohmann::json orderState(int64_t consumedSamples) const override;
  // Every sample feeds S real tokens.
  int64_t tokensBefore(int64_t consumedSamples, const std::string& where) override;

 private:
  MicroBatch assemble(int64_t index);

  PackedSplitOptions options_;
  ModelContract names_;
  std::string path_;  // "--data-path 0.7 A 0.3 B (train part)"
  std::unique_ptr<BlendedDataset> blend_;
};

}  // namespace dgemma
