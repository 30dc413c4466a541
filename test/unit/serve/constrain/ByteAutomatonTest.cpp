// ByteExpr combinators and the lazily determinized automaton.
#include <gtest/gtest.h>

#include <random>

#include "runtime/serve/constrain/ByteAutomaton.h"
#include "support/Error.h"

namespace dgemma::serve {
namespace {

ByteAutomaton automaton(const ByteExpr& expr) { return ByteAutomaton(expr, "test"); }

TEST(ByteAutomaton, CombinatorsMatchTheirLanguages) {
  const ByteExpr ab = ByteExpr::literal("ab");
  const ByteAutomaton seq = automaton(ByteExpr::sequence({ab, ByteExpr::optional(ByteExpr::literal("c"))}));
  EXPECT_TRUE(seq.matches("ab"));
  EXPECT_TRUE(seq.matches("abc"));
  EXPECT_FALSE(seq.matches("a"));
  EXPECT_FALSE(seq.matches("abcc"));

  const ByteAutomaton star = automaton(ByteExpr::star(ab));
  EXPECT_TRUE(star.matches(""));
  EXPECT_TRUE(star.matches("ababab"));
  EXPECT_FALSE(star.matches("aba"));

  const ByteAutomaton repeated = automaton(ByteExpr::repetition(ByteExpr::byteRange('0', '9'), 2, 3));
  EXPECT_FALSE(repeated.matches("1"));
  EXPECT_TRUE(repeated.matches("12"));
  EXPECT_TRUE(repeated.matches("123"));
  EXPECT_FALSE(repeated.matches("1234"));

  const ByteAutomaton atLeast = automaton(ByteExpr::repetition(ByteExpr::literal("x"), 2, std::nullopt));
  EXPECT_FALSE(atLeast.matches("x"));
  EXPECT_TRUE(atLeast.matches("xxxxx"));

  const ByteAutomaton nothing = automaton(ByteExpr::alternation({}));
  EXPECT_EQ(nothing.startState(), ByteAutomaton::kDeadState);
  EXPECT_FALSE(nothing.matches(""));
}

TEST(ByteAutomaton, SeparatedListAndSubsequence) {
  const ByteAutomaton list = automaton(ByteExpr::separatedList(ByteExpr::literal("a"), ByteExpr::literal(",")));
  EXPECT_TRUE(list.matches("a"));
  EXPECT_TRUE(list.matches("a,a,a"));
  EXPECT_FALSE(list.matches(""));
  EXPECT_FALSE(list.matches("a,"));
  EXPECT_FALSE(list.matches("a,,a"));

  // x required between optional w and y, optional z: separators only between present items.
  const ByteAutomaton members =
      automaton(ByteExpr::separatedSubsequence({ByteExpr::literal("w"), ByteExpr::literal("x"), ByteExpr::literal("y")},
                                               {false, true, false}, ByteExpr::literal(",")));
  for (const char* good : {"x", "w,x", "x,y", "w,x,y"}) EXPECT_TRUE(members.matches(good)) << good;
  for (const char* bad : {"", "w", "y", "w,y", ",x", "x,", "x,w", "wx", "w,x,y,"})
    EXPECT_FALSE(members.matches(bad)) << bad;

  const ByteAutomaton allOptional = automaton(ByteExpr::separatedSubsequence(
      {ByteExpr::literal("a"), ByteExpr::literal("b")}, {false, false}, ByteExpr::literal(",")));
  for (const char* good : {"", "a", "b", "a,b"}) EXPECT_TRUE(allOptional.matches(good)) << good;
  EXPECT_FALSE(allOptional.matches("b,a"));
}

TEST(ByteAutomaton, Utf8CharIsWellFormed) {
  ByteSet letters;
  letters.set('a');
  const ByteAutomaton chars = automaton(ByteExpr::star(ByteExpr::utf8Char(letters, true)));
  EXPECT_TRUE(chars.matches("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"));  // a é € 😀
  EXPECT_FALSE(chars.matches("b"));
  EXPECT_FALSE(chars.matches("\xC3"));              // truncated
  EXPECT_FALSE(chars.matches("\xC0\xAF"));          // overlong
  EXPECT_FALSE(chars.matches("\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(chars.matches("\xF4\x90\x80\x80"));  // above U+10FFFF
}

// Only states that can still reach acceptance exist: a prefix that cannot complete is dead at once.
TEST(ByteAutomaton, DeadAsSoonAsNoCompletionRemains) {
  const ByteAutomaton a = automaton(ByteExpr::sequence({ByteExpr::literal("ab"), ByteExpr::alternation({})}));
  EXPECT_EQ(a.startState(), ByteAutomaton::kDeadState);
  const ByteAutomaton b = automaton(ByteExpr::alternation(
      {ByteExpr::literal("ab"), ByteExpr::sequence({ByteExpr::literal("ac"), ByteExpr::alternation({})})}));
  const int32_t afterA = b.step(b.startState(), 'a');
  EXPECT_NE(afterA, ByteAutomaton::kDeadState);
  EXPECT_EQ(b.step(afterA, 'c'), ByteAutomaton::kDeadState);
  EXPECT_TRUE(b.isAccepting(b.step(afterA, 'b')));
}

// runAll shares the work of common prefixes and skips strings below a dead one; its answers are
// run()'s, string by string.
TEST(ByteAutomaton, RunAllAgreesWithRun) {
  const ByteAutomaton a = automaton(
      ByteExpr::sequence({ByteExpr::star(ByteExpr::alternation({ByteExpr::literal("ab"), ByteExpr::literal("b")})),
                          ByteExpr::literal("c")}));
  std::mt19937 rng(3);
  std::vector<std::string> strings{"", "a", "ab", "abc", "abab", "ba", "bbc", "c", "cc"};
  for (int i = 0; i < 500; ++i) {
    std::string text;
    for (uint32_t n = rng() % 6; n > 0; --n) text.push_back("abcx"[rng() % 4]);
    strings.push_back(text);
  }
  const SortedStrings sorted(strings);
  for (const int32_t from : {a.startState(), a.step(a.startState(), 'a'), a.step(a.startState(), 'b')}) {
    const std::vector<int32_t> all = a.runAll(from, sorted);
    ASSERT_EQ(all.size(), strings.size());
    for (size_t i = 0; i < strings.size(); ++i)
      EXPECT_EQ(all[i], a.run(from, strings[i])) << "\"" << strings[i] << "\"";
  }
}

TEST(ByteAutomaton, TooManyStatesIsAnInputError) {
  // (a|b)*a(a|b){12}: its DFA needs 2^13 states.
  const ByteExpr aOrB = ByteExpr::alternation({ByteExpr::literal("a"), ByteExpr::literal("b")});
  const ByteExpr expr =
      ByteExpr::sequence({ByteExpr::star(aOrB), ByteExpr::literal("a"), ByteExpr::repetition(aOrB, 12, 12)});
  const ByteAutomaton small(expr, "response_format.regex", 1000);
  try {
    // The states after every a/b string of length 13 are distinct.
    for (int bits = 0; bits < (1 << 13); ++bits) {
      std::string text;
      for (int i = 0; i < 13; ++i) text.push_back((bits >> i) & 1 ? 'a' : 'b');
      small.run(small.startState(), text);
    }
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("response_format.regex: the constraint needs more than 1000 automaton states"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dgemma::serve
