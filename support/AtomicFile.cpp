#include "support/AtomicFile.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "support/Error.h"

namespace dgemma {

std::string readWholeFile(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw InputError(path + ": cannot read: " + std::strerror(errno));
  std::ostringstream contents;
  contents << stream.rdbuf();
  if (stream.bad()) throw InputError(path + ": cannot read: I/O error");
  return std::move(contents).str();
}

void syncDirectory(const std::string& directory) {
  int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw RuntimeError(directory + ": cannot open directory: " + std::strerror(errno));
  int rc = ::fsync(fd);
  int savedErrno = errno;
  ::close(fd);
  if (rc != 0) throw RuntimeError(directory + ": fsync failed: " + std::strerror(savedErrno));
}

void writePiecesAtomically(const std::string& path, const std::vector<std::string_view>& pieces) {
  namespace fs = std::filesystem;
  fs::path target(path);
  fs::path directory = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::random_device entropy;
  fs::path temporary = directory / (std::string(".") + target.filename().string() + ".tmp-" + std::to_string(::getpid()) +
                                    "-" + std::to_string(entropy()));

  int fd = -1;
  auto fail = [&](const std::string& what) {
    std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    std::error_code ignored;
    fs::remove(temporary, ignored);
    throw RuntimeError(path + ": cannot write: " + what + ": " + reason);
  };

  fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail("create " + temporary.string());
  for (std::string_view piece : pieces) {
    size_t written = 0;
    while (written < piece.size()) {
      ssize_t n = ::write(fd, piece.data() + written, piece.size() - written);
      if (n < 0) {
        if (errno == EINTR) continue;
        fail("write");
      }
      written += static_cast<size_t>(n);
    }
  }
  if (::fsync(fd) != 0) fail("fsync");
  int closeResult = ::close(fd);
  fd = -1;
  if (closeResult != 0) fail("close");
  if (::rename(temporary.c_str(), target.c_str()) != 0) fail("rename");
  syncDirectory(directory.string());
}

void writeFileAtomically(const std::string& path, std::string_view bytes) { writePiecesAtomically(path, {bytes}); }

}  // namespace dgemma
