#include "runtime/serve/constrain/JsonSchema.h"

#include <algorithm>
#include <set>

#include "support/Error.h"

namespace dgemma::serve {
namespace {

constexpr int64_t kMaxCount = 256;  // the largest minLength, maxLength, minItems, maxItems
// Digits of an integer part or a fraction, and of an exponent: integers fit a signed 64-bit integer
// and every number a finite double, so that any JSON parser reads them back.
constexpr int64_t kMaxDigits = 18, kMaxExponentDigits = 2;
// Deeper nesting would only serve to exhaust the compiler's stack.
constexpr int kMaxSchemaDepth = 32;

ByteExpr lit(std::string_view bytes) { return ByteExpr::literal(bytes); }

ByteExpr digits() { return ByteExpr::byteRange('0', '9'); }

ByteExpr integerExpr() {
  const ByteExpr magnitude = ByteExpr::alternation(
      {lit("0"),
       ByteExpr::sequence({ByteExpr::byteRange('1', '9'), ByteExpr::repetition(digits(), 0, kMaxDigits - 1)})});
  return ByteExpr::sequence({ByteExpr::optional(lit("-")), magnitude});
}

ByteExpr numberExpr() {
  const ByteExpr fraction = ByteExpr::sequence({lit("."), ByteExpr::repetition(digits(), 1, kMaxDigits)});
  const ByteExpr exponent = ByteExpr::sequence({ByteExpr::alternation({lit("e"), lit("E")}),
                                                ByteExpr::optional(ByteExpr::alternation({lit("+"), lit("-")})),
                                                ByteExpr::repetition(digits(), 1, kMaxExponentDigits)});
  return ByteExpr::sequence({integerExpr(), ByteExpr::optional(fraction), ByteExpr::optional(exponent)});
}

// One character of a string's content.
ByteExpr stringCharExpr() {
  ByteSet printable;
  for (int b = 0x20; b <= 0x7E; ++b) printable.set(b);
  printable.reset('"');
  printable.reset('\\');
  ByteSet escaped;
  for (char c : std::string_view("\"\\/nt")) escaped.set(static_cast<uint8_t>(c));
  return ByteExpr::alternation(
      {ByteExpr::utf8Char(printable, true), ByteExpr::sequence({lit("\\"), ByteExpr::byteClass(escaped)})});
}

ByteExpr stringExpr(int64_t minLength, std::optional<int64_t> maxLength) {
  return ByteExpr::sequence({lit("\""), ByteExpr::repetition(stringCharExpr(), minLength, maxLength), lit("\"")});
}

}  // namespace

ByteExpr jsonStringExpr() { return stringExpr(0, std::nullopt); }

namespace {

// A value as compact JSON text (invalid UTF-8 in a string, possible only in a schema built in C++,
// becomes U+FFFD rather than an exception).
template <class Json>
ByteExpr literalValue(const Json& value) {
  return lit(value.dump(-1, ' ', false, Json::error_handler_t::replace));
}

bool isAnnotation(const std::string& key) {
  static const std::set<std::string> kAnnotations{"title", "description", "$schema", "$id", "default", "examples"};
  return kAnnotations.count(key) > 0;
}

// A count keyword (minLength, maxItems, ...): a non-negative integer up to kMaxCount.
template <class Json>
std::optional<int64_t> readCount(const Json& schema, const char* key, const std::string& where) {
  auto it = schema.find(key);
  if (it == schema.end()) return std::nullopt;
  if (!it->is_number_integer() || it->template get<int64_t>() < 0 || it->template get<int64_t>() > kMaxCount)
    throw InputError(where + "." + key + ": expected an integer from 0 to " + std::to_string(kMaxCount) + ", got " +
                     it->dump());
  return it->template get<int64_t>();
}

template <class Json>
std::pair<int64_t, std::optional<int64_t>> readRange(const Json& schema, const char* minKey, const char* maxKey,
                                                     const std::string& where) {
  const int64_t min = readCount(schema, minKey, where).value_or(0);
  const std::optional<int64_t> max = readCount(schema, maxKey, where);
  if (max && *max < min)
    throw InputError(where + "." + maxKey + ": " + std::to_string(*max) + " is below " + minKey + " " +
                     std::to_string(min));
  return {min, max};
}

// Any object whose values nest at most depth - 1 deep.
ByteExpr anyObjectExpr(int depth) {
  const ByteExpr member = ByteExpr::sequence({jsonStringExpr(), lit(":"), jsonValueExpr(depth - 1)});
  return ByteExpr::sequence({lit("{"), ByteExpr::optional(ByteExpr::separatedList(member, lit(","))), lit("}")});
}

// Json is nlohmann::json (object keys sorted) or nlohmann::ordered_json (keys in document order).
template <class Json>
class SchemaCompiler {
 public:
  ByteExpr compile(const Json& schema, const std::string& where) {
    if (++depth_ > kMaxSchemaDepth)
      throw InputError(where + ": schemas nested deeper than " + std::to_string(kMaxSchemaDepth));
    ByteExpr expr = compileAtDepth(schema, where);
    --depth_;
    return expr;
  }

 private:
  ByteExpr compileAtDepth(const Json& schema, const std::string& where) {
    if (schema.is_boolean()) {
      if (schema.template get<bool>()) return jsonValueExpr(kAnyValueDepth);
      throw InputError(where + ": the schema false admits no value");
    }
    if (!schema.is_object()) throw InputError(where + ": expected a schema (a JSON object), got " + schema.dump());
    checkKeywords(schema, where);
    if (schema.contains("const")) return literalValue(schema["const"]);
    if (schema.contains("enum")) return enumExpr(schema["enum"], where + ".enum");
    if (schema.contains("anyOf")) return anyOfExpr(schema["anyOf"], where + ".anyOf");
    if (schema.contains("type")) {
      const Json& type = schema["type"];
      if (type.is_string()) return typeExpr(schema, type.template get<std::string>(), where);
      if (type.is_array() && !type.empty()) {
        std::vector<ByteExpr> choices;
        for (size_t i = 0; i < type.size(); ++i) {
          if (!type[i].is_string())
            throw InputError(where + ".type[" + std::to_string(i) + "]: expected a type name, got " + type[i].dump());
          choices.push_back(
              typeExpr(schema, type[i].template get<std::string>(), where + ".type[" + std::to_string(i) + "]"));
        }
        return ByteExpr::alternation(std::move(choices));
      }
      throw InputError(where + ".type: expected a type name or a non-empty list of them, got " + type.dump());
    }
    if (schema.contains("properties")) return objectExpr(schema, where);
    if (schema.contains("items")) return arrayExpr(schema, where);
    return jsonValueExpr(kAnyValueDepth);
  }

  static void checkKeywords(const Json& schema, const std::string& where) {
    static const std::set<std::string> kSupported{"type",      "properties", "required", "additionalProperties",
                                                  "minLength", "maxLength",  "enum",     "const",
                                                  "anyOf",     "items",      "minItems", "maxItems"};
    for (const auto& [key, value] : schema.items())
      if (!kSupported.count(key) && !isAnnotation(key))
        throw InputError(where + ": unsupported keyword \"" + key + "\"");
  }

  ByteExpr enumExpr(const Json& values, const std::string& where) {
    if (!values.is_array() || values.empty())
      throw InputError(where + ": expected a non-empty list of values, got " + values.dump());
    std::vector<ByteExpr> choices;
    for (const Json& value : values) choices.push_back(literalValue(value));
    return ByteExpr::alternation(std::move(choices));
  }

  ByteExpr anyOfExpr(const Json& schemas, const std::string& where) {
    if (!schemas.is_array() || schemas.empty())
      throw InputError(where + ": expected a non-empty list of schemas, got " + schemas.dump());
    std::vector<ByteExpr> choices;
    for (size_t i = 0; i < schemas.size(); ++i)
      choices.push_back(compile(schemas[i], where + "[" + std::to_string(i) + "]"));
    return ByteExpr::alternation(std::move(choices));
  }

  ByteExpr typeExpr(const Json& schema, const std::string& type, const std::string& where) {
    if (type == "object")
      return schema.contains("properties") ? objectExpr(schema, where) : anyObjectExpr(kAnyValueDepth);
    if (type == "array") return arrayExpr(schema, where);
    if (type == "string") {
      const auto [min, max] = readRange(schema, "minLength", "maxLength", where);
      return stringExpr(min, max);
    }
    if (type == "integer") return integerExpr();
    if (type == "number") return numberExpr();
    if (type == "boolean") return ByteExpr::alternation({lit("true"), lit("false")});
    if (type == "null") return lit("null");
    throw InputError(where + ".type: unsupported type \"" + type +
                     "\" (expected object, array, string, integer, number, boolean or null)");
  }

  ByteExpr objectExpr(const Json& schema, const std::string& where) {
    std::vector<ByteExpr> members;
    std::vector<bool> required;
    std::vector<std::string> names;
    if (auto it = schema.find("properties"); it != schema.end()) {
      if (!it->is_object()) throw InputError(where + ".properties: expected an object, got " + it->dump());
      for (const auto& [name, property] : it->items()) {
        names.push_back(name);
        members.push_back(
            ByteExpr::sequence({lit(Json(name).dump(-1, ' ', false, Json::error_handler_t::replace) + ":"),
                                compile(property, where + ".properties." + name)}));
        required.push_back(false);
      }
    }
    if (auto it = schema.find("required"); it != schema.end()) {
      if (!it->is_array()) throw InputError(where + ".required: expected a list of property names, got " + it->dump());
      for (size_t i = 0; i < it->size(); ++i) {
        const Json& name = (*it)[i];
        auto found =
            name.is_string() ? std::find(names.begin(), names.end(), name.template get<std::string>()) : names.end();
        if (found == names.end())
          throw InputError(where + ".required[" + std::to_string(i) + "]: expected one of the properties, got " +
                           name.dump());
        required[found - names.begin()] = true;
      }
    }
    return ByteExpr::sequence(
        {lit("{"), ByteExpr::separatedSubsequence(std::move(members), std::move(required), lit(",")), lit("}")});
  }

  ByteExpr arrayExpr(const Json& schema, const std::string& where) {
    const auto [min, max] = readRange(schema, "minItems", "maxItems", where);
    const ByteExpr item =
        schema.contains("items") ? compile(schema["items"], where + ".items") : jsonValueExpr(kAnyValueDepth - 1);
    const ByteExpr items = [&] {
      if (max && *max == 0) return ByteExpr::empty();
      if (min == 0 && !max) return ByteExpr::optional(ByteExpr::separatedList(item, lit(",")));
      // item (, item){min-1, max-1}; with min 0, the whole list is optional.
      const ByteExpr more = ByteExpr::repetition(ByteExpr::sequence({lit(","), item}), std::max<int64_t>(min, 1) - 1,
                                                 max ? std::optional<int64_t>(*max - 1) : std::nullopt);
      const ByteExpr list = ByteExpr::sequence({item, more});
      return min == 0 ? ByteExpr::optional(list) : list;
    }();
    return ByteExpr::sequence({lit("["), items, lit("]")});
  }

  int depth_ = 0;
};

}  // namespace

ByteExpr jsonValueExpr(int depth) {
  std::vector<ByteExpr> choices{jsonStringExpr(), numberExpr(), lit("true"), lit("false"), lit("null")};
  if (depth > 0) {
    choices.push_back(anyObjectExpr(depth));
    const ByteExpr inner = jsonValueExpr(depth - 1);
    choices.push_back(
        ByteExpr::sequence({lit("["), ByteExpr::optional(ByteExpr::separatedList(inner, lit(","))), lit("]")}));
  }
  return ByteExpr::alternation(std::move(choices));
}

ByteExpr jsonSchemaExpr(const nlohmann::json& schema, const std::string& where) {
  return SchemaCompiler<nlohmann::json>().compile(schema, where);
}

ByteExpr jsonSchemaExpr(const nlohmann::ordered_json& schema, const std::string& where) {
  return SchemaCompiler<nlohmann::ordered_json>().compile(schema, where);
}

std::shared_ptr<const ByteAutomaton> compileJsonSchema(const nlohmann::json& schema, const std::string& where) {
  return std::make_shared<const ByteAutomaton>(jsonSchemaExpr(schema, where), where);
}

std::shared_ptr<const ByteAutomaton> compileJsonSchema(const nlohmann::ordered_json& schema, const std::string& where) {
  return std::make_shared<const ByteAutomaton>(jsonSchemaExpr(schema, where), where);
}

std::shared_ptr<const ByteAutomaton> compileJsonObject(const std::string& where) {
  return std::make_shared<const ByteAutomaton>(anyObjectExpr(kAnyValueDepth), where);
}

}  // namespace dgemma::serve
