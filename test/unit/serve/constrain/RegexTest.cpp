// compileRegex: the documented subset, checked against tables and against std::regex (ECMAScript)
// on random strings, and its located errors.
#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "runtime/serve/constrain/Regex.h"
#include "support/Error.h"

namespace dgemma::serve {
namespace {

std::string errorOf(const std::string& pattern) {
  try {
    compileRegex(pattern, "response_format.regex");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Regex, MatchesTheWholeText) {
  struct Case {
    const char* pattern;
    std::vector<std::string> accepted, rejected;
  };
  const std::vector<Case> cases{
      {"abc", {"abc"}, {"", "ab", "abcd", "xabc"}},
      {"^a|b$", {"a", "b"}, {"ab", ""}},
      {"\\d{3}-\\d{4}", {"555-1234"}, {"5551234", "55-1234", "555-12345"}},
      {"[a-c]+[^a-c]?", {"a", "abcx", "c\xC3\xA9"}, {"", "x", "abxx", "a\xC3"}},
      {"(?:ab|cd)*e", {"e", "abcde", "cdcdabe"}, {"abc", "ace"}},
      {"x.y", {"xay", "x\xE2\x82\xACy"}, {"x\ny", "xy", "xaay"}},
      {"\\w+@\\w+\\.com", {"bob_1@mail.com"}, {"bob@mail.org", "@mail.com"}},
      {"a{2,}b{0,1}", {"aa", "aaab"}, {"a", "aabb"}},
      {"[\\d.]+", {"3.14"}, {"3,14"}},
      {"[]a]", {"]", "a"}, {"b"}},
      {"a\\$", {"a$"}, {"a"}},
      {"colou?r", {"color", "colour"}, {"colouur"}},
      {"(a|)+?b", {"b", "aab"}, {"c"}},
      {"caf\xC3\xA9", {"caf\xC3\xA9"}, {"cafe"}},
      {"\\s\\S", {" x", "\t\xC3\xA9"}, {"  "}},
  };
  for (const Case& c : cases) {
    const auto automaton = compileRegex(c.pattern, "regex");
    for (const std::string& text : c.accepted) EXPECT_TRUE(automaton->matches(text)) << c.pattern << " on " << text;
    for (const std::string& text : c.rejected) EXPECT_FALSE(automaton->matches(text)) << c.pattern << " on " << text;
  }
}

// On ASCII text, the subset agrees with std::regex_match.
TEST(Regex, AgreesWithStdRegexOnRandomText) {
  const std::vector<std::string> patterns{"a*b+",       "(ab|ba){1,3}c?", "[a-c]{2}[^ab]*", "\\d+(\\.\\d{1,2})?",
                                          "(a|b|)*c",   "[abc]+|\\d",     "(?:a(?:b|c)?)+", "a{0,2}b{2}",
                                          "\\w\\W\\s?", "[-a]+b"};
  const std::string alphabet = "abc12.- _x";
  std::mt19937 rng(7);
  for (const std::string& pattern : patterns) {
    const auto automaton = compileRegex(pattern, "regex");
    const std::regex oracle(pattern, std::regex::ECMAScript);
    for (int trial = 0; trial < 2000; ++trial) {
      std::string text;
      const int length = static_cast<int>(rng() % 8);
      for (int i = 0; i < length; ++i) text.push_back(alphabet[rng() % alphabet.size()]);
      EXPECT_EQ(automaton->matches(text), std::regex_match(text, oracle)) << pattern << " on \"" << text << "\"";
    }
  }
}

TEST(Regex, ErrorsNameTheOffset) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"ab(c", "at offset 2: unclosed group"},
      {"abc)", "at offset 3: unmatched ')'"},
      {"a**", "at offset 2: a quantifier cannot follow"},
      {"*a", "at offset 0: nothing to repeat"},
      {"a{3,1}", "at offset 1: repetition {m,n} with n below m"},
      {"a{999}", "at offset 2: repetition count above 256"},
      {"a{x}", "at offset 2: expected a repetition"},
      {"a^b", "at offset 1: ^ and $ are accepted only"},
      {"(?=a)", "at offset 0: only the groups"},
      {"\\1", "at offset 0: unsupported escape \\1"},
      {"\\bword", "at offset 0: unsupported escape \\b"},
      {"[a-", "at offset 0: unclosed class"},
      {"[z-a]", "at offset 1: a range whose end is below its start"},
      {"[\xC3\xA9]", "at offset 1: only ASCII characters"},
      {"\xC3", "at offset 0: the pattern is not well-formed UTF-8"},
      {std::string(65, '(') + std::string(65, ')'), "at offset 64: groups nested deeper than 64"},
  };
  for (const auto& [pattern, expected] : cases) {
    const std::string message = errorOf(pattern);
    EXPECT_NE(message.find("response_format.regex: " + expected), std::string::npos) << pattern << ": " << message;
  }
}

}  // namespace
}  // namespace dgemma::serve
