#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "models/diffusion_gemma/spec/Config.h"
#include "models/diffusion_gemma/spec/WeightSchema.h"
#include "runtime/io/Safetensors.h"
#include "test/unit/models/ModelTestSupport.h"

namespace dgemma {
namespace {

using model_test::inputErrorMessage;
using model_test::presetPath;

const ExpectedTensor* findExpected(const std::vector<ExpectedTensor>& tensors, const std::string& name) {
  for (const ExpectedTensor& tensor : tensors)
    if (tensor.name == name) return &tensor;
  return nullptr;
}

TEST(DiffusionGemmaWeightSchema, Released26BTextSchema) {
  const DiffusionGemmaConfig config = loadDiffusionGemmaConfig(presetPath("diffusiongemma-26b-a4b.json"));
  const std::vector<ExpectedTensor> tensors = expectedTextWeights(config);

  // docs/model.md, "The released checkpoint" counts 1047 tensors in the release: 630 (30 layers x 21 decoder suffixes, every
  // row of docs/model.md, "Text tensors" but v_proj) + 25 v_proj + 30 encoder copies of layer_scalar + 351 vision layer
  // tensors + 11 top-level tensors, 6 of them text (embedding, final norm, 4 self-conditioning) and
  // 5 vision. The text schema keeps one copy of each tensor, so it has 630 + 25 + 6 = 661 entries:
  // 1047 - 30 encoder layer_scalar copies - 351 - 5 vision top-level tensors.
  EXPECT_EQ(tensors.size(), 661u);
  std::set<std::string> names;
  int64_t layerScalars = 0;
  int64_t valueProjections = 0;
  double parameterCount = 0;
  for (const ExpectedTensor& tensor : tensors) {
    EXPECT_TRUE(names.insert(tensor.name).second) << "duplicate " << tensor.name;
    EXPECT_EQ(tensor.name.rfind("model.decoder.", 0), 0u) << tensor.name;
    layerScalars += tensor.isBuffer;
    valueProjections += tensor.name.find("v_proj") != std::string::npos;
    parameterCount += static_cast<double>(numElementsOf(tensor.shape));
  }
  EXPECT_EQ(layerScalars, 30);
  EXPECT_EQ(valueProjections, 25);
  // docs/model.md, "Parameter count": 25.25 B text parameters, counted from the same shapes.
  EXPECT_NEAR(parameterCount / 1e9, 25.25, 0.005);

  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"model.decoder.layers.0.self_attn.q_proj.weight", {4096, 2816}},
      {"model.decoder.layers.0.self_attn.k_proj.weight", {2048, 2816}},
      {"model.decoder.layers.0.self_attn.v_proj.weight", {2048, 2816}},
      {"model.decoder.layers.0.self_attn.o_proj.weight", {2816, 4096}},
      {"model.decoder.layers.0.self_attn.q_norm.weight", {256}},
      {"model.decoder.layers.5.self_attn.q_proj.weight", {8192, 2816}},
      {"model.decoder.layers.5.self_attn.k_proj.weight", {1024, 2816}},
      {"model.decoder.layers.5.self_attn.o_proj.weight", {2816, 8192}},
      {"model.decoder.layers.5.self_attn.k_norm.weight", {512}},
      {"model.decoder.layers.5.post_feedforward_layernorm_1.weight", {2816}},
      {"model.decoder.layers.5.mlp.gate_proj.weight", {2112, 2816}},
      {"model.decoder.layers.5.mlp.down_proj.weight", {2816, 2112}},
      {"model.decoder.layers.5.router.proj.weight", {128, 2816}},
      {"model.decoder.layers.5.router.scale", {2816}},
      {"model.decoder.layers.5.router.per_expert_scale", {128}},
      {"model.decoder.layers.29.experts.gate_up_proj", {128, 1408, 2816}},
      {"model.decoder.layers.29.experts.down_proj", {128, 2816, 704}},
      {"model.decoder.layers.29.layer_scalar", {1}},
      {"model.decoder.embed_tokens.weight", {262144, 2816}},
      {"model.decoder.norm.weight", {2816}},
      {"model.decoder.self_conditioning.pre_norm.weight", {2816}},
      {"model.decoder.self_conditioning.up_proj.weight", {2112, 2816}},
      {"model.decoder.self_conditioning.down_proj.weight", {2816, 2112}},
  };
  for (const auto& [name, shape] : shapes) {
    const ExpectedTensor* tensor = findExpected(tensors, name);
    ASSERT_NE(tensor, nullptr) << name;
    EXPECT_EQ(tensor->shape, shape) << name;
  }
  for (int64_t full : {5, 11, 17, 23, 29})
    EXPECT_EQ(findExpected(tensors, "model.decoder.layers." + std::to_string(full) + ".self_attn.v_proj.weight"),
              nullptr);
  EXPECT_TRUE(findExpected(tensors, "model.decoder.layers.3.layer_scalar")->isBuffer);
  EXPECT_FALSE(findExpected(tensors, "model.decoder.layers.3.router.scale")->isBuffer);
}

// Synthetic checkpoints of the tiny-cpu geometry: layer 0 sliding (with v_proj), layer 1 full.
class CheckpointResolutionTest : public model_test::ScratchDirectoryTest {
 protected:
  void SetUp() override {
    model_test::ScratchDirectoryTest::SetUp();
    config_ = loadDiffusionGemmaConfig(presetPath("tiny-cpu.json"));
    schema_ = expectedTextWeights(config_);
    // Each tensor gets its own values, so that a tensor read from the wrong place shows.
    for (size_t t = 0; t < schema_.size(); ++t)
      byCanonicalName_.emplace(schema_[t].name, filled(schema_[t].shape, static_cast<float>(t + 1)));
  }

  static HostTensor filled(const std::vector<int64_t>& shape, float seed) {
    HostTensor tensor(DType::F32, shape);
    for (int64_t i = 0; i < tensor.numElements(); ++i)
      tensor.as<float>()[i] = seed + 0.001f * static_cast<float>(i % 997);
    return tensor;
  }

  // The text tensors as a checkpoint would store them with the text stack under `textPrefix`; the
  // self-conditioning block always stays under model.decoder.
  std::map<std::string, HostTensor> textTensorsUnder(std::string_view textPrefix) const {
    std::map<std::string, HostTensor> tensors;
    for (const auto& [name, tensor] : byCanonicalName_) {
      const std::string suffix = name.substr(kDecoderPrefix.size());
      const bool decoderOnly = suffix.rfind("self_conditioning.", 0) == 0;
      tensors.emplace((decoderOnly ? std::string(kDecoderPrefix) : std::string(textPrefix)) + suffix, tensor);
    }
    return tensors;
  }

  std::string checkpointPath() const { return pathOf("checkpoint"); }

  SafetensorsDirectory writeCheckpoint(const std::map<std::string, HostTensor>& tensors) const {
    std::filesystem::create_directories(checkpointPath());
    std::vector<std::pair<std::string, const HostTensor*>> entries;
    for (const auto& [name, tensor] : tensors) entries.emplace_back(name, &tensor);
    writeSafetensors(checkpointPath() + "/model.safetensors", entries);
    return SafetensorsDirectory::open(checkpointPath());
  }

  std::string resolutionError(const std::map<std::string, HostTensor>& tensors) const {
    const SafetensorsDirectory checkpoint = writeCheckpoint(tensors);
    return inputErrorMessage([&] { resolveCheckpointNames(config_, checkpoint); });
  }

  // Each canonical name must resolve to `storedName(canonical)` holding this fixture's values.
  template <typename StoredName>
  void expectResolvedTo(const ResolvedCheckpoint& resolved, StoredName storedName) const {
    ASSERT_EQ(resolved.textTensors.size(), schema_.size());
    for (const ExpectedTensor& expected : schema_) {
      SCOPED_TRACE(expected.name);
      const SafetensorsLocation& location = resolved.textTensors.at(expected.name);
      EXPECT_EQ(location.entry->name, storedName(expected.name));
      const HostTensor& values = byCanonicalName_.at(expected.name);
      ASSERT_EQ(location.entry->bytes, values.data.size());
      EXPECT_EQ(std::memcmp(location.file->data(*location.entry), values.data.data(), values.data.size()), 0);
    }
  }

  static std::string toEncoderName(const std::string& canonical) {
    return std::string(kEncoderTextPrefix) + canonical.substr(kDecoderPrefix.size());
  }

  DiffusionGemmaConfig config_;
  std::vector<ExpectedTensor> schema_;
  std::map<std::string, HostTensor> byCanonicalName_;
};

TEST_F(CheckpointResolutionTest, TinySchemaHasOneValueProjection) {
  // Layer 0 (sliding): 21 suffixes + v_proj; layer 1 (full): 21; then embedding, norm, 4 self-conditioning.
  EXPECT_EQ(schema_.size(), 22u + 21u + 6u);
  EXPECT_NE(findExpected(schema_, "model.decoder.layers.0.self_attn.v_proj.weight"), nullptr);
  EXPECT_EQ(findExpected(schema_, "model.decoder.layers.1.self_attn.v_proj.weight"), nullptr);
  EXPECT_EQ(findExpected(schema_, "model.decoder.layers.1.self_attn.q_proj.weight")->shape,
            (std::vector<int64_t>{128, 48}));
  EXPECT_EQ(findExpected(schema_, "model.decoder.layers.1.experts.gate_up_proj")->shape,
            (std::vector<int64_t>{8, 32, 48}));
}

TEST_F(CheckpointResolutionTest, DecoderOnlyNamesLikeTheRelease) {
  std::map<std::string, HostTensor> tensors = textTensorsUnder(kDecoderPrefix);
  // The release also stores the encoder's layer_scalar buffers, and the vision tensors.
  for (int64_t layer = 0; layer < 2; ++layer) {
    const std::string canonical = "model.decoder.layers." + std::to_string(layer) + ".layer_scalar";
    tensors.emplace(toEncoderName(canonical), byCanonicalName_.at(canonical));
  }
  tensors.emplace("model.encoder.vision_tower.std_bias", filled({16}, 0.5f));
  tensors.emplace("model.encoder.embed_vision.embedding_projection.weight", filled({48, 16}, 0.25f));
  const SafetensorsDirectory checkpoint = writeCheckpoint(tensors);

  const ResolvedCheckpoint resolved = resolveCheckpointNames(config_, checkpoint);
  expectResolvedTo(resolved, [](const std::string& canonical) { return canonical; });
  EXPECT_EQ(resolved.visionTensorNames,
            (std::vector<std::string>{"model.encoder.embed_vision.embedding_projection.weight",
                                      "model.encoder.vision_tower.std_bias"}));
}

TEST_F(CheckpointResolutionTest, EncoderPrefixedNames) {
  const SafetensorsDirectory checkpoint = writeCheckpoint(textTensorsUnder(kEncoderTextPrefix));
  const ResolvedCheckpoint resolved = resolveCheckpointNames(config_, checkpoint);
  expectResolvedTo(resolved, [](const std::string& canonical) {
    return canonical.find(".self_conditioning.") != std::string::npos ? canonical : toEncoderName(canonical);
  });
  EXPECT_TRUE(resolved.visionTensorNames.empty());
}

TEST_F(CheckpointResolutionTest, BothCopiesEqualAndAnEqualLmHeadAreAccepted) {
  std::map<std::string, HostTensor> tensors = textTensorsUnder(kDecoderPrefix);
  tensors.merge(textTensorsUnder(kEncoderTextPrefix));
  tensors.emplace(std::string(kLmHeadName), byCanonicalName_.at("model.decoder.embed_tokens.weight"));
  const SafetensorsDirectory checkpoint = writeCheckpoint(tensors);
  expectResolvedTo(resolveCheckpointNames(config_, checkpoint), [](const std::string& canonical) { return canonical; });
}

TEST_F(CheckpointResolutionTest, BothCopiesMustBeBitIdentical) {
  std::map<std::string, HostTensor> tensors = textTensorsUnder(kDecoderPrefix);
  tensors.merge(textTensorsUnder(kEncoderTextPrefix));
  tensors.at("model.encoder.language_model.layers.0.mlp.up_proj.weight").as<float>()[5] += 1.0f;
  // The same values in another dtype are not the same bits either.
  tensors.at("model.encoder.language_model.norm.weight") =
      convertDType(byCanonicalName_.at("model.decoder.norm.weight"), DType::BF16, "norm");
  EXPECT_EQ(resolutionError(tensors),
            checkpointPath() +
                ": 2 problem(s) with the text weights:"
                "\n  tensors model.decoder.layers.0.mlp.up_proj.weight and "
                "model.encoder.language_model.layers.0.mlp.up_proj.weight differ; the encoder and decoder "
                "copies must be bit-identical"
                "\n  tensors model.decoder.norm.weight and model.encoder.language_model.norm.weight differ; "
                "the encoder and decoder copies must be bit-identical");
}

TEST_F(CheckpointResolutionTest, LmHeadMustEqualTheEmbedding) {
  std::map<std::string, HostTensor> tensors = textTensorsUnder(kDecoderPrefix);
  HostTensor head = byCanonicalName_.at("model.decoder.embed_tokens.weight");
  head.as<float>()[0] = -1.0f;
  tensors.emplace(std::string(kLmHeadName), head);
  EXPECT_EQ(resolutionError(tensors),
            checkpointPath() +
                ": 1 problem(s) with the text weights:"
                "\n  tensor lm_head.weight: differs from model.decoder.embed_tokens.weight; the LM head is "
                "tied to the embedding, so a stored copy must be bit-identical");
}

TEST_F(CheckpointResolutionTest, LayerScalarCopiesMustMatch) {
  std::map<std::string, HostTensor> tensors = textTensorsUnder(kDecoderPrefix);
  HostTensor encoderScalar(DType::F32, {1});
  encoderScalar.as<float>()[0] = 0.5f;
  tensors.emplace("model.encoder.language_model.layers.1.layer_scalar", encoderScalar);
  EXPECT_EQ(resolutionError(tensors),
            checkpointPath() +
                ": 1 problem(s) with the text weights:"
                "\n  tensors model.decoder.layers.1.layer_scalar and "
                "model.encoder.language_model.layers.1.layer_scalar differ; the encoder and decoder copies "
                "must be bit-identical");
}

TEST_F(CheckpointResolutionTest, FullLayerMustNotHaveValueProjection) {
  std::map<std::string, HostTensor> tensors = textTensorsUnder(kDecoderPrefix);
  tensors.emplace("model.decoder.layers.1.self_attn.v_proj.weight", filled({64, 48}, 9.0f));
  EXPECT_EQ(resolutionError(tensors),
            checkpointPath() +
                ": 1 problem(s) with the text weights:"
                "\n  unexpected tensor model.decoder.layers.1.self_attn.v_proj.weight (a full-attention "
                "layer has no v_proj: V comes from k_proj)");
}

TEST_F(CheckpointResolutionTest, AllMissingTensorsInOneMessage) {
  std::map<std::string, HostTensor> tensors = textTensorsUnder(kDecoderPrefix);
  tensors.erase("model.decoder.layers.0.self_attn.v_proj.weight");
  tensors.erase("model.decoder.layers.1.router.scale");
  tensors.erase("model.decoder.self_conditioning.up_proj.weight");
  EXPECT_EQ(resolutionError(tensors), checkpointPath() +
                                          ": 3 problem(s) with the text weights:"
                                          "\n  missing tensor model.decoder.layers.0.self_attn.v_proj.weight [32,48]"
                                          "\n  missing tensor model.decoder.layers.1.router.scale [48]"
                                          "\n  missing tensor model.decoder.self_conditioning.up_proj.weight [48,48]");
}

// A pre-training checkpoint has no self-conditioning block: a plan that does not read it (`needed`
// false) loads the rest; what it does read must still be there.
TEST_F(CheckpointResolutionTest, TensorsThePlanDoesNotReadMayBeMissing) {
  std::map<std::string, HostTensor> tensors = textTensorsUnder(kDecoderPrefix);
  for (const char* part : {"pre_norm", "gate_proj", "up_proj", "down_proj"})
    tensors.erase(std::string("model.decoder.self_conditioning.") + part + ".weight");
  tensors.erase("model.decoder.layers.1.router.scale");
  const SafetensorsDirectory checkpoint = writeCheckpoint(tensors);
  auto outsideSelfConditioning = [](const std::string& name) {
    return name.find(".self_conditioning.") == std::string::npos;
  };
  EXPECT_EQ(inputErrorMessage([&] { resolveCheckpointNames(config_, checkpoint, outsideSelfConditioning); }),
            checkpointPath() +
                ": 1 problem(s) with the text weights:"
                "\n  missing tensor model.decoder.layers.1.router.scale [48]");
  tensors.emplace("model.decoder.layers.1.router.scale", byCanonicalName_.at("model.decoder.layers.1.router.scale"));
  const SafetensorsDirectory complete = writeCheckpoint(tensors);
  const ResolvedCheckpoint resolved = resolveCheckpointNames(config_, complete, outsideSelfConditioning);
  EXPECT_EQ(resolved.textTensors.size(), schema_.size() - 4);
  EXPECT_EQ(resolved.textTensors.count("model.decoder.self_conditioning.up_proj.weight"), 0u);
}

TEST_F(CheckpointResolutionTest, MisShapedMistypedAndStrayTensorsAreListedTogether) {
  std::map<std::string, HostTensor> tensors = textTensorsUnder(kDecoderPrefix);
  tensors.at("model.decoder.layers.1.self_attn.q_proj.weight") = filled({64, 48}, 3.0f);
  tensors.at("model.decoder.layers.0.layer_scalar") = HostTensor(DType::I64, {1});
  // The self-conditioning block has no encoder copy, and there is no layer 2.
  tensors.emplace("model.encoder.language_model.self_conditioning.pre_norm.weight", filled({48}, 1.0f));
  tensors.emplace("model.decoder.layers.2.layer_scalar", filled({1}, 1.0f));
  EXPECT_EQ(resolutionError(tensors),
            checkpointPath() +
                ": 4 problem(s) with the text weights:"
                "\n  tensor model.decoder.layers.0.layer_scalar: expected a floating dtype, found i64 (in " + checkpointPath() +
                "/model.safetensors)\n  tensor model.decoder.layers.1.self_attn.q_proj.weight: expected shape [128,48], found [64,48] (in " +
                checkpointPath() + "/model.safetensors)\n  unexpected tensor model.decoder.layers.2.layer_scalar (in " + checkpointPath() +
                "/model.safetensors)\n  unexpected tensor model.encoder.language_model.self_conditioning.pre_norm.weight (in " +
                checkpointPath() + "/model.safetensors)");
}

// The 26B-A4B vision tower (docs/model.md, "Vision tensors"): 27 layers x 13 tensors, the patch
// projection, the position tables, std_bias and std_scale, and the projector: the 356 vision tensors
// of the release's 1047.
TEST(DiffusionGemmaWeightSchema, Released26BVisionSchema) {
  DiffusionGemmaConfig config = loadDiffusionGemmaConfig(presetPath("diffusiongemma-26b-a4b.json"));
  EXPECT_TRUE(expectedVisionWeights(config).empty());  // the preset has no vision_config
  config.hasVision = true;
  config.vision = VisionConfig{1152, 4304, 27, 16, 16, 72, 1e-6, 100.0, 16, 3, 10240, true};
  const std::vector<ExpectedTensor> tensors = expectedVisionWeights(config);
  EXPECT_EQ(tensors.size(), 27u * 13u + 5u);
  EXPECT_EQ(tensors.size() + expectedTextWeights(config).size() + 30u, 1047u);
  std::set<std::string> names;
  int64_t buffers = 0;
  for (const ExpectedTensor& tensor : tensors) {
    EXPECT_TRUE(names.insert(tensor.name).second) << "duplicate " << tensor.name;
    EXPECT_TRUE(tensor.name.rfind("model.encoder.vision_tower.", 0) == 0 ||
                tensor.name == "model.encoder.embed_vision.embedding_projection.weight")
        << tensor.name;
    buffers += tensor.isBuffer;
  }
  EXPECT_EQ(buffers, 2);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"model.encoder.vision_tower.patch_embedder.input_proj.weight", {1152, 768}},
      {"model.encoder.vision_tower.patch_embedder.position_embedding_table", {2, 10240, 1152}},
      {"model.encoder.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight", {1152, 1152}},
      {"model.encoder.vision_tower.encoder.layers.26.self_attn.o_proj.linear.weight", {1152, 1152}},
      {"model.encoder.vision_tower.encoder.layers.3.self_attn.k_norm.weight", {72}},
      {"model.encoder.vision_tower.encoder.layers.3.mlp.gate_proj.linear.weight", {4304, 1152}},
      {"model.encoder.vision_tower.encoder.layers.3.mlp.down_proj.linear.weight", {1152, 4304}},
      {"model.encoder.vision_tower.encoder.layers.3.post_feedforward_layernorm.weight", {1152}},
      {"model.encoder.vision_tower.std_scale", {1152}},
      {"model.encoder.embed_vision.embedding_projection.weight", {2816, 1152}},
  };
  for (const auto& [name, shape] : shapes) {
    const ExpectedTensor* tensor = findExpected(tensors, name);
    ASSERT_NE(tensor, nullptr) << name;
    EXPECT_EQ(tensor->shape, shape) << name;
  }
  config.vision.standardize = false;
  EXPECT_EQ(findExpected(expectedVisionWeights(config), "model.encoder.vision_tower.std_bias"), nullptr);
}

// With a vision_config the vision tensors are checked and mapped; without one they are only listed.
TEST_F(CheckpointResolutionTest, VisionTensorsOfAVisionConfig) {
  std::map<std::string, HostTensor> tensors = textTensorsUnder(kDecoderPrefix);
  tensors.emplace("model.encoder.vision_tower.std_bias", filled({16}, 0.5f));
  tensors.emplace("model.encoder.embed_vision.embedding_projection.weight", filled({48, 16}, 0.25f));
  config_.hasVision = true;
  config_.vision.hiddenSize = 16;
  config_.vision.standardize = true;
  {
    const SafetensorsDirectory checkpoint = writeCheckpoint(tensors);
    const ResolvedCheckpoint resolved = resolveCheckpointNames(config_, checkpoint);
    ASSERT_EQ(resolved.visionTensors.size(), 2u);
    EXPECT_EQ(resolved.visionTensors.at("model.encoder.vision_tower.std_bias").entry->shape, (std::vector<int64_t>{16}));
  }
  tensors.at("model.encoder.vision_tower.std_bias") = filled({8}, 0.5f);
  tensors.emplace("model.encoder.vision_tower.encoder.layers.99.mlp.up_proj.linear.weight", filled({2}, 0.5f));
  EXPECT_EQ(resolutionError(tensors),
            checkpointPath() + ": 2 problem(s) with the weights:"
                               "\n  unexpected tensor model.encoder.vision_tower.encoder.layers.99.mlp.up_proj.linear.weight "
                               "(not a vision tensor of this vision_config; in " + checkpointPath() +
                "/model.safetensors)\n  tensor model.encoder.vision_tower.std_bias: expected shape [16], found [8] (in " +
                checkpointPath() + "/model.safetensors)");
}

}  // namespace
}  // namespace dgemma
