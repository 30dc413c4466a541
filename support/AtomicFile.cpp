#include "support/AtomicFile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "support/Error.h"
#include "support/InputFile.h"

namespace dgemma {

std::string readWholeFile(const std::string& path) { return readRegularFile(path); }

namespace {

// Refuses an existing target that rename would replace but that is no regular file.
void checkWritableTarget(const std::string& path) {
  struct stat status {};
  if (::stat(path.c_str(), &status) != 0) return;  // a new path (or a dangling link): rename creates it
  if (!S_ISREG(status.st_mode)) {
    throw InputError(path + ": expected a regular file or a new path to write, got " + describeFileType(status.st_mode));
  }
}

}  // namespace

void createOutputDirectory(const std::string& directory, const std::string& what) {
  namespace fs = std::filesystem;
  const fs::path wanted = fs::path(directory).lexically_normal();
  // The deepest existing ancestor (or the directory itself) must be a directory.
  for (fs::path existing = wanted; !existing.empty(); existing = existing.parent_path()) {
    struct stat status {};
    if (::stat(existing.c_str(), &status) == 0) {
      if (S_ISDIR(status.st_mode)) break;
      if (existing == wanted) {
        throw InputError(what + ": " + directory + ": expected a directory or a new path, got " +
                         describeFileType(status.st_mode));
      }
      throw InputError(what + ": " + directory + ": cannot create the directory: " + existing.string() + " is " +
                       describeFileType(status.st_mode));
    }
    if (existing == existing.parent_path()) break;
  }
  std::error_code error;
  fs::create_directories(wanted, error);
  if (error) throw RuntimeError(what + ": " + directory + ": cannot create the directory: " + error.message());
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
  checkWritableTarget(path);
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
