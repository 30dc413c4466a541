// Writing training checkpoints (docs/training.md, "Checkpoints"; docs/parallelism.md, "Sharded checkpoints
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
// CheckpointListing.h finds the complete checkpoints of a save directory, CheckpointReader.h loads one.
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
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/HostTensor.h"
#include "runtime/core/ShardBoxes.h"
#include "runtime/train/CheckpointManifest.h"

namespace dgemma {

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

class CheckpointWriter {
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
};

}  // namespace dgemma
