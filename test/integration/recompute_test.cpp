// dgemma-compile --recompute (docs/training.md, "Recomputation"): with every policy the loss terms
// and every gradient of `dgemma-run grad` are bit-identical to the plan without recomputation, on
// one rank (fp32 and bf16) and in multi-rank layouts (EP dispatch under DP, TP with SP) on Gloo, with
// self-conditioning and the encoder loss on; and the scratch arena shrinks.
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
  std::string batch;    // under test/fixtures/diffusion_gemma_train
  std::string flags;    // dgemma-compile's layout and batch flags
  int64_t ranks;
  std::vector<std::string> policies;
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

class Recompute : public ::testing::TestWithParam<Case> {
 protected:
  // Compiles `policy`'s plan and runs grad on the fixture's weights and batch; returns the plan dir.
  std::string compileAndGrad(const Case& c, const std::string& policy) {
    const std::string plan = dir / ("plan-" + policy);
    ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + source(c.model) +
                                  " --mode train --self-cond-prob 1 --encoder-loss-weight 1 --aux-loss-coeff 0.01 " + c.flags +
                                  " --recompute " + policy + " -o " + plan);
    EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
    const std::string weights = c.weights.empty() ? " --init random --seed 3" : " --weights " + source(c.weights);
    ToolResult ran = runTool(std::string(DGEMMA_RUN) + " grad --plan " + plan + weights + " --input " +
                             source("test/fixtures/diffusion_gemma_train/" + c.batch) + " --out " +
                             (dir / (policy + ".safetensors")) + " --nproc-per-node " + std::to_string(c.ranks));
    EXPECT_EQ(ran.exitCode, 0) << ran.output;
    return plan;
  }
  ScratchDirectory dir;
};

TEST_P(Recompute, GradientsAreBitIdenticalAndScratchShrinks) {
  const Case& c = GetParam();
  const uint64_t baseline = scratchBytes(compileAndGrad(c, "none"));
  if (HasFailure()) return;
  SafetensorsFile want = SafetensorsFile::open(dir / "none.safetensors");
  for (const std::string& policy : c.policies) {
    SCOPED_TRACE("--recompute " + policy);
    const uint64_t scratch = scratchBytes(compileAndGrad(c, policy));
    if (HasFailure()) return;
    EXPECT_LT(scratch, baseline) << "scratch bytes";
    std::cout << "[ recompute ] " << c.name << " " << policy << ": scratch " << scratch << " bytes (none: " << baseline << ")\n";
    SafetensorsFile got = SafetensorsFile::open(dir / (policy + ".safetensors"));
    ASSERT_EQ(got.entries().size(), want.entries().size());
    int64_t gradients = 0, nonZero = 0;
    for (const SafetensorsEntry& entry : want.entries()) {
      const SafetensorsEntry* other = got.find(entry.name);
      ASSERT_TRUE(other) << entry.name << ": missing";
      HostTensor a = got.read(entry.name), b = want.read(entry.name);
      ASSERT_EQ(a.shape, b.shape) << entry.name;
      ASSERT_EQ(a.dtype, b.dtype) << entry.name;
      EXPECT_EQ(0, std::memcmp(a.data.data(), b.data.data(), b.data.size())) << entry.name << ": not bit-identical";
      // grad writes the loss terms and every gradient under its parameter's name.
      if (entry.name.find("loss") == std::string::npos) {
        ++gradients;
        bool anyNonZero = false;
        for (uint8_t byte : b.data) anyNonZero |= byte != 0;
        nonZero += anyNonZero;
        // The K/V projections get gradients through the encoder K/V the decoder reads.
        if (entry.name.find("k_proj") != std::string::npos) EXPECT_TRUE(anyNonZero) << entry.name;
      }
    }
    EXPECT_GT(gradients, 40);
    EXPECT_GT(nonZero, gradients / 2);
  }
}

// seven_layers: 7 layers (full:3 leaves a chunk of one), 12-token prompts that cross the window.
// TP 2 needs two KV heads in every layer: tiny-cpu, from random weights, on the same batch (its ids
// lie in tiny-cpu's vocabulary, its canvas is tiny-cpu's 16).
const std::string kSevenLayers = "test/fixtures/diffusion_gemma/seven_layers";
const std::string kSevenLayersBatch = "seven_layers/batch.safetensors";
INSTANTIATE_TEST_SUITE_P(
    Layouts, Recompute,
    ::testing::Values(Case{"one_rank", kSevenLayers, kSevenLayers + "/model.safetensors", kSevenLayersBatch,
                           "--prompt-len 12 --micro-batch 4", 1, {"full", "full:3", "selective"}},
                      Case{"one_rank_bf16", kSevenLayers, kSevenLayers + "/model.safetensors", kSevenLayersBatch,
                           "--prompt-len 12 --micro-batch 4 --precision bf16", 1, {"full", "selective"}},
                      Case{"dp2_ep2", kSevenLayers, kSevenLayers + "/model.safetensors", kSevenLayersBatch,
                           "--prompt-len 12 --micro-batch 2 --dp 2 --ep 2", 2, {"full", "selective"}},
                      Case{"tp2_sp", "models/diffusion_gemma/configs/tiny-cpu.json", "", kSevenLayersBatch,
                           "--prompt-len 12 --micro-batch 4 --tp 2 --sp", 2, {"full:2", "selective"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace dgemma
