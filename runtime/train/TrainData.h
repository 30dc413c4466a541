// The data side of `dgemma-run train`: each split built for the plan (its canvas length, its
// largest prompt bucket as the longest encoder context, the model's vocabulary), and micro-batches
// collated from it by global sample index (docs/training.md, "The training loop").
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

// The real tokens of an item: its encoder context and its canvas block.
int64_t itemTokens(const BlockItem& item);

// Whether each item of the split has images (a MicroBatchOrder's modalities).
std::vector<bool> imageItems(const Dataset& dataset);

// The processed images of a split's rows, each row's processed once, when a micro-batch first
// needs them (the resize waits until the item is batched).
class RowImageCache {
 public:
  explicit RowImageCache(Gemma4ImageOptions options) : options_(options) {}
  const std::vector<ProcessedImage>& imagesOf(const Dataset& dataset, int64_t row);

 private:
  Gemma4ImageOptions options_;
  std::map<int64_t, std::vector<ProcessedImage>> rows_;
};

struct MicroBatch {
  // collate()'s fields (the prompt's and the canvas's); an image micro-batch adds collateImages()'s
  // pixel values and image position ids. Named by the model's contract.
  std::map<std::string, HostTensor> fields;
  bool images = false;                       // runs the image twins (the image train step)
  std::vector<int64_t> samples;             // global sample indices, the noise keys' sample indices
  int64_t tokens = 0;                        // real prompt and canvas tokens
  std::string where;                         // "FILE: samples 8..9" for messages
};

// Micro-batch `index` of `order` (samples [index·B, (index+1)·B)): its items collated, prompts
// left-padded to the longest of them (running it picks the prompt bucket), and for an image
// micro-batch their images, processed through `images`; every field named by `names`.
MicroBatch assembleMicroBatch(const Dataset& dataset, MicroBatchOrder& order, int64_t index,
                              const CollateOptions& options, RowImageCache& images, const ModelContract& names);

}  // namespace dgemma
