// The merge step of a BPE model, shared by the tokenizer.json backend (TokenizerJson.h) and the
// GPT-2 byte-level backend (ByteLevelBpe.h): a word's symbols are merged as HF tokenizers' BPE model
// does (Word::merge_all), the pair of lowest rank first and, among equal ranks, the leftmost.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace dgemma {

class BpeMerges {
 public:
  // The pair (left, right) merges into `merged` with priority `rank`, lower ranks first. Adding a
  // pair again replaces its rank and result, as HF's merge table (a map built in file order) does.
  void add(int32_t left, int32_t right, int32_t rank, int32_t merged);
  // Merges `symbols` (ids) and appends the result to `out`.
  void apply(const std::vector<int32_t>& symbols, std::vector<int32_t>& out) const;

 private:
  struct Merge {
    int32_t rank, merged;
  };
  const Merge* find(int32_t left, int32_t right) const;

  std::unordered_map<uint64_t, Merge> merges_;
};

}  // namespace dgemma
