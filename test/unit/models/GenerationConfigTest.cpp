#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "models/diffusion_gemma/spec/GenerationConfig.h"
#include "test/unit/models/ModelTestSupport.h"

namespace dgemma {
namespace {

using model_test::inputErrorMessage;
using nlohmann::json;

// The released 26B file's spelling of the sampler settings, as HF writes them.
json releasedStyleConfig() {
  return json{{"max_new_tokens", 512},
              {"max_denoising_steps", 32},
              {"sampler_config", {{"entropy_bound", 0.2}, {"_cls_name", "EntropyBoundSamplerConfig"}}},
              {"t_min", 0.3},
              {"t_max", 0.9},
              {"stability_threshold", 2},
              {"confidence_threshold", 0.01},
              {"cache_implementation", "dynamic"},
              {"cache_config", nullptr},
              {"bos_token_id", 2},
              {"pad_token_id", 0},
              {"eos_token_id", {1, 106, 50}},
              {"return_dict_in_generate", true},
              {"_from_model_config", false},
              {"transformers_version", "5.9.0"}};
}

std::string errorOf(const json& root) {
  return inputErrorMessage([&] { parseGenerationConfig(root, "generation_config.json"); });
}

TEST(GenerationConfig, ReadsEveryHfKey) {
  DiffusionGemmaGenerationConfig config = parseGenerationConfig(releasedStyleConfig(), "g.json");
  EXPECT_EQ(config.maxNewTokens, 512);
  EXPECT_TRUE(config.maxNewTokensGiven);
  EXPECT_EQ(config.maxDenoisingSteps, 32);
  EXPECT_DOUBLE_EQ(config.entropyBound, 0.2);
  EXPECT_DOUBLE_EQ(config.tMin, 0.3);
  EXPECT_DOUBLE_EQ(config.tMax, 0.9);
  EXPECT_EQ(config.stabilityThreshold, 2);
  EXPECT_DOUBLE_EQ(config.confidenceThreshold, 0.01);
  EXPECT_EQ(config.eosTokenIds, (std::vector<int64_t>{1, 106, 50}));
  EXPECT_EQ(config.padTokenId, 0);
  EXPECT_EQ(config.bosTokenId, 2);
}

// The demo model's directory carries its own sampler budget (docs/generation.md, "Defaults and
// settings"); dgemma-compile --mode infer --model DIR finds it beside config.json.
TEST(GenerationConfig, DemoModelDirectoryCarriesItsEntropyBound) {
  const std::optional<DiffusionGemmaGenerationConfig> config =
      loadGenerationConfigBeside(DGEMMA_DIFFUSION_GEMMA_CONFIGS "/demo");
  ASSERT_TRUE(config.has_value());
  EXPECT_EQ(config->entropyBound, 1e-4);
  EXPECT_EQ(config->maxNewTokens, 4);  // one canvas: three digits and EOS
  EXPECT_EQ(config->maxDenoisingSteps, 48);
}

TEST(GenerationConfig, NullAndAbsentKeysTakeHfDefaults) {
  json root = {{"max_new_tokens", nullptr}, {"sampler_config", nullptr}, {"t_min", nullptr}, {"eos_token_id", 7}};
  DiffusionGemmaGenerationConfig config = parseGenerationConfig(root, "g.json");
  EXPECT_EQ(config.maxNewTokens, 256);
  EXPECT_FALSE(config.maxNewTokensGiven);
  EXPECT_EQ(config.maxDenoisingSteps, 48);
  EXPECT_DOUBLE_EQ(config.entropyBound, 0.1);
  EXPECT_DOUBLE_EQ(config.tMin, 0.4);
  EXPECT_DOUBLE_EQ(config.tMax, 0.8);
  EXPECT_EQ(config.stabilityThreshold, 1);
  EXPECT_DOUBLE_EQ(config.confidenceThreshold, 0.005);
  EXPECT_EQ(config.eosTokenIds, (std::vector<int64_t>{7}));  // one id becomes a list
  EXPECT_FALSE(config.padTokenId.has_value());
}

TEST(GenerationConfig, RejectsUnknownKeysNamingThem) {
  json root = releasedStyleConfig();
  root["top_k"] = 50;
  EXPECT_EQ(errorOf(root), "generation_config.json: top_k: unknown key (HF's generation config does not accept it either)");
  root = releasedStyleConfig();
  root["sampler_config"]["threshold"] = 1.0;
  EXPECT_EQ(errorOf(root),
            "generation_config.json: sampler_config.threshold: unknown key (HF's generation config does not accept it either)");
}

TEST(GenerationConfig, NamesTheFieldOfABadValue) {
  auto with = [](const std::string& key, const json& value) {
    json root = releasedStyleConfig();
    root[key] = value;
    return errorOf(root);
  };
  EXPECT_EQ(with("max_new_tokens", 0), "generation_config.json: max_new_tokens: expected an integer in [1, 16777216], got 0");
  EXPECT_EQ(with("max_denoising_steps", "48"), "generation_config.json: max_denoising_steps: expected an integer in [1, 16777216], got \"48\"");
  EXPECT_EQ(with("t_max", 0.2), "generation_config.json: t_max: expected a number above t_min (0.3), got 0.2");
  EXPECT_EQ(with("t_min", -0.1), "generation_config.json: t_min: expected a number >= 0, got -0.1");
  EXPECT_EQ(with("confidence_threshold", 1),
            "generation_config.json: confidence_threshold: expected a finite number with a decimal point (HF requires a float), got 1");
  EXPECT_EQ(with("stability_threshold", -1), "generation_config.json: stability_threshold: expected an integer in [0, 16777216], got -1");
  EXPECT_EQ(with("eos_token_id", json{1, "x"}),
            "generation_config.json: eos_token_id[1]: expected an integer in [0, 16777216], got \"x\"");
  EXPECT_EQ(with("return_dict_in_generate", 1),
            "generation_config.json: return_dict_in_generate: expected true or false or null, got 1");
  EXPECT_EQ(with("sampler_config", json{{"entropy_bound", 0.0}}),
            "generation_config.json: sampler_config.entropy_bound: expected a number > 0, got 0.0");
  EXPECT_EQ(with("sampler_config", json{{"entropy_bound", 0.1}, {"_cls_name", "TopK"}}),
            "generation_config.json: sampler_config._cls_name: expected \"EntropyBoundSamplerConfig\" (the only sampler), got \"TopK\"");
}

TEST(GenerationConfig, TokenIdsMustBeInTheModelsVocabulary) {
  auto errorWith = [](const std::string& key, const json& value) -> std::string {
    json root = releasedStyleConfig();
    root[key] = value;
    try {
      checkGenerationTokenIds(parseGenerationConfig(root, "generation_config.json"), 256);
    } catch (const InputError& error) {
      return error.what();
    }
    return "accepted";
  };
  EXPECT_EQ(errorWith("eos_token_id", 1), "accepted");
  EXPECT_EQ(errorWith("eos_token_id", 99999),
            "generation_config.json: eos_token_id: token id 99999 is outside the model's vocabulary [0, 256) (config.json vocab_size)");
  EXPECT_EQ(errorWith("eos_token_id", json{1, 256}),
            "generation_config.json: eos_token_id[1]: token id 256 is outside the model's vocabulary [0, 256) (config.json vocab_size)");
  EXPECT_EQ(errorWith("eos_token_id", json::array()),
            "generation_config.json: eos_token_id: expected a token id or a non-empty list of them, got [] (generation would "
            "never stop at an end of sequence)");
  EXPECT_EQ(errorWith("pad_token_id", 1000),
            "generation_config.json: pad_token_id: token id 1000 is outside the model's vocabulary [0, 256) (config.json vocab_size)");
  EXPECT_EQ(errorWith("bos_token_id", 300),
            "generation_config.json: bos_token_id: token id 300 is outside the model's vocabulary [0, 256) (config.json vocab_size)");
}

TEST(GenerationConfig, AcceptsOnlyCachesThatComputeWhatTheDynamicCacheComputes) {
  json root = releasedStyleConfig();
  root["cache_implementation"] = "offloaded";
  EXPECT_NO_THROW(parseGenerationConfig(root, "g.json"));
  root["cache_implementation"] = "static";
  EXPECT_NE(errorOf(root).find("cache_implementation: \"static\" is not supported"), std::string::npos);
  root["cache_implementation"] = "paged";
  EXPECT_EQ(errorOf(root), "generation_config.json: cache_implementation: unknown cache implementation \"paged\"");
}

class GenerationConfigFileTest : public model_test::ScratchDirectoryTest {};

TEST_F(GenerationConfigFileTest, IsFoundBesideTheModelDirectoryOrItsConfigJson) {
  EXPECT_FALSE(loadGenerationConfigBeside(directory_.string()).has_value());
  writeJson("generation_config.json", json{{"max_new_tokens", 64}});
  const std::string configPath = writeJson("config.json", json::object());
  ASSERT_TRUE(loadGenerationConfigBeside(directory_.string()).has_value());
  EXPECT_EQ(loadGenerationConfigBeside(directory_.string())->maxNewTokens, 64);
  EXPECT_EQ(loadGenerationConfigBeside(configPath)->maxNewTokens, 64);
  writeText("generation_config.json", "{");
  EXPECT_NE(inputErrorMessage([&] { loadGenerationConfigBeside(configPath); }).find("generation_config.json: invalid JSON at byte"),
            std::string::npos);
}

}  // namespace
}  // namespace dgemma
