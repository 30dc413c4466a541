#include "runtime/data/pretrain/DataPath.h"

#include <charconv>
#include <cmath>
#include <optional>

#include "support/Error.h"

namespace dgemma {

namespace {

struct Word {
  std::string text;
  size_t column = 0;  // 1-based; 0 when the words came split already
};

std::string where(const std::vector<Word>& words, size_t index) {
  const Word& word = words[index];
  std::string text = "--data-path: word " + std::to_string(index + 1);
  if (word.column > 0) text += " at column " + std::to_string(word.column);
  return text + " ('" + word.text + "')";
}

std::optional<double> parseNumber(const std::string& text) {
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

bool endsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string checkedPrefix(const std::vector<Word>& words, size_t index) {
  const std::string& text = words[index].text;
  if (parseNumber(text)) throw InputError(where(words, index) + ": expected a dataset prefix, got a number");
  // A frequent slip: naming one of the two files instead of their common prefix.
  for (const char* suffix : {".bin", ".idx"})
    if (endsWith(text, suffix))
      throw InputError(where(words, index) + ": expected the prefix of PREFIX.bin and PREFIX.idx, without '" + suffix +
                       "'");
  return text;
}

std::vector<DataPathEntry> parseWords(const std::vector<Word>& words) {
  if (words.empty()) throw InputError("--data-path: expected a dataset prefix or weight-prefix pairs, got nothing");
  if (words.size() == 1) return {{1.0, checkedPrefix(words, 0)}};
  std::vector<DataPathEntry> entries;
  for (size_t index = 0; index < words.size(); index += 2) {
    const std::optional<double> weight = parseNumber(words[index].text);
    if (!weight)
      throw InputError(where(words, index) +
                       ": expected a weight (a number > 0) before each prefix; several prefixes are given as "
                       "weight-prefix pairs, e.g. '0.7 A 0.3 B'");
    if (!std::isfinite(*weight) || *weight <= 0)
      throw InputError(where(words, index) + ": expected a weight > 0 (a finite number)");
    if (index + 1 == words.size())
      throw InputError(where(words, index) + ": expected a dataset prefix after this weight, got the end");
    entries.push_back({*weight, checkedPrefix(words, index + 1)});
  }
  return entries;
}

}  // namespace

std::vector<DataPathEntry> parseDataPath(const std::vector<std::string>& words) {
  std::vector<Word> located;
  for (const std::string& word : words) located.push_back({word, 0});
  return parseWords(located);
}

std::vector<DataPathEntry> parseDataPath(const std::string& text) {
  std::vector<Word> words;
  size_t position = 0;
  auto isSpace = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (position < text.size()) {
    while (position < text.size() && isSpace(text[position])) ++position;
    const size_t start = position;
    while (position < text.size() && !isSpace(text[position])) ++position;
    if (position > start) words.push_back({text.substr(start, position - start), start + 1});
  }
  return parseWords(words);
}

}  // namespace dgemma
