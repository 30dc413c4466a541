// A checkpoint file's size and XXH3-64 as its manifest records them: computed by the writer for every
// file it writes and again by the reader, which compares (docs/training.md, "Checkpoints").
#pragma once

#include <cstdint>
#include <string>

namespace dgemma {

struct FileDigest {
  uint64_t size = 0;
  std::string xxh3;  // 16 lowercase hex digits
};

// Size and XXH3-64 of a whole regular file, read in blocks (a shard can be larger than free memory).
// An I/O error is an InputError when loading (`loading`), a RuntimeError when saving.
FileDigest digestCheckpointFile(const std::string& path, bool loading);

// XXH3-64 (16 hex digits) of the listing of the weights at `path`: the name and size of every
// *.safetensors, *.safetensors.index.json and config.json file of a directory (sorted by name), or of
// the one file. What an adapter checkpoint records of the frozen base it was trained over, cheap to
// recompute on resume (docs/training.md, "LoRA adapters"). InputError when `path` does not exist.
std::string weightsListingDigest(const std::string& path);

}  // namespace dgemma
