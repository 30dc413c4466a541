#include "runtime/train/Checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "support/Error.h"
#include "support/AtomicFile.h"

namespace dgemma {

namespace {

namespace fs = std::filesystem;

constexpr const char* kManifestName = "manifest.json";
constexpr const char* kFormatName = "dgemma-checkpoint";
constexpr const char* kTmpPrefix = ".tmp-";

std::string stepDirectoryName(int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

std::string shardName(const std::string& group, size_t index, size_t count) {
  char suffix[40];
  std::snprintf(suffix, sizeof suffix, "-%05zu-of-%05zu.safetensors", index + 1, count);
  return group + suffix;
}

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

bool validGroupName(const std::string& group) {
  if (group.empty()) return false;
  for (char c : group)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

// The step of a "step-<digits>" directory name.
std::optional<int64_t> stepOfDirectoryName(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

struct FileFacts {
  uint64_t size = 0;
  uint64_t hash = 0;
};

// Size and XXH3-64 of a whole file, read in blocks (a shard can be larger than free memory). An I/O
// error is an InputError when loading (`loading`), a RuntimeError when saving.
FileFacts hashFile(const std::string& path, bool loading) {
  auto fail = [&](const std::string& what) {
    std::string message = path + ": " + what + ": " + std::strerror(errno);
    if (loading) throw InputError(message);
    throw RuntimeError(message);
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open");
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(4 << 20);
  FileFacts facts;
  for (;;) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int savedErrno = errno;
      facts.hash = XXH3_64bits_digest(state);
      XXH3_freeState(state);
      ::close(fd);
      errno = savedErrno;
      if (n < 0) fail("cannot read");
      return facts;
    }
    XXH3_64bits_update(state, buffer.data(), static_cast<size_t>(n));
    facts.size += static_cast<uint64_t>(n);
  }
}

// Removes `path` by first renaming it to a .tmp- name in the same directory, so that a crash
// half-way through the recursive delete leaves something every reader ignores.
void removeViaTmp(const fs::path& path) {
  fs::path doomed = path.parent_path() / (std::string(kTmpPrefix) + "delete-" + path.filename().string() + "-" +
                                          std::to_string(::getpid()));
  fs::remove_all(doomed);
  fs::rename(path, doomed);
  fs::remove_all(doomed);
}

void removeStaleTmpDirectories(const fs::path& saveDir) {
  for (const fs::directory_entry& entry : fs::directory_iterator(saveDir)) {
    std::string name = entry.path().filename().string();
    if (name.compare(0, std::strlen(kTmpPrefix), kTmpPrefix) == 0) fs::remove_all(entry.path());
  }
}

// The manifest, or nothing when it is missing or does not parse (list() skips such directories).
std::optional<nlohmann::json> tryReadManifest(const fs::path& directory) {
  std::error_code error;
  fs::path path = directory / kManifestName;
  if (!fs::is_regular_file(path, error)) return std::nullopt;
  try {
    nlohmann::json manifest = nlohmann::json::parse(readWholeFile(path.string()));
    if (manifest.is_object()) return manifest;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

CheckpointSaveResult Checkpoint::save(const std::string& saveDir, const CheckpointState& state,
                                      const std::vector<CheckpointTensor>& tensors, const CheckpointSaveOptions& options) {
  auto started = std::chrono::steady_clock::now();
  if (state.step < 0) throw std::invalid_argument("checkpoint: negative step " + std::to_string(state.step));
  if (options.maxShardBytes == 0) throw std::invalid_argument("checkpoint: max shard bytes must be positive");
  if (options.keep < 0) throw std::invalid_argument("checkpoint: keep must be >= 0");

  // Group the tensors (groups in order of first appearance, tensors in caller order) and check
  // everything that could make a write fail half-way.
  std::vector<std::string> groupOrder;
  std::map<std::string, std::vector<const CheckpointTensor*>> byGroup;
  std::map<std::string, std::set<std::string>> namesByGroup;
  for (const CheckpointTensor& t : tensors) {
    std::string where = "checkpoint: group '" + t.group + "': tensor '" + t.name + "': ";
    if (!validGroupName(t.group)) throw std::invalid_argument(where + "group names use [a-z0-9_] only");
    if (!t.tensor) throw std::invalid_argument(where + "null tensor");
    uint64_t bytes = static_cast<uint64_t>(t.tensor->numElements()) * dtypeSize(t.tensor->dtype);
    if (t.tensor->data.size() != bytes)
      throw std::invalid_argument(where + "holds " + std::to_string(t.tensor->data.size()) + " bytes, its shape needs " +
                                  std::to_string(bytes));
    if (!namesByGroup[t.group].insert(t.name).second) throw std::invalid_argument(where + "appears twice");
    if (!byGroup.count(t.group)) groupOrder.push_back(t.group);
    byGroup[t.group].push_back(&t);
  }

  CheckpointSaveResult result;
  const fs::path root(saveDir);
  const fs::path final = root / stepDirectoryName(state.step);
  const fs::path tmp = root / (std::string(kTmpPrefix) + "step-" + std::to_string(state.step) + "-" + std::to_string(::getpid()));
  result.directory = final.string();

  try {
    fs::create_directories(root);
    removeStaleTmpDirectories(root);  // what crashed saves left
    fs::create_directory(tmp);

    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    nlohmann::ordered_json groups = nlohmann::ordered_json::object();
    auto record = [&](const std::string& name) {
      std::string path = (tmp / name).string();
      FileFacts facts = hashFile(path, /*loading=*/false);
      files.push_back({{"name", name}, {"size", facts.size}, {"xxh3_64", hex64(facts.hash)}});
      result.bytesWritten += facts.size;
      ++result.files;
    };

    for (const std::string& group : groupOrder) {
      // Greedy shards: a tensor opens a new shard when it would push the current one past the limit.
      std::vector<std::vector<const CheckpointTensor*>> shards(1);
      uint64_t shardBytes = 0;
      for (const CheckpointTensor* t : byGroup[group]) {
        uint64_t bytes = t->tensor->data.size();
        if (!shards.back().empty() && shardBytes + bytes > options.maxShardBytes) {
          shards.emplace_back();
          shardBytes = 0;
        }
        shards.back().push_back(t);
        shardBytes += bytes;
      }
      nlohmann::ordered_json shardNames = nlohmann::ordered_json::array();
      nlohmann::ordered_json weightMap = nlohmann::ordered_json::object();
      uint64_t totalSize = 0;
      for (size_t i = 0; i < shards.size(); ++i) {
        std::string name = shardName(group, i, shards.size());
        std::vector<std::pair<std::string, const HostTensor*>> entries;
        for (const CheckpointTensor* t : shards[i]) {
          entries.emplace_back(t->name, t->tensor);
          weightMap[t->name] = name;
          totalSize += t->tensor->data.size();
        }
        writeSafetensors((tmp / name).string(), entries, {{"format", "pt"}});
        record(name);
        shardNames.push_back(name);
      }
      std::string indexName = group + ".safetensors.index.json";
      nlohmann::ordered_json index = {{"metadata", {{"total_size", totalSize}}}, {"weight_map", weightMap}};
      writeFileAtomically((tmp / indexName).string(), index.dump(2) + "\n");
      record(indexName);
      groups[group] = {{"shards", shardNames}, {"index", indexName}};
    }

    nlohmann::ordered_json manifest = {{"format", kFormatName},
                                       {"format_version", kCheckpointFormatVersion},
                                       {"plan_hash", state.planHash},
                                       {"step", state.step},
                                       {"consumed_samples", state.consumedSamples},
                                       {"data_order_state", state.dataOrderState},
                                       {"rng", state.rng},
                                       {"config", state.config},
                                       {"groups", groups},
                                       {"files", files}};
    std::string manifestText = manifest.dump(2) + "\n";
    writeFileAtomically((tmp / kManifestName).string(), manifestText);
    result.bytesWritten += manifestText.size();
    ++result.files;
    syncDirectory(tmp.string());

    // Commit. A checkpoint of the same step (a run resumed from an earlier one) is moved aside first:
    // rename(2) cannot replace a non-empty directory.
    fs::path replaced;
    if (fs::exists(final)) {
      replaced = root / (std::string(kTmpPrefix) + "replaced-" + final.filename().string() + "-" + std::to_string(::getpid()));
      fs::remove_all(replaced);
      fs::rename(final, replaced);
    }
    fs::rename(tmp, final);
    syncDirectory(root.string());
    if (!replaced.empty()) fs::remove_all(replaced);

    if (options.keep > 0) {
      std::vector<CheckpointEntry> complete = list(saveDir);
      size_t excess = complete.size() > static_cast<size_t>(options.keep) ? complete.size() - options.keep : 0;
      for (const CheckpointEntry& entry : complete) {
        if (excess == 0) break;
        if (entry.step == state.step) continue;  // never the one just written, even when older steps exist
        removeViaTmp(entry.directory);
        result.removed.push_back(entry.directory);
        --excess;
      }
      if (!result.removed.empty()) syncDirectory(root.string());
    }
  } catch (const fs::filesystem_error& error) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw RuntimeError(saveDir + ": cannot save checkpoint " + final.filename().string() + ": " + error.what());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

std::vector<CheckpointEntry> Checkpoint::list(const std::string& saveDir) {
  std::vector<CheckpointEntry> entries;
  std::error_code error;
  if (!fs::is_directory(saveDir, error)) return entries;
  fs::directory_iterator it(saveDir, error);
  if (error) throw RuntimeError(saveDir + ": cannot list: " + error.message());
  for (const fs::directory_entry& entry : it) {
    std::optional<int64_t> step = stepOfDirectoryName(entry.path().filename().string());
    if (!step || !entry.is_directory(error)) continue;
    std::optional<nlohmann::json> manifest = tryReadManifest(entry.path());
    if (!manifest) continue;
    auto recorded = manifest->find("step");
    if (recorded == manifest->end() || !recorded->is_number_integer() || recorded->get<int64_t>() != *step) continue;
    entries.push_back({*step, entry.path().string()});
  }
  std::sort(entries.begin(), entries.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return entries;
}

std::optional<std::string> Checkpoint::findLatest(const std::string& saveDir) {
  std::vector<CheckpointEntry> entries = list(saveDir);
  if (entries.empty()) return std::nullopt;
  return entries.back().directory;
}

Checkpoint Checkpoint::load(const std::string& directory, const std::string& expectedPlanHash) {
  const fs::path root(directory);
  const std::string manifestPath = (root / kManifestName).string();
  std::error_code error;
  if (!fs::is_directory(root, error)) throw InputError(directory + ": no such checkpoint directory");
  if (!fs::exists(manifestPath, error))
    throw InputError(manifestPath + ": missing: not a complete checkpoint (an interrupted save, or not a checkpoint directory)");

  Checkpoint checkpoint;
  checkpoint.directory_ = directory;
  try {
    checkpoint.manifest_ = nlohmann::json::parse(readWholeFile(manifestPath));
  } catch (const nlohmann::json::exception& parseError) {
    throw InputError(manifestPath + ": invalid JSON (a torn or corrupted checkpoint): " + parseError.what());
  }
  const nlohmann::json& manifest = checkpoint.manifest_;
  auto bad = [&](const std::string& field, const std::string& what) -> InputError {
    return InputError(manifestPath + ": " + field + ": " + what);
  };
  if (!manifest.is_object()) throw bad("(top level)", "expected an object");
  auto field = [&](const char* name) -> const nlohmann::json& {
    auto found = manifest.find(name);
    if (found == manifest.end()) throw bad(name, "missing");
    return *found;
  };

  const nlohmann::json& format = field("format");
  if (format != kFormatName) throw bad("format", "expected \"" + std::string(kFormatName) + "\", got " + format.dump());
  const nlohmann::json& version = field("format_version");
  if (!version.is_number_integer() || version.get<int64_t>() != kCheckpointFormatVersion)
    throw bad("format_version", version.dump() + " is not supported (this build reads version " +
                                    std::to_string(kCheckpointFormatVersion) + ")");
  const nlohmann::json& planHash = field("plan_hash");
  if (!planHash.is_string()) throw bad("plan_hash", "expected a string");
  if (planHash.get<std::string>() != expectedPlanHash)
    throw bad("plan_hash", "the checkpoint was saved for plan " + planHash.dump() + ", but this run's plan is \"" +
                               expectedPlanHash + "\" (a different model, layout or objective)");

  CheckpointState& state = checkpoint.state_;
  state.planHash = planHash.get<std::string>();
  for (const char* name : {"step", "consumed_samples"}) {
    const nlohmann::json& value = field(name);
    if (!value.is_number_integer() || value.get<int64_t>() < 0) throw bad(name, "expected an integer >= 0");
  }
  state.step = field("step").get<int64_t>();
  state.consumedSamples = field("consumed_samples").get<int64_t>();
  for (const char* name : {"data_order_state", "rng", "config"})
    if (!field(name).is_object()) throw bad(name, "expected an object");
  state.dataOrderState = field("data_order_state");
  state.rng = field("rng");
  state.config = field("config");

  // Every listed file: present, of the recorded size, with the recorded hash.
  const nlohmann::json& files = field("files");
  if (!files.is_array()) throw bad("files", "expected an array");
  std::set<std::string> listed;
  for (size_t i = 0; i < files.size(); ++i) {
    const nlohmann::json& file = files[i];
    std::string where = "files[" + std::to_string(i) + "]";
    if (!file.is_object()) throw bad(where, "expected an object");
    auto name = file.find("name"), size = file.find("size"), hash = file.find("xxh3_64");
    if (name == file.end() || !name->is_string() || name->get<std::string>().empty() ||
        name->get<std::string>().find('/') != std::string::npos || name->get<std::string>()[0] == '.')
      throw bad(where + ".name", "expected a file name in the checkpoint directory");
    if (size == file.end() || !size->is_number_unsigned()) throw bad(where + ".size", "expected a byte count");
    if (hash == file.end() || !hash->is_string() || hash->get<std::string>().size() != 16)
      throw bad(where + ".xxh3_64", "expected 16 hex digits");
    listed.insert(name->get<std::string>());

    std::string path = (root / name->get<std::string>()).string();
    if (!fs::is_regular_file(path, error)) throw InputError(path + ": missing (the manifest lists it; a torn checkpoint)");
    uint64_t expectedSize = size->get<uint64_t>();
    uint64_t actualSize = fs::file_size(path, error);
    if (error) throw InputError(path + ": cannot stat: " + error.message());
    if (actualSize != expectedSize)
      throw InputError(path + ": size: " + std::to_string(actualSize) + " bytes, the manifest records " +
                       std::to_string(expectedSize) + " (a truncated or torn checkpoint)");
    FileFacts facts = hashFile(path, /*loading=*/true);
    if (facts.size != expectedSize)
      throw InputError(path + ": size: " + std::to_string(facts.size) + " bytes read, the manifest records " +
                       std::to_string(expectedSize) + " (the file changed while being read)");
    if (hex64(facts.hash) != hash->get<std::string>())
      throw InputError(path + ": xxh3_64: the file hashes to " + hex64(facts.hash) + ", the manifest records " +
                       hash->get<std::string>() + " (a corrupted checkpoint)");
  }

  // The groups and their shards.
  const nlohmann::json& groups = field("groups");
  if (!groups.is_object()) throw bad("groups", "expected an object");
  for (const auto& [group, entry] : groups.items()) {
    std::string where = "groups." + group;
    auto shards = entry.is_object() ? entry.find("shards") : entry.end();
    if (shards == entry.end() || !shards->is_array()) throw bad(where + ".shards", "expected an array of file names");
    Group& loaded = checkpoint.groups_[group];
    for (const nlohmann::json& shard : *shards) {
      if (!shard.is_string() || !listed.count(shard.get<std::string>()))
        throw bad(where + ".shards", shard.dump() + " is not among the files listed");
      checkpoint.files_.push_back(SafetensorsFile::open((root / shard.get<std::string>()).string()));
      size_t fileIndex = checkpoint.files_.size() - 1;
      const std::vector<SafetensorsEntry>& entries = checkpoint.files_.back().entries();
      for (size_t e = 0; e < entries.size(); ++e) {
        if (!loaded.byName.emplace(entries[e].name, Location{fileIndex, e}).second)
          throw bad(where, "tensor '" + entries[e].name + "' appears in two shards");
        loaded.names.push_back(entries[e].name);
      }
    }
  }
  return checkpoint;
}

std::vector<std::string> Checkpoint::groups() const {
  std::vector<std::string> names;
  for (const auto& [group, unused] : groups_) names.push_back(group);
  return names;
}

std::vector<std::string> Checkpoint::names(const std::string& group) const {
  auto found = groups_.find(group);
  return found == groups_.end() ? std::vector<std::string>{} : found->second.names;
}

bool Checkpoint::contains(const std::string& group, const std::string& name) const {
  auto found = groups_.find(group);
  return found != groups_.end() && found->second.byName.count(name) != 0;
}

HostTensor Checkpoint::read(const std::string& group, const std::string& name) const {
  auto found = groups_.find(group);
  const Location* location = nullptr;
  if (found != groups_.end()) {
    auto entry = found->second.byName.find(name);
    if (entry != found->second.byName.end()) location = &entry->second;
  }
  if (!location) throw InputError(directory_ + ": group '" + group + "': tensor '" + name + "': not found");
  const SafetensorsFile& file = files_[location->file];
  return file.read(file.entries()[location->entry].name);
}

}  // namespace dgemma
