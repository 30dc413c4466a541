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

namespace {

// The real tokens of an item: its encoder context and its canvas block.
int64_t itemTokens(const BlockItem& item) { return static_cast<int64_t>(item.inputIds.size() + item.canvasIds.size()); }

// Whether each item of the split has images (a MicroBatchOrder's modalities).
std::vector<bool> imageItems(const Dataset& dataset) {
  std::vector<bool> isImage;
  for (const DatasetItem& item : dataset.items) isImage.push_back(!dataset.rowImages[item.row].empty());
  return isImage;
}

}  // namespace

BlockSplit::BlockSplit(Dataset dataset, int64_t microBatch, uint64_t seed, const CollateOptions& collate,
                       const Gemma4ImageOptions& image, const ModelContract& names)
    : dataset_(std::move(dataset)),
      seed_(seed),
      collate_(collate),
      image_(image),
      batchNames_(names.batch),
      imageNames_(names.images),
      trainOrder_(SamplerKind::Cyclic, imageItems(dataset_), microBatch, seed),
      evaluationOrder_(SamplerKind::Single, imageItems(dataset_), microBatch, seed) {}

// The sampler and its seed, and where in which epoch `consumedSamples` leaves it (docs/data.md,
// "Item order"). All of it follows from the count.
nlohmann::json BlockSplit::orderState(int64_t consumedSamples) const {
  const int64_t items = trainOrder_.numItems();
  nlohmann::json state = {{"sampler", "cyclic"},
                          {"seed", seed_},
                          {"items", items},
                          {"epoch", consumedSamples / items},
                          {"position", consumedSamples % items}};
  // Image and text items are two streams of the order (docs/data.md, "Item order"); a text-only
  // split records what it always did.
  if (trainOrder_.imageItems() > 0) state["image_items"] = trainOrder_.imageItems();
  return state;
}

// Every whole epoch of a modality stream visits each of its items once, so only each stream's
// current epoch is walked: O(items), whatever the count.
int64_t BlockSplit::tokensBefore(int64_t consumedSamples, const std::string& where) {
  int64_t tokens = 0;
  const int64_t microBatches = consumedSamples / trainOrder_.microBatch();
  for (const bool images : {false, true}) {
    const std::vector<int64_t>& members = trainOrder_.streamItems(images);
    if (members.empty()) continue;
    const int64_t size = static_cast<int64_t>(members.size());
    int64_t epochTokens = 0, wholeEpochs = 0;
    for (int64_t item : members) epochTokens += itemTokens(dataset_.items[item].block);
    const int64_t samples = trainOrder_.streamSamplesBefore(images, microBatches);
    const int64_t epochs = samples / size;
    if (__builtin_mul_overflow(epochs, epochTokens, &wholeEpochs) ||
        __builtin_add_overflow(tokens, wholeEpochs, &tokens))
      throw InputError(where + ": consumed_samples: " + std::to_string(consumedSamples) + " samples of " +
                       dataset_.path + " hold more than 2^63 tokens");
    for (int64_t sample = epochs * size; sample < samples; ++sample)
      tokens += itemTokens(dataset_.items[trainOrder_.streamItemAt(images, sample)].block);
  }
  return tokens;
}

const std::vector<ProcessedImage>& BlockSplit::imagesOf(int64_t row) {
  auto found = rowImages_.find(row);
  if (found != rowImages_.end()) return found->second;
  std::vector<ProcessedImage> images;
  for (const std::string& path : dataset_.rowImages[row])
    images.push_back(processGemma4Image(decodeImage(path), image_));
  return rowImages_.emplace(row, std::move(images)).first->second;
}

MicroBatch BlockSplit::assemble(MicroBatchOrder& order, int64_t index) {
  MicroBatch batch;
  batch.images = order.imagesAt(index);
  std::vector<const BlockItem*> items;
  std::vector<std::vector<ProcessedImage>> itemImages;
  const int64_t firstSample = index * order.microBatch();
  int64_t sample = firstSample;
  for (int64_t item : order.itemsAt(index)) {
    const DatasetItem& entry = dataset_.items[item];
    items.push_back(&entry.block);
    batch.samples.push_back(sample++);
    batch.tokens += itemTokens(entry.block);
    if (batch.images) itemImages.push_back(imagesOf(entry.row));
  }
  batch.fields = collate(items, collate_, batchNames_);
  batch.where = dataset_.path + ": samples " + std::to_string(firstSample) + ".." + std::to_string(sample - 1);
  if (batch.images)
    for (auto& [name, tensor] : collateImages(itemImages, imageNames_)) batch.fields[name] = std::move(tensor);
  return batch;
}

}  // namespace dgemma
