// Preprocessing throughput (docs/pretraining.md, "Preprocessing"): dgemma-run preprocess's work,
// preprocessCorpus, on a generated JSONL corpus at 1 and 2 workers, plain and gzip'd, for each
// tokenizer directory given. The corpus is made here, deterministically: documents of 1 to 40 lines
// drawn from data/tokenizer/corpus.txt (English, European languages, Greek, Russian, CJK, emoji,
// code), so it needs nothing beyond the repository. The table comes last.
//
//   dgemma-bench-preprocess [--megabytes N] [--workers 1,2] [TOKENIZER_DIR...]
//
// Without a directory it measures the bundled SentencePiece tokenizer (data/tokenizer) and its
// tokenizer.json twin (test/fixtures/tokenizer_json). MB/s counts JSONL bytes read (after gzip).
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/data/indexed/Preprocess.h"
#include "runtime/data/text/Tokenizer.h"
#include "support/AtomicFile.h"

namespace {

namespace fs = std::filesystem;
using namespace dgemma;

std::string makeCorpus(int64_t bytes) {
  std::vector<std::string> sentences;
  std::ifstream source(DGEMMA_BENCH_CORPUS_SOURCE);
  for (std::string line; std::getline(source, line);)
    if (!line.empty()) sentences.push_back(line);
  if (sentences.empty()) throw std::runtime_error(std::string(DGEMMA_BENCH_CORPUS_SOURCE) + ": no text");
  std::mt19937_64 random(37);
  std::string corpus;
  corpus.reserve(static_cast<size_t>(bytes) + 8192);
  while (static_cast<int64_t>(corpus.size()) < bytes) {
    std::string text;
    const int64_t lines = 1 + static_cast<int64_t>(random() % 40);
    for (int64_t i = 0; i < lines; ++i) text += sentences[random() % sentences.size()] + (random() % 4 ? " " : "\n");
    corpus += nlohmann::json{{"text", text}}.dump() + "\n";
  }
  return corpus;
}

std::string gzip(const std::string& text) {
  z_stream stream{};
  if (deflateInit2(&stream, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw std::runtime_error("deflateInit2");
  std::string out(deflateBound(&stream, text.size()), '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  stream.avail_in = static_cast<uInt>(text.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  if (deflate(&stream, Z_FINISH) != Z_STREAM_END) throw std::runtime_error("deflate");
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

struct Measurement {
  std::string backend, input;
  int64_t workers;
  PreprocessSummary summary;
  double cpuSeconds;  // of the whole process: on a busy machine, what the workers got of it
};

double processCpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t megabytes = 32;
  std::vector<int64_t> workerCounts = {1, 2};
  std::vector<std::string> tokenizers;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--megabytes" && i + 1 < argc) {
      megabytes = std::stoll(argv[++i]);
    } else if (arg == "--workers" && i + 1 < argc) {
      workerCounts.clear();
      std::stringstream list(argv[++i]);
      for (std::string item; std::getline(list, item, ',');) workerCounts.push_back(std::stoll(item));
    } else {
      tokenizers.push_back(arg);
    }
  }
  if (tokenizers.empty()) tokenizers = {DGEMMA_BENCH_TOKENIZER_DIR, DGEMMA_BENCH_TOKENIZER_JSON_DIR};

  const fs::path work = fs::temp_directory_path() / ("dgemma-bench-preprocess-" + std::to_string(::getpid()));
  fs::create_directories(work);
  const std::string corpus = makeCorpus(megabytes * 1000000);
  writeFileAtomically((work / "corpus.jsonl").string(), corpus);
  writeFileAtomically((work / "corpus.jsonl.gz").string(), gzip(corpus));
  std::printf("corpus: %.1f MB of JSONL (%.1f MB gzip'd)\n", corpus.size() / 1e6,
              fs::file_size(work / "corpus.jsonl.gz") / 1e6);

  std::vector<Measurement> rows;
  for (const std::string& directory : tokenizers) {
    const Tokenizer tokenizer(directory);
    for (const std::string input : {"corpus.jsonl", "corpus.jsonl.gz"}) {
      for (const int64_t workers : workerCounts) {
        PreprocessOptions options;
        options.input = (work / input).string();
        options.jsonKeys = {"text"};
        options.outputPrefix = (work / "out").string();
        options.workers = workers;
        std::ostringstream progress;
        const double cpuBefore = processCpuSeconds();
        PreprocessSummary summary = preprocessCorpus(options, tokenizer, progress, false);
        rows.push_back({tokenizer.backend(), input, workers, std::move(summary), processCpuSeconds() - cpuBefore});
        const Measurement& row = rows.back();
        std::printf("%s, %s, %lld worker(s): %.2f s\n", row.backend.c_str(), input.c_str(),
                    static_cast<long long>(workers), row.summary.seconds);
      }
    }
  }
  fs::remove_all(work);

  std::printf(
      "\n| tokenizer | input | workers | JSONL MB | documents | tokens | seconds | CPU seconds | MB/s | tokens/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Measurement& row : rows)
    std::printf("| %s | %s | %lld | %.1f | %lld | %lld | %.2f | %.2f | %.2f | %.0f |\n", row.backend.c_str(),
                row.input.c_str(), static_cast<long long>(row.workers), row.summary.textBytes / 1e6,
                static_cast<long long>(row.summary.documents), static_cast<long long>(row.summary.tokens[0]),
                row.summary.seconds, row.cpuSeconds, row.summary.textBytes / 1e6 / row.summary.seconds,
                row.summary.tokens[0] / row.summary.seconds);
  return 0;
}
