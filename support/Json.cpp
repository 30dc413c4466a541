#include "support/Json.h"

#include <cstdio>

#include "support/Error.h"

namespace dgemma {
namespace {

template <typename Json>
Json parseBounded(std::string_view text, const std::string& source,
                  const std::function<void(const std::string&)>& onTopLevelKey = {}) {
  auto refuseDeepNesting = [&](int depth, typename Json::parse_event_t event, Json& value) {
    if (onTopLevelKey && event == Json::parse_event_t::key && depth == 1)
      onTopLevelKey(value.template get_ref<const std::string&>());
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      throw InputError(source + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    return true;
  };
  // nlohmann's lexer takes a NUL byte for the end of the input and ignores the rest of the text.
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos)
    throw InputError(source + ": invalid JSON at byte " + std::to_string(nul + 1) + ": a NUL byte");
  try {
    return Json::parse(text.begin(), text.end(), refuseDeepNesting);
  } catch (const typename Json::parse_error& error) {
    // nlohmann's message repeats the offending text; the byte offset is enough to find it.
    throw InputError(source + ": invalid JSON at byte " + std::to_string(error.byte) + ": " +
                     quoteForMessage(error.what(), 160));
  } catch (const typename Json::out_of_range& error) {
    // A number too large for a double (1e400) is reported as out_of_range, not as a parse error.
    throw InputError(source + ": invalid JSON: " + quoteForMessage(error.what(), 160));
  }
}

template <typename Json>
std::string describeBounded(const Json& value, std::size_t maxChars) {
  const std::string count = std::to_string(value.size());
  if (value.is_array()) return "an array of " + count + (value.size() == 1 ? " element" : " elements");
  if (value.is_object()) return "an object with " + count + (value.size() == 1 ? " key" : " keys");
  if (value.is_string()) return quoteForMessage(value.template get_ref<const std::string&>(), maxChars);
  if (value.is_discarded()) return "nothing";
  // Scalars: dump() does not recurse here; a number's text is short.
  std::string text = value.dump();
  if (text.size() > maxChars) text = text.substr(0, maxChars) + "…";
  return text;
}

}  // namespace

nlohmann::json parseJson(std::string_view text, const std::string& source) {
  return parseBounded<nlohmann::json>(text, source);
}

nlohmann::json parseJson(std::string_view text, const std::string& source,
                         const std::function<void(const std::string& key)>& onTopLevelKey) {
  return parseBounded<nlohmann::json>(text, source, onTopLevelKey);
}

nlohmann::ordered_json parseOrderedJson(std::string_view text, const std::string& source) {
  return parseBounded<nlohmann::ordered_json>(text, source);
}

std::string quoteForMessage(std::string_view text, std::size_t maxChars) {
  std::string out = "\"";
  std::size_t shown = 0;
  for (unsigned char c : text) {
    if (shown == maxChars) break;
    ++shown;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
    }
  }
  out += '"';
  if (shown < text.size()) out += "… (" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string describeJsonValue(const nlohmann::json& value, std::size_t maxChars) {
  return describeBounded(value, maxChars);
}

std::string describeJsonValue(const nlohmann::ordered_json& value, std::size_t maxChars) {
  return describeBounded(value, maxChars);
}

}  // namespace dgemma
