// `dgemma-run rl` end to end on the tiny CPU model (models/diffusion_gemma/configs/tiny-cpu.json):
// a policy-loss training plan (dgemma-compile --policy-loss grpo, with the KL term), an inference
// plan for the rollouts, arithmetic prompts with references, and the numeric verifier or a reward
// command. A rerun reproduces every step's rewards and losses; a run killed with SIGKILL and resumed
// writes the uninterrupted run's metrics; two data-parallel ranks equal one rank with the same
// global group; a reward command that crashes, hangs or prints garbage ends the run with a located
// error; an SFT plan is refused.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"

namespace dgemma {
namespace {

using testing::contains;
using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<nlohmann::json> metricsLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(readFile(path));
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// The lines without their wall-clock fields, the only ones a rerun or a resume may change.
std::vector<nlohmann::json> withoutTimes(std::vector<nlohmann::json> lines) {
  for (nlohmann::json& line : lines)
    for (const char* field : {"seconds", "rollout_seconds", "update_seconds"}) line.erase(field);
  return lines;
}

// "What is A + B?" with the sum as the reference.
void writePrompts(const std::string& path, int rows) {
  std::ofstream out(path);
  for (int i = 0; i < rows; ++i) {
    const int a = (37 * i + 3) % 100, b = (53 * i + 5) % 100;
    out << R"({"messages": [{"role": "user", "content": "What is )" << a << " + " << b << R"(?"}], "reference": )"
        << a + b << "}\n";
  }
}

class RlLoopTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(
        (std::filesystem::temp_directory_path() / ("dgemma-rl-loop-" + std::to_string(::getpid()))).string());
    std::filesystem::remove_all(*root_);
    std::filesystem::create_directories(*root_);
    writePrompts(data("prompts.jsonl"), 6);
    // The tiny model's random completions never hold the sum: a reward that varies with the text
    // (its length modulo 4) gives the groups advantages, so the updates move the weights.
    std::ofstream(data("length.py")) << "import json, sys\n"
                                        "for line in sys.stdin:\n"
                                        "    row = json.loads(line)\n"
                                        "    print(json.dumps({'reward': len(row['completion'].strip()) % 4 / 3}))\n";
    const std::string model = std::string(DGEMMA_SOURCE_DIR) + "/models/diffusion_gemma/configs/tiny-cpu.json";
    for (const std::string& command :
         {std::string(DGEMMA_COMPILE) + " --model " + model + " --mode train --micro-batch 4 --prompt-len 48 -o " +
              data("sft"),
          std::string(DGEMMA_COMPILE) + " --model " + model +
              " --mode train --policy-loss grpo --kl-coeff 0.04 --micro-batch 4 --prompt-len 48 -o " + data("grpo"),
          std::string(DGEMMA_COMPILE) + " --model " + model +
              " --mode train --policy-loss grpo --kl-coeff 0.04 --micro-batch 2 --dp 2 --prompt-len 48 -o " +
              data("grpo-dp2"),
          std::string(DGEMMA_COMPILE) + " --model " + model +
              " --mode train --policy-loss grpo --kl-coeff 0.04 --micro-batch 2 --tp 2 --prompt-len 48 -o " +
              data("grpo-tp2"),
          std::string(DGEMMA_COMPILE) + " --model " + model +
              " --mode train --policy-loss grpo --kl-coeff 0.04 --micro-batch 4 --lora 4 --prompt-len 48 -o " +
              data("grpo-lora"),
          std::string(DGEMMA_COMPILE) + " --model " + model +
              " --mode infer --micro-batch 4 --prompt-len 48 --max-new-tokens 16 -o " + data("infer"),
          std::string(DGEMMA_COMPILE) + " --model " + model +
              " --mode infer --micro-batch 4 --lora 4 --prompt-len 48 --max-new-tokens 16 -o " + data("infer-lora"),
          // The policy starts from a checkpoint: one SFT step from random weights.
          std::string(DGEMMA_RUN) + " train --plan " + data("sft") +
              " --init random --seed 3 --train mock --steps 1 --save-dir " + data("start")}) {
      ToolResult result = runTool(command);
      ASSERT_EQ(result.exitCode, 0) << command << "\n" << result.output;
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }

  static std::string data(const std::string& name) { return *root_ + "/" + name; }

  // A run on `plan` with the numeric verifier; `flags` adds the rest.
  static std::string rl(const std::string& flags, const std::string& plan = data("grpo"),
                        const std::string& rollout = data("infer")) {
    return std::string(DGEMMA_RUN) + " rl --plan " + plan + " --rollout-plan " + rollout + " --weights " +
           data("start") + "/step-00000001 --tokenizer " + DGEMMA_SOURCE_DIR + "/data/tokenizer --prompts " +
           data("prompts.jsonl") + " --seed 5 --group-size 4 --prompts-per-step 2 " + flags;
  }
  static std::string numeric(const std::string& flags, const std::string& plan = data("grpo")) {
    return rl("--reward numeric " + flags, plan);
  }
  static std::string byLength(const std::string& flags, const std::string& plan = data("grpo")) {
    return rl("--reward-command 'python3 " + data("length.py") + "' " + flags, plan);
  }

  ScratchDirectory dir;
  static std::string* root_;
};

std::string* RlLoopTest::root_ = nullptr;

TEST_F(RlLoopTest, ARerunReproducesEveryStep) {
  const std::string flags =
      "--lr 1e-3 --steps 3 --inner-updates 2 --diffusion-samples 2 --tensorboard " + (dir / "tb") + " --metrics ";
  ToolResult first = runTool(byLength(flags + (dir / "first.jsonl")));
  ASSERT_EQ(first.exitCode, 0) << first.output;
  ToolResult second = runTool(byLength(flags + (dir / "second.jsonl")));
  ASSERT_EQ(second.exitCode, 0) << second.output;
  const std::vector<nlohmann::json> lines = metricsLines(dir / "first.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  for (const nlohmann::json& line : lines) {
    for (const char* field :
         {"reward_mean", "reward_std", "pass_rate", "kl_mean", "clip_fraction", "rollout_seconds", "update_seconds"})
      EXPECT_TRUE(line.contains(field)) << field << " missing: " << line.dump();
    EXPECT_TRUE(std::isfinite(line.at("loss").get<double>())) << line.dump();
    // 2 prompts x 4 members, one block each, 2 diffusion times.
    EXPECT_EQ(line.at("examples").get<int64_t>(), 16) << line.dump();
  }
  // The first step's KL is to the weights it starts from on the same noise: exactly 0 at the first
  // of its updates, positive at the second, once the first has moved the weights.
  EXPECT_GT(lines[0].at("reward_std").get<double>(), 0.0) << lines[0].dump();
  EXPECT_GT(lines[0].at("grad_norm").get<double>(), 0.0) << lines[0].dump();
  EXPECT_GT(lines[0].at("kl_mean").get<double>(), 0.0) << lines[0].dump();
  EXPECT_EQ(withoutTimes(lines), withoutTimes(metricsLines(dir / "second.jsonl")));
  EXPECT_TRUE(std::filesystem::is_directory(dir / "tb"));
}

TEST_F(RlLoopTest, ResumeAfterKillNineContinuesTheUninterruptedRun) {
  const std::string common = "--lr 1e-3 --steps 5 --save-every 1 --inner-updates 2";
  ToolResult whole =
      runTool(byLength(common + " --metrics " + (dir / "whole.jsonl") + " --save-dir " + (dir / "whole")));
  ASSERT_EQ(whole.exitCode, 0) << whole.output;

  const std::string metrics = dir / "killed.jsonl";
  const std::string command = byLength(common + " --metrics " + metrics + " --save-dir " + (dir / "killed"));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + command + " > " + (dir / "killed.log") + " 2>&1").c_str(), nullptr);
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  bool sawStepTwo = false;
  int status = 0;
  while (!sawStepTwo && std::chrono::steady_clock::now() < deadline) {
    sawStepTwo = readFile(metrics).find(R"({"step": 2, "split": "train")") != std::string::npos;
    if (!sawStepTwo) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (::waitpid(child, &status, WNOHANG) == child)
      FAIL() << "the run ended before it was killed\n" << readFile(dir / "killed.log");
  }
  ::kill(child, SIGKILL);
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(sawStepTwo) << readFile(dir / "killed.log");
  ASSERT_TRUE(WIFSIGNALED(status)) << "the run finished before the kill landed";

  ToolResult resumed =
      runTool(byLength(common + " --metrics " + metrics + " --save-dir " + (dir / "killed") + " --resume"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed, "resumed from ")) << resumed.output;
  EXPECT_EQ(withoutTimes(metricsLines(metrics)), withoutTimes(metricsLines(dir / "whole.jsonl")));
  EXPECT_EQ(readFile(dir / "killed/step-00000005/model-00001-of-00001.safetensors"),
            readFile(dir / "whole/step-00000005/model-00001-of-00001.safetensors"));
}

// The same global group on two data-parallel ranks (each samples, scores and trains on half) and on
// one. At equal weights (lr 0: every step's rollouts, losses and gradients at the starting weights)
// rewards agree bit for bit and the loss, KL and gradient norm to 1e-6. Training (lr 1e-3), the
// ranks' all-reduce adds the gradient in another order than one rank's sum, and Adam's first
// updates, about lr x sign(g), turn that rounding into weights that differ by about 1e-5: rewards
// still agree bit for bit over three steps, losses to 1e-3.
TEST_F(RlLoopTest, TwoDataParallelRanksEqualOne) {
  auto compare = [&](const std::string& name, const std::string& flags, double tolerance) {
    ToolResult one = runTool(byLength(flags + " --metrics " + (dir / (name + "-one.jsonl"))));
    ASSERT_EQ(one.exitCode, 0) << one.output;
    ToolResult two = runTool(
        byLength(flags + " --metrics " + (dir / (name + "-two.jsonl")) + " --nproc-per-node 2", data("grpo-dp2")));
    ASSERT_EQ(two.exitCode, 0) << two.output;
    const std::vector<nlohmann::json> a = metricsLines(dir / (name + "-one.jsonl")),
                                      b = metricsLines(dir / (name + "-two.jsonl"));
    ASSERT_EQ(a.size(), 3u);
    ASSERT_EQ(b.size(), 3u);
    for (size_t i = 0; i < a.size(); ++i) {
      for (const char* field : {"reward_mean", "reward_std", "pass_rate", "tokens", "examples"})
        EXPECT_EQ(a[i].at(field), b[i].at(field)) << name << ": " << field << " at step " << i + 1;
      for (const char* field : {"loss", "kl_mean", "grad_norm"}) {
        const double x = a[i].at(field).get<double>(), y = b[i].at(field).get<double>();
        EXPECT_LE(std::abs(x - y), tolerance * std::max(1.0, std::abs(x)))
            << name << ": " << field << " at step " << i + 1 << ": " << x << " vs " << y;
      }
    }
    EXPECT_GT(a[0].at("grad_norm").get<double>(), 0.0) << name;
  };
  compare("frozen", "--steps 3 --inner-updates 2 --lr 0", 1e-6);
  compare("training", "--steps 3 --inner-updates 2 --lr 1e-3", 1e-3);
}

// Two tensor-parallel ranks (the rollout plan gets each parameter assembled whole) and one, at
// equal weights: the same rewards, and the gradient norm to 1e-6.
TEST_F(RlLoopTest, TwoTensorParallelRanksEqualOne) {
  const std::string flags = "--steps 2 --inner-updates 2 --lr 0 --metrics ";
  ToolResult one = runTool(byLength(flags + (dir / "one.jsonl")));
  ASSERT_EQ(one.exitCode, 0) << one.output;
  ToolResult two = runTool(byLength(flags + (dir / "two.jsonl") + " --nproc-per-node 2", data("grpo-tp2")));
  ASSERT_EQ(two.exitCode, 0) << two.output;
  const std::vector<nlohmann::json> a = metricsLines(dir / "one.jsonl"), b = metricsLines(dir / "two.jsonl");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].at("reward_mean"), b[i].at("reward_mean")) << "step " << i + 1;
    const double x = a[i].at("grad_norm").get<double>(), y = b[i].at("grad_norm").get<double>();
    EXPECT_LE(std::abs(x - y), 1e-6 * x) << "step " << i + 1 << ": " << x << " vs " << y;
  }
}

// A LoRA policy trains its adapters alone (the rollout plan, compiled with the same --lora, gets
// them every step); its checkpoint is a PEFT adapter directory, as a LoRA training run's.
TEST_F(RlLoopTest, ALoraPolicyTrainsItsAdapters) {
  const std::string command =
      rl("--reward-command 'python3 " + data("length.py") + "' --steps 2 --inner-updates 2 --lr 1e-2 --metrics " +
             (dir / "m.jsonl") + " --save-dir " + (dir / "lora"),
         data("grpo-lora"), data("infer-lora"));
  ToolResult run = runTool(command);
  ASSERT_EQ(run.exitCode, 0) << run.output;
  const std::vector<nlohmann::json> lines = metricsLines(dir / "m.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_GT(lines[0].at("kl_mean").get<double>(), 0.0) << lines[0].dump();
  for (const char* file : {"adapter_config.json", "adapter_model.safetensors"})
    EXPECT_TRUE(std::filesystem::is_regular_file(dir / ("lora/step-00000002/" + std::string(file)))) << file;
}

TEST_F(RlLoopTest, ARewardCommandScoresTheCompletions) {
  const std::string scorer = dir / "score.py";
  std::ofstream(scorer)
      << "import json, sys\n"
         "for line in sys.stdin:\n"
         "    row = json.loads(line)\n"
         "    print(json.dumps({'reward': float(row['completion'].strip() == str(row['reference']))}))\n";
  ToolResult run = runTool(rl("--steps 1 --reward-command 'python3 " + scorer + "' --metrics " + (dir / "m.jsonl")));
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_EQ(metricsLines(dir / "m.jsonl").size(), 1u);
}

TEST_F(RlLoopTest, AFailingRewardCommandEndsTheRunWithALocatedError) {
  struct Case {
    std::string command, expected;
  };
  for (const Case& c : std::vector<Case>{{"'echo boom >&2; exit 3'", "boom"},
                                         {"'sleep 30' --reward-timeout 1", "timeout"},
                                         {"'cat > /dev/null; echo garbage'", "garbage"}}) {
    ToolResult run = runTool(rl("--steps 1 --reward-command " + c.command));
    EXPECT_NE(run.exitCode, 0) << c.command << "\n" << run.output;
    EXPECT_TRUE(contains(run, c.expected)) << c.command << "\n" << run.output;
  }
}

TEST_F(RlLoopTest, AnSftPlanOrABadPromptIsRefused) {
  ToolResult sft = runTool(numeric("--steps 1", data("sft")));
  EXPECT_EQ(sft.exitCode, 2) << sft.output;
  EXPECT_TRUE(contains(sft, "expected a policy-loss training plan")) << sft.output;

  std::ofstream(dir / "bad.jsonl")
      << R"({"messages": [{"role": "user", "content": "What is 1 + 2?"}], "reference": "three"})"
      << "\n";
  ToolResult bad = runTool(std::string(DGEMMA_RUN) + " rl --plan " + data("grpo") + " --rollout-plan " + data("infer") +
                           " --weights " + data("start") + "/step-00000001 --tokenizer " + DGEMMA_SOURCE_DIR +
                           "/data/tokenizer --prompts " + (dir / "bad.jsonl") + " --reward numeric --steps 1");
  EXPECT_EQ(bad.exitCode, 2) << bad.output;
  EXPECT_TRUE(contains(bad, "bad.jsonl:1")) << bad.output;
}

}  // namespace
}  // namespace dgemma
