// The data pipeline end to end against reference batches (test/fixtures/batch, written by
// tools/reference/make_batch_fixtures.py from HF's tokenizer, chat template and
// Gemma4ImageProcessor, collated as docs/data.md, "Blocks" and "Collated batch", say): 22 rows
// (unicode, images, multi-turn, system messages, multi-block completions) -> 51 block items -> 21
// micro-batches, every collated tensor identical.
#include <gtest/gtest.h>

#include "runtime/data/dataset/Gemma4RowTokenizer.h"
#include "runtime/io/Safetensors.h"
#include "test/lib/DiffusionGemmaFieldNames.h"

namespace dgemma {
namespace {

const std::string kRoot = DGEMMA_SOURCE_DIR;

uint64_t fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t value = 0xcbf29ce484222325ull;
  for (uint8_t byte : bytes) value = (value ^ byte) * 0x100000001b3ull;
  return value;
}

void expectEqualTensors(const HostTensor& actual, const HostTensor& expected, const std::string& name) {
  ASSERT_EQ(actual.shape, expected.shape) << name;
  HostTensor converted = convertDType(actual, expected.dtype, name);
  EXPECT_EQ(converted.data, expected.data) << name;
}

TEST(BatchFixture, CollatedTensorsMatchTheReference) {
  constexpr int64_t kCanvas = 16, kMicroBatch = 3, kMaxSoftTokens = 70, kHeadPatches = 4;
  Tokenizer tokenizer(kRoot + "/data/tokenizer");
  DatasetOptions options;
  options.canvasLength = kCanvas;
  options.image.maxSoftTokens = kMaxSoftTokens;
  Dataset dataset = buildDataset(kRoot + "/test/fixtures/batch/rows.jsonl", gemma4RowTokenizer(tokenizer, 256), options);
  ASSERT_EQ(dataset.rows, 22);
  ASSERT_EQ(dataset.items.size(), 51u);

  // The reference's grouping: in item order, at most kMicroBatch items, never mixing image and text.
  std::vector<std::vector<const DatasetItem*>> batches;
  for (const DatasetItem& item : dataset.items) {
    bool hasImages = !dataset.rowImages[item.row].empty();
    if (batches.empty() || batches.back().size() == kMicroBatch ||
        !dataset.rowImages[batches.back().front()->row].empty() != hasImages)
      batches.emplace_back();
    batches.back().push_back(&item);
  }
  ASSERT_EQ(batches.size(), 21u);

  SafetensorsFile expected = SafetensorsFile::open(kRoot + "/test/fixtures/batch/expected.safetensors");
  CollateOptions collateOptions;
  collateOptions.canvasLength = kCanvas;
  collateOptions.padToMultipleOf = 2;
  for (size_t b = 0; b < batches.size(); ++b) {
    const std::string prefix = "batch" + std::to_string(b) + ".";
    std::vector<const BlockItem*> blocks;
    std::vector<std::vector<ProcessedImage>> images;
    for (const DatasetItem* item : batches[b]) {
      blocks.push_back(&item->block);
      images.emplace_back();
      for (const std::string& path : dataset.rowImages[item->row])
        images.back().push_back(processGemma4Image(decodeImage(path), options.image));
    }
    auto fields = collate(blocks, collateOptions, testing::diffusionGemmaBatchNames());
    for (const char* name : {"input_ids", "attention_mask", "position_ids", "mm_token_type_ids", "canvas_ids", "canvas_mask"})
      expectEqualTensors(fields.at(name), expected.read(prefix + name), prefix + name);

    auto imageFields = collateImages(images, testing::diffusionGemmaImageNames());
    ASSERT_EQ(imageFields.empty(), !expected.find(prefix + "pixel_values_fnv1a64")) << prefix;
    if (imageFields.empty()) continue;
    const HostTensor& pixels = imageFields.at("pixel_values");
    HostTensor shape = expected.read(prefix + "pixel_values_shape");
    EXPECT_EQ(pixels.shape, std::vector<int64_t>(shape.as<int64_t>(), shape.as<int64_t>() + 3)) << prefix;
    EXPECT_EQ(fnv1a64(pixels.data), static_cast<uint64_t>(expected.read(prefix + "pixel_values_fnv1a64").as<int64_t>()[0]))
        << prefix << "pixel_values differ";
    HostTensor head = expected.read(prefix + "pixel_values_head");
    for (int64_t image = 0; image < pixels.shape[0]; ++image)
      for (int64_t i = 0; i < kHeadPatches * pixels.shape[2]; ++i)
        ASSERT_EQ(pixels.as<float>()[image * pixels.shape[1] * pixels.shape[2] + i],
                  head.as<float>()[image * kHeadPatches * pixels.shape[2] + i])
            << prefix << "pixel_values image " << image << " value " << i;
    expectEqualTensors(imageFields.at("image_position_ids"), expected.read(prefix + "image_position_ids"),
                       prefix + "image_position_ids");
  }
}

}  // namespace
}  // namespace dgemma
