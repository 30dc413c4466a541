// Every parallel layout computes what one rank computes (docs/parallelism.md): per-rank plans from
// dgemma-compile --tp/--dp/--ep/--sp, run by dgemma-run --nproc-per-node on Gloo ranks, against the
// one-rank plan of the same global batch.
//   - grad: the loss terms and every gathered gradient, on an HF fixture whose prompts cross the
//     sliding window, with self-conditioning and the encoder loss on;
//   - train: three optimizer steps (the distributed optimizer under DP) give the same losses and
//     gradient norms; the updated parameters, resumed on one rank, give the same fourth step;
//   - a run resumed in its own layout continues bit-exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "TrainingOutputs.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

using testing::expectSameLosses;
using testing::metricsLines;
using testing::relativeDistance;
using testing::runTool;
using testing::ScratchDirectory;
using testing::splitRecords;
using testing::ToolResult;

struct Layout {
  std::string name;
  std::string flags;  // dgemma-compile's layout flags
  int64_t ranks;
  int64_t dataParallel;
};

std::ostream& operator<<(std::ostream& out, const Layout& layout) { return out << layout.name; }

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", "--tp 2", 2, 1},
      {"tp2_sp", "--tp 2 --sp", 2, 1},
      {"dp2_zero1", "--dp 2", 2, 2},
      {"dp2_ep2", "--dp 2 --ep 2", 2, 2},
      {"tp2_dp2_ep2_sp", "--tp 2 --dp 2 --ep 2 --sp", 4, 2},
      // 4 query heads and 2 KV heads per layer: each KV head on 2 of the 4 ranks
      // (docs/parallelism.md, "Tensor parallelism beyond the KV heads").
      {"tp4", "--tp 4", 4, 1},
      {"tp4_sp", "--tp 4 --sp", 4, 1},
      {"tp4_dp2_sp", "--tp 4 --dp 2 --sp", 8, 2},
  };
  return all;
}

std::string source(const std::string& path) { return std::string(DGEMMA_SOURCE_DIR) + "/" + path; }

// The losses to 1e-6; the gradient norm, a square root of a sum over every gradient element that the
// ranks add up in another order, to 1e-5.
// The gradient fixture's full-attention layers have one KV head and its sliding layers two: at TP 2
// the full layers' KV head is on both ranks, at TP 4 on all four and each sliding KV head on two
// (docs/parallelism.md, "Tensor parallelism beyond the KV heads").
const std::vector<Layout>& gradientLayouts() {
  // EP < DP needs the fixture's 4 prompts (the training layouts' global batch is 2): the experts'
  // tokens stay split over dp and are gathered over ep (the default exchange), or move by the
  // all-to-all over ep.
  static const std::vector<Layout> all = {layouts()[2],
                                          layouts()[3],
                                          {"dp4_ep2", "--dp 4 --ep 2", 4, 4},
                                          {"dp4_ep2_all_to_all", "--dp 4 --ep 2 --expert-exchange all-to-all", 4, 4},
                                          {"dp2_ep2_all_to_all", "--dp 2 --ep 2 --expert-exchange all-to-all", 2, 2},
                                          layouts()[0],
                                          layouts()[1],
                                          {"tp4", "--tp 4", 4, 1},
                                          {"tp4_sp", "--tp 4 --sp", 4, 1}};
  return all;
}

class ShardedParity : public ::testing::TestWithParam<Layout> {
 protected:
  std::string compile(const std::string& model, const std::string& flags, const std::string& out) {
    ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + model + " --mode train " + flags + " -o " + out);
    EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
    return out;
  }
  std::string run(const std::string& command, int64_t ranks) {
    ToolResult ran = runTool(std::string(DGEMMA_RUN) + " " + command + " --nproc-per-node " + std::to_string(ranks));
    EXPECT_EQ(ran.exitCode, 0) << ran.output;
    return ran.output;
  }
  ScratchDirectory dir;
};

class ShardedGradients : public ShardedParity {};

// The fixture's batch of 4 prompts (11 tokens, window 4), in a 12-token bucket.
TEST_P(ShardedGradients, EqualOneRank) {
  const Layout& layout = GetParam();
  const std::string model = source("test/fixtures/diffusion_gemma/seven_layers");
  const std::string batch = source("test/fixtures/diffusion_gemma_train/seven_layers/batch.safetensors");
  const std::string objective = " --self-cond-prob 1 --encoder-loss-weight 1 --prompt-len 12";
  compile(model, objective + " --micro-batch 4", dir / "one");
  compile(model, objective + " --micro-batch " + std::to_string(4 / layout.dataParallel) + " " + layout.flags, dir / "sharded");
  const std::string grad = " --weights " + model + "/model.safetensors --input " + batch;
  run("grad --plan " + (dir / "one") + grad + " --out " + (dir / "one.safetensors"), 1);
  run("grad --plan " + (dir / "sharded") + grad + " --out " + (dir / "sharded.safetensors"), layout.ranks);
  if (HasFailure()) return;

  SafetensorsFile want = SafetensorsFile::open(dir / "one.safetensors");
  SafetensorsFile got = SafetensorsFile::open(dir / "sharded.safetensors");
  int64_t compared = 0;
  for (const SafetensorsEntry& entry : want.entries()) {
    const std::string& name = entry.name;
    ASSERT_TRUE(got.find(name)) << name << ": missing from the sharded run's output";
    HostTensor a = got.read(name), b = want.read(name);
    ASSERT_EQ(a.shape, b.shape) << name;
    // fp32 sums in another order through seven layers and their backward: ~3e-6 measured. A
    // router's per_expert_scale gradient is worse conditioned: each of its 8 entries sums terms of
    // both signs over every route, so a few entries are small beside their terms (measured 4.5e-6
    // between 1 and 2 threads of one plan, 1.15e-5 between dp2_ep2 and one rank).
    // The loss terms are single sums, to 1e-6.
    const bool lossTerm = name == "loss" || name == "diffusion_loss" || name == "encoder_loss";
    const double tolerance = lossTerm ? 1e-6 : name.find("router.per_expert_scale") != std::string::npos ? 3e-5 : 1e-5;
    EXPECT_LE(relativeDistance(a, b), tolerance) << name;
    ++compared;
  }
  EXPECT_GT(compared, 50);  // the loss terms and every trainable parameter's gradient
}

// Three steps from the same random init on mock data: the same losses and norms as one rank; the
// parameters and moments they end with, resumed on one rank, give one rank's fourth step.
TEST_P(ShardedParity, TrainingAndCrossLayoutResumeEqualOneRank) {
  const Layout& layout = GetParam();
  const std::string model = source("models/diffusion_gemma/configs/tiny-cpu.json");
  compile(model, "--preset tiny-cpu --micro-batch 2", dir / "one");
  compile(model, "--preset tiny-cpu --micro-batch " + std::to_string(2 / layout.dataParallel) + " " + layout.flags,
          dir / "sharded");
  const std::string train = " --train mock --init random --seed 5 --warmup 1 --decay-steps 4 --eval-every 0 --save-every 3";
  run("train --plan " + (dir / "one") + train + " --steps 4 --metrics " + (dir / "one.jsonl") + " --save-dir " +
          (dir / "one-ckpt"),
      1);
  run("train --plan " + (dir / "sharded") + train + " --steps 3 --metrics " + (dir / "sharded.jsonl") + " --save-dir " +
          (dir / "sharded-ckpt"),
      layout.ranks);
  // The sharded checkpoint continues on one rank.
  run("train --plan " + (dir / "one") + train + " --steps 4 --resume --metrics " + (dir / "sharded.jsonl") + " --save-dir " +
          (dir / "sharded-ckpt"),
      1);
  if (HasFailure()) return;
  std::vector<nlohmann::json> want = splitRecords(dir / "one.jsonl"), got = splitRecords(dir / "sharded.jsonl");
  ASSERT_EQ(want.size(), 4u);
  ASSERT_EQ(got.size(), 4u);
  for (size_t step = 0; step < want.size(); ++step) expectSameLosses(got[step], want[step]);
}

// Adapters shard with the weights they sit on (docs/training.md, "LoRA adapters"): three steps of
// adapters on attention, the dense MLP and the router over a frozen random model give one rank's
// losses and gradient norms.
TEST_P(ShardedParity, AdapterTrainingEqualsOneRank) {
  const Layout& layout = GetParam();
  const std::string model = source("models/diffusion_gemma/configs/tiny-cpu.json");
  const std::string adapters = " --lora 4:8 --lora-targets attention,mlp,router";
  compile(model, "--preset tiny-cpu --micro-batch 2" + adapters, dir / "one");
  compile(model,
          "--preset tiny-cpu --micro-batch " + std::to_string(2 / layout.dataParallel) + " " + layout.flags + adapters,
          dir / "sharded");
  const std::string train = " --train mock --init random --seed 7 --warmup 1 --decay-steps 3 --eval-every 0 --steps 3";
  run("train --plan " + (dir / "one") + train + " --metrics " + (dir / "one.jsonl"), 1);
  run("train --plan " + (dir / "sharded") + train + " --metrics " + (dir / "sharded.jsonl"), layout.ranks);
  if (HasFailure()) return;
  std::vector<nlohmann::json> want = splitRecords(dir / "one.jsonl"), got = splitRecords(dir / "sharded.jsonl");
  ASSERT_EQ(want.size(), 3u);
  ASSERT_EQ(got.size(), 3u);
  for (size_t step = 0; step < want.size(); ++step) expectSameLosses(got[step], want[step]);
}

// Two steps, a checkpoint, and two more in a fresh set of processes write the same lines as four
// steps at once.
TEST_P(ShardedParity, ResumeInTheSameLayoutIsBitExact) {
  const Layout& layout = GetParam();
  const std::string model = source("models/diffusion_gemma/configs/tiny-cpu.json");
  compile(model, "--preset tiny-cpu --micro-batch " + std::to_string(2 / layout.dataParallel) + " " + layout.flags,
          dir / "sharded");
  const std::string train = " --plan " + (dir / "sharded") +
                            " --train mock --init random --seed 9 --warmup 1 --decay-steps 4 --eval-every 0 --save-every 2";
  run("train" + train + " --steps 4 --metrics " + (dir / "whole.jsonl") + " --save-dir " + (dir / "whole"), layout.ranks);
  run("train" + train + " --steps 2 --metrics " + (dir / "split.jsonl") + " --save-dir " + (dir / "split"), layout.ranks);
  run("train" + train + " --steps 4 --resume --metrics " + (dir / "split.jsonl") + " --save-dir " + (dir / "split"),
      layout.ranks);
  if (HasFailure()) return;
  EXPECT_EQ(metricsLines(dir / "split.jsonl"), metricsLines(dir / "whole.jsonl"));
}

// TP 8 over 8 query heads and 2 KV heads per layer (tiny-cpu with num_attention_heads 8): each KV
// head on 4 ranks, the tensor group `tp` (2) x `tp1` (4) (docs/parallelism.md, "Tensor parallelism
// beyond the KV heads"). Three steps give one rank's losses and gradient norms.
class TensorParallelBeyondKvHeads : public ShardedParity {};

TEST_F(TensorParallelBeyondKvHeads, EightQueryHeadsAtTensorParallelEightEqualOneRank) {
  nlohmann::json config = nlohmann::json::parse(std::ifstream(source("models/diffusion_gemma/configs/tiny-cpu.json")));
  config["text_config"]["num_attention_heads"] = 8;
  const std::string model = dir / "tiny-8q.json";
  std::ofstream(model) << config.dump(2);
  compile(model, "--preset tiny-cpu --micro-batch 2", dir / "one");
  compile(model, "--preset tiny-cpu --micro-batch 2 --tp 8 --sp", dir / "tp8");
  const std::string train = " --train mock --init random --seed 5 --warmup 1 --decay-steps 4 --eval-every 0 --steps 3";
  run("train --plan " + (dir / "one") + train + " --metrics " + (dir / "one.jsonl"), 1);
  run("train --plan " + (dir / "tp8") + train + " --metrics " + (dir / "tp8.jsonl"), 8);
  if (HasFailure()) return;
  std::vector<nlohmann::json> want = splitRecords(dir / "one.jsonl"), got = splitRecords(dir / "tp8.jsonl");
  ASSERT_EQ(want.size(), 3u);
  ASSERT_EQ(got.size(), 3u);
  for (size_t step = 0; step < want.size(); ++step) expectSameLosses(got[step], want[step]);
}

// An image batch (the vision fixture: 4 q heads, 2 KV heads, one image per example) at TP 4 with SP:
// the loss terms (1e-6) and every gathered gradient, the vision tower's included (1e-5), as one rank.
TEST_F(TensorParallelBeyondKvHeads, ImageGradientsAtTensorParallelFourEqualOneRank) {
  const std::string model = source("test/fixtures/diffusion_gemma_vision/train_one_image");
  const std::string objective =
      " --micro-batch 2 --prompt-len 72 --images-per-example 1 --self-cond-prob 1 --encoder-loss-weight 1";
  compile(model, objective, dir / "one");
  compile(model, objective + " --tp 4 --sp", dir / "tp4");
  const std::string grad = " --weights " + model + "/model.safetensors --input " + model + "/batch.safetensors";
  run("grad --plan " + (dir / "one") + grad + " --out " + (dir / "one.safetensors"), 1);
  run("grad --plan " + (dir / "tp4") + grad + " --out " + (dir / "tp4.safetensors"), 4);
  if (HasFailure()) return;
  SafetensorsFile want = SafetensorsFile::open(dir / "one.safetensors");
  SafetensorsFile got = SafetensorsFile::open(dir / "tp4.safetensors");
  int64_t vision = 0;
  for (const SafetensorsEntry& entry : want.entries()) {
    const std::string& name = entry.name;
    ASSERT_TRUE(got.find(name)) << name << ": missing from the TP 4 run's output";
    const bool lossTerm = name == "loss" || name == "diffusion_loss" || name == "encoder_loss";
    EXPECT_LE(relativeDistance(got.read(name), want.read(name)), lossTerm ? 1e-6 : 1e-5) << name;
    vision += name.find("vision") != std::string::npos;
  }
  EXPECT_GT(vision, 0);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardedGradients, ::testing::ValuesIn(gradientLayouts()),
                         [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Layouts, ShardedParity, ::testing::ValuesIn(layouts()),
                         [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

}  // namespace
}  // namespace dgemma
