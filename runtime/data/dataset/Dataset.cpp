#include "runtime/data/dataset/Dataset.h"

#include <cstring>
#include <filesystem>

#include "runtime/data/batch/ImageInputs.h"
#include "support/Error.h"

namespace dgemma {

namespace {

// Field path of each image part, in order of appearance ("messages[0].content[1].image").
std::vector<std::pair<std::string, std::string>> imageParts(const Row& row) {
  std::vector<std::pair<std::string, std::string>> parts;
  for (size_t m = 0; m < row.messages.size(); ++m)
    for (size_t c = 0; c < row.messages[m].content.size(); ++c)
      if (row.messages[m].content[c].kind == ContentPart::Image)
        parts.push_back({"messages[" + std::to_string(m) + "].content[" + std::to_string(c) + "].image",
                         row.messages[m].content[c].imagePath});
  return parts;
}

}  // namespace

Dataset buildDataset(const std::string& path, const RowTokenizer& tokenize, const DatasetOptions& options) {
  RowScan scan = readRows(path, options.skipBadRows);
  Dataset dataset;
  dataset.path = path;
  dataset.skipped = std::move(scan.skipped);
  dataset.lines = scan.lines;
  dataset.emptyCompletions = scan.emptyCompletions;

  for (const Row& row : scan.rows) {
    const std::string where = path + ":" + std::to_string(row.line);
    auto reject = [&](const std::string& field, const std::string& expected) {
      RowError error{path, row.line, field, expected};
      if (!options.skipBadRows) throw InputError(error.text());
      dataset.skipped.push_back(std::move(error));
    };

    const std::vector<std::pair<std::string, std::string>> parts = imageParts(row);
    const int64_t imageCount = static_cast<int64_t>(parts.size());
    if (options.imagesPerExample >= 0 && imageCount > 0 && imageCount != options.imagesPerExample) {
      reject("images", options.imagesPerExample == 0
                           ? "the plan is text-only; a row with " + std::to_string(imageCount) + " image" +
                                 (imageCount == 1 ? "" : "s") + " needs a plan compiled with dgemma-compile --images-per-example " +
                                 std::to_string(imageCount)
                           : "expected " + std::to_string(options.imagesPerExample) +
                                 " images per example (the plan's images_per_example) or none, got " + std::to_string(imageCount));
      continue;
    }
    std::vector<int64_t> softTokens;
    std::vector<std::string> imagePaths;
    bool good = true;
    for (const auto& [field, imagePath] : parts) {
      try {
        // Decoding proves the file is a readable image; the resize waits until the item is batched.
        RgbImage image = decodeImage(imagePath);
        softTokens.push_back(gemma4SoftTokenCount(image.height, image.width, options.image));
        imagePaths.push_back(imagePath);
      } catch (const InputError& error) {
        reject(field, std::string("expected a decodable image: ") + error.what());
        good = false;
        break;
      } catch (const RuntimeError& error) {
        // A read that failed (EIO): still the row's image, located, and exit 1 as an I/O failure.
        if (!options.skipBadRows) throw RuntimeError(RowError{path, row.line, field, error.what()}.text());
        reject(field, std::string("expected a readable image: ") + error.what());
        good = false;
        break;
      }
    }
    if (!good) continue;

    std::vector<BlockItem> blocks;
    try {
      TokenizedRow tokenized = tokenize(row, softTokens);
      tokenized.where = where;
      blocks = splitIntoBlocks(tokenized, options.canvasLength, options.maxEncoderLength);
      dataset.targetTokens += static_cast<int64_t>(tokenized.completionIds.size());
    } catch (const InputError& error) {
      // splitIntoBlocks and the tokenizer name the row themselves ("FILE:LINE: field: ..."); skip
      // mode files the message under its field.
      if (!options.skipBadRows) throw;
      std::string message = error.what();
      std::string prefix = where + ": ";
      std::string rest = message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
      size_t colon = rest.find(": ");
      dataset.skipped.push_back(RowError{path, row.line, colon == std::string::npos ? "row" : rest.substr(0, colon),
                                         colon == std::string::npos ? rest : rest.substr(colon + 2)});
      continue;
    }
    const int64_t rowIndex = static_cast<int64_t>(dataset.rowImages.size());
    for (BlockItem& block : blocks) {
      dataset.promptTokens += static_cast<int64_t>(block.inputIds.size());
      dataset.items.push_back({std::move(block), rowIndex});
    }
    dataset.images += static_cast<int64_t>(imagePaths.size());
    dataset.rowImages.push_back(std::move(imagePaths));
    ++dataset.rows;
  }
  return dataset;
}

void checkSplits(const std::string& train, const std::string& validation, const std::string& test) {
  if (train.empty() && (!validation.empty() || !test.empty()))
    throw InputError("--validation/--test: a validation or test split needs --train as well");
  std::vector<std::pair<std::string, std::string>> given;
  for (auto [flag, path] : {std::pair{"--train", train}, std::pair{"--validation", validation}, std::pair{"--test", test}}) {
    if (path.empty()) continue;
    std::error_code error;
    std::string canonical = std::filesystem::canonical(path, error).string();
    if (error) throw InputError(std::string(flag) + ": " + path + ": cannot open: " + error.message());
    for (const auto& [otherFlag, otherPath] : given)
      if (otherPath == canonical)
        throw InputError(std::string(flag) + ": " + path + " is the same file as " + otherFlag +
                         "; splits must be distinct files (dgemma never creates or mixes splits)");
    given.push_back({flag, canonical});
  }
}

std::map<std::string, HostTensor> collateImages(const std::vector<std::vector<ProcessedImage>>& imagesPerExample,
                                                const ImageFieldNames& names) {
  size_t withImages = 0, total = 0;
  for (const auto& images : imagesPerExample) {
    withImages += !images.empty();
    total += images.size();
  }
  if (withImages == 0) return {};
  if (withImages != imagesPerExample.size())
    throw InputError("collate: a micro-batch mixes examples with and without images (" + std::to_string(withImages) + " of " +
                     std::to_string(imagesPerExample.size()) + " have images); use micro-batch 1 or bucket by modality");
  const ProcessedImage& first = imagesPerExample.front().front();
  const int64_t patches = first.pixelValues.shape[0], patchValues = first.pixelValues.shape[1];
  HostTensor pixels(DType::F32, {static_cast<int64_t>(total), patches, patchValues});
  HostTensor positions(DType::I64, {static_cast<int64_t>(total), patches, 2});
  size_t index = 0;
  for (const auto& images : imagesPerExample)
    for (const ProcessedImage& image : images) {
      if (image.pixelValues.shape != first.pixelValues.shape)
        throw InputError("collate: images of one micro-batch must share N_patch (one max_soft_tokens setting), got " +
                         shapeToString(image.pixelValues.shape) + " and " + shapeToString(first.pixelValues.shape));
      std::memcpy(pixels.data.data() + index * image.pixelValues.data.size(), image.pixelValues.data.data(),
                  image.pixelValues.data.size());
      std::memcpy(positions.data.data() + index * image.imagePositionIds.data.size(), image.imagePositionIds.data.data(),
                  image.imagePositionIds.data.size());
      ++index;
    }
  return {{names.pixelValues, std::move(pixels)}, {names.imagePositionIds, std::move(positions)}};
}

void addImagePlanInputs(std::map<std::string, HostTensor>& fields, int64_t imagesPerExample,
                        const Gemma4ImageOptions& image, const ImageFieldNames& names, const std::string& where) {
  for (const std::string* name : {&names.imagePositionIds, &names.tokenTypeIds})
    if (!fields.count(*name)) throw InputError(where + ": an image batch without " + *name);
  try {
    ImagePlanInputs inputs = deriveImagePlanInputs(fields.at(names.imagePositionIds), fields.at(names.tokenTypeIds),
                                                   imagesPerExample, image.poolingKernelSize, image.maxSoftTokens);
    fields[names.imagePoolSlot] = std::move(inputs.poolSlot);
    fields[names.imageTokenIndex] = std::move(inputs.tokenIndex);
    fields[names.imageSegmentIds] = std::move(inputs.segmentIds);
  } catch (const InputError& error) {
    throw InputError(where + ": " + error.what());
  }
}

}  // namespace dgemma
