// Checkpoints that transformers loads as they are (docs/training.md, "Checkpoints" and "Export"):
//   - a demo checkpoint holds what HF's own save_pretrained writes for the demo config (the listing
//     tools/reference/make_export_reference.py committed: names, shapes, dtypes, config keys), and so
//     do its fp32 and bf16 exports;
//   - HF directory -> dgemma on one rank, on --tp 2 over two Gloo ranks and on --tp 4 over four (each
//     KV head replicated on two ranks) -> export is bit-exact, for an fp32 and a bf16 source;
//   - a corrupted checkpoint is refused naming its file, and nothing is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;
using testing::contains;
using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

std::string source(const std::string& path) { return std::string(DGEMMA_SOURCE_DIR) + "/" + path; }

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

nlohmann::json readJson(const std::string& path) { return nlohmann::json::parse(readFile(path)); }

std::set<std::string> keysOf(const nlohmann::json& object) {
  std::set<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.insert(key);
  return keys;
}

// The HF directory's tensors as the listing writes them: name -> {dtype, shape}.
nlohmann::json tensorListing(const std::string& directory) {
  const SafetensorsDirectory weights = SafetensorsDirectory::open(directory);
  nlohmann::json listing = nlohmann::json::object();
  for (const std::string& name : weights.names()) {
    const SafetensorsLocation location = *weights.find(name);
    const DType dtype = location.entry->dtype;
    listing[name] = {{"dtype", dtype == DType::BF16 ? "BF16" : dtype == DType::F32 ? "F32" : "other"},
                     {"shape", location.entry->shape}};
  }
  return listing;
}

// What `directory` must share with save_pretrained's output (`reference`, one dtype of the listing):
// the same tensors (text and vision tower), and config keys that HF knows (HF adds its defaults, e.g.
// transformers_version and initializer_range, which dgemma leaves to it).
void expectLikeSavePretrained(const std::string& directory, const nlohmann::json& reference) {
  nlohmann::json tensors = reference.at("text_tensors");
  tensors.update(reference.at("vision_tensors"));
  EXPECT_EQ(tensorListing(directory), tensors) << directory;
  const nlohmann::json config = readJson(directory + "/config.json");
  std::set<std::string> hfKeys;
  for (const auto& key : reference.at("config_keys")) hfKeys.insert(key.get<std::string>());
  for (const std::string& key : keysOf(config)) EXPECT_TRUE(hfKeys.count(key)) << directory << ": config.json: " << key;
  std::set<std::string> hfTextKeys;
  for (const auto& key : reference.at("text_config_keys")) hfTextKeys.insert(key.get<std::string>());
  for (const std::string& key : keysOf(config.at("text_config")))
    EXPECT_TRUE(hfTextKeys.count(key) || key == "global_head_dim" || key == "num_global_key_value_heads")
        << directory << ": config.json: text_config." << key;
  std::set<std::string> hfVisionKeys;
  for (const auto& key : reference.at("vision_config_keys")) hfVisionKeys.insert(key.get<std::string>());
  for (const std::string& key : keysOf(config.at("vision_config")))
    EXPECT_TRUE(hfVisionKeys.count(key)) << directory << ": config.json: vision_config." << key;
  std::set<std::string> hfGenerationKeys;
  for (const auto& key : reference.at("generation_config_keys")) hfGenerationKeys.insert(key.get<std::string>());
  for (const std::string& key : keysOf(readJson(directory + "/generation_config.json")))
    EXPECT_TRUE(hfGenerationKeys.count(key)) << directory << ": generation_config.json: " << key;
}

class ExportTest : public ::testing::Test {
 protected:
  void compile(const std::string& model, const std::string& flags, const std::string& out) {
    ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + model + " --mode train " + flags + " -o " + out);
    ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  }
  ToolResult run(const std::string& command, int64_t ranks = 1) {
    return runTool(std::string(DGEMMA_RUN) + " " + command + (ranks > 1 ? " --nproc-per-node " + std::to_string(ranks) : ""));
  }
  void expectRun(const std::string& command, int64_t ranks = 1) {
    ToolResult ran = run(command, ranks);
    EXPECT_EQ(ran.exitCode, 0) << ran.output;
  }
  ScratchDirectory dir;
};

TEST_F(ExportTest, DemoCheckpointAndItsExportsAreWhatSavePretrainedWrites) {
  const nlohmann::json listing = readJson(source("test/fixtures/export/demo_hf_listing.json"));
  // An image plan's checkpoint: it holds the vision tower (a text-only plan declares none of it).
  compile(source("models/diffusion_gemma/configs/demo"), "--preset demo --images-per-example 1", dir / "plan");
  expectRun("train --plan " + (dir / "plan") + " --init random --seed 1 --train mock --steps 1 --warmup 0 --tokenizer " +
            source("data/tokenizer") + " --save-dir " + (dir / "ckpt"));
  const std::string checkpoint = dir / "ckpt/step-00000001";
  expectLikeSavePretrained(checkpoint, listing.at("fp32"));
  EXPECT_EQ(readJson(checkpoint + "/generation_config.json"),
            readJson(source("models/diffusion_gemma/configs/demo/generation_config.json")));
  EXPECT_EQ(readFile(checkpoint + "/tokenizer.model"), readFile(source("data/tokenizer/tokenizer.model")));

  for (const char* dtype : {"fp32", "bf16"}) {
    const std::string out = dir / (std::string("export-") + dtype);
    ToolResult exported = run("export --weights " + checkpoint + " --out " + out + " --dtype " + dtype);
    ASSERT_EQ(exported.exitCode, 0) << exported.output;
    EXPECT_TRUE(contains(exported, "exported 80 tensors (" + std::string(dtype) + ") in 1 shard to " + out)) << exported.output;
    const nlohmann::json& reference = listing.at(dtype);
    expectLikeSavePretrained(out, reference);
    EXPECT_EQ(readJson(out + "/config.json").at("dtype"), reference.at("config_dtype"));
    for (const char* file : {"config.json", "generation_config.json", "model.safetensors"})
      EXPECT_TRUE(fs::exists(out + "/" + file)) << file;
    EXPECT_TRUE(fs::exists(out + "/tokenizer.model"));
  }
}

// Starting from an HF directory with the learning rate 0, one step leaves every weight as it was, so
// the checkpoint of any layout exports the source's bytes.
TEST_F(ExportTest, HfToDgemmaToExportIsBitExactOnOneTwoAndFourRanks) {
  const std::string model = source("models/diffusion_gemma/configs/tiny-cpu.json");
  compile(model, "--preset tiny-cpu --micro-batch 2", dir / "one");
  compile(model, "--preset tiny-cpu --micro-batch 2 --tp 2", dir / "tp2");
  compile(model, "--preset tiny-cpu --micro-batch 2 --tp 4", dir / "tp4");
  const std::string frozen = " --train mock --seed 3 --steps 1 --lr 0 --min-lr 0 --warmup 0 --eval-every 0";
  // The source: random weights as an fp32 HF directory, and its bf16 rounding.
  expectRun("train --plan " + (dir / "one") + " --init random" + frozen + " --save-dir " + (dir / "init"));
  expectRun("export --weights " + (dir / "init/step-00000001") + " --out " + (dir / "hf-fp32"));
  expectRun("export --weights " + (dir / "hf-fp32") + " --out " + (dir / "hf-bf16") + " --dtype bf16");
  if (HasFailure()) return;

  for (const char* dtype : {"fp32", "bf16"}) {
    const std::string hf = dir / (std::string("hf-") + dtype);
    for (auto [layout, ranks] : {std::pair{"one", 1}, std::pair{"tp2", 2}, std::pair{"tp4", 4}}) {
      const std::string name = std::string(layout) + "-" + dtype;
      expectRun("train --plan " + (dir / layout) + " --weights " + hf + frozen + " --save-dir " + (dir / (name + "-ckpt")), ranks);
      // Both layouts' checkpoints are HF directories with whole tensors.
      EXPECT_TRUE(fs::exists(dir / (name + "-ckpt/step-00000001/model.safetensors.index.json"))) << name;
      expectRun("export --weights " + (dir / (name + "-ckpt/step-00000001")) + " --out " + (dir / (name + "-out")) + " --dtype " +
                dtype);
      if (HasFailure()) return;
      const SafetensorsDirectory want = SafetensorsDirectory::open(hf), got = SafetensorsDirectory::open(dir / (name + "-out"));
      ASSERT_EQ(got.names(), want.names()) << name;
      for (const std::string& tensor : want.names()) {
        const HostTensor a = got.read(tensor), b = want.read(tensor);
        EXPECT_EQ(a.dtype, b.dtype) << name << " " << tensor;
        EXPECT_TRUE(a.shape == b.shape && a.data == b.data) << name << " " << tensor << " differs from the source";
      }
    }
  }
}

TEST_F(ExportTest, CorruptedCheckpointIsRefusedAndNothingIsWritten) {
  const std::string model = source("models/diffusion_gemma/configs/tiny-cpu.json");
  compile(model, "--preset tiny-cpu --micro-batch 2", dir / "plan");
  expectRun("train --plan " + (dir / "plan") + " --init random --train mock --steps 1 --warmup 0 --save-dir " + (dir / "ckpt"));
  const std::string shard = dir / "ckpt/step-00000001/model-00001-of-00001.safetensors";
  std::string bytes = readFile(shard);
  ASSERT_GT(bytes.size(), 4096u);
  bytes[bytes.size() - 7] ^= 0x40;
  std::ofstream(shard, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ToolResult refused = run("export --weights " + (dir / "ckpt/step-00000001") + " --out " + (dir / "out"));
  EXPECT_EQ(refused.exitCode, 2) << refused.output;
  EXPECT_TRUE(contains(refused, shard + ": xxh3_64: the file hashes to")) << refused.output;
  EXPECT_FALSE(fs::exists(dir / "out"));
  for (const auto& entry : fs::directory_iterator(dir / "."))
    EXPECT_EQ(entry.path().filename().string().find(".out.tmp"), std::string::npos) << entry.path();

  ToolResult taken = run("export --weights " + (dir / "ckpt/step-00000001") + " --out " + (dir / "plan"));
  EXPECT_EQ(taken.exitCode, 2) << taken.output;
  EXPECT_TRUE(contains(taken, "--out: " + (dir / "plan") + ": already exists")) << taken.output;
  ToolResult badSize = run("export --weights " + (dir / "ckpt/step-00000001") + " --out " + (dir / "x") + " --max-shard-size 5XB");
  EXPECT_EQ(badSize.exitCode, 2) << badSize.output;
  EXPECT_TRUE(contains(badSize, "--max-shard-size: expected a positive size")) << badSize.output;
}

}  // namespace
}  // namespace dgemma
