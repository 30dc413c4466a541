#include "runtime/train/CheckpointWriter.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "runtime/io/Safetensors.h"
#include "runtime/train/CheckpointFileDigest.h"
#include "runtime/train/CheckpointListing.h"
#include "support/AtomicFile.h"
#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {

namespace {

namespace fs = std::filesystem;

constexpr const char* kTmpPrefix = ".tmp-";

std::string shardName(const std::string& group, size_t index, size_t count) {
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "-%05zu-of-%05zu.safetensors", index + 1, count);
  return group + suffix;
}

bool validGroupName(const std::string& group) {
  if (group.empty()) return false;
  for (char c : group)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
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

template <typename Json>
std::vector<int64_t> intsOf(const Json& value) {
  return value.template get<std::vector<int64_t>>();
}

}  // namespace

CheckpointSaveResult CheckpointWriter::save(const std::string& saveDir, const CheckpointState& state,
                                            const std::vector<CheckpointTensor>& tensors,
                                            const CheckpointSaveOptions& options) {
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

std::string CheckpointWriter::temporaryDirectory(const std::string& saveDir, int64_t step, int64_t saveId) {
  return (fs::path(saveDir) / (std::string(kTmpPrefix) + "step-" + std::to_string(step) + "-" + std::to_string(saveId))).string();
}

std::string CheckpointWriter::beginSave(const std::string& saveDir, int64_t step) {
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
    throw RuntimeError(saveDir + ": cannot save checkpoint " + checkpointDirectoryName(step) + ": " + error.what());
  }
  return tmp.string();
}

void CheckpointWriter::abortSave(const std::string& tmpDir) {
  std::error_code ignored;
  fs::remove_all(tmpDir, ignored);
}

void CheckpointWriter::saveRank(const std::string& tmpDir, int rank, int worldSize,
                                const std::vector<CheckpointShard>& shards, const CheckpointSaveOptions& options) {
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
        const FileDigest facts = digestCheckpointFile(path, /*loading=*/false);
        files.push_back({{"name", name}, {"size", facts.size}, {"xxh3_64", facts.xxh3}});
      }
      boxes[group] = groupBoxes;
    }
    nlohmann::ordered_json list = {{"rank", rank}, {"world_size", worldSize}, {"groups", boxes}, {"files", files}};
    writeFileAtomically((tmp / rankListName(rank)).string(), list.dump(1) + "\n");
  } catch (const fs::filesystem_error& error) {
    throw RuntimeError(tmpDir + ": rank " + std::to_string(rank) + ": cannot write its checkpoint shards: " + error.what());
  }
}

CheckpointSaveResult CheckpointWriter::commitSave(const std::string& saveDir, const std::string& tmpDir,
                                                  const CheckpointState& state, int worldSize,
                                                  const CheckpointSaveOptions& options) {
  auto started = std::chrono::steady_clock::now();
  CheckpointSaveResult result;
  const fs::path root(saveDir);
  const fs::path final = root / checkpointDirectoryName(state.step);
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
      nlohmann::ordered_json list;
      try {
        list = parseOrderedJson(readWholeFile(listPath.string()), listPath.string());
      } catch (const InputError& damaged) {
        throw RuntimeError(std::string(damaged.what()) + " (a rank's box list, written during this save)");
      }
      if (list.at("rank") != rank || list.at("world_size") != worldSize)
        throw RuntimeError(listPath.string() + ": written by rank " + describeJsonValue(list.at("rank")) + " of " +
                           describeJsonValue(list.at("world_size")) + " ranks, the commit expects rank " +
                           std::to_string(rank) + " of " + std::to_string(worldSize));
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

    // A whole group whose tensors some rank split: assembled into whole-tensor shards, one tensor
    // in memory at a time, and the ranks' files of it dropped.
    auto consolidate = [&](const std::string& group, MergedGroup& g) {
      std::set<std::string> rankFiles;
      for (const nlohmann::ordered_json& file : g.shards) rankFiles.insert(file.get<std::string>());
      std::map<std::string, SafetensorsFile> opened;
      for (const std::string& file : rankFiles) opened.emplace(file, SafetensorsFile::open((tmp / file).string()));
      std::vector<std::vector<std::string>> contents(1);
      uint64_t shardBytes = 0;
      for (const std::string& name : g.order) {
        const MergedTensor& t = g.tensors[name];
        const uint64_t bytes = static_cast<uint64_t>(boxVolume(wholeBox(t.globalShape))) * dtypeSize(*parseDType(t.dtype));
        if (!contents.back().empty() && shardBytes + bytes > options.maxShardBytes) {
          contents.emplace_back();
          shardBytes = 0;
        }
        contents.back().push_back(name);
        shardBytes += bytes;
      }
      std::vector<std::string> shardNames;
      for (size_t i = 0; i < contents.size(); ++i) {
        const std::string fileName = shardName(group, i, contents.size());
        std::vector<StreamedTensor> streamed;
        for (const std::string& name : contents[i]) {
          const MergedTensor& t = g.tensors[name];
          const DType dtype = *parseDType(t.dtype);
          streamed.push_back({name, dtype, t.globalShape, [&, name, dtype](uint8_t* out) {
                                const MergedTensor& saved = g.tensors[name];
                                for (size_t b = 0; b < saved.boxes.size(); ++b) {
                                  const SafetensorsFile& file = opened.at(saved.boxList[b]["file"].get<std::string>());
                                  const SafetensorsEntry* entry = file.find(name);
                                  if (!entry) throw RuntimeError(file.path() + ": tensor '" + name + "': missing from its rank's file");
                                  copyRegion(file.data(*entry), saved.boxes[b], out, wholeBox(saved.globalShape), saved.boxes[b],
                                             dtypeSize(dtype));
                                  file.release(*entry);
                                }
                              }});
        }
        const std::string path = (tmp / fileName).string();
        writeSafetensorsStreamed(path, streamed, {{"format", "pt"}});
        const FileDigest facts = digestCheckpointFile(path, /*loading=*/false);
        files.push_back({{"name", fileName}, {"size", facts.size}, {"xxh3_64", facts.xxh3}});
        result.bytesWritten += facts.size;
        ++result.files;
        shardNames.push_back(fileName);
        for (const std::string& name : contents[i]) {
          MergedTensor& t = g.tensors[name];
          t.boxes = {wholeBox(t.globalShape)};
          t.ranks = {0};
          t.boxList = nlohmann::ordered_json::array();
          t.boxList.push_back({{"rank", 0},
                               {"file", fileName},
                               {"offset", std::vector<int64_t>(t.globalShape.size(), 0)},
                               {"shape", t.globalShape}});
        }
      }
      opened.clear();
      nlohmann::ordered_json kept = nlohmann::ordered_json::array();
      for (const nlohmann::ordered_json& file : files) {
        const std::string name = file.at("name").get<std::string>();
        if (!rankFiles.count(name)) {
          kept.push_back(file);
          continue;
        }
        fs::remove(tmp / name);
        result.bytesWritten -= file.at("size").get<uint64_t>();
        --result.files;
      }
      files = kept;
      g.shards = nlohmann::ordered_json(shardNames);
    };

    nlohmann::ordered_json groups = nlohmann::ordered_json::object();
    for (const std::string& group : groupOrder) {
      MergedGroup& g = merged[group];
      bool split = false;
      for (const std::string& name : g.order) {
        const MergedTensor& t = g.tensors[name];
        std::vector<ShardBox> gaps = uncoveredParts(wholeBox(t.globalShape), t.boxes);
        if (!gaps.empty())
          throw std::invalid_argument("checkpoint: group '" + group + "': tensor '" + name + "': no rank writes " +
                                      describeBox(gaps.front()) + " of its global shape " + describeShape(t.globalShape));
        split = split || t.boxes.size() > 1;
      }
      if (split && std::find(options.wholeGroups.begin(), options.wholeGroups.end(), group) != options.wholeGroups.end())
        consolidate(group, g);
      nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
      nlohmann::ordered_json weightMap = nlohmann::ordered_json::object();
      bool wholeTensors = true;  // every tensor one box: an HF directory
      for (const std::string& name : g.order) {
        const MergedTensor& t = g.tensors[name];
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
        const FileDigest facts = digestCheckpointFile(path, /*loading=*/false);
        files.push_back({{"name", indexName}, {"size", facts.size}, {"xxh3_64", facts.xxh3}});
        result.bytesWritten += facts.size;
        ++result.files;
        groups[group]["index"] = indexName;
      }
      groups[group]["tensors"] = tensors;
    }

    for (const auto& [name, bytes] : options.extraFiles) {
      const bool plain = !name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
                         name != kCheckpointManifestName && name.compare(0, std::strlen(kTmpPrefix), kTmpPrefix) != 0;
      bool taken = false;
      for (const nlohmann::ordered_json& file : files) taken = taken || file.at("name") == name;
      if (!plain || taken)
        throw std::invalid_argument("checkpoint: extra file " + quoteForMessage(name) +
                                    ": expected a plain file name that no other checkpoint file uses");
      const std::string path = (tmp / name).string();
      writeFileAtomically(path, bytes);
      const FileDigest facts = digestCheckpointFile(path, /*loading=*/false);
      files.push_back({{"name", name}, {"size", facts.size}, {"xxh3_64", facts.xxh3}});
      result.bytesWritten += facts.size;
      ++result.files;
    }

    nlohmann::ordered_json manifest = {{"format", kCheckpointFormatName},
                                       {"format_version", kCheckpointFormatVersion},
                                       {kManifestChecksumField, ""},
                                       {"model_hash", modelIdentityHash(state.model)},
                                       {"model", state.model},
                                       {"step", state.step},
                                       {"consumed_samples", state.consumedSamples},
                                       {"data_order_state", state.dataOrderState},
                                       {"rng", state.rng},
                                       {"config", state.config},
                                       {"world_size", worldSize},
                                       {"groups", groups},
                                       {"files", files}};
    // The checksum is over the manifest as a reader parses it (keys sorted), so it is computed on
    // the text's parse rather than on the ordered object.
    manifest[kManifestChecksumField] = manifestChecksum(nlohmann::json::parse(manifest.dump()));
    std::string manifestText = manifest.dump(2) + "\n";
    writeFileAtomically((tmp / kCheckpointManifestName).string(), manifestText);
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
      std::vector<CheckpointEntry> complete = listCheckpoints(saveDir);
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
  } catch (const nlohmann::json::exception& error) {
    abortSave(tmpDir);
    throw RuntimeError(saveDir + ": cannot save checkpoint " + final.filename().string() +
                       ": a rank's box list is damaged: " + quoteForMessage(error.what(), 160));
  } catch (...) {
    abortSave(tmpDir);
    throw;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace dgemma
