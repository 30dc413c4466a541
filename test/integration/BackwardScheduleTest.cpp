// dgemma-compile --backward-order (docs/performance.md, "Scheduling the backward"): the loss terms
// and every gradient of `dgemma-run grad` are bit-identical whether dg-backward-schedule reorders
// the backward or autodiff's order is kept, on one rank (fp32 and bf16, where the backward recasts
// the weights) and in multi-rank layouts (EP under DP, TP with SP) on Gloo, with self-conditioning
// and the encoder loss on, also under recomputation. dgemma-compile itself refuses plans whose ranks
// would run their collectives in different orders, so a multi-rank compile that succeeds has
// passed that check too.
#include <gtest/gtest.h>

#include "GradientParity.h"

namespace dgemma {
namespace {

using testing::compileAndGrad;
using testing::expectBitIdentical;
using testing::ScratchDirectory;
using testing::scratchBytes;

struct Case {
  std::string name;
  std::string model;    // a config, or a fixture under test/fixtures/diffusion_gemma
  std::string weights;  // the fixture's model.safetensors, or "" for --init random
  std::string flags;    // dgemma-compile's layout and batch flags
  int64_t ranks;
};

std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.name; }

class BackwardSchedule : public ::testing::TestWithParam<Case> {
 protected:
  // Compiles with `order` and runs grad on the batch; returns the plan dir.
  std::string compileAndGradIn(const Case& c, const std::string& order) {
    return compileAndGrad(dir, c.model, c.weights, c.flags + " --backward-order " + order, c.ranks, order);
  }
  ScratchDirectory dir;
};

TEST_P(BackwardSchedule, GradientsAreBitIdentical) {
  const Case& c = GetParam();
  const uint64_t autodiffOrder = scratchBytes(compileAndGradIn(c, "autodiff"));
  const uint64_t scheduled = scratchBytes(compileAndGradIn(c, "scheduled"));
  if (HasFailure()) return;
  std::cout << "[ backward-order ] " << c.name << ": scratch " << scheduled << " bytes (autodiff's order: " << autodiffOrder
            << ")\n";
  const testing::GradOutputCounts counts =
      expectBitIdentical(dir / "autodiff.safetensors", dir / "scheduled.safetensors", /*kvProjectionsNonZero=*/true);
  EXPECT_GT(counts.gradients, 40);
  EXPECT_GT(counts.nonZeroGradients, counts.gradients / 2);
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
