// Tokenization and the Gemma 4 prompt (docs/data.md, "Chat template", "Tokenization").
//
// Tokenizer loads a checkpoint's (or the bundled, data/tokenizer/) tokenizer: the SentencePiece model
// tokenizer.model through libsentencepiece when the directory has one (backend() "sentencepiece"),
// else the HF tokenizer.json (backend() "tokenizers", TokenizerJson.h; "gpt2-bpe" when its
// pre-tokenizer is GPT-2's ByteLevel), else GPT-2's byte-level BPE from vocab.json + merges.txt
// (backend() "gpt2-bpe", ByteLevelBpe.h). encode() follows HF's
// `tokenizer(text, add_special_tokens=False)`: special token strings in the text ("<bos>", "<eos>",
// "<|turn>", "<|endoftext|>", ...: for SentencePiece the model's control, unknown and user-defined
// pieces, for tokenizer.json its added_tokens, for GPT-2 BPE its config's added and special tokens)
// are matched leftmost-longest as single ids and never split; the text between them is encoded by
// SentencePiece, the tokenizer.json pipeline or the byte-level BPE. Nothing is added around the
// text. Bytes that are not UTF-8 are first read as Python's bytes.decode("utf-8", errors="replace")
// reads them (Utf8Replacement.h), the str a Python caller would hand HF.
//
// renderGemma4Prompt() renders the Gemma 4 chat template (26B variant, generation prompt, thinking
// off) in C++ and tokenizes it:
//
//   <bos> { <|turn>ROLE\nCONTENT<turn|>\n }* <|turn>model\n<|channel>thought\n<channel|>
//
// ROLE is system, user or model (assistant). CONTENT is the message's parts concatenated: a text part
// stripped of leading and trailing whitespace (Python str.strip()), model text with its thought
// blocks removed first, a system message given as a list of parts with a space after each text
// part, an image part as <boi> + N x <image> + <eoi>, N being that image's soft-token count.
// Consecutive assistant messages share one model turn. These are the upstream Gemma 4 template's
// rules; test/fixtures/tokenizer pins them (tools/reference/make_tokenizer_fixtures.py).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/data/rows/Rows.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace dgemma {

class ByteLevelBpe;
class TokenizerJson;

class Tokenizer {
 public:
  // Loads DIRECTORY/tokenizer.model, or DIRECTORY/tokenizer.json if there is no tokenizer.model, or
  // DIRECTORY/vocab.json + merges.txt if there is neither (docs/data.md, "Tokenization", for the
  // special tokens of that backend). Throws InputError naming the path when the directory or all
  // files are missing, when a file is unreadable or invalid (tokenizer.json: "PATH: JSON.PATH:
  // expected ...", merges.txt: "PATH:LINE: expected ..."), or when the tokenizer defines no EOS id
  // (docs/data.md, "Row validation", rule 7). With tokenizer.json, the EOS, BOS and PAD tokens are
  // tokenizer_config.json's (else special_tokens_map.json's) "eos_token", "bos_token", "pad_token",
  // defaulting to "<eos>", "<bos>", "<pad>".
  // DIRECTORY/tokenizer_config.json, if present, may name the image, begin-of-image and
  // end-of-image tokens ("image_token", "boi_token", "eoi_token"); the defaults are "<image>",
  // "<boi>" and "<eoi>".
  explicit Tokenizer(const std::string& directory);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  const std::string& directory() const { return directory_; }
  // "sentencepiece" (tokenizer.model), "tokenizers" (tokenizer.json) or "gpt2-bpe" (vocab.json, or a
  // tokenizer.json with the ByteLevel pre-tokenizer).
  const std::string& backend() const { return backend_; }
  // The file the tokenizer was loaded from (DIRECTORY/tokenizer.model, tokenizer.json or vocab.json).
  const std::string& file() const { return file_; }
  int64_t vocabSize() const { return vocabSize_; }  // number of pieces

  // Text to ids, with special-token strings matched as single ids; no BOS or EOS is added.
  std::vector<int32_t> encode(std::string_view text) const;
  // encode(text) followed by EOS unless it already ends with EOS (docs/data.md, "Tokenization").
  std::vector<int32_t> completionTokens(std::string_view text) const;

  // Ids to text as the Gemma tokenizer.json decoder does (Replace "▁" with " ", ByteFallback,
  // Fuse; transformers' decode with skip_special_tokens=False): every id becomes its piece, special
  // ones included ("<eos>"), "▁" a space; a run of byte pieces "<0xXX>" becomes its bytes, or one
  // U+FFFD per byte when they are not valid UTF-8; an id outside the tokenizer's pieces becomes
  // U+FFFD. A tokenizer.json's Strip decoder step is applied too; InputError when its decoder has
  // another step (TokenizerJson::applyDecoderStrip). gpt2-bpe decodes as HF's ByteLevel decoder: the
  // ids' tokenBytes() joined, then read as UTF-8 with Utf8Replacement.h's rule.
  std::string decode(std::span<const int64_t> ids) const;

  // Per id, the bytes the id contributes to decode(): its piece with "▁" replaced by " ", or for a
  // byte-fallback piece "<0xXX>" the single byte XX; for gpt2-bpe the bytes its byte characters stand
  // for (ByteLevelBpe::tokenBytes). decode() of ids is the concatenation of these,
  // except that it replaces bytes that are not well-formed UTF-8 by U+FFFD and applies a
  // tokenizer.json's Strip decoder step.
  std::vector<std::string> tokenBytes() const;
  // Whether `id` is a special token: a SentencePiece control, unknown or user-defined piece, a
  // tokenizer.json added token marked special, or a gpt2-bpe named or special added token. False for an id outside the tokenizer's pieces.
  bool isSpecial(int32_t id) const;

  // The id of a special token by its string ("<eos>", "<|turn>"); nullopt / InputError if the model
  // has no such special piece.
  std::optional<int32_t> findSpecialTokenId(std::string_view token) const;
  int32_t specialTokenId(std::string_view token) const;
  int32_t eosId() const { return eos_; }
  int32_t bosId() const { return bos_; }
  int32_t padId() const { return pad_; }  // -1 if the model has none
  int32_t imageTokenId() const { return specialTokenId(imageToken_); }
  int32_t boiTokenId() const { return specialTokenId(boiToken_); }
  int32_t eoiTokenId() const { return specialTokenId(eoiToken_); }
  const std::string& imageToken() const { return imageToken_; }
  const std::string& boiToken() const { return boiToken_; }
  const std::string& eoiToken() const { return eoiToken_; }

  // Throws InputError when the tokenizer has more pieces than the model's vocabulary.
  void checkVocabSize(int64_t modelVocabSize) const;

 private:
  void loadSentencePiece(const std::string& model);
  void loadTokenizerJson(const std::string& path);
  void loadByteLevelBpe(const std::string& vocabPath, const std::string& mergesPath);
  void loadByteLevelTokenizerJson(const std::string& path, const nlohmann::json& root);
  struct ByteLevelAddedToken {
    std::string content;
    int32_t id;
    bool special;
  };
  // An added token of tokenizer_config.json's added_tokens_decoder or tokenizer.json's added_tokens.
  static ByteLevelAddedToken readByteLevelAddedToken(const nlohmann::json& token, const std::string& at, int32_t id);
  // The special tokens, ids and per-id tables of the gpt2-bpe backend once bpe_ is loaded.
  void finishByteLevelBpe(std::vector<ByteLevelAddedToken> added, const std::string& where);
  std::string piece(int32_t id) const;
  // The byte of a byte-fallback piece; nothing for any other piece.
  std::optional<char> fallbackByte(int32_t id, const std::string& piece) const;

  std::string directory_, backend_, file_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::unique_ptr<TokenizerJson> json_;
  std::unique_ptr<ByteLevelBpe> bpe_;
  std::vector<std::string> bpeTokenBytes_;  // per id, for the gpt2-bpe backend
  int64_t vocabSize_ = 0;
  int32_t eos_ = -1, bos_ = -1, pad_ = -1;
  std::string imageToken_ = "<image>", boiToken_ = "<boi>", eoiToken_ = "<eoi>";
  std::unordered_map<std::string, int32_t> specials_;
  std::vector<bool> isSpecial_;  // per id
  // Special strings grouped by first byte, longest first, for the leftmost-longest match.
  std::vector<std::vector<std::pair<std::string, int32_t>>> byFirstByte_;
};

// Whether `directory` holds a tokenizer that Tokenizer loads: tokenizer.model, tokenizer.json, or
// GPT-2's vocab.json + merges.txt.
bool holdsTokenizer(const std::string& directory);

// Throws InputError ("WHAT: token id X at position P is out of range for vocab_size V") unless every
// id is in [0, vocabSize).
void checkTokenIds(const std::vector<int32_t>& ids, int64_t vocabSize, const std::string& what);

// The template's strip_thinking: thought blocks ("<|channel>...<channel|>") removed, then trimmed.
std::string stripThinking(std::string_view text);

// Python's str.strip() on UTF-8 text (Unicode whitespace at both ends).
std::string stripPythonWhitespace(std::string_view text);

struct TokenizedPrompt {
  std::vector<int32_t> inputIds;
  std::vector<int32_t> mmTokenTypeIds;  // 1 on image soft tokens, 0 elsewhere (<boi>, <eoi> included)
};

// The prompt text of the template above, image placeholders already expanded. `imageSoftTokenCounts`
// gives N for each image part in message order. Throws InputError if its length differs from the
// number of image parts or a count is below 1.
std::string renderGemma4PromptText(const Tokenizer& tokenizer, const std::vector<Message>& messages,
                                   const std::vector<int64_t>& imageSoftTokenCounts);

// renderGemma4PromptText, tokenized with encode(). Throws InputError if the number of image tokens in
// the result differs from the sum of the counts (image-token strings inside message text).
TokenizedPrompt renderGemma4Prompt(const Tokenizer& tokenizer, const std::vector<Message>& messages,
                                   const std::vector<int64_t>& imageSoftTokenCounts);

}  // namespace dgemma
