// Training checkpoints (docs/training.md, "Run outputs"):
//
//   SAVE_DIR/step-00000100/
//     manifest.json                          written last; lists every other file with its size and XXH3-64
//     model-00001-of-00002.safetensors       the tensors of group "model", in caller order, split into
//     model-00002-of-00002.safetensors       shards of at most max_shard_bytes of tensor data
//     model.safetensors.index.json           HF's index ({"metadata": {"total_size"}, "weight_map"}), so
//                                            SafetensorsDirectory (--weights DIR) reads the "model" group
//     optimizer-00001-of-00001.safetensors   group "optimizer", and so on per group
//     optimizer.safetensors.index.json
//
// Commit protocol: everything is written into SAVE_DIR/.tmp-step-<step>-<pid>/, each file fsync'd,
// then that directory fsync'd, renamed to step-<8-digit step>, and SAVE_DIR fsync'd. The rename is
// the commit: a crash leaves either the complete step directory or a .tmp-* directory, which every
// reader ignores and the next save deletes. One process saves into a SAVE_DIR at a time.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/HostTensor.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {

inline constexpr int kCheckpointFormatVersion = 1;

// The run state besides the tensors. The JSON members are the caller's, stored verbatim.
struct CheckpointState {
  std::string planHash;          // compared on load
  int64_t step = 0;              // optimizer steps completed
  int64_t consumedSamples = 0;
  nlohmann::json dataOrderState = nlohmann::json::object();  // the sampler's state (docs/data.md, "Item order")
  nlohmann::json rng = nlohmann::json::object();             // seeds, noise-seeding mode
  nlohmann::json config = nlohmann::json::object();          // the run configuration (schedule included)
};

struct CheckpointTensor {
  std::string group;  // file prefix: [a-z0-9_]+, e.g. "model", "optimizer"
  std::string name;   // unique within its group
  const HostTensor* tensor = nullptr;
};

struct CheckpointSaveOptions {
  uint64_t maxShardBytes = uint64_t{2} << 30;  // tensor data per shard; a larger tensor gets a shard alone
  int keep = 0;                                // keep the newest K complete checkpoints; 0 keeps all
};

struct CheckpointSaveResult {
  std::string directory;             // SAVE_DIR/step-NNNNNNNN
  uint64_t bytesWritten = 0;         // every file, manifest included
  int files = 0;
  double seconds = 0.0;              // wall time of the whole save, fsyncs included
  std::vector<std::string> removed;  // older checkpoints deleted by `keep`
};

// A complete checkpoint found in a save directory.
struct CheckpointEntry {
  int64_t step = 0;
  std::string directory;
};

class Checkpoint {
 public:
  // Writes a checkpoint of `state` and `tensors` (see the file comment), then applies `keep`. A
  // checkpoint of the same step already there is replaced. Throws std::invalid_argument for a bad
  // group or duplicate name (before writing anything), RuntimeError for I/O failures (the .tmp
  // directory is removed; earlier checkpoints are untouched).
  static CheckpointSaveResult save(const std::string& saveDir, const CheckpointState& state,
                                   const std::vector<CheckpointTensor>& tensors, const CheckpointSaveOptions& options);
  static CheckpointSaveResult save(const std::string& saveDir, const CheckpointState& state,
                                   const std::vector<CheckpointTensor>& tensors) {
    return save(saveDir, state, tensors, CheckpointSaveOptions{});
  }

  // The complete checkpoints in `saveDir`, oldest first: step-<digits> directories whose
  // manifest.json is present, parses and names the same step. .tmp-* and other entries are ignored;
  // a missing saveDir has none.
  static std::vector<CheckpointEntry> list(const std::string& saveDir);
  // The newest of list(), or nothing.
  static std::optional<std::string> findLatest(const std::string& saveDir);

  // Opens and verifies a checkpoint directory: the manifest's format version and plan hash, and
  // every listed file's size and XXH3-64. Throws InputError naming the file and the fault, e.g.
  //   ".../step-00000004/model-00001-of-00001.safetensors: size: 1000 bytes, the manifest records 1024
  //    (a truncated or torn checkpoint)".
  static Checkpoint load(const std::string& directory, const std::string& expectedPlanHash);

  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;

  const std::string& directory() const { return directory_; }
  const CheckpointState& state() const { return state_; }
  const nlohmann::json& manifest() const { return manifest_; }
  std::vector<std::string> groups() const;                        // sorted
  std::vector<std::string> names(const std::string& group) const;  // shard by shard, in data order (the saved order)
  bool contains(const std::string& group, const std::string& name) const;
  // A copy of the tensor, bit-exact. Throws InputError "DIR: group 'G': tensor 'N': not found".
  HostTensor read(const std::string& group, const std::string& name) const;

 private:
  Checkpoint() = default;

  struct Location {
    size_t file = 0;
    size_t entry = 0;
  };
  struct Group {
    std::vector<std::string> names;  // saved order
    std::map<std::string, Location> byName;
  };

  std::string directory_;
  CheckpointState state_;
  nlohmann::json manifest_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Group> groups_;
};

}  // namespace dgemma
