// dgemma-compile --fusion (dg-fuse-elementwise; docs/kernels.md, "Fused elementwise chains"): the
// loss terms and every gradient of `dgemma-run grad` are bit-identical with and without fusion, in
// fp32 and bf16 on one rank and in a tensor-parallel layout on Gloo; the fused train_step has fewer
// steps; the plan's metadata records the setting.
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
  std::string flags;  // dgemma-compile's layout and precision flags
  int64_t ranks;
};

std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.name; }

class Fusion : public ::testing::TestWithParam<Case> {
 protected:
  // Compiles tiny-cpu with --fusion `setting` and runs grad on random weights and the fixture batch
  // (its ids lie in tiny-cpu's vocabulary, its canvas is tiny-cpu's 16); returns rank 0's plan.
  Plan compileAndGrad(const Case& c, const std::string& setting) {
    const std::string plan = dir / ("plan-" + setting);
    ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " +
                                  source("models/diffusion_gemma/configs/tiny-cpu.json") +
                                  " --mode train --self-cond-prob 1 --encoder-loss-weight 1 --aux-loss-coeff 0.01"
                                  " --prompt-len 12 --micro-batch 4 " +
                                  c.flags + " --fusion " + setting + " -o " + plan);
    EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
    ToolResult ran = runTool(std::string(DGEMMA_RUN) + " grad --plan " + plan + " --init random --seed 3 --input " +
                             source("test/fixtures/diffusion_gemma_train/seven_layers/batch.safetensors") + " --out " +
                             (dir / (setting + ".safetensors")) + " --nproc-per-node " + std::to_string(c.ranks));
    EXPECT_EQ(ran.exitCode, 0) << ran.output;
    return readPlanFile(planFileForRank(plan, 0));
  }
  ScratchDirectory dir;
};

size_t trainSteps(const Plan& plan) {
  for (const EntryPoint& entry : plan.entryPoints)
    if (entry.name == "train_step") return entry.steps.size();
  ADD_FAILURE() << "no train_step entry";
  return 0;
}

TEST_P(Fusion, GradientsAreBitIdenticalWithFewerSteps) {
  const Case& c = GetParam();
  const Plan unfused = compileAndGrad(c, "off");
  const Plan fused = compileAndGrad(c, "on");
  if (HasFailure()) return;
  EXPECT_EQ(unfused.metadata.value("fusion", ""), "off");
  EXPECT_EQ(fused.metadata.value("fusion", ""), "on");
  EXPECT_LT(trainSteps(fused), trainSteps(unfused));
  std::cout << "[ fusion ] " << c.name << ": train_step " << trainSteps(unfused) << " steps unfused, "
            << trainSteps(fused) << " fused\n";
  SafetensorsFile want = SafetensorsFile::open(dir / "off.safetensors");
  SafetensorsFile got = SafetensorsFile::open(dir / "on.safetensors");
  ASSERT_EQ(got.entries().size(), want.entries().size());
  int64_t nonZero = 0;
  for (const SafetensorsEntry& entry : want.entries()) {
    ASSERT_TRUE(got.find(entry.name)) << entry.name << ": missing";
    HostTensor a = got.read(entry.name), b = want.read(entry.name);
    ASSERT_EQ(a.shape, b.shape) << entry.name;
    ASSERT_EQ(a.dtype, b.dtype) << entry.name;
    EXPECT_EQ(0, std::memcmp(a.data.data(), b.data.data(), b.data.size())) << entry.name << ": not bit-identical";
    bool anyNonZero = false;
    for (uint8_t byte : b.data) anyNonZero |= byte != 0;
    nonZero += anyNonZero;
  }
  // grad writes the loss terms and every gradient: most are non-zero, so the comparison means something.
  EXPECT_GT(nonZero, static_cast<int64_t>(want.entries().size()) / 2);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Fusion,
                         ::testing::Values(Case{"fp32", "", 1}, Case{"bf16", "--precision bf16", 1},
                                           Case{"tp2_sp", "--tp 2 --sp", 2}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace dgemma
