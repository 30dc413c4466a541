#include "runtime/serve/constrain/Regex.h"

#include <cctype>

#include "support/Error.h"

namespace dgemma::serve {
namespace {

// A set of UTF-8 characters: ASCII ones listed, multi-byte ones all or none.
struct CharSet {
  ByteSet ascii;
  bool multiByte = false;

  void add(const CharSet& other) {
    ascii |= other.ascii;
    multiByte = multiByte || other.multiByte;
  }
  CharSet negated() const {
    CharSet result;
    for (int b = 0; b < 0x80; ++b) result.ascii[b] = !ascii[b];
    result.multiByte = !multiByte;
    return result;
  }
  ByteExpr expr() const { return ByteExpr::utf8Char(ascii, multiByte); }
};

CharSet asciiSet(std::string_view chars) {
  CharSet set;
  for (char c : chars) set.ascii.set(static_cast<uint8_t>(c));
  return set;
}

CharSet asciiRange(char first, char last) {
  CharSet set;
  for (int c = first; c <= last; ++c) set.ascii.set(c);
  return set;
}

CharSet digitSet() { return asciiRange('0', '9'); }
CharSet wordSet() {
  CharSet set = asciiRange('a', 'z');
  set.add(asciiRange('A', 'Z'));
  set.add(digitSet());
  set.add(asciiSet("_"));
  return set;
}
CharSet spaceSet() { return asciiSet(" \t\n\r\f\v"); }

// The length of the well-formed UTF-8 sequence at text[pos]; 0 if it is not one.
size_t utf8Length(std::string_view text, size_t pos) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  const size_t length = b0 < 0x80                  ? 1
                        : b0 >= 0xC2 && b0 <= 0xDF ? 2
                        : b0 >= 0xE0 && b0 <= 0xEF ? 3
                        : b0 >= 0xF0 && b0 <= 0xF4 ? 4
                                                   : 0;
  if (length == 0 || pos + length > text.size()) return 0;
  if (length == 1) return 1;
  const auto b1 = static_cast<uint8_t>(text[pos + 1]);
  if ((b0 == 0xE0 && b1 < 0xA0) || (b0 == 0xED && b1 > 0x9F) || (b0 == 0xF0 && b1 < 0x90) || (b0 == 0xF4 && b1 > 0x8F))
    return 0;
  for (size_t i = 1; i < length; ++i)
    if ((static_cast<uint8_t>(text[pos + i]) & 0xC0) != 0x80) return 0;
  return length;
}

// Deeper nesting would only serve to exhaust the parser's stack.
constexpr int kMaxGroupDepth = 64;

class RegexParser {
 public:
  RegexParser(const std::string& pattern, const std::string& where) : text_(pattern), where_(where) {}

  ByteExpr parse() {
    size_t end = text_.size();
    if (!text_.empty() && text_[0] == '^') pos_ = 1;
    // A trailing $ is an anchor unless it is escaped (an odd number of backslashes before it).
    if (end > pos_ && text_[end - 1] == '$') {
      size_t backslashes = 0;
      while (end - 1 - backslashes > pos_ && text_[end - 2 - backslashes] == '\\') ++backslashes;
      if (backslashes % 2 == 0) --end;
    }
    end_ = end;
    ByteExpr expr = alternation();
    if (pos_ < end_) fail(pos_, text_[pos_] == ')' ? "unmatched ')'" : "unexpected character");
    return expr;
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& message) const {
    throw InputError(where_ + ": at offset " + std::to_string(at) + ": " + message);
  }
  bool atEnd() const { return pos_ >= end_; }
  char peek() const { return text_[pos_]; }

  ByteExpr alternation() {
    std::vector<ByteExpr> choices{concatenation()};
    while (!atEnd() && peek() == '|') {
      ++pos_;
      choices.push_back(concatenation());
    }
    return ByteExpr::alternation(std::move(choices));
  }

  ByteExpr concatenation() {
    std::vector<ByteExpr> parts;
    while (!atEnd() && peek() != '|' && peek() != ')') parts.push_back(quantified());
    return ByteExpr::sequence(std::move(parts));
  }

  ByteExpr quantified() {
    ByteExpr atom = this->atom();
    if (atEnd()) return atom;
    const size_t at = pos_;
    int64_t min = 0;
    std::optional<int64_t> max;
    switch (peek()) {
      case '*': ++pos_; break;
      case '+':
        ++pos_;
        min = 1;
        break;
      case '?':
        ++pos_;
        max = 1;
        break;
      case '{': std::tie(min, max) = braces(); break;
      default: return atom;
    }
    if (!atEnd() && peek() == '?') ++pos_;  // lazy: the same language
    if (!atEnd() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{'))
      fail(pos_, "a quantifier cannot follow the quantifier at offset " + std::to_string(at));
    return ByteExpr::repetition(std::move(atom), min, max);
  }

  int64_t number() {
    const size_t start = pos_;
    int64_t value = 0;
    while (!atEnd() && std::isdigit(static_cast<unsigned char>(peek()))) {
      value = value * 10 + (peek() - '0');
      if (value > kMaxRegexRepetition) fail(start, "repetition count above " + std::to_string(kMaxRegexRepetition));
      ++pos_;
    }
    if (pos_ == start) fail(start, "expected a repetition {m}, {m,} or {m,n}");
    return value;
  }

  std::pair<int64_t, std::optional<int64_t>> braces() {
    const size_t open = pos_++;
    const int64_t min = number();
    std::optional<int64_t> max = min;
    if (!atEnd() && peek() == ',') {
      ++pos_;
      max = std::nullopt;
      if (!atEnd() && peek() != '}') max = number();
    }
    if (atEnd() || peek() != '}') fail(open, "expected a repetition {m}, {m,} or {m,n}");
    ++pos_;
    if (max && *max < min) fail(open, "repetition {m,n} with n below m");
    return {min, max};
  }

  ByteExpr atom() {
    const size_t at = pos_;
    const char c = peek();
    switch (c) {
      case '(': {
        if (++groupDepth_ > kMaxGroupDepth) fail(at, "groups nested deeper than " + std::to_string(kMaxGroupDepth));
        ++pos_;
        if (!atEnd() && peek() == '?') {
          if (pos_ + 1 < end_ && text_[pos_ + 1] == ':') pos_ += 2;
          else fail(at, "only the groups ( ) and (?: ) are supported");
        }
        ByteExpr inner = alternation();
        if (atEnd() || peek() != ')') fail(at, "unclosed group");
        ++pos_;
        --groupDepth_;
        return inner;
      }
      case '[': return characterClass().expr();
      case '.': ++pos_; return asciiSet("\n").negated().expr();
      case '\\': return escape().expr();
      case '*':
      case '+':
      case '?':
      case '{': fail(at, "nothing to repeat");
      case '^':
      case '$': fail(at, "^ and $ are accepted only at the very start and end of the pattern");
      default: {
        const size_t length = utf8Length(text_, pos_);
        if (length == 0) fail(at, "the pattern is not well-formed UTF-8");
        pos_ += length;
        return ByteExpr::literal(std::string_view(text_).substr(at, length));
      }
    }
  }

  // At a backslash: the set the escape stands for.
  CharSet escape() {
    const size_t at = pos_++;
    if (atEnd()) fail(at, "the pattern ends in a backslash");
    const char c = text_[pos_++];
    switch (c) {
      case 'd': return digitSet();
      case 'D': return digitSet().negated();
      case 'w': return wordSet();
      case 'W': return wordSet().negated();
      case 's': return spaceSet();
      case 'S': return spaceSet().negated();
      case 'n': return asciiSet("\n");
      case 't': return asciiSet("\t");
      case 'r': return asciiSet("\r");
      case 'f': return asciiSet("\f");
      case 'v': return asciiSet("\v");
      case '0': return asciiSet(std::string_view("\0", 1));
      case 'x': {
        auto hex = [](char h) { return std::isxdigit(static_cast<unsigned char>(h)) != 0; };
        if (pos_ + 2 > end_ || !hex(text_[pos_]) || !hex(text_[pos_ + 1])) fail(at, "expected \\xHH");
        const int value = std::stoi(text_.substr(pos_, 2), nullptr, 16);
        if (value >= 0x80) fail(at, "\\xHH above 7F is not supported (write the character as UTF-8)");
        pos_ += 2;
        CharSet set;
        set.ascii.set(value);
        return set;
      }
      default:
        if (static_cast<uint8_t>(c) < 0x80 && std::ispunct(static_cast<unsigned char>(c)))
          return asciiSet(std::string(1, c));
        fail(at, std::string("unsupported escape \\") + c);
    }
  }

  // One member of a class: a character or an escape, as a set, and the character itself when it is
  // a single ASCII character (a possible range end).
  std::pair<CharSet, std::optional<char>> classMember() {
    const size_t at = pos_;
    if (peek() == '\\') {
      const bool single = pos_ + 1 < end_ && std::string_view("dDwWsS").find(text_[pos_ + 1]) == std::string_view::npos;
      CharSet set = escape();
      std::optional<char> ch;
      if (single)
        for (int b = 0; b < 0x80; ++b)
          if (set.ascii[b]) ch = static_cast<char>(b);
      return {set, ch};
    }
    if (static_cast<uint8_t>(peek()) >= 0x80) fail(at, "only ASCII characters are supported in a class");
    const char c = text_[pos_++];
    return {asciiSet(std::string(1, c)), c};
  }

  CharSet characterClass() {
    const size_t open = pos_++;
    bool negated = false;
    if (!atEnd() && peek() == '^') {
      negated = true;
      ++pos_;
    }
    CharSet set;
    bool first = true;
    while (true) {
      if (atEnd()) fail(open, "unclosed class");
      if (peek() == ']' && !first) break;
      first = false;
      const size_t memberAt = pos_;
      auto [member, low] = classMember();
      if (!atEnd() && peek() == '-' && pos_ + 1 < end_ && text_[pos_ + 1] != ']') {
        ++pos_;
        auto [upper, high] = classMember();
        if (!low || !high) fail(memberAt, "a range needs single characters at both ends");
        if (*high < *low) fail(memberAt, "a range whose end is below its start");
        member = asciiRange(*low, *high);
      }
      set.add(member);
    }
    ++pos_;
    return negated ? set.negated() : set;
  }

  const std::string& text_;
  const std::string& where_;
  size_t pos_ = 0, end_ = 0;
  int groupDepth_ = 0;
};

}  // namespace

ByteExpr regexExpr(const std::string& pattern, const std::string& where) { return RegexParser(pattern, where).parse(); }

std::shared_ptr<const ByteAutomaton> compileRegex(const std::string& pattern, const std::string& where) {
  return std::make_shared<const ByteAutomaton>(regexExpr(pattern, where), where);
}

}  // namespace dgemma::serve
