// DiffusionGemma's LoRA adapters in PEFT's format (docs/training.md, "PEFT format"): the key
// names and layouts PEFT 0.21.2 uses on transformers' model, the config, a round trip through the
// directory, the merge deltas, and the errors for every way a directory can disagree with a plan.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include <nlohmann/json.hpp>

#include "runtime/io/Safetensors.h"
#include "runtime/model/diffusion_gemma/HfExport.h"
#include "runtime/model/diffusion_gemma/PeftAdapter.h"
#include "support/AtomicFile.h"
#include "support/Error.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;
using test::expectInputError;
using test::mentions;
using test::TempDir;

const std::string kQ = "model.decoder.layers.0.self_attn.q_proj";
const std::string kGateUp = "model.decoder.layers.1.experts.gate_up_proj";
const std::string kDown = "model.decoder.layers.1.experts.down_proj";

AdapterSettings settingsFor(std::vector<std::string> targets, int64_t rank = 2, double alpha = 4.0) {
  AdapterSettings settings;
  settings.rank = rank;
  settings.alpha = alpha;
  settings.targets = std::move(targets);
  return settings;
}

// Elements 1, 2, 3, ... times `scale`, so that every element and its place are told apart.
HostTensor counting(std::vector<int64_t> shape, float scale = 1.0f) {
  HostTensor tensor(DType::F32, std::move(shape));
  for (int64_t i = 0; i < tensor.numElements(); ++i) tensor.as<float>()[i] = scale * static_cast<float>(i + 1);
  return tensor;
}

// One attention adapter (rank 2, in 3, out 5) and the experts of a layer (E 2, H 3, I 2).
std::map<std::string, HostTensor> sampleTensors() {
  return {{kQ + ".lora_A.weight", counting({2, 3})},  {kQ + ".lora_B.weight", counting({5, 2}, 0.5f)},
          {kGateUp + ".lora_A", counting({2, 2, 3})}, {kGateUp + ".lora_B", counting({2, 4, 2}, 0.25f)},
          {kDown + ".lora_A", counting({2, 2, 2})},   {kDown + ".lora_B", counting({2, 3, 2}, 2.0f)}};
}

std::map<std::string, std::vector<int64_t>> shapesOf(const std::map<std::string, HostTensor>& tensors) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& [name, tensor] : tensors) shapes[name] = tensor.shape;
  return shapes;
}

TEST(PeftAdapterTest, KeysFollowPeftsModulePathsForBothTiedCopies) {
  const AdapterSettings both = settingsFor({"q_proj", "experts.gate_up_proj", "experts.down_proj"});
  PeftKeys q = peftKeysOf(kQ + ".lora_A.weight", both);
  EXPECT_EQ(q.decoderKey, "base_model.model.model.decoder.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(q.encoderKey, "base_model.model.model.encoder.language_model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(q.layout, PeftLayout::Linear);
  // Both expert tensors targeted: PEFT nests the wrappers, gate_up_proj's innermost.
  PeftKeys gateUp = peftKeysOf(kGateUp + ".lora_B", both);
  EXPECT_EQ(gateUp.decoderKey, "base_model.model.model.decoder.layers.1.experts.base_layer.lora_B.weight");
  EXPECT_EQ(gateUp.layout, PeftLayout::ExpertB);
  PeftKeys down = peftKeysOf(kDown + ".lora_A", both);
  EXPECT_EQ(down.decoderKey, "base_model.model.model.decoder.layers.1.experts.lora_A.weight");
  EXPECT_EQ(down.encoderKey, "base_model.model.model.encoder.language_model.layers.1.experts.lora_A.weight");
  EXPECT_EQ(down.layout, PeftLayout::ExpertA);
  // One expert tensor alone: no nesting.
  EXPECT_EQ(peftKeysOf(kGateUp + ".lora_A", settingsFor({"experts.gate_up_proj"})).decoderKey,
            "base_model.model.model.decoder.layers.1.experts.lora_A.weight");

  EXPECT_TRUE(isLoraParameterName(kDown + ".lora_B"));
  EXPECT_TRUE(isLoraParameterName(kQ + ".lora_B.weight"));
  EXPECT_FALSE(isLoraParameterName(kQ + ".weight"));
  EXPECT_FALSE(isLoraParameterName(kGateUp));
  // A train plan's gradient buffers are named after the adapters, and are none.
  EXPECT_FALSE(isLoraParameterName("grad/" + kQ + ".lora_A.weight"));
  EXPECT_FALSE(isLoraParameterName("grad/" + kDown + ".lora_B"));
  EXPECT_TRUE(mentions(expectInputError([&] { peftKeysOf(kQ + ".weight", both); }), "expected model.decoder.<module>"));
}

TEST(PeftAdapterTest, ExpertLayoutsAreExpertMajorRowsOfAAndInterleavedColumnsOfB) {
  // A [E=2, r=2, in=3] -> [E*r, in]: the same elements.
  const HostTensor a = counting({2, 2, 3});
  const HostTensor peftA = toPeftLayout(a, PeftLayout::ExpertA);
  EXPECT_EQ(peftA.shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(peftA.data, a.data);
  // B [E=2, out=3, r=2] -> [out, r*E] with column k*E + e = expert e's column k (PEFT reshapes
  // lora_B to [out, r, E]).
  const HostTensor b = counting({2, 3, 2});
  const HostTensor peftB = toPeftLayout(b, PeftLayout::ExpertB);
  ASSERT_EQ(peftB.shape, (std::vector<int64_t>{3, 4}));
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t o = 0; o < 3; ++o)
      for (int64_t k = 0; k < 2; ++k)
        EXPECT_EQ(peftB.as<float>()[o * 4 + k * 2 + e], b.as<float>()[(e * 3 + o) * 2 + k]) << e << o << k;
  EXPECT_EQ(fromPeftLayout(peftB, PeftLayout::ExpertB, b.shape).data, b.data);
}

TEST(PeftAdapterTest, TargetModulesMatchExactlyTheTextLayersModules) {
  const nlohmann::json modules = peftTargetModules(settingsFor({"q_proj", "v_proj", "down_proj", "router.proj"}));
  ASSERT_TRUE(modules.is_string());
  const std::regex regex(modules.get<std::string>());  // PEFT uses re.fullmatch
  for (const char* wrapped :
       {"model.decoder.layers.0.self_attn.q_proj", "model.encoder.language_model.layers.11.self_attn.v_proj",
        "model.decoder.layers.3.mlp.down_proj", "model.decoder.layers.3.router.proj"})
    EXPECT_TRUE(std::regex_match(wrapped, regex)) << wrapped;
  for (const char* left :
       {"model.decoder.layers.0.self_attn.k_proj", "model.encoder.vision_tower.encoder.layers.0.self_attn.q_proj",
        "model.decoder.self_conditioning.down_proj", "model.decoder.layers.3.mlp.gate_proj",
        "model.decoder.layers.3.experts", "model.decoder.layers.0.self_attn.q_proj.lora_A"})
    EXPECT_FALSE(std::regex_match(left, regex)) << left;
  EXPECT_TRUE(peftTargetModules(settingsFor({"experts.down_proj"})).is_null());

  const nlohmann::ordered_json config =
      peftAdapterConfig(settingsFor({"q_proj", "experts.down_proj"}, 8, 16.0), "base/dir");
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 8);
  EXPECT_TRUE(config["lora_alpha"].is_number_integer());
  EXPECT_EQ(config["lora_alpha"], 16);
  EXPECT_EQ(config["target_parameters"], nlohmann::ordered_json::array({"experts.down_proj"}));
  EXPECT_EQ(config["base_model_name_or_path"], "base/dir");
  EXPECT_EQ(config["bias"], "none");
  EXPECT_TRUE(config["task_type"].is_null());
}

TEST(PeftAdapterTest, DirectoryRoundTripsEveryAdapterBitExactly) {
  TempDir dir;
  const AdapterSettings settings = settingsFor({"q_proj", "experts.gate_up_proj", "experts.down_proj"});
  const std::map<std::string, HostTensor> tensors = sampleTensors();
  writePeftAdapterDirectory(dir.path.string(), settings, "base", tensors);
  EXPECT_TRUE(fs::exists(dir.path / kPeftConfigFileName));
  const SafetensorsFile file = SafetensorsFile::open((dir.path / kPeftWeightsFileName).string());
  EXPECT_EQ(file.entries().size(), 2 * tensors.size());
  EXPECT_EQ(file.metadata().at("format"), "pt");

  const AdapterSettings read = readPeftAdapterSettings(dir.path.string());
  EXPECT_EQ(read.rank, 2);
  EXPECT_EQ(read.alpha, 4.0);
  EXPECT_EQ(read.targets, settings.targets);
  const std::map<std::string, HostTensor> back =
      readPeftAdapterDirectory(dir.path.string(), settings, shapesOf(tensors));
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    EXPECT_EQ(back.at(name).shape, tensor.shape) << name;
    EXPECT_EQ(back.at(name).data, tensor.data) << name;
  }
}

TEST(PeftAdapterTest, MergeDeltasAreScaledBTimesAPerWeightAndPerExpert) {
  TempDir dir;
  const AdapterSettings settings = settingsFor({"q_proj", "experts.gate_up_proj", "experts.down_proj"});
  const std::map<std::string, HostTensor> tensors = sampleTensors();
  writePeftAdapterDirectory(dir.path.string(), settings, "base", tensors);
  const std::map<std::string, HostTensor> deltas = peftMergeDeltas(dir.path.string());
  ASSERT_EQ(deltas.size(), 3u);  // one per tied weight, not one per copy
  const double scale = 4.0 / 2.0;
  const HostTensor& q = deltas.at(kQ + ".weight");
  ASSERT_EQ(q.shape, (std::vector<int64_t>{5, 3}));
  const HostTensor &qa = tensors.at(kQ + ".lora_A.weight"), &qb = tensors.at(kQ + ".lora_B.weight");
  for (int o = 0; o < 5; ++o)
    for (int i = 0; i < 3; ++i) {
      double sum = 0;
      for (int k = 0; k < 2; ++k) sum += double(qb.as<float>()[o * 2 + k]) * qa.as<float>()[k * 3 + i];
      EXPECT_DOUBLE_EQ(q.as<double>()[o * 3 + i], scale * sum);
    }
  for (const auto& [weight, out, in] : {std::tuple{kGateUp, 4, 3}, std::tuple{kDown, 3, 2}}) {
    const HostTensor& delta = deltas.at(weight);
    ASSERT_EQ(delta.shape, (std::vector<int64_t>{2, out, in})) << weight;
    const HostTensor &a = tensors.at(weight + ".lora_A"), &b = tensors.at(weight + ".lora_B");
    for (int e = 0; e < 2; ++e)
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) {
          double sum = 0;
          for (int k = 0; k < 2; ++k)
            sum += double(b.as<float>()[(e * out + o) * 2 + k]) * a.as<float>()[(e * 2 + k) * in + i];
          EXPECT_DOUBLE_EQ(delta.as<double>()[(e * out + o) * in + i], scale * sum) << weight << e << o << i;
        }
  }
}

// The directory of `tensors` with the config edited by `edit` and the tensors (by PEFT key) by `editTensors`.
void writeEdited(const fs::path& dir, const AdapterSettings& settings,
                 const std::function<void(nlohmann::ordered_json&)>& edit,
                 const std::function<void(std::map<std::string, HostTensor>&)>& editTensors = {}) {
  writePeftAdapterDirectory(dir.string(), settings, "base", sampleTensors());
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(readWholeFile((dir / kPeftConfigFileName).string()));
  edit(config);
  writeFileAtomically((dir / kPeftConfigFileName).string(), config.dump(2));
  if (!editTensors) return;
  const SafetensorsFile file = SafetensorsFile::open((dir / kPeftWeightsFileName).string());
  std::map<std::string, HostTensor> byKey;
  for (const SafetensorsEntry& entry : file.entries()) byKey[entry.name] = file.read(entry.name);
  editTensors(byKey);
  std::vector<std::pair<std::string, const HostTensor*>> ordered;
  for (const auto& [key, tensor] : byKey) ordered.emplace_back(key, &tensor);
  writeSafetensors((dir / kPeftWeightsFileName).string(), ordered);
}

TEST(PeftAdapterTest, ADirectoryThatDisagreesWithThePlanIsRefusedNamingFileAndField) {
  const AdapterSettings settings = settingsFor({"q_proj", "experts.gate_up_proj", "experts.down_proj"});
  const std::map<std::string, std::vector<int64_t>> shapes = shapesOf(sampleTensors());
  const std::string qA = "base_model.model.model.decoder.layers.0.self_attn.q_proj.lora_A.weight";
  const std::string qAEncoder = "base_model.model.model.encoder.language_model.layers.0.self_attn.q_proj.lora_A.weight";
  struct Case {
    std::string name;
    std::function<void(nlohmann::ordered_json&)> edit;
    std::function<void(std::map<std::string, HostTensor>&)> editTensors;
    std::vector<std::string> mentioned;
  };
  const std::vector<Case> cases = {
      {"rank", [](auto& c) { c["r"] = 4; }, {}, {"adapter_config.json: r: the adapter has rank 4, the plan 2"}},
      {"alpha", [](auto& c) { c["lora_alpha"] = 8; }, {}, {"adapter_config.json: lora_alpha: the adapter has 8"}},
      {"targets",
       [](auto& c) { c["target_parameters"] = {"experts.down_proj"}; },
       {},
       {"adapter_config.json: target_modules/target_parameters: the adapter targets experts.down_proj,q_proj"}},
      {"regex",
       [](auto& c) { c["target_modules"] = ".*q_proj"; },
       {},
       {"adapter_config.json: target_modules: expected"}},
      {"type",
       [](auto& c) { c["peft_type"] = "IA3"; },
       {},
       {"adapter_config.json: peft_type: expected \"LORA\", got \"IA3\""}},
      {"rslora", [](auto& c) { c["use_rslora"] = true; }, {}, {"adapter_config.json: use_rslora: expected false"}},
      {"pattern",
       [](auto& c) { c["rank_pattern"] = {{"q_proj", 4}}; },
       {},
       {"adapter_config.json: rank_pattern: expected {}"}},
      {"missing",
       [](auto&) {},
       [&](auto& t) { t.erase(qA); },
       {"adapter_model.safetensors: missing key " + qA + " [2,3]"}},
      {"unexpected",
       [](auto&) {},
       [&](auto& t) { t["base_model.model.model.decoder.layers.0.mlp.up_proj.lora_A.weight"] = counting({2, 3}); },
       {"adapter_model.safetensors: unexpected key base_model.model.model.decoder.layers.0.mlp.up_proj.lora_A.weight"}},
      {"shape",
       [](auto&) {},
       [&](auto& t) {
         t[qA] = counting({3, 2});
         t[qAEncoder] = counting({3, 2});
       },
       {"adapter_model.safetensors: key " + qA + ": expected shape [2,3], found [3,2]"}},
      {"copies",
       [](auto&) {},
       [&](auto& t) { t[qAEncoder] = counting({2, 3}, 3.0f); },
       {"key " + qAEncoder + " differs from " + qA, "one adapter to the tied encoder and decoder weights"}},
  };
  for (const Case& c : cases) {
    TempDir dir;
    const fs::path path = dir.path / c.name;
    writeEdited(path, settings, c.edit, c.editTensors);
    const std::string message = expectInputError([&] { readPeftAdapterDirectory(path.string(), settings, shapes); });
    for (const std::string& part : c.mentioned) EXPECT_TRUE(mentions(message, part)) << c.name;
  }
  // The same disagreements of the copies are refused by the merge too.
  TempDir dir;
  writeEdited(dir.path / "copies", settings, [](auto&) {}, [&](auto& t) { t[qAEncoder] = counting({2, 3}, 3.0f); });
  EXPECT_TRUE(
      mentions(expectInputError([&] { peftMergeDeltas((dir.path / "copies").string()); }), "differs from " + qA));
  EXPECT_TRUE(mentions(expectInputError([&] { readPeftAdapterSettings((dir.path / "absent").string()); }),
                       "expected an adapter directory"));
}

// export --merge-adapter on the HF fixture (H 32, 4 experts of width 8): every changed weight is
// W + ΔW rounded once, the expert tensors per expert, every other tensor the source's bytes; an
// adapter whose update does not fit the model is refused and nothing is written.
TEST(PeftAdapterTest, MergeExportAddsEachDeltaOnceAndRefusesOneThatDoesNotFit) {
  const std::string fixture = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/hf_tester";
  const std::string q = "model.decoder.layers.1.self_attn.q_proj", experts = "model.decoder.layers.0.experts";
  const AdapterSettings settings = settingsFor({"q_proj", "experts.gate_up_proj", "experts.down_proj"});
  std::map<std::string, HostTensor> tensors = {{q + ".lora_A.weight", counting({2, 32}, 1e-3f)},
                                               {q + ".lora_B.weight", counting({32, 2}, 1e-2f)},
                                               {experts + ".gate_up_proj.lora_A", counting({4, 2, 32}, 1e-3f)},
                                               {experts + ".gate_up_proj.lora_B", counting({4, 16, 2}, -1e-2f)},
                                               {experts + ".down_proj.lora_A", counting({4, 2, 8}, 2e-3f)},
                                               {experts + ".down_proj.lora_B", counting({4, 32, 2}, 1e-2f)}};
  TempDir dir;
  writePeftAdapterDirectory((dir.path / "adapter").string(), settings, fixture, tensors);
  HfExportOptions options;
  options.weights = fixture + "/model.safetensors";
  options.out = (dir.path / "merged").string();
  options.mergeAdapter = (dir.path / "adapter").string();
  exportHfDirectory(options);

  const SafetensorsFile source = SafetensorsFile::open(fixture + "/model.safetensors");
  const SafetensorsFile merged = SafetensorsFile::open((dir.path / "merged/model.safetensors").string());
  const std::map<std::string, HostTensor> deltas = peftMergeDeltas((dir.path / "adapter").string());
  int changed = 0;
  for (const SafetensorsEntry& entry : merged.entries()) {
    const HostTensor got = merged.read(entry.name);
    const SafetensorsEntry* original = source.find(entry.name);
    ASSERT_NE(original, nullptr) << entry.name;
    const HostTensor base = source.read(entry.name);
    const auto delta = deltas.find(entry.name);
    if (delta == deltas.end()) {
      EXPECT_EQ(got.data, base.data) << entry.name << ": an unchanged weight must keep its bytes";
      continue;
    }
    ++changed;
    ASSERT_EQ(got.shape, delta->second.shape) << entry.name;
    for (int64_t i = 0; i < got.numElements(); ++i)
      ASSERT_EQ(got.as<float>()[i], static_cast<float>(double(base.as<float>()[i]) + delta->second.as<double>()[i]))
          << entry.name << " element " << i;
  }
  EXPECT_EQ(changed, 3);

  // A q_proj adapter of another input width: refused, nothing written.
  std::map<std::string, HostTensor> wrong = {{q + ".lora_A.weight", counting({2, 16})},
                                             {q + ".lora_B.weight", counting({32, 2})}};
  writePeftAdapterDirectory((dir.path / "wrong").string(), settingsFor({"q_proj"}), fixture, wrong);
  options.out = (dir.path / "refused").string();
  options.mergeAdapter = (dir.path / "wrong").string();
  const std::string message = expectInputError([&] { exportHfDirectory(options); });
  EXPECT_TRUE(mentions(message, "--merge-adapter: " + options.mergeAdapter + ": does not fit --weights")) << message;
  EXPECT_TRUE(mentions(message, "the adapter's update of " + q + ".weight is [32,16], the weight [32,32]")) << message;
  EXPECT_FALSE(fs::exists(dir.path / "refused"));
}

}  // namespace
}  // namespace dgemma
