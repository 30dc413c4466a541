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
  datasetOptions.imagesPerExample = options.imagesPerExample;
  datasetOptions.image = options.image;
  Dataset dataset = buildDataset(path, gemma4RowTokenizer(tokenizer, options.vocabSize), datasetOptions);
  const int64_t rows = dataset.rows + static_cast<int64_t>(dataset.skipped.size());
  if (!options.quiet)
    for (const RowError& error : dataset.skipped) std::cerr << "skipped: " << error.text() << "\n";
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

std::vector<bool> imageItems(const Dataset& dataset) {
  std::vector<bool> isImage;
  for (const DatasetItem& item : dataset.items) isImage.push_back(!dataset.rowImages[item.row].empty());
  return isImage;
}

const std::vector<ProcessedImage>& RowImageCache::imagesOf(const Dataset& dataset, int64_t row) {
  auto found = rows_.find(row);
  if (found != rows_.end()) return found->second;
  std::vector<ProcessedImage> images;
  for (const std::string& path : dataset.rowImages[row]) images.push_back(processGemma4Image(decodeImage(path), options_));
  return rows_.emplace(row, std::move(images)).first->second;
}

MicroBatch assembleMicroBatch(const Dataset& dataset, MicroBatchOrder& order, int64_t index,
                              const CollateOptions& options, RowImageCache& images, const ModelContract& names) {
  MicroBatch batch;
  batch.images = order.imagesAt(index);
  std::vector<const BlockItem*> items;
  std::vector<std::vector<ProcessedImage>> itemImages;
  const int64_t firstSample = index * order.microBatch();
  int64_t sample = firstSample;
  for (int64_t item : order.itemsAt(index)) {
    const DatasetItem& entry = dataset.items[item];
    items.push_back(&entry.block);
    batch.samples.push_back(sample++);
    batch.tokens += itemTokens(entry.block);
    if (batch.images) itemImages.push_back(images.imagesOf(dataset, entry.row));
  }
  batch.fields = collate(items, options, names.batch);
  batch.where = dataset.path + ": samples " + std::to_string(firstSample) + ".." + std::to_string(sample - 1);
  if (batch.images)
    for (auto& [name, tensor] : collateImages(itemImages, names.images)) batch.fields[name] = std::move(tensor);
  return batch;
}

}  // namespace dgemma
