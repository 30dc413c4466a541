// The lines of a pre-training corpus file (docs/pretraining.md, "Preprocessing"): plain text, or
// gzip when the file starts with gzip's magic bytes 1f 8b (whatever its name), concatenated members
// included. Only regular files are read (support/InputFile.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace dgemma {

class CorpusLines {
 public:
  // Longer lines are refused rather than buffered without bound.
  static constexpr int64_t kMaxLineBytes = int64_t{256} << 20;

  // Throws InputError "PATH: cannot read: ..." or "PATH: expected a regular file, got ...".
  explicit CorpusLines(const std::string& path, int64_t maxLineBytes = kMaxLineBytes);
  ~CorpusLines();
  CorpusLines(const CorpusLines&) = delete;
  CorpusLines& operator=(const CorpusLines&) = delete;

  // The next line, without its "\n" (and without a "\r" before it); false at the end of the file.
  // Throws InputError "PATH:LINE: row: expected a line of at most N bytes, got more" and, for a damaged
  // gzip stream, "PATH: gzip: expected ..., got ..."; RuntimeError for a failed read.
  bool next(std::string& line);
  int64_t lineNumber() const { return lineNumber_; }  // of the line next() returned last, 1-based
  int64_t bytesRead() const { return bytesRead_; }    // of text, after decompression
  bool compressed() const { return gzip_ != nullptr; }

 private:
  struct Gzip;
  size_t fill();

  std::string path_;
  int64_t maxLineBytes_;
  int fd_ = -1;
  std::unique_ptr<Gzip> gzip_;
  std::string buffer_;
  size_t position_ = 0, end_ = 0;
  bool endOfFile_ = false;
  int64_t lineNumber_ = 0;
  int64_t bytesRead_ = 0;
};

}  // namespace dgemma
