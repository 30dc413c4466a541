// Context parallelism computes what one rank computes (docs/parallelism.md, "Context parallelism"):
// per-rank plans from dgemma-compile --cp (alone and with --tp/--sp/--dp/--ep/--recompute), run by
// dgemma-run --nproc-per-node on Gloo ranks, against the one-rank plan of the same global batch.
//   - grad: the loss terms and every gathered gradient on an HF fixture whose 11-token prompts (a
//     12-token bucket, sliding window 4) cross the window and the context chunks' boundaries (2 CP
//     chunks: of 3 tokens in the prompt pass, of 7 in the clean pass at CP 2), with self-conditioning
//     and the encoder loss on;
//   - train: three optimizer steps on the tiny-cpu config give the same losses and gradient norms.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "TrainingOutputs.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

using testing::expectSameLosses;
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

std::string source(const std::string& path) { return std::string(DGEMMA_SOURCE_DIR) + "/" + path; }

class ContextParallel : public ::testing::TestWithParam<Layout> {
 protected:
  void compile(const std::string& model, const std::string& flags, const std::string& out) {
    ToolResult compiled =
        runTool(std::string(DGEMMA_COMPILE) + " --model " + model + " --mode train " + flags + " -o " + out);
    EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
  }
  void run(const std::string& command, int64_t ranks) {
    ToolResult ran = runTool(std::string(DGEMMA_RUN) + " " + command + " --nproc-per-node " + std::to_string(ranks));
    EXPECT_EQ(ran.exitCode, 0) << ran.output;
  }
  // dgemma-run grad of the fixture batch: every output within its tolerance of one rank's.
  void checkGradients(const Layout& layout, const std::string& encoderLossWeight);
  ScratchDirectory dir;
};

class ContextParallelGradients : public ContextParallel {};

// The fixture's seven layers have one KV head on the full layer, which TP 2 cannot split: TP is
// checked by the training parity below.
const std::vector<Layout>& gradientLayouts() {
  static const std::vector<Layout> all = {
      {"cp2", "--cp 2", 2, 1},
      {"cp2_recompute_full", "--cp 2 --recompute full", 2, 1},
      {"cp2_recompute_selective", "--cp 2 --recompute selective", 2, 1},
      {"cp2_dp2", "--cp 2 --dp 2", 4, 2},
      {"cp2_dp2_ep2", "--cp 2 --dp 2 --ep 2", 4, 2},
      {"cp2_dp2_ep2_all_to_all", "--cp 2 --dp 2 --ep 2 --expert-exchange all-to-all", 4, 2},
  };
  return all;
}

// With the encoder loss the clean pass (P + L) gives the decoders the prompt's K/V; without it a
// separate prompt pass (P) does, split over the context ranks as well.
TEST_P(ContextParallelGradients, EqualOneRank) { checkGradients(GetParam(), "1"); }
TEST_P(ContextParallelGradients, WithoutTheEncoderLossEqualOneRank) { checkGradients(GetParam(), "0"); }

void ContextParallel::checkGradients(const Layout& layout, const std::string& encoderLossWeight) {
  const std::string model = source("test/fixtures/diffusion_gemma/seven_layers");
  const std::string batch = source("test/fixtures/diffusion_gemma_train/seven_layers/batch.safetensors");
  const std::string objective = " --self-cond-prob 1 --encoder-loss-weight " + encoderLossWeight + " --prompt-len 12";
  compile(model, objective + " --micro-batch 4", dir / "one");
  compile(model, objective + " --micro-batch " + std::to_string(4 / layout.dataParallel) + " " + layout.flags,
          dir / "sharded");
  const std::string grad = " --weights " + model + "/model.safetensors --input " + batch;
  run("grad --plan " + (dir / "one") + grad + " --out " + (dir / "one.safetensors"), 1);
  run("grad --plan " + (dir / "sharded") + grad + " --out " + (dir / "sharded.safetensors"), layout.ranks);
  if (HasFailure()) return;

  SafetensorsFile want = SafetensorsFile::open(dir / "one.safetensors");
  SafetensorsFile got = SafetensorsFile::open(dir / "sharded.safetensors");
  int64_t compared = 0;
  for (const SafetensorsEntry& entry : want.entries()) {
    const std::string& name = entry.name;
    ASSERT_TRUE(got.find(name)) << name << ": missing from the context-parallel run's output";
    HostTensor a = got.read(name), b = want.read(name);
    ASSERT_EQ(a.shape, b.shape) << name;
    // The loss terms to 1e-6. Gradients: fp32 sums in another order, as in ShardedParityTest; the
    // router's per_expert_scale sums terms of both signs over every route.
    const bool lossTerm = name.find("loss") != std::string::npos;
    const double tolerance = lossTerm ? 1e-6 : name.find("router.per_expert_scale") != std::string::npos ? 3e-5 : 1e-5;
    EXPECT_LE(relativeDistance(a, b), tolerance) << name;
    ++compared;
  }
  EXPECT_GT(compared, 50);  // the loss terms and every trainable parameter's gradient
}

const std::vector<Layout>& trainingLayouts() {
  static const std::vector<Layout> all = {
      {"cp2", "--cp 2", 2, 1},
      {"cp4", "--cp 4", 4, 1},
      {"cp2_tp2", "--cp 2 --tp 2", 4, 1},
      {"cp2_tp2_sp", "--cp 2 --tp 2 --sp", 4, 1},
      {"cp2_tp2_sp_recompute_full", "--cp 2 --tp 2 --sp --recompute full", 4, 1},
      {"cp2_dp2", "--cp 2 --dp 2", 4, 2},
      {"cp2_dp2_ep2", "--cp 2 --dp 2 --ep 2", 4, 2},
      {"cp2_tp2_dp2_sp", "--cp 2 --tp 2 --dp 2 --sp", 8, 2},
      // With TP beyond the KV heads (tiny-cpu has 2: the tensor group is tp x tp1 inside cp) and with
      // a padded vocabulary (256 ids in 288 rows), against the unpadded rank.
      {"cp2_tp4", "--cp 2 --tp 4", 8, 1},
      {"cp2_tp2_vocab_alignment_48", "--cp 2 --tp 2 --vocab-alignment 48", 4, 1},
  };
  return all;
}

// Three steps from the same random init on mock data (the tiny-cpu preset: prompt buckets 16, 32
// and 64, sliding window 8, canvas 16), then the layout's checkpoint resumed on one rank for two more
// (ZeRO-1 shards the optimizer state over the data group and `cp` in contiguous blocks, so its boxes
// assemble; the fifth step's loss reads the moments of the fourth update): the losses to 1e-6 and
// the gradient norms to 1e-5 at every step.
TEST_P(ContextParallel, TrainingAndResumeOnOneRankEqualOneRank) {
  const Layout& layout = GetParam();
  const std::string model = source("models/diffusion_gemma/configs/tiny-cpu.json");
  compile(model, "--preset tiny-cpu --micro-batch 2", dir / "one");
  compile(model, "--preset tiny-cpu --micro-batch " + std::to_string(2 / layout.dataParallel) + " " + layout.flags,
          dir / "sharded");
  const std::string train = " --train mock --init random --seed 5 --warmup 1 --decay-steps 5 --eval-every 0";
  run("train --plan " + (dir / "one") + train + " --steps 5 --metrics " + (dir / "one.jsonl"), 1);
  run("train --plan " + (dir / "sharded") + train + " --steps 3 --save-every 3 --metrics " + (dir / "sharded.jsonl") +
          " --save-dir " + (dir / "sharded-ckpt"),
      layout.ranks);
  run("train --plan " + (dir / "one") + train + " --steps 5 --resume --metrics " + (dir / "sharded.jsonl") +
          " --save-dir " + (dir / "sharded-ckpt"),
      1);
  if (HasFailure()) return;
  std::vector<nlohmann::json> want = splitRecords(dir / "one.jsonl"), got = splitRecords(dir / "sharded.jsonl");
  ASSERT_EQ(want.size(), 5u);
  ASSERT_EQ(got.size(), 5u);
  for (size_t step = 0; step < want.size(); ++step) expectSameLosses(got[step], want[step]);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallelGradients, ::testing::ValuesIn(gradientLayouts()),
                         [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallel, ::testing::ValuesIn(trainingLayouts()),
                         [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

}  // namespace
}  // namespace dgemma
