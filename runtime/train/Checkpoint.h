// Training checkpoints (docs/training.md, "Checkpoints"; docs/parallelism.md, "Sharded checkpoints
// and resume"):
//
//   SAVE_DIR/step-00000100/
//     manifest.json                          written last by rank 0; every other file with its size and
//                                            XXH3-64, per tensor its global shape, dtype and boxes, the
//                                            model identity a resume must match, and a checksum of all
//                                            of it (CheckpointManifest.h)
//     model-00001-of-00002.safetensors       one rank, or a group of CheckpointSaveOptions::wholeGroups
//     model-00002-of-00002.safetensors       (assembled by the commit): group "model" in caller order,
//                                            split into shards of at most max_shard_bytes of tensor data
//     model.safetensors.index.json           when no tensor of the group is split (always on one rank):
//                                            HF's index, so SafetensorsDirectory (--weights DIR) reads
//                                            the "model" group
//     model-rank00001-00001-of-00001.safetensors   several ranks: each rank's boxes, under the HF names
//     optimizer-...                          group "optimizer", and so on per group
//     config.json, generation_config.json,   CheckpointSaveOptions::extraFiles (the trainer's: what
//     tokenizer files                        makes the directory an HF model directory)
//
// A tensor is saved as boxes of the global tensor (ShardBoxes.h) that tile it exactly; a box held by
// several ranks is written by the first replica only (firstReplicaRank). Loading assembles any
// requested box from the saved boxes that intersect it, so a checkpoint saved under one layout loads
// under another.
//
// Commit protocol: rank 0 creates SAVE_DIR/.tmp-step-<step>-<id>/ (beginSave; the id is rank 0's
// process id, which every rank learns to name the directory: temporaryDirectory); every rank writes
// its files and a rank-<r>.json list of its boxes there, each file fsync'd (saveRank); once all have
// (a barrier between processes), rank 0 merges the lists into the manifest, fsyncs the directory,
// renames it to step-<8-digit step> and fsyncs SAVE_DIR (commitSave). The rename is the commit: a
// crash leaves either the complete step directory or a .tmp-* directory, which every reader ignores
// and the next save deletes. One run saves into a SAVE_DIR at a time.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/HostTensor.h"
#include "runtime/io/Safetensors.h"
#include "runtime/core/ShardBoxes.h"

namespace dgemma {

inline constexpr const char* kCheckpointFormatName = "dgemma-checkpoint";
// 4: the manifest carries manifest_xxh3_64, a checksum of every other member (CheckpointManifest.h).
inline constexpr int kCheckpointFormatVersion = 4;

// The run state besides the tensors. The JSON members are the caller's, stored verbatim.
struct CheckpointState {
  // What a run resuming from the checkpoint must match, whatever its layout (the trainer's: model
  // config, objective, precision, optimizer settings, every saved tensor's global shape and dtype).
  // Stored with its XXH3-64 as the manifest's "model" and "model_hash"; compared on load.
  nlohmann::json model = nlohmann::json::object();
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

// One box of a global tensor that a rank writes (plan `Parameter`: globalShape, shardOffset, shardShape).
struct CheckpointShard {
  std::string group;                 // as in CheckpointTensor
  std::string name;                  // the global tensor's (HF) name, unique within its group on a rank
  std::vector<int64_t> globalShape;
  ShardBox box;                      // the part of the global tensor `tensor` holds
  const HostTensor* tensor = nullptr;  // box.shape, row-major
};

struct CheckpointSaveOptions {
  uint64_t maxShardBytes = uint64_t{2} << 30;  // tensor data per shard; a larger tensor gets a shard alone
  int keep = 0;                                // keep the newest K complete checkpoints; 0 keeps all
  // Groups saved as whole tensors whatever the layout: when a tensor of one is split across ranks,
  // the commit assembles each tensor from the ranks' boxes (one tensor in memory at a time) into
  // GROUP-0000i-of-0000n.safetensors with HF's index, and drops the rank files. The trainer names
  // "model", so that every checkpoint is an HF model directory (docs/training.md, "Checkpoints").
  std::vector<std::string> wholeGroups;
  // Files the commit writes beside the tensors (file name, bytes), listed in the manifest with their
  // size and hash like every other: the trainer's config.json, generation_config.json and tokenizer
  // files (runtime/model/diffusion_gemma/HfExport.h). Plain names that no checkpoint file uses.
  std::vector<std::pair<std::string, std::string>> extraFiles;
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

  // The steps of a save by `worldSize` ranks (save() runs them for one rank holding whole tensors).
  // Between processes, beginSave's directory goes to every rank and each step ends at a barrier; in
  // one process (the tests) the ranks' saveRank calls simply follow each other.
  //
  // Rank 0, first: deletes what crashed saves left and creates the temporary directory it returns,
  // temporaryDirectory(saveDir, step, getpid()). Throws RuntimeError for I/O failures.
  static std::string beginSave(const std::string& saveDir, int64_t step);
  // SAVE_DIR/step-<8-digit step>: where the save of `step` commits.
  static std::string stepDirectory(const std::string& saveDir, int64_t step);
  // The temporary directory of the save of `step` whose rank 0 has process id `saveId`: how the
  // other ranks name beginSave's directory.
  static std::string temporaryDirectory(const std::string& saveDir, int64_t step, int64_t saveId);
  // Every rank: writes the shards it is the first replica of into `tmpDir`, then its box list.
  // Throws std::invalid_argument for a bad group, a duplicate name, a tensor whose size disagrees
  // with its box or a box outside its global shape (before writing anything); RuntimeError for I/O.
  static void saveRank(const std::string& tmpDir, int rank, int worldSize, const std::vector<CheckpointShard>& shards,
                       const CheckpointSaveOptions& options);
  // Rank 0, after every rank's saveRank: checks that the boxes of every tensor tile its global shape
  // (std::invalid_argument naming the tensor and the overlap or the gap otherwise), writes the
  // manifest (and HF's index for a group of whole tensors), commits and applies `keep`. On any failure the
  // temporary directory is removed.
  static CheckpointSaveResult commitSave(const std::string& saveDir, const std::string& tmpDir, const CheckpointState& state,
                                         int worldSize, const CheckpointSaveOptions& options);
  // Removes a temporary directory of a save that failed on some rank.
  static void abortSave(const std::string& tmpDir);

  // The complete checkpoints in `saveDir`, oldest first: step-<digits> directories whose
  // manifest.json is present, passes parseCheckpointManifest and names the same step (what `keep`
  // counts and deletes). .tmp-* and other entries are ignored; a missing saveDir has none.
  static std::vector<CheckpointEntry> list(const std::string& saveDir);
  // The step-<digits> directory of the highest step, complete or not: what --resume loads, so that
  // a damaged newest checkpoint is reported rather than skipped for an older one. Nothing when
  // there is no such directory.
  static std::optional<CheckpointEntry> newest(const std::string& saveDir);
  static std::optional<std::string> findLatest(const std::string& saveDir);  // newest()'s directory

  // Opens and verifies a checkpoint directory: the manifest (parseCheckpointManifest: its format
  // version, its checksum, every member's type and range), the step against a step-<digits>
  // directory name, its model identity
  // against `expectedModel` (a difference is named by its path, e.g. "model.optimizer.beta2: the
  // checkpoint has 0.999, this run 0.95"), every listed file's size and XXH3-64, and that every saved
  // box is in its file with the recorded dtype and shape and overlaps no other box. Throws
  // InputError naming the file and the fault, e.g.
  //   ".../step-00000004/model-00001-of-00001.safetensors: size: 1000 bytes, the manifest records 1024
  //    (a truncated or torn checkpoint)".
  static Checkpoint load(const std::string& directory, const nlohmann::json& expectedModel);

  Checkpoint(Checkpoint&&) = default;
  Checkpoint& operator=(Checkpoint&&) = default;

  const std::string& directory() const { return directory_; }
  const CheckpointState& state() const { return state_; }
  const nlohmann::json& manifest() const { return manifest_; }
  std::vector<std::string> groups() const;                        // sorted
  std::vector<std::string> names(const std::string& group) const;  // the saved order (rank 0's first)
  bool contains(const std::string& group, const std::string& name) const;
  int worldSize() const { return worldSize_; }  // the ranks that saved it
  // The global shape and dtype of a saved tensor. Throw InputError as read() does.
  const std::vector<int64_t>& globalShape(const std::string& group, const std::string& name) const;
  DType dtype(const std::string& group, const std::string& name) const;
  // The whole tensor, bit-exact. Throws InputError "DIR: group 'G': tensor 'N': not found".
  HostTensor read(const std::string& group, const std::string& name) const;
  // The elements `box` of the global tensor of shape `globalShape` (this rank's box in the loading
  // layout), assembled bit-exactly from the saved boxes that intersect it. Throws InputError naming
  // the tensor when the saved global shape is not `globalShape` (naming both), when the box lies
  // outside it or when the saved boxes leave part of it uncovered (naming that part).
  HostTensor readBox(const std::string& group, const std::string& name, const std::vector<int64_t>& globalShape,
                     const ShardBox& box) const;

 private:
  Checkpoint() = default;

  struct SavedBox {
    ShardBox box;
    size_t file = 0;  // into files_
    size_t entry = 0;  // into that file's entries()
  };
  struct SavedTensor {
    DType dtype = DType::F32;
    std::vector<int64_t> globalShape;
    std::vector<SavedBox> boxes;
  };
  struct Group {
    std::vector<std::string> names;  // saved order
    std::map<std::string, SavedTensor> tensors;
  };

  const SavedTensor& saved(const std::string& group, const std::string& name) const;

  std::string directory_;
  CheckpointState state_;
  nlohmann::json manifest_;
  int worldSize_ = 1;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Group> groups_;
};

}  // namespace dgemma
