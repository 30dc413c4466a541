// dgemma-compile --optimizer-offload experts|all (docs/parallelism.md, "Optimizer-state offload"):
// `dgemma-run train` for 3 steps from the same random weights gives the plain run's metrics lines
// (losses, grad norms) and byte-identical checkpoint tensors (masters and AdamW moments), on one
// rank in fp32 and bf16 and in ZeRO-1 layouts on Gloo (--dp 2 --ep 2: the dense moments sharded
// over the data group; --dp 4 --ep 2: the experts' too, over their expert-data group of 2; with
// context parallelism, --cp 2 --dp 2 --ep 2 and --cp 2 --tp 4, the tensor group tp x tp1). A run
// resumes across the setting. The offloaded plan keeps the moments in its host arena and stages
// the update.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "GradientParity.h"
#include "TrainingOutputs.h"
#include "plan/HostArena.h"

namespace dgemma {
namespace {

using testing::checkpointTensors;
using testing::metricsLines;
using testing::runTool;
using testing::ScratchDirectory;
using testing::sourcePath;
using testing::ToolResult;

struct Case {
  std::string name;
  std::string flags;  // dgemma-compile's layout and precision flags
  int64_t ranks;
};

std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.name; }

class OptimizerOffload : public ::testing::TestWithParam<Case> {
 protected:
  // Compiles tiny-cpu with --optimizer-offload `setting` into dir/plan-<setting> and trains it for
  // 3 steps on mock data from --init random, a checkpoint at the end; returns rank 0's plan.
  Plan compileAndTrain(const Case& c, const std::string& setting) {
    const std::string plan = dir / ("plan-" + setting);
    ToolResult compiled =
        runTool(std::string(DGEMMA_COMPILE) + " --model " + sourcePath("models/diffusion_gemma/configs/tiny-cpu.json") +
                " --mode train --micro-batch 2 --prompt-len 12 --self-cond-prob 0.5 "
                "--encoder-loss-weight 1 --aux-loss-coeff 0.01 " +
                c.flags + " --optimizer-offload " + setting + " -o " + plan);
    EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
    ToolResult trained = runTool(std::string(DGEMMA_RUN) + " train --plan " + plan +
                                 " --init random --seed 3 --train mock --steps 3 --lr 1e-2 --warmup 0 --metrics " +
                                 (dir / (setting + ".jsonl")) + " --save-dir " + (dir / setting) +
                                 " --nproc-per-node " + std::to_string(c.ranks));
    EXPECT_EQ(trained.exitCode, 0) << trained.output;
    return readPlanFile(planFileForRank(plan, 0));
  }
  ScratchDirectory dir;
};

// The host arena's bytes, and the optimizer_step copies into and out of it.
struct HostTraffic {
  uint64_t hostBytes = 0;
  int64_t toHost = 0, toDevice = 0;
};
HostTraffic hostTraffic(const Plan& plan) {
  HostTraffic traffic;
  auto inHost = [&](int64_t buffer) { return isHostArena(plan.arenas[plan.buffers[buffer].arena]); };
  for (const Arena& arena : plan.arenas)
    if (isHostArena(arena)) traffic.hostBytes += arena.bytes;
  for (const EntryPoint& entry : plan.entryPoints)
    for (const Step& step : entry.steps)
      if (step.op == "copy" && inHost(step.inputs[0]) != inHost(step.outputs[0])) {
        EXPECT_EQ(entry.name, "optimizer_step") << "a host copy outside the optimizer step";
        ++(inHost(step.outputs[0]) ? traffic.toHost : traffic.toDevice);
      }
  return traffic;
}

TEST_P(OptimizerOffload, TrainingIsBitIdenticalToThePlainRun) {
  const Case& c = GetParam();
  const Plan plain = compileAndTrain(c, "none");
  const std::map<std::string, std::string> plainTensors = checkpointTensors(dir / "none");
  const std::vector<std::string> plainMetrics = metricsLines(dir / "none.jsonl");
  ASSERT_EQ(plainMetrics.size(), 3u);
  EXPECT_NE(plainMetrics[0].find("grad_norm"), std::string::npos) << plainMetrics[0];
  ASSERT_FALSE(plainTensors.empty());
  EXPECT_EQ(hostTraffic(plain).hostBytes, 0u);

  uint64_t expertsHostBytes = 0;
  for (const std::string setting : {"experts", "all"}) {
    SCOPED_TRACE(setting);
    const Plan offloaded = compileAndTrain(c, setting);
    EXPECT_EQ(offloaded.metadata.value("optimizer_offload", ""), setting);
    const HostTraffic traffic = hostTraffic(offloaded);
    // The gradients, weights and scalars go to the host, the updated weights come back.
    EXPECT_GT(traffic.hostBytes, 0u);
    EXPECT_GT(traffic.toHost, traffic.toDevice);
    EXPECT_GT(traffic.toDevice, 0);
    if (setting == std::string("experts")) expertsHostBytes = traffic.hostBytes;
    else EXPECT_GT(traffic.hostBytes, expertsHostBytes);
    EXPECT_EQ(metricsLines(dir / (setting + ".jsonl")), plainMetrics);
    const std::map<std::string, std::string> tensors = checkpointTensors(dir / setting);
    ASSERT_EQ(tensors.size(), plainTensors.size());
    for (const auto& [path, bytes] : plainTensors) {
      auto found = tensors.find(path);
      ASSERT_NE(found, tensors.end()) << path;
      EXPECT_TRUE(found->second == bytes) << path << ": not byte-identical";
    }
  }
}

// The checkpoint is the same file with and without offload, so a run resumes across the setting:
// 3 plain steps, then steps 4-5 with --optimizer-offload experts, equal 5 plain steps.
TEST(OptimizerOffloadResume, AnOffloadedRunResumesThePlainRunsCheckpoint) {
  ScratchDirectory dir;
  for (const std::string setting : {"none", "experts"}) {
    ToolResult compiled =
        runTool(std::string(DGEMMA_COMPILE) + " --model " + sourcePath("models/diffusion_gemma/configs/tiny-cpu.json") +
                " --mode train --micro-batch 2 --prompt-len 12 --optimizer-offload " + setting + " -o " +
                (dir / ("plan-" + setting)));
    ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  }
  auto train = [&](const std::string& setting, const std::string& run, const std::string& steps) {
    return runTool(std::string(DGEMMA_RUN) + " train --plan " + (dir / ("plan-" + setting)) +
                   " --init random --seed 3 --train mock --lr 1e-2 --warmup 0 --decay-steps 5 --steps " + steps +
                   " --metrics " + (dir / (run + ".jsonl")) + " --save-dir " + (dir / run));
  };
  ToolResult whole = train("none", "whole", "5");
  ASSERT_EQ(whole.exitCode, 0) << whole.output;
  ToolResult first = train("none", "split", "3");
  ASSERT_EQ(first.exitCode, 0) << first.output;
  ToolResult resumed =
      runTool(std::string(DGEMMA_RUN) + " train --plan " + (dir / "plan-experts") +
              " --init random --seed 3 --train mock --lr 1e-2 --warmup 0 --decay-steps 5 --steps 5 --metrics " +
              (dir / "split.jsonl") + " --save-dir " + (dir / "split") + " --resume");
  ASSERT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_EQ(metricsLines(dir / "split.jsonl"), metricsLines(dir / "whole.jsonl"));
  const std::map<std::string, std::string> wholeTensors = checkpointTensors(dir / "whole");
  const std::map<std::string, std::string> splitTensors = checkpointTensors(dir / "split");
  int64_t compared = 0;
  for (const auto& [path, bytes] : wholeTensors)
    if (path.find("step-00000005") != std::string::npos) {
      ++compared;
      ASSERT_EQ(splitTensors.count(path), 1u) << path;
      EXPECT_TRUE(splitTensors.at(path) == bytes) << path << ": not byte-identical";
    }
  EXPECT_EQ(compared, 2);  // the model's and the optimizer's tensor files
}

INSTANTIATE_TEST_SUITE_P(Layouts, OptimizerOffload,
                         ::testing::Values(Case{"fp32", "", 1}, Case{"bf16", "--precision bf16", 1},
                                           Case{"dp2_ep2", "--dp 2 --ep 2", 2}, Case{"dp4_ep2", "--dp 4 --ep 2", 4},
                                           Case{"cp2_dp2_ep2", "--cp 2 --dp 2 --ep 2", 4},
                                           Case{"cp2_tp4", "--cp 2 --tp 4", 8}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace dgemma
