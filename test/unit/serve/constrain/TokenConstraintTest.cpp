// TokenConstraint on a hand-made vocabulary: transitions, distances, allowed tokens, the shortest
// token, and reads from several threads at once.
#include <gtest/gtest.h>

#include <thread>

#include "runtime/serve/constrain/Regex.h"
#include "runtime/serve/constrain/TokenConstraint.h"

namespace dgemma::serve {
namespace {

// Ids: 0 "a", 1 "b", 2 "c", 3 "d", 4 "ab", 5 "bc", 6 EOS, 7 pad, 8 a forbidden "<x>", 9 "x" forbidden.
TokenVocabulary smallVocabulary() {
  TokenVocabulary vocabulary;
  vocabulary.tokenBytes = {"a", "b", "c", "d", "ab", "bc", "<eos>", "<pad>", "<x>", "x"};
  vocabulary.eosIds = {6};
  vocabulary.padId = 7;
  vocabulary.forbiddenIds = {8, 9};
  return vocabulary;
}

TEST(TokenConstraint, DistancesAndAllowedTokens) {
  const TokenConstraint c(compileRegex("abc|d|xa", "regex"), smallVocabulary());
  const int32_t start = c.startState();
  EXPECT_EQ(c.minimumTokens(), 1);  // "d"
  EXPECT_EQ(*c.allowedTokens(start), (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(c.shortestToken(start), 3);
  const int32_t afterA = c.step(start, 0);
  ASSERT_NE(afterA, ByteAutomaton::kDeadState);
  EXPECT_EQ(c.distanceToAccept(afterA), 1);  // "bc"
  EXPECT_EQ(c.shortestToken(afterA), 5);
  const int32_t afterAb = c.step(start, 4);
  EXPECT_EQ(c.distanceToAccept(afterAb), 1);  // "c"
  EXPECT_TRUE(c.isAccepting(c.step(afterAb, 2)));
  // Forbidden, EOS, pad and out-of-range ids never move the text; "x" is forbidden, so "xa" is out.
  for (int64_t id : {5, 6, 7, 8, 9, 10, -1}) EXPECT_EQ(c.step(start, id), ByteAutomaton::kDeadState) << id;
  const auto successors = c.successors(start);
  ASSERT_EQ(successors->size(), 3u);
  EXPECT_EQ(successors->front().distance, 0);  // "d" first: nearest to acceptance
  EXPECT_TRUE(c.isAccepting(successors->front().state));
}

TEST(TokenConstraint, UnreachableWhenTheVocabularyCannotSpellIt) {
  const TokenConstraint c(compileRegex("x+", "regex"), smallVocabulary());
  EXPECT_EQ(c.minimumTokens(), TokenConstraint::kUnreachable);
  EXPECT_TRUE(c.allowedTokens(c.startState())->empty());
  EXPECT_EQ(c.shortestToken(c.startState()), -1);
}

// Many threads read one constraint while it is still computing its states: every thread must see
// the same answers as a single-threaded copy.
TEST(TokenConstraint, ConcurrentReadsAgreeWithASingleThread) {
  TokenVocabulary vocabulary;
  for (int b = 0; b < 128; ++b) vocabulary.tokenBytes.emplace_back(1, static_cast<char>(b));
  vocabulary.tokenBytes.push_back("<eos>");
  vocabulary.eosIds = {128};
  const std::string pattern = "(\\d{2}-)*[a-f]{3,6}(,[a-z]+){0,4}";
  const TokenConstraint reference(compileRegex(pattern, "regex"), vocabulary);
  const TokenConstraint shared(compileRegex(pattern, "regex"), vocabulary);
  auto walk = [](const TokenConstraint& c, uint32_t seed) {
    std::vector<int64_t> trace;
    int32_t state = c.startState();
    for (int i = 0; i < 200; ++i) {
      const auto allowed = c.allowedTokens(state);
      trace.push_back(c.distanceToAccept(state));
      if (allowed->empty()) break;
      seed = seed * 1664525u + 1013904223u;
      state = c.step(state, (*allowed)[seed % allowed->size()]);
    }
    return trace;
  };
  std::vector<std::vector<int64_t>> traces(8);
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < traces.size(); ++t) threads.emplace_back([&, t] { traces[t] = walk(shared, t); });
  for (std::thread& thread : threads) thread.join();
  for (uint32_t t = 0; t < traces.size(); ++t) EXPECT_EQ(traces[t], walk(reference, t)) << "thread " << t;
}

}  // namespace
}  // namespace dgemma::serve
