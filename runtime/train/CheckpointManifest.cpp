#include "runtime/train/CheckpointManifest.h"

#include <xxhash.h>

#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {

namespace {

// Larger than any extent or offset of a real tensor, and small enough that offset + extent and
// the checked products below cannot overflow int64.
constexpr int64_t kMaxExtent = int64_t{1} << 48;
constexpr int64_t kMaxElements = int64_t{1} << 56;
constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string hashOfText(const std::string& text) { return hex64(XXH3_64bits(text.data(), text.size())); }

// Compact, keys sorted (nlohmann::json's maps); invalid UTF-8 cannot come from the parser, and is
// replaced rather than thrown on for a value built in memory.
std::string canonicalText(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool isLowerHex(const std::string& text, size_t digits) {
  if (text.size() != digits) return false;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool validGroupName(const std::string& group) {
  if (group.empty() || group.size() > 64) return false;
  for (char c : group)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

// A plain name of a file in the checkpoint directory: no separator, no NUL, not hidden, not the
// manifest itself.
bool validFileName(const std::string& name) {
  if (name.empty() || name.size() > 255 || name[0] == '.' || name == "manifest.json") return false;
  for (char c : name)
    if (c == '/' || c == '\0') return false;
  return true;
}

class ManifestReader {
 public:
  ManifestReader(const nlohmann::json& manifest, const std::string& source) : manifest_(manifest), source_(source) {}

  InputError bad(const std::string& field, const std::string& what) const {
    return InputError(source_ + ": " + field + ": " + what);
  }

  const nlohmann::json& field(const char* name) const {
    auto found = manifest_.find(name);
    if (found == manifest_.end()) throw bad(name, "missing");
    return *found;
  }

  // An integer in [minimum, maximum], named `where`.
  int64_t integer(const nlohmann::json& value, const std::string& where, int64_t minimum, int64_t maximum,
                  const std::string& expected) const {
    bool fits = false;
    int64_t result = 0;
    if (value.is_number_unsigned()) {
      const uint64_t unsignedValue = value.get<uint64_t>();
      fits = unsignedValue <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
      result = static_cast<int64_t>(unsignedValue);
    } else if (value.is_number_integer()) {
      fits = true;
      result = value.get<int64_t>();
    }
    if (!fits || result < minimum || result > maximum) throw bad(where, "expected " + expected + ", got " + describeJsonValue(value));
    return result;
  }

  std::string string(const nlohmann::json& object, const char* key, const std::string& where, const std::string& expected) const {
    auto found = object.find(key);
    if (found == object.end() || !found->is_string()) throw bad(where + "." + key, "expected " + expected);
    return found->get<std::string>();
  }

  // An array of integers in [0, kMaxExtent].
  std::vector<int64_t> extents(const nlohmann::json& object, const char* key, const std::string& where) const {
    auto found = object.find(key);
    const std::string at = where + "." + key;
    if (found == object.end() || !found->is_array() || found->size() > 16)
      throw bad(at, "expected an array of at most 16 integers");
    std::vector<int64_t> values;
    for (size_t d = 0; d < found->size(); ++d)
      values.push_back(integer((*found)[d], at + "[" + std::to_string(d) + "]", 0, kMaxExtent,
                               "an integer in [0, " + std::to_string(kMaxExtent) + "]"));
    return values;
  }

 private:
  const nlohmann::json& manifest_;
  const std::string& source_;
};

int64_t checkedElementCount(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t extent : shape) {
    if (extent != 0 && count > kMaxElements / extent) return -1;
    count *= extent;
  }
  return count;
}

std::string describeShape(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) text += (d ? ", " : "") + std::to_string(shape[d]);
  return text + "]";
}

}  // namespace

std::string manifestChecksum(const nlohmann::json& manifest) {
  if (!manifest.is_object()) return hashOfText(canonicalText(manifest));
  nlohmann::json covered = manifest;
  covered.erase(kManifestChecksumField);
  return hashOfText(canonicalText(covered));
}

std::string modelIdentityHash(const nlohmann::json& model) { return hashOfText(canonicalText(model)); }

CheckpointManifest parseCheckpointManifest(std::string_view bytes, const std::string& source) {
  CheckpointManifest result;
  try {
    result.json = parseJson(bytes, source);
  } catch (const InputError& error) {
    throw InputError(std::string(error.what()) + " (a torn or corrupted checkpoint)");
  }
  const nlohmann::json& manifest = result.json;
  ManifestReader reader(manifest, source);
  if (!manifest.is_object()) throw reader.bad("(top level)", "expected an object, got " + describeJsonValue(manifest));

  const nlohmann::json& format = reader.field("format");
  if (format != kCheckpointFormatName)
    throw reader.bad("format", "expected \"" + std::string(kCheckpointFormatName) + "\", got " + describeJsonValue(format));
  const nlohmann::json& version = reader.field("format_version");
  if (version == 1 || version == 2 || version == 3)
    throw reader.bad("format_version",
                     describeJsonValue(version) +
                         " is the format of earlier builds (1: whole tensors; 2: a plan hash that ties it to one layout; "
                         "3: no manifest checksum), which this build no longer reads (it reads version " +
                         std::to_string(kCheckpointFormatVersion) + "): resume with the build that saved it, or start afresh");
  if (version != kCheckpointFormatVersion)
    throw reader.bad("format_version", describeJsonValue(version) + " is not supported (this build reads version " +
                                           std::to_string(kCheckpointFormatVersion) + ")");

  // The checksum first: every check below may then name a field as the writer meant it.
  const nlohmann::json& recordedChecksum = reader.field(kManifestChecksumField);
  if (!recordedChecksum.is_string() || !isLowerHex(recordedChecksum.get<std::string>(), 16))
    throw reader.bad(kManifestChecksumField, "expected 16 lowercase hex digits, got " + describeJsonValue(recordedChecksum));
  const std::string checksum = manifestChecksum(manifest);
  if (recordedChecksum.get<std::string>() != checksum)
    throw reader.bad(kManifestChecksumField, "the checksum does not match: the manifest's fields hash to " + checksum +
                                                 ", it records " + recordedChecksum.get<std::string>() +
                                                 " (an edited or corrupted manifest; the checksum covers every field)");

  result.worldSize = static_cast<int>(reader.integer(reader.field("world_size"), "world_size", 1, kMaxWorldSize,
                                                     "the number of ranks that saved the checkpoint"));
  const nlohmann::json& model = reader.field("model");
  if (!model.is_object()) throw reader.bad("model", "expected an object, got " + describeJsonValue(model));
  const nlohmann::json& modelHash = reader.field("model_hash");
  if (modelHash != modelIdentityHash(model))
    throw reader.bad("model_hash", describeJsonValue(modelHash) + " is not the hash of the recorded model (" +
                                       modelIdentityHash(model) + "; an edited or corrupted manifest)");

  CheckpointState& state = result.state;
  state.model = model;
  const int64_t maxCount = std::numeric_limits<int64_t>::max();
  state.step = reader.integer(reader.field("step"), "step", 0, maxCount, "an integer >= 0");
  state.consumedSamples = reader.integer(reader.field("consumed_samples"), "consumed_samples", 0, maxCount, "an integer >= 0");
  for (const char* name : {"data_order_state", "rng", "config"})
    if (!reader.field(name).is_object()) throw reader.bad(name, "expected an object, got " + describeJsonValue(reader.field(name)));
  state.dataOrderState = reader.field("data_order_state");
  state.rng = reader.field("rng");
  state.config = reader.field("config");

  const nlohmann::json& files = reader.field("files");
  if (!files.is_array()) throw reader.bad("files", "expected an array, got " + describeJsonValue(files));
  std::set<std::string> listed;
  for (size_t i = 0; i < files.size(); ++i) {
    const nlohmann::json& file = files[i];
    const std::string where = "files[" + std::to_string(i) + "]";
    if (!file.is_object()) throw reader.bad(where, "expected an object, got " + describeJsonValue(file));
    ManifestFile entry;
    entry.name = reader.string(file, "name", where, "a file name in the checkpoint directory");
    if (!validFileName(entry.name))
      throw reader.bad(where + ".name", "expected a file name in the checkpoint directory, got " + quoteForMessage(entry.name));
    if (!listed.insert(entry.name).second) throw reader.bad(where + ".name", quoteForMessage(entry.name) + " is listed twice");
    auto size = file.find("size");
    if (size == file.end()) throw reader.bad(where + ".size", "missing");
    entry.size = static_cast<uint64_t>(reader.integer(*size, where + ".size", 0, maxCount, "a byte count"));
    entry.xxh3 = reader.string(file, "xxh3_64", where, "16 lowercase hex digits");
    if (!isLowerHex(entry.xxh3, 16)) throw reader.bad(where + ".xxh3_64", "expected 16 lowercase hex digits, got " + quoteForMessage(entry.xxh3));
    result.files.push_back(std::move(entry));
  }

  const nlohmann::json& groups = reader.field("groups");
  if (!groups.is_object()) throw reader.bad("groups", "expected an object, got " + describeJsonValue(groups));
  for (const auto& [groupName, entry] : groups.items()) {
    const std::string where = "groups." + groupName;
    if (!validGroupName(groupName)) throw reader.bad("groups", quoteForMessage(groupName) + ": group names use [a-z0-9_] only");
    if (!entry.is_object()) throw reader.bad(where, "expected an object, got " + describeJsonValue(entry));
    ManifestGroup group;
    group.name = groupName;
    auto shards = entry.find("shards");
    if (shards == entry.end() || !shards->is_array()) throw reader.bad(where + ".shards", "expected an array of file names");
    std::set<std::string> groupShards;
    for (size_t s = 0; s < shards->size(); ++s) {
      const nlohmann::json& shard = (*shards)[s];
      if (!shard.is_string() || !listed.count(shard.get<std::string>()))
        throw reader.bad(where + ".shards[" + std::to_string(s) + "]", describeJsonValue(shard) + " is not among the files listed");
      if (!groupShards.insert(shard.get<std::string>()).second)
        throw reader.bad(where + ".shards[" + std::to_string(s) + "]", describeJsonValue(shard) + " is listed twice");
      group.shards.push_back(shard.get<std::string>());
    }
    auto index = entry.find("index");
    if (index != entry.end() && (!index->is_string() || !listed.count(index->get<std::string>())))
      throw reader.bad(where + ".index", describeJsonValue(*index) + " is not among the files listed");
    auto tensors = entry.find("tensors");
    if (tensors == entry.end() || !tensors->is_array()) throw reader.bad(where + ".tensors", "expected an array");
    std::set<std::string> names;
    for (size_t i = 0; i < tensors->size(); ++i) {
      const nlohmann::json& tensor = (*tensors)[i];
      const std::string at = where + ".tensors[" + std::to_string(i) + "]";
      if (!tensor.is_object()) throw reader.bad(at, "expected an object, got " + describeJsonValue(tensor));
      ManifestTensor saved;
      saved.name = reader.string(tensor, "name", at, "the tensor's name");
      if (!names.insert(saved.name).second) throw reader.bad(at, "tensor " + quoteForMessage(saved.name) + " is listed twice");
      const std::string dtypeText = reader.string(tensor, "dtype", at, "a dtype name");
      std::optional<DType> dtype = parseDType(dtypeText);
      if (!dtype) throw reader.bad(at + ".dtype", "expected a dtype name, got " + quoteForMessage(dtypeText));
      saved.dtype = *dtype;
      saved.globalShape = reader.extents(tensor, "shape", at);
      if (checkedElementCount(saved.globalShape) < 0)
        throw reader.bad(at + ".shape", describeShape(saved.globalShape) + " has more than 2^56 elements");
      auto boxes = tensor.find("boxes");
      if (boxes == tensor.end() || !boxes->is_array()) throw reader.bad(at + ".boxes", "expected an array");
      std::set<int> ranks;
      for (size_t b = 0; b < boxes->size(); ++b) {
        const nlohmann::json& box = (*boxes)[b];
        const std::string boxAt = at + ".boxes[" + std::to_string(b) + "]";
        if (!box.is_object()) throw reader.bad(boxAt, "expected an object, got " + describeJsonValue(box));
        auto rank = box.find("rank");
        if (rank == box.end()) throw reader.bad(boxAt + ".rank", "missing");
        ManifestBox savedBox;
        savedBox.rank = static_cast<int>(reader.integer(*rank, boxAt + ".rank", 0, result.worldSize - 1,
                                                        "a rank below world_size " + std::to_string(result.worldSize)));
        if (!ranks.insert(savedBox.rank).second)
          throw reader.bad(boxAt + ".rank", "rank " + std::to_string(savedBox.rank) + " holds a second box of tensor " +
                                                quoteForMessage(saved.name));
        savedBox.file = reader.string(box, "file", boxAt, "one of " + where + ".shards");
        if (!groupShards.count(savedBox.file))
          throw reader.bad(boxAt + ".file", quoteForMessage(savedBox.file) + " is not one of " + where + ".shards");
        savedBox.box = {reader.extents(box, "offset", boxAt), reader.extents(box, "shape", boxAt)};
        if (!boxFitsIn(savedBox.box, saved.globalShape))
          throw reader.bad(boxAt, "tensor " + quoteForMessage(saved.name) + ": box " + describeBox(savedBox.box) +
                                      " does not lie inside its shape " + describeShape(saved.globalShape));
        for (const ManifestBox& other : saved.boxes)
          if (intersectBoxes(other.box, savedBox.box))
            throw reader.bad(boxAt, "tensor " + quoteForMessage(saved.name) + ": box " + describeBox(savedBox.box) +
                                        " overlaps box " + describeBox(other.box));
        saved.boxes.push_back(std::move(savedBox));
      }
      group.tensors.push_back(std::move(saved));
    }
    result.groups.push_back(std::move(group));
  }
  return result;
}

}  // namespace dgemma
