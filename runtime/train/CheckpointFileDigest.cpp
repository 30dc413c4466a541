#include "runtime/train/CheckpointFileDigest.h"

#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "support/Error.h"
#include "support/InputFile.h"

namespace dgemma {

namespace {

std::string hex64(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace

FileDigest digestCheckpointFile(const std::string& path, bool loading) {
  auto fail = [&](const std::string& what) {
    std::string message = path + ": " + what + ": " + std::strerror(errno);
    if (loading) throw InputError(message);
    throw RuntimeError(message);
  };
  // Only a regular file: a FIFO placed among a checkpoint's files would block the open forever.
  RegularFile file(path);
  const int fd = file.fd();
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(4 << 20);
  FileDigest digest;
  for (;;) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int savedErrno = errno;
      const uint64_t hash = XXH3_64bits_digest(state);
      XXH3_freeState(state);
      errno = savedErrno;
      if (n < 0) fail("cannot read");
      digest.xxh3 = hex64(hash);
      return digest;
    }
    XXH3_64bits_update(state, buffer.data(), static_cast<size_t>(n));
    digest.size += static_cast<uint64_t>(n);
  }
}

std::string weightsListingDigest(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path weights(path);
  if (!fs::exists(weights, error)) throw InputError(path + ": no such file or directory");
  auto endsWith = [](const std::string& name, const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  std::map<std::string, uint64_t> listed;
  if (fs::is_directory(weights)) {
    for (const fs::directory_entry& entry : fs::directory_iterator(weights)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() &&
          (endsWith(name, ".safetensors") || endsWith(name, ".safetensors.index.json") || name == "config.json"))
        listed[name] = entry.file_size();
    }
  } else {
    listed[weights.filename().string()] = fs::file_size(weights);
  }
  std::string text;
  for (const auto& [name, size] : listed) text += name + '\t' + std::to_string(size) + '\n';
  return hex64(XXH3_64bits(text.data(), text.size()));
}

}  // namespace dgemma
