// Streamed text (docs/serving.md, "Streaming"): incremental detokenization on the bundled tokenizer
// and on the byte-fallback fixture tokenizer, and stop strings across delta boundaries.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/serve/api/StreamText.h"

namespace dgemma::serve {
namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

std::vector<int64_t> encode(const Tokenizer& tokenizer, const std::string& text) {
  const std::vector<int32_t> ids = tokenizer.encode(text);
  return {ids.begin(), ids.end()};
}

// Everything IncrementalText emits for `ids` pushed `step` at a time, then flushed; each push's text in `pieces`.
std::string streamed(const Tokenizer& tokenizer, const std::vector<int64_t>& ids, size_t step,
                     std::vector<std::string>* pieces = nullptr) {
  IncrementalText text(tokenizer);
  std::string all;
  for (size_t i = 0; i < ids.size(); i += step) {
    const std::string piece = text.push(std::span(ids).subspan(i, std::min(step, ids.size() - i)));
    if (pieces) pieces->push_back(piece);
    all += piece;
  }
  return all + text.flush();
}

TEST(ServeIncrementalText, BundledTokenizerEmitsDecodeOfAllIds) {
  const Tokenizer tokenizer(DGEMMA_TOKENIZER_DIR);
  for (const std::string& sentence :
       {std::string("Hello world, 12 + 30 = 42."), std::string("na\xC3\xAFve caf\xC3\xA9 ok"),
        std::string("<|turn>user\nWhat is 82 + 50?<turn|>\n")}) {
    const std::vector<int64_t> ids = encode(tokenizer, sentence);
    ASSERT_GT(ids.size(), 3u);
    for (size_t step : {1, 2, 5}) EXPECT_EQ(streamed(tokenizer, ids, step), tokenizer.decode(ids)) << sentence;
  }
}

TEST(ServeIncrementalText, EachPushEmitsOnlyNewText) {
  const Tokenizer tokenizer(DGEMMA_TOKENIZER_DIR);
  const std::vector<int64_t> ids = encode(tokenizer, "Hello world");
  std::vector<std::string> pieces;
  streamed(tokenizer, ids, 1, &pieces);
  ASSERT_EQ(pieces.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(pieces[i], tokenizer.decode(std::span(ids).subspan(i, 1))) << i;
}

// test/fixtures/tokenizer_json/byte_fallback: byte piece <0xXX> is id 4 + XX, and its decoder strips one
// leading space.
class ServeByteFallback : public ::testing::Test {
 protected:
  const Tokenizer tokenizer{std::string(DGEMMA_TOKENIZER_JSON_DIR) + "/byte_fallback"};
  static int64_t byte(unsigned char value) { return 4 + value; }
};

TEST_F(ServeByteFallback, SplitMultiByteCharacterIsHeldUntilComplete) {
  IncrementalText text(tokenizer);
  EXPECT_EQ(text.push(std::vector<int64_t>{byte(0xC3)}), "");  // decodes to U+FFFD on its own
  EXPECT_EQ(text.push(std::vector<int64_t>{byte(0xA9)}), "\xC3\xA9");
  EXPECT_EQ(text.flush(), "");
}

TEST_F(ServeByteFallback, ThreeByteCharacterOneByteAtATime) {
  // "é€x" as tokenizers encodes it: € (E2 82 AC) is three byte pieces.
  const std::vector<int64_t> ids{318, 314, 230, 134, 176, 309};
  std::vector<std::string> pieces;
  EXPECT_EQ(streamed(tokenizer, ids, 1, &pieces),
            "\xC3\xA9\xE2\x82\xAC"
            "x");
  int held = 0;
  for (const std::string& piece : pieces) {
    EXPECT_EQ(piece.find(kReplacement), std::string::npos);
    held += piece.empty();
  }
  EXPECT_GE(held, 2);  // at least the first two bytes of the euro sign
}

TEST_F(ServeByteFallback, IncompleteTailIsFlushedAsReplacement) {
  IncrementalText text(tokenizer);
  EXPECT_EQ(text.push(encode(tokenizer, "ab")), "ab");
  EXPECT_EQ(text.push(std::vector<int64_t>{byte(0xE2), byte(0x82)}), "");
  EXPECT_EQ(text.flush(), kReplacement + kReplacement);
}

TEST_F(ServeByteFallback, InvalidByteRunIsEmittedOnceSomethingFollows) {
  IncrementalText text(tokenizer);
  EXPECT_EQ(text.push(std::vector<int64_t>{byte(0xC3)}), "");
  EXPECT_EQ(text.push(std::vector<int64_t>{byte('a')}), "");  // C3 61 is not UTF-8: two U+FFFD, still at the end
  // "x" encodes as "▁x" (the normalizer prepends "▁"): a space in the middle of the text.
  const std::string rest = text.push(encode(tokenizer, "x"));
  EXPECT_EQ(rest, kReplacement + kReplacement + " x");
}

TEST_F(ServeByteFallback, LeadingSpaceStripOnlyAtTheStart) {
  const std::vector<int64_t> ids = encode(tokenizer, "one two  three");
  for (size_t step : {1, 2, 3}) EXPECT_EQ(streamed(tokenizer, ids, step), tokenizer.decode(ids));
}

// Everything a StopMatcher emits for `deltas`, then flushed.
std::string matched(StopMatcher& matcher, const std::vector<std::string>& deltas) {
  std::string all;
  for (const std::string& delta : deltas) all += matcher.push(delta);
  return all + matcher.flush();
}

TEST(ServeStopMatcher, StopAcrossDeltas) {
  StopMatcher matcher({"END"});
  EXPECT_EQ(matcher.push("abcE"), "abc");
  EXPECT_EQ(matcher.push("N"), "");
  EXPECT_FALSE(matcher.stopped());
  EXPECT_EQ(matcher.push("Dxyz"), "");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.push("more"), "");
  EXPECT_EQ(matcher.flush(), "");
}

TEST(ServeStopMatcher, PartialMatchThatFailsIsReleased) {
  StopMatcher matcher({"END"});
  EXPECT_EQ(matcher.push("abEN"), "ab");
  EXPECT_EQ(matcher.push("x"), "ENx");
  EXPECT_EQ(matcher.push("E"), "");
  EXPECT_EQ(matcher.flush(), "E");  // at the end of the choice a partial stop string is ordinary text
  EXPECT_FALSE(matcher.stopped());
}

TEST(ServeStopMatcher, MultipleStops) {
  StopMatcher matcher({"\n\n", "###"});
  EXPECT_EQ(matcher.push("a#"), "a");
  EXPECT_EQ(matcher.push("#\n"), "##");
  EXPECT_EQ(matcher.push("\nrest"), "");
  EXPECT_TRUE(matcher.stopped());
  StopMatcher other({"\n\n", "###"});
  EXPECT_EQ(matched(other, {"x##", "#", "y"}), "x");
  EXPECT_TRUE(other.stopped());
}

TEST(ServeStopMatcher, EarliestMatchWins) {
  StopMatcher matcher({"cd", "abcdef"});  // "abcdef" starts before "cd" does
  EXPECT_EQ(matched(matcher, {"xab", "cdef"}), "x");
  StopMatcher later({"cd", "abcx"});  // "abcx" was a candidate until "d" came
  EXPECT_EQ(matched(later, {"xab", "cdef"}), "xab");
  StopMatcher overlapping({"bc", "ab"});
  EXPECT_EQ(matched(overlapping, {"xabc"}), "x");
}

TEST(ServeStopMatcher, StopAtTheVeryStart) {
  StopMatcher matcher({"Q:"});
  EXPECT_EQ(matcher.push("Q"), "");
  EXPECT_EQ(matcher.push(": next"), "");
  EXPECT_TRUE(matcher.stopped());
  StopMatcher whole({"Q:"});
  EXPECT_EQ(whole.push("Q:"), "");
  EXPECT_TRUE(whole.stopped());
}

TEST(ServeStopMatcher, MultiByteStopSplitInsideACharacter) {
  StopMatcher matcher({"\xE2\x82\xAC"});  // the euro sign
  EXPECT_EQ(matcher.push("a\xE2\x82"), "a");
  EXPECT_EQ(matcher.push("\xAC b"), "");
  EXPECT_TRUE(matcher.stopped());
}

TEST(ServeStopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher matcher({});
  EXPECT_EQ(matcher.push("END"), "END");
  EXPECT_EQ(matcher.flush(), "");
  EXPECT_FALSE(matcher.stopped());
}

}  // namespace
}  // namespace dgemma::serve
