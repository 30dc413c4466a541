// A checkpoint's manifest.json as read from bytes nobody vouches for (docs/training.md,
// "Checkpoints"): parsed with a nesting bound, its checksum verified, and every field a resume uses
// checked for type and range before anything walks it. Nothing here touches the files the manifest
// lists; CheckpointReader::load verifies those.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/ShardBoxes.h"
#include "support/DType.h"

namespace dgemma {

inline constexpr const char* kCheckpointFormatName = "dgemma-checkpoint";
// 4: the manifest carries manifest_xxh3_64, a checksum of every other member.
inline constexpr int kCheckpointFormatVersion = 4;

// The file of a checkpoint directory that rank 0 writes last: its presence makes the checkpoint complete.
inline constexpr const char* kCheckpointManifestName = "manifest.json";

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

// The manifest member holding manifestChecksum(): 16 lowercase hex digits.
inline constexpr const char* kManifestChecksumField = "manifest_xxh3_64";

// XXH3-64 (hex) of the manifest's compact JSON with object keys sorted, every member but
// kManifestChecksumField included: an edit to any field, even one re-indented, changes its value
// only when it changes a value.
std::string manifestChecksum(const nlohmann::json& manifest);

// The model identity's XXH3-64 (hex), the manifest's "model_hash".
std::string modelIdentityHash(const nlohmann::json& model);

struct ManifestFile {
  std::string name;  // a plain file name in the checkpoint directory
  uint64_t size = 0;
  std::string xxh3;  // 16 lowercase hex digits
};

struct ManifestBox {
  int rank = 0;
  std::string file;  // one of its group's shards
  ShardBox box;      // inside the tensor's global shape
};

struct ManifestTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> globalShape;
  std::vector<ManifestBox> boxes;  // pairwise disjoint, at most one per rank
};

struct ManifestGroup {
  std::string name;                  // [a-z0-9_]+
  std::vector<std::string> shards;   // among the listed files
  std::vector<ManifestTensor> tensors;  // the saved order; names unique
};

struct CheckpointManifest {
  nlohmann::json json;   // the whole manifest as parsed
  CheckpointState state;
  int worldSize = 1;
  std::vector<ManifestFile> files;    // names unique
  std::vector<ManifestGroup> groups;  // sorted by name
};

// Parses and validates a manifest: the format and its version (earlier versions, without the
// checksum, are refused naming what they lack), the checksum, the model hash, and the type and
// range of every member. Throws InputError "SOURCE: FIELD: what was expected", FIELD a path such as
// "groups.model.tensors[3].boxes[1].offset". This is the entry the manifest fuzz target calls.
CheckpointManifest parseCheckpointManifest(std::string_view bytes, const std::string& source);

}  // namespace dgemma
