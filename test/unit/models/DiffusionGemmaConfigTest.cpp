#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/diffusion_gemma/spec/Config.h"
#include "support/Error.h"
#include "test/unit/models/ModelTestSupport.h"

namespace dgemma {
namespace {

using model_test::inputErrorMessage;
using model_test::presetPath;
using nlohmann::json;

// A small, valid top-level config (the dgemma tiny geometry, in the per_layer_config spelling only)
// that each test bends one way.
json tinyTopLevelConfig() {
  return json{{"model_type", "diffusion_gemma"},
              {"text_config",
               {{"vocab_size", 256},
                {"hidden_size", 48},
                {"intermediate_size", 48},
                {"num_hidden_layers", 2},
                {"layer_types", {"sliding_attention", "full_attention"}},
                {"num_attention_heads", 4},
                {"num_key_value_heads", 2},
                {"head_dim", 16},
                {"per_layer_config", {{"1", {{"head_dim", 32}, {"num_key_value_heads", 2}}}}},
                {"num_experts", 8},
                {"top_k_experts", 2},
                {"moe_intermediate_size", 16},
                {"sliding_window", 8},
                {"use_bidirectional_attention", "vision"}}},
              {"image_token_id", 4},
              {"boi_token_id", 5},
              {"eoi_token_id", 6},
              {"canvas_length", 16}};
}

class DiffusionGemmaConfigTest : public model_test::ScratchDirectoryTest {
 protected:
  DiffusionGemmaConfig load(const json& value) { return loadDiffusionGemmaConfig(writeJson("config.json", value)); }
};

std::vector<int64_t> fullAttentionLayers(const DiffusionGemmaConfig& config) {
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < config.numHiddenLayers; ++i)
    if (config.isFullAttention(i)) indices.push_back(i);
  return indices;
}

TEST_F(DiffusionGemmaConfigTest, Released26BPresetDerivesTheLayerGeometry) {
  const DiffusionGemmaConfig config = loadDiffusionGemmaConfig(presetPath("diffusiongemma-26b-a4b.json"));
  EXPECT_TRUE(config.warnings.empty()) << config.warnings.front();
  EXPECT_EQ(config.vocabSize, 262144);
  EXPECT_EQ(config.hiddenSize, 2816);
  EXPECT_EQ(config.intermediateSize, 2112);
  EXPECT_EQ(config.numExperts, 128);
  EXPECT_EQ(config.topKExperts, 8);
  EXPECT_EQ(config.moeIntermediateSize, 704);
  EXPECT_EQ(config.slidingWindow, 1024);
  EXPECT_EQ(config.maxPositionEmbeddings, 262144);
  EXPECT_DOUBLE_EQ(config.rmsNormEps, 1e-6);
  EXPECT_DOUBLE_EQ(config.finalLogitSoftcapping, 30.0);
  EXPECT_TRUE(config.imageTokensBidirectional);
  EXPECT_EQ(config.padTokenId, 0);
  EXPECT_EQ(config.bosTokenId, 2);
  EXPECT_EQ(config.eosTokenIds, (std::vector<int64_t>{1, 106}));  // the top-level list wins
  EXPECT_EQ(config.boiTokenId, 255999);
  EXPECT_EQ(config.eoiTokenId, 258882);
  EXPECT_EQ(config.imageTokenId, 258880);
  EXPECT_EQ(config.canvasLength, 256);
  EXPECT_FALSE(config.hasVision);

  // The preset has no layer_types and no rope_parameters: both come from docs/model.md, "Config loading rules".
  ASSERT_EQ(config.numHiddenLayers, 30);
  ASSERT_EQ(config.layers.size(), 30u);
  EXPECT_EQ(fullAttentionLayers(config), (std::vector<int64_t>{5, 11, 17, 23, 29}));
  for (int64_t i = 0; i < 30; ++i) {
    SCOPED_TRACE("layer " + std::to_string(i));
    const LayerGeometry& layer = config.layer(i);
    EXPECT_EQ(layer.numQueryHeads, 16);
    if (config.isFullAttention(i)) {
      EXPECT_EQ(layer.headDim, 512);
      EXPECT_EQ(layer.numKeyValueHeads, 2);
      EXPECT_EQ(layer.rope.type, RopeType::Proportional);
      EXPECT_DOUBLE_EQ(layer.rope.theta, 1e6);
      EXPECT_DOUBLE_EQ(layer.rope.partialRotaryFactor, 0.25);
      EXPECT_EQ(config.ropeRotatedPairs(i), 64);
      EXPECT_FALSE(config.hasValueProjection(i));
      EXPECT_EQ(config.queryWidth(i), 8192);
      EXPECT_EQ(config.keyValueWidth(i), 1024);
      EXPECT_EQ(config.queryHeadsPerKeyValueHead(i), 8);
    } else {
      EXPECT_EQ(layer.headDim, 256);
      EXPECT_EQ(layer.numKeyValueHeads, 8);
      EXPECT_EQ(layer.rope.type, RopeType::Default);
      EXPECT_DOUBLE_EQ(layer.rope.theta, 1e4);
      EXPECT_EQ(config.ropeRotatedPairs(i), 128);
      EXPECT_TRUE(config.hasValueProjection(i));
      EXPECT_EQ(config.queryWidth(i), 4096);
      EXPECT_EQ(config.keyValueWidth(i), 2048);
      EXPECT_EQ(config.queryHeadsPerKeyValueHead(i), 2);
    }
  }
  EXPECT_THROW(config.layer(30), std::out_of_range);
}

TEST_F(DiffusionGemmaConfigTest, EmbeddingScaleIsSqrtHiddenRoundedToTheEmbeddingDType) {
  DiffusionGemmaConfig config;
  config.hiddenSize = 2816;                               // √2816 = 53.066
  EXPECT_EQ(config.embeddingScale(DType::BF16), 53.0);    // bf16 spacing at 53 is 0.25
  EXPECT_EQ(config.embeddingScale(DType::F16), 53.0625);  // f16 spacing at 53 is 1/32
  config.hiddenSize = 48;                                 // √48 = 6.9282
  EXPECT_EQ(config.embeddingScale(DType::BF16), 6.9375);
  EXPECT_EQ(config.initializerRange, 0.02);  // HF's default: the file does not set it
  EXPECT_EQ(config.embeddingScale(DType::F32), static_cast<double>(std::sqrt(48.0f)));
  EXPECT_NEAR(config.embeddingScale(DType::F32), 6.92820323, 1e-6);
  // HF's scale is a float32 tensor, so a float64 model sees the float32 value, not √48 in float64.
  EXPECT_EQ(config.embeddingScale(DType::F64), static_cast<double>(std::sqrt(48.0f)));
  EXPECT_NE(config.embeddingScale(DType::F64), std::sqrt(48.0));
  EXPECT_THROW(config.embeddingScale(DType::I64), std::invalid_argument);
}

TEST_F(DiffusionGemmaConfigTest, TinyCpuPresetLoads) {
  const DiffusionGemmaConfig config = loadDiffusionGemmaConfig(presetPath("tiny-cpu.json"));
  // Both full-layer spellings are written and agree, so nothing is worth a warning.
  EXPECT_TRUE(config.warnings.empty()) << config.warnings.front();
  EXPECT_EQ(config.vocabSize, 256);
  EXPECT_EQ(config.hiddenSize, 48);
  EXPECT_EQ(config.intermediateSize, 48);
  EXPECT_EQ(config.numExperts, 8);
  EXPECT_EQ(config.topKExperts, 2);
  EXPECT_EQ(config.moeIntermediateSize, 16);
  EXPECT_EQ(config.slidingWindow, 8);
  EXPECT_EQ(config.maxPositionEmbeddings, 131072);  // HF class default
  EXPECT_TRUE(config.imageTokensBidirectional);
  EXPECT_EQ(config.padTokenId, 0);
  EXPECT_EQ(config.eosTokenIds, (std::vector<int64_t>{1}));
  EXPECT_EQ(config.bosTokenId, 2);
  EXPECT_EQ(config.imageTokenId, 4);
  EXPECT_EQ(config.boiTokenId, 5);
  EXPECT_EQ(config.eoiTokenId, 6);
  EXPECT_EQ(config.canvasLength, 16);
  EXPECT_EQ(config.embeddingScale(DType::BF16), 6.9375);

  ASSERT_EQ(config.layers.size(), 2u);
  EXPECT_EQ(config.layer(0).type, AttentionLayerType::Sliding);
  EXPECT_EQ(config.layer(0).headDim, 16);
  EXPECT_EQ(config.layer(0).numKeyValueHeads, 2);
  EXPECT_EQ(config.ropeRotatedPairs(0), 8);
  EXPECT_EQ(config.layer(1).type, AttentionLayerType::Full);
  EXPECT_EQ(config.layer(1).headDim, 32);
  EXPECT_EQ(config.layer(1).numKeyValueHeads, 2);
  EXPECT_EQ(config.queryHeadsPerKeyValueHead(1), 2);
  EXPECT_EQ(config.ropeRotatedPairs(1), 4);  // int(0.25 * 32 // 2)
}

TEST_F(DiffusionGemmaConfigTest, DirectoryPathReadsItsConfigJson) {
  writeJson("config.json", tinyTopLevelConfig());
  EXPECT_EQ(loadDiffusionGemmaConfig(directory_.string()).hiddenSize, 48);
}

TEST_F(DiffusionGemmaConfigTest, PerLayerConfigWinsOverGlobalFields) {
  json value = tinyTopLevelConfig();
  value["text_config"]["global_head_dim"] = 64;
  value["text_config"]["num_global_key_value_heads"] = 1;
  value["text_config"]["per_layer_config"] = {{"1", {{"head_dim", 32}, {"num_key_value_heads", 4}}}};
  const DiffusionGemmaConfig config = load(value);
  EXPECT_EQ(config.layer(1).headDim, 32);
  EXPECT_EQ(config.layer(1).numKeyValueHeads, 4);
  EXPECT_EQ(config.layer(0).headDim, 16);  // an unlisted layer keeps the global fields
  EXPECT_EQ(
      config.warnings,
      (std::vector<std::string>{pathOf("config.json") +
                                ": text_config.global_head_dim: ignored because per_layer_config is present, and it "
                                "disagrees with full layer 1"}));
}

TEST_F(DiffusionGemmaConfigTest, GlobalFieldsApplyToFullLayersWithoutPerLayerConfig) {
  json value = tinyTopLevelConfig();
  value["text_config"].erase("per_layer_config");
  value["text_config"]["global_head_dim"] = 64;
  value["text_config"]["num_global_key_value_heads"] = 1;
  DiffusionGemmaConfig config = load(value);
  EXPECT_EQ(config.layer(1).headDim, 64);
  EXPECT_EQ(config.layer(1).numKeyValueHeads, 1);
  EXPECT_EQ(config.layer(0).headDim, 16);
  EXPECT_EQ(config.layer(0).numKeyValueHeads, 2);

  // Without either spelling HF still gives full layers global_head_dim's default 512, and without
  // num_global_key_value_heads they keep num_key_value_heads.
  value["text_config"].erase("global_head_dim");
  value["text_config"].erase("num_global_key_value_heads");
  config = load(value);
  EXPECT_EQ(config.layer(1).headDim, 512);
  EXPECT_EQ(config.layer(1).numKeyValueHeads, 2);
  EXPECT_EQ(config.ropeRotatedPairs(1), 64);
}

TEST_F(DiffusionGemmaConfigTest, MissingLayerTypesFollowTheFiveToOneRule) {
  json value = tinyTopLevelConfig();
  value["text_config"].erase("layer_types");
  value["text_config"].erase("per_layer_config");
  value["text_config"]["num_hidden_layers"] = 12;
  DiffusionGemmaConfig config = load(value);
  EXPECT_EQ(fullAttentionLayers(config), (std::vector<int64_t>{5, 11}));
  EXPECT_TRUE(config.warnings.empty()) << config.warnings.front();

  // With 8 layers the rule ends on a sliding layer, which is then forced to full attention.
  value["text_config"]["num_hidden_layers"] = 8;
  config = load(value);
  EXPECT_EQ(fullAttentionLayers(config), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(config.layer(7).headDim, 512);  // the forced layer gets the full-layer geometry
  EXPECT_EQ(config.layer(7).rope.type, RopeType::Proportional);
  EXPECT_EQ(config.warnings,
            (std::vector<std::string>{pathOf("config.json") +
                                      ": text_config.layer_types[7]: the last layer must use full_attention, got "
                                      "sliding_attention; forced to full_attention"}));
}

TEST_F(DiffusionGemmaConfigTest, ExplicitLastSlidingLayerIsForcedToFull) {
  json value = tinyTopLevelConfig();
  value["text_config"]["layer_types"] = {"full_attention", "sliding_attention"};
  value["text_config"]["per_layer_config"] = {{"0", {{"head_dim", 32}}}, {"1", {{"head_dim", 32}}}};
  const DiffusionGemmaConfig config = load(value);
  EXPECT_EQ(fullAttentionLayers(config), (std::vector<int64_t>{0, 1}));
  ASSERT_EQ(config.warnings.size(), 1u);
  EXPECT_NE(config.warnings[0].find("text_config.layer_types[1]: the last layer must use full_attention"),
            std::string::npos);
}

TEST_F(DiffusionGemmaConfigTest, ExplicitRopeParametersReplaceTheDefaults) {
  json value = tinyTopLevelConfig();
  value["text_config"]["rope_parameters"] = {
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 50000}}},
      {"full_attention", {{"rope_type", "proportional"}, {"rope_theta", 2e6}, {"partial_rotary_factor", 0.5}}}};
  const DiffusionGemmaConfig config = load(value);
  EXPECT_EQ(config.layer(0).rope.type, RopeType::Default);
  EXPECT_DOUBLE_EQ(config.layer(0).rope.theta, 50000.0);
  EXPECT_EQ(config.ropeRotatedPairs(0), 8);
  EXPECT_EQ(config.layer(1).rope.type, RopeType::Proportional);
  EXPECT_DOUBLE_EQ(config.layer(1).rope.theta, 2e6);
  EXPECT_EQ(config.ropeRotatedPairs(1), 8);  // int(0.5 * 32 // 2)
}

TEST_F(DiffusionGemmaConfigTest, UnknownFieldsAreIgnoredWithAWarning) {
  json value = tinyTopLevelConfig();
  // The HF tester config's extra kwargs (docs/model.md, "Config loading rules"), and a Gemma 4 field at its fixed value.
  value["text_config"]["hidden_act"] = "gelu";
  value["text_config"]["moe_num_shared_experts"] = 1;
  value["text_config"]["attention_k_eq_v"] = true;
  value["mm_tokens_per_image"] = 4;
  value["self_conditioning_size"] = 32;
  value["transformers_version"] = "5.0.0";  // bookkeeping: no warning
  const DiffusionGemmaConfig config = load(value);
  const std::string path = pathOf("config.json");
  EXPECT_EQ(std::set<std::string>(config.warnings.begin(), config.warnings.end()),
            (std::set<std::string>{
                path + ": text_config.attention_k_eq_v: a Gemma 4 field DiffusionGemma does not have, ignored",
                path + ": text_config.hidden_act: unknown field, ignored",
                path + ": text_config.moe_num_shared_experts: unknown field, ignored",
                path + ": mm_tokens_per_image: unknown field, ignored",
                path + ": self_conditioning_size: unknown field, ignored",
            }));
}

TEST_F(DiffusionGemmaConfigTest, BareTextConfigGetsTheTopLevelDefaults) {
  json text = tinyTopLevelConfig()["text_config"];
  text["model_type"] = "diffusion_gemma_text";
  DiffusionGemmaConfig config = load(text);
  EXPECT_EQ(config.hiddenSize, 48);
  EXPECT_EQ(config.layer(1).headDim, 32);
  EXPECT_EQ(config.canvasLength, 256);
  EXPECT_EQ(config.boiTokenId, 255999);
  EXPECT_EQ(config.eoiTokenId, 258882);
  EXPECT_EQ(config.imageTokenId, 258880);
  EXPECT_FALSE(config.hasVision);
  EXPECT_TRUE(config.warnings.empty()) << config.warnings.front();

  // Without model_type, the absence of text_config marks a bare text config too.
  text.erase("model_type");
  EXPECT_EQ(load(text).numExperts, 8);
}

// The absorbing token of masked-diffusion pre-training (docs/pretraining.md, "Objectives"): optional.
TEST_F(DiffusionGemmaConfigTest, MaskTokenIdIsReadWhenTheTextConfigNamesOne) {
  json value = tinyTopLevelConfig();
  EXPECT_FALSE(load(value).maskTokenId.has_value());
  value["text_config"]["mask_token_id"] = 7;
  const DiffusionGemmaConfig config = load(value);
  EXPECT_EQ(config.maskTokenId, 7);
  EXPECT_TRUE(config.warnings.empty()) << config.warnings.front();
}

TEST_F(DiffusionGemmaConfigTest, VisionConfigPresenceIsRecorded) {
  json value = tinyTopLevelConfig();
  EXPECT_FALSE(load(value).hasVision);
  value["vision_config"] = {{"model_type", "gemma4_vision"}, {"hidden_size", 16}};
  EXPECT_TRUE(load(value).hasVision);
  value["vision_config"] = nullptr;
  EXPECT_FALSE(load(value).hasVision);
}

TEST_F(DiffusionGemmaConfigTest, VisionConfigTakesHfDefaultsForAbsentFields) {
  json value = tinyTopLevelConfig();
  value["vision_config"] = {{"model_type", "gemma4_vision"}};
  const DiffusionGemmaConfig defaults = load(value);
  EXPECT_TRUE(defaults.warnings.empty()) << defaults.warnings.front();
  EXPECT_EQ(defaults.vision.hiddenSize, 768);
  EXPECT_EQ(defaults.vision.intermediateSize, 3072);
  EXPECT_EQ(defaults.vision.numHiddenLayers, 16);
  EXPECT_EQ(defaults.vision.numAttentionHeads, 12);
  EXPECT_EQ(defaults.vision.numKeyValueHeads, 12);
  EXPECT_EQ(defaults.vision.headDim, 64);
  EXPECT_DOUBLE_EQ(defaults.vision.rmsNormEps, 1e-6);
  EXPECT_DOUBLE_EQ(defaults.vision.ropeTheta, 100.0);
  EXPECT_EQ(defaults.vision.patchSize, 16);
  EXPECT_EQ(defaults.vision.poolingKernelSize, 3);
  EXPECT_EQ(defaults.vision.positionEmbeddingSize, 10240);
  EXPECT_FALSE(defaults.vision.standardize);
  EXPECT_EQ(defaults.maxSoftTokensPerImage, 280);
  EXPECT_EQ(defaults.vision.patchDim(), 768);
  EXPECT_EQ(defaults.imagePatches(), 2520);
}

// The 26B-A4B vision config as the release spells it (docs/model.md, "Vision config").
TEST_F(DiffusionGemmaConfigTest, VisionConfigReadsTheReleasedValues) {
  json value = tinyTopLevelConfig();
  value["vision_soft_tokens_per_image"] = 70;
  value["vision_config"] = {{"model_type", "gemma4_vision"},    {"hidden_size", 1152},
                            {"intermediate_size", 4304},         {"num_hidden_layers", 27},
                            {"num_attention_heads", 16},         {"num_key_value_heads", 16},
                            {"head_dim", 72},                    {"hidden_activation", "gelu_pytorch_tanh"},
                            {"rms_norm_eps", 1e-5},              {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 100.0}}},
                            {"patch_size", 14},                  {"pooling_kernel_size", 2},
                            {"position_embedding_size", 10240},  {"use_clipped_linears", false},
                            {"standardize", true},               {"default_output_length", 280},
                            {"attention_bias", false},           {"attention_dropout", 0.0},
                            {"max_position_embeddings", 131072}, {"initializer_range", 0.02}};
  const DiffusionGemmaConfig config = load(value);
  EXPECT_TRUE(config.warnings.empty()) << config.warnings.front();
  EXPECT_EQ(config.vision.hiddenSize, 1152);
  EXPECT_EQ(config.vision.intermediateSize, 4304);
  EXPECT_EQ(config.vision.numHiddenLayers, 27);
  EXPECT_EQ(config.vision.numAttentionHeads, 16);
  EXPECT_EQ(config.vision.headDim, 72);
  EXPECT_DOUBLE_EQ(config.vision.rmsNormEps, 1e-5);
  EXPECT_EQ(config.vision.patchSize, 14);
  EXPECT_EQ(config.vision.poolingKernelSize, 2);
  EXPECT_TRUE(config.vision.standardize);
  EXPECT_EQ(config.maxSoftTokensPerImage, 70);
  EXPECT_EQ(config.imagePatches(), 280);
  EXPECT_EQ(config.vision.patchDim(), 3 * 14 * 14);

  value["vision_config"]["rope_parameters"] = {{"rope_type", "axial"}, {"rope_theta", 50}};
  value["vision_config"]["surprise"] = 1;
  const DiffusionGemmaConfig axial = load(value);
  EXPECT_DOUBLE_EQ(axial.vision.ropeTheta, 50.0);
  ASSERT_EQ(axial.warnings.size(), 1u);
  EXPECT_NE(axial.warnings.front().find("vision_config.surprise: unknown field, ignored"), std::string::npos);
}

// The fuzz target's committed seeds (fuzz/corpus/config): each parses, or is refused with an
// InputError; the vision seed parses with its vision_config.
TEST(DiffusionGemmaConfigFuzzSeeds, ParseOrAreInputErrors) {
  const std::filesystem::path corpus = std::filesystem::path(DGEMMA_DIFFUSION_GEMMA_CONFIGS) / "../../../fuzz/corpus/config";
  int64_t seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(corpus)) {
    std::ifstream file(entry.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    ++seeds;
    try {
      const DiffusionGemmaConfig config = parseDiffusionGemmaConfigText(text, entry.path().filename().string());
      if (entry.path().filename() == "vision.json") {
        EXPECT_TRUE(config.hasVision);
        EXPECT_EQ(config.vision.hiddenSize, 16);
        EXPECT_EQ(config.maxSoftTokensPerImage, 70);
      }
    } catch (const InputError&) {
    }
  }
  EXPECT_GE(seeds, 8);
}

TEST_F(DiffusionGemmaConfigTest, UnreadableFilesAreInputErrors) {
  EXPECT_EQ(inputErrorMessage([&] { loadDiffusionGemmaConfig(pathOf("absent.json")); }),
            pathOf("absent.json") + ": cannot open the config file");
  const std::string notJson = writeText("broken.json", "{\"vocab_size\": ");
  EXPECT_EQ(inputErrorMessage([&] { loadDiffusionGemmaConfig(notJson); }).rfind(notJson + ": invalid JSON at byte ", 0), 0u);
  const std::string array = writeText("array.json", "[1, 2]");
  EXPECT_EQ(inputErrorMessage([&] { loadDiffusionGemmaConfig(array); }),
            array + ": expected a JSON object at the top level, got an array of 2 elements");
}

// Issue 15: a 100,000-deep array in an unknown field overflowed the stack when it was copied and
// dumped; the file is refused while it is read.
TEST_F(DiffusionGemmaConfigTest, DeeplyNestedValuesAreRefusedWhileReading) {
  std::string text = tinyTopLevelConfig().dump();
  text.pop_back();
  text += ", \"junk\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const std::string path = writeText("deep.json", text);
  EXPECT_EQ(inputErrorMessage([&] { loadDiffusionGemmaConfig(path); }), path + ": JSON nested deeper than 64 levels");
  EXPECT_EQ(inputErrorMessage([&] { parseDiffusionGemmaConfigText(text, "fuzz input"); }),
            "fuzz input: JSON nested deeper than 64 levels");
  EXPECT_EQ(parseDiffusionGemmaConfigText(tinyTopLevelConfig().dump(), "text").vocabSize, 256);
}

// One config the model cannot honour: how it is bent away from tinyTopLevelConfig(), and the
// message after "PATH: ".
struct RejectedConfig {
  std::string name;
  std::function<void(json&)> bend;
  std::string message;
};

std::ostream& operator<<(std::ostream& stream, const RejectedConfig& rejected) { return stream << rejected.name; }

class RejectedConfigTest : public model_test::ScratchDirectoryTest,
                           public ::testing::WithParamInterface<RejectedConfig> {};

TEST_P(RejectedConfigTest, NamesTheField) {
  json value = tinyTopLevelConfig();
  GetParam().bend(value);
  const std::string path = writeJson("config.json", value);
  EXPECT_EQ(inputErrorMessage([&] { loadDiffusionGemmaConfig(path); }), path + ": " + GetParam().message);
}

const std::string kDense = "DiffusionGemma has routed experts in every layer; a dense config cannot be built";

INSTANTIATE_TEST_SUITE_P(
    DiffusionGemmaConfig, RejectedConfigTest,
    ::testing::Values(
        RejectedConfig{"DenseWithoutNumExperts", [](json& v) { v["text_config"].erase("num_experts"); },
                       "text_config.num_experts: missing; " + kDense},
        RejectedConfig{"ZeroExperts", [](json& v) { v["text_config"]["num_experts"] = 0; },
                       "text_config.num_experts: expected an integer in [1, 4096], got 0"},
        RejectedConfig{"MissingMoeIntermediateSize", [](json& v) { v["text_config"].erase("moe_intermediate_size"); },
                       "text_config.moe_intermediate_size: missing; " + kDense},
        RejectedConfig{"TopKAboveNumExperts", [](json& v) { v["text_config"]["top_k_experts"] = 9; },
                       "text_config.top_k_experts: expected an integer in [1, 8] (num_experts), got 9"},
        RejectedConfig{"AudioConfig", [](json& v) { v["audio_config"] = {{"hidden_size", 8}}; },
                       "audio_config: expected null or absent (DiffusionGemma has no audio or video input), got "
                       "an object with 1 key"},
        RejectedConfig{"AudioTokenId", [](json& v) { v["audio_token_id"] = 7; },
                       "audio_token_id: expected null or absent (DiffusionGemma has no audio or video input), got 7"},
        RejectedConfig{"PerLayerEmbeddings", [](json& v) { v["text_config"]["hidden_size_per_layer_input"] = 256; },
                       "text_config.hidden_size_per_layer_input: expected 0 or null (DiffusionGemma has no per-layer "
                       "embeddings), got 256"},
        RejectedConfig{"SlidingKeyValueHeadsDoNotDivide", [](json& v) { v["text_config"]["num_key_value_heads"] = 3; },
                       "text_config.num_key_value_heads: expected a divisor of the 4 query heads "
                       "(text_config.num_attention_heads) of layer 0 (sliding_attention), got 3"},
        RejectedConfig{"FullKeyValueHeadsDoNotDivide",
                       [](json& v) { v["text_config"]["per_layer_config"]["1"]["num_key_value_heads"] = 3; },
                       "text_config.per_layer_config.1.num_key_value_heads: expected a divisor of the 4 query heads "
                       "(text_config.num_attention_heads) of layer 1 (full_attention), got 3"},
        RejectedConfig{"GlobalKeyValueHeadsDoNotDivide",
                       [](json& v) {
                         v["text_config"].erase("per_layer_config");
                         v["text_config"]["num_global_key_value_heads"] = 3;
                       },
                       "text_config.num_global_key_value_heads: expected a divisor of the 4 query heads "
                       "(text_config.num_attention_heads) of layer 1 (full_attention), got 3"},
        RejectedConfig{"UnknownLayerType", [](json& v) { v["text_config"]["layer_types"][0] = "chunked_attention"; },
                       "text_config.layer_types[0]: expected \"sliding_attention\" or \"full_attention\", got "
                       "\"chunked_attention\""},
        RejectedConfig{"LayerTypesOfWrongLength", [](json& v) { v["text_config"]["layer_types"] = {"full_attention"}; },
                       "text_config.layer_types: expected 2 entries (num_hidden_layers), got 1"},
        RejectedConfig{"ZeroHiddenSize", [](json& v) { v["text_config"]["hidden_size"] = 0; },
                       "text_config.hidden_size: expected an integer in [1, 65536], got 0"},
        RejectedConfig{"NegativeSlidingWindow", [](json& v) { v["text_config"]["sliding_window"] = -8; },
                       "text_config.sliding_window: expected an integer in [1, 16777216], got -8"},
        RejectedConfig{"VocabSizeAsString", [](json& v) { v["text_config"]["vocab_size"] = "256"; },
                       "text_config.vocab_size: expected an integer in [1, 16777216], got \"256\""},
        RejectedConfig{"FractionalLayerCount", [](json& v) { v["text_config"]["num_hidden_layers"] = 2.5; },
                       "text_config.num_hidden_layers: expected an integer in [1, 1024], got 2.5"},
        RejectedConfig{"OddHeadDim", [](json& v) { v["text_config"]["per_layer_config"]["1"]["head_dim"] = 15; },
                       "text_config.per_layer_config.1.head_dim: expected an even integer in [2, 8192], got 15"},
        RejectedConfig{
            "BidirectionalAll", [](json& v) { v["text_config"]["use_bidirectional_attention"] = "all"; },
            "text_config.use_bidirectional_attention: \"all\" is not supported (only \"vision\" or null), got "
            "\"all\""},
        RejectedConfig{
            "VisionClippedLinears", [](json& v) { v["vision_config"] = {{"use_clipped_linears", true}}; },
            "vision_config.use_clipped_linears: expected false (dgemma has no clipped vision linears), got true"},
        RejectedConfig{"VisionActivation", [](json& v) { v["vision_config"] = {{"hidden_activation", "gelu"}}; },
                       "vision_config.hidden_activation: expected \"gelu_pytorch_tanh\", got \"gelu\""},
        RejectedConfig{"VisionHeadDimNotAMultipleOfFour", [](json& v) { v["vision_config"] = {{"head_dim", 18}}; },
                       "vision_config.head_dim: expected a multiple of 4 in [4, 8192] (2-D RoPE rotates each half of "
                       "the head), got 18"},
        RejectedConfig{"VisionKeyValueHeadsDoNotDivide",
                       [](json& v) { v["vision_config"] = {{"num_attention_heads", 4}, {"num_key_value_heads", 3}}; },
                       "vision_config.num_key_value_heads: expected a divisor of the 4 query heads "
                       "(num_attention_heads), got 3"},
        RejectedConfig{"VisionZeroHiddenSize", [](json& v) { v["vision_config"] = {{"hidden_size", 0}}; },
                       "vision_config.hidden_size: expected an integer in [1, 65536], got 0"},
        RejectedConfig{"VisionZeroPatchSize", [](json& v) { v["vision_config"] = {{"patch_size", 0}}; },
                       "vision_config.patch_size: expected an integer in [1, 256], got 0"},
        RejectedConfig{"VisionPoolingKernelAsString",
                       [](json& v) { v["vision_config"] = {{"pooling_kernel_size", "3"}}; },
                       "vision_config.pooling_kernel_size: expected an integer in [1, 64], got \"3\""},
        RejectedConfig{"VisionPositionTableEmpty",
                       [](json& v) { v["vision_config"] = {{"position_embedding_size", 0}}; },
                       "vision_config.position_embedding_size: expected an integer in [1, 16777216], got 0"},
        RejectedConfig{"VisionStandardizeNotABool", [](json& v) { v["vision_config"] = {{"standardize", 1}}; },
                       "vision_config.standardize: expected true or false, got 1"},
        RejectedConfig{"VisionNegativeEps", [](json& v) { v["vision_config"] = {{"rms_norm_eps", -1}}; },
                       "vision_config.rms_norm_eps: expected a number in (0, 1.0], got -1"},
        RejectedConfig{"VisionRopeType",
                       [](json& v) { v["vision_config"] = {{"rope_parameters", {{"rope_type", "yarn"}}}}; },
                       "vision_config.rope_parameters.rope_type: expected \"default\" or \"axial\", got \"yarn\""},
        RejectedConfig{
            "VisionRopeScaling",
            [](json& v) { v["vision_config"] = {{"rope_parameters", {{"rope_theta", 100}, {"factor", 2}}}}; },
            "vision_config.rope_parameters.factor: not supported (the vision RoPE entry takes rope_type and "
            "rope_theta)"},
        RejectedConfig{"VisionModelType", [](json& v) { v["vision_config"] = {{"model_type", "siglip_vision_model"}}; },
                       "vision_config.model_type: expected \"gemma4_vision\", got \"siglip_vision_model\""},
        RejectedConfig{"SoftTokensPerImageZero", [](json& v) { v["vision_soft_tokens_per_image"] = 0; },
                       "vision_soft_tokens_per_image: expected an integer in [1, 65536], got 0"},
        RejectedConfig{"MissingTextConfig", [](json& v) { v.erase("text_config"); },
                       "text_config: missing; the default text config has no MoE sizes, so it cannot be built"},
        RejectedConfig{"TextConfigNotAnObject", [](json& v) { v["text_config"] = json::array(); },
                       "text_config: expected an object, got an array of 0 elements"},
        RejectedConfig{"OtherModelType", [](json& v) { v["model_type"] = "gemma4"; },
                       "model_type: expected \"diffusion_gemma\" or \"diffusion_gemma_text\", got \"gemma4\""},
        RejectedConfig{"RopeEntryMissingForAUsedLayerType",
                       [](json& v) {
                         v["text_config"]["rope_parameters"] = {
                             {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000}}}};
                       },
                       "text_config.rope_parameters.full_attention: missing (layer 1 is full_attention)"},
        RejectedConfig{"UnsupportedRopeType",
                       [](json& v) {
                         v["text_config"]["rope_parameters"] = {
                             {"sliding_attention", {{"rope_type", "yarn"}, {"rope_theta", 10000}}},
                             {"full_attention", {{"rope_type", "default"}, {"rope_theta", 10000}}}};
                       },
                       "text_config.rope_parameters.sliding_attention.rope_type: expected \"default\" or "
                       "\"proportional\", got \"yarn\""},
        RejectedConfig{"PartialRotaryAboveOne",
                       [](json& v) {
                         v["text_config"]["rope_parameters"] = {
                             {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000}}},
                             {"full_attention",
                              {{"rope_type", "proportional"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 1.5}}}};
                       },
                       "text_config.rope_parameters.full_attention.partial_rotary_factor: expected a number in (0, 1], "
                       "got 1.5"},
        RejectedConfig{"PerLayerIndexOutOfRange",
                       [](json& v) { v["text_config"]["per_layer_config"]["2"] = {{"head_dim", 32}}; },
                       "text_config.per_layer_config.2: expected a layer index in [0, 2)"},
        RejectedConfig{"PerLayerSlidingWindow",
                       [](json& v) { v["text_config"]["per_layer_config"]["1"]["sliding_window"] = 4; },
                       "text_config.per_layer_config.1.sliding_window: not supported per layer (only head_dim, "
                       "num_attention_heads and num_key_value_heads may vary)"},
        RejectedConfig{"UntiedEmbeddings", [](json& v) { v["tie_word_embeddings"] = false; },
                       "tie_word_embeddings: expected true (the encoder text stack, the decoder and the LM head share "
                       "weights), got false"},
        RejectedConfig{
            "Gemma4DenseLayers", [](json& v) { v["text_config"]["enable_moe_block"] = false; },
            "text_config.enable_moe_block: expected true (every DiffusionGemma layer has routed experts), got "
            "false"},
        RejectedConfig{"KeyValueSharing", [](json& v) { v["text_config"]["num_kv_shared_layers"] = 1; },
                       "text_config.num_kv_shared_layers: expected 0 (no layer reuses another layer's K/V), got 1"},
        RejectedConfig{"EosOutsideTheVocabulary", [](json& v) { v["eos_token_id"] = {1, 300}; },
                       "eos_token_id: expected a token id or a non-empty list of token ids in [0, 256), got 300"},
        RejectedConfig{"MaskTokenOutsideTheVocabulary", [](json& v) { v["text_config"]["mask_token_id"] = 256; },
                       "text_config.mask_token_id: expected an integer in [0, 256) (vocab_size), got 256"},
        RejectedConfig{"ImageTokenOutsideTheVocabulary", [](json& v) { v["image_token_id"] = 256; },
                       "image_token_id: expected an integer in [0, 256) (vocab_size), got 256"},
        RejectedConfig{"OtherActivation", [](json& v) { v["text_config"]["hidden_activation"] = "silu"; },
                       "text_config.hidden_activation: expected \"gelu_pytorch_tanh\", got \"silu\""},
        RejectedConfig{"AttentionBias", [](json& v) { v["text_config"]["attention_bias"] = true; },
                       "text_config.attention_bias: expected false (the projections have no bias), got true"},
        RejectedConfig{"InitializerRangeNotPositive", [](json& v) { v["text_config"]["initializer_range"] = -0.02; },
                       "text_config.initializer_range: expected a number in (0, 1.0], got -0.02"},
        RejectedConfig{"ZeroNormEps", [](json& v) { v["text_config"]["rms_norm_eps"] = 0; },
                       "text_config.rms_norm_eps: expected a number in (0, 1.0], got 0"},
        // Issue 15: 2^62 heads made autodiff divide by zero (SIGFPE); head_dim 2^32 compiled and
        // failed at run time, 2^62 ended in an MLIR verifier dump.
        RejectedConfig{"AttentionHeadsBeyondTheBound",
                       [](json& v) { v["text_config"]["num_attention_heads"] = int64_t{1} << 62; },
                       "text_config.num_attention_heads: expected an integer in [1, 1024], got 4611686018427387904"},
        RejectedConfig{"HeadDimBeyondTheBound", [](json& v) { v["text_config"]["head_dim"] = int64_t{1} << 32; },
                       "text_config.head_dim: expected an even integer in [2, 8192], got 4294967296"},
        RejectedConfig{
            "PerLayerHeadsBeyondTheBound",
            [](json& v) { v["text_config"]["per_layer_config"]["1"]["num_attention_heads"] = 1025; },
            "text_config.per_layer_config.1.num_attention_heads: expected an integer in [1, 1024], got 1025"},
        RejectedConfig{"VocabularyBeyondTheBound", [](json& v) { v["text_config"]["vocab_size"] = (1 << 24) + 1; },
                       "text_config.vocab_size: expected an integer in [1, 16777216], got 16777217"},
        RejectedConfig{"UnsignedBeyondInt64", [](json& v) { v["text_config"]["num_experts"] = UINT64_MAX; },
                       "text_config.num_experts: expected an integer in [1, 4096], got 18446744073709551615"},
        RejectedConfig{"CanvasBeyondTheBound", [](json& v) { v["canvas_length"] = 65537; },
                       "canvas_length: expected an integer in [1, 65536], got 65537"},
        RejectedConfig{"RopeThetaBeyondTheBound",
                       [](json& v) {
                         v["text_config"]["rope_parameters"] = {
                             {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e300}}},
                             {"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
                       },
                       "text_config.rope_parameters.sliding_attention.rope_theta: expected a number in (0, "
                       "1000000000000.0], got 1e+300"}),
    [](const ::testing::TestParamInfo<RejectedConfig>& info) { return info.param.name; });

}  // namespace
}  // namespace dgemma
