// Sharded checkpoints (docs/parallelism.md, "Sharded checkpoints and resume"): several ranks'
// writers run in one process into one temporary directory, and every load reassembles boxes of
// another layout from the saved ones.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/io/Safetensors.h"
#include "runtime/train/CheckpointListing.h"
#include "runtime/train/CheckpointReader.h"
#include "runtime/train/CheckpointWriter.h"
#include "runtime/core/ShardBoxes.h"
#include "support/DType.h"
#include "support/Error.h"
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

// Distinct bytes for every element, so a misplaced element shows.
HostTensor patterned(DType dtype, std::vector<int64_t> shape, uint8_t seed) {
  HostTensor t(dtype, std::move(shape));
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = static_cast<uint8_t>(seed + i * 7 + i / 251);
  return t;
}

// The elements `box` of `whole`, element by element from the row-major index (independent of
// copyRegion, which the checkpoint uses).
HostTensor sliceOf(const HostTensor& whole, const ShardBox& box) {
  HostTensor part(whole.dtype, box.shape);
  const size_t elementSize = dtypeSize(whole.dtype);
  for (int64_t i = 0; i < part.numElements(); ++i) {
    int64_t rest = i, global = 0, stride = 1;
    for (size_t d = box.shape.size(); d-- > 0;) {
      int64_t coordinate = rest % box.shape[d] + box.offset[d];
      rest /= box.shape[d];
      global += coordinate * stride;
      stride *= whole.shape[d];
    }
    std::copy_n(whole.data.begin() + global * elementSize, elementSize, part.data.begin() + i * elementSize);
  }
  return part;
}

CheckpointState stateAt(int64_t step) {
  CheckpointState state;
  state.model = kModel;
  state.step = step;
  state.consumedSamples = 4 * step;
  return state;
}

// One global tensor and each rank's box of it in some layout.
struct Placed {
  std::string group;
  std::string name;
  const HostTensor* whole = nullptr;
  std::vector<ShardBox> boxOfRank;
};

// What the trainer of every rank will do: each rank passes the boxes it is the first replica of.
// Each rank's data is cut out of the whole tensor, as a rank holds only its box.
CheckpointSaveResult saveLayout(const std::string& saveDir, int64_t step, const std::vector<Placed>& tensors, int worldSize,
                                const CheckpointSaveOptions& options = CheckpointSaveOptions{}) {
  std::string tmp = CheckpointWriter::beginSave(saveDir, step);
  std::vector<std::vector<HostTensor>> held(worldSize);
  for (int rank = 0; rank < worldSize; ++rank) {
    held[rank].reserve(tensors.size());
    std::vector<CheckpointShard> shards;
    for (const Placed& t : tensors) {
      if (firstReplicaRank(t.boxOfRank, rank) != rank) continue;
      held[rank].push_back(sliceOf(*t.whole, t.boxOfRank[rank]));
      shards.push_back({t.group, t.name, t.whole->shape, t.boxOfRank[rank], &held[rank].back()});
    }
    CheckpointWriter::saveRank(tmp, rank, worldSize, shards, options);
  }
  return CheckpointWriter::commitSave(saveDir, tmp, stateAt(step), worldSize, options);
}

void expectBoxesLoad(const CheckpointReader& checkpoint, const std::string& group, const std::string& name,
                     const HostTensor& whole, const std::vector<ShardBox>& boxes) {
  for (const ShardBox& box : boxes) {
    HostTensor part = checkpoint.readBox(group, name, whole.shape, box);
    HostTensor expected = sliceOf(whole, box);
    EXPECT_EQ(part.dtype, expected.dtype) << name << " " << describeBox(box);
    EXPECT_EQ(part.shape, expected.shape) << name << " " << describeBox(box);
    EXPECT_EQ(part.data, expected.data) << name << " " << describeBox(box);
  }
}

ShardBox box(std::vector<int64_t> offset, std::vector<int64_t> shape) { return {std::move(offset), std::move(shape)}; }

std::vector<std::string> entriesOf(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ShardBoxesTest, IntersectionAndUncoveredParts) {
  EXPECT_EQ(intersectBoxes(box({0, 0}, {4, 6}), box({2, 3}, {4, 6})), box({2, 3}, {2, 3}));
  EXPECT_FALSE(intersectBoxes(box({0, 0}, {4, 6}), box({4, 0}, {4, 6})));
  EXPECT_EQ(intersectBoxes(box({}, {}), box({}, {})), box({}, {}));  // a scalar is one element
  EXPECT_TRUE(uncoveredParts(box({0, 0}, {8, 6}), {box({0, 0}, {4, 6}), box({4, 0}, {4, 6})}).empty());
  std::vector<ShardBox> gaps = uncoveredParts(box({0, 0}, {8, 6}), {box({0, 0}, {4, 6}), box({4, 0}, {4, 3})});
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_EQ(gaps[0], box({4, 3}, {4, 3}));
  EXPECT_TRUE(uncoveredParts(box({0, 0}, {0, 4}), {}).empty());  // nothing to cover
  EXPECT_EQ(describeBox(box({4, 3}, {4, 3})), "[4:8, 3:6]");
  EXPECT_EQ(firstReplicaRank({box({0}, {4}), box({4}, {4}), box({0}, {4}), box({4}, {4})}, 2), 0);
  EXPECT_EQ(firstReplicaRank({box({0}, {4}), box({4}, {4}), box({0}, {4}), box({4}, {4})}, 3), 1);
  EXPECT_EQ(firstReplicaRank({box({0}, {4}), box({4}, {4})}, 1), 1);
}

// The trainer's "model" group is saved whole whatever the layout, so that every checkpoint is an HF
// directory: the commit assembles the split tensors into HF-named shards with HF's index, the rank
// files go, the boxes still load into any layout, and the extra files are listed and hashed.
TEST(ShardedCheckpointTest, WholeGroupOfSplitTensorsBecomesAnHfDirectory) {
  TempDir dir;
  HostTensor up = patterned(DType::F32, {8, 6}, 3), down = patterned(DType::BF16, {6, 8}, 5), norm = patterned(DType::F32, {6}, 9);
  HostTensor moment = patterned(DType::F32, {8, 6}, 11);
  CheckpointSaveOptions options;
  options.wholeGroups = {"model"};
  options.maxShardBytes = 200;  // up (192 bytes) alone, then down and norm
  options.extraFiles = {{"config.json", "{\"model_type\": \"diffusion_gemma\"}\n"}, {"tokenizer.model", "pieces"}};
  const std::vector<Placed> tensors = {
      {"model", "model.layers.0.mlp.up_proj.weight", &up, {box({0, 0}, {4, 6}), box({4, 0}, {4, 6})}},
      {"model", "model.layers.0.mlp.down_proj.weight", &down, {box({0, 0}, {6, 4}), box({0, 4}, {6, 4})}},
      {"model", "model.norm.weight", &norm, {box({0}, {6}), box({0}, {6})}},
      {"optimizer", "model.layers.0.mlp.up_proj.weight", &moment, {box({0, 0}, {4, 6}), box({4, 0}, {4, 6})}}};
  CheckpointSaveResult saved = saveLayout(dir / "ckpt", 3, tensors, 2, options);
  EXPECT_EQ(entriesOf(saved.directory),
            (std::vector<std::string>{"config.json", "manifest.json", "model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                                      "optimizer-rank00000-00001-of-00001.safetensors",
                                      "optimizer-rank00001-00001-of-00001.safetensors", "tokenizer.model"}));
  EXPECT_EQ(saved.files, 8);
  uint64_t onDisk = 0;
  for (const auto& entry : fs::directory_iterator(saved.directory)) onDisk += entry.file_size();
  EXPECT_EQ(saved.bytesWritten, onDisk);

  // HF's reader sees the model group whole; the optimizer group keeps its boxes.
  SafetensorsDirectory hf = SafetensorsDirectory::open(saved.directory);
  EXPECT_EQ(hf.names(), (std::vector<std::string>{"model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight",
                                                  "model.norm.weight"}));
  EXPECT_EQ(hf.read("model.layers.0.mlp.up_proj.weight").data, up.data);
  EXPECT_EQ(hf.read("model.layers.0.mlp.down_proj.weight").data, down.data);
  EXPECT_EQ(hf.read("model.layers.0.mlp.down_proj.weight").dtype, DType::BF16);
  EXPECT_EQ(hf.read("model.norm.weight").data, norm.data);
  EXPECT_EQ(hf.find("model.layers.0.mlp.up_proj.weight")->file->path(), saved.directory + "/model-00001-of-00002.safetensors");

  CheckpointReader loaded = CheckpointReader::load(saved.directory, kModel);
  expectBoxesLoad(loaded, "model", "model.layers.0.mlp.down_proj.weight", down, {box({0, 0}, {3, 8}), box({0, 3}, {6, 5})});
  expectBoxesLoad(loaded, "optimizer", "model.layers.0.mlp.up_proj.weight", moment, {box({0, 0}, {8, 6})});
  EXPECT_EQ(fileBytes(saved.directory + "/tokenizer.model"), "pieces");

  // The extra files are checked like every other: an edited one fails the load.
  writeBytes(saved.directory + "/config.json", "{}\n");
  EXPECT_TRUE(
      mentions(expectInputError([&] { CheckpointReader::load(saved.directory, kModel); }), "config.json: size"));
}

TEST(ShardedCheckpointTest, ExtraFileNamesMayNotCollide) {
  TempDir dir;
  HostTensor w = patterned(DType::F32, {2}, 1);
  for (const char* name : {"manifest.json", "model-00001-of-00001.safetensors", "a/b", ".tmp-x"}) {
    CheckpointSaveOptions options;
    options.extraFiles = {{name, "x"}};
    EXPECT_THROW(saveLayout(dir / "ckpt", 1, {{"model", "w", &w, {box({0}, {2})}}}, 1, options), std::invalid_argument) << name;
    EXPECT_TRUE(listCheckpoints(dir / "ckpt").empty()) << name;
  }
}

TEST(ShardedCheckpointTest, ColumnSplitLoadsIntoOneTwoAndFourRanks) {
  TempDir dir;
  HostTensor w = patterned(DType::F32, {8, 6}, 3);
  // TP=2 column-parallel: the output features (dim 0) split between the ranks.
  CheckpointSaveResult saved =
      saveLayout(dir / "ckpt", 5, {{"model", "model.layers.0.mlp.up_proj.weight", &w, {box({0, 0}, {4, 6}), box({4, 0}, {4, 6})}}}, 2);
  EXPECT_EQ(entriesOf(saved.directory), (std::vector<std::string>{"manifest.json", "model-rank00000-00001-of-00001.safetensors",
                                                                  "model-rank00001-00001-of-00001.safetensors"}));
  EXPECT_EQ(saved.files, 3);

  CheckpointReader loaded = CheckpointReader::load(saved.directory, kModel);
  EXPECT_EQ(loaded.worldSize(), 2);
  EXPECT_EQ(loaded.globalShape("model", "model.layers.0.mlp.up_proj.weight"), (std::vector<int64_t>{8, 6}));
  EXPECT_EQ(loaded.dtype("model", "model.layers.0.mlp.up_proj.weight"), DType::F32);
  const nlohmann::json& boxes = loaded.manifest()["groups"]["model"]["tensors"][0]["boxes"];
  ASSERT_EQ(boxes.size(), 2u);
  EXPECT_EQ(boxes[1], (nlohmann::json{{"rank", 1},
                                      {"file", "model-rank00001-00001-of-00001.safetensors"},
                                      {"offset", {4, 0}},
                                      {"shape", {4, 6}}}));
  // The saved boxes carry the HF name.
  EXPECT_TRUE(SafetensorsFile::open(saved.directory + "/model-rank00001-00001-of-00001.safetensors")
                  .find("model.layers.0.mlp.up_proj.weight"));

  const std::string name = "model.layers.0.mlp.up_proj.weight";
  EXPECT_EQ(loaded.read("model", name).data, w.data);                                                   // 1 rank
  expectBoxesLoad(loaded, "model", name, w, {box({0, 0}, {8, 3}), box({0, 3}, {8, 3})});                  // 2 ranks, dim 1
  expectBoxesLoad(loaded, "model", name, w,                                                               // 4 ranks, 2 x 2
                  {box({0, 0}, {4, 3}), box({0, 3}, {4, 3}), box({4, 0}, {4, 3}), box({4, 3}, {4, 3})});
  expectBoxesLoad(loaded, "model", name, w, {box({2, 1}, {4, 4}), box({3, 0}, {1, 6}), box({0, 0}, {0, 6})});  // across the seam
}

TEST(ShardedCheckpointTest, ThreeDimensionalTensorSplitOnTwoDims) {
  TempDir dir;
  HostTensor experts = patterned(DType::BF16, {4, 6, 5}, 11);
  // EP=2 on dim 0 times TP=2 on dim 2 (an uneven 3 + 2 split).
  std::vector<ShardBox> saved = {box({0, 0, 0}, {2, 6, 3}), box({0, 0, 3}, {2, 6, 2}), box({2, 0, 0}, {2, 6, 3}),
                                 box({2, 0, 3}, {2, 6, 2})};
  CheckpointReader loaded = CheckpointReader::load(
      saveLayout(dir / "ckpt", 1, {{"model", "experts.gate_up_proj", &experts, saved}}, 4).directory, kModel);
  EXPECT_EQ(loaded.read("model", "experts.gate_up_proj").data, experts.data);
  expectBoxesLoad(loaded, "model", "experts.gate_up_proj", experts,
                  {box({0, 0, 0}, {4, 2, 5}), box({0, 2, 0}, {4, 2, 5}), box({0, 4, 0}, {4, 2, 5})});
  expectBoxesLoad(loaded, "model", "experts.gate_up_proj", experts, {box({1, 1, 1}, {2, 4, 3})});
}

TEST(ShardedCheckpointTest, EachRankSplitsItsFilesAtTheMaximumSize) {
  TempDir dir;
  HostTensor a = patterned(DType::F32, {4, 16}, 31), b = patterned(DType::F32, {4, 16}, 37);
  std::string tmp = CheckpointWriter::beginSave(dir / "ckpt", 2);
  std::vector<HostTensor> held;
  held.reserve(4);
  for (int rank = 0; rank < 2; ++rank) {
    ShardBox half = box({2 * rank, 0}, {2, 16});  // 128 bytes of each tensor: one per 200-byte file
    held.push_back(sliceOf(a, half));
    held.push_back(sliceOf(b, half));
    CheckpointWriter::saveRank(
        tmp, rank, 2,
        {{"model", "a", {4, 16}, half, &held[2 * rank]}, {"model", "b", {4, 16}, half, &held[2 * rank + 1]}},
        {.maxShardBytes = 200});
  }
  CheckpointSaveResult saved = CheckpointWriter::commitSave(dir / "ckpt", tmp, stateAt(2), 2, {});
  EXPECT_EQ(entriesOf(saved.directory),
            (std::vector<std::string>{"manifest.json", "model-rank00000-00001-of-00002.safetensors",
                                      "model-rank00000-00002-of-00002.safetensors", "model-rank00001-00001-of-00002.safetensors",
                                      "model-rank00001-00002-of-00002.safetensors"}));
  EXPECT_EQ(saved.files, 5);
  CheckpointReader loaded = CheckpointReader::load(saved.directory, kModel);
  EXPECT_EQ(loaded.names("model"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(loaded.read("model", "a").data, a.data);
  EXPECT_EQ(loaded.read("model", "b").data, b.data);
}

TEST(ShardedCheckpointTest, ReplicatedTensorsAreWrittenOnceByTheFirstReplica) {
  TempDir dir;
  HostTensor norm = patterned(DType::BF16, {6}, 1), expert = patterned(DType::F32, {4, 3}, 2);
  HostTensor step = patterned(DType::I64, {}, 9);
  // EP=2 x DP=2: ranks 0 and 2 hold experts 0-1, ranks 1 and 3 experts 2-3; norm and the step
  // count are on every rank.
  std::vector<ShardBox> everywhere(4, box({0}, {6}));
  std::vector<ShardBox> experts = {box({0, 0}, {2, 3}), box({2, 0}, {2, 3}), box({0, 0}, {2, 3}), box({2, 0}, {2, 3})};
  CheckpointSaveResult saved = saveLayout(dir / "ckpt", 2,
                                          {{"model", "norm.weight", &norm, everywhere},
                                           {"model", "experts.down_proj", &expert, experts},
                                           {"optimizer", "step", &step, std::vector<ShardBox>(4, box({}, {}))}},
                                          4);
  // Ranks 2 and 3 replicate ranks 0 and 1 and write nothing.
  EXPECT_EQ(entriesOf(saved.directory),
            (std::vector<std::string>{"manifest.json", "model-rank00000-00001-of-00001.safetensors",
                                      "model-rank00001-00001-of-00001.safetensors",
                                      "optimizer-rank00000-00001-of-00001.safetensors", "optimizer.safetensors.index.json"}));
  EXPECT_FALSE(SafetensorsFile::open(saved.directory + "/model-rank00001-00001-of-00001.safetensors").find("norm.weight"));
  CheckpointReader loaded = CheckpointReader::load(saved.directory, kModel);
  const nlohmann::json& tensors = loaded.manifest()["groups"]["model"]["tensors"];
  EXPECT_EQ(tensors[0]["name"], "norm.weight");
  EXPECT_EQ(tensors[0]["boxes"].size(), 1u);
  EXPECT_EQ(tensors[0]["boxes"][0]["rank"], 0);
  EXPECT_EQ(tensors[1]["boxes"].size(), 2u);
  EXPECT_EQ(loaded.read("model", "norm.weight").data, norm.data);
  EXPECT_EQ(loaded.read("model", "experts.down_proj").data, expert.data);
  EXPECT_EQ(loaded.read("optimizer", "step").data, step.data);
  // A group of whole tensors keeps HF's index; a split group has none, and --weights refuses it
  // (SafetensorsDirectory sees the split tensor in two files).
  EXPECT_FALSE(fs::exists(saved.directory + "/model.safetensors.index.json"));
  EXPECT_TRUE(mentions(expectInputError([&] { SafetensorsDirectory::open(saved.directory); }), "experts.down_proj"));
}

TEST(ShardedCheckpointTest, OverlappingOrMissingBoxesAreRefusedAtCommit) {
  TempDir dir;
  HostTensor w = patterned(DType::F32, {8, 6}, 5);
  HostTensor top = sliceOf(w, box({0, 0}, {4, 6})), bottom = sliceOf(w, box({4, 0}, {4, 6}));
  auto shardOf = [&](const HostTensor& part, ShardBox b) { return CheckpointShard{"model", "w", {8, 6}, std::move(b), &part}; };

  // Both replicas of a replicated tensor write it.
  std::string tmp = CheckpointWriter::beginSave(dir / "ckpt", 1);
  CheckpointWriter::saveRank(tmp, 0, 2, {shardOf(w, box({0, 0}, {8, 6}))}, {});
  CheckpointWriter::saveRank(tmp, 1, 2, {shardOf(w, box({0, 0}, {8, 6}))}, {});
  try {
    CheckpointWriter::commitSave(dir / "ckpt", tmp, stateAt(1), 2, {});
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_TRUE(mentions(error.what(), "group 'model': tensor 'w': ranks 0 and 1 both write elements of [0:8, 0:6]"));
  }
  EXPECT_FALSE(fs::exists(tmp));

  // A rank leaves its box out.
  tmp = CheckpointWriter::beginSave(dir / "ckpt", 1);
  CheckpointWriter::saveRank(tmp, 0, 2, {shardOf(top, box({0, 0}, {4, 6}))}, {});
  CheckpointWriter::saveRank(tmp, 1, 2, {}, {});
  try {
    CheckpointWriter::commitSave(dir / "ckpt", tmp, stateAt(1), 2, {});
    ADD_FAILURE() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& error) {
    EXPECT_TRUE(mentions(error.what(), "tensor 'w': no rank writes [4:8, 0:6] of its global shape [8, 6]"));
  }

  // A rank that never wrote (the barrier was skipped).
  tmp = CheckpointWriter::beginSave(dir / "ckpt", 1);
  CheckpointWriter::saveRank(tmp, 0, 2, {shardOf(top, box({0, 0}, {4, 6}))}, {});
  EXPECT_THROW(
      try { CheckpointWriter::commitSave(dir / "ckpt", tmp, stateAt(1), 2, {}); } catch (const RuntimeError& error) {
        EXPECT_TRUE(mentions(error.what(), "rank 1 of 2 has not written its shards"));
        throw;
      },
      RuntimeError);

  // A rank that was told another world size.
  tmp = CheckpointWriter::beginSave(dir / "ckpt", 1);
  CheckpointWriter::saveRank(tmp, 0, 3, {shardOf(top, box({0, 0}, {4, 6}))}, {});
  EXPECT_THROW(CheckpointWriter::commitSave(dir / "ckpt", tmp, stateAt(1), 2, {}), RuntimeError);
  EXPECT_FALSE(fs::exists(tmp));

  // A box that does not fit its tensor, before anything is written.
  tmp = CheckpointWriter::beginSave(dir / "ckpt", 1);
  EXPECT_THROW(CheckpointWriter::saveRank(tmp, 1, 2, {shardOf(bottom, box({5, 0}, {4, 6}))}, {}),
               std::invalid_argument);
  EXPECT_THROW(CheckpointWriter::saveRank(tmp, 1, 2, {shardOf(bottom, box({0, 0}, {4, 3}))}, {}),
               std::invalid_argument);
  EXPECT_THROW(CheckpointWriter::saveRank(tmp, 2, 2, {shardOf(bottom, box({4, 0}, {4, 6}))}, {}),
               std::invalid_argument);
  EXPECT_EQ(entriesOf(tmp), std::vector<std::string>{});
  CheckpointWriter::abortSave(tmp);
  EXPECT_EQ(entriesOf(dir / "ckpt"), std::vector<std::string>{});
}

TEST(ShardedCheckpointTest, UncoveredRequestNamesTheTensorAndTheRegion) {
  TempDir dir;
  HostTensor w = patterned(DType::F32, {8, 6}, 7);
  std::string path = saveLayout(dir / "ckpt", 3, {{"model", "w", &w, {box({0, 0}, {4, 6}), box({4, 0}, {4, 6})}}}, 2).directory;
  // A manifest that lost rank 1's box.
  nlohmann::json manifest = nlohmann::json::parse(fileBytes(path + "/manifest.json"));
  manifest["groups"]["model"]["tensors"][0]["boxes"].erase(1);
  writeBytes(path + "/manifest.json", test::resealedManifestText(manifest));
  CheckpointReader loaded = CheckpointReader::load(path, kModel);
  EXPECT_TRUE(mentions(expectInputError([&] { loaded.read("model", "w"); }),
                       "group 'model': tensor 'w': the saved boxes do not cover [4:8, 0:6] of the requested box [0:8, 0:6]"));
  EXPECT_TRUE(mentions(expectInputError([&] { loaded.readBox("model", "w", {8, 6}, box({2, 3}, {4, 3})); }),
                       "tensor 'w': the saved boxes do not cover [4:6, 3:6] of the requested box [2:6, 3:6]"));
  expectBoxesLoad(loaded, "model", "w", w, {box({0, 0}, {4, 6}), box({1, 2}, {3, 2})});  // what is there still loads
  EXPECT_TRUE(mentions(expectInputError([&] { loaded.readBox("model", "w", {8, 6}, box({6, 0}, {4, 6})); }),
                       "tensor 'w': the requested box [6:10, 0:6] does not lie inside the saved shape [8, 6]"));
  EXPECT_TRUE(mentions(expectInputError([&] { loaded.readBox("model", "v", {8, 6}, box({0, 0}, {4, 6})); }),
                       "group 'model': tensor 'v': not found"));
  // A box of a tensor of another global shape is refused even where it would fit the saved one.
  EXPECT_TRUE(mentions(expectInputError([&] { loaded.readBox("model", "w", {8, 12}, box({0, 0}, {4, 6})); }),
                       "group 'model': tensor 'w': the checkpoint holds it with the global shape [8, 6], this run's is [8, 12]"));
}

TEST(ShardedCheckpointTest, CorruptedOrMisshapenShardsNameTheFile) {
  TempDir dir;
  HostTensor w = patterned(DType::F32, {8, 6}, 13);
  std::string path = saveLayout(dir / "ckpt", 3, {{"model", "w", &w, {box({0, 0}, {4, 6}), box({4, 0}, {4, 6})}}}, 2).directory;
  const std::string rank1 = path + "/model-rank00001-00001-of-00001.safetensors";
  const std::string original = fileBytes(rank1);

  std::string flipped = original;
  flipped[flipped.size() - 5] ^= 0x10;
  writeBytes(rank1, flipped);
  EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(path, kModel); }),
                       rank1 + ": xxh3_64: the file hashes to"));
  writeBytes(rank1, original);

  // The manifest records a box whose shape is not the stored tensor's.
  const std::string manifestText = fileBytes(path + "/manifest.json");
  nlohmann::json manifest = nlohmann::json::parse(manifestText);
  manifest["groups"]["model"]["tensors"][0]["boxes"][1]["shape"] = {3, 6};
  writeBytes(path + "/manifest.json", test::resealedManifestText(manifest));
  EXPECT_TRUE(
      mentions(expectInputError([&] { CheckpointReader::load(path, kModel); }),
               rank1 + ": tensor \"w\": f32 [4, 6], the manifest records the f32 box [4:7, 0:6] of shape [3, 6]"));
  // Or boxes that overlap.
  manifest = nlohmann::json::parse(manifestText);
  manifest["groups"]["model"]["tensors"][0]["boxes"][1]["offset"] = {2, 0};
  writeBytes(path + "/manifest.json", test::resealedManifestText(manifest));
  EXPECT_TRUE(mentions(expectInputError([&] { CheckpointReader::load(path, kModel); }),
                       "groups.model.tensors[0].boxes[1]: tensor \"w\": box [2:6, 0:6] overlaps box [0:4, 0:6]"));
  writeBytes(path + "/manifest.json", manifestText);
  EXPECT_EQ(CheckpointReader::load(path, kModel).read("model", "w").data, w.data);
}

TEST(ShardedCheckpointTest, RoundTripAcrossLayoutsIsBitExact) {
  TempDir dir;
  HostTensor up = patterned(DType::F32, {8, 6}, 17), moment = patterned(DType::F32, {8, 6}, 19);
  HostTensor norm = patterned(DType::BF16, {6}, 23), step = patterned(DType::I64, {}, 29);
  std::vector<ShardBox> rowsA = {box({0, 0}, {4, 6}), box({4, 0}, {4, 6})};          // layout A: TP=2 on dim 0
  std::vector<ShardBox> colsB = {box({0, 0}, {8, 2}), box({0, 2}, {8, 2}), box({0, 4}, {8, 2})};  // layout B: 3 ranks on dim 1
  auto placedA = [&](const HostTensor& u, const HostTensor& m, const HostTensor& n, const HostTensor& s) {
    return std::vector<Placed>{{"model", "up.weight", &u, rowsA},
                               {"model", "norm.weight", &n, std::vector<ShardBox>(2, box({0}, {6}))},
                               {"optimizer", "exp_avg/up.weight", &m, rowsA},
                               {"optimizer", "step", &s, std::vector<ShardBox>(2, box({}, {}))}};
  };
  std::string a = saveLayout(dir / "a", 4, placedA(up, moment, norm, step), 2).directory;

  // Load A into B: each B rank assembles its boxes; then B saves them (rebuilt whole here only to
  // feed saveLayout's slicing, which cuts each rank's box out again).
  CheckpointReader fromA = CheckpointReader::load(a, kModel);
  auto assemble = [&](const CheckpointReader& checkpoint, const std::string& group, const std::string& name,
                      const std::vector<ShardBox>& boxes) {
    HostTensor whole(checkpoint.dtype(group, name), checkpoint.globalShape(group, name));
    for (const ShardBox& b : boxes) {
      HostTensor part = checkpoint.readBox(group, name, whole.shape, b);
      copyRegion(part.data.data(), b, whole.data.data(), wholeBox(whole.shape), b, dtypeSize(whole.dtype));
    }
    return whole;
  };
  HostTensor upB = assemble(fromA, "model", "up.weight", colsB), momentB = assemble(fromA, "optimizer", "exp_avg/up.weight", colsB);
  HostTensor normB = fromA.readBox("model", "norm.weight", {6}, box({0}, {6})), stepB = fromA.readBox("optimizer", "step", {}, box({}, {}));
  std::string b = saveLayout(dir / "b", 4,
                             {{"model", "up.weight", &upB, colsB},
                              {"model", "norm.weight", &normB, std::vector<ShardBox>(3, box({0}, {6}))},
                              {"optimizer", "exp_avg/up.weight", &momentB, colsB},
                              {"optimizer", "step", &stepB, std::vector<ShardBox>(3, box({}, {}))}},
                             3)
                      .directory;

  // B loads back into A's boxes, and A's files come out byte for byte.
  CheckpointReader fromB = CheckpointReader::load(b, kModel);
  expectBoxesLoad(fromB, "model", "up.weight", up, rowsA);
  expectBoxesLoad(fromB, "optimizer", "exp_avg/up.weight", moment, rowsA);
  HostTensor upA = assemble(fromB, "model", "up.weight", rowsA), momentA = assemble(fromB, "optimizer", "exp_avg/up.weight", rowsA);
  HostTensor normA = fromB.read("model", "norm.weight"), stepA = fromB.read("optimizer", "step");
  std::string again = saveLayout(dir / "again", 4, placedA(upA, momentA, normA, stepA), 2).directory;
  for (const std::string& file : entriesOf(a)) EXPECT_EQ(fileBytes(again + "/" + file), fileBytes(a + "/" + file)) << file;
  EXPECT_EQ(entriesOf(again), entriesOf(a));
}

}  // namespace
}  // namespace dgemma
