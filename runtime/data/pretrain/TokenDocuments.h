// The token documents a pre-training dataset reads (docs/pretraining.md): one sequence per
// document, as Megatron's GPTDataset treats an indexed dataset. The packed dataset codes against this
// interface, not against a file format, so the Megatron `.bin/.idx` reader binds to it with a small
// adapter and the tests use documents held in memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dgemma {

class TokenDocuments {
 public:
  virtual ~TokenDocuments() = default;

  virtual int64_t sequenceCount() const = 0;
  virtual int64_t sequenceLength(int64_t sequence) const = 0;
  // Tokens [offset, offset + length) of `sequence` into `out`, replacing its contents (the datasets
  // clear `out` before each call, so an implementation that appends serves them too).
  virtual void readTokens(int64_t sequence, int64_t offset, int64_t length, std::vector<int64_t>& out) const = 0;

  // Names the data in cache keys and messages: a file-backed source gives its prefix (and may add
  // what changes when the files are rewritten, such as sizes and modification times). The index
  // caches also fold in every document length, so a rewritten corpus never reuses a stale index.
  virtual std::string identity() const = 0;
  // The path prefix whose directory holds the index caches ("beside the data"), e.g. `dir/corpus`
  // for `dir/corpus.bin`; empty for data with no place on disk (then only an explicit cache
  // directory caches).
  virtual std::string cachePrefix() const = 0;
};

// Documents held in memory (tests, small generated corpora). Its identity is a digest of its tokens.
class InMemoryDocuments : public TokenDocuments {
 public:
  // `cachePrefix` as TokenDocuments::cachePrefix (empty: none).
  explicit InMemoryDocuments(std::vector<std::vector<int64_t>> documents, std::string cachePrefix = "");

  int64_t sequenceCount() const override { return static_cast<int64_t>(documents_.size()); }
  int64_t sequenceLength(int64_t sequence) const override;
  void readTokens(int64_t sequence, int64_t offset, int64_t length, std::vector<int64_t>& out) const override;
  std::string identity() const override { return identity_; }
  std::string cachePrefix() const override { return cachePrefix_; }

 private:
  std::vector<std::vector<int64_t>> documents_;
  std::string cachePrefix_;
  std::string identity_;
};

}  // namespace dgemma
