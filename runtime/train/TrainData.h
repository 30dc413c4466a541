// The data side of `dgemma-run train` for chat rows: each split built for the plan (its canvas
// length, its largest prompt bucket as the longest encoder context, the model's vocabulary), and
// micro-batches collated from it by global sample index (docs/training.md, "The training loop").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/HostTensor.h"
#include "runtime/data/batch/Blocks.h"
#include "runtime/data/batch/MicroBatchOrder.h"
#include "runtime/data/batch/MockDataset.h"
#include "runtime/data/dataset/Dataset.h"
#include "runtime/data/text/Tokenizer.h"
#include "runtime/model/ModelAdapter.h"
#include "runtime/train/TrainSplit.h"

namespace dgemma {

struct SplitOptions {
  int64_t canvasLength = 0;
  int64_t maxEncoderLength = 0;  // the plan's largest prompt_len bucket: a longer context fits no bucket
  int64_t vocabSize = 0;
  int64_t imagesPerExample = 0;  // the plan's (0: text-only; image rows are bad rows)
  Gemma4ImageOptions image;      // the plan's model config's (imageOptionsOf)
  bool skipBadRows = false;
  bool quiet = false;  // no counts or skipped rows printed (every rank but 0 loads the same splits)
};

// `--train mock`: synthetic smoke-test data instead of a file (docs/training.md), not evidence of
// quality.
inline constexpr const char* kMockSplit = "mock";
inline constexpr int64_t kMockItems = 64;

// The mock split (MockDataset): kMockItems items of <bos> + random prompt tokens, each completion one
// of four fixed answers filling one canvas block with its EOS, so a run can overfit it. Prompts are
// 32 tokens or as many as the largest prompt bucket holds; token ids come from the upper three
// quarters of the vocabulary, away from the special tokens at its start.
Dataset mockSplit(const SplitOptions& options, int64_t bosId, int64_t eosId, uint64_t seed);

// Builds the split at `path` (given as `flag`), lists each skipped row on stderr and prints its
// counts. A row with images is a bad row unless it has the plan's images_per_example (a text-only
// plan: none). Throws InputError for a bad row (unless skipping) and for a split with no item left.
Dataset loadSplit(const std::string& flag, const std::string& path, const Tokenizer& tokenizer, const SplitOptions& options);

// A split of chat rows cut into canvas blocks (docs/data.md, "Item order"). The training order is
// MicroBatchOrder's cyclic one; an evaluation takes the items in file order, text and image items
// in turns, each modality's last micro-batch wrapping around to its first items to fill the bucket.
// A micro-batch is collated with its prompts left-padded to the longest of them (running it picks
// the prompt bucket) and, for an image micro-batch, its images, each row's processed once when a
// micro-batch first needs them (the demo's fit in a few MB).
class BlockSplit final : public TrainSplit {
 public:
  BlockSplit(Dataset dataset, int64_t microBatch, uint64_t seed, const CollateOptions& collate,
             const Gemma4ImageOptions& image, const ModelContract& names);

  const Dataset& dataset() const { return dataset_; }
  const std::string& path() const override { return dataset_.path; }
  int64_t items() const override { return static_cast<int64_t>(dataset_.items.size()); }
  MicroBatch trainingMicroBatch(int64_t index) override { return assemble(trainOrder_, index); }
  int64_t evaluationMicroBatches() const override { return evaluationOrder_.microBatchesPerEpoch(); }
  MicroBatch evaluationMicroBatch(int64_t index) override { return assemble(evaluationOrder_, index); }
  nlohmann::json orderState(int64_t consumedSamples) const override;
  int64_t tokensBefore(int64_t consumedSamples, const std::string& where) override;

 private:
  MicroBatch assemble(MicroBatchOrder& order, int64_t index);
  const std::vector<ProcessedImage>& imagesOf(int64_t row);

  Dataset dataset_;
  uint64_t seed_;
  CollateOptions collate_;
  Gemma4ImageOptions image_;
  CollatedFieldNames batchNames_;
  ImageFieldNames imageNames_;
  MicroBatchOrder trainOrder_, evaluationOrder_;
  std::map<int64_t, std::vector<ProcessedImage>> rowImages_;
};

}  // namespace dgemma
