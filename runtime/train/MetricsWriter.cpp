#include "runtime/train/MetricsWriter.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "support/Error.h"
#include "support/Json.h"
#include "support/AtomicFile.h"

namespace dgemma {

namespace {

// "%.9g" gives the shortest decimal count that round-trips every fp32 value, "%.17g" every fp64 value.
void appendFloat(std::string& out, double value, int digits) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char text[40];
  std::snprintf(text, sizeof text, "%.*g", digits, value);
  out += text;
}

void appendValue(std::string& out, const MetricValue& value) {
  if (std::holds_alternative<std::nullptr_t>(value)) out += "null";
  else if (const bool* b = std::get_if<bool>(&value)) out += *b ? "true" : "false";
  else if (const int64_t* i = std::get_if<int64_t>(&value)) out += std::to_string(*i);
  else if (const float* f = std::get_if<float>(&value)) appendFloat(out, *f, 9);
  else if (const double* d = std::get_if<double>(&value)) appendFloat(out, *d, 17);
  else out += nlohmann::json(std::get<std::string>(value)).dump();  // quoted and escaped
}

[[noreturn]] void ioFailure(const std::string& path, const std::string& what) {
  throw RuntimeError(path + ": cannot write: " + what + ": " + std::strerror(errno));
}

}  // namespace

std::string metricsSplitName(MetricsSplit split) {
  switch (split) {
    case MetricsSplit::Train: return "train";
    case MetricsSplit::Validation: return "validation";
    case MetricsSplit::Test: return "test";
  }
  return "?";
}

std::string formatMetricsLine(const MetricsRecord& r) {
  if (r.split == MetricsSplit::Train && (!r.lr || !r.gradNorm))
    throw std::invalid_argument("metrics: step " + std::to_string(r.step) + ": a train line needs lr and grad_norm");
  std::set<std::string> names = {"step", "split", "loss", "diffusion_loss", "encoder_loss", "lr",
                                 "grad_norm", "consumed_samples", "tokens", "seconds"};
  std::string line = "{\"step\": " + std::to_string(r.step) + ", \"split\": \"" + metricsSplitName(r.split) + "\"";
  line += ", \"loss\": ";
  appendFloat(line, r.loss, 9);
  line += ", \"diffusion_loss\": ";
  if (r.diffusionLoss) appendFloat(line, *r.diffusionLoss, 9);
  else line += "null";
  line += ", \"encoder_loss\": ";
  if (r.encoderLoss) appendFloat(line, *r.encoderLoss, 9);
  else line += "null";
  line += ", \"lr\": ";
  if (r.lr) appendFloat(line, *r.lr, 17);
  else line += "null";
  line += ", \"grad_norm\": ";
  if (r.gradNorm) appendFloat(line, *r.gradNorm, 9);
  else line += "null";
  line += ", \"consumed_samples\": " + std::to_string(r.consumedSamples);
  line += ", \"tokens\": " + std::to_string(r.tokens);
  line += ", \"seconds\": ";
  appendFloat(line, r.seconds, 17);
  for (const auto& [name, value] : r.extra) {
    if (!names.insert(name).second)
      throw std::invalid_argument("metrics: step " + std::to_string(r.step) + ": field '" + name + "' appears twice");
    line += ", " + nlohmann::json(name).dump() + ": ";
    appendValue(line, value);
  }
  line += "}\n";
  return line;
}

MetricsWriter MetricsWriter::create(const std::string& path, Options options) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) ioFailure(path, "open");
  MetricsWriter writer(path, fd, options);
  if (options.syncEachLine && ::fsync(fd) != 0) ioFailure(path, "fsync");
  return writer;
}

MetricsWriter MetricsWriter::resume(const std::string& path, int64_t resumedStep, Options options) {
  std::error_code error;
  uint64_t keep = 0;
  if (std::filesystem::exists(path, error)) {
    // The file is read whole: a device or a FIFO would never end.
    if (!std::filesystem::is_regular_file(path, error))
      throw InputError(path + ": not a regular file (a metrics file to resume)");
    std::string contents = readWholeFile(path);
    size_t start = 0;
    int64_t lineNumber = 0;
    // Only lines ending in '\n' count: a torn last line (a crash mid-write) stays past `keep`.
    for (size_t end; (end = contents.find('\n', start)) != std::string::npos; start = end + 1) {
      ++lineNumber;
      std::string_view text(contents.data() + start, end - start);
      const std::string where = path + ":" + std::to_string(lineNumber);
      nlohmann::json object;
      try {
        object = parseJson(text, where);  // bounded nesting: a line is the user's file
      } catch (const InputError&) {
        object = nlohmann::json();  // not an object: refused below as a foreign line
      }
      auto step = object.is_object() ? object.find("step") : object.end();
      if (step == object.end() || !step->is_number_integer())
        throw InputError(where + ": expected a JSON object with an integer \"step\" (is this a dgemma metrics file?)");
      if (step->get<int64_t>() > resumedStep) break;
      keep = end + 1;
    }
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) ioFailure(path, "open");
  MetricsWriter writer(path, fd, options);
  if (::ftruncate(fd, static_cast<off_t>(keep)) != 0) ioFailure(path, "truncate");
  if (::fsync(fd) != 0) ioFailure(path, "fsync");
  return writer;
}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), options_(other.options_) {
  other.fd_ = -1;
}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    options_ = other.options_;
    other.fd_ = -1;
  }
  return *this;
}

MetricsWriter::~MetricsWriter() { close(); }

void MetricsWriter::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void MetricsWriter::write(const MetricsRecord& record) {
  if (fd_ < 0) throw std::logic_error("MetricsWriter::write on a moved-from writer");
  std::string line = formatMetricsLine(record);
  // One write(2) per line: O_APPEND puts it at the end, and a process killed afterwards has handed
  // the whole line to the kernel. Partial writes (a full disk) are retried for the rest.
  size_t written = 0;
  while (written < line.size()) {
    ssize_t n = ::write(fd_, line.data() + written, line.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      ioFailure(path_, "write");
    }
    written += static_cast<size_t>(n);
  }
  if (options_.syncEachLine && ::fsync(fd_) != 0) ioFailure(path_, "fsync");
}

}  // namespace dgemma
