// checkParallelLayout against the bundled configs: the 26B recipe's layouts pass, and each broken
// constraint of docs/parallelism.md ("Divisibility") is named with the sizes involved.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "models/diffusion_gemma/spec/Config.h"
#include "models/diffusion_gemma/spec/ParallelLayout.h"
#include "test/unit/models/ModelTestSupport.h"

namespace dgemma {
namespace {

using model_test::inputErrorMessage;
using model_test::presetPath;

DiffusionGemmaConfig config26b() { return loadDiffusionGemmaConfig(presetPath("diffusiongemma-26b-a4b.json")); }
DiffusionGemmaConfig tinyConfig() { return loadDiffusionGemmaConfig(presetPath("tiny-cpu.json")); }

// Expects checkParallelLayout to refuse `layout` with a message containing `expected`.
void expectRefused(const DiffusionGemmaConfig& config, const ParallelLayout& layout, const std::string& expected,
                   const std::vector<int64_t>& promptLengths = {64}) {
  const std::string message =
      inputErrorMessage([&] { checkParallelLayout(config, layout, promptLengths, config.canvasLength); });
  EXPECT_NE(message.find(expected), std::string::npos) << "expected \"" << expected << "\" in: " << message;
}

TEST(ParallelLayout, WorldAndExpertMeshSizes) {
  const ParallelLayout layout{2, 4, 4, true};
  EXPECT_EQ(layout.worldSize(), 8);
  EXPECT_EQ(layout.expertDataParallel(), 2);
}

TEST(ParallelLayout, AcceptsTheRecipeLayouts) {
  const DiffusionGemmaConfig config = config26b();
  for (const ParallelLayout& layout : {ParallelLayout{1, 8, 8, false}, ParallelLayout{1, 1, 1, false},
                                       ParallelLayout{2, 4, 4, true}, ParallelLayout{2, 2, 2, true}})
    EXPECT_NO_THROW(checkParallelLayout(config, layout, {128, 512}, config.canvasLength))
        << "tp " << layout.tensorParallel << " dp " << layout.dataParallel << " ep " << layout.expertParallel;
  // The tiny config is sized for TP 2 and EP 2, 4 and 8.
  const DiffusionGemmaConfig tiny = tinyConfig();
  for (int64_t ep : {2, 4, 8}) EXPECT_NO_THROW(checkParallelLayout(tiny, ParallelLayout{2, 8, ep, true}, {8, 16}, tiny.canvasLength));
}

// TP beyond the KV heads replicates them (docs/parallelism.md, "Tensor parallelism beyond the KV
// heads"): the 26B's full layers have 2, its sliding layers 8, and it has 16 query heads.
TEST(ParallelLayout, AcceptsTensorParallelBeyondTheKvHeads) {
  const DiffusionGemmaConfig config = config26b();
  for (int64_t tp : {4, 8, 16})
    EXPECT_NO_THROW(checkParallelLayout(config, ParallelLayout{tp, 1, 1, true}, {128, 512}, config.canvasLength)) << tp;
  const DiffusionGemmaConfig tiny = tinyConfig();
  EXPECT_NO_THROW(checkParallelLayout(tiny, ParallelLayout{4, 2, 1, true}, {8, 16}, tiny.canvasLength));
}

TEST(ParallelLayout, KvHeadsMustSplitOrReplicateEvenly) {
  // More KV heads than ranks must be a multiple of them: 3 at TP 2.
  DiffusionGemmaConfig config = tinyConfig();
  config.layers[0].numQueryHeads = 6;
  config.layers[0].numKeyValueHeads = 3;
  config.layers[1].numQueryHeads = 6;
  expectRefused(config, ParallelLayout{2, 1, 1, true}, "--tp 2 does not divide layer 0 (sliding)'s KV heads (3)");
  // Fewer must divide TP: 4 KV heads at TP 6.
  config = tinyConfig();
  config.layers[0].numQueryHeads = 12;
  config.layers[0].numKeyValueHeads = 4;
  config.layers[1].numQueryHeads = 12;
  config.vocabSize = 258;
  expectRefused(config, ParallelLayout{6, 1, 1, false},
                "--tp 6: layer 0 (sliding)'s KV heads (4) neither divide TP nor are a multiple of it");
  // 2 and 3 KV heads at TP 6: each divides 6, but their replica blocks do not nest.
  config.layers[0].numQueryHeads = 6;
  config.layers[0].numKeyValueHeads = 3;
  config.layers[1].numQueryHeads = 6;
  config.layers[1].numKeyValueHeads = 2;
  expectRefused(config, ParallelLayout{6, 1, 1, false},
                "--tp 6: layer 0 (sliding)'s KV heads (3) and layer 1 (full attention)'s (2) are replicated over "
                "rank blocks that do not nest");
}

// Context parallelism (docs/parallelism.md, "Context parallelism"): world = CP x TP x DP, the CP
// ranks count as expert-data ranks, and 2 CP (times TP under SP) divides every bucket and the canvas.
TEST(ParallelLayout, ContextParallelSizesAndChunks) {
  const ParallelLayout layout{2, 2, 2, true, 2};
  EXPECT_EQ(layout.worldSize(), 8);
  EXPECT_EQ(layout.expertDataParallel(), 4);
  const DiffusionGemmaConfig tiny = tinyConfig();
  EXPECT_NO_THROW(checkParallelLayout(tiny, layout, {16, 32}, tiny.canvasLength));
  EXPECT_NO_THROW(checkParallelLayout(tiny, ParallelLayout{1, 1, 1, false, 2}, {12}, tiny.canvasLength));
  expectRefused(tiny, ParallelLayout{1, 1, 1, false, 2},
                "--cp 2 needs every prompt bucket to be a multiple of 4: --prompt-len 14", {12, 14});
  expectRefused(tiny, layout,
                "--cp 2 with --tp 2 --sp needs every prompt bucket to be a multiple of 8: --prompt-len 12", {12});
  expectRefused(tiny, ParallelLayout{1, 1, 1, false, 16},
                "needs the canvas length canvas_length (16) to be a multiple of 32", {32});
  expectRefused(tiny, ParallelLayout{1, 1, 1, false, 0}, "expected positive sizes", {32});
}

TEST(ParallelLayout, ExpertParallelMustDivideDataParallelAndTheExperts) {
  expectRefused(config26b(), ParallelLayout{1, 2, 4, false}, "--ep 4 does not divide the data-parallel size --dp (2)");
  expectRefused(tinyConfig(), ParallelLayout{1, 3, 3, false}, "--ep 3 does not divide the number of experts num_experts (8)");
  expectRefused(tinyConfig(), ParallelLayout{1, 2, 0, false}, "expected positive sizes");
}

TEST(ParallelLayout, TensorParallelMustDivideHeadsAndMlp) {
  DiffusionGemmaConfig config = tinyConfig();
  config.layers[0].numQueryHeads = 3;
  expectRefused(config, ParallelLayout{2, 1, 1, true}, "layer 0 (sliding)'s query heads (3)");
  config = tinyConfig();
  config.intermediateSize = 47;
  expectRefused(config, ParallelLayout{2, 1, 1, true}, "the dense MLP width intermediate_size (47)");
}

// docs/parallelism.md, "Vocabulary padding": a vocabulary TP does not divide is padded, not refused.
TEST(ParallelLayout, VocabularyIsPaddedToAMultipleOfTensorParallelAndAlignment) {
  DiffusionGemmaConfig config = tinyConfig();
  config.vocabSize = 255;
  EXPECT_NO_THROW(checkParallelLayout(config, ParallelLayout{2, 1, 1, true}, {64}, config.canvasLength));
  EXPECT_EQ(paddedVocabularySize(255, 2, 1), 256);
  EXPECT_EQ(paddedVocabularySize(253, 2, 1), 254);
  EXPECT_EQ(paddedVocabularySize(256, 2, 1), 256);  // divisible: unchanged
  EXPECT_EQ(paddedVocabularySize(253, 1, 1), 253);
  EXPECT_EQ(paddedVocabularySize(253, 1, 64), 256);
  EXPECT_EQ(paddedVocabularySize(253, 2, 3), 258);  // lcm(2, 3) = 6
  EXPECT_EQ(paddedVocabularySize(262144, 8, 128), 262144);
  EXPECT_EQ(paddedVocabularySize(262145, 8, 128), 262272);
}

TEST(ParallelLayout, SequenceParallelNeedsTensorParallelAndDivisibleLengths) {
  const DiffusionGemmaConfig config = tinyConfig();
  expectRefused(config, ParallelLayout{1, 1, 1, true}, "--sp: sequence parallelism splits over the TP ranks");
  expectRefused(config, ParallelLayout{2, 1, 1, true}, "--tp 2 does not divide the prompt bucket --prompt-len 7 (7)", {8, 7});
  DiffusionGemmaConfig oddCanvas = config;
  oddCanvas.canvasLength = 15;
  expectRefused(oddCanvas, ParallelLayout{2, 1, 1, true}, "the canvas length canvas_length (15)");
}

// Unlike Megatron Core, MoE layers run under TP without SP: every TP rank routes the whole tokens.
TEST(ParallelLayout, MoeUnderTensorParallelRunsWithoutSequenceParallel) {
  EXPECT_NO_THROW(checkParallelLayout(tinyConfig(), ParallelLayout{2, 1, 1, false}, {8}, 16));
}

}  // namespace
}  // namespace dgemma
