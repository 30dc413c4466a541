// Parsing one JSONL line into a JSON value, stricter than nlohmann's default DOM parser: a key that
// appears twice in one object is an error (nlohmann would keep the last value silently), and nesting
// deeper than kMaxJsonDepth is refused.
#pragma once

#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

namespace dgemma {

inline constexpr size_t kMaxJsonDepth = 256;

// Why a line is not an acceptable JSON value. `field` is the path of the offending value in the
// notation of RowError ("messages[1].role"), or "row" for the line as a whole; `expected` is the
// "expected ..., got ..." part of the message.
struct JsonLineError {
  std::string field;
  std::string expected;
};

// The JSON path of `key` inside the object at `parentPath` ("" for the top level).
std::string jsonChildPath(const std::string& parentPath, const std::string& key);
// The JSON path of element `index` of the array at `parentPath`.
std::string jsonIndexPath(const std::string& parentPath, size_t index);

// Parses `line` (one complete JSON text). The line must already be valid UTF-8.
std::variant<nlohmann::json, JsonLineError> parseJsonLine(std::string_view line);

}  // namespace dgemma
