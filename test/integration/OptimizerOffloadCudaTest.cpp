// dgemma-compile --backend cuda --optimizer-offload experts (docs/parallelism.md, "Optimizer-state
// offload"), on a GPU: `dgemma-run train --backend cuda` for 3 steps from the same random weights
// gives the plain CUDA run's metrics lines (losses, grad norms) and byte-identical checkpoint
// tensors (masters and AdamW moments), in fp32 and bf16. The offloaded run keeps the experts'
// moments in pinned host memory and updates them with the CPU's adamw kernel, so this also checks
// that the CPU and CUDA AdamW round alike. Skips without a usable CUDA device (label gpu).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ToolRunner.h"
#include "TrainingOutputs.h"
#include "runtime/backends/cuda/CudaBackend.h"

namespace dgemma {
namespace {

using testing::checkpointTensors;
using testing::metricsLines;
using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

struct Case {
  std::string name;
  std::string flags;  // dgemma-compile's precision flags
};

std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.name; }

class OptimizerOffloadOnCuda : public ::testing::TestWithParam<Case> {
 protected:
  // Compiles tiny-cpu for the CUDA backend with --optimizer-offload `setting` and trains it there
  // for 3 steps on mock data, a checkpoint at the end.
  void compileAndTrain(const std::string& setting) {
    const std::string plan = dir / ("plan-" + setting);
    ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + DGEMMA_SOURCE_DIR +
                                  "/models/diffusion_gemma/configs/tiny-cpu.json --mode train --micro-batch 2 "
                                  "--prompt-len 12 --self-cond-prob 0.5 --encoder-loss-weight 1 --aux-loss-coeff 0.01 "
                                  "--backend cuda " +
                                  GetParam().flags + " --optimizer-offload " + setting + " -o " + plan);
    ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
    ToolResult trained = runTool(std::string(DGEMMA_RUN) + " train --plan " + plan +
                                 " --backend cuda --init random --seed 3 --train mock --steps 3 --lr 1e-2 --warmup 0 "
                                 "--metrics " +
                                 (dir / (setting + ".jsonl")) + " --save-dir " + (dir / setting));
    ASSERT_EQ(trained.exitCode, 0) << trained.output;
  }
  ScratchDirectory dir;
};

TEST_P(OptimizerOffloadOnCuda, TrainingIsBitIdenticalToThePlainRun) {
  std::string reason;
  if (!cudaDeviceAvailable(&reason)) GTEST_SKIP() << "no usable CUDA device: " << reason;
  ASSERT_NO_FATAL_FAILURE(compileAndTrain("none"));
  ASSERT_NO_FATAL_FAILURE(compileAndTrain("experts"));
  const std::vector<std::string> plainMetrics = metricsLines(dir / "none.jsonl");
  ASSERT_EQ(plainMetrics.size(), 3u);
  EXPECT_NE(plainMetrics[0].find("grad_norm"), std::string::npos) << plainMetrics[0];
  EXPECT_EQ(metricsLines(dir / "experts.jsonl"), plainMetrics);
  const std::map<std::string, std::string> plainTensors = checkpointTensors(dir / "none");
  const std::map<std::string, std::string> tensors = checkpointTensors(dir / "experts");
  ASSERT_FALSE(plainTensors.empty());
  ASSERT_EQ(tensors.size(), plainTensors.size());
  for (const auto& [path, bytes] : plainTensors) {
    auto found = tensors.find(path);
    ASSERT_NE(found, tensors.end()) << path;
    EXPECT_TRUE(found->second == bytes) << path << ": not byte-identical";
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, OptimizerOffloadOnCuda,
                         ::testing::Values(Case{"fp32", ""}, Case{"bf16", "--precision bf16"}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace dgemma
