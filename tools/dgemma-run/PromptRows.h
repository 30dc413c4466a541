// The prompts of `dgemma-run generate` and `eval` (docs/generation.md, "dgemma-run generate"):
// JSONL rows (docs/data.md) or one --prompt, chat-formatted with the Gemma 4 template and the
// generation prompt, checked against what the plan can run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/data/rows/Rows.h"
#include "runtime/data/text/Tokenizer.h"

namespace dgemma::tool {

struct PromptRow {
  int64_t id = 0;        // the row's index among the file's rows (blank lines not counted): its request id
  std::string where;     // "FILE:LINE", or "--prompt"
  std::vector<int64_t> promptIds;
  std::string completion;
  bool hasCompletion = false;
};

struct PromptRows {
  std::vector<PromptRow> rows;
  std::vector<std::string> skipped;  // "FILE:LINE: field: why", one per skipped row
  int64_t total = 0;                 // rows read, skipped ones included
};

// What the plan can run: its largest prefill bucket and its vocabulary.
struct PromptLimits {
  int64_t maxPromptLength = 0;
  int64_t vocabSize = 0;
};

// Rows of `path`, tokenized. A row that is malformed (docs/data.md, "Row validation") is an error
// unless `skipMalformed`; one the plan cannot run (images, without the vision tower; a prompt longer
// than every prefill bucket) is an error unless `skipUnrunnable`. Skipped rows are listed with their
// reason. `requireCompletion`: a row without "completion" is malformed (eval), else it may have one.
PromptRows readPromptRows(const std::string& path, const Tokenizer& tokenizer, const PromptLimits& limits,
                          bool requireCompletion, bool skipMalformed, bool skipUnrunnable);

// One user message, as a row with id 0.
PromptRow promptFromText(const std::string& text, const Tokenizer& tokenizer, const PromptLimits& limits);

}  // namespace dgemma::tool
