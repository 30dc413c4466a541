// dgemma-compile --recompute (docs/training.md, "Recomputation"): with every policy the loss terms
// and every gradient of `dgemma-run grad` are bit-identical to the plan without recomputation, on
// one rank (fp32 and bf16) and in multi-rank layouts (EP dispatch under DP, TP with SP) on Gloo, with
// self-conditioning and the encoder loss on; and the scratch arena shrinks.
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
  std::vector<std::string> policies;
};

std::ostream& operator<<(std::ostream& out, const Case& c) { return out << c.name; }

class Recompute : public ::testing::TestWithParam<Case> {
 protected:
  // Compiles `policy`'s plan and runs grad on the fixture's weights and batch; returns the plan dir.
  std::string compileAndGradIn(const Case& c, const std::string& policy) {
    return compileAndGrad(dir, c.model, c.weights, c.flags + " --recompute " + policy, c.ranks, policy);
  }
  ScratchDirectory dir;
};

TEST_P(Recompute, GradientsAreBitIdenticalAndScratchShrinks) {
  const Case& c = GetParam();
  const uint64_t baseline = scratchBytes(compileAndGradIn(c, "none"));
  if (HasFailure()) return;
  for (const std::string& policy : c.policies) {
    SCOPED_TRACE("--recompute " + policy);
    const uint64_t scratch = scratchBytes(compileAndGradIn(c, policy));
    if (HasFailure()) return;
    EXPECT_LT(scratch, baseline) << "scratch bytes";
    std::cout << "[ recompute ] " << c.name << " " << policy << ": scratch " << scratch << " bytes (none: " << baseline << ")\n";
    const testing::GradOutputCounts counts =
        expectBitIdentical(dir / "none.safetensors", dir / (policy + ".safetensors"), /*kvProjectionsNonZero=*/true);
    EXPECT_GT(counts.gradients, 40);
    EXPECT_GT(counts.nonZeroGradients, counts.gradients / 2);
  }
}

// seven_layers: 7 layers (full:3 leaves a chunk of one), 12-token prompts that cross the window.
// TP 2 needs two KV heads in every layer: tiny-cpu, from random weights, on the same batch (its ids
// lie in tiny-cpu's vocabulary, its canvas is tiny-cpu's 16).
const std::string kSevenLayers = "test/fixtures/diffusion_gemma/seven_layers";
INSTANTIATE_TEST_SUITE_P(
    Layouts, Recompute,
    ::testing::Values(Case{"one_rank", kSevenLayers, kSevenLayers + "/model.safetensors",
                           "--prompt-len 12 --micro-batch 4", 1, {"full", "full:3", "selective"}},
                      Case{"one_rank_bf16", kSevenLayers, kSevenLayers + "/model.safetensors",
                           "--prompt-len 12 --micro-batch 4 --precision bf16", 1, {"full", "selective"}},
                      Case{"dp2_ep2", kSevenLayers, kSevenLayers + "/model.safetensors",
                           "--prompt-len 12 --micro-batch 2 --dp 2 --ep 2", 2, {"full", "selective"}},
                      Case{"tp2_sp", "models/diffusion_gemma/configs/tiny-cpu.json", "",
                           "--prompt-len 12 --micro-batch 4 --tp 2 --sp", 2, {"full:2", "selective"}}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace dgemma
