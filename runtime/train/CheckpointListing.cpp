#include "runtime/train/CheckpointListing.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "support/AtomicFile.h"
#include "support/Error.h"

namespace dgemma {

namespace {

namespace fs = std::filesystem;

// A manifest lists every tensor and file; even a large model's stays far below this.
constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;

// The bytes of a manifest: a regular file of at most kMaxManifestBytes (a device or a FIFO would
// never end).
std::string readManifestBytes(const std::string& path) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) throw InputError(path + ": not a regular file");
  const uint64_t size = fs::file_size(path, error);
  if (error) throw InputError(path + ": cannot stat: " + error.message());
  if (size > kMaxManifestBytes)
    throw InputError(path + ": " + std::to_string(size) + " bytes, more than any manifest (at most " +
                     std::to_string(kMaxManifestBytes) + ")");
  return readWholeFile(path);
}

// Whether `directory` holds a manifest that parses, validates and names `step`: a complete
// checkpoint. The shards are not hashed here; CheckpointReader::load does that.
bool hasValidManifest(const fs::path& directory, int64_t step) {
  const std::string path = (directory / kCheckpointManifestName).string();
  try {
    return readCheckpointManifest(path).state.step == step;
  } catch (const InputError&) {
    return false;
  }
}

}  // namespace

std::string checkpointDirectoryName(int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

std::string checkpointStepDirectory(const std::string& saveDir, int64_t step) {
  return (fs::path(saveDir) / checkpointDirectoryName(step)).string();
}

std::optional<int64_t> stepOfCheckpointDirectoryName(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return std::nullopt;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

CheckpointManifest readCheckpointManifest(const std::string& path) {
  return parseCheckpointManifest(readManifestBytes(path), path);
}

std::vector<CheckpointEntry> listCheckpoints(const std::string& saveDir) {
  std::vector<CheckpointEntry> entries;
  std::error_code error;
  if (!fs::is_directory(saveDir, error)) return entries;
  fs::directory_iterator it(saveDir, error);
  if (error) throw RuntimeError(saveDir + ": cannot list: " + error.message());
  for (const fs::directory_entry& entry : it) {
    std::optional<int64_t> step = stepOfCheckpointDirectoryName(entry.path().filename().string());
    if (!step || !entry.is_directory(error)) continue;
    if (!hasValidManifest(entry.path(), *step)) continue;
    entries.push_back({*step, entry.path().string()});
  }
  std::sort(entries.begin(), entries.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return entries;
}

std::optional<CheckpointEntry> newestCheckpoint(const std::string& saveDir) {
  std::optional<CheckpointEntry> newest;
  std::error_code error;
  if (!fs::is_directory(saveDir, error)) return newest;
  fs::directory_iterator it(saveDir, error);
  if (error) throw RuntimeError(saveDir + ": cannot list: " + error.message());
  for (const fs::directory_entry& entry : it) {
    std::optional<int64_t> step = stepOfCheckpointDirectoryName(entry.path().filename().string());
    if (step && entry.is_directory(error) && (!newest || *step > newest->step)) newest = CheckpointEntry{*step, entry.path().string()};
  }
  return newest;
}

std::optional<std::string> newestCheckpointDirectory(const std::string& saveDir) {
  std::optional<CheckpointEntry> entry = newestCheckpoint(saveDir);
  if (!entry) return std::nullopt;
  return entry->directory;
}

}  // namespace dgemma
