#include "runtime/data/rows/Rows.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

#include "support/Error.h"
#include "support/InputFile.h"
#include "support/Json.h"
#include "runtime/data/rows/JsonLine.h"
#include "runtime/data/rows/Utf8.h"

namespace dgemma {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string RowError::text() const {
  return file + ":" + std::to_string(line) + ": " + field + ": " + expected;
}

const char* roleName(Message::Role role) {
  switch (role) {
    case Message::System: return "system";
    case Message::User: return "user";
    case Message::Assistant: return "assistant";
  }
  return "?";
}

namespace {

constexpr const char* kMissing = "nothing (the key is missing)";
constexpr const char* kRoles = "\"system\", \"user\" or \"assistant\"";
constexpr const char* kPartTypes = "\"text\" or \"image\"";

// What a value is, for "got ...": the JSON type, or the string itself for strings.
std::string describe(const json& value) {
  if (value.is_string()) return quoteForMessage(value.get_ref<const std::string&>());
  return value.type_name();
}

// A resolved path for a message: as it is when short and printable, otherwise quoted and cut.
std::string shownPath(const fs::path& path) {
  const std::string& text = path.native();
  constexpr size_t kMaxShown = 200;
  const bool printable = std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f; });
  return printable && text.size() <= kMaxShown ? text : quoteForMessage(text, kMaxShown);
}

bool isBlank(const std::string& text) {
  for (char c : text) {
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

// Validates one row; the first error wins.
class RowParser {
 public:
  RowParser(const std::string& file, int64_t line, const std::string& directory, bool requireCompletion)
      : file_(file), line_(line), directory_(directory), requireCompletion_(requireCompletion) {}

  JsonlRowReader::Result parse(const std::string& text) {
    // Before anything else: nlohmann's lexer ends the input at a NUL, silently dropping the rest of
    // the line (even a whole second row).
    if (const size_t nul = text.find('\0'); nul != std::string::npos) {
      return error("row", "expected a line without NUL bytes, got one at byte column " + std::to_string(nul + 1));
    }
    if (auto bad = findInvalidUtf8(text)) {
      return error("row", describeUtf8Problem(*bad));
    }
    auto parsed = parseJsonLine(text);
    if (auto* problem = std::get_if<JsonLineError>(&parsed)) return error(problem->field, problem->expected);
    const json& doc = std::get<json>(parsed);
    if (!doc.is_object()) return error("row", "expected a JSON object, got " + describe(doc));

    Row row;
    row.line = line_;
    auto messages = doc.find("messages");
    if (messages == doc.end()) return error("messages", std::string("expected a non-empty array of messages, got ") + kMissing);
    if (!messages->is_array()) return error("messages", "expected a non-empty array of messages, got " + describe(*messages));
    if (messages->empty()) return error("messages", "expected a non-empty array of messages, got an empty array");
    for (size_t i = 0; i < messages->size(); ++i) {
      Message message;
      if (auto failure = parseMessage((*messages)[i], i, message)) return *failure;
      row.messages.push_back(std::move(message));
    }
    if (row.messages.back().role == Message::Assistant) {
      return error(jsonChildPath(jsonIndexPath("messages", row.messages.size() - 1), "role"),
                   "expected the last message to be \"user\" or \"system\" (the prompt must end before the "
                   "completion), got \"assistant\"");
    }

    if (auto reference = doc.find("reference"); reference != doc.end()) row.reference = *reference;
    auto completion = doc.find("completion");
    if (completion == doc.end() && !requireCompletion_) return row;
    if (completion == doc.end()) return error("completion", std::string("expected a string, got ") + kMissing);
    if (!completion->is_string()) return error("completion", "expected a string, got " + describe(*completion));
    row.completion = completion->get<std::string>();
    row.hasCompletion = true;
    return row;
  }

 private:
  RowError error(std::string field, std::string expected) const {
    return RowError{file_, line_, std::move(field), std::move(expected)};
  }

  std::optional<RowError> parseMessage(const json& value, size_t index, Message& message) {
    const std::string path = jsonIndexPath("messages", index);
    if (!value.is_object()) return error(path, "expected a message object, got " + describe(value));

    const std::string rolePath = jsonChildPath(path, "role");
    auto role = value.find("role");
    if (role == value.end()) return error(rolePath, std::string("expected ") + kRoles + ", got " + kMissing);
    if (!role->is_string()) return error(rolePath, std::string("expected ") + kRoles + ", got " + describe(*role));
    const auto& roleText = role->get_ref<const std::string&>();
    if (roleText == "system") {
      if (index != 0) {
        return error(rolePath, "expected \"user\" or \"assistant\" (a system message may only be the first "
                               "message), got \"system\"");
      }
      message.role = Message::System;
    } else if (roleText == "user") {
      message.role = Message::User;
    } else if (roleText == "assistant") {
      message.role = Message::Assistant;
    } else {
      return error(rolePath, std::string("expected ") + kRoles + ", got " + describe(*role));
    }

    const std::string contentPath = jsonChildPath(path, "content");
    auto content = value.find("content");
    if (content == value.end()) {
      return error(contentPath, std::string("expected a string or an array of parts, got ") + kMissing);
    }
    if (content->is_string()) {
      message.content.push_back(ContentPart{ContentPart::Text, content->get<std::string>(), ""});
      return std::nullopt;
    }
    if (!content->is_array()) {
      return error(contentPath, "expected a string or an array of parts, got " + describe(*content));
    }
    message.contentIsList = true;
    for (size_t j = 0; j < content->size(); ++j) {
      ContentPart part;
      if (auto failure = parsePart((*content)[j], jsonIndexPath(contentPath, j), part)) return failure;
      message.content.push_back(std::move(part));
    }
    return std::nullopt;
  }

  std::optional<RowError> parsePart(const json& value, const std::string& path, ContentPart& part) {
    if (!value.is_object()) return error(path, "expected a part object, got " + describe(value));
    const std::string typePath = jsonChildPath(path, "type");
    auto type = value.find("type");
    if (type == value.end()) return error(typePath, std::string("expected ") + kPartTypes + ", got " + kMissing);
    const bool isText = type->is_string() && type->get_ref<const std::string&>() == "text";
    const bool isImage = type->is_string() && type->get_ref<const std::string&>() == "image";
    if (!isText && !isImage) return error(typePath, std::string("expected ") + kPartTypes + ", got " + describe(*type));

    const char* key = isText ? "text" : "image";
    const std::string keyPath = jsonChildPath(path, key);
    auto field = value.find(key);
    if (field == value.end()) return error(keyPath, std::string("expected a string, got ") + kMissing);
    if (!field->is_string()) return error(keyPath, "expected a string, got " + describe(*field));
    const auto& text = field->get_ref<const std::string&>();
    if (isText) {
      part.kind = ContentPart::Text;
      part.text = text;
      return std::nullopt;
    }
    part.kind = ContentPart::Image;
    if (text.empty()) return error(keyPath, "expected a local image file path, got an empty string");
    // The OS reads a path up to its first NUL: "x.png\u0000.txt" would open x.png.
    if (const size_t nul = text.find('\0'); nul != std::string::npos) {
      return error(keyPath, "expected a file path without NUL bytes, got " + quoteForMessage(text) + " (a NUL at byte " +
                                std::to_string(nul + 1) + ")");
    }
    if (text.find("://") != std::string::npos) {
      return error(keyPath, "expected a local image file path (remote images are not supported), got " + quoteForMessage(text));
    }
    fs::path resolved(text);
    if (resolved.is_relative()) resolved = fs::path(directory_) / resolved;
    resolved = resolved.lexically_normal();
    std::error_code ec;
    const fs::file_status status = fs::status(resolved, ec);
    if (status.type() == fs::file_type::not_found) {
      return error(keyPath, "expected an existing image file, got " + quoteForMessage(text) + " (" + shownPath(resolved) +
                                " does not exist)");
    }
    if (ec) {
      return error(keyPath, "expected an existing image file, got " + quoteForMessage(text) + " (" + shownPath(resolved) +
                                ": " + ec.message() + ")");
    }
    if (status.type() == fs::file_type::directory) {
      return error(keyPath, "expected an image file, got " + quoteForMessage(text) + " (" + shownPath(resolved) +
                                " is a directory)");
    }
    if (status.type() != fs::file_type::regular) {
      return error(keyPath, "expected an image file, got " + quoteForMessage(text) + " (" + shownPath(resolved) +
                                " is not a regular file)");
    }
    part.imagePath = resolved.string();
    return std::nullopt;
  }

  const std::string& file_;
  int64_t line_;
  const std::string& directory_;
  bool requireCompletion_;
};

}  // namespace

JsonlRowReader::Result parseRowLine(const std::string& text, const std::string& file, int64_t line, const std::string& directory,
                                    bool requireCompletion) {
  return RowParser(file, line, directory, requireCompletion).parse(text);
}

Row parseRowOrThrow(const std::string& text, const std::string& file, int64_t line, const std::string& directory,
                    bool requireCompletion) {
  JsonlRowReader::Result result = parseRowLine(text, file, line, directory, requireCompletion);
  if (auto* failure = std::get_if<RowError>(&result)) throw InputError(failure->text());
  return std::get<Row>(std::move(result));
}

JsonlRowReader::~JsonlRowReader() {
  if (file_ != nullptr) std::fclose(file_);
}

void JsonlRowReader::open(const std::string& path) {
  if (file_ != nullptr) {
    std::fclose(file_);
    file_ = nullptr;
  }
  // A regular file only: a device or FIFO could be endless (/dev/zero) and the reader would never
  // return.
  RegularFile regular(path, "a regular JSONL file");
  file_ = ::fdopen(regular.fd(), "rb");
  if (file_ == nullptr) throw RuntimeError(path + ": cannot read: " + std::strerror(errno));
  regular.release();
  path_ = path;
  std::error_code ec;
  fs::path absolute = fs::absolute(fs::path(path), ec);
  directory_ = (ec ? fs::path(path) : absolute).parent_path().lexically_normal().string();
  buffer_.assign(size_t{1} << 20, '\0');
  bufferPos_ = bufferEnd_ = 0;
  eof_ = false;
  line_ = 0;
  blank_ = 0;
}

size_t JsonlRowReader::fillBuffer() {
  bufferPos_ = bufferEnd_ = 0;
  if (eof_) return 0;
  const size_t count = std::fread(buffer_.data(), 1, buffer_.size(), file_);
  if (count == 0) {
    if (std::ferror(file_)) throw RuntimeError(path_ + ": read error: " + std::strerror(errno));
    eof_ = true;
  }
  bufferEnd_ = count;
  return count;
}

bool JsonlRowReader::readLine(std::string& lineText, bool& tooLong, int64_t& length) {
  lineText.clear();
  tooLong = false;
  length = 0;
  bool any = false;
  for (;;) {
    if (bufferPos_ == bufferEnd_ && fillBuffer() == 0) return any;
    any = true;
    const char* start = buffer_.data() + bufferPos_;
    const size_t available = bufferEnd_ - bufferPos_;
    const auto* newline = static_cast<const char*>(std::memchr(start, '\n', available));
    const size_t take = newline != nullptr ? static_cast<size_t>(newline - start) : available;
    length += static_cast<int64_t>(take);
    if (!tooLong) {
      if (length > options_.maxLineBytes) {
        tooLong = true;
        std::string().swap(lineText);
      } else {
        lineText.append(start, take);
      }
    }
    bufferPos_ += take + (newline != nullptr ? 1 : 0);
    if (newline != nullptr) return true;
  }
}

std::optional<JsonlRowReader::Result> JsonlRowReader::next() {
  if (file_ == nullptr) throw RuntimeError("JsonlRowReader::next: no file is open");
  std::string text;
  bool tooLong = false;
  int64_t length = 0;
  while (readLine(text, tooLong, length)) {
    ++line_;
    if (tooLong) {
      return RowError{path_, line_, "row",
                      "expected a line of at most " + std::to_string(options_.maxLineBytes) + " bytes, got " +
                          std::to_string(length) + " bytes"};
    }
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (isBlank(text)) {
      ++blank_;
      continue;
    }
    return parseRowLine(text, path_, line_, directory_, options_.requireCompletion);
  }
  return std::nullopt;
}

RowScan readRows(const std::string& path, bool skipBadRows, JsonlReaderOptions options) {
  JsonlRowReader reader(options);
  reader.open(path);
  RowScan scan;
  while (auto result = reader.next()) {
    if (auto* row = std::get_if<Row>(&*result)) {
      if (row->completion.empty()) ++scan.emptyCompletions;
      scan.rows.push_back(std::move(*row));
      continue;
    }
    auto& failure = std::get<RowError>(*result);
    if (!skipBadRows) throw InputError(failure.text());
    scan.skipped.push_back(std::move(failure));
  }
  scan.lines = reader.linesRead();
  scan.blankLines = reader.blankLines();
  return scan;
}

std::string skippedRowsReport(const RowScan& scan) {
  if (scan.skipped.empty()) return "";
  std::string report = "skipped " + std::to_string(scan.skipped.size()) + " of " +
                       std::to_string(scan.skipped.size() + scan.rows.size()) + " rows:\n";
  for (const RowError& failure : scan.skipped) report += "  " + failure.text() + "\n";
  return report;
}

}  // namespace dgemma
