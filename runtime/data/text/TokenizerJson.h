// The subset of the Hugging Face `tokenizers` pipeline that Gemma-style tokenizer.json files use,
// for Tokenizer's "tokenizers" backend (Tokenizer.h). encode() follows
// `tokenizers.Tokenizer.encode(text, add_special_tokens=False).ids`:
//
//   1. added tokens with normalized=false are matched in the raw text, leftmost-longest, honouring
//      their lstrip / rstrip / single_word flags; each match is one id (the model vocabulary's id when
//      the content is a vocabulary entry, as HF does, else the file's id);
//   2. the text between them is normalized (normalizer: Replace with a literal pattern, Prepend,
//      Sequence of those);
//   3. added tokens with normalized=true (their content normalized the same way) are matched in it;
//   4. the rest is pre-tokenized (pre_tokenizer: Split on a literal pattern with any behaviour,
//      invert false; Metaspace; Sequence of those; null);
//   5. every piece is encoded by the BPE model: merges by rank (their order), ignore_merges,
//      byte_fallback (<0xXX> pieces, used only when every byte of a character has one), unk_token
//      and fuse_unk.
//
// Anything else (other normalizer, pre-tokenizer or model types, regex patterns, BPE dropout,
// continuing_subword_prefix / end_of_word_suffix, Split invert) is rejected with an InputError that
// names the file and the JSON path. post_processor, decoder, truncation and padding are not read: Tokenizer::decode maps ids back
// through idToToken with the Gemma decoder's rules (Tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dgemma {

class TokenizerJson {
 public:
  struct AddedToken {
    std::string content;
    int32_t id = -1;
    bool special = false, normalized = false, lstrip = false, rstrip = false, singleWord = false;
  };

  // Parses and validates PATH (a tokenizer.json). Throws InputError "PATH: JSON.PATH: expected ...".
  explicit TokenizerJson(const std::string& path);
  // The same from the file's parsed contents (Tokenizer parses it once to choose its backend).
  TokenizerJson(const std::string& path, const nlohmann::json& root);
  ~TokenizerJson();
  TokenizerJson(TokenizerJson&&) noexcept;
  TokenizerJson& operator=(TokenizerJson&&) noexcept;

  std::vector<int32_t> encode(std::string_view text) const;

  const std::vector<AddedToken>& addedTokens() const;
  // The id of a token: an added token's content, else a model vocabulary entry; -1 if none.
  int32_t tokenToId(std::string_view token) const;
  // 1 + the largest id of the vocabulary and the added tokens.
  int64_t vocabSize() const;
  // The token string of an id: an added token's content, else the vocabulary entry; "" if none.
  std::string idToToken(int32_t id) const;
  // The last step of decoding, after Tokenizer::decode's Replace / ByteFallback / Fuse: the
  // decoder's Strip of leading and trailing spaces, if it has one. InputError "PATH:
  // decoder...: ..." when the file's decoder has a step dgemma does not implement.
  std::string applyDecoderStrip(std::string text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dgemma
