// dgemma-run preprocess (docs/pretraining.md, "Preprocessing"): a JSONL corpus, plain or gzip, to
// indexed datasets, as megatron-core's tools/preprocess_data.py does it. Each non-blank line is a
// JSON object; each of its --json-keys values becomes one document of that key's dataset: a string
// is one sequence, an array of strings (Megatron's pre-split sentences) one sequence per string,
// empty sequences dropped, EOS appended to the document's last sequence. Output order is input
// order whatever the number of workers, so the files are the same bytes for every N.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "runtime/data/rows/Rows.h"

namespace dgemma {

class Tokenizer;

struct PreprocessOptions {
  std::string input;                  // JSONL, or gzip'd JSONL
  std::vector<std::string> jsonKeys;  // at least one, distinct
  std::string outputPrefix;
  int64_t workers = 1;
  bool appendEod = true;
  bool skipBadLines = false;  // count and list them instead of failing on the first
};

// The prefix each key's dataset is written to: PREFIX itself for a single key, Megatron's
// PREFIX_KEY_document for several.
std::vector<std::string> preprocessOutputPrefixes(const std::string& outputPrefix,
                                                  const std::vector<std::string>& jsonKeys);

struct PreprocessSummary {
  int64_t lines = 0;       // read, blank and bad ones included
  int64_t blankLines = 0;  // skipped: they hold no document
  int64_t documents = 0;   // per key
  std::vector<int64_t> tokens;  // per key, EODs included
  std::vector<RowError> skipped;  // --skip-bad-lines
  int64_t textBytes = 0;  // of JSONL read (after decompression)
  bool compressed = false;
  double seconds = 0;
  std::string dtype;  // of the written tokens
  std::vector<std::string> prefixes;
};

// Writes the datasets. Progress lines go to `progress` (stderr): in place on a terminal. Throws
// InputError "FILE:LINE: FIELD: expected ..." for the first bad line unless skipBadLines, and
// leaves no output file behind on any error; an existing pair is replaced only on success.
PreprocessSummary preprocessCorpus(const PreprocessOptions& options, const Tokenizer& tokenizer, std::ostream& progress,
                                   bool progressInPlace);

}  // namespace dgemma
