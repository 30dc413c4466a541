// dgemma-compile --fusion (dg-fuse-elementwise; docs/kernels.md, "Fused elementwise chains"): the
// loss terms and every gradient of `dgemma-run grad` are bit-identical with and without fusion, in
// fp32 and bf16 on one rank and in a tensor-parallel layout on Gloo; the fused train_step has fewer
// steps; the plan's metadata records the setting.
#include <gtest/gtest.h>

#include "GradientParity.h"

namespace dgemma {
namespace {

using testing::compileAndGrad;
using testing::expectBitIdentical;
using testing::ScratchDirectory;

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
  Plan compileAndGradIn(const Case& c, const std::string& setting) {
    const std::string plan = compileAndGrad(dir, "models/diffusion_gemma/configs/tiny-cpu.json", "",
                                            "--prompt-len 12 --micro-batch 4 " + c.flags + " --fusion " + setting, c.ranks,
                                            setting);
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
  const Plan unfused = compileAndGradIn(c, "off");
  const Plan fused = compileAndGradIn(c, "on");
  if (HasFailure()) return;
  EXPECT_EQ(unfused.metadata.value("fusion", ""), "off");
  EXPECT_EQ(fused.metadata.value("fusion", ""), "on");
  EXPECT_LT(trainSteps(fused), trainSteps(unfused));
  std::cout << "[ fusion ] " << c.name << ": train_step " << trainSteps(unfused) << " steps unfused, "
            << trainSteps(fused) << " fused\n";
  const testing::GradOutputCounts counts =
      expectBitIdentical(dir / "off.safetensors", dir / "on.safetensors", /*kvProjectionsNonZero=*/false);
  // grad writes the loss terms and every gradient: most are non-zero, so the comparison means something.
  EXPECT_GT(counts.nonZeroEntries, counts.entries / 2);
}

INSTANTIATE_TEST_SUITE_P(Layouts, Fusion,
                         ::testing::Values(Case{"fp32", "", 1}, Case{"bf16", "--precision bf16", 1},
                                           Case{"tp2_sp", "--tp 2 --sp", 2}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace dgemma
