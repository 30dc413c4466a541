#include <gtest/gtest.h>

#include "support/Error.h"
#include "runtime/data/batch/Blocks.h"
#include "test/lib/DiffusionGemmaFieldNames.h"

namespace dgemma {
namespace {

constexpr int64_t kEos = 1;

TokenizedRow row(std::vector<int64_t> prompt, std::vector<int64_t> completion) {
  TokenizedRow result;
  result.where = "train.jsonl:7";
  result.promptIds = prompt;
  result.promptTokenTypes.assign(prompt.size(), 0);
  result.completionIds = completion;
  return result;
}

std::vector<int64_t> ints(const HostTensor& tensor) {
  return std::vector<int64_t>(tensor.as<int64_t>(), tensor.as<int64_t>() + tensor.numElements());
}

// The worked example of docs/data.md, "Blocks": C = 2, completion [10..14] + EOS gives three items.
TEST(SplitIntoBlocks, OnlyEarlierCleanBlocksJoinTheEncoder) {
  std::vector<BlockItem> items = splitIntoBlocks(row({2, 105, 7}, {10, 11, 12, 13, 14, kEos}), 2, 8192);
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0].inputIds, (std::vector<int64_t>{2, 105, 7}));
  EXPECT_EQ(items[0].canvasIds, (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(items[1].inputIds, (std::vector<int64_t>{2, 105, 7, 10, 11}));
  EXPECT_EQ(items[1].canvasIds, (std::vector<int64_t>{12, 13}));
  EXPECT_EQ(items[2].inputIds, (std::vector<int64_t>{2, 105, 7, 10, 11, 12, 13}));
  EXPECT_EQ(items[2].canvasIds, (std::vector<int64_t>{14, kEos}));
  EXPECT_EQ(items[2].block, 2);
  EXPECT_EQ(items[2].tokenTypes.size(), items[2].inputIds.size());
}

TEST(SplitIntoBlocks, ShortLastBlockAndImageTypes) {
  TokenizedRow example = row({2, 5, 4, 4, 6}, {20, 21, 22, kEos});
  example.promptTokenTypes = {0, 0, 1, 1, 0};  // boi, two soft tokens, eoi
  std::vector<BlockItem> items = splitIntoBlocks(example, 3, 8192);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[1].canvasIds, (std::vector<int64_t>{kEos}));
  EXPECT_EQ(items[1].tokenTypes, (std::vector<int64_t>{0, 0, 1, 1, 0, 0, 0, 0}));
}

TEST(SplitIntoBlocks, NeverTruncates) {
  try {
    splitIntoBlocks(row({1, 2, 3, 4}, {10, 11, 12, 13, 14, kEos}), 2, 7);
    FAIL();
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()),
              "train.jsonl:7: completion: block 2 needs an encoder context of 8 tokens, more than max_encoder_length 7 "
              "(dgemma never truncates)");
  }
  EXPECT_THROW(splitIntoBlocks(row({1}, {}), 2, 8), InputError);
}

TEST(Collate, LeftPadsPromptsAndRightPadsCanvases) {
  std::vector<BlockItem> first = splitIntoBlocks(row({2, 3, 4, 5, 6}, {10, 11, 12, kEos}), 4, 8192);
  std::vector<BlockItem> second = splitIntoBlocks(row({2, 3}, {20, kEos}), 4, 8192);
  CollateOptions options;
  options.canvasLength = 4;
  options.padToMultipleOf = 2;  // longest prompt 5 -> width 6
  auto batch = collate({&first[0], &second[0]}, options, testing::diffusionGemmaBatchNames());
  EXPECT_EQ(batch.at("input_ids").shape, (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(ints(batch.at("input_ids")), (std::vector<int64_t>{0, 2, 3, 4, 5, 6, 0, 0, 0, 0, 2, 3}));
  EXPECT_EQ(ints(batch.at("attention_mask")), (std::vector<int64_t>{0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(ints(batch.at("position_ids")), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(ints(batch.at("canvas_ids")), (std::vector<int64_t>{10, 11, 12, kEos, 20, kEos, 0, 0}));
  const HostTensor& mask = batch.at("canvas_mask");
  EXPECT_EQ(std::vector<float>(mask.as<float>(), mask.as<float>() + 8), (std::vector<float>{1, 1, 1, 1, 1, 1, 0, 0}));
  EXPECT_EQ(ints(batch.at("mm_token_type_ids")), std::vector<int64_t>(12, 0));
}

TEST(Collate, ScoredEosFillOption) {
  std::vector<BlockItem> items = splitIntoBlocks(row({2}, {20, kEos}), 4, 8192);
  CollateOptions options;
  options.canvasLength = 4;
  options.scoredCanvasFill = kEos;
  auto batch = collate({&items[0]}, options, testing::diffusionGemmaBatchNames());
  EXPECT_EQ(ints(batch.at("canvas_ids")), (std::vector<int64_t>{20, kEos, kEos, kEos}));
  const HostTensor& mask = batch.at("canvas_mask");
  EXPECT_EQ(std::vector<float>(mask.as<float>(), mask.as<float>() + 4), (std::vector<float>{1, 1, 1, 1}));
}

TEST(Collate, RejectsViolatedPreconditions) {
  std::vector<BlockItem> items = splitIntoBlocks(row({2}, {20, 21, 22, kEos}), 4, 8192);
  CollateOptions options;
  options.canvasLength = 4;
  options.padToMultipleOf = 3;
  EXPECT_THROW(collate({&items[0]}, options, testing::diffusionGemmaBatchNames()), InputError);
  options.padToMultipleOf = 1;
  options.canvasLength = 2;  // the item's canvas holds 4 tokens
  try {
    collate({&items[0]}, options, testing::diffusionGemmaBatchNames());
    FAIL();
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()), "train.jsonl:7: block 0: expected a canvas of 1..2 tokens, got 4");
  }
  EXPECT_THROW(collate({}, options, testing::diffusionGemmaBatchNames()), InputError);
}

}  // namespace
}  // namespace dgemma
