#include "runtime/data/pretrain/TokenDocuments.h"

#include <xxhash.h>

#include <cstdio>

#include "support/Error.h"

namespace dgemma {

InMemoryDocuments::InMemoryDocuments(std::vector<std::vector<int64_t>> documents, std::string cachePrefix)
    : documents_(std::move(documents)), cachePrefix_(std::move(cachePrefix)) {
  // The lengths go into the digest too, so [[1, 2], [3]] and [[1], [2, 3]] differ.
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const std::vector<int64_t>& document : documents_) {
    const int64_t length = static_cast<int64_t>(document.size());
    XXH3_64bits_update(state, &length, sizeof length);
    XXH3_64bits_update(state, document.data(), document.size() * sizeof(int64_t));
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits_digest(state)));
  XXH3_freeState(state);
  identity_ = std::string("memory:") + hex;
}

int64_t InMemoryDocuments::sequenceLength(int64_t sequence) const {
  if (sequence < 0 || sequence >= sequenceCount())
    throw RuntimeError("in-memory documents: sequence " + std::to_string(sequence) + " out of range [0, " +
                       std::to_string(sequenceCount()) + ")");
  return static_cast<int64_t>(documents_[sequence].size());
}

void InMemoryDocuments::readTokens(int64_t sequence, int64_t offset, int64_t length, std::vector<int64_t>& out) const {
  const int64_t size = sequenceLength(sequence);
  if (offset < 0 || length < 0 || offset > size || length > size - offset)
    throw RuntimeError("in-memory documents: tokens [" + std::to_string(offset) + ", " +
                       std::to_string(offset + length) + ") of sequence " + std::to_string(sequence) + " outside its " +
                       std::to_string(size) + " tokens");
  out.assign(documents_[sequence].begin() + offset, documents_[sequence].begin() + offset + length);
}

}  // namespace dgemma
