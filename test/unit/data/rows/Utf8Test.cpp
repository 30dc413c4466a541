#include <gtest/gtest.h>

#include <string>

#include "runtime/data/rows/JsonLine.h"
#include "runtime/data/rows/Utf8.h"

namespace dgemma {
namespace {

int64_t badOffset(const std::string& text) {
  auto problem = findInvalidUtf8(text);
  return problem ? problem->offset : -1;
}

TEST(Utf8, AcceptsEveryEncodingLength) {
  EXPECT_EQ(badOffset(""), -1);
  EXPECT_EQ(badOffset("plain ascii"), -1);
  EXPECT_EQ(badOffset("caf\xC3\xA9"), -1);             // U+00E9
  EXPECT_EQ(badOffset("\xE2\x82\xAC"), -1);            // U+20AC
  EXPECT_EQ(badOffset("\xF0\x9F\x98\x80"), -1);        // U+1F600
  EXPECT_EQ(badOffset("\xF4\x8F\xBF\xBF"), -1);        // U+10FFFF
  EXPECT_EQ(badOffset("\xEF\xBB\xBF{}"), -1);          // byte-order mark
  EXPECT_EQ(badOffset("\xED\x9F\xBF"), -1);            // U+D7FF, just below the surrogates
}

TEST(Utf8, RejectsMalformedSequencesAtTheirFirstByte) {
  EXPECT_EQ(badOffset("ab\x80"), 2);                   // stray continuation byte
  EXPECT_EQ(badOffset("a\xC0\xAF"), 1);                // overlong '/'
  EXPECT_EQ(badOffset("\xC1\xBF"), 0);                 // overlong
  EXPECT_EQ(badOffset("x\xE0\x80\xAF"), 1);            // overlong 3-byte form
  EXPECT_EQ(badOffset("\xF0\x80\x80\xAF"), 0);         // overlong 4-byte form
  EXPECT_EQ(badOffset("ok\xED\xA0\x80"), 2);           // surrogate U+D800
  EXPECT_EQ(badOffset("\xF4\x90\x80\x80"), 0);         // above U+10FFFF
  EXPECT_EQ(badOffset("\xF5\x80\x80\x80"), 0);         // lead byte out of range
  EXPECT_EQ(badOffset("\xFF"), 0);
  EXPECT_EQ(badOffset("abc\xC3"), 3);                  // truncated at the end
  EXPECT_EQ(badOffset("abc\xE2\x82"), 3);              // truncated at the end
  EXPECT_EQ(badOffset("\xC3(x"), 0);                   // missing continuation
  EXPECT_EQ(badOffset("\xF0\x9F\x98("), 0);            // missing last continuation
  auto problem = findInvalidUtf8("ab\xFE");
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(problem->byte, 0xFE);
}

TEST(JsonLine, ParsesNestedValues) {
  auto parsed = parseJsonLine(R"({"a": [1, -2, 3.5, true, null, "s", {"b": {}}], "c": 18446744073709551615})");
  ASSERT_TRUE(std::holds_alternative<nlohmann::json>(parsed));
  const auto& doc = std::get<nlohmann::json>(parsed);
  EXPECT_EQ(doc["a"].size(), 7u);
  EXPECT_EQ(doc["a"][1].get<int>(), -2);
  EXPECT_DOUBLE_EQ(doc["a"][2].get<double>(), 3.5);
  EXPECT_TRUE(doc["a"][6]["b"].is_object());
  EXPECT_EQ(doc["c"].get<uint64_t>(), 18446744073709551615ull);
}

TEST(JsonLine, DuplicateKeysAreNamedByTheirPath) {
  auto top = parseJsonLine(R"({"a": 1, "a": 2})");
  ASSERT_TRUE(std::holds_alternative<JsonLineError>(top));
  EXPECT_EQ(std::get<JsonLineError>(top).field, "a");
  EXPECT_EQ(std::get<JsonLineError>(top).expected, "expected each key once in an object, got \"a\" twice");

  auto nested = parseJsonLine(R"({"m": [{"x": 1}, {"y": [0, {"k": 1, "j": 2, "k": 3}]}]})");
  ASSERT_TRUE(std::holds_alternative<JsonLineError>(nested));
  EXPECT_EQ(std::get<JsonLineError>(nested).field, "m[1].y[1].k");

  // The same key in different objects is fine.
  auto separate = parseJsonLine(R"({"a": {"k": 1}, "b": {"k": 2}, "k": 3})");
  EXPECT_TRUE(std::holds_alternative<nlohmann::json>(separate));
}

TEST(JsonLine, RefusesDeepNesting) {
  std::string deep = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(std::holds_alternative<nlohmann::json>(parseJsonLine(deep)));
  std::string tooDeep = std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  auto parsed = parseJsonLine(tooDeep);
  ASSERT_TRUE(std::holds_alternative<JsonLineError>(parsed));
  EXPECT_EQ(std::get<JsonLineError>(parsed).expected,
            "expected at most 64 levels of nested arrays and objects, got more");
}

TEST(JsonLine, ReportsParseErrorsWithTheirColumn) {
  auto parsed = parseJsonLine(R"({"a": tru})");
  ASSERT_TRUE(std::holds_alternative<JsonLineError>(parsed));
  const auto& problem = std::get<JsonLineError>(parsed);
  EXPECT_EQ(problem.field, "row");
  EXPECT_EQ(problem.expected.rfind("expected valid JSON, got parse error at column ", 0), 0u) << problem.expected;
  auto overflow = parseJsonLine(R"({"a": 1e400})");
  ASSERT_TRUE(std::holds_alternative<JsonLineError>(overflow));
  EXPECT_EQ(std::get<JsonLineError>(overflow).expected, "expected valid JSON, got number overflow parsing '1e400'");
  // Trailing garbage after a complete value is an error too.
  EXPECT_TRUE(std::holds_alternative<JsonLineError>(parseJsonLine(R"({} {})")));
}

}  // namespace
}  // namespace dgemma
