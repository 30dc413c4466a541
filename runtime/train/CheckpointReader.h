// A training checkpoint opened for reading (docs/training.md, "Checkpoints"; docs/parallelism.md,
// "Sharded checkpoints and resume"): its manifest and every file verified on load, then any box of a
// saved tensor assembled from the boxes of whatever layout saved it. CheckpointWriter.h describes
// the directory's files.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/HostTensor.h"
#include "runtime/core/ShardBoxes.h"
#include "runtime/io/Safetensors.h"
#include "runtime/train/CheckpointManifest.h"

namespace dgemma {

class CheckpointReader {
 public:
  // Opens and verifies a checkpoint directory: the manifest (parseCheckpointManifest: its format
  // version, its checksum, every member's type and range), the step against a step-<digits>
  // directory name, its model identity
  // against `expectedModel` (a difference is named by its path, e.g. "model.optimizer.beta2: the
  // checkpoint has 0.999, this run 0.95"), every listed file's size and XXH3-64, and that every saved
  // box is in its file with the recorded dtype and shape and overlaps no other box. Throws
  // InputError naming the file and the fault, e.g.
  //   ".../step-00000004/model-00001-of-00001.safetensors: size: 1000 bytes, the manifest records 1024
  //    (a truncated or torn checkpoint)".
  static CheckpointReader load(const std::string& directory, const nlohmann::json& expectedModel);

  CheckpointReader(CheckpointReader&&) = default;
  CheckpointReader& operator=(CheckpointReader&&) = default;

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
  CheckpointReader() = default;

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
