// TensorBoard event files for `dgemma-run train --tensorboard DIR`, written directly.
//
// File: DIR/events.out.tfevents.<unix seconds, 10 digits>.<hostname> (TensorFlow's EventsWriter
// name; TensorBoard reads every file whose name contains "tfevents", in name order). If that name
// exists (two writers in one second), ".<pid>.<n>" is appended, which sorts after it.
//
// Records are TFRecord frames, little-endian:
//   uint64 length | uint32 masked CRC32C(length bytes) | data | uint32 masked CRC32C(data)
// with mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. The data is a serialized tensorboard.Event
// (tensorboard/compat/proto/event.proto, summary.proto):
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//             SessionLog session_log = 7; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
//   SessionLog { SessionStatus status = 1; }   START = 1
// The first record is {wall_time, file_version: "brain.Event:2"}; each scalar is then its own event
// {wall_time, step, summary {value {tag, simple_value}}}.
//
// Resume: a writer opened with resumedStep = s writes {wall_time, step: s + 1, session_log {START}}
// after the file version. TensorBoard's loader treats that as a restart and discards the events of
// earlier files with step >= s + 1, i.e. the steps the crashed run logged after its last checkpoint.
//
// No protobuf or TensorFlow dependency: the handful of fields above are hand-encoded (varints,
// fixed64/fixed32 and length-delimited fields), which is far smaller than generating and linking
// libprotobuf for five messages. CRC32C is likewise written here (table-driven, reflected Castagnoli
// polynomial 0x82F63B78): Debian 12 packages no C or C++ CRC32C library (only python3-crc32c), and
// the 256-entry table is a dozen lines. A checksum at this rate (a few records a step) needs no SSE4.2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dgemma {

// CRC-32C (Castagnoli) of `bytes`: crc32c("123456789") == 0xE3069283. `crc` continues a previous value.
uint32_t crc32c(const void* bytes, size_t size, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view bytes) { return crc32c(bytes.data(), bytes.size()); }
uint32_t maskCrc32c(uint32_t crc);

// One TFRecord frame around `data`.
std::string encodeTfRecord(std::string_view data);

// Serialized tensorboard.Event messages.
std::string encodeFileVersionEvent(double wallTime, const std::string& fileVersion = "brain.Event:2");
std::string encodeScalarEvent(double wallTime, int64_t step, const std::string& tag, float value);
std::string encodeSessionStartEvent(double wallTime, int64_t step);

// What readTensorBoardEvents decodes of an Event (other fields are skipped).
struct TensorBoardEvent {
  double wallTime = 0.0;
  int64_t step = 0;
  std::optional<std::string> fileVersion;
  std::optional<int> sessionStatus;                    // SessionLog.status when session_log is set
  std::vector<std::pair<std::string, float>> scalars;  // Summary values with simple_value
};

// Reads an event file: checks every frame's two CRCs and decodes each Event. A truncated last
// record (a writer killed mid-write) ends the list, as TensorBoard treats it; a CRC mismatch or a
// malformed message throws InputError "PATH: record N: ...".
std::vector<TensorBoardEvent> readTensorBoardEvents(const std::string& path);

class TensorBoardWriter {
 public:
  struct Options {
    std::optional<int64_t> resumedStep;  // write a SessionLog START at resumedStep + 1
    std::string hostname;                // empty: gethostname()
    bool syncEachEvent = false;          // fsync after every event (each is written at once anyway)
  };

  // Creates `logDir` (and parents) and a new event file in it, starting with the file version
  // record. Throws RuntimeError "PATH: cannot write: ...".
  static TensorBoardWriter open(const std::string& logDir, Options options);
  static TensorBoardWriter open(const std::string& logDir) { return open(logDir, Options{}); }

  TensorBoardWriter(TensorBoardWriter&& other) noexcept;
  TensorBoardWriter& operator=(TensorBoardWriter&& other) noexcept;
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  ~TensorBoardWriter();

  // One event per scalar, wall time now. Tags like "train/loss", "validation/loss".
  void addScalar(const std::string& tag, int64_t step, float value);
  void addScalar(const std::string& tag, int64_t step, float value, double wallTime);
  void flush();  // fsync
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, int fd, Options options) : path_(std::move(path)), fd_(fd), options_(std::move(options)) {}
  void writeRecord(std::string_view event);
  void close() noexcept;

  std::string path_;
  int fd_ = -1;
  Options options_;
};

}  // namespace dgemma
