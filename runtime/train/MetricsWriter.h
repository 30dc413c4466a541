// The metrics file of `dgemma-run train --metrics FILE.jsonl` (docs/cli.md and docs/training.md,
// "Metrics file"): JSON Lines, one object per optimizer step ("split": "train") plus one per
// evaluation ("validation", "test"). Field order is fixed:
//
//   {"step": 12, "split": "train", "loss": 2.31640625, "diffusion_loss": 2.1, "encoder_loss": null,
//    "lr": 2.5000000000000002e-06, "grad_norm": 0.87, "consumed_samples": 96, "tokens": 24576,
//    "seconds": 3.0912345678901234, ...extra fields}
//
// Number formats (each float round-trips exactly through strtod/strtof, JSON parsers and Python):
//  - loss, diffusion_loss, encoder_loss, grad_norm: fp32 values (reduced on the device in fp32), "%.9g";
//  - lr, seconds: fp64 values (the schedule and the clock are double), "%.17g";
//  - step, consumed_samples, tokens: integers;
//  - a non-finite float (a NaN loss, an overflowing norm) is written as null, so every line stays
//    strict JSON; encoder_loss is null also when the objective has no encoder loss; lr and grad_norm
//    are null on evaluation lines, which have none.
//
// Crash safety: each line goes to the file in one write(2) on an O_APPEND descriptor and is fsync'd
// (Options::syncEachLine), so a kill -9 leaves whole lines only; a power loss can still leave a last
// line without its newline, which resume() drops.
//
// Resume: resume(path, s) keeps the lines up to the first one whose step is > s and truncates the
// rest, so after the resumed run the file equals an uninterrupted run's (timing fields aside). The
// trainer therefore writes every line of step s (train and evaluations) before saving checkpoint s.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dgemma {

enum class MetricsSplit { Train, Validation, Test };

std::string metricsSplitName(MetricsSplit split);  // "train" | "validation" | "test"

// An extra field's value: float is written as fp32 ("%.9g"), double as fp64 ("%.17g").
using MetricValue = std::variant<std::nullptr_t, bool, int64_t, float, double, std::string>;

struct MetricsRecord {
  int64_t step = 0;
  MetricsSplit split = MetricsSplit::Train;
  float loss = 0.0f;
  std::optional<float> diffusionLoss;  // null: the objective has none (pre-training)
  std::optional<float> encoderLoss;  // null: the objective has no encoder loss
  std::optional<double> lr;          // required on train lines
  std::optional<float> gradNorm;     // required on train lines
  int64_t consumedSamples = 0;
  int64_t tokens = 0;
  double seconds = 0.0;
  std::vector<std::pair<std::string, MetricValue>> extra;  // appended in this order
};

// The record as one line, with its trailing '\n'. Throws std::invalid_argument for a train record
// without lr or grad_norm, or an extra field that repeats a name (a standard one included).
std::string formatMetricsLine(const MetricsRecord& record);

class MetricsWriter {
 public:
  struct Options {
    bool syncEachLine = true;  // fsync after every line; off: the line still reaches the kernel at once
  };

  // A new run: creates or empties `path` (its directory must exist). Throws RuntimeError.
  static MetricsWriter create(const std::string& path, Options options);
  static MetricsWriter create(const std::string& path) { return create(path, Options{}); }
  // A resumed run at checkpoint step `resumedStep`: keeps the whole lines up to the first with
  // step > resumedStep, drops the rest and any torn last line, then appends. A missing file is
  // created. Throws InputError "PATH:LINE: ..." for a whole line that is not a JSON object with an
  // integer "step", RuntimeError for I/O failures.
  static MetricsWriter resume(const std::string& path, int64_t resumedStep, Options options);
  static MetricsWriter resume(const std::string& path, int64_t resumedStep) { return resume(path, resumedStep, Options{}); }

  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  ~MetricsWriter();

  // Appends one line (formatMetricsLine). Throws RuntimeError "PATH: cannot write: ..." on I/O failure.
  void write(const MetricsRecord& record);
  const std::string& path() const { return path_; }

 private:
  MetricsWriter(std::string path, int fd, Options options) : path_(std::move(path)), fd_(fd), options_(options) {}
  void close() noexcept;

  std::string path_;
  int fd_ = -1;
  Options options_;
};

}  // namespace dgemma
