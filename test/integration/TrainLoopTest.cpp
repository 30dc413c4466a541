// `dgemma-run train` end to end on the tiny CPU model (models/diffusion_gemma/configs/tiny-cpu.json,
// micro-batch 2) and small text-only arithmetic splits tokenized by the bundled tokenizer: a resumed
// run continues bit-exactly, also after a kill -9; one batch is overfitted; gradient accumulation
// equals a larger micro-batch; the NaN guard aborts or skips; mock data trains; bad inputs exit 2
// naming the file.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <regex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "test/unit/train/ResealManifest.h"

namespace dgemma {
namespace {

using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

using testing::contains;

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<std::string> readLines(const std::string& path) {
  std::vector<std::string> lines;
  std::istringstream in(readFile(path));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The metrics lines of steps [first, last] without the wall-clock field, the one field a resumed
// run may change.
std::vector<std::string> stepLines(const std::string& metricsPath, int64_t first, int64_t last) {
  static const std::regex seconds(R"(, "seconds": [^,}]*)");
  std::vector<std::string> selected;
  for (const std::string& line : readLines(metricsPath)) {
    const int64_t step = nlohmann::json::parse(line).at("step").get<int64_t>();
    if (step >= first && step <= last) selected.push_back(std::regex_replace(line, seconds, ""));
  }
  return selected;
}

// "What is A + B?" -> "A+B" rows, a deterministic function of the row index.
void writeArithmeticRows(const std::string& path, int rows, int salt) {
  std::ofstream out(path);
  for (int i = 0; i < rows; ++i) {
    const int a = (37 * i + 11 * salt + 3) % 100, b = (53 * i + 7 * salt + 5) % 100;
    out << R"({"messages": [{"role": "user", "content": "What is )" << a << " + " << b << R"(?"}], "completion": ")" << a + b
        << "\"}\n";
  }
}

class TrainLoopTest : public ::testing::Test {
 protected:
  // One plan and data set per process (each test runs in its own under ctest).
  static void SetUpTestSuite() {
    root_ = new std::string((std::filesystem::temp_directory_path() / ("dgemma-train-loop-" + std::to_string(::getpid()))).string());
    std::filesystem::remove_all(*root_);
    std::filesystem::create_directories(*root_);
    writeArithmeticRows(*root_ + "/train.jsonl", 12, 0);
    writeArithmeticRows(*root_ + "/validation.jsonl", 6, 1);
    writeArithmeticRows(*root_ + "/test.jsonl", 4, 2);
    writeArithmeticRows(*root_ + "/one-batch.jsonl", 2, 3);
    ToolResult compiled = runTool(compileCommand(2, "") + " -o " + *root_ + "/plan");
    ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }

  static std::string compileCommand(int microBatch, const std::string& extra) {
    return std::string(DGEMMA_COMPILE) + " --model " + DGEMMA_SOURCE_DIR + "/models/diffusion_gemma/configs/tiny-cpu.json" +
           " --mode train --micro-batch " + std::to_string(microBatch) + " --prompt-len 32,48" + extra;
  }
  static std::string data(const std::string& name) { return *root_ + "/" + name; }

  // A run from --init random on the train split; `flags` adds the rest.
  static std::string train(const std::string& flags, const std::string& plan = data("plan")) {
    return std::string(DGEMMA_RUN) + " train --plan " + plan + " --init random --seed 7 --tokenizer " + DGEMMA_SOURCE_DIR +
           "/data/tokenizer --train " + data("train.jsonl") + " " + flags;
  }

  ScratchDirectory dir;
  static std::string* root_;
};

std::string* TrainLoopTest::root_ = nullptr;

// A 6-step run, and a 3-step run resumed in a fresh process to step 6, write the same lines for
// steps 4-6 (train, validation and test, timing aside) and the same final weights and moments.
TEST_F(TrainLoopTest, ResumeContinuesBitExactly) {
  const std::string common = "--validation " + data("validation.jsonl") + " --test " + data("test.jsonl") +
                             " --lr 1e-3 --warmup 2 --decay-steps 6 --eval-every 2";
  ToolResult whole = runTool(train(common + " --steps 6 --metrics " + (dir / "whole.jsonl") + " --save-dir " + (dir / "whole") +
                                   " --tensorboard " + (dir / "tb")));
  ASSERT_EQ(whole.exitCode, 0) << whole.output;
  // Off a terminal the progress line is whole lines: the first step and the last.
  EXPECT_TRUE(contains(whole, "step 1/6  loss ")) << whole.output;
  EXPECT_TRUE(contains(whole, "step 6/6  loss ")) << whole.output;
  EXPECT_TRUE(contains(whole, "saved checkpoint " + (dir / "whole/step-00000006"))) << whole.output;

  ToolResult first = runTool(train(common + " --steps 3 --metrics " + (dir / "split.jsonl") + " --save-dir " + (dir / "split")));
  ASSERT_EQ(first.exitCode, 0) << first.output;
  ToolResult resumed =
      runTool(train(common + " --steps 6 --metrics " + (dir / "split.jsonl") + " --save-dir " + (dir / "split") + " --resume"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed, "resumed from " + (dir / "split/step-00000003") + ": step 3, consumed samples 6")) << resumed.output;

  const std::vector<std::string> expected = stepLines(dir / "whole.jsonl", 4, 6);
  EXPECT_EQ(expected.size(), 6u);  // three train lines, validations at 4 and 6, the test at 6
  EXPECT_EQ(stepLines(dir / "split.jsonl", 4, 6), expected);
  for (const char* file : {"model-00001-of-00001.safetensors", "optimizer-00001-of-00001.safetensors"})
    EXPECT_TRUE(readFile(dir / "whole/step-00000006/" + file) == readFile(dir / "split/step-00000006/" + file)) << file;

  // A checkpoint's model group is a --weights directory (the optimizer starts afresh).
  ToolResult fromCheckpoint = runTool(std::string(DGEMMA_RUN) + " train --plan " + data("plan") + " --weights " +
                                      (dir / "whole/step-00000006") + " --tokenizer " + DGEMMA_SOURCE_DIR +
                                      "/data/tokenizer --train " + data("train.jsonl") + " --steps 1");
  EXPECT_EQ(fromCheckpoint.exitCode, 0) << fromCheckpoint.output;
}

// kill -9 once the metrics file shows step 4 (with a checkpoint every step), then --resume: the
// finished file equals an uninterrupted run's.
TEST_F(TrainLoopTest, ResumeAfterKillNineContinuesBitExactly) {
  // Four micro-batches a step keep the run going long enough to be caught mid-way.
  const std::string common = "--accumulation 4 --lr 1e-3 --steps 6 --save-every 1";
  ToolResult reference = runTool(train(common + " --metrics " + (dir / "reference.jsonl") + " --save-dir " + (dir / "reference")));
  ASSERT_EQ(reference.exitCode, 0) << reference.output;

  const std::string metrics = dir / "killed.jsonl";
  const std::string command = train(common + " --metrics " + metrics + " --save-dir " + (dir / "killed"));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + command + " > " + (dir / "killed.log") + " 2>&1").c_str(), nullptr);
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool sawStepFour = false;
  int status = 0;
  while (!sawStepFour && std::chrono::steady_clock::now() < deadline) {
    sawStepFour = readFile(metrics).find(R"({"step": 4, "split": "train")") != std::string::npos;
    if (!sawStepFour) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (::waitpid(child, &status, WNOHANG) == child) FAIL() << "the run ended before it was killed\n" << readFile(dir / "killed.log");
  }
  ::kill(child, SIGKILL);
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(sawStepFour) << readFile(dir / "killed.log");
  ASSERT_TRUE(WIFSIGNALED(status)) << "the run finished before the kill landed";
  std::vector<std::string> saved;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "killed")) saved.push_back(entry.path().filename().string());
  std::sort(saved.begin(), saved.end());
  std::cout << "[ kill -9 ] after " << readLines(metrics).size() << " metrics lines; in the save directory:";
  for (const std::string& name : saved) std::cout << " " << name;
  std::cout << "\n";

  ToolResult resumed = runTool(train(common + " --metrics " + metrics + " --save-dir " + (dir / "killed") + " --resume"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed, "resumed from ")) << resumed.output;
  EXPECT_EQ(stepLines(metrics, 1, 6), stepLines(dir / "reference.jsonl", 1, 6));
}

// One batch of two rows (the micro-batch, no accumulation), trained on again and again, is learned:
// the training loss falls from about 2 ln(256) to below 0.05 (the median of the last 10 steps; a
// single step's loss depends on the corruption it drew).
// 300 steps on one fixed batch drive the median of the last 10 losses below 0.05. At 200 steps the
// median sat near 0.05 and moved across it with the GEMMs' rounding (seeds 5-9: 0.017-0.045 fp32,
// 0.022-0.093 bf16); at 300 both plans are near 0.01 with seed 7.
void expectOverfitsOneBatch(const std::string& plan, const std::string& batch) {
  ToolResult run = runTool(std::string(DGEMMA_RUN) + " train --plan " + plan + " --init random --seed 7 --tokenizer " +
                           DGEMMA_SOURCE_DIR + "/data/tokenizer --train " + batch + " --steps 300 --lr 3e-3 --warmup 10 --log-every 1");
  ASSERT_EQ(run.exitCode, 0) << run.output;
  std::vector<double> losses;
  static const std::regex progress(R"(step +\d+/300  loss ([0-9.]+))");
  for (auto it = std::sregex_iterator(run.output.begin(), run.output.end(), progress); it != std::sregex_iterator(); ++it)
    losses.push_back(std::stod((*it)[1]));
  ASSERT_EQ(losses.size(), 300u) << run.output;
  EXPECT_GT(losses.front(), 10.0);
  std::vector<double> last(losses.end() - 10, losses.end());
  std::nth_element(last.begin(), last.begin() + 5, last.end());
  EXPECT_LT(last[5], 0.05) << run.output;
}

TEST_F(TrainLoopTest, OverfitsOneBatch) { expectOverfitsOneBatch(data("plan"), data("one-batch.jsonl")); }

// --train mock: synthetic smoke-test data, no file and no tokenizer. Every step writes its line with
// a finite loss, and the loss falls (the mean of the last 10 of 100 steps below 0.6 times that of
// the first 5; 0.48 measured): 64 items and four fixed answers are learnable.
// --canvas-tail eos_fill scores the EOS-filled positions after a last block's EOS, so the first
// step's decoder loss differs from the pad run's; a resume must repeat the choice.
TEST_F(TrainLoopTest, CanvasTailEosFillScoresTheTailAndIsPartOfTheTrajectory) {
  auto firstDiffusionLoss = [&](const std::string& tail) {
    const std::string metrics = dir / ("metrics-" + tail + ".jsonl");
    ToolResult run = runTool(train("--steps 1 --decay-steps 2 --canvas-tail " + tail + " --metrics " + metrics +
                                   " --save-dir " + (dir / tail)));
    EXPECT_EQ(run.exitCode, 0) << run.output;
    return nlohmann::json::parse(readLines(metrics).at(0)).at("diffusion_loss").get<double>();
  };
  const double padLoss = firstDiffusionLoss("pad");
  const double eosFillLoss = firstDiffusionLoss("eos_fill");
  EXPECT_TRUE(std::isfinite(padLoss) && std::isfinite(eosFillLoss));
  EXPECT_NE(padLoss, eosFillLoss);

  ToolResult switched = runTool(train("--steps 2 --decay-steps 2 --canvas-tail pad --save-dir " + (dir / "eos_fill") + " --resume"));
  EXPECT_EQ(switched.exitCode, 2);
  EXPECT_TRUE(contains(switched, "config.trajectory.canvas_tail")) << switched.output;

  ToolResult unknown = runTool(train("--steps 1 --canvas-tail zeros"));
  EXPECT_EQ(unknown.exitCode, 2);
  EXPECT_TRUE(contains(unknown, "--canvas-tail")) << unknown.output;
}

TEST_F(TrainLoopTest, MockDataTrains) {
  ToolResult run = runTool(std::string(DGEMMA_RUN) + " train --plan " + data("plan") +
                           " --init random --seed 7 --train mock --steps 100 --lr 3e-3 --warmup 10 --metrics " + (dir / "mock.jsonl"));
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_TRUE(contains(run, "--train mock: 64 synthetic items (smoke-test data, not evidence of quality)")) << run.output;
  const std::vector<std::string> lines = readLines(dir / "mock.jsonl");
  ASSERT_EQ(lines.size(), 100u);
  std::vector<double> losses;
  for (const std::string& line : lines) {
    const double loss = nlohmann::json::parse(line).at("loss").get<double>();
    EXPECT_TRUE(std::isfinite(loss)) << line;
    losses.push_back(loss);
  }
  auto meanOf = [](auto first, auto last) { return std::accumulate(first, last, 0.0) / static_cast<double>(last - first); };
  const double start = meanOf(losses.begin(), losses.begin() + 5), end = meanOf(losses.end() - 10, losses.end());
  EXPECT_LT(end, 0.6 * start) << run.output;

  ToolResult withValidation = runTool(std::string(DGEMMA_RUN) + " train --plan " + data("plan") +
                                      " --init random --train mock --validation " + data("validation.jsonl") + " --steps 1");
  EXPECT_EQ(withValidation.exitCode, 2);
  EXPECT_TRUE(contains(withValidation, "--train mock: smoke-test data has no --validation or --test split")) << withValidation.output;
}

// bf16 mixed precision (docs/training.md, "Mixed precision"): the f32 masters and moments carry small updates that bf16
// weights could not hold, so the bf16 plan overfits too; a resumed bf16 run continues bit-exactly.
TEST_F(TrainLoopTest, Bf16PlanOverfitsAndResumesBitExactly) {
  ToolResult compiled = runTool(compileCommand(2, " --precision bf16 -o " + (dir / "plan-bf16")));
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  expectOverfitsOneBatch(dir / "plan-bf16", data("one-batch.jsonl"));

  const std::string common = " --lr 1e-3 --warmup 2 --decay-steps 4";
  ToolResult whole = runTool(train(common + " --steps 4 --metrics " + (dir / "whole.jsonl") + " --save-dir " + (dir / "whole"),
                                   dir / "plan-bf16"));
  ASSERT_EQ(whole.exitCode, 0) << whole.output;
  ToolResult first = runTool(train(common + " --steps 2 --metrics " + (dir / "split.jsonl") + " --save-dir " + (dir / "split"),
                                   dir / "plan-bf16"));
  ASSERT_EQ(first.exitCode, 0) << first.output;
  ToolResult resumed = runTool(train(common + " --steps 4 --metrics " + (dir / "split.jsonl") + " --save-dir " + (dir / "split") +
                                         " --resume",
                                     dir / "plan-bf16"));
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_EQ(stepLines(dir / "split.jsonl", 3, 4), stepLines(dir / "whole.jsonl", 3, 4));
  for (const char* file : {"model-00001-of-00001.safetensors", "optimizer-00001-of-00001.safetensors"})
    EXPECT_TRUE(readFile(dir / "whole/step-00000004/" + file) == readFile(dir / "split/step-00000004/" + file)) << file;
}

// Two micro-batches of 2 accumulated are one micro-batch of 4: the same samples, the same noise
// (keys per sample), the same per-example mean (no encoder loss, whose token mean is per micro-batch).
TEST_F(TrainLoopTest, AccumulationEqualsALargerMicroBatch) {
  for (int microBatch : {2, 4}) {
    ToolResult compiled = runTool(compileCommand(microBatch, " --encoder-loss-weight 0 -o " + (dir / "plan" + std::to_string(microBatch))));
    ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  }
  ToolResult accumulated = runTool(train("--steps 3 --lr 1e-3 --accumulation 2 --metrics " + (dir / "accumulated.jsonl"), dir / "plan2"));
  ASSERT_EQ(accumulated.exitCode, 0) << accumulated.output;
  ToolResult single = runTool(train("--steps 3 --lr 1e-3 --metrics " + (dir / "single.jsonl"), dir / "plan4"));
  ASSERT_EQ(single.exitCode, 0) << single.output;
  const std::vector<std::string> a = readLines(dir / "accumulated.jsonl"), b = readLines(dir / "single.jsonl");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) {
    const nlohmann::json x = nlohmann::json::parse(a[i]), y = nlohmann::json::parse(b[i]);
    EXPECT_EQ(x["consumed_samples"], y["consumed_samples"]);
    EXPECT_EQ(x["tokens"], y["tokens"]);
    EXPECT_EQ(x["lr"], y["lr"]);
    EXPECT_TRUE(x["encoder_loss"].is_null());
    for (const char* field : {"loss", "grad_norm"})
      EXPECT_NEAR(x[field].get<double>(), y[field].get<double>(), 1e-5 * std::abs(y[field].get<double>()))
          << "step " << i + 1 << " " << field;
  }
}

// A rate of 1e30 ruins the weights in one update, so step 2's gradients are NaN: by default the run
// stops there (exit 1, naming the step and the tensor, its line written); with --nan-policy skip
// every such step is logged as skipped and the run goes on.
TEST_F(TrainLoopTest, NanGuardAbortsOrSkips) {
  ToolResult aborted = runTool(train("--steps 3 --lr 1e30 --metrics " + (dir / "abort.jsonl")));
  EXPECT_EQ(aborted.exitCode, 1) << aborted.output;
  EXPECT_TRUE(contains(aborted, "error: step 2: gradient grad/")) << aborted.output;
  ASSERT_EQ(readLines(dir / "abort.jsonl").size(), 2u);
  EXPECT_NE(readLines(dir / "abort.jsonl")[1].find(R"("grad_norm": null, "consumed_samples": 4, "tokens": )"), std::string::npos);

  ToolResult skipped = runTool(train("--steps 3 --lr 1e30 --nan-policy skip --metrics " + (dir / "skip.jsonl")));
  ASSERT_EQ(skipped.exitCode, 0) << skipped.output;
  EXPECT_TRUE(contains(skipped, "step 2 skipped, no update: gradient grad/")) << skipped.output;
  EXPECT_TRUE(contains(skipped, "2 steps skipped")) << skipped.output;
  const std::vector<std::string> lines = readLines(dir / "skip.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_FALSE(nlohmann::json::parse(lines[0]).contains("skipped"));
  for (size_t i = 1; i < 3; ++i) {
    const nlohmann::json line = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(line["skipped"], true) << lines[i];
    // A skipped step does not advance the schedule: step 3 applies (would apply) step 2's rate.
    EXPECT_EQ(line["lr"], nlohmann::json::parse(lines[1])["lr"]);
  }
}

// A plan compiled with --preset carries run defaults; explicit flags win, and an explicit --steps
// keeps the decay to itself rather than the preset's --decay-steps.
TEST_F(TrainLoopTest, PresetRunDefaultsFillUnsetFlags) {
  ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + DGEMMA_SOURCE_DIR +
                                "/models/diffusion_gemma/configs/tiny-cpu.json --mode train --preset tiny-cpu -o " + (dir / "plan"));
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  ToolResult run = runTool(train("--steps 2 --warmup 1 --metrics " + (dir / "metrics.jsonl"), dir / "plan"));
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_TRUE(contains(run, "defaults of the plan's preset tiny-cpu: --accumulation 1 --eval-batches 4 --eval-every 10 --lr 0.001 "
                            "--min-lr 0.0001\n"))
      << run.output;
  EXPECT_TRUE(contains(run, "lr cosine 0.001 -> 0.0001, warmup 1, decay 2 steps")) << run.output;
  const std::vector<std::string> lines = readLines(dir / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(lines[1])["lr"], 0.001);  // lr(1) = the peak after one warmup step
}

// Bad input exits 2 with a message naming the file: a missing split, nothing to resume from, a
// damaged checkpoint, and a resume that would not continue the same run.
TEST_F(TrainLoopTest, BadInputExitsTwoNamingTheFile) {
  ToolResult missing = runTool(std::string(DGEMMA_RUN) + " train --plan " + data("plan") + " --init random --tokenizer " +
                               DGEMMA_SOURCE_DIR + "/data/tokenizer --train " + (dir / "nowhere.jsonl") + " --steps 1");
  EXPECT_EQ(missing.exitCode, 2);
  EXPECT_TRUE(contains(missing, "--train: " + (dir / "nowhere.jsonl") + ": cannot open")) << missing.output;

  // An encoder context longer than the largest prompt bucket (48) fits no train_step.
  std::ofstream(dir / "long.jsonl") << R"({"messages": [{"role": "user", "content": ")" << std::string(60, 'x') << R"("}], "completion": "1"})"
                                    << "\n";
  ToolResult tooLong = runTool(std::string(DGEMMA_RUN) + " train --plan " + data("plan") + " --init random --tokenizer " +
                               DGEMMA_SOURCE_DIR + "/data/tokenizer --train " + (dir / "long.jsonl") + " --steps 1");
  EXPECT_EQ(tooLong.exitCode, 2);
  EXPECT_TRUE(contains(tooLong, (dir / "long.jsonl") + ":1: completion: block 0 needs an encoder context of ")) << tooLong.output;
  EXPECT_TRUE(contains(tooLong, "more than max_encoder_length 48")) << tooLong.output;

  ToolResult nothing = runTool(train("--steps 2 --save-dir " + (dir / "empty") + " --resume"));
  EXPECT_EQ(nothing.exitCode, 2);
  EXPECT_TRUE(contains(nothing, "--resume: " + (dir / "empty") + ": no complete checkpoint")) << nothing.output;

  // --decay-steps 2: the schedule of the 2-step runs below, which a resumed run must repeat.
  ASSERT_EQ(runTool(train("--steps 1 --decay-steps 2 --save-dir " + (dir / "saved"))).exitCode, 0);
  std::string withOtherSeed = train("--steps 2 --save-dir " + (dir / "saved") + " --resume");
  withOtherSeed.replace(withOtherSeed.find("--seed 7"), 8, "--seed 8");
  ToolResult otherSeed = runTool(withOtherSeed);
  EXPECT_EQ(otherSeed.exitCode, 2);
  EXPECT_TRUE(contains(otherSeed, "step-00000001/manifest.json: config.trajectory.seed: the checkpoint's run used 7, this run 8"))
      << otherSeed.output;
  // A changed schedule is named by its field and both values, not as "an object with 6 keys".
  ToolResult otherDecay = runTool(train("--steps 3 --save-dir " + (dir / "saved") + " --resume"));
  EXPECT_EQ(otherDecay.exitCode, 2);
  EXPECT_TRUE(contains(otherDecay, "step-00000001/manifest.json: config.trajectory.lr_schedule.decay_steps: the checkpoint's "
                                   "run used 2, this run 3"))
      << otherDecay.output;

  const std::string shard = dir / "saved/step-00000001/model-00001-of-00001.safetensors";
  std::string bytes = readFile(shard);
  bytes[bytes.size() / 2] ^= 1;
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  ToolResult corrupted = runTool(train("--steps 2 --save-dir " + (dir / "saved") + " --resume"));
  EXPECT_EQ(corrupted.exitCode, 2);
  EXPECT_TRUE(contains(corrupted, shard + ": xxh3_64: ")) << corrupted.output;
}

void writeText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary | std::ios::trunc) << text; }

// An edited manifest is refused before anything is restored: without its checksum redone, naming
// the checksum; with it redone (a crafted manifest), naming the field that disagrees with what the
// resume recomputes. A crafted count of 2^62 samples is refused within seconds, not replayed.
TEST_F(TrainLoopTest, EditedManifestIsRefused) {
  ASSERT_EQ(runTool(train("--steps 2 --decay-steps 4 --save-dir " + (dir / "saved"))).exitCode, 0);
  const std::string checkpoint = dir / "saved/step-00000002";
  const std::string manifestPath = checkpoint + "/manifest.json";
  const std::string originalText = readFile(manifestPath);
  const nlohmann::json original = nlohmann::json::parse(originalText);
  const std::string resume = train("--steps 4 --decay-steps 4 --save-dir " + (dir / "saved") + " --resume");
  auto expectRefused = [&](const std::string& text, const std::string& message) {
    writeText(manifestPath, text);
    ToolResult refused = runTool(resume);
    EXPECT_EQ(refused.exitCode, 2) << refused.output;
    EXPECT_TRUE(contains(refused, message)) << refused.output;
    EXPECT_TRUE(contains(refused, "--resume: " + checkpoint + " is the newest checkpoint in " + (dir / "saved"))) << refused.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "saved/step-00000003"));
  };
  for (int64_t consumed : {0, 9, 1400}) {
    nlohmann::json edited = original;
    edited["consumed_samples"] = consumed;
    expectRefused(edited.dump(2), manifestPath + ": manifest_xxh3_64: the checksum does not match");
    expectRefused(test::resealedManifestText(edited),
                  manifestPath + ": consumed_samples: " + std::to_string(consumed) + ", but step 2 x global batch 2 = 4");
  }
  nlohmann::json edited = original;
  edited["rng"]["seed"] = 8;
  expectRefused(test::resealedManifestText(edited), manifestPath + ": rng.seed: the checkpoint records 8, the restore recomputes 7");
  edited = original;
  edited["data_order_state"]["position"] = 3;
  expectRefused(test::resealedManifestText(edited),
                manifestPath + ": data_order_state.position: the checkpoint records 3, the restore recomputes 4");
  edited = original;
  edited["config"]["trajectory"] = 5;  // the trainer's own member, of the wrong type
  expectRefused(test::resealedManifestText(edited),
                manifestPath + ": config.trajectory.accumulation: the checkpoint's run used null, this run 1");
  edited = original;
  edited["consumed_samples"] = int64_t{1} << 62;
  expectRefused(test::resealedManifestText(edited), manifestPath + ": consumed_samples: 4611686018427387904, but step 2 x global batch 2 = 4");
  expectRefused("{\"step\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
                manifestPath + ": JSON nested deeper than 64 levels");

  // Consistent in every field, 2^62 samples in: the token recount walks one epoch, not 2^62 samples.
  std::filesystem::copy(checkpoint, dir / "crafted");
  edited = original;
  const int64_t samples = int64_t{1} << 62, items = original["data_order_state"]["items"].get<int64_t>();
  edited["step"] = samples / 2;
  edited["consumed_samples"] = samples;
  edited["data_order_state"]["epoch"] = samples / items;
  edited["data_order_state"]["position"] = samples % items;
  writeText(dir / "crafted/manifest.json", test::resealedManifestText(edited));
  const auto started = std::chrono::steady_clock::now();
  ToolResult crafted = runTool(train("--steps 4 --decay-steps 4 --resume-from " + (dir / "crafted")));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(crafted.exitCode, 2) << crafted.output;
  EXPECT_TRUE(contains(crafted, "--steps 4: the checkpoint is at step 2305843009213693952 already")) << crafted.output;
  EXPECT_LT(seconds, 10.0);

  writeText(manifestPath, originalText);
  ToolResult resumed = runTool(resume);
  EXPECT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed, "resumed from " + checkpoint + ": step 2, consumed samples 4")) << resumed.output;
}

// A deleted, truncated, invalid or step-edited newest manifest stops --resume naming that
// checkpoint, leaves it as it is, and says how to choose the older one; --resume-from DIR does.
TEST_F(TrainLoopTest, DamagedNewestCheckpointIsAnErrorNotAFallback) {
  ASSERT_EQ(runTool(train("--steps 2 --decay-steps 3 --save-every 1 --save-dir " + (dir / "saved"))).exitCode, 0);
  const std::string newest = dir / "saved/step-00000002", older = dir / "saved/step-00000001";
  const std::string manifestPath = newest + "/manifest.json";
  const std::string originalText = readFile(manifestPath);
  nlohmann::json stepEdited = nlohmann::json::parse(originalText);
  stepEdited["step"] = 1;
  const std::vector<std::pair<std::string, std::string>> damages = {
      {"", manifestPath + ": missing: not a complete checkpoint"},
      {originalText.substr(0, originalText.size() / 2), manifestPath + ": invalid JSON at byte "},
      {"not a manifest", manifestPath + ": invalid JSON"},
      {stepEdited.dump(2), manifestPath + ": manifest_xxh3_64: the checksum does not match"},
      {test::resealedManifestText(stepEdited), manifestPath + ": step: 1, but the directory is step-00000002"},
  };
  for (const auto& [text, message] : damages) {
    if (text.empty())
      std::filesystem::remove(manifestPath);
    else
      writeText(manifestPath, text);
    ToolResult refused = runTool(train("--steps 3 --decay-steps 3 --save-dir " + (dir / "saved") + " --resume"));
    EXPECT_EQ(refused.exitCode, 2) << refused.output;
    EXPECT_TRUE(contains(refused, message)) << refused.output;
    EXPECT_TRUE(contains(refused, "--resume: " + newest + " is the newest checkpoint in " + (dir / "saved") +
                                      "; --resume does not fall back to an older one: to continue from the newest complete "
                                      "one before it, run with --resume-from " + older + " instead of --resume"))
        << refused.output;
    // Nothing was trained or saved: the damaged checkpoint is as it was.
    EXPECT_FALSE(contains(refused, "resumed from")) << refused.output;
    EXPECT_EQ(std::filesystem::exists(manifestPath) ? readFile(manifestPath) : "", text);
    EXPECT_FALSE(std::filesystem::exists(dir / "saved/step-00000003"));
  }
  ToolResult both = runTool(train("--steps 3 --save-dir " + (dir / "saved") + " --resume --resume-from " + older));
  EXPECT_EQ(both.exitCode, 2) << both.output;
  EXPECT_TRUE(contains(both, "--resume-from: give it instead of --resume, not with it")) << both.output;

  ToolResult chosen =
      runTool(train("--steps 3 --decay-steps 3 --save-every 1 --save-dir " + (dir / "saved") + " --resume-from " + older));
  EXPECT_EQ(chosen.exitCode, 0) << chosen.output;
  EXPECT_TRUE(contains(chosen, "resumed from " + older + ": step 1, consumed samples 2")) << chosen.output;
  // The user's choice trains step 2 again, replacing the damaged directory with a complete one.
  EXPECT_TRUE(std::filesystem::exists(dir / "saved/step-00000003/manifest.json"));
  EXPECT_EQ(nlohmann::json::parse(readFile(manifestPath)).at("step"), 2);
}

}  // namespace
}  // namespace dgemma
