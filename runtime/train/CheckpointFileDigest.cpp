#include "runtime/train/CheckpointFileDigest.h"

#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
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

}  // namespace dgemma
