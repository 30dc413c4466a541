// Issue 15, configs, flags and plans: every value a user controls is checked for its range, and
// sizes computed from them for overflow, before anything is built or allocated; each refusal is
// exit 2 with a message naming the file or flag, the field and the allowed range, within seconds.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

using testing::contains;
using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

const std::string kDemoConfig = std::string(DGEMMA_SOURCE_DIR) + "/models/diffusion_gemma/configs/demo/config.json";

class InputBoundsTest : public ::testing::Test {
 protected:
  // Runs `command` and checks that it is refused with exit 2, quickly, printing `message`.
  void expectRefused(const std::string& command, const std::string& message) {
    const auto start = std::chrono::steady_clock::now();
    ToolResult result = runTool(command);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(result.exitCode, 2) << command << "\n" << result.output;
    EXPECT_TRUE(contains(result, message)) << command << "\n" << result.output;
    EXPECT_LT(seconds, 20.0) << command;
    // A refusal is one located line, never an MLIR dump or a 300-digit echo.
    EXPECT_LT(result.output.size(), 600u) << command << "\n" << result.output;
  }

  // The demo config with one text_config field replaced.
  std::string configWith(const std::string& field, const nlohmann::json& value) {
    nlohmann::json config = nlohmann::json::parse(std::ifstream(kDemoConfig));
    config["text_config"][field] = value;
    const std::string path = dir / (field + ".json");
    std::ofstream(path) << config.dump();
    return path;
  }

  std::string compileTrain(const std::string& config, const std::string& flags = "--prompt-len 4 --micro-batch 1") {
    return std::string(DGEMMA_COMPILE) + " --model " + config + " --mode train " + flags + " -o " + (dir / "plan");
  }

  ScratchDirectory dir;
};

TEST_F(InputBoundsTest, ConfigFieldsOutsideTheirRangesAreRefusedBeforeBuilding) {
  expectRefused(compileTrain(configWith("num_attention_heads", int64_t{1} << 62)),
                "num_attention_heads.json: text_config.num_attention_heads: expected an integer in [1, 1024], got "
                "4611686018427387904");
  expectRefused(compileTrain(configWith("head_dim", int64_t{1} << 32)),
                "head_dim.json: text_config.head_dim: expected an even integer in [2, 8192], got 4294967296");
  expectRefused(compileTrain(configWith("head_dim", int64_t{1} << 62)),
                "text_config.head_dim: expected an even integer in [2, 8192], got 4611686018427387904");
  EXPECT_FALSE(std::filesystem::exists(dir / "plan"));
}

// Sizes each in range whose product is too large to hold: refused naming the tensor, not by the
// allocator, the OOM killer or the MLIR verifier.
TEST_F(InputBoundsTest, ConfigsWhoseTensorsCannotBeHeldAreRefusedNamingTheTensor) {
  nlohmann::json config = nlohmann::json::parse(std::ifstream(kDemoConfig));
  config["text_config"]["vocab_size"] = 1 << 24;
  config["text_config"]["hidden_size"] = 1 << 16;
  std::ofstream(dir / "big.json") << config.dump();
  expectRefused(compileTrain(dir / "big.json"),
                "the model config and flags give a tensor larger than 1.0 TiB (the bound on one tensor): "
                "loc(\"diffusion_gemma.model.decoder.embed_tokens.weight\") of shape [16777216,65536]");
}

TEST_F(InputBoundsTest, DeeplyNestedConfigFieldsAreRefusedWhileReading) {
  std::ifstream in(kDemoConfig);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.erase(text.find_last_of('}'));
  text += ", \"junk\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  std::ofstream(dir / "deep.json") << text;
  expectRefused(compileTrain(dir / "deep.json"), "deep.json: JSON nested deeper than 64 levels");
}

TEST_F(InputBoundsTest, CompileFlagsOutsideTheirRangesAreRefusedShortly) {
  const std::string builtin = std::string(DGEMMA_COMPILE) + " --model builtin:rmsnorm-matmul-softmax --mode infer -o " + (dir / "p");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {compileTrain(kDemoConfig, "--micro-batch 1099511627776"),
       "--micro-batch: expected an integer in [1, 65536], got \"1099511627776\""},
      {compileTrain(kDemoConfig, "--prompt-len 1099511627776"),
       "--prompt-len: expected integers in [1, 1048576] separated by commas, got \"1099511627776\""},
      {compileTrain(kDemoConfig, "--micro-batch 60000 --prompt-len 1000"),
       "--micro-batch 60000 with 1004 tokens per example (longest --prompt-len + canvas): more than 16777216 tokens "
       "per micro-batch"},
      {compileTrain(kDemoConfig, "--micro-batch 1" + std::string(300, '0')),
       "--micro-batch: expected an integer in [1, 65536], got \"1000000000000000000000000000000000000000\"… (301 bytes)"},
      {compileTrain(kDemoConfig, "--canvas-len 0"), "--canvas-len: expected an integer in [1, 1048576], got \"0\""},
      {compileTrain(kDemoConfig, "--weight-decay inf"), "--weight-decay: expected a number in [0, 1e+06], got \"inf\""},
      {compileTrain(kDemoConfig, "--adam-eps 1e400"), "--adam-eps: expected a number in (0, 1], got \"1e400\""},
      {compileTrain(kDemoConfig, "--self-cond-prob 1.5"), "--self-cond-prob: expected a number in [0, 1], got \"1.5\""},
      {compileTrain(kDemoConfig, "--dp 0"), "--dp: expected an integer in [1, 1024], got \"0\""},
      {builtin + " --vocab-size 0", "--vocab-size: expected an integer in [1, 65536], got \"0\""},
      {builtin + " --vocab-size -1", "--vocab-size: expected an integer in [1, 65536], got \"-1\""},
      {builtin + " --hidden-size 0x10", "--hidden-size: expected an integer in [1, 65536], got \"0x10\""},
  };
  for (const auto& [command, message] : cases) expectRefused(command, message);
}

TEST_F(InputBoundsTest, RunFlagsOutsideTheirRangesAreRefusedShortly) {
  const std::string run = std::string(DGEMMA_RUN);
  const std::string plan = " --plan " + (dir / "plan");
  const std::string tokenizer = std::string(" --tokenizer ") + DGEMMA_SOURCE_DIR + "/data/tokenizer";
  const std::string checkData = run + " check-data --data x.jsonl" + tokenizer;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {run + " forward" + plan + " --input b --out o --threads -1", "--threads: expected an integer in [0, 1024], got \"-1\""},
      {run + " forward" + plan + " --input b --out o --threads 100000",
       "--threads: expected an integer in [0, 1024], got \"100000\""},
      {run + " forward" + plan + " --input b --out o --seed -1",
       "--seed: expected an integer in [0, 18446744073709551615], got \"-1\""},
      {run + " grad" + plan + " --input b --out o --step -1",
       "--step: expected an integer in [0, 18446744073709551615], got \"-1\""},
      {run + " train" + plan + " --train mock --steps 18446744073709551616",
       "--steps: expected an integer in [1, 1099511627776], got \"18446744073709551616\""},
      {run + " train" + plan + " --train mock --seed -1", "--seed: expected an integer in [0, 18446744073709551615]"},
      {run + " train" + plan + " --train mock --lr nan", "--lr: expected a number in [0, 1e+30], got \"nan\""},
      {run + " train" + plan + " --train mock --keep -2", "--keep: expected an integer in [0, 1048576], got \"-2\""},
      {run + " train" + plan + " --train mock --comm-timeout 0",
       "--comm-timeout: expected a number in (0, 604800], got \"0\""},
      {run + " generate" + plan + " --weights w --prompt hi --seed -1",
       "--seed: expected an integer in [0, 18446744073709551615], got \"-1\""},
      {checkData + " --vocab-size 0", "--vocab-size: expected an integer in [1, 16777216], got \"0\""},
      {checkData + " --vocab-size -1", "--vocab-size: expected an integer in [1, 16777216], got \"-1\""},
      {checkData + " --canvas-len 0", "--canvas-len: expected an integer in [1, 1048576], got \"0\""},
      {run + " inspect" + plan + " --rank -1", "--rank: expected an integer in [0, 1048575], got \"-1\""},
  };
  for (const auto& [command, message] : cases) expectRefused(command, message);
}

// Issue 15: the hash does not cover the preamble, so a plan with non-zero flags ran.
TEST_F(InputBoundsTest, APlanWithNonZeroPreambleFlagsIsRefused) {
  ASSERT_EQ(runTool(compileTrain(kDemoConfig)).exitCode, 0);
  const std::string path = dir / "plan/rank-0.dgplan";
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(12);
  file.put('\x01');
  file.close();
  expectRefused(std::string(DGEMMA_RUN) + " inspect --plan " + (dir / "plan"),
                path + ": preamble flags (byte 12): expected 0, got 1");
}

// Issue 15: an out-of-vocabulary id was exit 1 naming an internal plan step.
TEST_F(InputBoundsTest, OutOfVocabularyBatchIdsNameTheBatchTensor) {
  ASSERT_EQ(runTool(compileTrain(kDemoConfig)).exitCode, 0);
  HostTensor inputIds(DType::I64, {1, 4}), attention(DType::I64, {1, 4}), canvasIds(DType::I64, {1, 4}),
      canvasMask(DType::F32, {1, 4});  // the demo config's canvas_length
  for (int64_t i = 0; i < 4; ++i) inputIds.as<int64_t>()[i] = 2 + i, attention.as<int64_t>()[i] = 1;
  for (int64_t i = 0; i < 4; ++i) canvasIds.as<int64_t>()[i] = 7, canvasMask.as<float>()[i] = 1;
  canvasIds.as<int64_t>()[2] = 256;  // the demo config's vocab_size
  const std::string batch = dir / "batch.safetensors";
  writeSafetensors(batch, {{"input_ids", &inputIds}, {"attention_mask", &attention}, {"canvas_ids", &canvasIds},
                           {"canvas_mask", &canvasMask}});
  expectRefused(std::string(DGEMMA_RUN) + " grad --plan " + (dir / "plan") + " --init random --input " + batch + " --out " +
                    (dir / "out.safetensors"),
                batch + ": tensor canvas_ids: element [0,2]: token id 256 is outside the vocabulary [0, 256) (the plan's "
                        "vocab_size)");
  EXPECT_FALSE(std::filesystem::exists(dir / "out.safetensors"));
}

}  // namespace
}  // namespace dgemma
