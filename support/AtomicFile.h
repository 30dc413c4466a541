// Whole-file reads and crash-safe writes. A reader never sees a half-written file: writes go to a
// temporary file in the same directory, are fsync'd, renamed over the target, and the directory is
// fsync'd so the rename itself survives a crash.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dgemma {

// The contents of the regular file `path` (support/InputFile.h: a device, FIFO or directory is
// refused). Throws InputError "PATH: cannot read: <reason>" or "PATH: expected a regular file, got
// ..."; RuntimeError "PATH: cannot read: <reason>".
std::string readWholeFile(const std::string& path);
// Replaces `path` by a regular file. The target must not exist or be a regular file (a symbolic link
// is followed for the check and then replaced itself, as rename does): renaming over `/dev/null` or a
// FIFO would replace the node, so anything else is InputError "PATH: expected a regular file or a new
// path to write, got a character device". Throws RuntimeError "PATH: cannot write: <reason>"; on
// failure the target is untouched and the temporary file removed.
void writeFileAtomically(const std::string& path, std::string_view bytes);
// The same for `pieces` written back to back, without first concatenating them (a checkpoint shard
// can be as large as memory).
void writePiecesAtomically(const std::string& path, const std::vector<std::string_view>& pieces);
// A file written in pieces (a stream too large to hold whole) and committed as writePiecesAtomically
// commits: nothing appears at `path` before commit(). A writer destroyed without commit() (an
// exception on the way) removes its temporary file. Errors as writePiecesAtomically's.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();
  void append(std::string_view bytes);
  void commit();

 private:
  [[noreturn]] void fail(const std::string& what);
  void discard() noexcept;

  std::string path_;
  std::string temporary_;  // empty once committed or discarded
  int fd_ = -1;
};
// fsync a directory (after renames into it). Throws RuntimeError.
void syncDirectory(const std::string& directory);
// Creates `directory` and its missing parents, for an output directory named by `what` ("-o"). An
// existing directory is fine. Throws InputError "WHAT: PATH: expected a directory or a new path, got
// a regular file" when it or a parent is not a directory; RuntimeError for other failures.
void createOutputDirectory(const std::string& directory, const std::string& what);

}  // namespace dgemma
