// `dgemma-run train` on pre-training plans end to end (docs/pretraining.md, "Training"): a corpus
// preprocessed into two Megatron indexed datasets, blended 0.7 / 0.3, packed into the tiny CPU
// model's sequences, and trained with the autoregressive, the masked-diffusion and (resume only) the
// block-diffusion step. A run
// resumed from a mid-epoch checkpoint writes the uninterrupted run's metrics and weights; two
// data-parallel ranks read the blend's samples in one rank's order; the wrong data for a plan is
// refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"

namespace dgemma {
namespace {

using testing::contains;
using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

const std::string kModel = std::string(DGEMMA_SOURCE_DIR) + "/models/diffusion_gemma/configs/tiny-cpu.json";
const std::string kTokenizer = std::string(DGEMMA_SOURCE_DIR) + "/data/tokenizer";

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<nlohmann::json> metricsLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(readFile(path));
  for (std::string line; std::getline(in, line);) {
    nlohmann::json parsed = nlohmann::json::parse(line);
    parsed.erase("seconds");  // the one field a resume may change
    lines.push_back(parsed);
  }
  return lines;
}

// Documents of 3 to 40 words from a small vocabulary, one JSON line each; `salt` varies the source.
void writeCorpus(const std::string& path, int documents, int salt) {
  static const char* words[] = {"the", "cat",  "sat",   "on",    "a",    "mat", "and",  "dog",   "ran",
                                "to",  "park", "while", "birds", "sang", "in",  "tall", "green", "trees"};
  std::ofstream out(path);
  for (int d = 0; d < documents; ++d) {
    out << "{\"text\": \"";
    const int length = 3 + (d * 7 + salt * 5) % 38;
    for (int w = 0; w < length; ++w) out << (w ? " " : "") << words[(d * 13 + w * (salt + 3)) % 18];
    out << "\"}\n";
  }
}

class PretrainingRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(
        (std::filesystem::temp_directory_path() / ("dgemma-pretraining-run-" + std::to_string(::getpid()))).string());
    std::filesystem::remove_all(*root_);
    std::filesystem::create_directories(*root_);
    writeCorpus(data("a.jsonl"), 300, 1);
    writeCorpus(data("b.jsonl"), 200, 2);
    const std::string compile = std::string(DGEMMA_COMPILE) + " --model " + kModel + " --mode train --seq-len 32 ";
    for (const std::string& command : {
             std::string(DGEMMA_RUN) + " preprocess --input " + data("a.jsonl") + " --json-keys text --tokenizer " +
                 kTokenizer + " --output-prefix " + data("a"),
             std::string(DGEMMA_RUN) + " preprocess --input " + data("b.jsonl") + " --json-keys text --tokenizer " +
                 kTokenizer + " --output-prefix " + data("b"),
             compile + "--objective autoregressive --micro-batch 4 -o " + data("ar"),
             compile + "--objective autoregressive --micro-batch 2 --dp 2 -o " + data("ar-dp2"),
             compile + "--objective masked-diffusion --mask-token-id 3 --micro-batch 4 -o " + data("md"),
             compile + "--objective masked-diffusion --mask-token-id 3 --micro-batch 2 --dp 2 -o " + data("md-dp2"),
             compile + "--objective block-diffusion --canvas-len 8 --micro-batch 4 -o " + data("bd"),
             std::string(DGEMMA_COMPILE) + " --model " + kModel + " --mode train --micro-batch 4 --prompt-len 48 -o " +
                 data("sft"),
         }) {
      ToolResult result = runTool(command);
      ASSERT_EQ(result.exitCode, 0) << command << "\n" << result.output;
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }
  static std::string data(const std::string& name) { return *root_ + "/" + name; }

  // A run over the 0.7 / 0.3 blend of the two sources, validation every 2 steps.
  std::string train(const std::string& plan, const std::string& flags) const {
    return std::string(DGEMMA_RUN) + " train --plan " + data(plan) + " --init random --seed 5 --data-path 0.7 " +
           data("a") + " 0.3 " + data("b") + " --split 90,10,0 --data-cache-dir " + (dir / "cache") +
           " --eval-every 2 --warmup 1 " + flags;
  }

  static std::string* root_;
  ScratchDirectory dir;
};

std::string* PretrainingRunTest::root_ = nullptr;

// Step 3 of 6 (12 of the blend's ~250 training samples) is mid-epoch. The resumed run rebuilds
// nothing it needs from the interrupted one: the caches, the sample order and the masked- and
// block-diffusion draws follow from the seed and the consumed samples.
TEST_F(PretrainingRunTest, ResumeFromAMidEpochCheckpointContinuesTheUninterruptedRun) {
  for (const std::string plan : {"ar", "md", "bd"}) {
    const std::string common = "--steps 6 --lr 3e-3 --save-every 3 ";
    ToolResult whole = runTool(train(
        plan, common + "--metrics " + (dir / (plan + "-whole.jsonl")) + " --save-dir " + (dir / (plan + "-whole"))));
    ASSERT_EQ(whole.exitCode, 0) << whole.output;
    // The trainer tells block diffusion by its plan's canvas_len bucket (runtime/train/TrainPlan.h).
    if (plan == "bd")
      EXPECT_TRUE(contains(whole, "block-diffusion on packed text, packed length 32, blocks of 8")) << whole.output;
    const std::string metrics = dir / (plan + "-resumed.jsonl");
    const std::string save = dir / (plan + "-resumed");
    ToolResult first = runTool(train(plan, common + "--metrics " + metrics + " --save-dir " + save));
    ASSERT_EQ(first.exitCode, 0) << first.output;
    std::filesystem::remove_all(save + "/step-00000006");
    ToolResult resumed = runTool(train(plan, common + "--metrics " + metrics + " --save-dir " + save + " --resume"));
    ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
    EXPECT_TRUE(contains(resumed, "resumed from " + save + "/step-00000003")) << resumed.output;

    const std::vector<nlohmann::json> expected = metricsLines(dir / (plan + "-whole.jsonl"));
    ASSERT_EQ(expected.size(), 9u) << plan;  // 6 train lines, validation at steps 2, 4 and 6
    EXPECT_EQ(metricsLines(metrics), expected) << plan;
    EXPECT_LT(expected[7].at("loss").get<double>(), expected[0].at("loss").get<double>()) << plan << ": it learns";
    const nlohmann::json& validation = expected.back();
    ASSERT_EQ(validation.at("split"), "validation");
    EXPECT_NEAR(validation.at("perplexity").get<double>(), std::exp(validation.at("loss").get<double>()), 1e-3);
    EXPECT_TRUE(validation.at("diffusion_loss").is_null());
    EXPECT_EQ(readFile(save + "/step-00000006/model-00001-of-00001.safetensors"),
              readFile(dir / (plan + "-whole/step-00000006/model-00001-of-00001.safetensors")))
        << plan;
  }
}

// Two data-parallel ranks, each feeding half of every global micro-batch, against one rank. At
// equal weights (lr 0) every step sees the same samples and draws, so losses agree to 1e-6 and the
// token counts exactly; training, the ranks' all-reduce sums the gradient in another order, which
// Adam turns into weights about 1e-5 apart.
TEST_F(PretrainingRunTest, TwoDataParallelRanksReadOneRanksSamples) {
  for (const std::string plan : {"ar", "md"}) {
    for (const auto& [lr, tolerance] : {std::pair{"0", 1e-6}, std::pair{"3e-3", 1e-3}}) {
      const std::string flags = std::string("--steps 3 --lr ") + lr + " --metrics ";
      ToolResult one = runTool(train(plan, flags + (dir / "one.jsonl")));
      ASSERT_EQ(one.exitCode, 0) << one.output;
      ToolResult two = runTool(train(plan + "-dp2", flags + (dir / "two.jsonl") + " --nproc-per-node 2"));
      ASSERT_EQ(two.exitCode, 0) << two.output;
      const std::vector<nlohmann::json> a = metricsLines(dir / "one.jsonl"), b = metricsLines(dir / "two.jsonl");
      ASSERT_EQ(a.size(), 5u);  // 3 train lines, validation at steps 2 and 3
      ASSERT_EQ(b.size(), a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].at("tokens"), b[i].at("tokens"));
        EXPECT_EQ(a[i].at("consumed_samples"), b[i].at("consumed_samples"));
        const double x = a[i].at("loss").get<double>(), y = b[i].at("loss").get<double>();
        EXPECT_LE(std::abs(x - y), tolerance * std::max(1.0, std::abs(x)))
            << plan << " lr " << lr << ": line " << i << ": " << x << " vs " << y;
      }
    }
  }
}

TEST_F(PretrainingRunTest, TheWrongDataForAPlanIsRefusedByName) {
  ToolResult rows = runTool(std::string(DGEMMA_RUN) + " train --plan " + data("ar") +
                            " --init random --steps 1 --train " + data("a.jsonl") + " --tokenizer " + kTokenizer);
  EXPECT_NE(rows.exitCode, 0);
  EXPECT_TRUE(contains(rows, "--data-path: required: the plan's train_step is the autoregressive")) << rows.output;

  ToolResult sft = runTool(std::string(DGEMMA_RUN) + " train --plan " + data("sft") +
                           " --init random --steps 1 --data-path " + data("a") + " --tokenizer " + kTokenizer);
  EXPECT_NE(sft.exitCode, 0);
  EXPECT_TRUE(contains(sft, "--data-path: feeds a pre-training plan")) << sft.output;

  ToolResult both = runTool(train("ar", "--steps 1 --train " + data("a.jsonl")));
  EXPECT_NE(both.exitCode, 0);
  EXPECT_TRUE(contains(both, "--train excludes --data-path")) << both.output;

  ToolResult missing = runTool(std::string(DGEMMA_RUN) + " train --plan " + data("ar") +
                               " --init random --steps 1 --data-path " + (dir / "nowhere"));
  EXPECT_NE(missing.exitCode, 0);
  EXPECT_TRUE(contains(missing, dir / "nowhere.idx")) << missing.output;

  ToolResult badSplit = runTool(std::string(DGEMMA_RUN) + " train --plan " + data("ar") +
                                " --init random --steps 1 --split 90,x --data-path " + data("a"));
  EXPECT_NE(badSplit.exitCode, 0);
  EXPECT_TRUE(contains(badSplit, "--split: item 2 ('x')")) << badSplit.output;
}

}  // namespace
}  // namespace dgemma
