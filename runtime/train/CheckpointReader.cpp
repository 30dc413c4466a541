#include "runtime/train/CheckpointReader.h"

#include <filesystem>
#include <optional>
#include <set>
#include <system_error>

#include "runtime/train/CheckpointFileDigest.h"
#include "runtime/train/CheckpointListing.h"
#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {

namespace {

namespace fs = std::filesystem;

std::string describeShape(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) text += (d ? ", " : "") + std::to_string(shape[d]);
  return text + "]";
}

// A key of a path in a message: as it is when it is a plain name, quoted otherwise.
std::string quoteKey(const std::string& key) {
  bool plain = !key.empty() && key.size() <= 80;
  for (char c : key)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '/' || c == '.'))
      plain = false;
  return plain ? key : quoteForMessage(key);
}

// A value of this run's own identity (bounded: the trainer builds it), cut for a message.
std::string describeOwnValue(const nlohmann::json* value) {
  if (!value) return "nothing";
  std::string text = value->dump();
  return text.size() > 120 ? text.substr(0, 117) + "..." : text;
}

// A value of the checkpoint's identity: from the manifest, so never walked for a message.
std::string describeSavedValue(const nlohmann::json* value) { return value ? describeJsonValue(*value) : "nothing"; }

// "PATH.key: the checkpoint has A, this run B" for the first member (in key order, depth first)
// where `saved` and `now` differ; arrays of numbers (shapes) are compared whole. The recursion
// follows `saved`, which parseJson bounded to kMaxJsonDepth levels.
std::string firstDifference(const std::string& path, const nlohmann::json& saved, const nlohmann::json& now) {
  if (saved.is_object() && now.is_object()) {
    std::set<std::string> keys;
    for (const auto& [key, unused] : saved.items()) keys.insert(key);
    for (const auto& [key, unused] : now.items()) keys.insert(key);
    for (const std::string& key : keys) {
      auto before = saved.find(key), after = now.find(key);
      const nlohmann::json* savedValue = before == saved.end() ? nullptr : &*before;
      const nlohmann::json* nowValue = after == now.end() ? nullptr : &*after;
      if (savedValue && nowValue && *savedValue == *nowValue) continue;
      if (savedValue && nowValue) return firstDifference(path + "." + quoteKey(key), *savedValue, *nowValue);
      return path + "." + quoteKey(key) + ": the checkpoint has " + describeSavedValue(savedValue) + ", this run " +
             describeOwnValue(nowValue);
    }
  }
  return path + ": the checkpoint has " + describeSavedValue(&saved) + ", this run " + describeOwnValue(&now);
}

}  // namespace

CheckpointReader CheckpointReader::load(const std::string& directory, const nlohmann::json& expectedModel) {
  const fs::path root(directory);
  const std::string manifestPath = (root / kCheckpointManifestName).string();
  std::error_code error;
  if (!fs::is_directory(root, error)) throw InputError(directory + ": no such checkpoint directory");
  if (!fs::exists(manifestPath, error))
    throw InputError(manifestPath + ": missing: not a complete checkpoint (an interrupted save, or not a checkpoint directory)");

  CheckpointReader checkpoint;
  checkpoint.directory_ = directory;
  CheckpointManifest manifest = readCheckpointManifest(manifestPath);
  auto bad = [&](const std::string& field, const std::string& what) -> InputError {
    return InputError(manifestPath + ": " + field + ": " + what);
  };
  if (modelIdentityHash(manifest.state.model) != modelIdentityHash(expectedModel))
    throw bad(firstDifference("model", manifest.state.model, expectedModel),
              "a checkpoint of another model or recipe (the layout may differ, nothing else that decides the run)");
  // The directory's name is the step a listing shows and a resume continues from.
  std::optional<int64_t> named = stepOfCheckpointDirectoryName(root.filename().string());
  if (named && *named != manifest.state.step)
    throw bad("step", std::to_string(manifest.state.step) + ", but the directory is " + root.filename().string() +
                          " (an edited manifest, or a directory renamed by hand)");
  checkpoint.state_ = manifest.state;
  checkpoint.worldSize_ = manifest.worldSize;

  // Every listed file: present, of the recorded size, with the recorded hash.
  for (const ManifestFile& file : manifest.files) {
    const std::string path = (root / file.name).string();
    if (!fs::is_regular_file(path, error)) throw InputError(path + ": missing (the manifest lists it; a torn checkpoint)");
    const uint64_t actualSize = fs::file_size(path, error);
    if (error) throw InputError(path + ": cannot stat: " + error.message());
    if (actualSize != file.size)
      throw InputError(path + ": size: " + std::to_string(actualSize) + " bytes, the manifest records " +
                       std::to_string(file.size) + " (a truncated or torn checkpoint)");
    const FileDigest facts = digestCheckpointFile(path, /*loading=*/true);
    if (facts.size != file.size)
      throw InputError(path + ": size: " + std::to_string(facts.size) + " bytes read, the manifest records " +
                       std::to_string(file.size) + " (the file changed while being read)");
    if (facts.xxh3 != file.xxh3)
      throw InputError(path + ": xxh3_64: the file hashes to " + facts.xxh3 + ", the manifest records " + file.xxh3 +
                       " (a corrupted checkpoint)");
  }

  // The groups: every box in its shard file with the recorded dtype and shape.
  for (const ManifestGroup& group : manifest.groups) {
    Group& loaded = checkpoint.groups_[group.name];
    std::map<std::string, size_t> fileByName;
    for (const std::string& shard : group.shards) {
      checkpoint.files_.push_back(SafetensorsFile::open((root / shard).string()));
      fileByName[shard] = checkpoint.files_.size() - 1;
    }
    for (const ManifestTensor& tensor : group.tensors) {
      loaded.names.push_back(tensor.name);
      SavedTensor& savedTensor = loaded.tensors[tensor.name];
      savedTensor.dtype = tensor.dtype;
      savedTensor.globalShape = tensor.globalShape;
      for (const ManifestBox& box : tensor.boxes) {
        const size_t file = fileByName.at(box.file);
        const SafetensorsFile& shardFile = checkpoint.files_[file];
        const SafetensorsEntry* stored = shardFile.find(tensor.name);
        const std::string where = shardFile.path() + ": tensor " + quoteForMessage(tensor.name) + ": ";
        if (!stored) throw InputError(where + "missing (the manifest records its box " + describeBox(box.box) + " there)");
        if (stored->dtype != tensor.dtype || stored->shape != box.box.shape)
          throw InputError(where + std::string(dtypeName(stored->dtype)) + " " + describeShape(stored->shape) +
                           ", the manifest records the " + std::string(dtypeName(tensor.dtype)) + " box " +
                           describeBox(box.box) + " of shape " + describeShape(box.box.shape));
        savedTensor.boxes.push_back({box.box, file, static_cast<size_t>(stored - shardFile.entries().data())});
      }
    }
  }
  checkpoint.manifest_ = std::move(manifest.json);
  return checkpoint;
}

std::vector<std::string> CheckpointReader::groups() const {
  std::vector<std::string> names;
  for (const auto& [group, unused] : groups_) names.push_back(group);
  return names;
}

std::vector<std::string> CheckpointReader::names(const std::string& group) const {
  auto found = groups_.find(group);
  return found == groups_.end() ? std::vector<std::string>{} : found->second.names;
}

bool CheckpointReader::contains(const std::string& group, const std::string& name) const {
  auto found = groups_.find(group);
  return found != groups_.end() && found->second.tensors.count(name) != 0;
}

const CheckpointReader::SavedTensor& CheckpointReader::saved(const std::string& group, const std::string& name) const {
  auto found = groups_.find(group);
  if (found != groups_.end()) {
    auto tensor = found->second.tensors.find(name);
    if (tensor != found->second.tensors.end()) return tensor->second;
  }
  throw InputError(directory_ + ": group '" + group + "': tensor '" + name + "': not found");
}

const std::vector<int64_t>& CheckpointReader::globalShape(const std::string& group, const std::string& name) const {
  return saved(group, name).globalShape;
}

DType CheckpointReader::dtype(const std::string& group, const std::string& name) const {
  return saved(group, name).dtype;
}

HostTensor CheckpointReader::read(const std::string& group, const std::string& name) const {
  const std::vector<int64_t>& globalShape = saved(group, name).globalShape;
  return readBox(group, name, globalShape, wholeBox(globalShape));
}

HostTensor CheckpointReader::readBox(const std::string& group, const std::string& name,
                                     const std::vector<int64_t>& globalShape, const ShardBox& box) const {
  const SavedTensor& tensor = saved(group, name);
  std::string where = directory_ + ": group '" + group + "': tensor '" + name + "': ";
  if (tensor.globalShape != globalShape)
    throw InputError(where + "the checkpoint holds it with the global shape " + describeShape(tensor.globalShape) +
                     ", this run's is " + describeShape(globalShape) + " (a checkpoint of another model)");
  if (!boxFitsIn(box, tensor.globalShape))
    throw InputError(where + "the requested box " + describeBox(box) + " does not lie inside the saved shape " +
                     describeShape(tensor.globalShape) + " (a checkpoint of another model)");
  std::vector<ShardBox> savedBoxes;
  for (const SavedBox& piece : tensor.boxes) savedBoxes.push_back(piece.box);
  std::vector<ShardBox> gaps = uncoveredParts(box, savedBoxes);
  if (!gaps.empty())
    throw InputError(where + "the saved boxes do not cover " + describeBox(gaps.front()) + " of the requested box " +
                     describeBox(box) + (gaps.size() > 1 ? " (and " + std::to_string(gaps.size() - 1) + " more parts)" : "") +
                     " (a checkpoint without some rank's shards)");
  HostTensor result(tensor.dtype, box.shape);
  for (const SavedBox& piece : tensor.boxes) {
    std::optional<ShardBox> common = intersectBoxes(piece.box, box);
    if (!common) continue;
    const SafetensorsFile& file = files_[piece.file];
    copyRegion(file.data(file.entries()[piece.entry]), piece.box, result.data.data(), box, *common, dtypeSize(tensor.dtype));
  }
  return result;
}

}  // namespace dgemma
