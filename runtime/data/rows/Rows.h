// JSONL rows (docs/data.md, "JSONL rows", "Row validation", "Bad input"): a streaming reader that
// validates every row against the schema, as far as that needs neither a tokenizer nor an image
// decoder, and turns it into typed messages. Errors are located as `FILE:LINE: field: what was
// expected` (docs/cli.md, "Exit codes and messages").
//
//   {"messages": [{"role": "system", "content": "You are terse."},
//                 {"role": "user", "content": [{"type": "image", "image": "images/cat.png"},
//                                              {"type": "text", "text": "What animal is this?"}]}],
//    "completion": "A cat."}
//
// Lines are numbered from 1. Blank lines (only spaces, tabs and a CR) are skipped but counted. A line
// may end in CRLF. A UTF-8 byte-order mark at the start of a line is ignored (the JSON parser skips
// it).
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>
#include <vector>

namespace dgemma {

struct ContentPart {
  enum Kind { Text, Image };
  Kind kind = Text;
  std::string text;       // Text parts
  std::string imagePath;  // Image parts: absolute, resolved against the JSONL file's directory
};

struct Message {
  enum Role { System, User, Assistant };
  Role role = User;
  std::vector<ContentPart> content;  // string content becomes one Text part
  bool contentIsList = false;        // given as an array of parts (the chat template renders a system
                                     // message differently then)
};

struct Row {
  int64_t line = 0;  // 1-based line number in the JSONL file
  std::vector<Message> messages;
  std::string completion;  // may be empty (the target is then just EOS)
  bool hasCompletion = false;  // false only when the reader did not require one
  // The row's "reference", any JSON value (null when absent): what a verifier compares a generated
  // completion with (dgemma-run rl, docs/rl.md). Training and generation ignore it.
  nlohmann::json reference;
};

struct RowError {
  std::string file;
  int64_t line = 0;
  std::string field;     // "messages[1].content[0].image", or "row" for the line as a whole
  std::string expected;  // "expected a string, got number"
  std::string text() const;  // "FILE:LINE: field: expected ..."
};

const char* roleName(Message::Role role);  // "system", "user", "assistant"

struct JsonlReaderOptions {
  // Longer lines are an error (the rest of the line is read and dropped, so the next line is still
  // read correctly).
  int64_t maxLineBytes = int64_t{64} << 20;
  // A row without "completion" is an error; generation (dgemma-run generate) reads prompts only.
  bool requireCompletion = true;
};

class JsonlRowReader {
 public:
  using Result = std::variant<Row, RowError>;

  JsonlRowReader() = default;
  explicit JsonlRowReader(JsonlReaderOptions options) : options_(options) {}
  ~JsonlRowReader();
  JsonlRowReader(const JsonlRowReader&) = delete;
  JsonlRowReader& operator=(const JsonlRowReader&) = delete;

  // Opens `path`; throws InputError ("PATH: cannot read: REASON", "PATH: expected a regular JSONL file, got a FIFO") if it cannot (support/InputFile.h: only regular files).
  void open(const std::string& path);
  // The next non-blank line as a valid row or as the first error found in it; nothing at the end of
  // the file. Throws RuntimeError on a read error.
  std::optional<Result> next();

  const std::string& path() const { return path_; }
  int64_t linesRead() const { return line_; }    // lines read so far, blank ones included
  int64_t blankLines() const { return blank_; }  // blank lines skipped so far

 private:
  // Reads the next physical line (without its LF) into `lineText`; false at the end of the file.
  // `length` is the line's byte count; `tooLong` is set when it exceeds maxLineBytes, and the text is
  // then not kept.
  bool readLine(std::string& lineText, bool& tooLong, int64_t& length);
  size_t fillBuffer();

  JsonlReaderOptions options_;
  std::FILE* file_ = nullptr;
  std::string path_;
  std::string directory_;  // absolute directory of the file, for image paths
  std::vector<char> buffer_;
  size_t bufferPos_ = 0, bufferEnd_ = 0;
  bool eof_ = false;
  int64_t line_ = 0;
  int64_t blank_ = 0;
};

// Validates one line's text (without its line terminator) as a row. `directory` is where relative
// image paths resolve. Exposed for tests and for producers that do not read files.
JsonlRowReader::Result parseRowLine(const std::string& text, const std::string& file, int64_t line,
                                    const std::string& directory, bool requireCompletion = true);

// parseRowLine for callers that want an exception (the JSONL fuzz target): the row, or InputError
// with the error's text ("FILE:LINE: field: expected ...").
Row parseRowOrThrow(const std::string& text, const std::string& file, int64_t line, const std::string& directory,
                    bool requireCompletion = true);

struct RowScan {
  std::vector<Row> rows;
  std::vector<RowError> skipped;  // skip mode: every bad row, in file order
  int64_t lines = 0;              // physical lines in the file, blank ones included
  int64_t blankLines = 0;
  int64_t emptyCompletions = 0;   // good rows with completion "" (docs/data.md, "Bad input")
};

// Reads and validates every row of `path`. Fail-fast (skipBadRows = false): throws InputError with
// the first error's text. Skip mode: bad rows are collected in `skipped` and reading continues.
RowScan readRows(const std::string& path, bool skipBadRows, JsonlReaderOptions options = {});

// "skipped N bad rows of M:" followed by one indented error line per skipped row; "" if none.
std::string skippedRowsReport(const RowScan& scan);

}  // namespace dgemma
