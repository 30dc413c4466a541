#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "support/Error.h"
#include "runtime/data/dataset/Dataset.h"
#include "test/lib/DiffusionGemmaFieldNames.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;

// A stand-in tokenizer: one id per byte of text, images as boi + n soft tokens + eoi, EOS after the
// completion. It keeps these tests about the dataset rules, not about tokenization.
TokenizedRow byteTokenizer(const Row& row, const std::vector<int64_t>& softTokens) {
  TokenizedRow out;
  out.promptIds = {2};
  size_t image = 0;
  for (const Message& message : row.messages)
    for (const ContentPart& part : message.content) {
      if (part.kind == ContentPart::Image) {
        out.promptIds.push_back(5);
        out.promptIds.insert(out.promptIds.end(), softTokens.at(image++), 4);
        out.promptIds.push_back(6);
      } else {
        for (unsigned char c : part.text) out.promptIds.push_back(7 + c % 200);
      }
    }
  out.promptTokenTypes.resize(out.promptIds.size());
  for (size_t i = 0; i < out.promptIds.size(); ++i) out.promptTokenTypes[i] = out.promptIds[i] == 4;
  for (unsigned char c : row.completion) out.completionIds.push_back(7 + c % 200);
  out.completionIds.push_back(1);
  return out;
}

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("dgemma-dataset-" + std::to_string(::getpid()) + "-" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
    fs::copy_file(std::string(DGEMMA_SOURCE_DIR) + "/data/demo/images/train-0000.png", dir / "shape.png");
    std::ofstream(dir / "notes.txt") << "not an image";
    std::ofstream(dir / "broken.png") << "\x89PNG\r\n\x1a\n truncated";
  }
  void TearDown() override { fs::remove_all(dir); }

  std::string write(const std::string& name, const std::vector<std::string>& lines) {
    std::ofstream out(dir / name);
    for (const std::string& line : lines) out << line << "\n";
    return (dir / name).string();
  }

  fs::path dir;
};

const std::string kImageRow =
    R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "shape.png"}, {"type": "text", "text": "Describe."}]}], "completion": "A red square."})";
const std::string kTextRow = R"({"messages": [{"role": "user", "content": "1+1?"}], "completion": "2"})";

TEST_F(DatasetTest, BuildsItemsPerBlockWithImages) {
  std::string path = write("train.jsonl", {kImageRow, "", kTextRow});
  DatasetOptions options;
  options.canvasLength = 4;
  Dataset dataset = buildDataset(path, byteTokenizer, options);
  EXPECT_EQ(dataset.rows, 2);
  EXPECT_EQ(dataset.images, 1);
  // "A red square." is 13 bytes + EOS = 14 targets -> 4 blocks of 4; "2" + EOS -> 1 block.
  ASSERT_EQ(dataset.items.size(), 5u);
  EXPECT_EQ(dataset.targetTokens, 16);
  EXPECT_EQ(dataset.items[3].block.block, 3);
  EXPECT_EQ(dataset.items[4].row, 1);
  EXPECT_EQ(dataset.rowImages[0], std::vector<std::string>{(dir / "shape.png").string()});
  EXPECT_TRUE(dataset.rowImages[1].empty());
}

// A plan's images_per_example: a row has none or exactly that many images; on a text-only plan (0)
// any image makes a bad row whose message names the compile flag.
TEST_F(DatasetTest, ImageCountsFollowThePlan) {
  const std::string twoImages =
      R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "shape.png"}, {"type": "image", "image": "shape.png"}]}], "completion": "Two."})";
  std::string path = write("train.jsonl", {kTextRow, kImageRow, twoImages});
  DatasetOptions options;
  options.canvasLength = 4;
  options.skipBadRows = true;
  options.imagesPerExample = 1;
  Dataset one = buildDataset(path, byteTokenizer, options);
  EXPECT_EQ(one.rows, 2);
  ASSERT_EQ(one.skipped.size(), 1u);
  EXPECT_EQ(one.skipped[0].text(), path + ":3: images: expected 1 images per example (the plan's images_per_example) or none, got 2");
  options.imagesPerExample = 0;
  Dataset none = buildDataset(path, byteTokenizer, options);
  EXPECT_EQ(none.rows, 1);
  ASSERT_EQ(none.skipped.size(), 2u);
  EXPECT_EQ(none.skipped[0].text(), path + ":2: images: the plan is text-only; a row with 1 image needs a plan compiled with "
                                           "dgemma-compile --images-per-example 1");
  EXPECT_EQ(none.skipped[1].text(), path + ":3: images: the plan is text-only; a row with 2 images needs a plan compiled with "
                                           "dgemma-compile --images-per-example 2");
  options.skipBadRows = false;
  EXPECT_THROW(buildDataset(path, byteTokenizer, options), InputError);
  options.imagesPerExample = -1;  // check-data: any count
  EXPECT_EQ(buildDataset(path, byteTokenizer, options).rows, 3);
}

// Rows that only the dataset build can judge: images that do not decode, contexts over the limit.
TEST_F(DatasetTest, BadRowsFailFastOrAreListed) {
  const std::string unsupported =
      R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "notes.txt"}]}], "completion": "x"})";
  const std::string corrupt =
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image", "image": "broken.png"}]}], "completion": "x"})";
  const std::string longContext = R"({"messages": [{"role": "user", "content": "a very long prompt indeed"}], "completion": "x"})";
  std::string path = write("train.jsonl", {kTextRow, unsupported, corrupt, longContext, kTextRow});
  DatasetOptions options;
  options.canvasLength = 4;
  options.maxEncoderLength = 16;
  try {
    buildDataset(path, byteTokenizer, options);
    FAIL();
  } catch (const InputError& error) {
    std::string message = error.what();
    EXPECT_EQ(message.rfind(path + ":2: messages[0].content[0].image: expected a decodable image: ", 0), 0u) << message;
  }

  options.skipBadRows = true;
  Dataset dataset = buildDataset(path, byteTokenizer, options);
  EXPECT_EQ(dataset.rows, 2);
  ASSERT_EQ(dataset.skipped.size(), 3u);
  EXPECT_EQ(dataset.skipped[0].line, 2);
  EXPECT_EQ(dataset.skipped[1].field, "messages[0].content[1].image");
  EXPECT_EQ(dataset.skipped[2].text(), path + ":4: completion: block 0 needs an encoder context of 26 tokens, more than "
                                                  "max_encoder_length 16 (dgemma never truncates)");
}

// An image that passes the row checks but cannot be read (EIO) gave "internal error" with a
// library's text; a format other than PNG or JPEG is named.
TEST_F(DatasetTest, UnreadableAndUnsupportedImagesAreLocated) {
  const std::string unreadable =
      R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "/proc/self/mem"}]}], "completion": "x"})";
  std::string path = write("train.jsonl", {kTextRow, unreadable});
  DatasetOptions options;
  try {
    buildDataset(path, byteTokenizer, options);
    FAIL();
  } catch (const RuntimeError& error) {
    EXPECT_EQ(std::string(error.what()), path + ":2: messages[0].content[0].image: /proc/self/mem: cannot read: Input/output error");
    EXPECT_EQ(error.exitCode(), 1);
  }
  options.skipBadRows = true;
  Dataset dataset = buildDataset(path, byteTokenizer, options);
  EXPECT_EQ(dataset.rows, 1);
  ASSERT_EQ(dataset.skipped.size(), 1u);
  EXPECT_EQ(dataset.skipped[0].field, "messages[0].content[0].image");

  std::ofstream(dir / "gray.pgm", std::ios::binary) << "P5\n4 4\n255\n" << std::string(5, '\x10');
  path = write("pgm.jsonl", {R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "gray.pgm"}]}], "completion": "x"})"});
  options.skipBadRows = false;
  try {
    buildDataset(path, byteTokenizer, options);
    FAIL();
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()), path + ":1: messages[0].content[0].image: expected a decodable image: " + (dir / "gray.pgm").string() +
                                             ": expected a PNG or JPEG image, got a Netpbm (PGM) image; convert it to PNG "
                                             "(docs/data.md, \"JSONL rows\")");
  }
}

TEST_F(DatasetTest, SplitsMustBeDistinctFiles) {
  std::string train = write("train.jsonl", {kTextRow});
  std::string validation = write("validation.jsonl", {kTextRow});
  fs::create_symlink(dir / "train.jsonl", dir / "alias.jsonl");
  EXPECT_NO_THROW(checkSplits(train, validation, ""));
  try {
    checkSplits(train, validation, (dir / "alias.jsonl").string());
    FAIL();
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("is the same file as --train"), std::string::npos) << error.what();
  }
  EXPECT_THROW(checkSplits("", validation, ""), InputError);
  EXPECT_THROW(checkSplits(train, (dir / "missing.jsonl").string(), ""), InputError);
}

TEST_F(DatasetTest, ImageCollationRejectsMixedMicroBatches) {
  ProcessedImage image = processGemma4Image(decodeImage((dir / "shape.png").string()));
  auto batch = collateImages({{image}, {image, image}}, testing::diffusionGemmaImageNames());
  EXPECT_EQ(batch.at("pixel_values").shape[0], 3);
  EXPECT_EQ(batch.at("pixel_values").shape[1], image.pixelValues.shape[0]);
  EXPECT_EQ(batch.at("image_position_ids").shape, (std::vector<int64_t>{3, image.pixelValues.shape[0], 2}));
  EXPECT_TRUE(collateImages({{}, {}}, testing::diffusionGemmaImageNames()).empty());
  EXPECT_THROW(collateImages({{image}, {}}, testing::diffusionGemmaImageNames()), InputError);
  Gemma4ImageOptions smaller;
  smaller.maxSoftTokens = 70;
  ProcessedImage other = processGemma4Image(decodeImage((dir / "shape.png").string()), smaller);
  EXPECT_THROW(collateImages({{image}, {other}}, testing::diffusionGemmaImageNames()), InputError);
}

}  // namespace
}  // namespace dgemma
