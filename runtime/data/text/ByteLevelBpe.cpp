#include "runtime/data/text/ByteLevelBpe.h"

// PCRE2 (Debian's libpcre2-dev) runs GPT-2's pattern: with PCRE2_UTF | PCRE2_UCP its \p{L}, \p{N} and
// \s are the Unicode properties the pattern needs, with the (?!\S) lookahead; std::regex has no
// Unicode property classes. HF runs the pattern through Oniguruma and Python's GPT-2 code through the
// `regex` package; PCRE2 10.42 has Unicode 14's tables, so characters assigned later may be classified
// differently by them (the parity test uses characters of Unicode 13 and earlier).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <unordered_map>
#include <utility>

#include "runtime/data/text/BpeMerges.h"
#include "support/Error.h"
#include "support/InputFile.h"
#include "support/Json.h"

namespace dgemma {
namespace {

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// UTF-8 of a byte character: all are below U+0200.
std::string utf8Of(uint32_t cp) {
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  return {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
}

// GPT-2's bytes_to_unicode: the code point standing for each byte.
std::array<uint32_t, 256> byteCodepoints() {
  std::array<uint32_t, 256> codepoints{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    codepoints[b] = printable ? b : next++;
  }
  return codepoints;
}

struct PcreCodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct PcreMatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

std::string pcreMessage(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

struct ByteLevelBpe::Impl {
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> tokens;  // by id
  std::vector<bool> idTaken;
  std::array<int32_t, 256> byteIds{};
  std::array<std::string, 256> byteChars;                 // UTF-8 of each byte's character
  std::unordered_map<uint32_t, unsigned char> charBytes;  // the inverse
  BpeMerges merges;
  int32_t rank = 0;
  bool ignoreMerges = false;
  std::unique_ptr<pcre2_code, PcreCodeDeleter> pattern;

  Impl() {
    const std::array<uint32_t, 256> codepoints = byteCodepoints();
    for (int b = 0; b < 256; ++b) {
      byteChars[b] = utf8Of(codepoints[b]);
      charBytes[codepoints[b]] = static_cast<unsigned char>(b);
    }
  }

  // One vocabulary entry; `at` names it in messages ("PATH: the token \"x\"").
  void addToken(const std::string& token, const nlohmann::json& value, const std::string& at) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() > ByteLevelBpe::kMaxTokenId)
      throw InputError(at + ": expected an integer id from 0 to " + std::to_string(ByteLevelBpe::kMaxTokenId) +
                       ", got " + describeJsonValue(value));
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    if (static_cast<size_t>(id) >= tokens.size()) {
      tokens.resize(static_cast<size_t>(id) + 1);
      idTaken.resize(static_cast<size_t>(id) + 1);
    }
    if (idTaken[id])
      throw InputError(at + ": the tokens " + quoteForMessage(tokens[id]) + " and " + quoteForMessage(token) +
                       " both have the id " + std::to_string(id) + "; expected one token per id");
    tokens[id] = token;
    idTaken[id] = true;
    vocab.emplace(token, id);
  }

  // After the vocabulary: every byte's character must be a token.
  void findByteIds(const std::string& vocabName) {
    for (int b = 0; b < 256; ++b) {
      auto it = vocab.find(byteChars[b]);
      if (it == vocab.end()) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        throw InputError(vocabName +
                         ": expected a token for every byte's character (GPT-2's byte-level alphabet), but " +
                         quoteForMessage(byteChars[b]) + " (byte " + hex + ") is missing");
      }
      byteIds[b] = it->second;
    }
  }

  // The next merge in rank order; `at` locates it ("PATH:LINE: "), `vocabName` names the vocabulary.
  void addMerge(const std::string& left, const std::string& right, const std::string& at,
                const std::string& vocabName) {
    for (const std::string* part : {&left, &right})
      if (!vocab.count(*part))
        throw InputError(at + "expected the merge's tokens in " + vocabName + ", but " + quoteForMessage(*part) +
                         " is not there");
    auto merged = vocab.find(left + right);
    if (merged == vocab.end())
      throw InputError(at + "expected the merged token " + quoteForMessage(left + right) + " in " + vocabName +
                       ", but it is not there");
    merges.add(vocab.at(left), vocab.at(right), rank++, merged->second);
  }

  void compilePattern() {
    int errorCode = 0;
    PCRE2_SIZE errorOffset = 0;
    pattern.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern.data()), kGpt2Pattern.size(),
                                PCRE2_UTF | PCRE2_UCP, &errorCode, &errorOffset, nullptr));
    if (!pattern) throw RuntimeError("GPT-2's pre-tokenizer pattern does not compile: " + pcreMessage(errorCode));
    // JIT is a speed-up only: where the platform has none, pcre2_match interprets the pattern.
    pcre2_jit_compile(pattern.get(), PCRE2_JIT_COMPLETE);
  }

  // Appends the ids of one piece of the pre-tokenizer.
  void encodePiece(std::string_view piece, std::vector<int32_t>& ids) const {
    if (piece.size() == 1) {
      ids.push_back(byteIds[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (ignoreMerges) {
      // HF's ignore_merges: a piece that is a token is that token, whatever the merges would give.
      std::string chars;
      for (char b : piece) chars += byteChars[static_cast<unsigned char>(b)];
      if (auto it = vocab.find(chars); it != vocab.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    std::vector<int32_t> symbols;
    symbols.reserve(piece.size());
    for (char b : piece) symbols.push_back(byteIds[static_cast<unsigned char>(b)]);
    merges.apply(symbols, ids);
  }
};

ByteLevelBpe ByteLevelBpe::load(const std::string& vocabPath, const std::string& mergesPath) {
  return ByteLevelBpe(readRegularFile(vocabPath), vocabPath, readRegularFile(mergesPath), mergesPath);
}

ByteLevelBpe::ByteLevelBpe(std::string_view vocabJson, const std::string& vocabName, std::string_view mergesText,
                           const std::string& mergesName)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  const nlohmann::json vocab = parseJson(vocabJson, vocabName);
  if (!vocab.is_object())
    throw InputError(vocabName + ": expected a JSON object of token -> id, got " + describeJsonValue(vocab));
  for (const auto& [token, value] : vocab.items())
    d.addToken(token, value, vocabName + ": the token " + quoteForMessage(token));
  d.findByteIds(vocabName);

  size_t lineStart = 0;
  for (int64_t lineNumber = 1; lineStart < mergesText.size(); ++lineNumber) {
    size_t lineEnd = mergesText.find('\n', lineStart);
    if (lineEnd == std::string_view::npos) lineEnd = mergesText.size();
    std::string_view line = mergesText.substr(lineStart, lineEnd - lineStart);
    lineStart = lineEnd + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // CRLF, as Rust's lines() reads it
    if (line.starts_with("#version")) continue;
    const std::string at = mergesName + ":" + std::to_string(lineNumber) + ": ";
    const size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos)
      throw InputError(at + "expected a merge \"LEFT RIGHT\" (two tokens separated by one space), got " +
                       quoteForMessage(line));
    d.addMerge(std::string(line.substr(0, space)), std::string(line.substr(space + 1)), at, vocabName);
  }
  d.compilePattern();
}

ByteLevelBpe::ByteLevelBpe(const nlohmann::json& model, const std::string& file) : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  auto fail = [&](const std::string& at, const std::string& what) { throw InputError(file + ": " + at + ": " + what); };
  if (!model.is_object()) fail("model", "expected an object, got " + describeJsonValue(model));
  if (auto it = model.find("type"); it != model.end() && *it != "BPE")
    fail("model.type", "expected \"BPE\" for a ByteLevel tokenizer, got " + describeJsonValue(*it));
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null() && *it != 0)
    fail("model.dropout", "BPE dropout is not supported by dgemma (expected null), got " + describeJsonValue(*it));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto it = model.find(key); it != model.end() && !it->is_null() && *it != "")
      fail(std::string("model.") + key, "is not supported by dgemma (expected null), got " + describeJsonValue(*it));
  if (auto it = model.find("ignore_merges"); it != model.end() && !it->is_null()) {
    if (!it->is_boolean()) fail("model.ignore_merges", "expected a boolean, got " + describeJsonValue(*it));
    d.ignoreMerges = it->get<bool>();
  }
  // unk_token, fuse_unk and byte_fallback cannot change the ids: every byte has its token.
  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object()) fail("model.vocab", "expected an object of token -> id");
  for (const auto& [token, value] : vocab->items())
    d.addToken(token, value, file + ": model.vocab[" + quoteForMessage(token) + "]");
  d.findByteIds(file + ": model.vocab");
  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) fail("model.merges", "expected an array");
  for (size_t i = 0; i < merges->size(); ++i) {
    const nlohmann::json& m = (*merges)[i];
    const std::string at = file + ": model.merges[" + std::to_string(i) + "]: ";
    std::string left, right;
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else if (m.is_string() &&
               std::count(m.get_ref<const std::string&>().begin(), m.get_ref<const std::string&>().end(), ' ') == 1) {
      const std::string& text = m.get_ref<const std::string&>();
      left = text.substr(0, text.find(' '));
      right = text.substr(text.find(' ') + 1);
    } else {
      throw InputError(at + "expected [\"LEFT\", \"RIGHT\"] or \"LEFT RIGHT\", got " + describeJsonValue(m));
    }
    d.addMerge(left, right, at, file + ": model.vocab");
  }
  d.compilePattern();
}

ByteLevelBpe::~ByteLevelBpe() = default;
ByteLevelBpe::ByteLevelBpe(ByteLevelBpe&&) noexcept = default;
ByteLevelBpe& ByteLevelBpe::operator=(ByteLevelBpe&&) noexcept = default;

void ByteLevelBpe::encode(std::string_view text, std::vector<int32_t>& ids) const {
  const Impl& d = *impl_;
  std::unique_ptr<pcre2_match_data, PcreMatchDataDeleter> match(
      pcre2_match_data_create_from_pattern(d.pattern.get(), nullptr));
  if (!match) throw RuntimeError("out of memory for a PCRE2 match");
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // The first match checks that the whole text is UTF-8; later ones skip that check, which would
  // otherwise make the loop quadratic. PCRE2_NOTEMPTY: every piece has a character (the pattern's
  // alternatives all consume one anyway).
  uint32_t options = PCRE2_NOTEMPTY;
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc = pcre2_match(d.pattern.get(), subject, text.size(), offset, options, match.get(), nullptr);
    options |= PCRE2_NO_UTF_CHECK;
    if (rc == PCRE2_ERROR_NOMATCH) {
      d.encodePiece(text.substr(offset), ids);
      break;
    }
    if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
      throw InputError("text to encode: expected UTF-8: " + pcreMessage(rc));
    if (rc < 0) throw RuntimeError("GPT-2 pre-tokenization failed: " + pcreMessage(rc));
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match.get());
    // Text between matches stays a piece of its own, as HF's Split keeps it (the pattern covers
    // every character, so there is none in practice).
    if (span[0] > offset) d.encodePiece(text.substr(offset, span[0] - offset), ids);
    d.encodePiece(text.substr(span[0], span[1] - span[0]), ids);
    offset = span[1];
  }
}

int64_t ByteLevelBpe::vocabSize() const { return static_cast<int64_t>(impl_->tokens.size()); }

int32_t ByteLevelBpe::tokenToId(std::string_view token) const {
  auto it = impl_->vocab.find(std::string(token));
  return it == impl_->vocab.end() ? -1 : it->second;
}

const std::string& ByteLevelBpe::idToToken(int32_t id) const {
  static const std::string kNone;
  return id >= 0 && id < vocabSize() ? impl_->tokens[id] : kNone;
}

std::string ByteLevelBpe::tokenBytes(std::string_view token) const {
  std::string bytes;
  for (size_t pos = 0; pos < token.size();) {
    // Byte characters are all below U+0200: one or two UTF-8 bytes.
    const auto b0 = static_cast<unsigned char>(token[pos]);
    uint32_t cp = b0;
    size_t length = 1;
    if ((b0 >> 5) == 0x6 && pos + 1 < token.size() && (static_cast<unsigned char>(token[pos + 1]) & 0xC0) == 0x80) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(token[pos + 1]) & 0x3Fu);
      length = 2;
    }
    auto it = b0 < 0x80 || length == 2 ? impl_->charBytes.find(cp) : impl_->charBytes.end();
    if (it == impl_->charBytes.end()) return std::string(token);
    bytes.push_back(static_cast<char>(it->second));
    pos += length;
  }
  return bytes;
}

}  // namespace dgemma
