// What the bit-identity tests of the plan-rewriting options share (RecomputeTest, BackwardScheduleTest,
// FusionTest): compile a training plan with one setting, run `dgemma-run grad` on the seven-layer
// fixture batch, and compare two runs' loss terms and gradients byte for byte. The including
// target defines DGEMMA_COMPILE, DGEMMA_RUN and DGEMMA_SOURCE_DIR.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "ToolRunner.h"
#include "plan/PlanFile.h"
#include "runtime/io/Safetensors.h"

namespace dgemma::testing {

inline std::string sourcePath(const std::string& path) { return std::string(DGEMMA_SOURCE_DIR) + "/" + path; }

// Compiles `model` (a config, or a fixture directory under the source tree) for training with
// self-conditioning, the encoder loss and the router's aux loss on, plus `flags`, into
// dir/plan-<name>, then runs `dgemma-run grad` on `ranks` ranks with `weights` (a safetensors file
// under the source tree, or "" for --init random --seed 3) on the seven-layer fixture batch (its ids
// lie in tiny-cpu's vocabulary too) into dir/<name>.safetensors. Returns the plan directory.
inline std::string compileAndGrad(const ScratchDirectory& dir, const std::string& model, const std::string& weights,
                                  const std::string& flags, int64_t ranks, const std::string& name) {
  const std::string plan = dir / ("plan-" + name);
  ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + sourcePath(model) +
                                " --mode train --self-cond-prob 1 --encoder-loss-weight 1 --aux-loss-coeff 0.01 " + flags +
                                " -o " + plan);
  EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
  const std::string init = weights.empty() ? " --init random --seed 3" : " --weights " + sourcePath(weights);
  ToolResult ran = runTool(std::string(DGEMMA_RUN) + " grad --plan " + plan + init + " --input " +
                           sourcePath("test/fixtures/diffusion_gemma_train/seven_layers/batch.safetensors") + " --out " +
                           (dir / (name + ".safetensors")) + " --nproc-per-node " + std::to_string(ranks));
  EXPECT_EQ(ran.exitCode, 0) << ran.output;
  return plan;
}

// Scratch bytes of rank 0's plan (its non-persistent arenas).
inline uint64_t scratchBytes(const std::string& planDir) {
  Plan plan = readPlanFile(planFileForRank(planDir, 0));
  uint64_t bytes = 0;
  for (const Arena& arena : plan.arenas)
    if (!arena.persistent) bytes += arena.bytes;
  return bytes;
}

// What expectBitIdentical compared, so that a test can require the comparison to mean something:
// every entry of the grad output, and the gradients (the entries that are no loss term), with how
// many of each hold a non-zero byte.
struct GradOutputCounts {
  int64_t entries = 0, nonZeroEntries = 0;
  int64_t gradients = 0, nonZeroGradients = 0;
};

// Fails the test for every entry of `want` that `got` lacks or holds in other bytes (shape, dtype,
// data). With `kvProjectionsNonZero` a k_proj gradient must be non-zero too: the K/V projections get
// gradients through the encoder K/V the decoder reads, which recomputation and reordering must keep.
inline GradOutputCounts expectBitIdentical(const std::string& wantPath, const std::string& gotPath,
                                           bool kvProjectionsNonZero) {
  GradOutputCounts counts;
  SafetensorsFile want = SafetensorsFile::open(wantPath);
  SafetensorsFile got = SafetensorsFile::open(gotPath);
  EXPECT_EQ(got.entries().size(), want.entries().size());
  for (const SafetensorsEntry& entry : want.entries()) {
    if (!got.find(entry.name)) {
      ADD_FAILURE() << entry.name << ": missing";
      continue;
    }
    HostTensor a = got.read(entry.name), b = want.read(entry.name);
    EXPECT_EQ(a.shape, b.shape) << entry.name;
    EXPECT_EQ(a.dtype, b.dtype) << entry.name;
    EXPECT_TRUE(a.data.size() == b.data.size() && std::memcmp(a.data.data(), b.data.data(), b.data.size()) == 0)
        << entry.name << ": not bit-identical";
    const bool anyNonZero = std::any_of(b.data.begin(), b.data.end(), [](uint8_t byte) { return byte != 0; });
    ++counts.entries;
    counts.nonZeroEntries += anyNonZero;
    // grad writes the loss terms and every gradient under its parameter's name.
    if (entry.name.find("loss") != std::string::npos) continue;
    ++counts.gradients;
    counts.nonZeroGradients += anyNonZero;
    if (kvProjectionsNonZero && entry.name.find("k_proj") != std::string::npos) {
      EXPECT_TRUE(anyNonZero) << entry.name;
    }
  }
  return counts;
}

}  // namespace dgemma::testing
