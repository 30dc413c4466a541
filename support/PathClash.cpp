#include "support/PathClash.h"

#include <sys/stat.h>

#include <filesystem>
#include <optional>

#include "support/Error.h"

namespace dgemma {

namespace {

namespace fs = std::filesystem;

struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  bool operator==(const FileIdentity& other) const { return device == other.device && inode == other.inode; }
};

std::optional<FileIdentity> identityOf(const fs::path& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return std::nullopt;  // follows symlinks
  return FileIdentity{status.st_dev, status.st_ino};
}

// The path itself when it exists, then each existing ancestor, nearest first (after making it
// absolute, so that a relative path's ancestors include the working directory's).
std::vector<FileIdentity> selfAndAncestors(const std::string& path) {
  std::vector<FileIdentity> chain;
  std::error_code error;
  fs::path current = fs::absolute(fs::path(path), error);
  if (error) current = fs::path(path);
  while (true) {
    if (std::optional<FileIdentity> identity = identityOf(current)) chain.push_back(*identity);
    const fs::path parent = current.parent_path();
    if (parent.empty() || parent == current) break;
    current = parent;
  }
  return chain;
}

bool sameFile(const NamedPath& a, const NamedPath& b) {
  const std::optional<FileIdentity> first = identityOf(a.path), second = identityOf(b.path);
  if (first && second) return *first == *second;
  if (first || second) return false;
  // Neither exists yet: the same path, spelled alike once made absolute and normal.
  std::error_code error;
  return fs::weakly_canonical(fs::absolute(a.path, error), error) == fs::weakly_canonical(fs::absolute(b.path, error), error);
}

// Whether `inner` is `outer` or lies somewhere below it.
bool within(const NamedPath& inner, const NamedPath& outer) {
  const std::optional<FileIdentity> directory = identityOf(outer.path);
  if (!directory) return false;
  for (const FileIdentity& ancestor : selfAndAncestors(inner.path))
    if (ancestor == *directory) return true;
  return false;
}

// The regular files directly inside `directory` (a plan's rank files, a checkpoint's shards): an
// output hard-linked to one of them, anywhere, would overwrite it too. At most kMaxListed are looked
// at; an input directory is a plan or a checkpoint, not a tree of millions.
constexpr size_t kMaxListed = 100000;

std::optional<fs::path> sameAsFileIn(const NamedPath& output, const NamedPath& directory) {
  const std::optional<FileIdentity> target = identityOf(output.path);
  if (!target) return std::nullopt;
  std::error_code error;
  fs::directory_iterator entries(directory.path, error);
  if (error) return std::nullopt;
  size_t listed = 0;
  for (const fs::directory_entry& entry : entries) {
    if (++listed > kMaxListed) break;
    if (std::optional<FileIdentity> identity = identityOf(entry.path()); identity && *identity == *target) return entry.path();
  }
  return std::nullopt;
}

[[noreturn]] void clash(const NamedPath& output, const NamedPath& other, const std::string& how) {
  throw InputError(output.flag + " " + output.path + ": " + how + " " + other.flag + " " + other.path +
                   "; an output may not overwrite what the run reads (choose another path)");
}

}  // namespace

bool liesWithin(const std::string& inner, const std::string& outer) { return within({"", inner}, {"", outer}); }

void checkOutputsAgainstInputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs,
                               const std::vector<NamedPath>& inputDirectories) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& output = outputs[i];
    if (output.path.empty()) continue;
    for (const NamedPath& input : inputs)
      if (!input.path.empty() && sameFile(output, input)) clash(output, input, "is the same file as");
    for (const NamedPath& directory : inputDirectories) {
      if (directory.path.empty()) continue;
      if (within(output, directory)) clash(output, directory, "lies in the input directory of");
      if (std::optional<fs::path> file = sameAsFileIn(output, directory))
        clash(output, {directory.flag + " " + directory.path + ": its file", file->string()}, "is the same file as");
    }
    for (size_t j = 0; j < i; ++j)
      if (!outputs[j].path.empty() && sameFile(output, outputs[j])) clash(output, outputs[j], "is also the output of");
  }
}

}  // namespace dgemma
