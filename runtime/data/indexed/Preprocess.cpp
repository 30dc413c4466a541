#include "runtime/data/indexed/Preprocess.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <ostream>

#include <nlohmann/json.hpp>

#include "runtime/core/ThreadPool.h"
#include "runtime/data/indexed/CorpusLines.h"
#include "runtime/data/indexed/IndexedDatasetWriter.h"
#include "runtime/data/rows/JsonLine.h"
#include "runtime/data/rows/Utf8.h"
#include "runtime/data/text/Tokenizer.h"
#include "support/Error.h"

namespace dgemma {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Lines are tokenized in batches of about this much text, several batches per worker per round, so
// that a round's slowest batch keeps the others waiting only briefly.
constexpr size_t kBatchBytes = size_t{256} << 10;
constexpr int64_t kBatchesPerWorker = 4;

struct LineBatch {
  int64_t firstLine = 0;
  std::vector<std::string> lines;
};

// One line's documents: per key, its non-empty sequences (EOD included); or why the line is bad.
struct EncodedLine {
  bool blank = false;
  std::optional<RowError> error;
  std::vector<std::vector<std::vector<int32_t>>> documents;
};

bool isBlank(const std::string& text) { return text.find_first_not_of(" \t") == std::string::npos; }

class LineEncoder {
 public:
  LineEncoder(const PreprocessOptions& options, const Tokenizer& tokenizer)
      : options_(options), tokenizer_(tokenizer) {}

  EncodedLine encode(const std::string& text, int64_t line) const {
    EncodedLine encoded;
    auto fail = [&](std::string field, std::string expected) {
      encoded.error = RowError{options_.input, line, std::move(field), std::move(expected)};
      return std::move(encoded);
    };
    if (isBlank(text)) {
      encoded.blank = true;
      return encoded;
    }
    // nlohmann's lexer would end the input at a NUL and drop the rest of the line.
    if (const size_t nul = text.find('\0'); nul != std::string::npos)
      return fail("row", "expected a line without NUL bytes, got one at byte column " + std::to_string(nul + 1));
    if (const auto bad = findInvalidUtf8(text)) return fail("row", describeUtf8Problem(*bad));
    auto parsed = parseJsonLine(text);
    if (const auto* problem = std::get_if<JsonLineError>(&parsed)) return fail(problem->field, problem->expected);
    const json& row = std::get<json>(parsed);
    if (!row.is_object()) return fail("row", std::string("expected a JSON object, got ") + row.type_name());

    for (const std::string& key : options_.jsonKeys) {
      const std::string field = jsonChildPath("", key);
      const auto value = row.find(key);
      if (value == row.end())
        return fail(field, "expected a string or an array of strings, got nothing (the key is missing)");
      std::vector<std::vector<int32_t>> sequences;
      auto addSequence = [&](const std::string& sentence) {
        std::vector<int32_t> ids = tokenizer_.encode(sentence);
        if (!ids.empty()) sequences.push_back(std::move(ids));
      };
      if (value->is_string()) {
        addSequence(value->get_ref<const std::string&>());
      } else if (value->is_array()) {
        for (size_t i = 0; i < value->size(); ++i) {
          const json& sentence = (*value)[i];
          if (!sentence.is_string())
            return fail(jsonIndexPath(field, i), std::string("expected a string, got ") + sentence.type_name());
          addSequence(sentence.get_ref<const std::string&>());
        }
      } else {
        return fail(field, std::string("expected a string or an array of strings, got ") + value->type_name());
      }
      // As preprocess_data.py: the EOD ends the document's last sequence; a document without tokens
      // gets none.
      if (options_.appendEod && !sequences.empty()) sequences.back().push_back(tokenizer_.eosId());
      encoded.documents.push_back(std::move(sequences));
    }
    return encoded;
  }

 private:
  const PreprocessOptions& options_;
  const Tokenizer& tokenizer_;
};

// Progress on stderr (docs/pretraining.md, "Preprocessing"): rewritten in place each second on a
// terminal, a whole line every ten seconds otherwise.
class ProgressReporter {
 public:
  ProgressReporter(std::ostream& out, bool inPlace)
      : out_(out), inPlace_(inPlace), start_(Clock::now()), last_(start_) {}

  void maybeReport(int64_t lines, int64_t documents, int64_t bytes) {
    const Clock::time_point now = Clock::now();
    if (now - last_ < (inPlace_ ? std::chrono::seconds(1) : std::chrono::seconds(10))) return;
    last_ = now;
    report(lines, documents, bytes, now);
    reported_ = true;
  }
  void finish() {
    if (inPlace_ && reported_) out_ << "\n" << std::flush;
  }

 private:
  void report(int64_t lines, int64_t documents, int64_t bytes, Clock::time_point now) {
    const double seconds = std::chrono::duration<double>(now - start_).count();
    char text[160];
    std::snprintf(text, sizeof text, "preprocess: %lld lines, %lld documents, %.1f MB in %.0f s (%.2f MB/s)",
                  static_cast<long long>(lines), static_cast<long long>(documents), bytes / 1e6, seconds,
                  seconds > 0 ? bytes / 1e6 / seconds : 0.0);
    out_ << (inPlace_ ? "\r" : "") << text << (inPlace_ ? "" : "\n") << std::flush;
  }

  std::ostream& out_;
  bool inPlace_;
  Clock::time_point start_, last_;
  bool reported_ = false;
};

}  // namespace

std::vector<std::string> preprocessOutputPrefixes(const std::string& outputPrefix,
                                                  const std::vector<std::string>& jsonKeys) {
  if (jsonKeys.size() == 1) return {outputPrefix};
  std::vector<std::string> prefixes;
  for (const std::string& key : jsonKeys) prefixes.push_back(outputPrefix + "_" + key + "_document");
  return prefixes;
}

PreprocessSummary preprocessCorpus(const PreprocessOptions& options, const Tokenizer& tokenizer, std::ostream& progress,
                                   bool progressInPlace) {
  const Clock::time_point start = Clock::now();
  PreprocessSummary summary;
  summary.prefixes = preprocessOutputPrefixes(options.outputPrefix, options.jsonKeys);
  summary.tokens.assign(options.jsonKeys.size(), 0);
  const TokenDType dtype = tokenDTypeForVocabulary(tokenizer.vocabSize());
  summary.dtype = tokenDTypeName(dtype);

  CorpusLines input(options.input);
  summary.compressed = input.compressed();
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const std::string& prefix : summary.prefixes)
    writers.push_back(std::make_unique<IndexedDatasetWriter>(prefix, dtype));

  const LineEncoder encoder(options, tokenizer);
  ThreadPool pool(options.workers);
  ProgressReporter reporter(progress, progressInPlace);
  const int64_t batchesPerRound = options.workers * kBatchesPerWorker;
  std::string line;
  bool more = true;
  while (more) {
    // Read a round of batches on this thread, tokenize them on every worker, write them in order.
    std::vector<LineBatch> batches;
    while (more && static_cast<int64_t>(batches.size()) < batchesPerRound) {
      LineBatch batch;
      size_t bytes = 0;
      while (bytes < kBatchBytes && (more = input.next(line))) {
        if (batch.lines.empty()) batch.firstLine = input.lineNumber();
        bytes += line.size();
        batch.lines.push_back(std::move(line));
      }
      if (!batch.lines.empty()) batches.push_back(std::move(batch));
    }
    std::vector<std::vector<EncodedLine>> encoded(batches.size());
    pool.parallelFor(static_cast<int64_t>(batches.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const LineBatch& batch = batches[b];
        encoded[b].reserve(batch.lines.size());
        for (size_t i = 0; i < batch.lines.size(); ++i)
          encoded[b].push_back(encoder.encode(batch.lines[i], batch.firstLine + static_cast<int64_t>(i)));
      }
    });
    for (std::vector<EncodedLine>& batch : encoded) {
      for (EncodedLine& row : batch) {
        ++summary.lines;
        if (row.blank) {
          ++summary.blankLines;
          continue;
        }
        if (row.error) {
          if (!options.skipBadLines) throw InputError(row.error->text());
          summary.skipped.push_back(std::move(*row.error));
          continue;
        }
        for (size_t k = 0; k < writers.size(); ++k) {
          for (const std::vector<int32_t>& sequence : row.documents[k]) {
            writers[k]->addSequence(sequence);
            summary.tokens[k] += static_cast<int64_t>(sequence.size());
          }
          writers[k]->endDocument();
        }
        ++summary.documents;
      }
    }
    reporter.maybeReport(summary.lines, summary.documents, input.bytesRead());
  }
  reporter.finish();
  for (const auto& writer : writers) writer->finish();
  summary.textBytes = input.bytesRead();
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return summary;
}

}  // namespace dgemma
