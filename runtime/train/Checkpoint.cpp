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
  char suffix[64];
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

std::string rankShardName(const std::string& group, int rank, int worldSize, size_t index, size_t count) {
  if (worldSize == 1) return shardName(group, index, count);
  char suffix[96];
  std::snprintf(suffix, sizeof suffix, "-rank%05d-%05zu-of-%05zu.safetensors", rank, index + 1, count);
  return group + suffix;
}

// The box list a rank leaves in the temporary directory for commitSave.
std::string rankListName(int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank-%05d.json", rank);
  return name;
}

std::string describeShape(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t d = 0; d < shape.size(); ++d) text += (d ? ", " : "") + std::to_string(shape[d]);
  return text + "]";
}

// Everything in `shards` that could make a rank's write fail half-way; the groups in order of first
// appearance, each with its shards in caller order.
std::vector<std::pair<std::string, std::vector<const CheckpointShard*>>> groupShards(const std::vector<CheckpointShard>& shards) {
  std::vector<std::pair<std::string, std::vector<const CheckpointShard*>>> groups;
  std::map<std::string, std::set<std::string>> namesByGroup;
  for (const CheckpointShard& t : shards) {
    std::string where = "checkpoint: group '" + t.group + "': tensor '" + t.name + "': ";
    if (!validGroupName(t.group)) throw std::invalid_argument(where + "group names use [a-z0-9_] only");
    if (!t.tensor) throw std::invalid_argument(where + "null tensor");
    if (!boxFitsIn(t.box, t.globalShape))
      throw std::invalid_argument(where + "box " + describeBox(t.box) + " does not lie inside the global shape " +
                                  describeShape(t.globalShape));
    if (t.tensor->shape != t.box.shape)
      throw std::invalid_argument(where + "the tensor's shape " + describeShape(t.tensor->shape) + " is not its box's " +
                                  describeShape(t.box.shape));
    uint64_t bytes = static_cast<uint64_t>(t.tensor->numElements()) * dtypeSize(t.tensor->dtype);
    if (t.tensor->data.size() != bytes)
      throw std::invalid_argument(where + "holds " + std::to_string(t.tensor->data.size()) + " bytes, its shape needs " +
                                  std::to_string(bytes));
    if (!namesByGroup[t.group].insert(t.name).second) throw std::invalid_argument(where + "appears twice");
    auto found = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == t.group; });
    if (found == groups.end()) found = groups.insert(groups.end(), {t.group, {}});
    found->second.push_back(&t);
  }
  return groups;
}

// One rank whole: every tensor is its own global tensor.
std::vector<CheckpointShard> wholeTensors(const std::vector<CheckpointTensor>& tensors) {
  std::vector<CheckpointShard> shards;
  for (const CheckpointTensor& t : tensors) {
    std::vector<int64_t> shape = t.tensor ? t.tensor->shape : std::vector<int64_t>{};
    shards.push_back({t.group, t.name, shape, wholeBox(shape), t.tensor});
  }
  return shards;
}

// The manifest's model_hash: XXH3-64 of the model identity's compact JSON (object keys sorted).
std::string modelHash(const nlohmann::json& model) {
  const std::string text = model.dump();
  return hex64(XXH3_64bits(text.data(), text.size()));
}

std::string describeValue(const nlohmann::json* value) {
  if (!value) return "nothing";
  std::string text = value->dump();
  return text.size() > 120 ? text.substr(0, 117) + "..." : text;
}

// "PATH.key: the checkpoint has A, this run B" for the first member (in key order, depth first)
// where `saved` and `now` differ; arrays of numbers (shapes) are compared whole.
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
      if (savedValue && nowValue) return firstDifference(path + "." + key, *savedValue, *nowValue);
      return path + "." + key + ": the checkpoint has " + describeValue(savedValue) + ", this run " + describeValue(nowValue);
    }
  }
  return path + ": the checkpoint has " + describeValue(&saved) + ", this run " + describeValue(&now);
}

template <typename Json>
std::vector<int64_t> intsOf(const Json& value) {
  return value.template get<std::vector<int64_t>>();
}

}  // namespace

CheckpointSaveResult Checkpoint::save(const std::string& saveDir, const CheckpointState& state,
                                      const std::vector<CheckpointTensor>& tensors, const CheckpointSaveOptions& options) {
  auto started = std::chrono::steady_clock::now();
  if (state.step < 0) throw std::invalid_argument("checkpoint: negative step " + std::to_string(state.step));
  if (options.maxShardBytes == 0) throw std::invalid_argument("checkpoint: max shard bytes must be positive");
  if (options.keep < 0) throw std::invalid_argument("checkpoint: keep must be >= 0");
  std::vector<CheckpointShard> shards = wholeTensors(tensors);
  groupShards(shards);  // refuses a bad list before the directory is created

  std::string tmp = beginSave(saveDir, state.step);
  try {
    saveRank(tmp, 0, 1, shards, options);
  } catch (...) {
    abortSave(tmp);
    throw;
  }
  CheckpointSaveResult result = commitSave(saveDir, tmp, state, 1, options);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

std::string Checkpoint::stepDirectory(const std::string& saveDir, int64_t step) {
  return (fs::path(saveDir) / stepDirectoryName(step)).string();
}

std::string Checkpoint::temporaryDirectory(const std::string& saveDir, int64_t step, int64_t saveId) {
  return (fs::path(saveDir) / (std::string(kTmpPrefix) + "step-" + std::to_string(step) + "-" + std::to_string(saveId))).string();
}

std::string Checkpoint::beginSave(const std::string& saveDir, int64_t step) {
  if (step < 0) throw std::invalid_argument("checkpoint: negative step " + std::to_string(step));
  const fs::path root(saveDir);
  const fs::path tmp = temporaryDirectory(saveDir, step, ::getpid());
  try {
    fs::create_directories(root);
    removeStaleTmpDirectories(root);  // what crashed saves left
    fs::create_directory(tmp);
  } catch (const fs::filesystem_error& error) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw RuntimeError(saveDir + ": cannot save checkpoint " + stepDirectoryName(step) + ": " + error.what());
  }
  return tmp.string();
}

void Checkpoint::abortSave(const std::string& tmpDir) {
  std::error_code ignored;
  fs::remove_all(tmpDir, ignored);
}

void Checkpoint::saveRank(const std::string& tmpDir, int rank, int worldSize, const std::vector<CheckpointShard>& shards,
                          const CheckpointSaveOptions& options) {
  if (worldSize < 1 || rank < 0 || rank >= worldSize)
    throw std::invalid_argument("checkpoint: rank " + std::to_string(rank) + " of " + std::to_string(worldSize) + " ranks");
  if (options.maxShardBytes == 0) throw std::invalid_argument("checkpoint: max shard bytes must be positive");
  const auto groups = groupShards(shards);
  const fs::path tmp(tmpDir);
  try {
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    nlohmann::ordered_json boxes = nlohmann::ordered_json::object();
    for (const auto& [group, members] : groups) {
      // Greedy shards: a tensor opens a new shard when it would push the current one past the limit.
      std::vector<std::vector<const CheckpointShard*>> fileContents(1);
      uint64_t shardBytes = 0;
      for (const CheckpointShard* t : members) {
        uint64_t bytes = t->tensor->data.size();
        if (!fileContents.back().empty() && shardBytes + bytes > options.maxShardBytes) {
          fileContents.emplace_back();
          shardBytes = 0;
        }
        fileContents.back().push_back(t);
        shardBytes += bytes;
      }
      nlohmann::ordered_json groupBoxes = nlohmann::ordered_json::array();
      for (size_t i = 0; i < fileContents.size(); ++i) {
        std::string name = rankShardName(group, rank, worldSize, i, fileContents.size());
        std::vector<std::pair<std::string, const HostTensor*>> entries;
        for (const CheckpointShard* t : fileContents[i]) {
          entries.emplace_back(t->name, t->tensor);
          groupBoxes.push_back({{"name", t->name},
                                {"dtype", dtypeName(t->tensor->dtype)},
                                {"global_shape", t->globalShape},
                                {"offset", t->box.offset},
                                {"shape", t->box.shape},
                                {"file", name}});
        }
        std::string path = (tmp / name).string();
        writeSafetensors(path, entries, {{"format", "pt"}});
        FileFacts facts = hashFile(path, /*loading=*/false);
        files.push_back({{"name", name}, {"size", facts.size}, {"xxh3_64", hex64(facts.hash)}});
      }
      boxes[group] = groupBoxes;
    }
    nlohmann::ordered_json list = {{"rank", rank}, {"world_size", worldSize}, {"groups", boxes}, {"files", files}};
    writeFileAtomically((tmp / rankListName(rank)).string(), list.dump(1) + "\n");
  } catch (const fs::filesystem_error& error) {
    throw RuntimeError(tmpDir + ": rank " + std::to_string(rank) + ": cannot write its checkpoint shards: " + error.what());
  }
}

CheckpointSaveResult Checkpoint::commitSave(const std::string& saveDir, const std::string& tmpDir, const CheckpointState& state,
                                            int worldSize, const CheckpointSaveOptions& options) {
  auto started = std::chrono::steady_clock::now();
  CheckpointSaveResult result;
  const fs::path root(saveDir);
  const fs::path final = root / stepDirectoryName(state.step);
  const fs::path tmp(tmpDir);
  result.directory = final.string();

  struct MergedTensor {
    std::string dtype;
    std::vector<int64_t> globalShape;
    std::vector<ShardBox> boxes;
    std::vector<int> ranks;
    nlohmann::ordered_json boxList = nlohmann::ordered_json::array();
  };
  struct MergedGroup {
    std::vector<std::string> order;
    std::map<std::string, MergedTensor> tensors;
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    uint64_t totalSize = 0;
  };

  try {
    if (state.step < 0) throw std::invalid_argument("checkpoint: negative step " + std::to_string(state.step));
    if (worldSize < 1) throw std::invalid_argument("checkpoint: world size " + std::to_string(worldSize));
    if (options.keep < 0) throw std::invalid_argument("checkpoint: keep must be >= 0");

    // Merge the ranks' box lists, in rank order.
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    std::vector<std::string> groupOrder;
    std::map<std::string, MergedGroup> merged;
    for (int rank = 0; rank < worldSize; ++rank) {
      fs::path listPath = tmp / rankListName(rank);
      if (!fs::exists(listPath))
        throw RuntimeError(tmpDir + ": rank " + std::to_string(rank) + " of " + std::to_string(worldSize) +
                           " has not written its shards (no " + rankListName(rank) + ")");
      nlohmann::ordered_json list = nlohmann::ordered_json::parse(readWholeFile(listPath.string()));
      if (list.at("rank") != rank || list.at("world_size") != worldSize)
        throw RuntimeError(listPath.string() + ": written by rank " + list.at("rank").dump() + " of " +
                           list.at("world_size").dump() + " ranks, the commit expects rank " + std::to_string(rank) + " of " +
                           std::to_string(worldSize));
      for (const nlohmann::ordered_json& file : list.at("files")) {
        files.push_back(file);
        result.bytesWritten += file.at("size").get<uint64_t>();
        ++result.files;
      }
      for (const auto& [group, boxes] : list.at("groups").items()) {
        if (!merged.count(group)) groupOrder.push_back(group);
        MergedGroup& g = merged[group];
        for (const nlohmann::ordered_json& box : boxes) {
          std::string name = box.at("name").get<std::string>();
          std::string where = "checkpoint: group '" + group + "': tensor '" + name + "': ";
          auto [it, added] = g.tensors.try_emplace(name);
          MergedTensor& t = it->second;
          if (added) {
            g.order.push_back(name);
            t.dtype = box.at("dtype").get<std::string>();
            t.globalShape = intsOf(box.at("global_shape"));
          } else if (t.dtype != box.at("dtype").get<std::string>() || t.globalShape != intsOf(box.at("global_shape"))) {
            throw std::invalid_argument(where + "rank " + std::to_string(rank) + " writes it as " +
                                        box.at("dtype").get<std::string>() + " " + describeShape(intsOf(box.at("global_shape"))) +
                                        ", rank " + std::to_string(t.ranks.front()) + " as " + t.dtype + " " +
                                        describeShape(t.globalShape));
          }
          ShardBox shardBox{intsOf(box.at("offset")), intsOf(box.at("shape"))};
          for (size_t other = 0; other < t.boxes.size(); ++other)
            if (intersectBoxes(t.boxes[other], shardBox))
              throw std::invalid_argument(where + "ranks " + std::to_string(t.ranks[other]) + " and " + std::to_string(rank) +
                                          " both write elements of " + describeBox(shardBox) +
                                          " (a box held by several ranks is written by its first replica only)");
          std::string file = box.at("file").get<std::string>();
          t.boxes.push_back(shardBox);
          t.ranks.push_back(rank);
          t.boxList.push_back({{"rank", rank}, {"file", file}, {"offset", shardBox.offset}, {"shape", shardBox.shape}});
          if (g.shards.empty() || g.shards.back() != file) g.shards.push_back(file);
          std::optional<DType> dtype = parseDType(t.dtype);
          g.totalSize += static_cast<uint64_t>(boxVolume(shardBox)) * (dtype ? dtypeSize(*dtype) : 0);
        }
      }
      fs::remove(listPath);
    }

    nlohmann::ordered_json groups = nlohmann::ordered_json::object();
    for (const std::string& group : groupOrder) {
      MergedGroup& g = merged[group];
      nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
      nlohmann::ordered_json weightMap = nlohmann::ordered_json::object();
      bool wholeTensors = true;  // every tensor one box: an HF directory
      for (const std::string& name : g.order) {
        const MergedTensor& t = g.tensors[name];
        std::vector<ShardBox> gaps = uncoveredParts(wholeBox(t.globalShape), t.boxes);
        if (!gaps.empty())
          throw std::invalid_argument("checkpoint: group '" + group + "': tensor '" + name + "': no rank writes " +
                                      describeBox(gaps.front()) + " of its global shape " + describeShape(t.globalShape));
        tensors.push_back({{"name", name}, {"dtype", t.dtype}, {"shape", t.globalShape}, {"boxes", t.boxList}});
        if (t.boxes.size() == 1)
          weightMap[name] = t.boxList.front()["file"];
        else
          wholeTensors = false;
      }
      groups[group] = {{"shards", g.shards}};
      if (wholeTensors) {
        // HF's index makes the "model" group a --weights directory. Boxes have no place in it.
        std::string indexName = group + ".safetensors.index.json";
        nlohmann::ordered_json index = {{"metadata", {{"total_size", g.totalSize}}}, {"weight_map", weightMap}};
        std::string path = (tmp / indexName).string();
        writeFileAtomically(path, index.dump(2) + "\n");
        FileFacts facts = hashFile(path, /*loading=*/false);
        files.push_back({{"name", indexName}, {"size", facts.size}, {"xxh3_64", hex64(facts.hash)}});
        result.bytesWritten += facts.size;
        ++result.files;
        groups[group]["index"] = indexName;
      }
      groups[group]["tensors"] = tensors;
    }

    nlohmann::ordered_json manifest = {{"format", kFormatName},
                                       {"format_version", kCheckpointFormatVersion},
                                       {"model_hash", modelHash(state.model)},
                                       {"model", state.model},
                                       {"step", state.step},
                                       {"consumed_samples", state.consumedSamples},
                                       {"data_order_state", state.dataOrderState},
                                       {"rng", state.rng},
                                       {"config", state.config},
                                       {"world_size", worldSize},
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
    abortSave(tmpDir);
    throw RuntimeError(saveDir + ": cannot save checkpoint " + final.filename().string() + ": " + error.what());
  } catch (...) {
    abortSave(tmpDir);
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

Checkpoint Checkpoint::load(const std::string& directory, const nlohmann::json& expectedModel) {
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
  if (version == 1 || version == 2)
    throw bad("format_version", version.dump() + " is the format of earlier builds (1: whole tensors; 2: a plan hash that "
                                "ties it to one layout), which this build no longer reads (it reads version " +
                                std::to_string(kCheckpointFormatVersion) +
                                "): resume with the build that saved it, or start afresh");
  if (!version.is_number_integer() || version.get<int64_t>() != kCheckpointFormatVersion)
    throw bad("format_version", version.dump() + " is not supported (this build reads version " +
                                    std::to_string(kCheckpointFormatVersion) + ")");
  const nlohmann::json& worldSize = field("world_size");
  if (!worldSize.is_number_integer() || worldSize.get<int64_t>() < 1 || worldSize.get<int64_t>() > (int64_t{1} << 20))
    throw bad("world_size", "expected the number of ranks that saved the checkpoint, got " + worldSize.dump());
  checkpoint.worldSize_ = worldSize.get<int>();
  const nlohmann::json& model = field("model");
  const nlohmann::json& recordedHash = field("model_hash");
  if (!model.is_object()) throw bad("model", "expected an object");
  if (recordedHash != modelHash(model))
    throw bad("model_hash", recordedHash.dump() + " is not the hash of the recorded model (" + modelHash(model) +
                                "; an edited or corrupted manifest)");
  if (modelHash(model) != modelHash(expectedModel))
    throw bad(firstDifference("model", model, expectedModel),
              "a checkpoint of another model or recipe (the layout may differ, nothing else that decides the run)");

  CheckpointState& state = checkpoint.state_;
  state.model = model;
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

  // The groups: their shard files, and per tensor its dtype, global shape and saved boxes.
  const nlohmann::json& groups = field("groups");
  if (!groups.is_object()) throw bad("groups", "expected an object");
  auto isShape = [](const nlohmann::json& value) {
    if (!value.is_array()) return false;
    for (const nlohmann::json& extent : value)
      if (!extent.is_number_integer() || extent.get<int64_t>() < 0) return false;
    return true;
  };
  for (const auto& [group, entry] : groups.items()) {
    std::string where = "groups." + group;
    auto shards = entry.is_object() ? entry.find("shards") : entry.end();
    if (shards == entry.end() || !shards->is_array()) throw bad(where + ".shards", "expected an array of file names");
    Group& loaded = checkpoint.groups_[group];
    std::map<std::string, size_t> fileByName;
    for (const nlohmann::json& shard : *shards) {
      if (!shard.is_string() || !listed.count(shard.get<std::string>()))
        throw bad(where + ".shards", shard.dump() + " is not among the files listed");
      checkpoint.files_.push_back(SafetensorsFile::open((root / shard.get<std::string>()).string()));
      fileByName[shard.get<std::string>()] = checkpoint.files_.size() - 1;
    }
    auto tensors = entry.find("tensors");
    if (tensors == entry.end() || !tensors->is_array()) throw bad(where + ".tensors", "expected an array");
    for (size_t i = 0; i < tensors->size(); ++i) {
      const nlohmann::json& tensor = (*tensors)[i];
      std::string at = where + ".tensors[" + std::to_string(i) + "]";
      if (!tensor.is_object() || !tensor.contains("name") || !tensor["name"].is_string())
        throw bad(at + ".name", "expected the tensor's name");
      const std::string name = tensor["name"].get<std::string>();
      std::optional<DType> dtype = tensor.contains("dtype") && tensor["dtype"].is_string()
                                       ? parseDType(tensor["dtype"].get<std::string>())
                                       : std::nullopt;
      if (!dtype) throw bad(at + ".dtype", "expected a dtype name, tensor '" + name + "'");
      if (!tensor.contains("shape") || !isShape(tensor["shape"]))
        throw bad(at + ".shape", "expected the global shape, tensor '" + name + "'");
      if (!tensor.contains("boxes") || !tensor["boxes"].is_array())
        throw bad(at + ".boxes", "expected an array, tensor '" + name + "'");
      auto [slot, added] = loaded.tensors.try_emplace(name);
      if (!added) throw bad(at, "tensor '" + name + "' is listed twice");
      loaded.names.push_back(name);
      SavedTensor& savedTensor = slot->second;
      savedTensor.dtype = *dtype;
      savedTensor.globalShape = intsOf(tensor["shape"]);
      const nlohmann::json& boxes = tensor["boxes"];
      for (size_t b = 0; b < boxes.size(); ++b) {
        const nlohmann::json& box = boxes[b];
        std::string boxAt = at + ".boxes[" + std::to_string(b) + "]";
        if (!box.is_object() || !box.contains("rank") || !box["rank"].is_number_integer() || box["rank"].get<int64_t>() < 0 ||
            box["rank"].get<int64_t>() >= checkpoint.worldSize_)
          throw bad(boxAt + ".rank", "expected a rank below world_size " + std::to_string(checkpoint.worldSize_));
        auto file = box.contains("file") && box["file"].is_string() ? fileByName.find(box["file"].get<std::string>())
                                                                     : fileByName.end();
        if (file == fileByName.end()) throw bad(boxAt + ".file", "expected one of " + where + ".shards");
        if (!box.contains("offset") || !isShape(box["offset"]) || !box.contains("shape") || !isShape(box["shape"]))
          throw bad(boxAt, "expected integer arrays \"offset\" and \"shape\"");
        SavedBox savedBox{{intsOf(box["offset"]), intsOf(box["shape"])}, file->second, 0};
        if (!boxFitsIn(savedBox.box, savedTensor.globalShape))
          throw bad(boxAt, "tensor '" + name + "': box " + describeBox(savedBox.box) + " does not lie inside its shape " +
                               describeShape(savedTensor.globalShape));
        for (const SavedBox& other : savedTensor.boxes)
          if (intersectBoxes(other.box, savedBox.box))
            throw bad(boxAt, "tensor '" + name + "': box " + describeBox(savedBox.box) + " overlaps box " +
                                 describeBox(other.box));
        const SafetensorsFile& shardFile = checkpoint.files_[file->second];
        const SafetensorsEntry* stored = shardFile.find(name);
        if (!stored)
          throw InputError(shardFile.path() + ": tensor '" + name + "': missing (the manifest records its box " +
                           describeBox(savedBox.box) + " there)");
        if (stored->dtype != savedTensor.dtype || stored->shape != savedBox.box.shape)
          throw InputError(shardFile.path() + ": tensor '" + name + "': " + std::string(dtypeName(stored->dtype)) + " " +
                           describeShape(stored->shape) + ", the manifest records the " + std::string(dtypeName(savedTensor.dtype)) +
                           " box " + describeBox(savedBox.box) + " of shape " + describeShape(savedBox.box.shape));
        savedBox.entry = static_cast<size_t>(stored - shardFile.entries().data());
        savedTensor.boxes.push_back(std::move(savedBox));
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
  return found != groups_.end() && found->second.tensors.count(name) != 0;
}

const Checkpoint::SavedTensor& Checkpoint::saved(const std::string& group, const std::string& name) const {
  auto found = groups_.find(group);
  if (found != groups_.end()) {
    auto tensor = found->second.tensors.find(name);
    if (tensor != found->second.tensors.end()) return tensor->second;
  }
  throw InputError(directory_ + ": group '" + group + "': tensor '" + name + "': not found");
}

const std::vector<int64_t>& Checkpoint::globalShape(const std::string& group, const std::string& name) const {
  return saved(group, name).globalShape;
}

DType Checkpoint::dtype(const std::string& group, const std::string& name) const { return saved(group, name).dtype; }

HostTensor Checkpoint::read(const std::string& group, const std::string& name) const {
  const std::vector<int64_t>& globalShape = saved(group, name).globalShape;
  return readBox(group, name, globalShape, wholeBox(globalShape));
}

HostTensor Checkpoint::readBox(const std::string& group, const std::string& name, const std::vector<int64_t>& globalShape,
                               const ShardBox& box) const {
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
