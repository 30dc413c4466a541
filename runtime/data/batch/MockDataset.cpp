#include "runtime/data/batch/MockDataset.h"

#include "support/Error.h"
#include "runtime/core/Philox.h"

namespace dgemma {

namespace {
// Philox streams of the mock data, apart from the data order and the training noise.
constexpr uint64_t kPromptStream = 0x3c0ffee;
constexpr uint64_t kAnswerStream = 0x3c0ffef;

// `count` ids in [low, high) from Philox(seed; stream, offset). The modulo bias is below 2^-32 * range.
std::vector<int64_t> drawTokens(uint64_t seed, uint64_t stream, uint64_t offset, int64_t count, int64_t low, int64_t high) {
  std::vector<int64_t> tokens(count);
  const uint64_t range = static_cast<uint64_t>(high - low);
  for (int64_t i = 0; i < count; ++i)
    tokens[i] = low + static_cast<int64_t>(philoxUniformBlock(seed, stream, offset, i / 4)[i % 4] % range);
  return tokens;
}
}  // namespace

TokenizedRow mockRow(const MockDatasetOptions& options, int64_t index) {
  if (options.promptLength < 0 || options.completionLength < 0 || options.numDistinctAnswers < 1 ||
      options.tokenMin >= options.tokenMax || index < 0)
    throw InputError("mock dataset: expected non-negative lengths, at least one answer, token_min < token_max and a "
                     "non-negative index");
  const int64_t shifted = index + (options.validation ? kMockValidationOffset : 0);
  TokenizedRow row;
  row.where = std::string("mock:") + (options.validation ? "validation:" : "train:") + std::to_string(index);
  row.promptIds = {options.bosId};
  std::vector<int64_t> text = drawTokens(options.seed, kPromptStream, static_cast<uint64_t>(shifted), options.promptLength,
                                         options.tokenMin, options.tokenMax);
  row.promptIds.insert(row.promptIds.end(), text.begin(), text.end());
  row.promptTokenTypes.assign(row.promptIds.size(), 0);
  const int64_t answer = shifted % options.numDistinctAnswers;
  row.completionIds = drawTokens(options.seed + 7919 * static_cast<uint64_t>(answer), kAnswerStream, 0,
                                 options.completionLength, options.tokenMin, options.tokenMax);
  row.completionIds.push_back(options.eosId);
  return row;
}

}  // namespace dgemma
