// Documents whose tokens say where they come from: token = 10000 · document + offset, so a test can
// check every token of a packed sample against the document and position it claims.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/data/pretrain/TokenDocuments.h"

namespace dgemma::test {

constexpr int64_t kTokenDocumentStride = 10000;

// `count` documents of 0 to `maxLength` tokens (a fixed generator: the same corpus every run), with
// some empty and some longer than a sample.
inline std::vector<std::vector<int64_t>> makeDocuments(int64_t count, int64_t maxLength, uint32_t generatorSeed = 5) {
  std::mt19937 generator(generatorSeed);
  std::vector<std::vector<int64_t>> documents(static_cast<size_t>(count));
  for (int64_t d = 0; d < count; ++d) {
    const int64_t length = static_cast<int64_t>(generator() % static_cast<uint32_t>(maxLength + 1));
    for (int64_t offset = 0; offset < length; ++offset) documents[d].push_back(kTokenDocumentStride * d + offset);
  }
  return documents;
}

inline std::shared_ptr<InMemoryDocuments> makeSource(int64_t count, int64_t maxLength,
                                                     const std::string& cachePrefix = "", uint32_t generatorSeed = 5) {
  return std::make_shared<InMemoryDocuments>(makeDocuments(count, maxLength, generatorSeed), cachePrefix);
}

}  // namespace dgemma::test
