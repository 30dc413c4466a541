// Parsing one JSONL line into a JSON value, stricter than nlohmann's default DOM parser: a key that
// appears twice in one object is an error (nlohmann would keep the last value silently), nesting
// deeper than kMaxJsonDepth (support/Json.h) is refused while it is read, and the messages quote the
// line's text only escaped and cut (support/Json.h, quoteForMessage). support/Json.h's parseJson has
// the same depth bound but keeps the last of two equal keys, which docs/data.md refuses.
#pragma once

#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "support/Json.h"

namespace dgemma {

// Why a line is not an acceptable JSON value. `field` is the path of the offending value in the
// notation of RowError ("messages[1].role"), or "row" for the line as a whole; `expected` is the
// "expected ..., got ..." part of the message.
struct JsonLineError {
  std::string field;
  std::string expected;
};

// The JSON path of `key` inside the object at `parentPath` ("" for the top level): ".key" for a
// plain name, `["..."]` quoted and cut (quoteForMessage) for any other key.
std::string jsonChildPath(const std::string& parentPath, const std::string& key);
// The JSON path of element `index` of the array at `parentPath`.
std::string jsonIndexPath(const std::string& parentPath, size_t index);

// Parses `line` (one complete JSON text). The line must already be valid UTF-8 and hold no NUL byte
// (nlohmann's lexer takes a NUL for the end of the input and would ignore the rest of the line).
std::variant<nlohmann::json, JsonLineError> parseJsonLine(std::string_view line);

}  // namespace dgemma
