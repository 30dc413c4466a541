// The CLI contract: help exits 0, bad usage and bad input exit 2 with a located message, and a
// tampered plan never runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ToolRunner.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

using testing::contains;

class CliTest : public ::testing::Test {
 protected:
  std::string compilePlan() {
    ToolResult result = runTool(std::string(DGEMMA_COMPILE) +
                                " --model builtin:rmsnorm-matmul-softmax --mode infer --prompt-len 4 --hidden-size 8"
                                " --vocab-size 8 -o " + (dir / "plan"));
    EXPECT_EQ(result.exitCode, 0) << result.output;
    return dir / "plan";
  }

  ToolResult forward(const std::string& plan) {
    HostTensor x(DType::F32, {2, 4, 8});
    writeSafetensors(dir / "batch.safetensors", {{"x", &x}});
    return runTool(std::string(DGEMMA_RUN) + " forward --plan " + plan + " --init random --input " + (dir / "batch.safetensors") +
                   " --out " + (dir / "out.safetensors"));
  }

  void rewritePlan(const std::string& plan, const std::function<void(std::string&)>& edit) {
    std::string path = plan + "/rank-0.dgplan";
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    edit(bytes);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  }

  ScratchDirectory dir;
};

TEST_F(CliTest, HelpExitsZero) {
  EXPECT_EQ(runTool(std::string(DGEMMA_COMPILE) + " --help").exitCode, 0);
  ToolResult run = runTool(std::string(DGEMMA_RUN) + " --help");
  EXPECT_EQ(run.exitCode, 0);
  for (const char* command : {"train", "generate", "eval", "check-data", "forward", "grad", "inspect"})
    EXPECT_TRUE(contains(run, command)) << command;
  for (const char* command : {"train", "generate", "eval", "check-data", "forward", "grad"})
    EXPECT_EQ(runTool(std::string(DGEMMA_RUN) + " " + command + " --help").exitCode, 0) << command;
}

TEST_F(CliTest, BadUsageExitsTwo) {
  ToolResult missing = runTool(std::string(DGEMMA_COMPILE) + " --mode infer");
  EXPECT_EQ(missing.exitCode, 2);
  EXPECT_TRUE(contains(missing, "--model is required")) << missing.output;
  ToolResult badMode = runTool(std::string(DGEMMA_COMPILE) + " --model x --mode sample -o p");
  EXPECT_EQ(badMode.exitCode, 2);
  EXPECT_EQ(runTool(std::string(DGEMMA_RUN)).exitCode, 2);
  EXPECT_EQ(runTool(std::string(DGEMMA_RUN) + " forward --plan p").exitCode, 2);
  ToolResult badLengths = runTool(std::string(DGEMMA_COMPILE) +
                                  " --model builtin:rmsnorm-matmul-softmax --mode infer --prompt-len 4,x -o " + (dir / "p"));
  EXPECT_EQ(badLengths.exitCode, 2);
  EXPECT_TRUE(contains(badLengths, "--prompt-len: expected integers in [1, 1048576] separated by commas")) << badLengths.output;
}

// Every bad flag of generate and eval exits 2 naming the flag, before any plan is loaded where the
// flag alone is wrong (docs/generation.md).
TEST_F(CliTest, GenerateAndEvalFlagsAreValidated) {
  const std::string plan = compilePlan();
  const std::string tokenizer = std::string(" --tokenizer ") + DGEMMA_SOURCE_DIR + "/data/tokenizer";
  const std::string generate = std::string(DGEMMA_RUN) + " generate --plan " + plan + " --weights " + (dir / "w") + tokenizer;
  const std::string eval = std::string(DGEMMA_RUN) + " eval --plan " + plan + " --weights " + (dir / "w") + tokenizer;
  std::ofstream(dir / "rows.jsonl") << "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {generate + " --prompt hi --max-new-tokens 0", "--max-new-tokens"},
      {generate + " --prompt hi --max-new-tokens x", "--max-new-tokens"},
      {generate + " --prompt hi --steps 0", "--steps"},
      {generate + " --prompt hi --steps 99999999", "--steps"},
      {generate + " --prompt hi --seed x", "--seed"},
      {generate + " --prompt hi --backend tpu", "--backend"},
      {generate + " --prompt hi --json --visual", "--visual"},
      {generate, "--prompt / --input: give one of them (a prompt text"},
      {generate + " --prompt hi --input " + (dir / "rows.jsonl"), "--prompt / --input: give one of them, not both"},
      {generate + " --prompt ''", "--prompt: expected the text of a user message, got an empty string"},
      // Strict UTF-8 on the command line too: a stray byte, an overlong '/', a surrogate.
      {generate + " --prompt \"$(printf '\\377\\376')\"", "--prompt: expected UTF-8 text, got the invalid byte 0xFF at column 1"},
      {generate + " --prompt \"$(printf 'a\\300\\257')\"", "--prompt: expected UTF-8 text, got the invalid byte 0xC0 at column 2"},
      {generate + " --prompt \"$(printf '\\355\\240\\200')\"", "--prompt: expected UTF-8 text, got the invalid byte 0xED at column 1"},
      {generate + " --input " + (dir / "rows.jsonl") + " --image cat.png", "--image: goes with --prompt"},
      {generate + " --prompt hi", "--plan: " + plan + "/rank-0.dgplan is not an inference plan"},
      {std::string(DGEMMA_RUN) + " generate --plan " + plan + " --prompt hi", "--weights is required"},
      {std::string(DGEMMA_RUN) + " generate --plan " + plan + " --weights " + (dir / "w") + " --prompt hi", "--tokenizer: required"},
      {eval, "--test is required"},
      {eval + " --test " + (dir / "rows.jsonl") + " --steps -3", "--steps"},
      {eval + " --test " + (dir / "rows.jsonl"), "is not an inference plan"},
  };
  for (const auto& [command, message] : cases) {
    ToolResult result = runTool(command);
    EXPECT_EQ(result.exitCode, 2) << command << "\n" << result.output;
    EXPECT_TRUE(contains(result, message)) << command << "\n" << result.output;
  }
}

TEST_F(CliTest, UnbuiltFeaturesSaySoAndExitTwo) {
  ToolResult tp = runTool(std::string(DGEMMA_COMPILE) + " --model builtin:rmsnorm-matmul-softmax --mode infer --tp 2 -o " + (dir / "p"));
  EXPECT_EQ(tp.exitCode, 2);
  EXPECT_TRUE(contains(tp, "has no parallel mapping")) << tp.output;
  std::filesystem::create_directories(dir / "hf");
  std::ofstream(dir / "hf/config.json") << "{\"model_type\": \"diffusion_gemma\"}";
  ToolResult hf = runTool(std::string(DGEMMA_COMPILE) + " --model " + (dir / "hf") + " --mode infer -o " + (dir / "p"));
  EXPECT_EQ(hf.exitCode, 2);
  EXPECT_TRUE(contains(hf, "config.json: text_config: missing")) << hf.output;
}

// Without a GPU driver the binaries still start (nothing links libcuda or libnccl); a run on
// --backend cuda, one rank or several (which would use NCCL), fails with exit 1 naming the flag.
// On a machine with a GPU the GPU tests and scripts/gpu-check.sh cover that backend instead.
TEST_F(CliTest, CudaRunsWithoutAGpuNameTheBackendAndExitOne) {
  if (std::filesystem::exists("/dev/nvidiactl")) GTEST_SKIP() << "this machine has an NVIDIA driver";
  const std::string plan = dir / "tp2";
  ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + DGEMMA_SOURCE_DIR +
                                "/models/diffusion_gemma/configs/tiny-cpu.json --mode train --tp 2 --micro-batch 2"
                                " --prompt-len 16 -o " + plan);
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  const std::string train = std::string(DGEMMA_RUN) + " train --plan " + plan +
                            " --init random --seed 1 --train mock --steps 1 --backend cuda --nproc-per-node 2";
  ToolResult ranks = runTool(train);
  EXPECT_EQ(ranks.exitCode, 1) << ranks.output;
  EXPECT_TRUE(contains(ranks, "error: --backend cuda: ")) << ranks.output;
}

// An inference plan reads the generation_config.json beside the model; like HF, dgemma-compile
// refuses unknown keys and bad values, naming the file and the key.
TEST_F(CliTest, BadGenerationConfigsAreRefusedNamingFileAndKey) {
  std::filesystem::create_directories(dir / "hf");
  std::filesystem::copy_file(std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/seven_layers/config.json",
                             dir / "hf/config.json");
  const std::string compile = std::string(DGEMMA_COMPILE) + " --model " + (dir / "hf") + " --mode infer --prompt-len 4 -o " + (dir / "p");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"do_sample": true})", "generation_config.json: do_sample: unknown key"},
      {R"({"max_denoising_steps": 0})", "generation_config.json: max_denoising_steps: expected an integer in [1, 16777216], got 0"},
      {R"({"sampler_config": {"entropy_bound": -0.5, "_cls_name": "EntropyBoundSamplerConfig"}})",
       "generation_config.json: sampler_config.entropy_bound: expected a number > 0"},
      {"{", "generation_config.json: invalid JSON at byte 2"},
  };
  for (const auto& [text, message] : cases) {
    std::ofstream(dir / "hf/generation_config.json") << text;
    ToolResult result = runTool(compile);
    EXPECT_EQ(result.exitCode, 2) << text << "\n" << result.output;
    EXPECT_TRUE(contains(result, message)) << text << "\n" << result.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "p")) << text;
  }
  std::filesystem::remove(dir / "hf/generation_config.json");
  ToolResult flag = runTool(compile + " --max-new-tokens 0");
  EXPECT_EQ(flag.exitCode, 2);
  EXPECT_TRUE(contains(flag, "--max-new-tokens: expected an integer in [1, 1048576], got \"0\"")) << flag.output;
  ToolResult train = runTool(std::string(DGEMMA_COMPILE) + " --model " + (dir / "hf") + " --mode train --max-new-tokens 8 -o " + (dir / "p"));
  EXPECT_EQ(train.exitCode, 2);
  EXPECT_TRUE(contains(train, "--max-new-tokens: only DiffusionGemma inference plans")) << train.output;
}

// The objective flags of a training plan are validated before anything is built (docs/training.md, "Uniform-state corruption", "The four objectives").
TEST_F(CliTest, TrainingObjectiveFlagsAreValidated) {
  const std::string tiny = std::string(DGEMMA_COMPILE) + " --model " + DGEMMA_SOURCE_DIR +
                           "/models/diffusion_gemma/configs/tiny-cpu.json --mode train -o " + (dir / "p");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --noise-min 0.5 --noise-max 0.2", "expected 0 <= noise_min <= noise_max <= 1"},
      {" --self-cond-prob 1.5", "--self-cond-prob: expected a number in [0, 1], got \"1.5\""},
      {" --objective reweighted-ce --weight-clip 0", "--weight-clip: expected a number in (0, 1e+06], got \"0\""},
      {" --encoder-loss-weight -1", "--encoder-loss-weight: expected a number in [0, 1e+06], got \"-1\""},
      {" --objective flat-ce", "--objective"},
  };
  for (const auto& [flags, message] : cases) {
    ToolResult result = runTool(tiny + flags);
    EXPECT_EQ(result.exitCode, 2) << flags << "\n" << result.output;
    EXPECT_TRUE(contains(result, message)) << flags << "\n" << result.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "p")) << flags;
  }
  ToolResult unclipped = runTool(tiny + " --objective reweighted-loo-ce --emit dg");
  EXPECT_EQ(unclipped.exitCode, 0) << unclipped.output;
  EXPECT_TRUE(contains(unclipped, "without --weight-clip")) << unclipped.output;
}

// check-data on the bundled demo splits reports their counts; bad input exits 2 naming the file.
TEST_F(CliTest, CheckDataCountsTheBundledSplits) {
  const std::string root = DGEMMA_SOURCE_DIR;
  for (auto [split, rows] : {std::pair{"validation", "200"}, std::pair{"test", "200"}}) {
    ToolResult result = runTool(std::string(DGEMMA_RUN) + " check-data --data " + root + "/data/demo/" + split +
                                ".jsonl --tokenizer " + root + "/data/tokenizer --canvas-len 16");
    EXPECT_EQ(result.exitCode, 0) << result.output;
    EXPECT_TRUE(contains(result, std::string(": rows ") + rows + ", kept " + rows + ", skipped 0, blocks ")) << result.output;
  }
  std::ofstream(dir / "bad.jsonl") << "{\"messages\": []}\n";
  ToolResult bad = runTool(std::string(DGEMMA_RUN) + " check-data --data " + (dir / "bad.jsonl") + " --tokenizer " + root +
                           "/data/tokenizer");
  EXPECT_EQ(bad.exitCode, 2);
  EXPECT_TRUE(contains(bad, "bad.jsonl:1: messages: expected")) << bad.output;
  ToolResult noTokenizer = runTool(std::string(DGEMMA_RUN) + " check-data --data " + (dir / "bad.jsonl") + " --tokenizer " +
                                   (dir / "nowhere"));
  EXPECT_EQ(noTokenizer.exitCode, 2);
  EXPECT_TRUE(contains(noTokenizer, "nowhere")) << noTokenizer.output;
}

TEST_F(CliTest, RunsAnIntactPlan) {
  std::string plan = compilePlan();
  ToolResult result = forward(plan);
  EXPECT_EQ(result.exitCode, 0) << result.output;
  ToolResult inspect = runTool(std::string(DGEMMA_RUN) + " inspect --plan " + plan);
  EXPECT_EQ(inspect.exitCode, 0);
  EXPECT_TRUE(contains(inspect, "entry forward[micro_batch=2,prompt_len=4]: 3 steps")) << inspect.output;
}

TEST_F(CliTest, TruncatedPlanIsRejected) {
  std::string plan = compilePlan();
  rewritePlan(plan, [](std::string& bytes) { bytes.resize(bytes.size() - 10); });
  ToolResult result = forward(plan);
  EXPECT_EQ(result.exitCode, 2);
  EXPECT_TRUE(contains(result, "rank-0.dgplan: truncated or extended")) << result.output;
  rewritePlan(plan, [](std::string& bytes) { bytes.resize(30); });
  result = forward(plan);
  EXPECT_EQ(result.exitCode, 2);
  EXPECT_TRUE(contains(result, "truncated: 30 bytes")) << result.output;
}

TEST_F(CliTest, EditedPlanIsRejected) {
  std::string plan = compilePlan();
  rewritePlan(plan, [](std::string& bytes) {
    size_t at = bytes.find("\"eps\":");
    ASSERT_NE(at, std::string::npos);
    bytes[at + 6] = bytes[at + 6] == '1' ? '2' : '1';  // change the first digit of rms_norm's eps
  });
  ToolResult result = forward(plan);
  EXPECT_EQ(result.exitCode, 2);
  EXPECT_TRUE(contains(result, "content hash mismatch")) << result.output;
  EXPECT_EQ(runTool(std::string(DGEMMA_RUN) + " inspect --plan " + plan).exitCode, 2);
}

TEST_F(CliTest, WrongBatchShapeNamesTheBuckets) {
  std::string plan = compilePlan();
  HostTensor x(DType::F32, {2, 5, 8});
  writeSafetensors(dir / "batch.safetensors", {{"x", &x}});
  ToolResult result = runTool(std::string(DGEMMA_RUN) + " forward --plan " + plan + " --init random --input " +
                              (dir / "batch.safetensors") + " --out " + (dir / "out.safetensors"));
  EXPECT_EQ(result.exitCode, 2);
  EXPECT_TRUE(contains(result, "no bucket of \"forward\" takes these tensor shapes")) << result.output;
  EXPECT_TRUE(contains(result, "forward[micro_batch=2,prompt_len=4]: x[2,4,8]")) << result.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "out.safetensors"));  // nothing half-written
}

TEST_F(CliTest, MissingWeightsAreListed) {
  std::string plan = compilePlan();
  HostTensor only(DType::F32, {8});
  writeSafetensors(dir / "weights.safetensors", {{"norm.weight", &only}});
  HostTensor x(DType::F32, {2, 4, 8});
  writeSafetensors(dir / "batch.safetensors", {{"x", &x}});
  ToolResult result = runTool(std::string(DGEMMA_RUN) + " forward --plan " + plan + " --weights " + (dir / "weights.safetensors") +
                              " --input " + (dir / "batch.safetensors") + " --out " + (dir / "out.safetensors"));
  EXPECT_EQ(result.exitCode, 2);
  EXPECT_TRUE(contains(result, "missing tensor proj.weight [8,8]")) << result.output;
}

}  // namespace
}  // namespace dgemma
