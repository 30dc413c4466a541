// The prompts of `dgemma-run generate` and `eval` (docs/generation.md, "dgemma-run generate"):
// JSONL rows (docs/data.md) or one --prompt, chat-formatted with the Gemma 4 template and the
// generation prompt, checked against what the plan can run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/image/Image.h"
#include "runtime/data/rows/Rows.h"
#include "runtime/data/text/Tokenizer.h"

namespace dgemma::tool {

struct PromptRow {
  int64_t id = 0;        // the row's index among the file's rows (blank lines not counted): its request id
  std::string where;     // "FILE:LINE", or "--prompt"
  std::vector<int64_t> promptIds;
  std::vector<int64_t> promptTokenTypes;  // 1 on image soft tokens
  std::vector<ProcessedImage> images;     // the prompt's images, processed, in order of appearance
  std::string completion;
  bool hasCompletion = false;
  nlohmann::json reference;  // the row's "reference" (null when it has none): dgemma-run rl's verifier compares with it
  std::string text;  // the messages' text parts, joined by newlines: what a verifier sees as the prompt
};

struct PromptRows {
  std::vector<PromptRow> rows;
  std::vector<std::string> skipped;  // "FILE:LINE: field: why", one per skipped row
  int64_t total = 0;                 // rows read, skipped ones included
};

// What the plan can run: its largest prefill bucket, its vocabulary, and its images per prompt
// (0: text-only) with the model's image processor options.
struct PromptLimits {
  int64_t maxPromptLength = 0;
  int64_t vocabSize = 0;
  int64_t imagesPerExample = 0;
  Gemma4ImageOptions image;
};

// Rows of `path`, tokenized, their images decoded and processed. A row that is malformed (docs/data.md,
// "Row validation") or has an image that does not decode is an error unless `skipMalformed`; one the
// plan cannot run (images on a text-only plan, another image count than its images_per_example, a
// prompt longer than every prefill bucket) is an error unless `skipUnrunnable`. Skipped rows are listed with their
// reason. `requireCompletion`: a row without "completion" is malformed (eval), else it may have one.
PromptRows readPromptRows(const std::string& path, const Tokenizer& tokenizer, const PromptLimits& limits,
                          bool requireCompletion, bool skipMalformed, bool skipUnrunnable);

// One user message, as a row with id 0: the images at `imagePaths` (--image, in order), then the text.
PromptRow promptFromText(const std::string& text, const std::vector<std::string>& imagePaths, const Tokenizer& tokenizer,
                         const PromptLimits& limits);

}  // namespace dgemma::tool
