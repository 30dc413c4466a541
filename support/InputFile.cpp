#include "support/InputFile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {

std::string describeFileType(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
  }
  return "a file of unknown type";
}

RegularFile::RegularFile(const std::string& path, const std::string& what) {
  if (path.find('\0') != std::string::npos) throw InputError(quoteForMessage(path) + ": cannot read: the path contains a NUL byte");
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer before fstat can refuse it.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) throw InputError(path + ": cannot read: " + std::strerror(errno));
  struct stat status {};
  if (::fstat(fd_, &status) != 0) {
    const int saved = errno;
    ::close(fd_);
    throw InputError(path + ": cannot read: " + std::strerror(saved));
  }
  if (!S_ISREG(status.st_mode)) {
    ::close(fd_);
    throw InputError(path + ": expected " + what + ", got " + describeFileType(status.st_mode));
  }
  // Regular files ignore O_NONBLOCK, but clear it so nothing downstream sees EAGAIN.
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  size_ = static_cast<uint64_t>(status.st_size);
}

RegularFile::~RegularFile() {
  if (fd_ >= 0) ::close(fd_);
}

int RegularFile::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

std::string readRegularFile(const std::string& path, uint64_t maxBytes) {
  RegularFile file(path);
  if (file.size() > maxBytes) {
    throw InputError(path + ": expected at most " + std::to_string(maxBytes) + " bytes, got " + std::to_string(file.size()));
  }
  std::string contents;
  contents.resize(static_cast<size_t>(file.size()));
  size_t filled = 0;
  // Read until end of file, not just st_size bytes: a file may grow while it is read (and /proc files
  // report size 0); the cap still holds.
  // One byte past the cap proves the file too long.
  const uint64_t limit = maxBytes == std::numeric_limits<uint64_t>::max() ? maxBytes : maxBytes + 1;
  for (;;) {
    if (filled == contents.size()) {
      if (filled >= limit) break;
      contents.resize(static_cast<size_t>(std::min<uint64_t>(std::max<uint64_t>(uint64_t{filled} * 2, 4096), limit)));
    }
    const ssize_t n = ::read(file.fd(), contents.data() + filled, contents.size() - filled);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw RuntimeError(path + ": cannot read: " + std::strerror(errno));
    }
    if (n == 0) break;
    filled += static_cast<size_t>(n);
  }
  if (filled > maxBytes) {
    throw InputError(path + ": expected at most " + std::to_string(maxBytes) + " bytes, got more (the file grew while it was read)");
  }
  contents.resize(filled);
  return contents;
}

}  // namespace dgemma
