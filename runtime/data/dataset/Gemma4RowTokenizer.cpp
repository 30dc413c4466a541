#include "runtime/data/dataset/Gemma4RowTokenizer.h"

namespace dgemma {

RowTokenizer gemma4RowTokenizer(const Tokenizer& tokenizer, int64_t vocabSize) {
  return [&tokenizer, vocabSize](const Row& row, const std::vector<int64_t>& imageSoftTokens) {
    TokenizedPrompt prompt = renderGemma4Prompt(tokenizer, row.messages, imageSoftTokens);
    std::vector<int32_t> completion = tokenizer.completionTokens(row.completion);
    checkTokenIds(prompt.inputIds, vocabSize, "messages");
    checkTokenIds(completion, vocabSize, "completion");
    TokenizedRow out;
    out.promptIds.assign(prompt.inputIds.begin(), prompt.inputIds.end());
    out.promptTokenTypes.assign(prompt.mmTokenTypeIds.begin(), prompt.mmTokenTypeIds.end());
    out.completionIds.assign(completion.begin(), completion.end());
    return out;
  };
}

}  // namespace dgemma
