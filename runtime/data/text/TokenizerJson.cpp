#include "runtime/data/text/TokenizerJson.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>
#include <utility>

#include "runtime/data/text/BpeMerges.h"
#include "support/Error.h"
#include "support/InputFile.h"
#include "support/Json.h"

namespace dgemma {
namespace {

using nlohmann::json;

// Length of the UTF-8 character at text[pos] (1 for a malformed byte, so that any input is handled).
size_t charLen(std::string_view text, size_t pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  size_t len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 1;
  if (pos + len > text.size()) return 1;
  for (size_t i = 1; i < len; ++i)
    if ((static_cast<unsigned char>(text[pos + i]) & 0xC0) != 0x80) return 1;
  return len;
}

uint32_t codepointAt(std::string_view text, size_t pos, size_t len) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (len == 1) return b0;
  uint32_t cp = len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  return cp;
}

// Rust's char::is_whitespace (Unicode White_Space).
bool isRustWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// A "word" character for single_word added tokens (HF: regex \w, i.e. letters, marks, decimal digits,
// connector punctuation and the joiners). Outside ASCII this is an approximation by ranges: the
// letters and digits of Latin-1, the Latin, Greek, Cyrillic, Armenian, Hebrew, Arabic, Indic, Thai,
// Hangul, kana and CJK blocks and the full-width forms, the main combining-mark blocks, U+200C/D and
// U+203F/40; other punctuation, symbols, emoji and whitespace are not word characters.
bool isWordChar(uint32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  static constexpr std::pair<uint32_t, uint32_t> kRanges[] = {
      {0xAA, 0xAA},       {0xB2, 0xB3},       {0xB5, 0xB5},       {0xB9, 0xBA},       {0xBC, 0xBE},
      {0xC0, 0xD6},       {0xD8, 0xF6},       {0xF8, 0x2C1},      {0x2C6, 0x2D1},     {0x2E0, 0x2E4},
      {0x370, 0x374},     {0x376, 0x37D},     {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x3F5},
      {0x3F7, 0x481},     {0x48A, 0x52F},     {0x531, 0x556},     {0x560, 0x588},     {0x5D0, 0x5EA},
      {0x620, 0x64A},     {0x660, 0x669},     {0x671, 0x6D3},     {0x6F0, 0x6FC},     {0x904, 0x939},
      {0x966, 0x96F},     {0xE01, 0xE30},     {0xE50, 0xE59},     {0x10A0, 0x10FF},   {0x1100, 0x11FF},
      {0x1E00, 0x1FBC},   {0x2070, 0x2071},   {0x2074, 0x2079},   {0x207F, 0x2089},   {0x2090, 0x209C},
      {0x2160, 0x2188},   {0x2460, 0x249B},   {0x3005, 0x3007},   {0x3021, 0x3029},   {0x3041, 0x3096},
      {0x309D, 0x309F},   {0x30A1, 0x30FA},   {0x30FC, 0x30FF},   {0x3131, 0x318E},   {0x3400, 0x4DBF},
      {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3},   {0xF900, 0xFAFF},   {0xFF10, 0xFF19},   {0xFF21, 0xFF3A},
      {0xFF41, 0xFF5A},   {0xFF66, 0xFFDC},   {0x20000, 0x3134A}, {0x300, 0x36F},     {0x483, 0x489},
      {0x591, 0x5BD},     {0x610, 0x61A},     {0x64B, 0x65F},     {0x900, 0x903},     {0x93A, 0x94F},
      {0x1AB0, 0x1AFF},   {0x1DC0, 0x1DFF},   {0x200C, 0x200D},   {0x203F, 0x2040},   {0x20D0, 0x20FF},
      {0xFE20, 0xFE2F},   {0xFF3F, 0xFF3F}};
  for (const auto& [lo, hi] : kRanges)
    if (c >= lo && c <= hi) return true;
  return false;
}

uint32_t lastChar(std::string_view s) {
  size_t lead = s.size() - 1;
  while (lead > 0 && (static_cast<unsigned char>(s[lead]) & 0xC0) == 0x80 && s.size() - lead < 4) --lead;
  size_t len = charLen(s, lead);
  if (lead + len != s.size()) return static_cast<unsigned char>(s.back());
  return codepointAt(s, lead, len);
}

std::string replaceAll(std::string_view s, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(s);
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// HF's Split with a literal pattern: the pieces of `s` (non-empty) for one delimiter behaviour.
std::vector<std::string> splitLiteral(const std::string& s, const std::string& pattern, SplitBehavior behavior) {
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> matches;
  if (pattern.empty()) {
    matches.push_back({{0, s.size()}, false});
  } else {
    size_t prev = 0;
    while (true) {
      size_t hit = s.find(pattern, prev);
      if (hit == std::string::npos) break;
      if (hit > prev) matches.push_back({{prev, hit}, false});
      matches.push_back({{hit, hit + pattern.size()}, true});
      prev = hit + pattern.size();
    }
    if (prev < s.size() || matches.empty()) matches.push_back({{prev, s.size()}, false});
  }
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> pieces;
  bool previousMatch = false;
  switch (behavior) {
    case SplitBehavior::Removed:
      for (const auto& m : matches)
        if (!m.second) pieces.push_back(m);
      break;
    case SplitBehavior::Isolated:
      pieces = matches;
      break;
    case SplitBehavior::MergedWithPrevious:
      for (const auto& m : matches) {
        if (m.second && !previousMatch) {
          if (!pieces.empty()) pieces.back().first.second = m.first.second;
          else pieces.push_back({m.first, true});
        } else {
          pieces.push_back({m.first, false});
        }
        previousMatch = m.second;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (auto it = matches.rbegin(); it != matches.rend(); ++it) {
        if (it->second && !previousMatch) {
          if (!pieces.empty()) pieces.back().first.first = it->first.first;
          else pieces.push_back({it->first, true});
        } else {
          pieces.push_back({it->first, false});
        }
        previousMatch = it->second;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    case SplitBehavior::Contiguous:
      for (const auto& m : matches) {
        if (m.second == previousMatch && !pieces.empty()) pieces.back().first.second = m.first.second;
        else pieces.push_back({m.first, false});
        previousMatch = m.second;
      }
      break;
  }
  std::vector<std::string> out;
  for (const auto& p : pieces)
    if (p.first.second > p.first.first) out.push_back(s.substr(p.first.first, p.first.second - p.first.first));
  return out;
}

// Located JSON validation: every error reads "FILE: JSON.PATH: expected ...".
struct Checker {
  std::string file;

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw InputError(file + ": " + path + ": " + what);
  }
  // Never dumps the value: a file's value can be large (support/Json.h, describeJsonValue).
  static std::string describe(const json& j) { return std::string(j.type_name()) + " " + describeJsonValue(j); }
  const json& field(const json& obj, const std::string& path, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail(path + "." + key, "expected a value, but the key is missing");
    return *it;
  }
  const json& object(const json& obj, const std::string& path, const char* key) const {
    const json& j = field(obj, path, key);
    if (!j.is_object()) fail(path + "." + key, "expected an object, got " + describe(j));
    return j;
  }
  std::string string(const json& j, const std::string& path) const {
    if (!j.is_string()) fail(path, "expected a string, got " + describe(j));
    return j.get<std::string>();
  }
  std::string string(const json& obj, const std::string& path, const char* key) const {
    return string(field(obj, path, key), path + "." + key);
  }
  bool boolean(const json& obj, const std::string& path, const char* key, bool fallback) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(path + "." + key, "expected a boolean, got " + describe(*it));
    return it->get<bool>();
  }
  int32_t id(const json& j, const std::string& path) const {
    if (!j.is_number_integer() || j.get<int64_t>() < 0 || j.get<int64_t>() > INT32_MAX)
      fail(path, "expected a non-negative integer id, got " + describe(j));
    return static_cast<int32_t>(j.get<int64_t>());
  }
  // A {"String": "..."} pattern; {"Regex": ...} is not supported.
  std::string literalPattern(const json& obj, const std::string& path) const {
    const json& p = object(obj, path, "pattern");
    if (p.contains("Regex"))
      fail(path + ".pattern", "regex patterns are not supported by dgemma (only {\"String\": ...})");
    if (!p.contains("String")) fail(path + ".pattern", "expected {\"String\": ...}, got " + describe(p));
    return string(p["String"], path + ".pattern.String");
  }
};

}  // namespace

struct TokenizerJson::Impl {
  struct Normalizer {
    enum Kind { Replace, Prepend } kind;
    std::string pattern, content;  // Replace: pattern -> content; Prepend: content
  };
  struct PreTokenizer {
    enum Kind { Split, Metaspace } kind;
    std::string pattern;  // Split
    SplitBehavior behavior = SplitBehavior::Isolated;
    std::string replacement;  // Metaspace
    enum Scheme { Always, First, Never } scheme = Always;
    bool split = true;
  };

  std::vector<AddedToken> added;
  std::vector<std::string> tokens;  // by id: the added token's content, else the vocabulary entry
  int64_t decoderStripStart = 0, decoderStripStop = 0;  // the decoder's Strip of " "
  std::string unsupportedDecoder;                       // why decode() cannot follow the decoder
  std::unordered_map<std::string, int32_t> addedIds;
  // Added tokens matched in the raw text (normalized=false) and in normalized text (their content
  // normalized), grouped by first byte, longest first.
  std::vector<std::vector<std::pair<std::string, size_t>>> rawTrie, normTrie;
  bool hasNormTokens = false;
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> preTokenizers;
  std::unordered_map<std::string, int32_t> vocab;
  BpeMerges merges;
  std::optional<int32_t> unkId;
  bool fuseUnk = false, byteFallback = false, ignoreMerges = false;
  int32_t byteIds[256];
  int64_t vocabSize = 0;

  std::string normalize(std::string s) const {
    for (const Normalizer& n : normalizers) {
      if (n.kind == Normalizer::Replace) s = replaceAll(s, n.pattern, n.content);
      else if (!s.empty()) s = n.content + s;
    }
    return s;
  }

  struct Piece {
    std::string_view text;
    int32_t id;  // -1: not an added token
  };

  // HF AddedVocabulary::find_matches over `s`.
  std::vector<Piece> findMatches(std::string_view s, const std::vector<std::vector<std::pair<std::string, size_t>>>& trie) const {
    std::vector<Piece> out;
    size_t startOffset = 0, pos = 0;
    while (pos < s.size()) {
      const std::pair<std::string, size_t>* match = nullptr;
      for (const auto& c : trie[static_cast<unsigned char>(s[pos])])
        if (s.compare(pos, c.first.size(), c.first) == 0) {
          match = &c;
          break;
        }
      if (match == nullptr) {
        ++pos;
        continue;
      }
      const AddedToken& token = added[match->second];
      size_t start = pos, stop = pos + match->first.size();
      pos = stop;
      if (token.singleWord) {
        const bool startSpace = start == 0 || !isWordChar(lastChar(s.substr(0, start)));
        const bool stopSpace = stop == s.size() || !isWordChar(codepointAt(s, stop, charLen(s, stop)));
        if (!startSpace || !stopSpace) continue;
      }
      if (token.lstrip) {
        size_t newStart = start;
        while (newStart > 0) {
          size_t lead = newStart - 1;
          while (lead > 0 && (static_cast<unsigned char>(s[lead]) & 0xC0) == 0x80 && newStart - lead < 4) --lead;
          size_t len = charLen(s, lead);
          if (lead + len != newStart || !isRustWhitespace(codepointAt(s, lead, len))) break;
          newStart = lead;
        }
        start = std::max(newStart, startOffset);
      }
      if (token.rstrip) {
        while (stop < s.size()) {
          size_t len = charLen(s, stop);
          if (!isRustWhitespace(codepointAt(s, stop, len))) break;
          stop += len;
        }
        pos = stop;
      }
      if (startOffset < start) out.push_back({s.substr(startOffset, start - startOffset), -1});
      out.push_back({s.substr(start, stop - start), token.id});
      startOffset = stop;
    }
    if (startOffset < s.size()) out.push_back({s.substr(startOffset), -1});
    return out;
  }

  std::vector<std::string> preTokenize(const std::string& s, bool atOriginalStart) const {
    std::vector<std::string> pieces{s};
    for (const PreTokenizer& p : preTokenizers) {
      std::vector<std::string> next;
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (p.kind == PreTokenizer::Split) {
          for (std::string& q : splitLiteral(pieces[i], p.pattern, p.behavior)) next.push_back(std::move(q));
          continue;
        }
        std::string q = replaceAll(pieces[i], " ", p.replacement);
        const bool startsWith = q.compare(0, p.replacement.size(), p.replacement) == 0;
        if (!startsWith && (p.scheme == PreTokenizer::Always || (p.scheme == PreTokenizer::First && i == 0 && atOriginalStart)))
          q = p.replacement + q;
        if (p.split) {
          for (std::string& r : splitLiteral(q, p.replacement, SplitBehavior::MergedWithNext)) next.push_back(std::move(r));
        } else if (!q.empty()) {
          next.push_back(std::move(q));
        }
      }
      pieces = std::move(next);
    }
    return pieces;
  }

  void bpe(std::string_view word, std::vector<int32_t>& ids) const {
    if (word.empty()) return;
    if (ignoreMerges) {
      auto it = vocab.find(std::string(word));
      if (it != vocab.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    std::vector<int32_t> symbols;
    int32_t pendingUnk = -1;  // an unknown (fused) not yet added
    for (size_t pos = 0; pos < word.size();) {
      const size_t len = charLen(word, pos);
      const std::string ch(word.substr(pos, len));
      pos += len;
      auto it = vocab.find(ch);
      if (it != vocab.end()) {
        if (pendingUnk >= 0) symbols.push_back(pendingUnk), pendingUnk = -1;
        symbols.push_back(it->second);
        continue;
      }
      if (byteFallback) {
        bool all = true;
        for (char b : ch) all = all && byteIds[static_cast<unsigned char>(b)] >= 0;
        if (all) {
          // As HF does, a pending unknown is not flushed before the byte pieces.
          for (char b : ch) symbols.push_back(byteIds[static_cast<unsigned char>(b)]);
          continue;
        }
      }
      if (unkId) {
        if (pendingUnk >= 0 && !fuseUnk) symbols.push_back(pendingUnk);
        pendingUnk = *unkId;
      }
    }
    if (pendingUnk >= 0) symbols.push_back(pendingUnk);

    merges.apply(symbols, ids);
  }
};

// A regular file, nesting bounded (support/InputFile.h, support/Json.h).
TokenizerJson::TokenizerJson(const std::string& path) : TokenizerJson(path, parseJson(readRegularFile(path), path)) {}

TokenizerJson::TokenizerJson(const std::string& path, const json& root) : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  const Checker c{path};
  if (!root.is_object()) c.fail("(root)", "expected an object, got " + Checker::describe(root));

  // model
  const json& model = c.object(root, "(root)", "model");
  const std::string modelType = model.contains("type") ? c.string(model, "model", "type") : "BPE";
  if (modelType != "BPE")
    c.fail("model.type", "the model type " + quoteForMessage(modelType) + " is not supported by dgemma (only BPE)");
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0))
    c.fail("model.dropout", "BPE dropout is not supported by dgemma (expected null), got " + Checker::describe(*it));
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto it = model.find(key); it != model.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      c.fail(std::string("model.") + key, "is not supported by dgemma (expected null), got " + Checker::describe(*it));
  const json& vocab = c.object(model, "model", "vocab");
  for (const auto& [piece, id] : vocab.items()) {
    const int32_t value = c.id(id, "model.vocab[" + json(piece).dump() + "]");
    d.vocab[piece] = value;
    d.vocabSize = std::max<int64_t>(d.vocabSize, int64_t{value} + 1);
  }
  const json& merges = c.field(model, "model", "merges");
  if (!merges.is_array()) c.fail("model.merges", "expected an array, got " + Checker::describe(merges));
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string at = "model.merges[" + std::to_string(i) + "]";
    const json& m = merges[i];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        c.fail(at, "expected \"LEFT RIGHT\" (two pieces separated by one space), got " + Checker::describe(m));
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      c.fail(at, "expected [\"LEFT\", \"RIGHT\"] or \"LEFT RIGHT\", got " + Checker::describe(m));
    }
    auto ia = d.vocab.find(a), ib = d.vocab.find(b), inew = d.vocab.find(a + b);
    if (ia == d.vocab.end()) c.fail(at, "the piece " + json(a).dump() + " is not in model.vocab");
    if (ib == d.vocab.end()) c.fail(at, "the piece " + json(b).dump() + " is not in model.vocab");
    if (inew == d.vocab.end()) c.fail(at, "the merged piece " + json(a + b).dump() + " is not in model.vocab");
    d.merges.add(ia->second, ib->second, static_cast<int32_t>(i), inew->second);
  }
  if (auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    const std::string unk = c.string(*it, "model.unk_token");
    auto v = d.vocab.find(unk);
    if (v == d.vocab.end()) c.fail("model.unk_token", "the unknown token " + json(unk).dump() + " is not in model.vocab");
    d.unkId = v->second;
  }
  d.fuseUnk = c.boolean(model, "model", "fuse_unk", false);
  d.byteFallback = c.boolean(model, "model", "byte_fallback", false);
  d.ignoreMerges = c.boolean(model, "model", "ignore_merges", false);
  for (int b = 0; b < 256; ++b) {
    static const char* hex = "0123456789ABCDEF";
    const std::string piece = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
    auto it = d.vocab.find(piece);
    d.byteIds[b] = it == d.vocab.end() ? -1 : it->second;
  }

  // normalizer
  std::function<void(const json&, const std::string&)> addNormalizer = [&](const json& n, const std::string& at) {
    if (n.is_null()) return;
    if (!n.is_object()) c.fail(at, "expected an object or null, got " + Checker::describe(n));
    const std::string type = c.string(n, at, "type");
    if (type == "Sequence") {
      const json& list = c.field(n, at, "normalizers");
      if (!list.is_array()) c.fail(at + ".normalizers", "expected an array, got " + Checker::describe(list));
      for (size_t i = 0; i < list.size(); ++i) addNormalizer(list[i], at + ".normalizers[" + std::to_string(i) + "]");
    } else if (type == "Replace") {
      d.normalizers.push_back({Impl::Normalizer::Replace, c.literalPattern(n, at), c.string(n, at, "content")});
    } else if (type == "Prepend") {
      d.normalizers.push_back({Impl::Normalizer::Prepend, "", c.string(n, at, "prepend")});
    } else {
      c.fail(at + ".type", "the normalizer type \"" + type +
                               "\" is not supported by dgemma (supported: Replace with a String pattern, Prepend, Sequence)");
    }
  };
  if (auto it = root.find("normalizer"); it != root.end()) addNormalizer(*it, "normalizer");

  // pre_tokenizer
  std::function<void(const json&, const std::string&)> addPreTokenizer = [&](const json& p, const std::string& at) {
    if (p.is_null()) return;
    if (!p.is_object()) c.fail(at, "expected an object or null, got " + Checker::describe(p));
    const std::string type = c.string(p, at, "type");
    Impl::PreTokenizer step{};
    if (type == "Sequence") {
      const json& list = c.field(p, at, "pretokenizers");
      if (!list.is_array()) c.fail(at + ".pretokenizers", "expected an array, got " + Checker::describe(list));
      for (size_t i = 0; i < list.size(); ++i) addPreTokenizer(list[i], at + ".pretokenizers[" + std::to_string(i) + "]");
      return;
    } else if (type == "Split") {
      step.kind = Impl::PreTokenizer::Split;
      step.pattern = c.literalPattern(p, at);
      const std::string behavior = c.string(p, at, "behavior");
      if (behavior == "Removed") step.behavior = SplitBehavior::Removed;
      else if (behavior == "Isolated") step.behavior = SplitBehavior::Isolated;
      else if (behavior == "MergedWithPrevious") step.behavior = SplitBehavior::MergedWithPrevious;
      else if (behavior == "MergedWithNext") step.behavior = SplitBehavior::MergedWithNext;
      else if (behavior == "Contiguous") step.behavior = SplitBehavior::Contiguous;
      else c.fail(at + ".behavior", "expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous, got " +
                                        json(behavior).dump());
      if (c.boolean(p, at, "invert", false)) c.fail(at + ".invert", "invert: true is not supported by dgemma");
    } else if (type == "Metaspace") {
      step.kind = Impl::PreTokenizer::Metaspace;
      step.replacement = c.string(p, at, "replacement");
      if (step.replacement.empty() || charLen(step.replacement, 0) != step.replacement.size())
        c.fail(at + ".replacement", "expected one character, got " + json(step.replacement).dump());
      std::string scheme = "always";
      if (auto it = p.find("prepend_scheme"); it != p.end() && !it->is_null()) scheme = c.string(*it, at + ".prepend_scheme");
      else if (!c.boolean(p, at, "add_prefix_space", true)) scheme = "never";
      if (scheme == "always") step.scheme = Impl::PreTokenizer::Always;
      else if (scheme == "first") step.scheme = Impl::PreTokenizer::First;
      else if (scheme == "never") step.scheme = Impl::PreTokenizer::Never;
      else c.fail(at + ".prepend_scheme", "expected always, first or never, got " + json(scheme).dump());
      step.split = c.boolean(p, at, "split", true);
    } else {
      c.fail(at + ".type",
             "the pre-tokenizer type \"" + type +
                 "\" is not supported by dgemma (supported: Split with a String pattern, Metaspace, Sequence)");
    }
    d.preTokenizers.push_back(std::move(step));
  };
  if (auto it = root.find("pre_tokenizer"); it != root.end()) addPreTokenizer(*it, "pre_tokenizer");

  // decoder: only read for decode(); a file whose decoder dgemma does not implement still encodes.
  auto readDecoderStep = [&](const json& step, const std::string& at) {
    const std::string type = step.is_object() && step.contains("type") && step["type"].is_string() ? step["type"].get<std::string>() : "";
    const bool metaspaceToSpace = type == "Replace" && step.value("content", json()) == " " &&
                                  step.value("pattern", json()).value("String", json()) == "\u2581";
    if (type == "Strip" && step.value("content", json()) == " " && step.value("start", json()).is_number_unsigned() &&
        step.value("stop", json()).is_number_unsigned()) {
      d.decoderStripStart = step["start"].get<int64_t>();
      d.decoderStripStop = step["stop"].get<int64_t>();
    } else if (!metaspaceToSpace && type != "ByteFallback" && type != "Fuse") {
      d.unsupportedDecoder = path + ": " + at + ": the decoder step " + (type.empty() ? step.dump() : "\"" + type + "\"") +
                             " is not supported by dgemma (supported: Replace \"\u2581\" with \" \", ByteFallback, Fuse, Strip of \" \")";
    }
  };
  if (auto it = root.find("decoder"); it != root.end() && !it->is_null()) {
    if (it->is_object() && it->value("type", json()) == "Sequence" && it->value("decoders", json()).is_array()) {
      const json& steps = (*it)["decoders"];
      for (size_t i = 0; i < steps.size(); ++i) readDecoderStep(steps[i], "decoder.decoders[" + std::to_string(i) + "]");
    } else {
      readDecoderStep(*it, "decoder");
    }
  }

  // added_tokens
  d.rawTrie.resize(256);
  d.normTrie.resize(256);
  if (auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) c.fail("added_tokens", "expected an array, got " + Checker::describe(*it));
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string at = "added_tokens[" + std::to_string(i) + "]";
      const json& t = (*it)[i];
      if (!t.is_object()) c.fail(at, "expected an object, got " + Checker::describe(t));
      AddedToken token;
      token.id = c.id(c.field(t, at, "id"), at + ".id");
      token.content = c.string(t, at, "content");
      token.special = c.boolean(t, at, "special", false);
      token.normalized = c.boolean(t, at, "normalized", !token.special);
      token.lstrip = c.boolean(t, at, "lstrip", false);
      token.rstrip = c.boolean(t, at, "rstrip", false);
      token.singleWord = c.boolean(t, at, "single_word", false);
      if (token.content.empty()) c.fail(at + ".content", "expected a non-empty string");
      // As in HF, an added token whose content is a vocabulary entry takes that entry's id.
      if (auto v = d.vocab.find(token.content); v != d.vocab.end()) token.id = v->second;
      d.vocabSize = std::max<int64_t>(d.vocabSize, int64_t{token.id} + 1);
      d.addedIds[token.content] = token.id;
      const size_t index = d.added.size();
      d.added.push_back(token);
      if (token.normalized) {
        const std::string normalized = d.normalize(token.content);
        if (!normalized.empty()) {
          d.normTrie[static_cast<unsigned char>(normalized[0])].emplace_back(normalized, index);
          d.hasNormTokens = true;
        }
      } else {
        d.rawTrie[static_cast<unsigned char>(token.content[0])].emplace_back(token.content, index);
      }
    }
  }
  for (auto* trie : {&d.rawTrie, &d.normTrie})
    for (auto& group : *trie)
      std::stable_sort(group.begin(), group.end(),
                       [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  // Ids back to tokens, for decoding: added tokens win over a vocabulary entry of the same id, as
  // in tokenizers.
  d.tokens.assign(d.vocabSize, "");
  for (const auto& [piece, id] : d.vocab) d.tokens[id] = piece;
  for (const AddedToken& token : d.added) d.tokens[token.id] = token.content;
}

TokenizerJson::~TokenizerJson() = default;
TokenizerJson::TokenizerJson(TokenizerJson&&) noexcept = default;
TokenizerJson& TokenizerJson::operator=(TokenizerJson&&) noexcept = default;

std::vector<int32_t> TokenizerJson::encode(std::string_view text) const {
  const Impl& d = *impl_;
  std::vector<int32_t> ids;
  const char* const base = text.data();
  for (const Impl::Piece& raw : d.findMatches(text, d.rawTrie)) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      continue;
    }
    const bool atStart = raw.text.data() == base;
    const std::string normalized = d.normalize(std::string(raw.text));
    std::vector<Impl::Piece> pieces =
        d.hasNormTokens ? d.findMatches(normalized, d.normTrie) : std::vector<Impl::Piece>{{normalized, -1}};
    for (const Impl::Piece& piece : pieces) {
      if (piece.id >= 0) {
        ids.push_back(piece.id);
        continue;
      }
      const bool first = atStart && piece.text.data() == normalized.data();
      for (const std::string& word : d.preTokenize(std::string(piece.text), first)) d.bpe(word, ids);
    }
  }
  return ids;
}

const std::vector<TokenizerJson::AddedToken>& TokenizerJson::addedTokens() const { return impl_->added; }

int32_t TokenizerJson::tokenToId(std::string_view token) const {
  const std::string key(token);
  if (auto it = impl_->addedIds.find(key); it != impl_->addedIds.end()) return it->second;
  if (auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return -1;
}

int64_t TokenizerJson::vocabSize() const { return impl_->vocabSize; }

std::string TokenizerJson::applyDecoderStrip(std::string text) const {
  if (!impl_->unsupportedDecoder.empty()) throw InputError(impl_->unsupportedDecoder);
  int64_t start = 0, stop = 0;
  while (start < impl_->decoderStripStart && start < static_cast<int64_t>(text.size()) && text[start] == ' ') ++start;
  text.erase(0, start);
  while (stop < impl_->decoderStripStop && !text.empty() && text.back() == ' ') {
    text.pop_back();
    ++stop;
  }
  return text;
}

std::string TokenizerJson::idToToken(int32_t id) const {
  return id >= 0 && id < static_cast<int64_t>(impl_->tokens.size()) ? impl_->tokens[id] : std::string();
}

}  // namespace dgemma
