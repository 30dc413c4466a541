// The bundled demo dataset (data/demo, written by scripts/make_demo_data.py) is valid input: every
// row passes validation in fail-fast mode, every image decodes and yields soft tokens, the three
// splits are distinct files of the expected sizes, and no addition of the test or validation split
// is in train (the exact match the demo reports measures addition learned, not pairs memorised).
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "runtime/data/image/Image.h"
#include "runtime/data/rows/Rows.h"

namespace dgemma {
namespace {

const std::string kDemo = std::string(DGEMMA_SOURCE_DIR) + "/data/demo/";

TEST(DemoData, EverySplitValidates) {
  std::set<std::string> files;
  for (auto [split, expectedRows] : {std::pair{"train", 6600}, std::pair{"validation", 200}, std::pair{"test", 200}}) {
    const std::string path = kDemo + split + ".jsonl";
    files.insert(std::filesystem::canonical(path).string());
    RowScan scan = readRows(path, /*skipBadRows=*/false);
    EXPECT_EQ(static_cast<int64_t>(scan.rows.size()), expectedRows) << split;
    EXPECT_TRUE(scan.skipped.empty());
    int64_t imageRows = 0;
    for (const Row& row : scan.rows) {
      EXPECT_FALSE(row.completion.empty());
      for (const Message& message : row.messages)
        for (const ContentPart& part : message.content)
          if (part.kind == ContentPart::Image) ++imageRows;
    }
    EXPECT_GT(imageRows, 0) << split;                       // both tasks are present
    EXPECT_LT(imageRows, expectedRows) << split;
  }
  EXPECT_EQ(files.size(), 3u);  // splits are distinct files
}

// The text of every arithmetic row's user message ("What is A + B?") in `split`.
std::set<std::string> arithmeticPrompts(const std::string& split) {
  std::set<std::string> prompts;
  for (const Row& row : readRows(kDemo + split + ".jsonl", /*skipBadRows=*/false).rows)
    for (const Message& message : row.messages)
      for (const ContentPart& part : message.content)
        if (part.kind == ContentPart::Text && part.text.rfind("What is ", 0) == 0) prompts.insert(part.text);
  return prompts;
}

TEST(DemoData, HeldOutAdditionsAreNotInTrain) {
  const std::set<std::string> train = arithmeticPrompts("train");
  EXPECT_EQ(train.size(), 6000u);  // distinct within train too
  for (const char* split : {"validation", "test"}) {
    const std::set<std::string> heldOut = arithmeticPrompts(split);
    EXPECT_EQ(heldOut.size(), 140u) << split;
    for (const std::string& prompt : heldOut) EXPECT_FALSE(train.count(prompt)) << split << ": " << prompt;
  }
}

TEST(DemoData, ImagesDecodeAndGiveSoftTokens) {
  for (const char* name : {"images/train-0000.png", "images/validation-0007.png", "images/test-0042.png"}) {
    RgbImage image = decodeImage(kDemo + name);
    EXPECT_EQ(image.width, 48);
    EXPECT_EQ(image.height, 48);
    ProcessedImage processed = processGemma4Image(image);
    EXPECT_GT(processed.numSoftTokens, 0) << name;
  }
}

}  // namespace
}  // namespace dgemma
