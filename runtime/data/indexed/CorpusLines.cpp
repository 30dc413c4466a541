#include "runtime/data/indexed/CorpusLines.h"

#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "support/Error.h"
#include "support/InputFile.h"

namespace dgemma {

namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;

}  // namespace

struct CorpusLines::Gzip {
  gzFile file = nullptr;
  ~Gzip() {
    if (file != nullptr) gzclose(file);
  }
};

CorpusLines::CorpusLines(const std::string& path, int64_t maxLineBytes)
    : path_(path), maxLineBytes_(maxLineBytes), buffer_(kBufferBytes, '\0') {
  RegularFile regular(path, "a regular JSONL file");
  unsigned char magic[2] = {};
  const ssize_t peeked = ::pread(regular.fd(), magic, sizeof magic, 0);
  if (peeked < 0) throw RuntimeError(path + ": cannot read: " + std::strerror(errno));
  fd_ = regular.release();
  if (peeked == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    gzip_ = std::make_unique<Gzip>();
    gzip_->file = gzdopen(fd_, "rb");  // owns fd_ from here on
    if (gzip_->file == nullptr) {
      ::close(fd_);
      fd_ = -1;
      throw RuntimeError(path + ": cannot read: gzdopen failed");
    }
    fd_ = -1;
    gzbuffer(gzip_->file, 1 << 18);
  }
}

CorpusLines::~CorpusLines() {
  if (fd_ >= 0) ::close(fd_);
}

size_t CorpusLines::fill() {
  position_ = end_ = 0;
  if (endOfFile_) return 0;
  if (gzip_ != nullptr) {
    const int count = gzread(gzip_->file, buffer_.data(), static_cast<unsigned>(buffer_.size()));
    int code = Z_OK;
    const char* message = gzerror(gzip_->file, &code);
    // A truncated stream reads as an end of file with Z_BUF_ERROR ("unexpected end of file").
    if (count < 0 || (code != Z_OK && code != Z_STREAM_END))
      throw InputError(path_ + ": gzip: expected a complete gzip stream, got an error after " +
                       std::to_string(bytesRead_) + " bytes of text: " + message);
    end_ = static_cast<size_t>(count);
  } else {
    ssize_t count;
    do count = ::read(fd_, buffer_.data(), buffer_.size());
    while (count < 0 && errno == EINTR);
    if (count < 0) throw RuntimeError(path_ + ": cannot read: " + std::strerror(errno));
    end_ = static_cast<size_t>(count);
  }
  if (end_ == 0) endOfFile_ = true;
  bytesRead_ += static_cast<int64_t>(end_);
  return end_;
}

bool CorpusLines::next(std::string& line) {
  line.clear();
  bool any = false;
  for (;;) {
    if (position_ == end_ && fill() == 0) break;
    any = true;
    const char* start = buffer_.data() + position_;
    const size_t available = end_ - position_;
    const auto* newline = static_cast<const char*>(std::memchr(start, '\n', available));
    const size_t take = newline != nullptr ? static_cast<size_t>(newline - start) : available;
    if (static_cast<int64_t>(line.size() + take) > maxLineBytes_)
      throw InputError(path_ + ":" + std::to_string(lineNumber_ + 1) + ": row: expected a line of at most " +
                       std::to_string(maxLineBytes_) + " bytes, got more");
    line.append(start, take);
    position_ += take + (newline != nullptr ? 1 : 0);
    if (newline != nullptr) break;
  }
  if (!any) return false;
  ++lineNumber_;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

}  // namespace dgemma
