#include "runtime/data/rows/JsonLine.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <utility>
#include <vector>

namespace dgemma {

std::string jsonChildPath(const std::string& parentPath, const std::string& key) {
  // A key of the row's author lands in messages: plain names as they are, anything else quoted.
  constexpr size_t kMaxPlainKey = 60;
  const bool plain = !key.empty() && key.size() <= kMaxPlainKey && std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  if (!plain) return (parentPath.empty() ? std::string("row") : parentPath) + "[" + quoteForMessage(key) + "]";
  return parentPath.empty() ? key : parentPath + "." + key;
}

std::string jsonIndexPath(const std::string& parentPath, size_t index) {
  return (parentPath.empty() ? std::string("row") : parentPath) + "[" + std::to_string(index) + "]";
}

namespace {

using json = nlohmann::json;

// A SAX consumer that builds the DOM itself, so that it can see every key of every object.
class StrictDomBuilder {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  bool null() { return add(json(nullptr)) != nullptr; }
  bool boolean(bool value) { return add(json(value)) != nullptr; }
  bool number_integer(number_integer_t value) { return add(json(value)) != nullptr; }
  bool number_unsigned(number_unsigned_t value) { return add(json(value)) != nullptr; }
  bool number_float(number_float_t value, const string_t& /*text*/) { return add(json(value)) != nullptr; }
  bool string(string_t& value) { return add(json(std::move(value))) != nullptr; }
  bool binary(binary_t& value) { return add(json::binary(std::move(value))) != nullptr; }

  bool start_object(std::size_t /*elements*/) { return open(json::object()); }
  bool start_array(std::size_t /*elements*/) { return open(json::array()); }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }

  bool key(string_t& name) {
    Frame& frame = stack_.back();
    if (!frame.keys.insert(name).second) {
      error_ = JsonLineError{jsonChildPath(frame.path, name),
                             "expected each key once in an object, got " + quoteForMessage(name) + " twice"};
      return false;
    }
    frame.pendingKey = std::move(name);
    return true;
  }

  bool parse_error(std::size_t /*position*/, const std::string& lastToken, const nlohmann::detail::exception& ex) {
    std::string message = ex.what();
    // nlohmann ends the message with the raw token it read last ("; last read: '...'"), which can be
    // megabytes of the line, control characters included: quote it escaped and cut instead.
    if (auto lastRead = message.find("; last read: "); lastRead != std::string::npos) {
      message.erase(lastRead);
      message += "; last read: " + quoteForMessage(lastToken);
    }
    // "[json.exception.parse_error.101] parse error at line 1, column 5: ..." -> "parse error at column 5: ..."
    if (auto close = message.find("] "); !message.empty() && message[0] == '[' && close != std::string::npos) {
      message.erase(0, close + 2);
    }
    if (auto at = message.find("at line 1, column "); at != std::string::npos) {
      message.replace(at, 18, "at column ");
    }
    error_ = JsonLineError{"row", "expected valid JSON, got " + message};
    return false;
  }

  json& root() { return root_; }
  const JsonLineError& error() const { return error_; }

 private:
  struct Frame {
    json* value;
    std::string path;
    std::string pendingKey;
    std::set<std::string> keys;
  };

  // The path the next value added to the innermost open container will have.
  std::string nextPath() const {
    if (stack_.empty()) return "";
    const Frame& frame = stack_.back();
    if (frame.value->is_array()) return jsonIndexPath(frame.path, frame.value->size());
    return jsonChildPath(frame.path, frame.pendingKey);
  }

  json* add(json value) {
    if (stack_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    Frame& frame = stack_.back();
    if (frame.value->is_array()) {
      frame.value->push_back(std::move(value));
      return &frame.value->back();
    }
    json& slot = (*frame.value)[frame.pendingKey];
    slot = std::move(value);
    return &slot;
  }

  bool open(json container) {
    std::string path = nextPath();
    if (stack_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      error_ = JsonLineError{path.empty() ? "row" : path,
                             "expected at most " + std::to_string(kMaxJsonDepth) +
                                 " levels of nested arrays and objects, got more"};
      return false;
    }
    json* value = add(std::move(container));
    stack_.push_back(Frame{value, std::move(path), {}, {}});
    return true;
  }

  json root_;
  std::vector<Frame> stack_;
  JsonLineError error_{"row", "expected valid JSON"};
};

}  // namespace

std::variant<nlohmann::json, JsonLineError> parseJsonLine(std::string_view line) {
  StrictDomBuilder builder;
  const bool ok = json::sax_parse(line.begin(), line.end(), &builder, json::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  if (!ok) return builder.error();
  return std::move(builder.root());
}

}  // namespace dgemma
