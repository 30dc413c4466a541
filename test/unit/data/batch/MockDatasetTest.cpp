#include <gtest/gtest.h>

#include "support/Error.h"
#include "runtime/data/batch/MockDataset.h"

namespace dgemma {
namespace {

TEST(MockDataset, StructureFollowsTheSpec) {
  MockDatasetOptions options;
  TokenizedRow row = mockRow(options, 5);
  ASSERT_EQ(row.promptIds.size(), 33u);  // <bos> + 32
  EXPECT_EQ(row.promptIds.front(), 2);
  ASSERT_EQ(row.completionIds.size(), 65u);  // 64 + EOS
  EXPECT_EQ(row.completionIds.back(), 1);
  for (size_t i = 1; i < row.promptIds.size(); ++i) {
    EXPECT_GE(row.promptIds[i], 1000);
    EXPECT_LT(row.promptIds[i], 20000);
  }
  EXPECT_EQ(row.promptTokenTypes, std::vector<int64_t>(33, 0));
  // 65 targets in blocks of 256: one item.
  EXPECT_EQ(splitIntoBlocks(row, 256, 8192).size(), 1u);
}

TEST(MockDataset, AnswersCycleAndPromptsDiffer) {
  MockDatasetOptions options;
  EXPECT_EQ(mockRow(options, 1).completionIds, mockRow(options, 5).completionIds);  // same answer program
  EXPECT_NE(mockRow(options, 1).completionIds, mockRow(options, 2).completionIds);
  EXPECT_NE(mockRow(options, 1).promptIds, mockRow(options, 5).promptIds);
  EXPECT_EQ(mockRow(options, 7).promptIds, mockRow(options, 7).promptIds);  // deterministic
  MockDatasetOptions validation = options;
  validation.validation = true;
  EXPECT_NE(mockRow(validation, 3).promptIds, mockRow(options, 3).promptIds);
  MockDatasetOptions otherSeed = options;
  otherSeed.seed = 99;
  EXPECT_NE(mockRow(otherSeed, 3).completionIds, mockRow(options, 3).completionIds);
}

TEST(MockDataset, FitsATinyVocabulary) {
  MockDatasetOptions options;
  options.tokenMin = 13;
  options.tokenMax = 256;
  options.promptLength = 8;
  options.completionLength = 20;
  TokenizedRow row = mockRow(options, 0);
  for (int64_t id : row.completionIds) EXPECT_LT(id, 256);
  EXPECT_EQ(splitIntoBlocks(row, 16, 64).size(), 2u);  // 21 targets in blocks of 16
  options.tokenMax = 13;
  EXPECT_THROW(mockRow(options, 0), InputError);
}

}  // namespace
}  // namespace dgemma
