#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/DType.h"
#include "runtime/io/Safetensors.h"
#include "runtime/train/CheckpointListing.h"
#include "runtime/train/CheckpointReader.h"
#include "runtime/train/CheckpointWriter.h"
#include "runtime/train/CheckpointManifest.h"
#include "test/unit/TestSupport.h"
#include "test/unit/train/ResealManifest.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;
using test::expectInputError;
using test::fileBytes;
using test::mentions;
using test::TempDir;
using test::writeBytes;

// The model identity a resume must match (the trainer's is the model config, recipe and shapes).
const nlohmann::json kModel = {{"model_config", {{"hidden_size", 64}}}, {"optimizer", {{"beta1", 0.9}, {"beta2", 0.999}}}};

HostTensor f32Tensor(std::vector<int64_t> shape, float seed) {
  HostTensor t(DType::F32, std::move(shape));
  float* values = t.as<float>();
  for (int64_t i = 0; i < t.numElements(); ++i) values[i] = seed / static_cast<float>(i + 3) - static_cast<float>(i);
  if (t.numElements() > 2) {
    values[0] = std::numeric_limits<float>::denorm_min();
    values[1] = -0.0f;
    values[2] = std::numeric_limits<float>::quiet_NaN();
  }
  return t;
}

HostTensor bf16Tensor(std::vector<int64_t> shape, float seed) {
  HostTensor t(DType::BF16, std::move(shape));
  uint16_t* values = t.as<uint16_t>();
  for (int64_t i = 0; i < t.numElements(); ++i) values[i] = f32ToBf16Bits(seed * static_cast<float>(i) / 7.0f);
  return t;
}

HostTensor i64Tensor(std::vector<int64_t> shape) {
  HostTensor t(DType::I64, std::move(shape));
  int64_t* values = t.as<int64_t>();
  for (int64_t i = 0; i < t.numElements(); ++i) values[i] = (i % 2 ? -1 : 1) * (int64_t{1} << (i % 63));
  values[0] = std::numeric_limits<int64_t>::min();
  return t;
}

CheckpointState stateAt(int64_t step) {
  CheckpointState state;
  state.model = kModel;
  state.step = step;
  state.consumedSamples = 8 * step;
  state.dataOrderState = {{"seed", 1234}, {"epoch", 0}, {"sampler", "random"}, {"position", 8 * step}};
  state.rng = {{"seed", 42}, {"noise_seeding", "per-sample"}};
  state.config = {{"objective", "base-sft"}, {"lr_schedule", {{"max_lr", 5e-5}, {"warmup_steps", 20}}}};
  return state;
}

// A small model and its optimizer state: f32 main weights and moments, bf16 frozen weights, an i64 counter.
struct Fixture {
  HostTensor embed = f32Tensor({16, 8}, 1.5f);
  HostTensor norm = bf16Tensor({8}, 2.0f);
  HostTensor ids = i64Tensor({5});
  HostTensor empty = HostTensor(DType::F32, {0, 4});
  HostTensor m = f32Tensor({16, 8}, -0.25f);
  HostTensor v = f32Tensor({16, 8}, 0.125f);
  HostTensor count = i64Tensor({1});

  std::vector<CheckpointTensor> tensors() const {
    return {{"model", "model.decoder.embed_tokens.weight", &embed},
            {"model", "model.decoder.norm.weight", &norm},
            {"model", "buffers.position_ids", &ids},
            {"model", "empty", &empty},
            {"optimizer", "exp_avg/model.decoder.embed_tokens.weight", &m},
            {"optimizer", "exp_avg_sq/model.decoder.embed_tokens.weight", &v},
            {"optimizer", "step", &count}};
  }
};

void expectBitEqual(const HostTensor& actual, const HostTensor& expected, const std::string& name) {
  EXPECT_EQ(actual.dtype, expected.dtype) << name;
  EXPECT_EQ(actual.shape, expected.shape) << name;
  EXPECT_EQ(actual.data, expected.data) << name;  // bytes: NaN, -0 and denormals included
}

std::string shardOf(const std::string& dir, const std::string& prefix) {
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind(prefix, 0) == 0) return entry.path().string();
  ADD_FAILURE() << "no file " << prefix << "* in " << dir;
  return "";
}

std::vector<std::string> entriesOf(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CheckpointTest, SaveLoadRoundTripIsBitExact) {
  TempDir dir;
  Fixture f;
  CheckpointSaveResult saved = CheckpointWriter::save(dir / "ckpt", stateAt(7), f.tensors());
  EXPECT_EQ(saved.directory, dir / "ckpt/step-00000007");
  EXPECT_EQ(entriesOf(saved.directory),
            (std::vector<std::string>{"manifest.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json",
                                      "optimizer-00001-of-00001.safetensors", "optimizer.safetensors.index.json"}));
  uint64_t onDisk = 0;
  for (const auto& entry : fs::directory_iterator(saved.directory)) onDisk += entry.file_size();
  EXPECT_EQ(saved.bytesWritten, onDisk);
  EXPECT_EQ(saved.files, 5);
  EXPECT_GE(saved.seconds, 0.0);
  EXPECT_TRUE(saved.removed.empty());
  EXPECT_EQ(entriesOf(dir / "ckpt"), std::vector<std::string>{"step-00000007"});  // no .tmp left

  ASSERT_EQ(newestCheckpointDirectory(dir / "ckpt"), saved.directory);
  CheckpointReader loaded = CheckpointReader::load(saved.directory, kModel);
  CheckpointState expected = stateAt(7);
  EXPECT_EQ(loaded.state().model, expected.model);
  EXPECT_EQ(loaded.state().step, 7);
  EXPECT_EQ(loaded.state().consumedSamples, 56);
  EXPECT_EQ(loaded.state().dataOrderState, expected.dataOrderState);
  EXPECT_EQ(loaded.state().rng, expected.rng);
  EXPECT_EQ(loaded.state().config, expected.config);
  EXPECT_EQ(loaded.manifest()["format_version"], kCheckpointFormatVersion);

  EXPECT_EQ(loaded.groups(), (std::vector<std::string>{"model", "optimizer"}));
  EXPECT_EQ(loaded.names("optimizer"),
            (std::vector<std::string>{"exp_avg/model.decoder.embed_tokens.weight",
                                      "exp_avg_sq/model.decoder.embed_tokens.weight", "step"}));
  for (const CheckpointTensor& t : f.tensors()) {
    ASSERT_TRUE(loaded.contains(t.group, t.name)) << t.name;
    expectBitEqual(loaded.read(t.group, t.name), *t.tensor, t.name);
  }
  EXPECT_FALSE(loaded.contains("model", "step"));
  EXPECT_TRUE(mentions(expectInputError([&] { loaded.read("model", "step"); }), "group 'model': tensor 'step': not found"));

  // The model group's index makes the directory a --weights source for the existing loader.
  SafetensorsDirectory weights = SafetensorsDirectory::open(saved.directory);
  EXPECT_EQ(weights.names(), (std::vector<std::string>{"buffers.position_ids", "empty", "model.decoder.embed_tokens.weight",
                                                       "model.decoder.norm.weight"}));
  expectBitEqual(weights.read("model.decoder.norm.weight"), f.norm, "norm via SafetensorsDirectory");
}

TEST(CheckpointTest, ShardsSplitAtTheMaximumSize) {
  TempDir dir;
  HostTensor a = f32Tensor({64}, 1.0f), b = f32Tensor({64}, 2.0f), big = f32Tensor({300}, 3.0f), c = f32Tensor({10}, 4.0f);
  // 256-byte a and b share a 600-byte shard; big (1200 bytes) is alone; c starts the third.
  CheckpointSaveResult saved = CheckpointWriter::save(
      dir / "ckpt", stateAt(1), {{"model", "a", &a}, {"model", "b", &b}, {"model", "big", &big}, {"model", "c", &c}},
      {.maxShardBytes = 600});
  EXPECT_EQ(entriesOf(saved.directory),
            (std::vector<std::string>{"manifest.json", "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                      "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  EXPECT_EQ(SafetensorsFile::open(saved.directory + "/model-00001-of-00003.safetensors").entries().size(), 2u);
  EXPECT_EQ(SafetensorsFile::open(saved.directory + "/model-00002-of-00003.safetensors").entries().size(), 1u);
  nlohmann::json index = nlohmann::json::parse(fileBytes(saved.directory + "/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"]["c"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(index["metadata"]["total_size"], 4 * (64 + 64 + 300 + 10));

  CheckpointReader loaded = CheckpointReader::load(saved.directory, kModel);
  EXPECT_EQ(loaded.names("model"), (std::vector<std::string>{"a", "b", "big", "c"}));
  expectBitEqual(loaded.read("model", "big"), big, "big");
  expectBitEqual(loaded.read("model", "c"), c, "c");
}

TEST(CheckpointTest, KeepDeletesTheOldestBeyondK) {
  TempDir dir;
  Fixture f;
  std::vector<std::string> removed;
  for (int64_t step = 1; step <= 5; ++step) {
    CheckpointSaveResult saved = CheckpointWriter::save(dir / "ckpt", stateAt(step), f.tensors(), {.keep = 2});
    removed.insert(removed.end(), saved.removed.begin(), saved.removed.end());
  }
  EXPECT_EQ(entriesOf(dir / "ckpt"), (std::vector<std::string>{"step-00000004", "step-00000005"}));
  EXPECT_EQ(removed, (std::vector<std::string>{dir / "ckpt/step-00000001", dir / "ckpt/step-00000002",
                                               dir / "ckpt/step-00000003"}));
  std::vector<CheckpointEntry> listed = listCheckpoints(dir / "ckpt");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].step, 4);
  EXPECT_EQ(listed[1].step, 5);

  // A run resumed from step 4 that saves step 4 again (replacing it) never deletes what it just wrote.
  CheckpointSaveResult again = CheckpointWriter::save(dir / "ckpt", stateAt(4), f.tensors(), {.keep = 1});
  EXPECT_EQ(again.removed, std::vector<std::string>{dir / "ckpt/step-00000005"});
  EXPECT_EQ(entriesOf(dir / "ckpt"), std::vector<std::string>{"step-00000004"});
  EXPECT_NO_THROW(CheckpointReader::load(dir / "ckpt/step-00000004", kModel));
}

TEST(CheckpointTest, TruncatedShardIsRejected) {
  TempDir dir;
  Fixture f;
  std::string path = CheckpointWriter::save(dir / "ckpt", stateAt(4), f.tensors()).directory;
  std::string shard = shardOf(path, "model-00001");
  fs::resize_file(shard, fs::file_size(shard) - 24);
  std::string message = expectInputError([&] { CheckpointReader::load(path, kModel); });
  EXPECT_TRUE(mentions(message, shard + ": size: "));
  EXPECT_TRUE(mentions(message, "truncated or torn checkpoint"));
}

TEST(CheckpointTest, FlippedByteIsRejected) {
  TempDir dir;
  Fixture f;
  std::string path = CheckpointWriter::save(dir / "ckpt", stateAt(4), f.tensors()).directory;
  std::string shard = shardOf(path, "optimizer-00001");
  std::string bytes = fileBytes(shard);
  bytes[bytes.size() - 10] ^= 0x20;  // inside the tensor data: the safetensors header still parses
  writeBytes(shard, bytes);
  std::string message = expectInputError([&] { CheckpointReader::load(path, kModel); });
  EXPECT_TRUE(mentions(message, shard + ": xxh3_64: the file hashes to "));
  EXPECT_TRUE(mentions(message, "corrupted checkpoint"));
}

// A damaged newest checkpoint stays the newest: newestCheckpointDirectory reports it for the load to
// refuse, and only listCheckpoints (what `keep` counts) leaves it out. Nothing falls back to step 2 silently.
TEST(CheckpointTest, DamagedNewestManifestIsReportedNotSkipped) {
  TempDir dir;
  Fixture f;
  CheckpointWriter::save(dir / "ckpt", stateAt(2), f.tensors());
  std::string newest = CheckpointWriter::save(dir / "ckpt", stateAt(4), f.tensors()).directory;
  const std::string manifestText = fileBytes(newest + "/manifest.json");
  auto expectReportedAndRefused = [&](const std::string& message) {
    EXPECT_EQ(newestCheckpointDirectory(dir / "ckpt"), newest);
    EXPECT_EQ(listCheckpoints(dir / "ckpt").size(), 1u);
    EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(newest, kModel); }), message));
  };
  fs::remove(newest + "/manifest.json");
  expectReportedAndRefused(newest + "/manifest.json: missing: not a complete checkpoint");
  writeBytes(newest + "/manifest.json", manifestText.substr(0, manifestText.size() / 2));  // torn
  expectReportedAndRefused(newest + "/manifest.json: invalid JSON at byte ");
  writeBytes(newest + "/manifest.json", "[1, 2");
  expectReportedAndRefused(newest + "/manifest.json: invalid JSON");
  writeBytes(newest + "/manifest.json", "[1, 2]");
  expectReportedAndRefused(newest + "/manifest.json: (top level): expected an object, got an array of 2 elements");
  // The step edited, checksum and all: the directory's name disagrees.
  nlohmann::json manifest = nlohmann::json::parse(manifestText);
  manifest["step"] = 5;
  writeBytes(newest + "/manifest.json", test::resealedManifestText(manifest));
  expectReportedAndRefused(newest + "/manifest.json: step: 5, but the directory is step-00000004");
  writeBytes(newest + "/manifest.json", manifestText);
  EXPECT_NO_THROW(CheckpointReader::load(newest, kModel));
  EXPECT_EQ(listCheckpoints(dir / "ckpt").size(), 2u);
}

// Every member is under the checksum: an edit of any field a resume uses is refused naming the
// manifest, while re-indenting it is not an edit.
TEST(CheckpointTest, ManifestChecksumCoversEveryField) {
  TempDir dir;
  Fixture f;
  const std::string path = CheckpointWriter::save(dir / "ckpt", stateAt(4), f.tensors()).directory;
  const std::string manifestPath = path + "/manifest.json";
  const nlohmann::json original = nlohmann::json::parse(fileBytes(manifestPath));
  ASSERT_TRUE(original.contains(kManifestChecksumField));
  const std::vector<std::pair<std::string, nlohmann::json>> edits = {
      {"/consumed_samples", 0},
      {"/consumed_samples", 9},
      {"/consumed_samples", 1400},
      {"/step", 3},
      {"/rng/seed", 43},
      {"/rng/noise_seeding", "per-batch"},
      {"/data_order_state/position", 0},
      {"/data_order_state/epoch", 1},
      {"/config/lr_schedule/warmup_steps", 0},
      {"/world_size", 2},
      {"/files/0/size", 1},
      {"/groups/model/tensors/0/shape/0", 17},
      {"/model/optimizer/beta1", 0.8},
  };
  for (const auto& [pointer, value] : edits) {
    nlohmann::json edited = original;
    edited[nlohmann::json::json_pointer(pointer)] = value;
    writeBytes(manifestPath, edited.dump(2));
    EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(path, kModel); }),
                         manifestPath + ": manifest_xxh3_64: the checksum does not match"))
        << pointer;
  }
  nlohmann::json added = original;
  added["note"] = "hand-written";
  writeBytes(manifestPath, added.dump());
  EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(path, kModel); }), "the checksum does not match"));
  writeBytes(manifestPath, original.dump(4));
  EXPECT_EQ(CheckpointReader::load(path, kModel).state().consumedSamples, 32);
}

// A manifest of format 3 has no checksum: it is refused as an earlier build's format (no upgrade:
// an unchecked manifest cannot be vouched for after the fact).
TEST(CheckpointTest, ManifestWithoutChecksumIsAnEarlierFormat) {
  TempDir dir;
  Fixture f;
  const std::string path = CheckpointWriter::save(dir / "ckpt", stateAt(4), f.tensors()).directory;
  nlohmann::json manifest = nlohmann::json::parse(fileBytes(path + "/manifest.json"));
  manifest.erase(kManifestChecksumField);
  writeBytes(path + "/manifest.json", manifest.dump());
  EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(path, kModel); }), "manifest_xxh3_64: missing"));
  manifest["format_version"] = 3;
  writeBytes(path + "/manifest.json", manifest.dump());
  EXPECT_TRUE(
      mentions(expectInputError([&] { CheckpointReader::load(path, kModel); }),
               path + "/manifest.json: format_version: 3 is the format of earlier builds (1: whole tensors; 2: a plan "
                      "hash that ties it to one layout; 3: no manifest checksum), which this build no longer reads"));
}

// Nesting far beyond any manifest is refused while it is read, wherever it is: no stack overflow
// in the parser, a listing or a message.
TEST(CheckpointTest, DeeplyNestedManifestIsRefusedWithoutRecursion) {
  TempDir dir;
  Fixture f;
  const std::string path = CheckpointWriter::save(dir / "ckpt", stateAt(4), f.tensors()).directory;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string& text : {deep, "{\"format\": \"dgemma-checkpoint\", \"config\": " + deep + "}",
                                  "{\"format\": " + deep + "}"}) {
    writeBytes(path + "/manifest.json", text);
    EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(path, kModel); }),
                         path + "/manifest.json: JSON nested deeper than 64 levels"));
    EXPECT_TRUE(listCheckpoints(dir / "ckpt").empty());
    EXPECT_EQ(newestCheckpointDirectory(dir / "ckpt"), path);
  }
}

// parseCheckpointManifest on its own (the fuzz target's entry): each member's type and range,
// named by its path, before anything walks it.
TEST(CheckpointTest, ManifestFieldsAreValidatedByPath) {
  TempDir dir;
  Fixture f;
  const std::string path = CheckpointWriter::save(dir / "ckpt", stateAt(4), f.tensors()).directory;
  const nlohmann::json original = nlohmann::json::parse(fileBytes(path + "/manifest.json"));
  EXPECT_NO_THROW(parseCheckpointManifest(test::resealedManifestText(original), "m.json"));
  const std::vector<std::tuple<std::string, nlohmann::json, std::string>> cases = {
      {"/consumed_samples", -1, "m.json: consumed_samples: expected an integer >= 0, got -1"},
      {"/consumed_samples", std::numeric_limits<uint64_t>::max(), "m.json: consumed_samples: expected an integer >= 0, got 18446744073709551615"},
      {"/step", 1.5, "m.json: step: expected an integer >= 0, got 1.5"},
      {"/rng", nlohmann::json::array(), "m.json: rng: expected an object, got an array of 0 elements"},
      {"/world_size", 0, "m.json: world_size: expected the number of ranks that saved the checkpoint, got 0"},
      {"/files/0/name", "../escape", "m.json: files[0].name: expected a file name in the checkpoint directory, got \"../escape\""},
      {"/files/0/xxh3_64", std::string(200, '\x01'), "m.json: files[0].xxh3_64: expected 16 lowercase hex digits, got \"\\x01"},
      {"/groups/model/tensors/0/shape/0", int64_t{1} << 60, "m.json: groups.model.tensors[0].shape[0]: expected an integer in [0, "},
      {"/groups/model/tensors/0/boxes/0/rank", 1, "m.json: groups.model.tensors[0].boxes[0].rank: expected a rank below world_size 1, got 1"},
      {"/groups/model/tensors/0/boxes/0/offset/0", 1, "m.json: groups.model.tensors[0].boxes[0]: tensor \"model.decoder.embed_tokens.weight\": box [1:17, 0:8] does not lie inside its shape [16, 8]"},
      {"/groups/model/shards/0", "nowhere.safetensors", "m.json: groups.model.shards[0]: \"nowhere.safetensors\" is not among the files listed"},
      {"/model_hash", nlohmann::json::array({nlohmann::json::array({1})}), "m.json: model_hash: an array of 1 element is not the hash of the recorded model"},
  };
  for (const auto& [pointer, value, message] : cases) {
    nlohmann::json edited = original;
    edited[nlohmann::json::json_pointer(pointer)] = value;
    EXPECT_TRUE(mentions(expectInputError([&] { parseCheckpointManifest(test::resealedManifestText(edited), "m.json"); }), message))
        << pointer;
  }
}

TEST(CheckpointTest, MissingShardIsRejected) {
  TempDir dir;
  Fixture f;
  std::string path = CheckpointWriter::save(dir / "ckpt", stateAt(4), f.tensors()).directory;
  fs::remove(path + "/optimizer-00001-of-00001.safetensors");
  EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(path, kModel); }),
                       path + "/optimizer-00001-of-00001.safetensors: missing"));
}

// A save killed before its rename leaves .tmp-step-*: readers ignore it, the next save removes it.
TEST(CheckpointTest, InterruptedSaveIsIgnoredAndCleanedUp) {
  TempDir dir;
  Fixture f;
  std::string first = CheckpointWriter::save(dir / "ckpt", stateAt(3), f.tensors()).directory;
  fs::copy(first, dir / "ckpt/.tmp-step-6-99999");  // complete-looking, manifest and all
  fs::create_directories(dir / "ckpt/.tmp-step-7-99999");
  fs::create_directories(dir / "ckpt/notes");
  EXPECT_EQ(newestCheckpointDirectory(dir / "ckpt"), first);
  EXPECT_EQ(listCheckpoints(dir / "ckpt").size(), 1u);

  CheckpointWriter::save(dir / "ckpt", stateAt(6), f.tensors());
  EXPECT_EQ(entriesOf(dir / "ckpt"), (std::vector<std::string>{"notes", "step-00000003", "step-00000006"}));
  EXPECT_EQ(newestCheckpointDirectory(dir / "ckpt"), dir / "ckpt/step-00000006");
  EXPECT_FALSE(newestCheckpointDirectory(dir / "nothing-here"));
}

// The identity is compared as a whole, and the first difference is named by its path.
TEST(CheckpointTest, ModelMismatchNamesTheDifference) {
  TempDir dir;
  Fixture f;
  std::string path = CheckpointWriter::save(dir / "ckpt", stateAt(4), f.tensors()).directory;
  nlohmann::json other = kModel;
  other["optimizer"]["beta2"] = 0.95;
  EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(path, other); }),
                       path + "/manifest.json: model.optimizer.beta2: the checkpoint has 0.999, this run 0.95"));
  other = kModel;
  other["parameters"] = {{"w", {{"shape", {4, 4}}}}};
  EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(path, other); }),
                       "model.parameters: the checkpoint has nothing, this run {\"w\":{\"shape\":[4,4]}}"));
  EXPECT_NO_THROW(CheckpointReader::load(path, kModel));

  // An edited identity no longer matches its recorded hash.
  nlohmann::json manifest = nlohmann::json::parse(fileBytes(path + "/manifest.json"));
  manifest["model"]["optimizer"]["beta1"] = 0.8;
  writeBytes(path + "/manifest.json", test::resealedManifestText(manifest));
  EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(path, kModel); }),
                       "manifest.json: model_hash: \"" + manifest["model_hash"].get<std::string>() +
                           "\" is not the hash of the recorded model"));
}

TEST(CheckpointTest, UnknownFormatVersionIsRejected) {
  TempDir dir;
  Fixture f;
  std::string path = CheckpointWriter::save(dir / "ckpt", stateAt(4), f.tensors()).directory;
  nlohmann::json manifest = nlohmann::json::parse(fileBytes(path + "/manifest.json"));
  manifest["format_version"] = 5;
  writeBytes(path + "/manifest.json", manifest.dump());
  EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(path, kModel); }),
                       "format_version: 5 is not supported (this build reads version 4)"));
  for (int earlier : {1, 2, 3}) {
    manifest["format_version"] = earlier;
    writeBytes(path + "/manifest.json", manifest.dump());
    EXPECT_TRUE(mentions(
        expectInputError([&] { CheckpointReader::load(path, kModel); }),
        "format_version: " + std::to_string(earlier) +
            " is the format of earlier builds (1: whole tensors; 2: a plan hash that ties it to one layout; 3: no "
            "manifest checksum), "
            "which this build no longer reads"));
  }
  EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(dir / "ckpt/step-00000099", kModel); }),
                       "no such checkpoint directory"));
}

TEST(CheckpointTest, BadTensorListsAreRejectedBeforeWriting) {
  TempDir dir;
  HostTensor t = f32Tensor({4}, 1.0f);
  HostTensor wrongSize = f32Tensor({4}, 1.0f);
  wrongSize.data.pop_back();
  EXPECT_THROW(CheckpointWriter::save(dir / "ckpt", stateAt(1), {{"Model", "w", &t}}), std::invalid_argument);
  EXPECT_THROW(CheckpointWriter::save(dir / "ckpt", stateAt(1), {{"model-1", "w", &t}}), std::invalid_argument);
  EXPECT_THROW(CheckpointWriter::save(dir / "ckpt", stateAt(1), {{"model", "w", &t}, {"model", "w", &t}}),
               std::invalid_argument);
  EXPECT_THROW(CheckpointWriter::save(dir / "ckpt", stateAt(1), {{"model", "w", nullptr}}), std::invalid_argument);
  EXPECT_THROW(CheckpointWriter::save(dir / "ckpt", stateAt(1), {{"model", "w", &wrongSize}}), std::invalid_argument);
  EXPECT_FALSE(fs::exists(dir / "ckpt"));
  // The same name in two groups is fine.
  EXPECT_NO_THROW(CheckpointWriter::save(dir / "ckpt", stateAt(1), {{"model", "w", &t}, {"optimizer", "w", &t}}));
}

TEST(CheckpointTest, IoFailureIsARuntimeErrorAndLeavesNoTmp) {
  TempDir dir;
  HostTensor t = f32Tensor({4}, 1.0f);
  writeBytes(dir / "file", "not a directory");
  EXPECT_THROW(CheckpointWriter::save(dir / "file", stateAt(1), {{"model", "w", &t}}), RuntimeError);
  EXPECT_EQ(entriesOf(dir.path), std::vector<std::string>{"file"});
}

}  // namespace
}  // namespace dgemma
