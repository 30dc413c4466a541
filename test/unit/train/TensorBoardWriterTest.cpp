#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/train/TensorBoardWriter.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::fileBytes;
using test::mentions;
using test::TempDir;
using test::writeBytes;

std::vector<std::string> eventFiles(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Published CRC-32C check values (RFC 3720 appendix B.4 and the common "123456789" check).
TEST(TensorBoardWriterTest, Crc32cKnownVectors) {
  EXPECT_EQ(crc32c(std::string_view("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string_view("")), 0x00000000u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending += static_cast<char>(i);
    descending += static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  // Continuing a CRC over a split buffer gives the CRC of the whole.
  EXPECT_EQ(crc32c("56789", 5, crc32c("1234", 4)), 0xE3069283u);
}

TEST(TensorBoardWriterTest, MaskIsTensorFlows) {
  uint32_t crc = 0xE3069283u;
  EXPECT_EQ(maskCrc32c(crc), static_cast<uint32_t>(((crc >> 15) | (crc << 17)) + 0xa282ead8u));
  EXPECT_EQ(maskCrc32c(0), 0xa282ead8u);
}

// The bytes protobuf itself produces for these messages (field keys, fixed64/fixed32, lengths).
TEST(TensorBoardWriterTest, EventWireBytes) {
  // wall_time 1.5 (key 0x09, fixed64 LE), file_version (key 0x1a, length 13).
  std::string fileVersion = encodeFileVersionEvent(1.5);
  EXPECT_EQ(fileVersion, std::string("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f", 9) + "\x1a\x0d" "brain.Event:2");
  // step 300 (key 0x10, varint ac 02), summary (key 0x2a) { value (0x0a) { tag (0x0a) "a", simple_value (0x15) 1.0f } }.
  std::string scalar = encodeScalarEvent(1.5, 300, "a", 1.0f);
  EXPECT_EQ(scalar, std::string("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f", 9) + "\x10\xac\x02" +
                        std::string("\x2a\x0a\x0a\x08\x0a\x01" "a" "\x15\x00\x00\x80\x3f", 12));
  // session_log (key 0x3a) { status (0x08) START (1) }.
  std::string start = encodeSessionStartEvent(1.5, 4);
  EXPECT_EQ(start, std::string("\x09\x00\x00\x00\x00\x00\x00\xf8\x3f", 9) + "\x10\x04" + "\x3a\x02\x08\x01");
}

TEST(TensorBoardWriterTest, RecordFraming) {
  std::string data = "abc";
  std::string record = encodeTfRecord(data);
  ASSERT_EQ(record.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(record.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(record[at + i])) << (8 * i);
    return v;
  };
  EXPECT_EQ(u32(8), maskCrc32c(crc32c(record.data(), 8)));
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(u32(15), maskCrc32c(crc32c(data)));
}

TEST(TensorBoardWriterTest, WriterOutputReadsBack) {
  TempDir dir;
  std::string path;
  {
    TensorBoardWriter writer = TensorBoardWriter::open(dir / "tb", {.hostname = "testhost"});
    path = writer.path();
    writer.addScalar("train/loss", 1, 2.5f, 100.25);
    writer.addScalar("train/lr", 1, 2.5e-6f, 100.25);
    writer.addScalar("train/loss", 2, 0.1f, 101.5);
    writer.addScalar("validation/loss", 0, -3.0f, 102.0);
  }
  std::string name = std::filesystem::path(path).filename().string();
  ASSERT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  std::string seconds = name.substr(20, 10);
  EXPECT_EQ(seconds.find_first_not_of("0123456789"), std::string::npos) << name;
  EXPECT_EQ(name.substr(30), ".testhost");

  std::vector<TensorBoardEvent> events = readTensorBoardEvents(path);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].fileVersion, "brain.Event:2");
  EXPECT_GT(events[0].wallTime, 1.6e9);
  EXPECT_TRUE(events[0].scalars.empty());
  struct Expected {
    double wallTime;
    int64_t step;
    std::string tag;
    float value;
  };
  std::vector<Expected> expected = {
      {100.25, 1, "train/loss", 2.5f}, {100.25, 1, "train/lr", 2.5e-6f}, {101.5, 2, "train/loss", 0.1f}, {102.0, 0, "validation/loss", -3.0f}};
  for (size_t i = 0; i < expected.size(); ++i) {
    const TensorBoardEvent& event = events[i + 1];
    EXPECT_EQ(event.wallTime, expected[i].wallTime);
    EXPECT_EQ(event.step, expected[i].step);
    EXPECT_FALSE(event.fileVersion);
    ASSERT_EQ(event.scalars.size(), 1u);
    EXPECT_EQ(event.scalars[0].first, expected[i].tag);
    EXPECT_EQ(event.scalars[0].second, expected[i].value);  // bit-exact fp32
  }
}

TEST(TensorBoardWriterTest, ResumeWritesASessionStartAndANewFile) {
  TempDir dir;
  std::string first, second;
  {
    TensorBoardWriter writer = TensorBoardWriter::open(dir / "tb", {.hostname = "h"});
    first = writer.path();
    writer.addScalar("train/loss", 5, 1.0f);
  }
  {
    TensorBoardWriter writer = TensorBoardWriter::open(dir / "tb", {.resumedStep = 3, .hostname = "h"});
    second = writer.path();
    writer.addScalar("train/loss", 4, 2.0f);
  }
  EXPECT_NE(first, second);
  std::vector<std::string> files = eventFiles(dir.path / "tb");
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], first);  // name order is creation order
  EXPECT_EQ(files[1], second);

  std::vector<TensorBoardEvent> events = readTensorBoardEvents(second);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].sessionStatus, 1);  // START
  EXPECT_EQ(events[1].step, 4);
  EXPECT_TRUE(events[1].scalars.empty());
  EXPECT_EQ(events[2].step, 4);
}

TEST(TensorBoardWriterTest, ReaderStopsAtATornRecordAndRejectsCorruption) {
  TempDir dir;
  std::string path;
  {
    TensorBoardWriter writer = TensorBoardWriter::open(dir.path.string(), {.hostname = "h"});
    path = writer.path();
    writer.addScalar("a", 1, 1.0f);
    writer.addScalar("a", 2, 2.0f);
  }
  std::string bytes = fileBytes(path);
  writeBytes(path, bytes.substr(0, bytes.size() - 3));  // killed mid-record
  EXPECT_EQ(readTensorBoardEvents(path).size(), 2u);

  std::string corrupted = bytes;
  corrupted[corrupted.size() - 6] ^= 0x01;  // inside the last event's data
  writeBytes(path, corrupted);
  EXPECT_TRUE(mentions(expectInputError([&] { readTensorBoardEvents(path); }), "record 2: the data's CRC does not match"));
  corrupted = bytes;
  corrupted[0] ^= 0x01;  // the first record's length
  writeBytes(path, corrupted);
  EXPECT_TRUE(mentions(expectInputError([&] { readTensorBoardEvents(path); }), "record 0: the length's CRC"));
}

TEST(TensorBoardWriterTest, NegativeStepsUseTenByteVarints) {
  std::string event = encodeScalarEvent(0.0, -1, "t", 0.0f);
  TempDir dir;
  writeBytes(dir / "events.out.tfevents.x", encodeTfRecord(event));
  std::vector<TensorBoardEvent> events = readTensorBoardEvents(dir / "events.out.tfevents.x");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].step, -1);
}

}  // namespace
}  // namespace dgemma
