// dgemma-compile --backward-order (docs/performance.md, "Scheduling the backward"): the loss terms
// and every gradient of `dgemma-run grad` are bit-identical whether dg-backward-schedule reorders
// the backward or autodiff's order is kept, on one rank (fp32 and bf16, where the backward recasts
// the weights) and in multi-rank layouts (EP under DP, TP with SP) on Gloo, with self-conditioning
// and the encoder loss on, also under recomputation. dgemma-compile itself refuses plans whose ranks
// would run their collectives in different orders, so a multi-rank compile that succeeds has
// passed that check too.
#include <gtest/gtest.h>

#include <cstring>

#include "ToolRunner.h"
#include "plan/PlanFile.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

std::string source(const std::string& path) { return std::string(DGEMMA_SOURCE_DIR) + "/" + path; }

struct Case {
  std::string name;
  std::string model;    // a config, or a fixture under test/fixtures/diffusion_gemma
  std::string weights;  // the fixture's model.safetensors, or "" for --init random
  std::string flags;    // dgemma-compile's layout and batch flags
  int64_t ranks;
};

std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.name; }

// Scratch bytes of rank 0's plan (its non-persistent arenas).
uint64_t scratchBytes(const std::string& planDir) {
  Plan plan = readPlanFile(planFileForRank(planDir, 0));
  uint64_t bytes = 0;
  for (const Arena& arena : plan.arenas)
    if (!arena.persistent) bytes += arena.bytes;
  return bytes;
}

class BackwardSchedule : public ::testing::TestWithParam<Case> {
 protected:
  // Compiles with `order` and runs grad on the batch; returns the plan dir.
  std::string compileAndGrad(const Case& c, const std::string& order) {
    const std::string plan = dir / ("plan-" + order);
    ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + source(c.model) +
                                  " --mode train --self-cond-prob 1 --encoder-loss-weight 1 --aux-loss-coeff 0.01 " + c.flags +
                                  " --backward-order " + order + " -o " + plan);
    EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
    const std::string weights = c.weights.empty() ? " --init random --seed 3" : " --weights " + source(c.weights);
    ToolResult ran = runTool(std::string(DGEMMA_RUN) + " grad --plan " + plan + weights + " --input " +
                             source("test/fixtures/diffusion_gemma_train/seven_layers/batch.safetensors") + " --out " +
                             (dir / (order + ".safetensors")) + " --nproc-per-node " + std::to_string(c.ranks));
    EXPECT_EQ(ran.exitCode, 0) << ran.output;
    return plan;
  }
  ScratchDirectory dir;
};

TEST_P(BackwardSchedule, GradientsAreBitIdentical) {
  const Case& c = GetParam();
  const uint64_t autodiffOrder = scratchBytes(compileAndGrad(c, "autodiff"));
  const uint64_t scheduled = scratchBytes(compileAndGrad(c, "scheduled"));
  if (HasFailure()) return;
  std::cout << "[ backward-order ] " << c.name << ": scratch " << scheduled << " bytes (autodiff's order: " << autodiffOrder
            << ")\n";
  SafetensorsFile want = SafetensorsFile::open(dir / "autodiff.safetensors");
  SafetensorsFile got = SafetensorsFile::open(dir / "scheduled.safetensors");
  ASSERT_EQ(got.entries().size(), want.entries().size());
  int64_t gradients = 0, nonZero = 0;
  for (const SafetensorsEntry& entry : want.entries()) {
    ASSERT_TRUE(got.find(entry.name)) << entry.name << ": missing";
    HostTensor a = got.read(entry.name), b = want.read(entry.name);
    ASSERT_EQ(a.shape, b.shape) << entry.name;
    ASSERT_EQ(a.dtype, b.dtype) << entry.name;
    EXPECT_EQ(0, std::memcmp(a.data.data(), b.data.data(), b.data.size())) << entry.name << ": not bit-identical";
    if (entry.name.find("loss") == std::string::npos) {
      ++gradients;
      bool anyNonZero = false;
      for (uint8_t byte : b.data) anyNonZero |= byte != 0;
      nonZero += anyNonZero;
      // The K/V projections get gradients from both passes: the decoder reads the encoder's K/V.
      if (entry.name.find("k_proj") != std::string::npos) EXPECT_TRUE(anyNonZero) << entry.name;
    }
  }
  EXPECT_GT(gradients, 40);
  EXPECT_GT(nonZero, gradients / 2);
}

// seven_layers: 7 layers, 12-token prompts. TP 2 needs two KV heads in every layer: tiny-cpu, from
// random weights, on the same batch (its ids lie in tiny-cpu's vocabulary, its canvas is 16).
const std::string kSevenLayers = "test/fixtures/diffusion_gemma/seven_layers";
INSTANTIATE_TEST_SUITE_P(
    Layouts, BackwardSchedule,
    ::testing::Values(Case{"one_rank", kSevenLayers, kSevenLayers + "/model.safetensors", "--prompt-len 12 --micro-batch 4", 1},
                      Case{"one_rank_bf16", kSevenLayers, kSevenLayers + "/model.safetensors",
                           "--prompt-len 12 --micro-batch 4 --precision bf16", 1},
                      Case{"one_rank_bf16_selective", kSevenLayers, kSevenLayers + "/model.safetensors",
                           "--prompt-len 12 --micro-batch 4 --precision bf16 --recompute selective", 1},
                      Case{"dp2_ep2_bf16", kSevenLayers, kSevenLayers + "/model.safetensors",
                           "--prompt-len 12 --micro-batch 2 --dp 2 --ep 2 --precision bf16", 2},
                      Case{"dp2_ep2_all_to_all", kSevenLayers, kSevenLayers + "/model.safetensors",
                           "--prompt-len 12 --micro-batch 2 --dp 2 --ep 2 --expert-exchange all-to-all", 2},
                      Case{"tp2_sp", "models/diffusion_gemma/configs/tiny-cpu.json", "", "--prompt-len 12 --micro-batch 4 --tp 2 --sp",
                           2}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace dgemma
