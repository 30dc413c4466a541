#include "runtime/generate/Evaluation.h"

#include <algorithm>

namespace dgemma {

std::vector<int64_t> answerTokens(std::span<const int64_t> newTokens, std::span<const int64_t> eosIds, int64_t padId) {
  std::vector<int64_t> answer;
  for (int64_t id : newTokens) {
    if (std::find(eosIds.begin(), eosIds.end(), id) != eosIds.end()) break;
    if (id != padId) answer.push_back(id);
  }
  return answer;
}

std::string answerText(const Tokenizer& tokenizer, std::span<const int64_t> newTokens, std::span<const int64_t> eosIds,
                       int64_t padId) {
  return tokenizer.decode(answerTokens(newTokens, eosIds, padId));
}

CompletionScore scoreCompletion(const Tokenizer& tokenizer, const std::string& answer, std::span<const int64_t> newTokens,
                                const std::string& completion) {
  CompletionScore score;
  score.exactMatch = stripPythonWhitespace(answer) == stripPythonWhitespace(completion);
  const std::vector<int32_t> reference = tokenizer.completionTokens(completion);
  score.referenceTokens = static_cast<int64_t>(reference.size());
  for (size_t position = 0; position < reference.size() && position < newTokens.size(); ++position)
    if (newTokens[position] == reference[position]) ++score.matchingTokens;
  return score;
}

}  // namespace dgemma
