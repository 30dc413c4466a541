#include "runtime/train/TrainData.h"

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
    std::cerr << "skipped: " << problem << "\n";
  }
  dataset.items = std::move(textItems);
  if (dataset.items.empty()) throw InputError(flag + ": " + path + ": no item to train on (the file is empty or every row was skipped)");
  std::cout << flag << " " << path << ": rows " << rows << ", kept " << dataset.rows << ", skipped " << rows - dataset.rows
            << ", items " << dataset.items.size() << "\n";
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
