// Images end to end on the demo model (models/diffusion_gemma/configs/demo: a tiny vision tower,
// patch 8, pooling 2, 9 soft tokens per 48 x 48 image) and a handful of rows in the form of
// data/demo (its images): dgemma-compile --images-per-example, training on an image plan (image and
// text micro-batches) resumed bit-exactly, generate --image and eval over image rows; and the bad
// input of each (docs/training.md, "The training loop"; docs/data.md, "Item order").
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"

namespace dgemma {
namespace {

using testing::contains;
using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

const std::string kSource = DGEMMA_SOURCE_DIR;
const std::string kDemo = kSource + "/models/diffusion_gemma/configs/demo";
const std::string kTokenizer = kSource + "/data/tokenizer";

std::string image(int index) {
  char name[64];
  std::snprintf(name, sizeof name, "/data/demo/images/train-%04d.png", index);
  return kSource + name;
}

std::string imageRow(const std::vector<std::string>& images, const std::string& completion) {
  nlohmann::json content = nlohmann::json::array();
  for (const std::string& path : images) content.push_back({{"type", "image"}, {"image", path}});
  content.push_back({{"type", "text"}, {"text", "Describe the picture."}});
  return nlohmann::json{{"messages", {{{"role", "user"}, {"content", content}}}}, {"completion", completion}}.dump();
}

std::string textRow(int a, int b) {
  char completion[8];
  std::snprintf(completion, sizeof completion, "%03d", a + b);
  return nlohmann::json{{"messages", {{{"role", "user"}, {"content", "What is " + std::to_string(a) + " + " + std::to_string(b) + "?"}}}},
                        {"completion", completion}}
      .dump();
}

void writeLines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path);
  for (const std::string& line : lines) out << line << "\n";
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The metrics lines of steps [first, last] without their wall-clock field.
std::vector<std::string> stepLines(const std::string& path, int64_t first, int64_t last) {
  static const std::regex seconds(R"(, "seconds": [^,}]*)");
  std::vector<std::string> lines;
  std::istringstream in(readFile(path));
  for (std::string line; std::getline(in, line);) {
    const int64_t step = nlohmann::json::parse(line).at("step").get<int64_t>();
    if (step >= first && step <= last) lines.push_back(std::regex_replace(line, seconds, ""));
  }
  return lines;
}

// Prompt buckets that hold an image prompt (9 soft tokens) with its earlier canvas blocks.
constexpr const char* kBuckets = " --prompt-len 48,96";

class ImagePipelineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string((std::filesystem::temp_directory_path() / ("dgemma-images-" + std::to_string(::getpid()))).string());
    std::filesystem::remove_all(*root_);
    std::filesystem::create_directories(*root_);
    const std::string& dir = *root_;
    // Image rows among text rows: the train split mixes both modalities in every epoch.
    writeLines(dir + "/train.jsonl", {textRow(37, 49), imageRow({image(0)}, "A red dot."), textRow(5, 88),
                                      imageRow({image(1)}, "A blue square."), textRow(9, 16), imageRow({image(2)}, "A dot."),
                                      textRow(61, 7)});
    writeLines(dir + "/validation.jsonl", {imageRow({image(3)}, "A cat."), textRow(1, 2)});
    ToolResult train = runTool(std::string(DGEMMA_COMPILE) + " --model " + kDemo + " --mode train --micro-batch 2" + kBuckets +
                               " --encoder-loss-weight 0 --images-per-example 1 -o " + dir + "/image-plan");
    ASSERT_EQ(train.exitCode, 0) << train.output;
    ToolResult text = runTool(std::string(DGEMMA_COMPILE) + " --model " + kDemo + " --mode train --micro-batch 2" + kBuckets +
                              " --encoder-loss-weight 0 -o " + dir + "/text-plan");
    ASSERT_EQ(text.exitCode, 0) << text.output;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }
  static std::string data(const std::string& name) { return *root_ + "/" + name; }
  static std::string train(const std::string& plan, const std::string& split, const std::string& flags) {
    return std::string(DGEMMA_RUN) + " train --plan " + data(plan) + " --init random --seed 3 --tokenizer " + kTokenizer +
           " --train " + split + " " + flags;
  }

  ScratchDirectory dir;
  static std::string* root_;
};

std::string* ImagePipelineTest::root_ = nullptr;

TEST_F(ImagePipelineTest, ImagesPerExampleNeedsAVisionConfig) {
  const std::string tiny = kSource + "/models/diffusion_gemma/configs/tiny-cpu.json";
  ToolResult result = runTool(std::string(DGEMMA_COMPILE) + " --model " + tiny + " --mode train --images-per-example 1 -o " +
                              (dir / "plan"));
  EXPECT_EQ(result.exitCode, 2) << result.output;
  EXPECT_TRUE(contains(result, "--images-per-example 1: " + tiny + " has no vision_config")) << result.output;
  ToolResult negative = runTool(std::string(DGEMMA_COMPILE) + " --model " + kDemo + " --mode train --images-per-example -1 -o " +
                                (dir / "plan"));
  EXPECT_EQ(negative.exitCode, 2) << negative.output;
  EXPECT_TRUE(contains(negative, "--images-per-example")) << negative.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "plan"));
}

// The plan records the flag; a text-only plan of the same config records nothing new.
TEST_F(ImagePipelineTest, ThePlanRecordsImagesPerExample) {
  ToolResult image = runTool(std::string(DGEMMA_COMPILE) + " --model " + kDemo +
                             " --mode train --micro-batch 2 --prompt-len 48 --images-per-example 1 --emit plan-json");
  ASSERT_EQ(image.exitCode, 0) << image.output;
  EXPECT_TRUE(contains(image, "\"images_per_example\": 1")) << image.output.substr(0, 2000);
  ToolResult text = runTool(std::string(DGEMMA_COMPILE) + " --model " + kDemo + " --mode train --micro-batch 2 --prompt-len 48 --emit plan-json");
  ASSERT_EQ(text.exitCode, 0) << text.output;
  EXPECT_FALSE(contains(text, "images_per_example")) << "a text-only plan stays as it was";
}

// On a text-only plan a row with images is a bad row whose message names the flag to compile with.
TEST_F(ImagePipelineTest, TextOnlyPlanRefusesImageRows) {
  ToolResult refused = runTool(train("text-plan", data("train.jsonl"), "--steps 1"));
  EXPECT_EQ(refused.exitCode, 2) << refused.output;
  EXPECT_TRUE(contains(refused, data("train.jsonl") + ":2: images: the plan is text-only; a row with 1 image needs a plan "
                                                     "compiled with dgemma-compile --images-per-example 1"))
      << refused.output;
  ToolResult skipped = runTool(train("text-plan", data("train.jsonl"), "--steps 1 --skip-bad-rows"));
  EXPECT_EQ(skipped.exitCode, 0) << skipped.output;
  EXPECT_TRUE(contains(skipped, "skipped: " + data("train.jsonl") + ":4: images: the plan is text-only")) << skipped.output;
  EXPECT_TRUE(contains(skipped, "rows 7, kept 4, skipped 3")) << skipped.output;
}

// An image plan takes rows with none or exactly images_per_example images.
TEST_F(ImagePipelineTest, WrongImageCountIsABadRow) {
  const std::string split = dir / "two-images.jsonl";
  writeLines(split, {textRow(1, 1), imageRow({image(4), image(5)}, "Two.")});
  ToolResult refused = runTool(train("image-plan", split, "--steps 1"));
  EXPECT_EQ(refused.exitCode, 2) << refused.output;
  EXPECT_TRUE(contains(refused, split + ":2: images: expected 1 images per example (the plan's images_per_example) or none, got 2"))
      << refused.output;
}

// Image and text micro-batches in one run, validation over both; a run stopped at step 3 and
// resumed continues with the lines and weights of the uninterrupted one (the modality streams
// follow from the consumed samples alone).
TEST_F(ImagePipelineTest, TrainsOnImagesAndResumesBitExactly) {
  const std::string common = "--validation " + data("validation.jsonl") + " --lr 3e-3 --warmup 1 --decay-steps 6 --eval-every 3";
  ToolResult whole = runTool(train("image-plan", data("train.jsonl"), common + " --steps 6 --metrics " + (dir / "whole.jsonl") +
                                                                          " --save-dir " + (dir / "whole")));
  ASSERT_EQ(whole.exitCode, 0) << whole.output;
  EXPECT_TRUE(contains(whole, "rows 7, kept 7, skipped 0, items ")) << whole.output;
  const std::string manifest = readFile(dir / "whole/step-00000006/manifest.json");
  EXPECT_NE(manifest.find("\"image_items\""), std::string::npos) << manifest;

  ToolResult first = runTool(train("image-plan", data("train.jsonl"), common + " --steps 3 --metrics " + (dir / "split.jsonl") +
                                                                          " --save-dir " + (dir / "split")));
  ASSERT_EQ(first.exitCode, 0) << first.output;
  ToolResult resumed = runTool(train("image-plan", data("train.jsonl"), common + " --steps 6 --metrics " + (dir / "split.jsonl") +
                                                                            " --save-dir " + (dir / "split") + " --resume"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  const std::vector<std::string> expected = stepLines(dir / "whole.jsonl", 4, 6);
  EXPECT_EQ(expected.size(), 4u);  // three train lines and the validation at 6
  EXPECT_EQ(stepLines(dir / "split.jsonl", 4, 6), expected);
  for (const char* file : {"model-00001-of-00001.safetensors", "optimizer-00001-of-00001.safetensors"})
    EXPECT_TRUE(readFile(dir / "whole/step-00000006/" + file) == readFile(dir / "split/step-00000006/" + file)) << file;
}

// Two data-parallel ranks split an image micro-batch by examples, each with its examples' images
// (rank r: images [r·B/2·I, (r+1)·B/2·I)): the first step's loss on image rows is the one rank's up
// to f32 rounding (the ranks' partial sums meet in another order), while other images for the second
// rank's examples move it by about 1e-2, so the bound would catch images fed to the wrong examples.
TEST_F(ImagePipelineTest, DataParallelImageMicroBatchesMatchOneRank) {
  auto rows = [](int third, int fourth) {
    return std::vector<std::string>{imageRow({image(10)}, "A dot."), imageRow({image(11)}, "A red dot."),
                                    imageRow({image(third)}, "Two."), imageRow({image(fourth)}, "A cat.")};
  };
  writeLines(dir / "images.jsonl", rows(12, 13));
  writeLines(dir / "other-images.jsonl", rows(20, 21));
  auto firstLoss = [&](const std::string& layout, int ranks, const std::string& split) {
    const std::string plan = dir / ("plan-" + std::to_string(ranks));
    if (!std::filesystem::exists(plan)) {
      ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + kDemo + " --mode train" + layout + kBuckets +
                                    " --encoder-loss-weight 0 --images-per-example 1 -o " + plan);
      EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
    }
    const std::string metrics = dir / "metrics.jsonl";
    std::filesystem::remove(metrics);
    ToolResult trained = runTool(std::string(DGEMMA_RUN) + " train --plan " + plan + " --init random --seed 3 --tokenizer " +
                                 kTokenizer + " --train " + split + " --steps 1 --metrics " + metrics + " --nproc-per-node " +
                                 std::to_string(ranks));
    EXPECT_EQ(trained.exitCode, 0) << trained.output;
    const std::string lines = readFile(metrics);
    return nlohmann::json::parse(lines.substr(0, lines.find('\n'))).at("loss").get<double>();
  };
  const double oneRank = firstLoss(" --micro-batch 4", 1, dir / "images.jsonl");
  const double twoRanks = firstLoss(" --micro-batch 2 --dp 2", 2, dir / "images.jsonl");
  const double otherImages = firstLoss(" --micro-batch 4", 1, dir / "other-images.jsonl");
  EXPECT_NEAR(twoRanks, oneRank, 1e-5);
  EXPECT_GT(std::abs(otherImages - oneRank), 1e-3);
}

// generate --image and eval over image rows on an inference plan with prefill_images, from a
// checkpoint of the image plan; a text-only inference plan refuses --image, naming the flag.
TEST_F(ImagePipelineTest, GenerateWithImagesAndEvalPerModality) {
  ToolResult trained = runTool(train("image-plan", data("train.jsonl"), "--steps 1 --save-dir " + (dir / "ckpt")));
  ASSERT_EQ(trained.exitCode, 0) << trained.output;
  const std::string weights = dir / "ckpt/step-00000001";
  ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + kDemo + " --mode infer --micro-batch 2" + kBuckets +
                                " --max-new-tokens 8 --images-per-example 1 -o " + (dir / "infer"));
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  const std::string run = std::string(DGEMMA_RUN) + " generate --plan " + (dir / "infer") + " --weights " + weights +
                          " --tokenizer " + kTokenizer + " --seed 1 --steps 4";
  ToolResult generated = runTool(run + " --json --prompt 'Describe the picture.' --image " + image(7));
  ASSERT_EQ(generated.exitCode, 0) << generated.output;
  EXPECT_TRUE(contains(generated, "\"finish_reason\"")) << generated.output;
  EXPECT_TRUE(contains(generated, "generated 1 requests")) << generated.output;
  ToolResult twoImages = runTool(run + " --prompt hi --image " + image(7) + " --image " + image(8));
  EXPECT_EQ(twoImages.exitCode, 2) << twoImages.output;
  EXPECT_TRUE(contains(twoImages, "images: expected 1 images per prompt (the plan's images_per_example) or none, got 2"))
      << twoImages.output;

  ToolResult evaluated = runTool(std::string(DGEMMA_RUN) + " eval --plan " + (dir / "infer") + " --weights " + weights +
                                 " --tokenizer " + kTokenizer + " --seed 1 --steps 4 --test " + data("train.jsonl"));
  ASSERT_EQ(evaluated.exitCode, 0) << evaluated.output;
  const std::string last = evaluated.output.substr(evaluated.output.rfind("{\"exact_match\""));
  const nlohmann::json summary = nlohmann::json::parse(last.substr(0, last.find('\n')));
  EXPECT_EQ(summary.at("rows"), 7);
  EXPECT_EQ(summary.at("image_rows"), 3);
  EXPECT_EQ(summary.at("text_rows"), 4);
  EXPECT_EQ(summary.at("skipped"), 0);
  EXPECT_TRUE(summary.at("image_exact_match").is_number());

  ToolResult textPlan = runTool(std::string(DGEMMA_COMPILE) + " --model " + kDemo + " --mode infer --micro-batch 2" + kBuckets +
                                " --max-new-tokens 8 -o " + (dir / "text-infer"));
  ASSERT_EQ(textPlan.exitCode, 0) << textPlan.output;
  ToolResult refused = runTool(std::string(DGEMMA_RUN) + " generate --plan " + (dir / "text-infer") + " --weights " + weights +
                               " --tokenizer " + kTokenizer + " --prompt hi --image " + image(7));
  EXPECT_EQ(refused.exitCode, 2) << refused.output;
  EXPECT_TRUE(contains(refused, "images: the plan is text-only; a prompt with 1 image(s) needs a plan compiled with "
                                "dgemma-compile --images-per-example 1"))
      << refused.output;
}

}  // namespace
}  // namespace dgemma
