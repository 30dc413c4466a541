// dgemma-run export's library part (docs/training.md, "Export"): the HF fixture model written out as
// HF names it, sharded, in fp32 bit-exactly and in bf16 rounded to nearest even; nothing left on
// error; the side files.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "models/diffusion_gemma/spec/Config.h"
#include "models/diffusion_gemma/spec/WeightSchema.h"
#include "runtime/io/Safetensors.h"
#include "runtime/data/text/Tokenizer.h"
#include "runtime/model/diffusion_gemma/HfExport.h"
#include "support/DType.h"
#include "support/Error.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;
using test::expectInputError;
using test::fileBytes;
using test::mentions;
using test::TempDir;

const std::string kFixture = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/hf_tester";

std::vector<std::string> entriesOf(const fs::path& directory) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(directory)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

HfExportResult exportFixture(const std::string& out, DType dtype, uint64_t maxShardBytes = kDefaultExportShardBytes,
                             const std::string& weights = kFixture + "/model.safetensors") {
  HfExportOptions options;
  options.weights = weights;
  options.out = out;
  options.dtype = dtype;
  options.maxShardBytes = maxShardBytes;
  return exportHfDirectory(options);
}

// The fixture directory holds its batch and expected outputs too: the weights are its
// model.safetensors (config.json beside it).
// The fixture's text tensors plus the encoder's layer_scalar copies, the set save_pretrained writes.
std::set<std::string> hfTextNames() {
  std::set<std::string> names;
  for (const ExpectedTensor& tensor : expectedTextWeights(loadDiffusionGemmaConfig(kFixture))) {
    names.insert(tensor.name);
    if (std::optional<std::string> copy = untiedEncoderCopyName(tensor.name)) names.insert(*copy);
  }
  return names;
}

TEST(HfExportTest, Fp32ShardsAreBitExactUnderHfNames) {
  TempDir dir;
  const HfExportResult result = exportFixture(dir / "out", DType::F32, 40000);
  EXPECT_GT(result.shards, 3);
  const SafetensorsDirectory source = SafetensorsDirectory::open(kFixture + "/model.safetensors");
  const SafetensorsDirectory exported = SafetensorsDirectory::open(dir / "out");
  const std::vector<std::string> names = exported.names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), hfTextNames());
  EXPECT_EQ(result.tensors, static_cast<int>(names.size()));
  for (const std::string& name : names) {
    // The fixture holds the encoder copies too (save_pretrained's own file).
    const HostTensor got = exported.read(name), want = source.read(name);
    EXPECT_EQ(got.dtype, DType::F32) << name;
    EXPECT_EQ(got.shape, want.shape) << name;
    EXPECT_EQ(got.data, want.data) << name;
  }
  // HF's shard names and index; every shard's data within the limit unless one tensor is larger.
  const nlohmann::json index = nlohmann::json::parse(fileBytes(dir / "out/model.safetensors.index.json"));
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), result.weightBytes);
  EXPECT_EQ(index.at("weight_map").size(), names.size());
  char first[64];
  std::snprintf(first, sizeof first, "model-00001-of-%05d.safetensors", result.shards);
  EXPECT_TRUE(fs::exists(dir / ("out/" + std::string(first))));
  for (const std::string& file : entriesOf(dir / "out"))
    if (file.rfind("model-", 0) == 0) {
      const SafetensorsFile shard = SafetensorsFile::open(dir / ("out/" + file));
      uint64_t bytes = 0;
      for (const SafetensorsEntry& entry : shard.entries()) bytes += entry.bytes;
      EXPECT_TRUE(bytes <= 40000 || shard.entries().size() == 1) << file << ": " << bytes;
      EXPECT_EQ(shard.metadata().at("format"), "pt");
    }
  // The config is the model's, its dtype the export's; the generation config is copied.
  nlohmann::json config = nlohmann::json::parse(fileBytes(dir / "out/config.json"));
  nlohmann::json original = nlohmann::json::parse(fileBytes(kFixture + "/config.json"));
  EXPECT_EQ(config.at("dtype"), "float32");
  EXPECT_EQ(config, original);
  EXPECT_EQ(nlohmann::json::parse(fileBytes(dir / "out/generation_config.json")),
            nlohmann::json::parse(fileBytes(kFixture + "/generation_config.json")));
  EXPECT_EQ(result.notes, (std::vector<std::string>{"no tokenizer files (pass --tokenizer DIR to include them)"}));
}

TEST(HfExportTest, Bf16RoundsToNearestEvenAndRoundTripsExactly) {
  TempDir dir;
  exportFixture(dir / "bf16", DType::BF16);
  EXPECT_EQ(entriesOf(dir / "bf16"), (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors"}));
  EXPECT_EQ(nlohmann::json::parse(fileBytes(dir / "bf16/config.json")).at("dtype"), "bfloat16");
  const SafetensorsDirectory source = SafetensorsDirectory::open(kFixture + "/model.safetensors");
  const SafetensorsDirectory rounded = SafetensorsDirectory::open(dir / "bf16");
  int64_t changed = 0;
  for (const std::string& name : rounded.names()) {
    const HostTensor got = rounded.read(name), want = source.read(name);
    ASSERT_EQ(got.dtype, DType::BF16) << name;
    for (int64_t i = 0; i < want.numElements(); ++i) {
      const float value = want.as<float>()[i];
      ASSERT_EQ(got.as<uint16_t>()[i], f32ToBf16Bits(value)) << name << "[" << i << "]";
      changed += bf16BitsToF32(got.as<uint16_t>()[i]) != value;
    }
  }
  EXPECT_GT(changed, 1000);  // random fp32 weights: nearly every value rounds

  // bf16 -> fp32 widens exactly, and fp32 of bf16 values -> bf16 gives the same bytes back.
  exportFixture(dir / "wide", DType::F32, kDefaultExportShardBytes, dir / "bf16");
  exportFixture(dir / "again", DType::BF16, kDefaultExportShardBytes, dir / "wide");
  EXPECT_EQ(fileBytes(dir / "again/model.safetensors"), fileBytes(dir / "bf16/model.safetensors"));
  const SafetensorsDirectory wide = SafetensorsDirectory::open(dir / "wide");
  for (const std::string& name : wide.names()) {
    const HostTensor a = wide.read(name), b = rounded.read(name);
    for (int64_t i = 0; i < a.numElements(); ++i) ASSERT_EQ(a.as<float>()[i], bf16BitsToF32(b.as<uint16_t>()[i])) << name;
  }
}

TEST(HfExportTest, NothingIsLeftOnError) {
  TempDir dir;
  fs::create_directories(dir / "taken");
  EXPECT_TRUE(mentions(expectInputError([&] { exportFixture(dir / "taken", DType::F32); }), "already exists"));

  // A source with a mis-shaped tensor: refused naming the tensor and its file, before any output.
  fs::create_directories(dir / "bad");
  fs::copy_file(kFixture + "/config.json", dir / "bad/config.json");
  std::vector<HostTensor> held;
  std::vector<std::pair<std::string, const HostTensor*>> entries;
  const SafetensorsFile fixture = SafetensorsFile::open(kFixture + "/model.safetensors");
  held.reserve(fixture.entries().size());
  for (const SafetensorsEntry& entry : fixture.entries()) {
    held.push_back(fixture.read(entry.name));
    if (entry.name == "model.decoder.norm.weight") held.back() = HostTensor(DType::F32, {3});
    entries.emplace_back(entry.name, &held.back());
  }
  writeSafetensors(dir / "bad/model.safetensors", entries);
  const std::string message = expectInputError([&] { exportFixture(dir / "out", DType::F32, kDefaultExportShardBytes, dir / "bad"); });
  EXPECT_TRUE(mentions(message, "tensor model.decoder.norm.weight: expected shape [32], found [3] (in " + (dir / "bad") +
                                    "/model.safetensors)"));
  EXPECT_EQ(entriesOf(dir.path), (std::vector<std::string>{"bad", "taken"}));

  // A tokenizer directory without a tokenizer: refused, nothing written.
  HfExportOptions options;
  options.weights = kFixture + "/model.safetensors";
  options.out = dir / "out";
  options.tokenizerDir = dir / "taken";
  EXPECT_TRUE(mentions(expectInputError([&] { exportHfDirectory(options); }), "expected a directory with tokenizer.json"));
  EXPECT_EQ(entriesOf(dir.path), (std::vector<std::string>{"bad", "taken"}));
}

TEST(HfExportTest, SideFilesCarryTheTokenizer) {
  const std::string tokenizer = std::string(DGEMMA_SOURCE_DIR) + "/data/tokenizer";
  const auto files = hfSideFiles({{"model_type", "diffusion_gemma"}}, nullptr, tokenizer);
  std::vector<std::string> names;
  for (const auto& [name, bytes] : files) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "generation_config.json", "tokenizer.model", "tokenizer_config.json",
                                             "special_tokens_map.json"}));
  EXPECT_EQ(files[2].second, fileBytes(tokenizer + "/tokenizer.model"));
  // No generation config: HF's defaults for the class, every sampler field null.
  EXPECT_EQ(nlohmann::json::parse(files[1].second).at("t_min"), nullptr);
  EXPECT_EQ(untiedEncoderCopyName("model.decoder.layers.12.layer_scalar"), "model.encoder.language_model.layers.12.layer_scalar");
  EXPECT_EQ(untiedEncoderCopyName("model.decoder.norm.weight"), std::nullopt);
}

// A GPT-2 byte-level BPE tokenizer (vocab.json + merges.txt) travels with the weights too.
TEST(HfExportTest, SideFilesCarryAGpt2BpeTokenizer) {
  const std::string tokenizer = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/gpt2_bpe";
  EXPECT_TRUE(holdsTokenizer(tokenizer));
  std::map<std::string, std::string> files;
  for (const auto& [name, bytes] : hfSideFiles({{"model_type", "diffusion_gemma"}}, nullptr, tokenizer))
    files[name] = bytes;
  EXPECT_EQ(files.at("vocab.json"), fileBytes(tokenizer + "/vocab.json"));
  EXPECT_EQ(files.at("merges.txt"), fileBytes(tokenizer + "/merges.txt"));
  EXPECT_EQ(files.count("tokenizer_config.json"), 1u);
  EXPECT_FALSE(holdsTokenizer(std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures"));
}

}  // namespace
}  // namespace dgemma
