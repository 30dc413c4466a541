// GPT-2's byte-level BPE from a vocab.json and a merges.txt, for Tokenizer's "gpt2-bpe" backend
// (Tokenizer.h; docs/data.md, "Tokenization"). encode() gives the ids HF's GPT2Tokenizer (the
// tokenizers BPE model behind a ByteLevel pre-tokenizer, add_prefix_space=False) gives a text
// without special tokens:
//
//   1. the text is split by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      with Unicode letters, numbers and white space;
//   2. each piece's UTF-8 bytes become GPT-2's byte characters (bytes_to_unicode: printable bytes
//      keep their code point, the other 68 take U+0100, U+0101, ... in byte order), one symbol each;
//   3. the symbols are merged by the rank of merges.txt (BpeMerges.h).
//
// Files (what HF's BPE.read_file accepts, stricter where it would silently drop an entry):
//   vocab.json  a JSON object of token -> id, ids non-negative and unique, holding all 256 byte
//               characters;
//   merges.txt  one merge "LEFT RIGHT" per line (exactly one space), "#version" lines skipped; the
//               line's index among the merges is its rank, a repeated merge takes its last rank; both
//               parts and their concatenation must be vocabulary tokens.
// Anything else is an InputError naming the file (merges.txt: "PATH:LINE: expected ..."). The same
// model can come from a GPT-2 style tokenizer.json (the second constructor).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dgemma {

class ByteLevelBpe {
 public:
  // Ids index tables, so an id far beyond any real vocabulary (GPT-2 has 50,257 tokens, the largest
  // public BPE vocabularies about 260,000) is refused rather than allocated.
  static constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

  // Reads and validates the two files.
  static ByteLevelBpe load(const std::string& vocabPath, const std::string& mergesPath);
  // The same from the files' contents; the names are used in error messages only.
  ByteLevelBpe(std::string_view vocabJson, const std::string& vocabName, std::string_view mergesText,
               const std::string& mergesName);
  // From the "model" of a GPT-2 style tokenizer.json (ByteLevel pre-tokenizer; Tokenizer routes such
  // a file here): its vocab and merges (["LEFT", "RIGHT"] or "LEFT RIGHT"), checked as above, and
  // ignore_merges. InputError "FILE: model.merges[I]: expected ..." and the like.
  ByteLevelBpe(const nlohmann::json& model, const std::string& file);
  ~ByteLevelBpe();
  ByteLevelBpe(ByteLevelBpe&&) noexcept;
  ByteLevelBpe& operator=(ByteLevelBpe&&) noexcept;

  // Appends the ids of `text`, which must be well-formed UTF-8 (InputError otherwise; Tokenizer
  // replaces invalid bytes first, Utf8Replacement.h). Special tokens are not matched here.
  void encode(std::string_view text, std::vector<int32_t>& ids) const;

  // 1 + the largest id of vocab.json.
  int64_t vocabSize() const;
  // The id of a vocabulary token; -1 if none.
  int32_t tokenToId(std::string_view token) const;
  // The vocabulary token of an id; "" for an id that has none.
  const std::string& idToToken(int32_t id) const;

  // The bytes a token stands for, as HF's ByteLevel decoder gives them: each byte character becomes
  // its byte; a token with any other character (an added token such as "hello world") is taken as
  // its own UTF-8 bytes.
  std::string tokenBytes(std::string_view token) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dgemma
