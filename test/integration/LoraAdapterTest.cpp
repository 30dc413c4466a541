// LoRA adapters through the tools (docs/training.md, "LoRA adapters"), on the tiny HF fixture as the
// frozen base:
//   - `dgemma-run train` of an adapter plan saves checkpoints that hold the adapters (plan names and
//     PEFT's adapter directory, the same values) and none of the base;
//   - `forward --adapter STEP_DIR` runs them over the base, and `export --merge-adapter` writes the
//     merged model whose forward gives the same logits;
//   - a resumed adapter run is bit-exact, and refuses another base;
//   - an adapter that disagrees with the plan, or a plan without adapters, is refused naming it;
//   - under --tp 2 the PEFT files hold the whole adapters, those of the one-rank run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

const std::string kFixture = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/hf_tester";
const std::string kBase = kFixture + "/model.safetensors";
const std::string kLora = " --lora 2:4 --lora-targets attention,mlp,router";
// Two steps at a learning rate that moves the adapters visibly; the decay is fixed so that a run of
// one step continues into the same schedule.
const std::string kTrain = " --train mock --seed 5 --lr 0.01 --warmup 0 --decay-steps 2 --eval-every 0";

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class LoraAdapterTest : public ::testing::Test {
 protected:
  void compile(const std::string& flags, const std::string& out) {
    ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + kFixture + " " + flags + " -o " + out);
    ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  }
  ToolResult run(const std::string& command, int64_t ranks = 1) {
    return runTool(std::string(DGEMMA_RUN) + " " + command +
                   (ranks > 1 ? " --nproc-per-node " + std::to_string(ranks) : ""));
  }
  void expectRun(const std::string& command, int64_t ranks = 1) {
    ToolResult ran = run(command, ranks);
    EXPECT_EQ(ran.exitCode, 0) << command << "\n" << ran.output;
  }
  // The fixture's batch through `plan`'s forward entry: its logits.
  HostTensor forwardLogits(const std::string& plan, const std::string& weights, const std::string& extra,
                           const std::string& name) {
    const std::string out = dir / (name + ".safetensors");
    expectRun("forward --plan " + plan + " --weights " + weights + extra + " --input " + kFixture +
              "/batch.safetensors --out " + out);
    if (!fs::exists(out)) return {};
    return SafetensorsFile::open(out).read("logits");
  }
  ScratchDirectory dir;
};

// max|a - b| / max|b|.
double relativeDistance(const HostTensor& a, const HostTensor& b) {
  EXPECT_EQ(a.shape, b.shape);
  if (a.shape != b.shape || a.numElements() == 0) return INFINITY;
  double difference = 0, scale = 0;
  for (int64_t i = 0; i < a.numElements(); ++i) {
    difference = std::max(difference, std::abs(double(a.as<float>()[i]) - b.as<float>()[i]));
    scale = std::max(scale, std::abs(double(b.as<float>()[i])));
  }
  return difference / scale;
}

TEST_F(LoraAdapterTest, TrainedAdapterRunsOverTheBaseAndMergesIntoTheSameModel) {
  compile("--mode train --micro-batch 2 --prompt-len 25" + kLora, dir / "train");
  compile("--mode infer --micro-batch 3 --prompt-len 25" + kLora, dir / "infer");
  compile("--mode infer --micro-batch 3 --prompt-len 25", dir / "plain");
  expectRun("train --plan " + (dir / "train") + " --weights " + kBase + kTrain + " --steps 2 --save-dir " +
            (dir / "run"));
  if (HasFailure()) return;
  const std::string step = dir / "run/step-00000002";

  // The checkpoint is a PEFT adapter directory, and its model group holds the adapters alone.
  ASSERT_TRUE(fs::exists(step + "/adapter_config.json"));
  const nlohmann::json config = nlohmann::json::parse(readFile(step + "/adapter_config.json"));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 2);
  EXPECT_EQ(config["lora_alpha"], 4);
  EXPECT_EQ(config["base_model_name_or_path"], kBase);
  EXPECT_FALSE(fs::exists(step + "/config.json")) << "an adapter checkpoint is no model directory";
  const SafetensorsFile peft = SafetensorsFile::open(step + "/adapter_model.safetensors");
  const SafetensorsDirectory model = SafetensorsDirectory::open(step);
  ASSERT_FALSE(model.names().empty());
  EXPECT_EQ(peft.entries().size(), 2 * model.names().size());
  bool trained = false;
  for (const std::string& name : model.names()) {
    EXPECT_NE(name.find(".lora_"), std::string::npos) << name << ": a base tensor in the checkpoint";
    // A linear adapter's PEFT tensor (both copies) is the plan tensor itself.
    const HostTensor saved = model.read(name);
    for (const char* copy : {"model.decoder.", "model.encoder.language_model."}) {
      const std::string key =
          "base_model.model." + std::string(copy) + name.substr(std::string("model.decoder.").size());
      ASSERT_NE(peft.find(key), nullptr) << key;
      EXPECT_EQ(peft.read(key).data, saved.data) << key;
    }
    if (name.find(".lora_B.") != std::string::npos)
      for (int64_t i = 0; i < saved.numElements(); ++i) trained = trained || saved.as<float>()[i] != 0.0f;
  }
  EXPECT_TRUE(trained) << "two steps left every lora_B at its zero init";

  // The adapter over the base changes the logits; merged into the weights it gives the same ones.
  const HostTensor base = forwardLogits(dir / "plain", kBase, "", "base");
  const HostTensor adapted = forwardLogits(dir / "infer", kBase, " --adapter " + step, "adapted");
  expectRun("export --weights " + kBase + " --merge-adapter " + step + " --out " + (dir / "merged"));
  const HostTensor merged = forwardLogits(dir / "plain", dir / "merged", "", "merged");
  if (HasFailure()) return;
  EXPECT_GT(relativeDistance(adapted, base), 1e-2);
  // f32 rounds the two differently: the merged weight once, the unmerged path x·Wᵀ and the low-rank
  // term apart (3.1e-6 on this fixture, where two steps moved the logits by 60%).
  EXPECT_LE(relativeDistance(merged, adapted), 1e-5);
  // Without --adapter the adapter plan starts from its init (B = 0): the base's logits.
  EXPECT_LE(relativeDistance(forwardLogits(dir / "infer", kBase, "", "fresh"), base), 1e-6);
}

TEST_F(LoraAdapterTest, ResumedAdapterRunIsBitExactAndRefusesAnotherBase) {
  compile("--mode train --micro-batch 2 --prompt-len 25" + kLora, dir / "train");
  const std::string plan = " --plan " + (dir / "train") + " --weights " + kBase + kTrain;
  expectRun("train" + plan + " --steps 2 --save-dir " + (dir / "straight"));
  expectRun("train" + plan + " --steps 1 --save-dir " + (dir / "resumed"));
  expectRun("train" + plan + " --steps 2 --save-dir " + (dir / "resumed") + " --resume");
  if (HasFailure()) return;
  for (const char* file : {"adapter_model.safetensors", "adapter_config.json"})
    EXPECT_EQ(readFile(dir / ("resumed/step-00000002/" + std::string(file))),
              readFile(dir / ("straight/step-00000002/" + std::string(file))))
        << file;
  const SafetensorsDirectory straight = SafetensorsDirectory::open(dir / "straight/step-00000002");
  const SafetensorsDirectory resumed = SafetensorsDirectory::open(dir / "resumed/step-00000002");
  ASSERT_EQ(resumed.names(), straight.names());
  for (const std::string& name : straight.names()) EXPECT_EQ(resumed.read(name).data, straight.read(name).data) << name;

  // The base is no part of the checkpoint: a resume over another one is refused, naming why.
  expectRun("export --weights " + kBase + " --out " + (dir / "bf16") + " --dtype bf16");
  const ToolResult other =
      run("train --plan " + (dir / "train") + " --weights " + (dir / "bf16") + kTrain + " --steps 2 --save-dir " +
          (dir / "resumed") + " --resume-from " + (dir / "resumed/step-00000001"));
  EXPECT_EQ(other.exitCode, 2) << other.output;
  EXPECT_TRUE(contains(other, "adapter_base.weights_listing_xxh3")) << other.output;
}

TEST_F(LoraAdapterTest, AnAdapterThePlanCannotTakeIsRefusedNamingIt) {
  compile("--mode train --micro-batch 2 --prompt-len 25" + kLora, dir / "train");
  compile("--mode infer --micro-batch 3 --prompt-len 25", dir / "plain");
  compile("--mode infer --micro-batch 3 --prompt-len 25 --lora 4:4 --lora-targets attention,mlp,router", dir / "rank4");
  expectRun("train --plan " + (dir / "train") + " --weights " + kBase + kTrain + " --steps 1 --save-dir " +
            (dir / "run"));
  if (HasFailure()) return;
  const std::string step = dir / "run/step-00000001";
  const std::string batch = " --input " + kFixture + "/batch.safetensors --out " + (dir / "out.safetensors");

  const ToolResult plain =
      run("forward --plan " + (dir / "plain") + " --weights " + kBase + " --adapter " + step + batch);
  EXPECT_EQ(plain.exitCode, 2) << plain.output;
  EXPECT_TRUE(contains(plain, "--adapter: " + step + ": the plan has no LoRA adapter parameters")) << plain.output;

  const ToolResult rank =
      run("forward --plan " + (dir / "rank4") + " --weights " + kBase + " --adapter " + step + batch);
  EXPECT_EQ(rank.exitCode, 2) << rank.output;
  EXPECT_TRUE(contains(rank, step + "/adapter_config.json: r: the adapter has rank 2, the plan 4")) << rank.output;

  const ToolResult merge =
      run("export --weights " + kBase + " --merge-adapter " + (dir / "absent") + " --out " + (dir / "m"));
  EXPECT_EQ(merge.exitCode, 2) << merge.output;
  EXPECT_TRUE(contains(merge, dir / "absent")) << merge.output;
  EXPECT_FALSE(fs::exists(dir / "m"));
}

// The fixture's vocabulary does not split in two: the tiny-cpu config with random weights is the base.
TEST_F(LoraAdapterTest, TensorParallelCheckpointHoldsTheWholeAdapters) {
  const std::string model = std::string(DGEMMA_SOURCE_DIR) + "/models/diffusion_gemma/configs/tiny-cpu.json";
  auto compileTiny = [&](const std::string& flags, const std::string& out) {
    ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + model +
                                  " --mode train --preset tiny-cpu " + "--micro-batch 2 " + flags + " -o " + out);
    ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  };
  compileTiny("", dir / "plain");
  compileTiny(kLora, dir / "one");
  compileTiny("--tp 2" + kLora, dir / "tp2");
  expectRun("train --plan " + (dir / "plain") +
            " --init random --train mock --seed 3 --steps 1 --lr 0 --min-lr 0 --warmup 0 " +
            "--eval-every 0 --save-dir " + (dir / "init"));
  expectRun("export --weights " + (dir / "init/step-00000001") + " --out " + (dir / "base"));
  const std::string train =
      " --weights " + (dir / "base") + " --train mock --seed 5 --steps 1 --lr 0.01 --warmup 0 --eval-every 0";
  expectRun("train --plan " + (dir / "one") + train + " --save-dir " + (dir / "run-one"));
  expectRun("train --plan " + (dir / "tp2") + train + " --save-dir " + (dir / "run-tp2"), 2);
  if (HasFailure()) return;
  const SafetensorsFile one = SafetensorsFile::open(dir / "run-one/step-00000001/adapter_model.safetensors");
  const SafetensorsFile tp2 = SafetensorsFile::open(dir / "run-tp2/step-00000001/adapter_model.safetensors");
  ASSERT_EQ(tp2.entries().size(), one.entries().size());
  for (const SafetensorsEntry& entry : one.entries()) {
    const SafetensorsEntry* split = tp2.find(entry.name);
    ASSERT_NE(split, nullptr) << entry.name;
    ASSERT_EQ(split->shape, entry.shape) << entry.name;
    // The same step on another layout: equal up to the order of f32 sums (1.1e-6 measured).
    EXPECT_LE(relativeDistance(tp2.read(entry.name), one.read(entry.name)), 1e-5) << entry.name;
  }
}

}  // namespace
}  // namespace dgemma
