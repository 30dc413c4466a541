// support/Json.h: the nesting bound, located parse errors, and message renderings that neither
// recurse nor echo raw bytes.
#include "support/Json.h"

#include <gtest/gtest.h>

#include <string>

#include "support/Error.h"

namespace dgemma {
namespace {

std::string messageOf(const std::string& text) {
  try {
    parseJson(text, "config.json");
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

TEST(Json, ParsesNestingUpToTheBound) {
  const std::string text = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(parseJson(text, "ok.json").is_array());
}

TEST(Json, RefusesDeepNestingNamingTheSource) {
  const std::string deep = "{\"extra\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_EQ(messageOf(deep), "config.json: JSON nested deeper than 64 levels");
  const std::string justOver = std::string(kMaxJsonDepth + 1, '{');
  EXPECT_NE(messageOf(std::string(kMaxJsonDepth + 1, '[')).find("nested deeper"), std::string::npos);
  EXPECT_NE(messageOf(justOver).find("config.json: "), std::string::npos);
}

TEST(Json, ParseErrorsNameTheByte) {
  const std::string message = messageOf("{\"a\": tru}");
  EXPECT_EQ(message.rfind("config.json: invalid JSON at byte ", 0), 0u) << message;
  EXPECT_TRUE(parseOrderedJson("{\"b\": 1, \"a\": 2}", "x").begin().key() == "b");
}

TEST(Json, RefusesANulByteInsteadOfEndingTheTextThere) {
  EXPECT_EQ(messageOf(std::string("{\"a\": 1}\0{garbage", 17)), "config.json: invalid JSON at byte 9: a NUL byte");
}

TEST(Json, RefusesANumberTooLargeForADouble) {
  const std::string message = messageOf("{\"rope_theta\": 1e400}");
  EXPECT_EQ(message.rfind("config.json: invalid JSON: ", 0), 0u) << message;
}

TEST(Json, QuotesEscapeAndCut) {
  EXPECT_EQ(quoteForMessage("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\x01\"");
  const std::string huge(1 << 20, '\x07');
  const std::string quoted = quoteForMessage(huge, 4);
  EXPECT_EQ(quoted, "\"\\x07\\x07\\x07\\x07\"… (1048576 bytes)");
}

TEST(Json, DescribesValuesWithoutWalkingThem) {
  EXPECT_EQ(describeJsonValue(nlohmann::json::array({1, 2, 3})), "an array of 3 elements");
  EXPECT_EQ(describeJsonValue(nlohmann::json{{"k", 1}}), "an object with 1 key");
  EXPECT_EQ(describeJsonValue(nlohmann::json("x\ny")), "\"x\\ny\"");
  EXPECT_EQ(describeJsonValue(nlohmann::json(4611686018427387904LL)), "4611686018427387904");
  EXPECT_EQ(describeJsonValue(nlohmann::json(true)), "true");
}

}  // namespace
}  // namespace dgemma
