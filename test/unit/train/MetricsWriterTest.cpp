#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/train/MetricsWriter.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::fileBytes;
using test::mentions;
using test::TempDir;
using test::writeBytes;

// fp32 values that need all 9 significant digits, and fp64 ones that need 17.
MetricsRecord trainRecord(int64_t step) {
  MetricsRecord r;
  r.step = step;
  r.loss = 2.3164062f + 0.1f * static_cast<float>(step);
  r.diffusionLoss = 0.1f / static_cast<float>(step);
  r.encoderLoss = 1.0f / 3.0f;
  r.lr = 5e-5 * static_cast<double>(step) / 20.0;
  r.gradNorm = std::nextafter(0.87f, 1.0f);
  r.consumedSamples = 8 * step;
  r.tokens = 2048 * step;
  r.seconds = 3.0912345678901234 * static_cast<double>(step);
  return r;
}

std::vector<std::string> linesOf(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

float parseFloat(const nlohmann::json& value) { return static_cast<float>(value.get<double>()); }

TEST(MetricsWriterTest, LineFormatIsTheContract) {
  MetricsRecord r;
  r.step = 12;
  r.loss = 2.5f;
  r.diffusionLoss = 2.25f;
  r.lr = 2.5e-6;
  r.gradNorm = 0.5f;
  r.consumedSamples = 96;
  r.tokens = 24576;
  r.seconds = 1.5;
  EXPECT_EQ(formatMetricsLine(r),
            "{\"step\": 12, \"split\": \"train\", \"loss\": 2.5, \"diffusion_loss\": 2.25, \"encoder_loss\": null, "
            "\"lr\": 2.5000000000000002e-06, \"grad_norm\": 0.5, \"consumed_samples\": 96, \"tokens\": 24576, "
            "\"seconds\": 1.5}\n");

  MetricsRecord validation;
  validation.step = 100;
  validation.split = MetricsSplit::Validation;
  validation.loss = 1.0f;
  validation.diffusionLoss = 0.75f;
  validation.encoderLoss = 0.25f;
  validation.extra = {{"iterations", int64_t{16}}, {"note", std::string("a \"quoted\" name")}, {"skipped", false},
                      {"ratio", 0.1f}, {"exact", 0.1}, {"absent", nullptr}};
  EXPECT_EQ(formatMetricsLine(validation),
            "{\"step\": 100, \"split\": \"validation\", \"loss\": 1, \"diffusion_loss\": 0.75, \"encoder_loss\": 0.25, "
            "\"lr\": null, \"grad_norm\": null, \"consumed_samples\": 0, \"tokens\": 0, \"seconds\": 0, "
            "\"iterations\": 16, \"note\": \"a \\\"quoted\\\" name\", \"skipped\": false, \"ratio\": 0.100000001, "
            "\"exact\": 0.10000000000000001, \"absent\": null}\n");
}

TEST(MetricsWriterTest, RejectsIncompleteTrainLinesAndRepeatedNames) {
  MetricsRecord r = trainRecord(1);
  r.lr.reset();
  EXPECT_THROW(formatMetricsLine(r), std::invalid_argument);
  r = trainRecord(1);
  r.extra = {{"loss", 1.0f}};
  EXPECT_THROW(formatMetricsLine(r), std::invalid_argument);
  r.extra = {{"a", 1.0f}, {"a", 2.0f}};
  EXPECT_THROW(formatMetricsLine(r), std::invalid_argument);
}

TEST(MetricsWriterTest, NonFiniteValuesAreNull) {
  MetricsRecord r = trainRecord(1);
  r.loss = std::numeric_limits<float>::quiet_NaN();
  r.gradNorm = std::numeric_limits<float>::infinity();
  nlohmann::json line = nlohmann::json::parse(formatMetricsLine(r));  // strict JSON
  EXPECT_TRUE(line["loss"].is_null());
  EXPECT_TRUE(line["grad_norm"].is_null());
}

// Every float read back (by a JSON parser, as a double, then narrowed for fp32 fields) is the value written.
TEST(MetricsWriterTest, RoundTripIsExact) {
  TempDir dir;
  std::string path = dir / "metrics.jsonl";
  std::vector<MetricsRecord> records;
  {
    MetricsWriter writer = MetricsWriter::create(path);
    for (int64_t step = 1; step <= 5; ++step) {
      records.push_back(trainRecord(step));
      writer.write(records.back());
    }
  }
  std::vector<std::string> lines = linesOf(fileBytes(path));
  ASSERT_EQ(lines.size(), records.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const MetricsRecord& r = records[i];
    nlohmann::json line = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(line["step"], r.step);
    EXPECT_EQ(line["split"], "train");
    EXPECT_EQ(parseFloat(line["loss"]), r.loss);
    EXPECT_EQ(parseFloat(line["diffusion_loss"]), *r.diffusionLoss);
    EXPECT_EQ(parseFloat(line["encoder_loss"]), *r.encoderLoss);
    EXPECT_EQ(line["lr"].get<double>(), *r.lr);
    EXPECT_EQ(parseFloat(line["grad_norm"]), *r.gradNorm);
    EXPECT_EQ(line["consumed_samples"], r.consumedSamples);
    EXPECT_EQ(line["tokens"], r.tokens);
    EXPECT_EQ(line["seconds"].get<double>(), r.seconds);
    // And through strtof/strtod, as C readers and Python's float() parse them.
    std::string loss = line["loss"].dump();
    EXPECT_EQ(std::strtof(loss.c_str(), nullptr), r.loss);
  }
}

TEST(MetricsWriterTest, CreateEmptiesAnOldFile) {
  TempDir dir;
  std::string path = dir / "metrics.jsonl";
  writeBytes(path, "old\n");
  { MetricsWriter writer = MetricsWriter::create(path); }
  EXPECT_EQ(fileBytes(path), "");
}

// A run killed after step 5 resumes from its step-3 checkpoint: lines 4 and 5 go, and the file then
// equals the uninterrupted run's.
TEST(MetricsWriterTest, ResumeTruncatesLinesAfterTheCheckpoint) {
  TempDir dir;
  std::string uninterrupted = dir / "a.jsonl", resumed = dir / "b.jsonl";
  auto validationRecord = [](int64_t step) {
    MetricsRecord r;
    r.step = step;
    r.split = MetricsSplit::Validation;
    r.loss = 0.5f + static_cast<float>(step);
    r.diffusionLoss = 0.25f;
    return r;
  };
  {
    MetricsWriter writer = MetricsWriter::create(uninterrupted);
    for (int64_t step = 1; step <= 6; ++step) {
      writer.write(trainRecord(step));
      if (step % 2 == 0) writer.write(validationRecord(step));
    }
  }
  {
    MetricsWriter writer = MetricsWriter::create(resumed);
    for (int64_t step = 1; step <= 5; ++step) {
      MetricsRecord r = trainRecord(step);
      if (step > 3) r.loss += 1.0f;  // what the crashed run logged after its checkpoint differs
      writer.write(r);
      if (step % 2 == 0) writer.write(validationRecord(step));
    }
  }
  {
    MetricsWriter writer = MetricsWriter::resume(resumed, 3);
    EXPECT_EQ(linesOf(fileBytes(resumed)).size(), 4u);  // train 1, 2, validation 2, train 3
    for (int64_t step = 4; step <= 6; ++step) {
      writer.write(trainRecord(step));
      if (step % 2 == 0) writer.write(validationRecord(step));
    }
  }
  EXPECT_EQ(fileBytes(resumed), fileBytes(uninterrupted));
}

TEST(MetricsWriterTest, ResumeDropsATornLastLine) {
  TempDir dir;
  std::string path = dir / "metrics.jsonl";
  std::string whole = formatMetricsLine(trainRecord(1)) + formatMetricsLine(trainRecord(2));
  std::string torn = formatMetricsLine(trainRecord(3));
  torn.resize(torn.size() / 2);  // a crash mid-write: no newline
  writeBytes(path, whole + torn);
  {
    MetricsWriter writer = MetricsWriter::resume(path, 10);
    EXPECT_EQ(fileBytes(path), whole);
    writer.write(trainRecord(3));
  }
  EXPECT_EQ(fileBytes(path), whole + formatMetricsLine(trainRecord(3)));
  for (const std::string& line : linesOf(fileBytes(path))) EXPECT_NO_THROW(nlohmann::json::parse(line));
}

TEST(MetricsWriterTest, ResumeCreatesAMissingFileAndRejectsForeignLines) {
  TempDir dir;
  std::string path = dir / "metrics.jsonl";
  { MetricsWriter writer = MetricsWriter::resume(path, 7); }
  EXPECT_EQ(fileBytes(path), "");

  writeBytes(path, formatMetricsLine(trainRecord(1)) + "not json\n");
  EXPECT_TRUE(mentions(expectInputError([&] { MetricsWriter::resume(path, 7); }), path + ":2: expected a JSON object"));
  writeBytes(path, "{\"step\": \"one\"}\n");
  EXPECT_TRUE(mentions(expectInputError([&] { MetricsWriter::resume(path, 7); }), path + ":1:"));
  // Nesting far beyond any metrics line is refused while it is read, not walked.
  writeBytes(path, formatMetricsLine(trainRecord(1)) + std::string(100000, '[') + std::string(100000, ']') + "\n");
  EXPECT_TRUE(mentions(expectInputError([&] { MetricsWriter::resume(path, 7); }), path + ":2: expected a JSON object"));
  EXPECT_TRUE(mentions(expectInputError([&] { MetricsWriter::resume("/dev/zero", 7); }), "/dev/zero: not a regular file"));
}

TEST(MetricsWriterTest, OpenFailureIsARuntimeError) {
  TempDir dir;
  EXPECT_THROW(MetricsWriter::create(dir / "missing/metrics.jsonl"), RuntimeError);
}

}  // namespace
}  // namespace dgemma
