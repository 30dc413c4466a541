// Opening the files a user names as inputs (JSONL rows, images, configs, plans, checkpoints). Only
// regular files are read: a device, FIFO or socket can be endless (`/dev/zero`) or block forever (a
// FIFO nobody writes), so a reader of one would never return. The check is made on the opened
// descriptor, so the file cannot be swapped between the check and the read.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace dgemma {

// "a directory", "a character device", "a FIFO", ... for a st_mode that is not a regular file.
std::string describeFileType(unsigned mode);

// An open read-only descriptor of a regular file; closes it on destruction.
class RegularFile {
 public:
  // Throws InputError "PATH: cannot read: REASON" or "PATH: expected WHAT, got a FIFO".
  explicit RegularFile(const std::string& path, const std::string& what = "a regular file");
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }  // at open time
  // Hands the descriptor over (to fdopen); the destructor then leaves it alone.
  int release();

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole contents of the regular file `path`, at most `maxBytes` long. Throws InputError for a
// file that cannot be opened, is not a regular file, or is longer than maxBytes ("PATH: expected at
// most N bytes, got M"); RuntimeError "PATH: cannot read: REASON" when reading fails.
std::string readRegularFile(const std::string& path, uint64_t maxBytes = std::numeric_limits<uint64_t>::max());

}  // namespace dgemma
