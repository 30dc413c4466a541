#include "support/AtomicFile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>

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

AtomicFileWriter::AtomicFileWriter(const std::string& path) : path_(path) {
  namespace fs = std::filesystem;
  checkWritableTarget(path);
  const fs::path target(path);
  const fs::path directory = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::random_device entropy;
  temporary_ = (directory / (std::string(".") + target.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                             std::to_string(entropy())))
                   .string();
  fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("create " + temporary_);
}

AtomicFileWriter::~AtomicFileWriter() { discard(); }

void AtomicFileWriter::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
  temporary_.clear();
}

void AtomicFileWriter::fail(const std::string& what) {
  const std::string reason = std::strerror(errno);
  discard();
  throw RuntimeError(path_ + ": cannot write: " + what + ": " + reason);
}

void AtomicFileWriter::append(std::string_view bytes) {
  if (fd_ < 0) throw std::logic_error(path_ + ": AtomicFileWriter::append after commit or failure");
  size_t written = 0;
  while (written < bytes.size()) {
    ssize_t n = ::write(fd_, bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    written += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  namespace fs = std::filesystem;
  if (fd_ < 0) throw std::logic_error(path_ + ": AtomicFileWriter::commit after commit or failure");
  if (::fsync(fd_) != 0) fail("fsync");
  const int closeResult = ::close(fd_);
  fd_ = -1;
  if (closeResult != 0) fail("close");
  if (::rename(temporary_.c_str(), path_.c_str()) != 0) fail("rename");
  temporary_.clear();
  const fs::path target(path_);
  syncDirectory(target.has_parent_path() ? target.parent_path().string() : std::string("."));
}

void writePiecesAtomically(const std::string& path, const std::vector<std::string_view>& pieces) {
  AtomicFileWriter file(path);
  for (std::string_view piece : pieces) file.append(piece);
  file.commit();
}

void writeFileAtomically(const std::string& path, std::string_view bytes) { writePiecesAtomically(path, {bytes}); }

}  // namespace dgemma
