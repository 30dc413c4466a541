#include "runtime/train/TensorBoardWriter.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>

#include "support/Error.h"
#include "support/AtomicFile.h"

namespace dgemma {

namespace {

// --- CRC-32C ---------------------------------------------------------------------------------------

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;

constexpr std::array<uint32_t, 256> makeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ kCastagnoliReflected : crc >> 1;
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrcTable = makeCrcTable();

// --- protobuf wire format: just what Event, Summary, Summary.Value and SessionLog need -----------

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void putVarint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

void putKey(std::string& out, uint32_t field, WireType type) { putVarint(out, (static_cast<uint64_t>(field) << 3) | type); }

void putLittleEndian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xff);
}

void putDouble(std::string& out, uint32_t field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  putKey(out, field, kFixed64);
  putLittleEndian(out, bits, 8);
}

void putFloat(std::string& out, uint32_t field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  putKey(out, field, kFixed32);
  putLittleEndian(out, bits, 4);
}

// int64 fields are varints of the two's-complement value (10 bytes when negative).
void putInt64(std::string& out, uint32_t field, int64_t value) {
  putKey(out, field, kVarint);
  putVarint(out, static_cast<uint64_t>(value));
}

void putBytes(std::string& out, uint32_t field, std::string_view bytes) {
  putKey(out, field, kLengthDelimited);
  putVarint(out, bytes.size());
  out += bytes;
}

// Event field numbers (event.proto) and the nested messages'.
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5, kEventSessionLog = 7;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;
constexpr uint32_t kSessionLogStatus = 1;
constexpr int kSessionStart = 1;

// Proto3 leaves a zero step out, as protobuf's own serializer does.
std::string eventHeader(double wallTime, int64_t step) {
  std::string event;
  putDouble(event, kEventWallTime, wallTime);
  if (step != 0) putInt64(event, kEventStep, step);
  return event;
}

// A bounds-checked cursor over one message; errors name the message being read.
class WireReader {
 public:
  WireReader(std::string_view bytes, std::string context) : bytes_(bytes), context_(std::move(context)) {}
  bool done() const { return at_ == bytes_.size(); }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (at_ >= bytes_.size()) fail("varint runs past the end");
      uint8_t byte = static_cast<uint8_t>(bytes_[at_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return value;
    }
    fail("varint longer than 10 bytes");
  }
  uint64_t littleEndian(int bytes) {
    if (bytes_.size() - at_ < static_cast<size_t>(bytes)) fail("fixed-size field runs past the end");
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(static_cast<uint8_t>(bytes_[at_ + i])) << (8 * i);
    at_ += bytes;
    return value;
  }
  std::string_view lengthDelimited() {
    uint64_t length = varint();
    if (length > bytes_.size() - at_) fail("length-delimited field runs past the end");
    std::string_view value = bytes_.substr(at_, length);
    at_ += length;
    return value;
  }
  void skip(uint32_t type) {
    switch (type) {
      case kVarint: varint(); return;
      case kFixed64: littleEndian(8); return;
      case kLengthDelimited: lengthDelimited(); return;
      case kFixed32: littleEndian(4); return;
      default: fail("unsupported wire type " + std::to_string(type));
    }
  }
  void expect(uint32_t field, uint32_t type, uint32_t expected) {
    if (type != expected)
      fail("field " + std::to_string(field) + " has wire type " + std::to_string(type) + ", expected " +
           std::to_string(expected));
  }
  [[noreturn]] void fail(const std::string& what) const { throw InputError(context_ + ": " + what); }

 private:
  std::string_view bytes_;
  size_t at_ = 0;
  std::string context_;
};

void decodeSummary(std::string_view bytes, TensorBoardEvent& event, const std::string& context) {
  WireReader summary(bytes, context + ": summary");
  while (!summary.done()) {
    uint64_t key = summary.varint();
    uint32_t field = static_cast<uint32_t>(key >> 3), type = static_cast<uint32_t>(key & 7);
    if (field != kSummaryValue) {
      summary.skip(type);
      continue;
    }
    summary.expect(field, type, kLengthDelimited);
    WireReader value(summary.lengthDelimited(), context + ": summary value");
    std::string tag;
    std::optional<float> simple;
    while (!value.done()) {
      uint64_t valueKey = value.varint();
      uint32_t valueField = static_cast<uint32_t>(valueKey >> 3), valueType = static_cast<uint32_t>(valueKey & 7);
      if (valueField == kValueTag) {
        value.expect(valueField, valueType, kLengthDelimited);
        tag = std::string(value.lengthDelimited());
      } else if (valueField == kValueSimpleValue) {
        value.expect(valueField, valueType, kFixed32);
        uint32_t bits = static_cast<uint32_t>(value.littleEndian(4));
        float number;
        std::memcpy(&number, &bits, sizeof number);
        simple = number;
      } else {
        value.skip(valueType);
      }
    }
    if (simple) event.scalars.emplace_back(std::move(tag), *simple);
  }
}

TensorBoardEvent decodeEvent(std::string_view bytes, const std::string& context) {
  TensorBoardEvent event;
  WireReader reader(bytes, context);
  while (!reader.done()) {
    uint64_t key = reader.varint();
    uint32_t field = static_cast<uint32_t>(key >> 3), type = static_cast<uint32_t>(key & 7);
    switch (field) {
      case kEventWallTime: {
        reader.expect(field, type, kFixed64);
        uint64_t bits = reader.littleEndian(8);
        std::memcpy(&event.wallTime, &bits, sizeof bits);
        break;
      }
      case kEventStep:
        reader.expect(field, type, kVarint);
        event.step = static_cast<int64_t>(reader.varint());
        break;
      case kEventFileVersion:
        reader.expect(field, type, kLengthDelimited);
        event.fileVersion = std::string(reader.lengthDelimited());
        break;
      case kEventSummary:
        reader.expect(field, type, kLengthDelimited);
        decodeSummary(reader.lengthDelimited(), event, context);
        break;
      case kEventSessionLog: {
        reader.expect(field, type, kLengthDelimited);
        WireReader sessionLog(reader.lengthDelimited(), context + ": session_log");
        event.sessionStatus = 0;
        while (!sessionLog.done()) {
          uint64_t logKey = sessionLog.varint();
          uint32_t logField = static_cast<uint32_t>(logKey >> 3), logType = static_cast<uint32_t>(logKey & 7);
          if (logField == kSessionLogStatus) {
            sessionLog.expect(logField, logType, kVarint);
            event.sessionStatus = static_cast<int>(sessionLog.varint());
          } else {
            sessionLog.skip(logType);
          }
        }
        break;
      }
      default: reader.skip(type);
    }
  }
  return event;
}

double wallTimeNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

[[noreturn]] void ioFailure(const std::string& path, const std::string& what) {
  throw RuntimeError(path + ": cannot write: " + what + ": " + std::strerror(errno));
}

}  // namespace

uint32_t crc32c(const void* bytes, size_t size, uint32_t crc) {
  const auto* data = static_cast<const uint8_t*>(bytes);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = kCrcTable[(crc ^ data[i]) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

uint32_t maskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

std::string encodeTfRecord(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  putLittleEndian(record, data.size(), 8);
  putLittleEndian(record, maskCrc32c(crc32c(record.data(), 8)), 4);
  record += data;
  putLittleEndian(record, maskCrc32c(crc32c(data)), 4);
  return record;
}

std::string encodeFileVersionEvent(double wallTime, const std::string& fileVersion) {
  std::string event = eventHeader(wallTime, 0);
  putBytes(event, kEventFileVersion, fileVersion);
  return event;
}

std::string encodeScalarEvent(double wallTime, int64_t step, const std::string& tag, float value) {
  std::string summaryValue;
  putBytes(summaryValue, kValueTag, tag);
  putFloat(summaryValue, kValueSimpleValue, value);
  std::string summary;
  putBytes(summary, kSummaryValue, summaryValue);
  std::string event = eventHeader(wallTime, step);
  putBytes(event, kEventSummary, summary);
  return event;
}

std::string encodeSessionStartEvent(double wallTime, int64_t step) {
  std::string sessionLog;
  putKey(sessionLog, kSessionLogStatus, kVarint);
  putVarint(sessionLog, kSessionStart);
  std::string event = eventHeader(wallTime, step);
  putBytes(event, kEventSessionLog, sessionLog);
  return event;
}

std::vector<TensorBoardEvent> readTensorBoardEvents(const std::string& path) {
  std::string bytes = readWholeFile(path);
  std::vector<TensorBoardEvent> events;
  size_t at = 0;
  for (size_t record = 0;; ++record) {
    std::string context = path + ": record " + std::to_string(record);
    if (bytes.size() - at < 12) break;  // end of file, or a torn header
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
    uint32_t lengthCrc = 0, dataCrc = 0;
    for (int i = 0; i < 4; ++i) lengthCrc |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + 8 + i])) << (8 * i);
    if (lengthCrc != maskCrc32c(crc32c(bytes.data() + at, 8)))
      throw InputError(context + ": the length's CRC does not match (corrupted file)");
    if (length > bytes.size() - at - 12 || bytes.size() - at - 12 - length < 4) break;  // a torn last record
    std::string_view data(bytes.data() + at + 12, length);
    for (int i = 0; i < 4; ++i)
      dataCrc |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[at + 12 + length + i])) << (8 * i);
    if (dataCrc != maskCrc32c(crc32c(data))) throw InputError(context + ": the data's CRC does not match (corrupted file)");
    events.push_back(decodeEvent(data, context));
    at += 12 + length + 4;
  }
  return events;
}

TensorBoardWriter TensorBoardWriter::open(const std::string& logDir, Options options) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(logDir, error);
  if (error) throw RuntimeError(logDir + ": cannot create directory: " + error.message());
  if (options.hostname.empty()) options.hostname = hostName();

  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%010lld", static_cast<long long>(std::time(nullptr)));
  const std::string base = (fs::path(logDir) / ("events.out.tfevents." + std::string(seconds) + "." + options.hostname)).string();
  std::string path = base;
  int fd = -1;
  for (int attempt = 1;; ++attempt) {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) break;
    if (errno != EEXIST || attempt > 1000) ioFailure(path, "create");
    path = base + "." + std::to_string(::getpid()) + "." + std::to_string(attempt);
  }
  TensorBoardWriter writer(path, fd, std::move(options));
  double now = wallTimeNow();
  writer.writeRecord(encodeFileVersionEvent(now));
  if (writer.options_.resumedStep) writer.writeRecord(encodeSessionStartEvent(now, *writer.options_.resumedStep + 1));
  if (::fsync(fd) != 0) ioFailure(path, "fsync");
  syncDirectory(logDir);
  return writer;
}

TensorBoardWriter::TensorBoardWriter(TensorBoardWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), options_(std::move(other.options_)) {
  other.fd_ = -1;
}

TensorBoardWriter& TensorBoardWriter::operator=(TensorBoardWriter&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    options_ = std::move(other.options_);
    other.fd_ = -1;
  }
  return *this;
}

TensorBoardWriter::~TensorBoardWriter() { close(); }

void TensorBoardWriter::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void TensorBoardWriter::addScalar(const std::string& tag, int64_t step, float value) {
  addScalar(tag, step, value, wallTimeNow());
}

void TensorBoardWriter::addScalar(const std::string& tag, int64_t step, float value, double wallTime) {
  writeRecord(encodeScalarEvent(wallTime, step, tag, value));
  if (options_.syncEachEvent) flush();
}

void TensorBoardWriter::flush() {
  if (fd_ >= 0 && ::fsync(fd_) != 0) ioFailure(path_, "fsync");
}

void TensorBoardWriter::writeRecord(std::string_view event) {
  if (fd_ < 0) throw std::logic_error("TensorBoardWriter: write on a moved-from writer");
  std::string record = encodeTfRecord(event);
  size_t written = 0;
  while (written < record.size()) {
    ssize_t n = ::write(fd_, record.data() + written, record.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      ioFailure(path_, "write");
    }
    written += static_cast<size_t>(n);
  }
}

}  // namespace dgemma
