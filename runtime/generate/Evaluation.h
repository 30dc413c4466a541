// Scoring a generation against a reference completion (docs/generation.md, "dgemma-run eval").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/data/text/Tokenizer.h"

namespace dgemma {

// The generated answer: the new tokens before the first of `eosIds`, pads dropped.
std::vector<int64_t> answerTokens(std::span<const int64_t> newTokens, std::span<const int64_t> eosIds, int64_t padId);

// The answer's text (answerTokens, decoded).
std::string answerText(const Tokenizer& tokenizer, std::span<const int64_t> newTokens, std::span<const int64_t> eosIds,
                       int64_t padId);

struct CompletionScore {
  bool exactMatch = false;        // the texts agree after Python's str.strip() on both
  int64_t matchingTokens = 0;     // reference positions where the new token equals the reference's
  int64_t referenceTokens = 0;    // the completion's tokens: encoded, EOS appended (docs/data.md)
  double tokenAccuracy() const { return referenceTokens > 0 ? static_cast<double>(matchingTokens) / referenceTokens : 0; }
};

// Compares a generation (its answer text and its new tokens, position by position from the first)
// with the reference completion.
CompletionScore scoreCompletion(const Tokenizer& tokenizer, const std::string& answer, std::span<const int64_t> newTokens,
                                const std::string& completion);

}  // namespace dgemma
