// A small validator for the JSON schema subset of JsonSchema.h, the oracle of the tests.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

namespace dgemma::serve::test {

// Characters of a JSON string (code points).
inline int64_t utf8Length(const std::string& text) {
  int64_t count = 0;
  for (char c : text) count += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return count;
}

inline bool validates(const nlohmann::json& value, const nlohmann::json& schema) {
  using nlohmann::json;
  if (schema.is_boolean()) return schema.get<bool>();
  if (schema.contains("const")) return value == schema["const"];
  if (schema.contains("enum")) {
    for (const json& member : schema["enum"])
      if (value == member) return true;
    return false;
  }
  if (schema.contains("anyOf")) {
    for (const json& branch : schema["anyOf"])
      if (validates(value, branch)) return true;
    return false;
  }
  auto hasType = [&](const std::string& type) {
    if (!schema.contains("type")) return false;
    const json& t = schema["type"];
    if (t.is_string()) return t == type;
    for (const json& member : t)
      if (member == type) return true;
    return false;
  };
  if (!schema.contains("type")) {
    if (schema.contains("properties") && !value.is_object()) return false;
    if (schema.contains("items") && !value.is_array()) return false;
  }
  bool typeMatches = !schema.contains("type");
  if (value.is_object() && (hasType("object") || (!schema.contains("type") && schema.contains("properties")))) {
    if (schema.contains("properties")) {
      const json& properties = schema["properties"];
      for (const auto& [name, member] : value.items())
        if (!properties.contains(name) || !validates(member, properties[name])) return false;
    }
    for (const json& name : schema.value("required", json::array()))
      if (!value.contains(name.get<std::string>())) return false;
    typeMatches = true;
  } else if (value.is_array() && (hasType("array") || !schema.contains("type"))) {
    const auto size = static_cast<int64_t>(value.size());
    if (size < schema.value("minItems", int64_t{0}) || size > schema.value("maxItems", int64_t{1} << 40)) return false;
    if (schema.contains("items"))
      for (const json& item : value)
        if (!validates(item, schema["items"])) return false;
    typeMatches = true;
  } else if (value.is_string()) {
    const int64_t length = utf8Length(value.get<std::string>());
    if (length < schema.value("minLength", int64_t{0}) || length > schema.value("maxLength", int64_t{1} << 40))
      return false;
    typeMatches = typeMatches || hasType("string");
  } else if (value.is_number_integer() || value.is_number_unsigned()) {
    typeMatches = typeMatches || hasType("integer") || hasType("number");
  } else if (value.is_number_float()) {
    // A long integer parses as a double; JSON Schema counts any integral number as an integer.
    const double number = value.get<double>();
    typeMatches = typeMatches || hasType("number") || (hasType("integer") && std::floor(number) == number);
  } else if (value.is_boolean()) {
    typeMatches = typeMatches || hasType("boolean");
  } else if (value.is_null()) {
    typeMatches = typeMatches || hasType("null");
  }
  return typeMatches;
}

}  // namespace dgemma::serve::test
