// compileJsonSchema and compileJsonObject: accepted and rejected texts, property order, and errors
// that name the JSON path of the unsupported part.
#include <gtest/gtest.h>

#include "runtime/serve/constrain/JsonSchema.h"
#include "support/Error.h"
#include "test/unit/serve/constrain/SchemaValidator.h"

namespace dgemma::serve {
namespace {

using nlohmann::json;

std::string errorOf(const json& schema) {
  try {
    compileJsonSchema(schema, "response_format.json_schema.schema");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonSchema, ObjectWithRequiredAndOptionalProperties) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "age": {"type": "integer"}, "name": {"type": "string", "maxLength": 3}, "ok": {"type": "boolean"}},
      "required": ["name"], "additionalProperties": false})");
  const auto automaton = compileJsonSchema(schema, "schema");
  for (const char* good : {R"({"name":"bo"})", R"({"age":-12,"name":""})", R"({"name":"abc","ok":true})",
                           R"({"age":0,"name":"\"\\","ok":false})", "{\"name\":\"\xC3\xA9t\xC3\xA9\"}"}) {
    EXPECT_TRUE(automaton->matches(good)) << good;
    EXPECT_TRUE(test::validates(json::parse(good), schema)) << good;
  }
  for (const char* bad : {"{}", R"({"age":1})", R"({"name":"abcd"})", R"({ "name":"a"})", R"({"name":"a","age":1})",
                          R"({"age":01,"name":"a"})", R"({"name":"a",})", "{\"name\":\"\n\"}", "{\"name\":\"\xC3\"}"})
    EXPECT_FALSE(automaton->matches(bad)) << bad;
}

TEST(JsonSchema, PropertiesFollowTheSchemaOrderWithOrderedJson) {
  const auto schema = nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"zeta": {"type": "null"}, "alpha": {"type": "null"}},
          "required": ["zeta", "alpha"]})");
  const auto automaton = compileJsonSchema(schema, "schema");
  EXPECT_TRUE(automaton->matches(R"({"zeta":null,"alpha":null})"));
  EXPECT_FALSE(automaton->matches(R"({"alpha":null,"zeta":null})"));
}

TEST(JsonSchema, ScalarsArraysEnumsAndAnyOf) {
  struct Case {
    const char* schema;
    std::vector<std::string> accepted, rejected;
  };
  const std::vector<Case> cases{
      {R"({"type": "number"})", {"0", "-1.5", "2e10", "3.25E-2"}, {"01", "1.", ".5", "+1", "1e"}},
      {R"({"type": "integer"})", {"0", "-7", "120", "-999999999999999999"}, {"1.0", "-", "00", "1000000000000000000"}},
      {R"({"type": "number"})", {"1.5e99", "0.000000000000000001"}, {"1e100", "0.0000000000000000001"}},
      {R"({"type": ["integer", "null"]})", {"3", "null"}, {"true"}},
      {R"({"enum": ["red", 2, null, {"a": 1}]})", {R"("red")", "2", "null", R"({"a":1})"}, {R"("blue")", "3"}},
      {R"({"const": "x"})", {R"("x")"}, {R"("y")"}},
      {R"({"anyOf": [{"type": "boolean"}, {"type": "array", "items": {"type": "integer"}, "maxItems": 2}]})",
       {"true", "[]", "[1,2]"},
       {"[1,2,3]", "[true]"}},
      {R"({"type": "array", "items": {"type": "string"}, "minItems": 1})",
       {R"([""])", R"(["a","b","c"])"},
       {"[]", "[1]"}},
      {R"({"type": "array", "minItems": 2, "maxItems": 3})", {R"([1,"a"])", R"([{},[],null])"}, {"[1]", "[1,2,3,4]"}},
      {R"({"type": "string", "minLength": 2})", {R"("ab")", R"("\n\t\/")"}, {R"("a")", R"("\u0041")", R"("\x")"}},
      {R"({})", {R"({"a":[1,{"b":null}]})", "3", R"("s")"}, {"", "{"}},
      {R"({"type": "object"})", {"{}", R"({"a":[1,{"b":null}]})"}, {"[]", R"({"a"})"}},
  };
  for (const Case& c : cases) {
    const json schema = json::parse(c.schema);
    const auto automaton = compileJsonSchema(schema, "schema");
    for (const std::string& text : c.accepted) {
      EXPECT_TRUE(automaton->matches(text)) << c.schema << " on " << text;
      EXPECT_TRUE(test::validates(json::parse(text), schema)) << c.schema << " on " << text;
    }
    for (const std::string& text : c.rejected) EXPECT_FALSE(automaton->matches(text)) << c.schema << " on " << text;
  }
}

TEST(JsonSchema, JsonObjectIsAnyObjectOfBoundedDepth) {
  const auto automaton = compileJsonObject("response_format");
  EXPECT_TRUE(automaton->matches("{}"));
  EXPECT_TRUE(automaton->matches(R"({"a":{"b":{"c":{"d":{"e":1}}}},"f":[[[]]]})"));
  EXPECT_FALSE(automaton->matches(R"({"a":{"b":{"c":{"d":{"e":{}}}}}})"));  // six levels
  EXPECT_FALSE(automaton->matches("[]"));
  EXPECT_FALSE(automaton->matches(R"({"a":1,})"));
}

TEST(JsonSchema, UnsupportedPartsAreLocatedErrors) {
  const std::vector<std::pair<const char*, const char*>> cases{
      {R"({"type": "object", "properties": {"age": {"type": "string", "pattern": "a+"}}})",
       "response_format.json_schema.schema.properties.age: unsupported keyword \"pattern\""},
      {R"({"type": "array", "items": {"$ref": "#/x"}})",
       "response_format.json_schema.schema.items: unsupported keyword \"$ref\""},
      {R"({"anyOf": [{"type": "integer"}, {"type": "date"}]})",
       "response_format.json_schema.schema.anyOf[1].type: unsupported type \"date\""},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})",
       "response_format.json_schema.schema.required[0]: expected one of the properties, got \"b\""},
      {R"({"type": "string", "maxLength": 1000})",
       "response_format.json_schema.schema.maxLength: expected an integer from 0 to 256, got 1000"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})",
       "response_format.json_schema.schema.maxItems: 2 is below minItems 3"},
      {R"({"enum": []})", "response_format.json_schema.schema.enum: expected a non-empty list of values"},
      {R"({"type": 3})", "response_format.json_schema.schema.type: expected a type name"},
      {R"([1])", "response_format.json_schema.schema: expected a schema (a JSON object)"},
  };
  for (const auto& [schema, expected] : cases) {
    const std::string message = errorOf(json::parse(schema));
    EXPECT_NE(message.find(expected), std::string::npos) << schema << ": " << message;
  }
  json deep = {{"type", "integer"}};
  for (int i = 0; i < 40; ++i) deep = {{"type", "array"}, {"items", deep}};
  std::string path = "response_format.json_schema.schema";
  for (int i = 0; i < 32; ++i) path += ".items";
  EXPECT_EQ(errorOf(deep), path + ": schemas nested deeper than 32");
}

}  // namespace
}  // namespace dgemma::serve
