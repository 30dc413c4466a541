#include "runtime/data/text/Tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "support/Error.h"
#include "support/InputFile.h"
#include "support/Json.h"
#include "runtime/data/rows/Utf8.h"
#include "runtime/data/text/ByteLevelBpe.h"
#include "runtime/data/text/TokenizerJson.h"
#include "runtime/data/text/Utf8Replacement.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;

bool isPythonWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Decodes the UTF-8 sequence at text[pos] into `cp` and returns its length; 0 if it is malformed.
size_t decodeAt(std::string_view text, size_t pos, uint32_t& cp) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  size_t len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || pos + len > text.size()) return 0;
  cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t i = 1; i < len; ++i) {
    const auto b = static_cast<unsigned char>(text[pos + i]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  return len;
}

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

// The byte of a byte-fallback piece "<0xXX>"; nothing for any other piece.
std::optional<char> byteFallbackValue(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  const int high = hex(piece[3]), low = hex(piece[4]);
  if (high < 0 || low < 0) return std::nullopt;
  return static_cast<char>(high * 16 + low);
}

// A piece's text with SentencePiece's word boundary "▁" (U+2581) replaced by a space.
std::string replaceMetaspace(std::string_view piece) {
  constexpr std::string_view kMetaspace = "\xE2\x96\x81";
  std::string text;
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.compare(pos, kMetaspace.size(), kMetaspace) == 0) {
      text.push_back(' ');
      pos += kMetaspace.size();
    } else {
      text.push_back(piece[pos++]);
    }
  }
  return text;
}

// `bytes` with every byte where well-formed UTF-8 breaks replaced by U+FFFD.
std::string withReplacementCharacters(std::string_view bytes) {
  std::string text;
  while (std::optional<Utf8Problem> problem = findInvalidUtf8(bytes)) {
    text.append(bytes.substr(0, problem->offset));
    text.append(kReplacementCharacter);
    bytes.remove_prefix(problem->offset + 1);
  }
  text.append(bytes);
  return text;
}

std::string readConfigToken(const nlohmann::json& config, const char* key, std::string fallback) {
  auto it = config.find(key);
  if (it == config.end()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return fallback;
}

struct SpecialTokenNames {
  std::string eos, bos, pad, unk;  // "" for none
};

// The special token names of an HF tokenizer directory: tokenizer_config.json's, else
// special_tokens_map.json's, else `names`. A name given as null keeps the fallback.
SpecialTokenNames readSpecialTokenNames(const fs::path& dir, SpecialTokenNames names) {
  for (const char* file : {"special_tokens_map.json", "tokenizer_config.json"}) {
    const fs::path p = dir / file;
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;
    const nlohmann::json config = parseJson(readRegularFile(p.string()), p.string());
    if (!config.is_object()) continue;
    names.eos = readConfigToken(config, "eos_token", names.eos);
    names.bos = readConfigToken(config, "bos_token", names.bos);
    names.pad = readConfigToken(config, "pad_token", names.pad);
    names.unk = readConfigToken(config, "unk_token", names.unk);
  }
  return names;
}

// The piece types of a serialized SentencePiece ModelProto (field 1: repeated SentencePiece, whose
// field 3 is the type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte). The
// installed libsentencepiece cannot tell user-defined pieces from normal ones, so the model file's
// protobuf wire format is read here. Returns an empty vector if the file is not well-formed.
std::vector<int> readPieceTypes(const std::string& bytes) {
  std::vector<int> types;
  auto readVarint = [](const std::string& b, size_t& pos, uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64 && pos < b.size(); shift += 7) {
      const auto byte = static_cast<unsigned char>(b[pos++]);
      value |= uint64_t{byte & 0x7Fu} << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  };
  // Skips one field of wire type `wire`; false if malformed.
  auto skip = [&](const std::string& b, size_t& pos, uint64_t wire) {
    uint64_t v = 0;
    switch (wire) {
      case 0: return readVarint(b, pos, v);
      case 1: pos += 8; return pos <= b.size();
      case 2:
        if (!readVarint(b, pos, v) || v > b.size() - pos) return false;
        pos += v;
        return true;
      case 5: pos += 4; return pos <= b.size();
      default: return false;
    }
  };
  size_t pos = 0;
  while (pos < bytes.size()) {
    uint64_t key = 0;
    if (!readVarint(bytes, pos, key)) return {};
    if (key >> 3 == 1 && (key & 7) == 2) {
      uint64_t length = 0;
      if (!readVarint(bytes, pos, length) || length > bytes.size() - pos) return {};
      const std::string piece = bytes.substr(pos, length);
      pos += length;
      int type = 1;  // the default
      size_t p = 0;
      while (p < piece.size()) {
        uint64_t k = 0, v = 0;
        if (!readVarint(piece, p, k)) return {};
        if (k >> 3 == 3 && (k & 7) == 0) {
          if (!readVarint(piece, p, v)) return {};
          type = static_cast<int>(v);
        } else if (!skip(piece, p, k & 7)) {
          return {};
        }
      }
      types.push_back(type);
    } else if (!skip(bytes, pos, key & 7)) {
      return {};
    }
  }
  return types;
}

}  // namespace

std::string stripPythonWhitespace(std::string_view text) {
  size_t begin = 0, end = text.size();
  while (begin < end) {
    uint32_t cp = 0;
    size_t len = decodeAt(text, begin, cp);
    if (len == 0 || !isPythonWhitespace(cp)) break;
    begin += len;
  }
  while (end > begin) {
    size_t lead = end - 1;
    while (lead > begin && (static_cast<unsigned char>(text[lead]) & 0xC0) == 0x80) --lead;
    uint32_t cp = 0;
    size_t len = decodeAt(text, lead, cp);
    if (len != end - lead || !isPythonWhitespace(cp)) break;
    end = lead;
  }
  return std::string(text.substr(begin, end - begin));
}

Tokenizer::Tokenizer(const std::string& directory) : directory_(directory) {
  const fs::path dir(directory);
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw InputError(
        directory +
        ": expected a tokenizer directory (with tokenizer.model, tokenizer.json or vocab.json + merges.txt), but it"
        " does not exist or is not a directory");
  const fs::path model = dir / "tokenizer.model";
  const fs::path tokenizerJson = dir / "tokenizer.json";
  const fs::path vocab = dir / "vocab.json", merges = dir / "merges.txt";
  if (fs::exists(model, ec)) {
    loadSentencePiece(model.string());
  } else if (fs::exists(tokenizerJson, ec)) {
    loadTokenizerJson(tokenizerJson.string());
  } else if (fs::exists(vocab, ec) || fs::exists(merges, ec)) {
    loadByteLevelBpe(vocab.string(), merges.string());
  } else {
    throw InputError(model.string() + ": expected a SentencePiece tokenizer model (or " + tokenizerJson.string() +
                     ", an HF tokenizer, or vocab.json and merges.txt, a GPT-2 BPE tokenizer), but none exists");
  }

  const fs::path configPath = dir / "tokenizer_config.json";
  if (fs::exists(configPath, ec)) {
    const nlohmann::json config = parseJson(readRegularFile(configPath.string()), configPath.string());
    if (config.is_object()) {
      imageToken_ = readConfigToken(config, "image_token", imageToken_);
      boiToken_ = readConfigToken(config, "boi_token", boiToken_);
      eoiToken_ = readConfigToken(config, "eoi_token", eoiToken_);
    }
  }
}

void Tokenizer::loadTokenizerJson(const std::string& path) {
  // A regular file, nesting bounded (support/InputFile.h, support/Json.h).
  const nlohmann::json root = parseJson(readRegularFile(path), path);
  // GPT-2 style files (saved by transformers from vocab.json + merges.txt) go to the byte-level backend.
  if (root.is_object() && root.contains("pre_tokenizer") && root["pre_tokenizer"].is_object() &&
      root["pre_tokenizer"].value("type", nlohmann::json()) == "ByteLevel") {
    loadByteLevelTokenizerJson(path, root);
    return;
  }
  backend_ = "tokenizers";
  file_ = path;
  json_ = std::make_unique<TokenizerJson>(path, root);
  vocabSize_ = json_->vocabSize();
  isSpecial_.assign(static_cast<size_t>(vocabSize_), false);
  for (const TokenizerJson::AddedToken& token : json_->addedTokens()) {
    specials_.emplace(token.content, token.id);
    if (token.special && token.id >= 0 && token.id < vocabSize_) isSpecial_[token.id] = true;
  }

  const SpecialTokenNames names = readSpecialTokenNames(directory_, {"<eos>", "<bos>", "<pad>", ""});
  eos_ = json_->tokenToId(names.eos);
  bos_ = json_->tokenToId(names.bos);
  pad_ = json_->tokenToId(names.pad);
  if (eos_ < 0) throw InputError(path + ": the tokenizer defines no EOS id (no token \"" + names.eos + "\")");
}

void Tokenizer::loadByteLevelBpe(const std::string& vocabPath, const std::string& mergesPath) {
  backend_ = "gpt2-bpe";
  file_ = vocabPath;
  for (const std::string& path : {vocabPath, mergesPath}) {
    std::error_code ec;
    if (!fs::exists(path, ec))
      throw InputError(path + ": expected this file beside " + (path == vocabPath ? mergesPath : vocabPath) +
                       " (a GPT-2 BPE tokenizer is vocab.json and merges.txt), but it does not exist");
  }
  bpe_ = std::make_unique<ByteLevelBpe>(ByteLevelBpe::load(vocabPath, mergesPath));

  std::vector<ByteLevelAddedToken> added;
  const fs::path configPath = fs::path(directory_) / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(configPath, ec)) {
    const std::string where = configPath.string();
    const nlohmann::json config = parseJson(readRegularFile(where), where);
    if (auto it = config.find("added_tokens_decoder"); config.is_object() && it != config.end() && !it->is_null()) {
      if (!it->is_object())
        throw InputError(where + ": added_tokens_decoder: expected an object of id -> token, got " +
                         describeJsonValue(*it));
      for (const auto& [key, token] : it->items()) {
        const std::string at = where + ": added_tokens_decoder[" + quoteForMessage(key) + "]";
        int64_t id = -1;
        if (!key.empty() && key.size() <= 8 && key.find_first_not_of("0123456789") == std::string::npos)
          id = std::stoll(key);
        if (id < 0) throw InputError(at + ": expected a non-negative integer id of at most 8 digits as the key");
        added.push_back(readByteLevelAddedToken(token, at, static_cast<int32_t>(id)));
      }
    }
  }
  finishByteLevelBpe(std::move(added), vocabPath);
}

Tokenizer::ByteLevelAddedToken Tokenizer::readByteLevelAddedToken(const nlohmann::json& token, const std::string& at,
                                                                  int32_t id) {
  if (!token.is_object() || !token.contains("content") || !token["content"].is_string() ||
      token["content"].get<std::string>().empty())
    throw InputError(at + ": expected an object with a non-empty string \"content\", got " + describeJsonValue(token));
  for (const char* flag : {"lstrip", "rstrip", "single_word"})
    if (auto f = token.find(flag); f != token.end() && *f == true)
      throw InputError(at + "." + flag + ": true is not supported by dgemma's GPT-2 BPE tokenizer (expected false)");
  if (id > ByteLevelBpe::kMaxTokenId)
    throw InputError(at + ": expected an id from 0 to " + std::to_string(ByteLevelBpe::kMaxTokenId) + ", got " +
                     std::to_string(id));
  return {token["content"].get<std::string>(), id, token.contains("special") && token["special"] == true};
}

void Tokenizer::loadByteLevelTokenizerJson(const std::string& path, const nlohmann::json& root) {
  backend_ = "gpt2-bpe";
  file_ = path;
  auto fail = [&](const std::string& at, const std::string& what) { throw InputError(path + ": " + at + ": " + what); };
  // GPT-2's shape as transformers saves it: no normalizer, the ByteLevel pre-tokenizer with GPT-2's
  // pattern and no prefix space, the ByteLevel decoder; the post-processor only adds special tokens,
  // which encode() never does.
  if (auto it = root.find("normalizer"); it != root.end() && !it->is_null())
    fail("normalizer", "expected null beside the ByteLevel pre-tokenizer, got " + describeJsonValue(*it));
  const nlohmann::json& pre = root["pre_tokenizer"];
  if (pre.value("add_prefix_space", false) != false)
    fail("pre_tokenizer.add_prefix_space", "true is not supported by dgemma (expected false)");
  if (pre.value("use_regex", true) != true)
    fail("pre_tokenizer.use_regex", "false is not supported by dgemma (expected true, GPT-2's pattern)");
  if (auto it = root.find("decoder");
      it != root.end() && !it->is_null() && it->value("type", nlohmann::json()) != "ByteLevel")
    fail("decoder", "expected the ByteLevel decoder beside the ByteLevel pre-tokenizer, got " + describeJsonValue(*it));
  if (!root.contains("model")) fail("model", "expected a value, but the key is missing");
  bpe_ = std::make_unique<ByteLevelBpe>(root["model"], path);

  std::vector<ByteLevelAddedToken> added;
  if (auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) fail("added_tokens", "expected an array, got " + describeJsonValue(*it));
    for (size_t i = 0; i < it->size(); ++i) {
      const nlohmann::json& token = (*it)[i];
      const std::string at = path + ": added_tokens[" + std::to_string(i) + "]";
      const nlohmann::json id = token.is_object() ? token.value("id", nlohmann::json()) : nlohmann::json();
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        throw InputError(at + ".id: expected a non-negative integer id, got " + describeJsonValue(id));
      added.push_back(readByteLevelAddedToken(token, at, static_cast<int32_t>(id.get<int64_t>())));
    }
  }
  finishByteLevelBpe(std::move(added), path);
}

void Tokenizer::finishByteLevelBpe(std::vector<ByteLevelAddedToken> added, const std::string& where) {
  // add_prefix_space changes every text's first word; dgemma follows GPT-2's default, false.
  const fs::path configPath = fs::path(directory_) / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(configPath, ec)) {
    const nlohmann::json config = parseJson(readRegularFile(configPath.string()), configPath.string());
    if (auto it = config.find("add_prefix_space"); config.is_object() && it != config.end() && *it == true)
      throw InputError(configPath.string() +
                       ": add_prefix_space: true is not supported by dgemma's GPT-2 BPE tokenizer (expected false)");
  }
  // The named special tokens are added tokens too (GPT2Tokenizer's defaults: "<|endoftext|>" is BOS,
  // EOS and unknown; no PAD). A token of the vocabulary keeps its id there, as in HF.
  const SpecialTokenNames names =
      readSpecialTokenNames(directory_, {"<|endoftext|>", "<|endoftext|>", "", "<|endoftext|>"});
  auto idOf = [&](const std::string& token) -> int32_t {
    if (int32_t id = bpe_->tokenToId(token); id >= 0) return id;
    for (const ByteLevelAddedToken& a : added)
      if (a.content == token) return a.id;
    return -1;
  };
  for (const std::string* name : {&names.eos, &names.bos, &names.pad, &names.unk}) {
    if (name->empty()) continue;
    const int32_t id = idOf(*name);
    if (id < 0)
      throw InputError(where + ": expected the special token \"" + *name +
                       "\" (named by the tokenizer's config, or GPT-2's default) among the tokens or the added"
                       " tokens, but it is in neither");
    added.push_back({*name, id, true});
  }
  eos_ = idOf(names.eos);
  bos_ = names.bos.empty() ? -1 : idOf(names.bos);
  pad_ = names.pad.empty() ? -1 : idOf(names.pad);

  vocabSize_ = bpe_->vocabSize();
  for (ByteLevelAddedToken& a : added) {
    if (int32_t id = bpe_->tokenToId(a.content); id >= 0) a.id = id;
    vocabSize_ = std::max<int64_t>(vocabSize_, int64_t{a.id} + 1);
  }
  isSpecial_.assign(static_cast<size_t>(vocabSize_), false);
  bpeTokenBytes_.assign(static_cast<size_t>(vocabSize_), "");
  for (int32_t id = 0; id < bpe_->vocabSize(); ++id) bpeTokenBytes_[id] = bpe_->tokenBytes(bpe_->idToToken(id));
  byFirstByte_.resize(256);
  for (const ByteLevelAddedToken& a : added) {
    // HF decodes an added token through the ByteLevel decoder too.
    bpeTokenBytes_[a.id] = bpe_->tokenBytes(a.content);
    if (a.special) isSpecial_[a.id] = true;
    if (!specials_.emplace(a.content, a.id).second) continue;
    byFirstByte_[static_cast<unsigned char>(a.content[0])].emplace_back(a.content, a.id);
  }
  for (auto& group : byFirstByte_)
    std::stable_sort(group.begin(), group.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

void Tokenizer::loadSentencePiece(const std::string& modelPath) {
  const fs::path model(modelPath);
  backend_ = "sentencepiece";
  file_ = modelPath;
  // Read through readRegularFile first: SentencePiece's own Load would block forever on a FIFO and
  // fail with an internal error on a directory.
  const std::string modelBytes = readRegularFile(model.string());
  sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp_->LoadFromSerializedProto(modelBytes);
  if (!status.ok()) throw InputError(model.string() + ": cannot load the SentencePiece model: " + status.ToString());
  vocabSize_ = sp_->GetPieceSize();
  eos_ = sp_->eos_id();
  bos_ = sp_->bos_id();
  pad_ = sp_->pad_id();
  if (eos_ < 0) throw InputError(model.string() + ": the tokenizer defines no EOS id");

  const std::vector<int> types = readPieceTypes(modelBytes);
  if (static_cast<int64_t>(types.size()) != vocabSize_)
    throw InputError(model.string() + ": cannot read the piece types of the SentencePiece model");
  constexpr int kUserDefined = 4;
  byFirstByte_.resize(256);
  isSpecial_.assign(static_cast<size_t>(vocabSize_), false);
  for (int id = 0; id < sp_->GetPieceSize(); ++id) {
    if (!(sp_->IsControl(id) || sp_->IsUnknown(id) || types[id] == kUserDefined)) continue;
    isSpecial_[id] = true;
    std::string piece = sp_->IdToPiece(id);
    if (piece.empty() || specials_.count(piece)) continue;
    specials_.emplace(piece, id);
    byFirstByte_[static_cast<unsigned char>(piece[0])].emplace_back(piece, id);
  }
  for (auto& group : byFirstByte_)
    std::stable_sort(group.begin(), group.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

std::string Tokenizer::piece(int32_t id) const {
  return json_ ? json_->idToToken(id) : sp_->IdToPiece(static_cast<int>(id));
}

std::optional<char> Tokenizer::fallbackByte(int32_t id, const std::string& piece) const {
  std::optional<char> byte = byteFallbackValue(piece);
  if (byte && (json_ || sp_->IsByte(static_cast<int>(id)))) return byte;
  return std::nullopt;
}

std::vector<std::string> Tokenizer::tokenBytes() const {
  if (bpe_) return bpeTokenBytes_;
  std::vector<std::string> bytes(static_cast<size_t>(vocabSize_));
  for (int32_t id = 0; id < vocabSize_; ++id) {
    const std::string text = piece(id);
    if (std::optional<char> byte = fallbackByte(id, text)) bytes[id] = std::string(1, *byte);
    else bytes[id] = replaceMetaspace(text);
  }
  return bytes;
}

bool Tokenizer::isSpecial(int32_t id) const { return id >= 0 && id < vocabSize_ && isSpecial_[id]; }

std::string Tokenizer::decode(std::span<const int64_t> ids) const {
  if (bpe_) {
    // HF's ByteLevel decoder: every token's bytes, then one lossy UTF-8 decoding of them all.
    std::string bytes;
    for (int64_t id : ids)
      bytes += id >= 0 && id < vocabSize_ ? bpeTokenBytes_[id] : std::string(kReplacementCharacter);
    return replaceInvalidUtf8(bytes);
  }
  std::string text, byteRun;
  // ByteFallback: a run of byte pieces is one UTF-8 string, or one U+FFFD per byte if it is not one.
  auto flushBytes = [&] {
    if (findInvalidUtf8(byteRun)) {
      for (size_t i = 0; i < byteRun.size(); ++i) text.append(kReplacementCharacter);
    } else {
      text.append(byteRun);
    }
    byteRun.clear();
  };
  for (int64_t id : ids) {
    if (id < 0 || id >= vocabSize_) {
      flushBytes();
      text.append(kReplacementCharacter);
      continue;
    }
    const std::string pieceText = piece(static_cast<int32_t>(id));
    if (std::optional<char> byte = fallbackByte(static_cast<int32_t>(id), pieceText)) {
      byteRun.push_back(*byte);
      continue;
    }
    flushBytes();
    text.append(replaceMetaspace(pieceText));
  }
  flushBytes();
  // A piece itself is valid UTF-8, so this only guards a malformed vocabulary.
  text = withReplacementCharacters(text);
  return json_ ? json_->applyDecoderStrip(std::move(text)) : text;
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view input) const {
  const std::string replaced = replaceInvalidUtf8(input);
  const std::string_view text = replaced;
  if (json_) return json_->encode(text);
  std::vector<int32_t> ids;
  std::vector<int> pieceIds;
  auto encodeSegment = [&](std::string_view segment) {
    if (segment.empty()) return;
    if (bpe_) {
      bpe_->encode(segment, ids);
      return;
    }
    pieceIds.clear();
    const auto status = sp_->Encode(segment, &pieceIds);
    if (!status.ok()) throw RuntimeError(directory_ + ": SentencePiece encoding failed: " + status.ToString());
    ids.insert(ids.end(), pieceIds.begin(), pieceIds.end());
  };
  size_t segmentStart = 0, pos = 0;
  while (pos < text.size()) {
    const auto& group = byFirstByte_[static_cast<unsigned char>(text[pos])];
    const std::pair<std::string, int32_t>* match = nullptr;
    for (const auto& candidate : group) {
      if (text.compare(pos, candidate.first.size(), candidate.first) == 0) {
        match = &candidate;
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    encodeSegment(text.substr(segmentStart, pos - segmentStart));
    ids.push_back(match->second);
    pos += match->first.size();
    segmentStart = pos;
  }
  encodeSegment(text.substr(segmentStart));
  return ids;
}

std::vector<int32_t> Tokenizer::completionTokens(std::string_view text) const {
  std::vector<int32_t> ids = encode(text);
  if (ids.empty() || ids.back() != eos_) ids.push_back(eos_);
  return ids;
}

std::optional<int32_t> Tokenizer::findSpecialTokenId(std::string_view token) const {
  auto it = specials_.find(std::string(token));
  if (it == specials_.end()) return std::nullopt;
  return it->second;
}

int32_t Tokenizer::specialTokenId(std::string_view token) const {
  if (auto id = findSpecialTokenId(token)) return *id;
  throw InputError(file_ + ": the tokenizer has no special token \"" + std::string(token) + "\"");
}

void Tokenizer::checkVocabSize(int64_t modelVocabSize) const {
  if (vocabSize_ > modelVocabSize)
    throw InputError(file_ + ": the tokenizer has " + std::to_string(vocabSize_) +
                     " pieces but the model's vocab_size is " + std::to_string(modelVocabSize));
}

bool holdsTokenizer(const std::string& directory) {
  const std::filesystem::path path(directory);
  auto file = [&](const char* name) { return std::filesystem::is_regular_file(path / name); };
  return file("tokenizer.model") || file("tokenizer.json") || (file("vocab.json") && file("merges.txt"));
}

void checkTokenIds(const std::vector<int32_t>& ids, int64_t vocabSize, const std::string& what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocabSize)
      throw InputError(what + ": token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                       " is out of range for vocab_size " + std::to_string(vocabSize));
  }
}

std::string stripThinking(std::string_view text) {
  // Each "<channel|>" ends a piece; a piece holding "<|channel>" keeps only what comes before it.
  std::string kept;
  constexpr std::string_view kOpen = "<|channel>", kClose = "<channel|>";
  size_t start = 0;
  for (;;) {
    size_t close = text.find(kClose, start);
    std::string_view piece =
        text.substr(start, close == std::string_view::npos ? std::string_view::npos : close - start);
    size_t open = piece.find(kOpen);
    kept += piece.substr(0, open);
    if (close == std::string_view::npos) break;
    start = close + kClose.size();
  }
  return stripPythonWhitespace(kept);
}

std::string renderGemma4PromptText(const Tokenizer& tokenizer, const std::vector<Message>& messages,
                                   const std::vector<int64_t>& imageSoftTokenCounts) {
  size_t images = 0;
  for (const Message& m : messages)
    for (const ContentPart& p : m.content) images += p.kind == ContentPart::Image;
  if (images != imageSoftTokenCounts.size())
    throw InputError("prompt: " + std::to_string(images) + " image parts but " +
                     std::to_string(imageSoftTokenCounts.size()) + " soft-token counts");

  // The Gemma 4 template's rules for text and image parts (tools and reasoning fields aside):
  // model text loses its thought blocks and is trimmed, other text is trimmed; consecutive assistant
  // messages share one model turn; a system message given as a list of parts renders each text part
  // trimmed and followed by a space.
  std::string text = "<bos>";
  size_t image = 0;
  for (size_t index = 0; index < messages.size(); ++index) {
    const Message& m = messages[index];
    const bool isModel = m.role == Message::Assistant;
    const bool continuesPrevious = isModel && index > 0 && messages[index - 1].role == Message::Assistant;
    const bool continuesIntoNext =
        isModel && index + 1 < messages.size() && messages[index + 1].role == Message::Assistant;
    if (!continuesPrevious) {
      text += "<|turn>";
      text += isModel ? "model" : roleName(m.role);
      text += '\n';
    }
    for (const ContentPart& p : m.content) {
      if (p.kind == ContentPart::Text) {
        if (isModel) text += stripThinking(p.text);
        else if (m.role == Message::System && m.contentIsList) text += stripPythonWhitespace(p.text) + " ";
        else text += stripPythonWhitespace(p.text);
        continue;
      }
      const int64_t n = imageSoftTokenCounts[image];
      if (n < 1)
        throw InputError("prompt: image " + std::to_string(image) + " (" + p.imagePath + ") has " + std::to_string(n) +
                         " soft tokens; every image needs at least one");
      text += tokenizer.boiToken();
      for (int64_t i = 0; i < n; ++i) text += tokenizer.imageToken();
      text += tokenizer.eoiToken();
      ++image;
    }
    if (!continuesIntoNext) text += "<turn|>\n";
  }
  text += "<|turn>model\n<|channel>thought\n<channel|>";
  return text;
}

TokenizedPrompt renderGemma4Prompt(const Tokenizer& tokenizer, const std::vector<Message>& messages,
                                   const std::vector<int64_t>& imageSoftTokenCounts) {
  TokenizedPrompt out;
  out.inputIds = tokenizer.encode(renderGemma4PromptText(tokenizer, messages, imageSoftTokenCounts));
  const int32_t imageId = tokenizer.imageTokenId();
  out.mmTokenTypeIds.reserve(out.inputIds.size());
  int64_t imageTokens = 0, expected = 0;
  for (int32_t id : out.inputIds) {
    out.mmTokenTypeIds.push_back(id == imageId ? 1 : 0);
    imageTokens += id == imageId;
  }
  for (int64_t n : imageSoftTokenCounts) expected += n;
  if (imageTokens != expected)
    throw InputError("prompt: " + std::to_string(imageTokens) +
                     " image tokens after template expansion but the images"
                     " give " +
                     std::to_string(expected) + " soft tokens (does message text contain \"" + tokenizer.imageToken() +
                     "\"?)");
  return out;
}

}  // namespace dgemma
