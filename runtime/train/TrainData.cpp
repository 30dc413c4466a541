#include "runtime/train/TrainData.h"

#include <algorithm>
#include <iostream>

#include "support/Error.h"
#include "runtime/data/dataset/Gemma4RowTokenizer.h"

namespace dgemma {

Dataset loadSplit(const std::string& flag, const std::string& path, const Tokenizer& tokenizer, const SplitOptions& options) {
  DatasetOptions datasetOptions;
  datasetOptions.canvasLength = options.canvasLength;
  datasetOptions.maxEncoderLength = options.maxEncoderLength;
  datasetOptions.skipBadRows = options.skipBadRows;
  Dataset dataset = buildDataset(path, gemma4RowTokenizer(tokenizer, options.vocabSize), datasetOptions);
  const int64_t rows = dataset.rows + static_cast<int64_t>(dataset.skipped.size());
  if (!options.quiet)
    for (const RowError& error : dataset.skipped) std::cerr << "skipped: " << error.text() << "\n";
  // A row with images is bad input for a plan without a vision tower: an error, or skipped and
  // listed like any bad row.
  std::vector<DatasetItem> textItems;
  int64_t lastImageRow = -1;
  for (DatasetItem& item : dataset.items) {
    if (dataset.rowImages[item.row].empty()) {
      textItems.push_back(std::move(item));
      continue;
    }
    const std::string problem = item.block.where + ": images: the plan is text-only until the vision tower is built";
    if (!options.skipBadRows) throw InputError(problem + " (--skip-bad-rows skips such rows)");
    if (item.row == lastImageRow) continue;  // a row's later blocks
    lastImageRow = item.row;
    --dataset.rows;
    if (!options.quiet) std::cerr << "skipped: " << problem << "\n";
  }
  dataset.items = std::move(textItems);
  if (dataset.items.empty()) throw InputError(flag + ": " + path + ": no item to train on (the file is empty or every row was skipped)");
  if (!options.quiet)
    std::cout << flag << " " << path << ": rows " << rows << ", kept " << dataset.rows << ", skipped " << rows - dataset.rows
            << ", items " << dataset.items.size() << "\n";
  return dataset;
}

Dataset mockSplit(const SplitOptions& options, int64_t bosId, int64_t eosId, uint64_t seed) {
  MockDatasetOptions mock;
  mock.promptLength = std::min<int64_t>(32, options.maxEncoderLength - 1);  // <bos> comes first
  mock.completionLength = options.canvasLength - 1;                         // then EOS: one block
  mock.tokenMin = options.vocabSize / 4;
  mock.tokenMax = options.vocabSize;
  mock.bosId = bosId;
  mock.eosId = eosId;
  mock.seed = seed;
  if (mock.promptLength < 1 || mock.completionLength < 1 || mock.tokenMin < 1)
    throw InputError(std::string("--train ") + kMockSplit + ": the plan's buckets or vocabulary are too small for mock data");
  Dataset dataset;
  dataset.path = kMockSplit;
  for (int64_t index = 0; index < kMockItems; ++index) {
    TokenizedRow row = mockRow(mock, index);
    row.where = std::string(kMockSplit) + ":" + std::to_string(index + 1);
    for (BlockItem& block : splitIntoBlocks(row, options.canvasLength, options.maxEncoderLength))
      dataset.items.push_back({std::move(block), index});
    dataset.rowImages.emplace_back();
    dataset.promptTokens += static_cast<int64_t>(row.promptIds.size());
    dataset.targetTokens += static_cast<int64_t>(row.completionIds.size());
  }
  dataset.rows = dataset.lines = kMockItems;
  if (!options.quiet)
    std::cout << "--train " << kMockSplit << ": " << dataset.items.size()
              << " synthetic items (smoke-test data, not evidence of quality)\n";
  return dataset;
}

int64_t itemTokens(const BlockItem& item) { return static_cast<int64_t>(item.inputIds.size() + item.canvasIds.size()); }

MicroBatch assembleMicroBatch(const Dataset& dataset, ItemOrder& order, int64_t firstSample, int64_t size,
                              const CollateOptions& options) {
  MicroBatch batch;
  std::vector<const BlockItem*> items;
  for (int64_t sample = firstSample; sample < firstSample + size; ++sample) {
    const BlockItem& item = dataset.items[order.itemAt(sample)].block;
    items.push_back(&item);
    batch.samples.push_back(sample);
    batch.tokens += itemTokens(item);
  }
  batch.fields = collate(items, options);
  batch.where = dataset.path + ": samples " + std::to_string(firstSample) + ".." + std::to_string(firstSample + size - 1);
  return batch;
}

}  // namespace dgemma
