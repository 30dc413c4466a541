// The RowTokenizer of DiffusionGemma: the Gemma 4 chat template with the generation prompt
// (thinking off) for the prompt, the EOS-terminated completion, every id checked against the
// vocabulary (docs/data.md, "Chat template", "Tokenization").
#pragma once

#include "runtime/data/dataset/Dataset.h"
#include "runtime/data/text/Tokenizer.h"

namespace dgemma {

// `tokenizer` must outlive the returned function. `vocabSize` is the model's (ids must be below it).
RowTokenizer gemma4RowTokenizer(const Tokenizer& tokenizer, int64_t vocabSize);

}  // namespace dgemma
