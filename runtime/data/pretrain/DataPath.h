// Megatron's `--data-path`: one dataset prefix, or weight-prefix pairs "0.7 A 0.3 B"
// (docs/pretraining.md, "Blends").
#pragma once

#include <string>
#include <vector>

namespace dgemma {

struct DataPathEntry {
  double weight = 1;   // as written; the blend normalizes the weights to sum 1
  std::string prefix;  // `PREFIX` of PREFIX.bin + PREFIX.idx
};

// Parses the words of `--data-path` (as the shell split them). Throws InputError naming the word:
// "--data-path: word 3 ('x'): expected a weight (a number > 0) ...".
std::vector<DataPathEntry> parseDataPath(const std::vector<std::string>& words);
// The same for one string of whitespace-separated words (a config file's value); errors also give
// the word's 1-based column.
std::vector<DataPathEntry> parseDataPath(const std::string& text);

}  // namespace dgemma
