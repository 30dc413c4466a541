// JSON from files the user controls (configs, manifests, plan headers, safetensors headers, JSONL
// rows): parsing with a nesting bound, and short, escaped renderings of untrusted text and values
// for error messages. nlohmann's parser keeps its own stack, but dump() and the code that walks a
// parsed value recurse, so a 100,000-deep array must be refused while it is read.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dgemma {

// Deeper than any file dgemma reads needs (a plan header is 5 levels, a tokenizer.json 6).
constexpr int kMaxJsonDepth = 64;

// Throws InputError "SOURCE: invalid JSON at byte N: <reason>" (a NUL byte anywhere included) or
// "SOURCE: JSON nested deeper than 64 levels (at byte N)". `source` names the file (and line).
nlohmann::json parseJson(std::string_view text, const std::string& source);
// The same, calling `onTopLevelKey` with each key of the top-level object as it is read, repeated
// keys included (a parsed object keeps only the last of them; a caller to whom a repeat is an error
// throws from the callback).
nlohmann::json parseJson(std::string_view text, const std::string& source,
                         const std::function<void(const std::string& key)>& onTopLevelKey);
nlohmann::ordered_json parseOrderedJson(std::string_view text, const std::string& source);

// `text` quoted for a message: control characters and non-ASCII bytes escaped, cut to `maxChars`
// characters with the total length noted ("\"abc…\" (1048576 bytes)").
std::string quoteForMessage(std::string_view text, std::size_t maxChars = 60);
// A value for a message without walking it: scalars rendered (strings quoted as above, numbers
// cut), arrays and objects by their size ("an array of 3 elements").
std::string describeJsonValue(const nlohmann::json& value, std::size_t maxChars = 60);
std::string describeJsonValue(const nlohmann::ordered_json& value, std::size_t maxChars = 60);

}  // namespace dgemma
