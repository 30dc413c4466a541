// The builtin rewards (docs/rl.md, "Rewards"): exact, numeric and regex on edge cases, and
// the references checkReference turns away.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/rl/reward/Reward.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::mentions;

double rewardOf(const std::string& rule, const std::string& completion, const nlohmann::json& reference) {
  const std::vector<double> rewards =
      makeBuiltinReward(rule)->score({RewardItem{"prompt", completion, reference, "rows.jsonl:7"}});
  EXPECT_EQ(rewards.size(), 1u);
  return rewards.empty() ? -1 : rewards[0];
}

TEST(BuiltinReward, NamesItsRule) {
  for (const std::string rule : {"exact", "numeric", "regex"}) EXPECT_EQ(makeBuiltinReward(rule)->name(), rule);
}

TEST(BuiltinReward, UnknownNameNamesTheFlag) {
  const std::string message = expectInputError([] { makeBuiltinReward("command"); });
  EXPECT_TRUE(mentions(message, "--reward"));
  EXPECT_TRUE(mentions(message, "\"command\""));
  EXPECT_TRUE(mentions(expectInputError([] { checkReference("fuzzy", "x", "rows.jsonl:1"); }), "--reward"));
}

TEST(BuiltinReward, ScoresEveryItemInOrder) {
  const std::vector<RewardItem> items = {
      {"p", "4", "4", "a:1"}, {"p", "5", "4", "a:1"}, {"p", "4", "4", "a:2"}, {"p", "", "4", "a:2"}};
  EXPECT_EQ(makeBuiltinReward("exact")->score(items), (std::vector<double>{1, 0, 1, 0}));
  EXPECT_TRUE(makeBuiltinReward("exact")->score({}).empty());
}

TEST(ExactReward, TrimsBothSides) {
  EXPECT_EQ(rewardOf("exact", "  Paris\n", "Paris"), 1);
  EXPECT_EQ(rewardOf("exact", "Paris", " \tParis \n"), 1);
  EXPECT_EQ(rewardOf("exact", "\r\n\v\f Paris", "Paris"), 1);
  EXPECT_EQ(rewardOf("exact", " \n ", ""), 1);
}

TEST(ExactReward, ComparesTheWholeTextExactly) {
  EXPECT_EQ(rewardOf("exact", "paris", "Paris"), 0);
  EXPECT_EQ(rewardOf("exact", "Paris.", "Paris"), 0);
  EXPECT_EQ(rewardOf("exact", "Pa ris", "Paris"), 0);
  EXPECT_EQ(rewardOf("exact", "The answer is Paris", "Paris"), 0);
  EXPECT_EQ(rewardOf("exact", "", "Paris"), 0);
}

TEST(ExactReward, NumericReferenceComparesAsItsJsonText) {
  EXPECT_EQ(rewardOf("exact", "42", 42), 1);
  EXPECT_EQ(rewardOf("exact", " -7 ", -7), 1);
  EXPECT_EQ(rewardOf("exact", "0.5", 0.5), 1);
  EXPECT_EQ(rewardOf("exact", "42.0", 42), 0);
  EXPECT_EQ(rewardOf("exact", "42", 42.5), 0);
}

TEST(NumericReward, TakesTheLastNumber) {
  EXPECT_EQ(rewardOf("numeric", "3 apples and 5 pears make 8", 8), 1);
  EXPECT_EQ(rewardOf("numeric", "The answer is 8, not 3", 8), 0);
  EXPECT_EQ(rewardOf("numeric", "The answer is 8, not 3", 3), 1);
  EXPECT_EQ(rewardOf("numeric", "#### 72", 72), 1);
  EXPECT_EQ(rewardOf("numeric", "\\boxed{72}.", 72), 1);
  EXPECT_EQ(rewardOf("numeric", "x2", 2), 1);
}

TEST(NumericReward, NoNumberScoresZero) {
  EXPECT_EQ(rewardOf("numeric", "I do not know", 0), 0);
  EXPECT_EQ(rewardOf("numeric", "", 0), 0);
  EXPECT_EQ(rewardOf("numeric", "- + . , e", 0), 0);
}

TEST(NumericReward, Signs) {
  EXPECT_EQ(rewardOf("numeric", "it is -3", -3), 1);
  EXPECT_EQ(rewardOf("numeric", "it is -3", 3), 0);
  EXPECT_EQ(rewardOf("numeric", "x=+3", 3), 1);
  EXPECT_EQ(rewardOf("numeric", "(-12)", -12), 1);
  EXPECT_EQ(rewardOf("numeric", "-0", 0), 1);
  // A sign after a letter or digit is an operator: "2-3" reads 2 and 3.
  EXPECT_EQ(rewardOf("numeric", "2-3", 3), 1);
  EXPECT_EQ(rewardOf("numeric", "2-3", -3), 0);
  EXPECT_EQ(rewardOf("numeric", "-x-5", 5), 1);
}

TEST(NumericReward, Decimals) {
  EXPECT_EQ(rewardOf("numeric", "pi is 3.14159", 3.14159), 1);
  EXPECT_EQ(rewardOf("numeric", "pi is 3.14159", 3.14), 0);
  EXPECT_EQ(rewardOf("numeric", "The total is 5.", 5), 1);
  EXPECT_EQ(rewardOf("numeric", "0.1 + 0.2 = 0.30000000000000004", 0.3), 1);
  EXPECT_EQ(rewardOf("numeric", "about 0.3001", 0.3), 0);
}

TEST(NumericReward, Exponents) {
  EXPECT_EQ(rewardOf("numeric", "c = 3e8 m/s", 300000000), 1);
  EXPECT_EQ(rewardOf("numeric", "6.02E+23", 6.02e23), 1);
  EXPECT_EQ(rewardOf("numeric", "h = 6.626e-34", 6.626e-34), 1);
  EXPECT_EQ(rewardOf("numeric", "6.626e-3", 6.627e-3), 0);
  // "e" without digits after it is not an exponent.
  EXPECT_EQ(rewardOf("numeric", "3eggs", 3), 1);
  EXPECT_EQ(rewardOf("numeric", "3e-", 3), 1);
}

TEST(NumericReward, CommasBetweenDigitGroups) {
  EXPECT_EQ(rewardOf("numeric", "It costs $1,234.", 1234), 1);
  EXPECT_EQ(rewardOf("numeric", "-12,345,678.5", -12345678.5), 1);
  EXPECT_EQ(rewardOf("numeric", "1,234e3", 1234000), 1);
  // Not groups of three: a list.
  EXPECT_EQ(rewardOf("numeric", "1,2,3", 3), 1);
  EXPECT_EQ(rewardOf("numeric", "1,2,3", 123), 0);
  EXPECT_EQ(rewardOf("numeric", "1,23", 23), 1);
  EXPECT_EQ(rewardOf("numeric", "1234,567", 567), 1);
  EXPECT_EQ(rewardOf("numeric", "1,2345", 2345), 1);
}

TEST(NumericReward, Tolerance) {
  EXPECT_EQ(rewardOf("numeric", "1000000000.5", 1000000000.5000001), 1);  // relative 1e-16
  EXPECT_EQ(rewardOf("numeric", "100.000001", 100), 0);                   // relative 1e-9 is 1e-7
  EXPECT_EQ(rewardOf("numeric", "100.00000001", 100), 1);
  EXPECT_EQ(rewardOf("numeric", "0.0000000000001", 0), 1);  // absolute 1e-12 near zero
  EXPECT_EQ(rewardOf("numeric", "0.00000000001", 0), 0);
  EXPECT_EQ(rewardOf("numeric", "6.626e-34", 6.627e-34), 1);  // both within 1e-12 of each other
  EXPECT_EQ(rewardOf("numeric", "1e999", 1e308), 0);
}

TEST(NumericReward, NumericStringReference) {
  EXPECT_EQ(rewardOf("numeric", "so 1234", "1,234"), 1);
  EXPECT_EQ(rewardOf("numeric", "so -2.5", " -2.5e0 "), 1);
  EXPECT_EQ(rewardOf("numeric", "so 7", "+7"), 1);
}

TEST(RegexReward, MatchesTheWholeTrimmedCompletion) {
  EXPECT_EQ(rewardOf("regex", "  yes\n", "yes|no"), 1);
  EXPECT_EQ(rewardOf("regex", "no", "yes|no"), 1);
  EXPECT_EQ(rewardOf("regex", "yes, surely", "yes|no"), 0);
  EXPECT_EQ(rewardOf("regex", "The answer is 42", "The answer is \\d+"), 1);
  EXPECT_EQ(rewardOf("regex", "The answer is 42!", "The answer is \\d+"), 0);
  EXPECT_EQ(rewardOf("regex", "ab", "^a.$"), 1);
  EXPECT_EQ(rewardOf("regex", "", "x*"), 1);
  EXPECT_EQ(rewardOf("regex", "caf\xc3\xa9", "caf."), 1);
}

TEST(RegexReward, LongCompletionsMatchWithoutRecursion) {
  const std::string completion(1 << 20, 'a');
  EXPECT_EQ(rewardOf("regex", completion, "(a|b)*"), 1);
  EXPECT_EQ(rewardOf("regex", completion + "c", "(a|b)*"), 0);
}

TEST(RegexReward, SharesOnePatternAcrossItems) {
  std::vector<RewardItem> items;
  for (int i = 0; i < 8; ++i) items.push_back({"p", i % 2 ? "odd" : "even", "even|nothing", "rows.jsonl:1"});
  items.push_back({"p", "odd", "odd", "rows.jsonl:2"});
  EXPECT_EQ(makeBuiltinReward("regex")->score(items), (std::vector<double>{1, 0, 1, 0, 1, 0, 1, 0, 1}));
}

TEST(CheckReference, AcceptsWhatEachRuleUses) {
  checkReference("exact", "Paris", "rows.jsonl:1");
  checkReference("exact", 42, "rows.jsonl:1");
  checkReference("numeric", 42, "rows.jsonl:1");
  checkReference("numeric", -2.5e-3, "rows.jsonl:1");
  checkReference("numeric", " 1,234.5 ", "rows.jsonl:1");
  checkReference("regex", "[0-9]+(\\.[0-9]+)?", "rows.jsonl:1");
  for (const nlohmann::json& anything : {nlohmann::json(nullptr), nlohmann::json::object({{"tests", {1, 2}}})})
    checkReference("command", anything, "rows.jsonl:1");
}

TEST(CheckReference, ExactRejectsOtherTypes) {
  for (const nlohmann::json& bad : {nlohmann::json(true), nlohmann::json(nullptr), nlohmann::json::array({1})}) {
    const std::string message = expectInputError([&] { checkReference("exact", bad, "rows.jsonl:3"); });
    EXPECT_TRUE(mentions(message, "rows.jsonl:3: reference: expected a string or a number"));
  }
}

TEST(CheckReference, NumericRejectsNonNumbers) {
  for (const nlohmann::json& bad :
       {nlohmann::json("forty-two"), nlohmann::json("42 apples"), nlohmann::json(""), nlohmann::json("1,2"),
        nlohmann::json(".5"), nlohmann::json("1e999"), nlohmann::json(true), nlohmann::json::object()}) {
    const std::string message = expectInputError([&] { checkReference("numeric", bad, "rows.jsonl:4"); });
    EXPECT_TRUE(mentions(message, "rows.jsonl:4: reference: expected a number or a numeric string"));
  }
  // The builtin itself refuses them too, instead of scoring 0.
  EXPECT_TRUE(mentions(expectInputError([] { rewardOf("numeric", "42", "forty-two"); }), "rows.jsonl:7: reference"));
}

TEST(CheckReference, RegexRejectsWhatDoesNotCompile) {
  EXPECT_TRUE(mentions(expectInputError([] { checkReference("regex", 5, "rows.jsonl:5"); }),
                       "rows.jsonl:5: reference: expected a regular expression"));
  for (const std::string bad : {"(unclosed", "[z-a]", "a**", "(a)\\1", "(?=a)b"}) {
    const std::string message = expectInputError([&] { checkReference("regex", bad, "rows.jsonl:6"); });
    EXPECT_TRUE(mentions(message, "rows.jsonl:6: reference"));
  }
  EXPECT_TRUE(mentions(expectInputError([] { rewardOf("regex", "x", "(x"); }), "rows.jsonl:7: reference"));
}

}  // namespace
}  // namespace dgemma
