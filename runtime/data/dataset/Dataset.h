// A JSONL split turned into training items (docs/data.md, "Row validation", "Blocks", "Bad input"):
// every row is validated (JSON and schema, images decoded and sized, prompt and completion
// tokenized, every block within max_encoder_length) before any training starts. Fail-fast by
// default; with skipBadRows a bad row is counted and listed, never dropped silently.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/data/batch/Blocks.h"
#include "runtime/data/batch/ImageInputs.h"
#include "runtime/data/image/Image.h"
#include "runtime/data/rows/Rows.h"

namespace dgemma {

// Renders and tokenizes one row: the prompt (with each image expanded to its soft-token count, in
// order of appearance) and the EOS-terminated completion. Throws InputError for anything it cannot
// tokenize (an id outside the vocabulary, ...); the builder attributes it to the row.
using RowTokenizer = std::function<TokenizedRow(const Row& row, const std::vector<int64_t>& imageSoftTokens)>;

struct DatasetOptions {
  int64_t canvasLength = 256;
  int64_t maxEncoderLength = 8192;
  Gemma4ImageOptions image;
  // The plan's images_per_example: a row has no image or exactly this many; with 0 (a text-only
  // plan) every row with an image is a bad row. -1: any count (check-data, which has no plan).
  int64_t imagesPerExample = -1;
  bool skipBadRows = false;
};

struct DatasetItem {
  BlockItem block;
  int64_t row = 0;                      // index into Dataset::rowImages
};

struct Dataset {
  std::string path;
  std::vector<DatasetItem> items;                  // (row, block) order
  std::vector<std::vector<std::string>> rowImages;  // resolved image paths per kept row
  std::vector<RowError> skipped;                   // skip mode: every bad row
  int64_t rows = 0;                                // rows kept
  int64_t lines = 0;
  int64_t promptTokens = 0;                        // over items (encoder context, prompt + earlier blocks)
  int64_t targetTokens = 0;                        // completion tokens, EOS included
  int64_t images = 0;
  int64_t emptyCompletions = 0;
};

Dataset buildDataset(const std::string& path, const RowTokenizer& tokenize, const DatasetOptions& options);

// Splits must be distinct files (after symlinks); validation or test without train is an error.
// Empty strings mean "not given". Throws InputError naming the flags.
void checkSplits(const std::string& train, const std::string& validation, const std::string& test);

// The pixel values [ΣN_img, N_patch, 3·p·p] and image position ids [ΣN_img, N_patch, 2] of a
// micro-batch, images concatenated in example order. Every example must have images (mixed
// micro-batches are rejected) and all must share N_patch. Returns an empty map when no example has
// images.
std::map<std::string, HostTensor> collateImages(const std::vector<std::vector<ProcessedImage>>& imagesPerExample,
                                                const ImageFieldNames& names);

// Adds to a collated image batch (collate()'s token types, collateImages()'s image position ids)
// the host-derived inputs of the image entries: the pool slots, the image token index and the image
// segment ids (deriveImagePlanInputs, with the processor's pooling kernel and soft-token budget).
// Throws InputError located at `where` for a batch whose image tokens and images disagree.
void addImagePlanInputs(std::map<std::string, HostTensor>& fields, int64_t imagesPerExample,
                        const Gemma4ImageOptions& image, const ImageFieldNames& names, const std::string& where);

}  // namespace dgemma
