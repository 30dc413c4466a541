#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include "support/Error.h"
#include "runtime/data/rows/Rows.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class RowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    dir_ = fs::temp_directory_path() / ("dgemma_rows_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream out(path, std::ios::binary);
    out << bytes;
    return path.string();
  }
  std::string touchImage(const std::string& name) { return write(name, "\x89PNG not really"); }

  fs::path dir_;
};

const std::string kGoodRow = R"({"messages": [{"role": "user", "content": "hi"}], "completion": "hello"})";

TEST_F(RowsTest, ReadsAGoodFile) {
  const std::string cat = touchImage("images/cat.png");
  const std::string dog = touchImage("dog.jpg");
  const std::string absolute = touchImage("elsewhere/abs.png");
  const std::string file = write(
      "data/train.jsonl",
      // 1: system message, image parts with relative paths, mixed content, unicode.
      R"({"id": 7, "meta": {"x": [1, 2]}, "messages": [{"role": "system", "content": "You are terse."}, )"
      R"({"role": "user", "content": [{"type": "image", "image": "../images/cat.png"}, )"
      R"({"type": "text", "text": "Qu'est-ce que c'est ? \u00e9 é 日本語 😀"}]}], "completion": "A cat. 🐈"})"
      "\n"
      // 2: blank
      "\n"
      // 3: multi-turn history, string content, an image next to the JSONL file and an absolute path.
      R"({"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}, )"
      R"({"role": "user", "content": [{"type": "image", "image": "../dog.jpg"}, {"type": "image", "image": ")" +
          absolute + R"("}, {"type": "text", "text": ""}]}], "completion": ""})" +
      "\n   \t \n" +  // 4: blank (whitespace only)
      kGoodRow);     // 5: no final newline

  RowScan scan = readRows(file, /*skipBadRows=*/false);
  EXPECT_EQ(scan.lines, 5);
  EXPECT_EQ(scan.blankLines, 2);
  EXPECT_EQ(scan.emptyCompletions, 1);
  EXPECT_TRUE(scan.skipped.empty());
  EXPECT_EQ(skippedRowsReport(scan), "");
  ASSERT_EQ(scan.rows.size(), 3u);

  const Row& first = scan.rows[0];
  EXPECT_EQ(first.line, 1);
  ASSERT_EQ(first.messages.size(), 2u);
  EXPECT_EQ(first.messages[0].role, Message::System);
  ASSERT_EQ(first.messages[0].content.size(), 1u);
  EXPECT_EQ(first.messages[0].content[0].kind, ContentPart::Text);
  EXPECT_EQ(first.messages[0].content[0].text, "You are terse.");
  EXPECT_EQ(first.messages[1].role, Message::User);
  ASSERT_EQ(first.messages[1].content.size(), 2u);
  EXPECT_EQ(first.messages[1].content[0].kind, ContentPart::Image);
  EXPECT_EQ(first.messages[1].content[0].imagePath, cat);
  EXPECT_TRUE(first.messages[1].content[0].text.empty());
  EXPECT_EQ(first.messages[1].content[1].kind, ContentPart::Text);
  EXPECT_EQ(first.messages[1].content[1].text, "Qu'est-ce que c'est ? \xC3\xA9 \xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x98\x80");
  EXPECT_EQ(first.completion, "A cat. \xF0\x9F\x90\x88");

  const Row& second = scan.rows[1];
  EXPECT_EQ(second.line, 3);
  ASSERT_EQ(second.messages.size(), 3u);
  EXPECT_EQ(second.messages[0].role, Message::User);
  EXPECT_EQ(second.messages[1].role, Message::Assistant);
  EXPECT_EQ(second.messages[1].content[0].text, "2");
  EXPECT_EQ(second.messages[2].role, Message::User);
  ASSERT_EQ(second.messages[2].content.size(), 3u);
  EXPECT_EQ(second.messages[2].content[0].imagePath, dog);
  EXPECT_EQ(second.messages[2].content[1].imagePath, absolute);
  EXPECT_EQ(second.messages[2].content[2].kind, ContentPart::Text);
  EXPECT_EQ(second.messages[2].content[2].text, "");
  EXPECT_EQ(second.completion, "");

  EXPECT_EQ(scan.rows[2].line, 5);
  EXPECT_EQ(scan.rows[2].completion, "hello");
  EXPECT_STREQ(roleName(Message::Assistant), "assistant");
}

TEST_F(RowsTest, AcceptsCrlfLineEndings) {
  touchImage("a.png");
  const std::string file = write("crlf.jsonl", kGoodRow + "\r\n\r\n" +
                                                   R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"}]}], "completion": "x\r"})" +
                                                   "\r\n" + R"({"messages": 1})" + "\r\n");
  RowScan scan = readRows(file, /*skipBadRows=*/true);
  EXPECT_EQ(scan.lines, 4);
  EXPECT_EQ(scan.blankLines, 1);
  ASSERT_EQ(scan.rows.size(), 2u);
  EXPECT_EQ(scan.rows[0].completion, "hello");
  EXPECT_EQ(scan.rows[1].line, 3);
  EXPECT_EQ(scan.rows[1].completion, "x\r");  // an escaped CR inside a string is content
  EXPECT_EQ(scan.rows[1].messages[0].content[0].imagePath, (dir_ / "a.png").string());
  ASSERT_EQ(scan.skipped.size(), 1u);
  EXPECT_EQ(scan.skipped[0].text(), file + ":4: messages: expected a non-empty array of messages, got number");
}

TEST_F(RowsTest, EmptyFileHasNoRows) {
  RowScan scan = readRows(write("empty.jsonl", ""), false);
  EXPECT_EQ(scan.lines, 0);
  EXPECT_TRUE(scan.rows.empty());
  RowScan blanks = readRows(write("blanks.jsonl", "\n\n  \n"), false);
  EXPECT_EQ(blanks.lines, 3);
  EXPECT_EQ(blanks.blankLines, 3);
  EXPECT_TRUE(blanks.rows.empty());
}

TEST_F(RowsTest, UnopenableFilesAreInputErrors) {
  const std::string missing = (dir_ / "nope.jsonl").string();
  try {
    readRows(missing, false);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), missing + ": cannot read: No such file or directory");
    EXPECT_EQ(e.exitCode(), 2);
  }
  try {
    readRows(dir_.string(), true);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), dir_.string() + ": expected a regular JSONL file, got a directory");
  }
}

// One kind of bad row: the line's text and the expected "field: expected ..." of its error.
struct BadRowCase {
  std::string name;
  std::string line;
  std::string message;  // after "FILE:LINE: "; "{DIR}" stands for the JSONL file's directory
};

void PrintTo(const BadRowCase& bad, std::ostream* out) { *out << bad.name; }

std::vector<BadRowCase> badRowCases() {
  const std::string user = R"({"role": "user", "content": "q"})";
  auto row = [](const std::string& messages, const std::string& tail = R"(, "completion": "c")") {
    return R"({"messages": )" + messages + tail + "}";
  };
  auto parts = [&](const std::string& partList) {
    return row(R"([{"role": "user", "content": )" + partList + "}]");
  };
  return {
      {"BadJson", R"({"messages": [)",
       "row: expected valid JSON, got parse error at column 15: syntax error while parsing value - unexpected "
       "end of input; expected '[', '{', or a literal"},
      {"NotAnObject", R"("just a string")", R"(row: expected a JSON object, got "just a string")"},
      {"TopLevelArray", "[" + kGoodRow + "]", "row: expected a JSON object, got array"},
      {"MissingMessages", R"({"completion": "c"})",
       "messages: expected a non-empty array of messages, got nothing (the key is missing)"},
      {"EmptyMessages", row("[]"), "messages: expected a non-empty array of messages, got an empty array"},
      {"MessagesNotAnArray", row(user), "messages: expected a non-empty array of messages, got object"},
      {"MessageNotAnObject", row(R"([)" + user + R"(, "u"])"),
       R"(messages[1]: expected a message object, got "u")"},
      {"BadRole", row(R"([{"role": "bot", "content": "q"}])"),
       R"(messages[0].role: expected "system", "user" or "assistant", got "bot")"},
      {"RoleNotAString", row(R"([{"role": 1, "content": "q"}])"),
       R"(messages[0].role: expected "system", "user" or "assistant", got number)"},
      {"MissingRole", row(R"([{"content": "q"}])"),
       R"(messages[0].role: expected "system", "user" or "assistant", got nothing (the key is missing))"},
      {"SystemNotFirst", row("[" + user + R"(, {"role": "system", "content": "s"}, )" + user + "]"),
       R"(messages[1].role: expected "user" or "assistant" (a system message may only be the first message), got "system")"},
      {"ContentWrongType", row(R"([{"role": "user", "content": 5}])"),
       "messages[0].content: expected a string or an array of parts, got number"},
      {"MissingContent", row(R"([{"role": "user"}])"),
       "messages[0].content: expected a string or an array of parts, got nothing (the key is missing)"},
      {"PartNotAnObject", parts(R"([{"type": "text", "text": "a"}, "b"])"),
       R"(messages[0].content[1]: expected a part object, got "b")"},
      {"UnknownPartType", parts(R"([{"type": "audio", "audio": "a.wav"}])"),
       R"(messages[0].content[0].type: expected "text" or "image", got "audio")"},
      {"PartMissingType", parts(R"([{"text": "a"}])"),
       R"(messages[0].content[0].type: expected "text" or "image", got nothing (the key is missing))"},
      {"TextPartMissingText", parts(R"([{"type": "text", "image": "a.png"}])"),
       "messages[0].content[0].text: expected a string, got nothing (the key is missing)"},
      {"TextNotAString", parts(R"([{"type": "text", "text": 7}])"),
       "messages[0].content[0].text: expected a string, got number"},
      {"ImagePartMissingImage", parts(R"([{"type": "image", "url": "a.png"}])"),
       "messages[0].content[0].image: expected a string, got nothing (the key is missing)"},
      {"ImageNotAString", parts(R"([{"type": "image", "image": ["a.png"]}])"),
       "messages[0].content[0].image: expected a string, got array"},
      {"EmptyImagePath", parts(R"([{"type": "image", "image": ""}])"),
       "messages[0].content[0].image: expected a local image file path, got an empty string"},
      {"UrlImage", parts(R"([{"type": "text", "text": "t"}, {"type": "image", "image": "https://example.com/cat.png"}])"),
       R"(messages[0].content[1].image: expected a local image file path (remote images are not supported), got "https://example.com/cat.png")"},
      {"FileUrlImage", parts(R"([{"type": "image", "image": "file:///tmp/cat.png"}])"),
       R"(messages[0].content[0].image: expected a local image file path (remote images are not supported), got "file:///tmp/cat.png")"},
      {"MissingImageFile", parts(R"([{"type": "image", "image": "images/missing.png"}])"),
       R"(messages[0].content[0].image: expected an existing image file, got "images/missing.png" ({DIR}/images/missing.png does not exist))"},
      {"ImageIsADirectory", parts(R"([{"type": "image", "image": "images"}])"),
       R"(messages[0].content[0].image: expected an image file, got "images" ({DIR}/images is a directory))"},
      {"LastMessageAssistant", row("[" + user + R"(, {"role": "assistant", "content": "a"}])"),
       R"(messages[1].role: expected the last message to be "user" or "system" (the prompt must end before the completion), got "assistant")"},
      {"MissingCompletion", row("[" + user + "]", ""),
       "completion: expected a string, got nothing (the key is missing)"},
      {"CompletionNotAString", row("[" + user + "]", R"(, "completion": 42)"),
       "completion: expected a string, got number"},
      {"CompletionNull", row("[" + user + "]", R"(, "completion": null)"),
       "completion: expected a string, got null"},
      {"InvalidUtf8", R"({"messages": [{"role": "user", "content": "caf)" "\xE9" R"("}], "completion": "c"})",
       "row: expected UTF-8 text, got the invalid byte 0xE9 at column 47"},
      {"Utf8Surrogate", R"({"completion": ")" "\xED\xA0\x80" R"("})",
       "row: expected UTF-8 text, got the invalid byte 0xED at column 17"},
      {"DuplicateTopLevelKey", row("[" + user + "]", R"(, "completion": "a", "completion": "b")"),
       R"(completion: expected each key once in an object, got "completion" twice)"},
      {"DuplicateNestedKey", row(R"([{"role": "user", "content": "q", "role": "assistant"}])"),
       R"(messages[0].role: expected each key once in an object, got "role" twice)"},
      // nlohmann's lexer takes a NUL for the end of the input: the second row after it was ignored.
      {"NulByteInTheLine", kGoodRow + std::string(1, '\0') + kGoodRow,
       "row: expected a line without NUL bytes, got one at byte column " + std::to_string(kGoodRow.size() + 1)},
      // The OS would open "x.png" for "x.png\0.txt".
      {"NulByteInAnImagePath", parts(R"([{"type": "image", "image": "x.png\u0000.txt"}])"),
       R"(messages[0].content[0].image: expected a file path without NUL bytes, got "x.png\x00.txt" (a NUL at byte 6))"},
      {"DuplicateKeyOfControlCharacters", row("[" + user + "]", R"(, "\u0001": 1, "\u0001": 2)"),
       R"(row["\x01"]: expected each key once in an object, got "\x01" twice)"},
  };
}

class BadRowTest : public RowsTest, public ::testing::WithParamInterface<BadRowCase> {};

TEST_P(BadRowTest, IsReportedWithItsFieldAndLine) {
  const BadRowCase& bad = GetParam();
  fs::create_directories(dir_ / "images");
  touchImage("images/there.png");
  // Good row, blank line, the bad row on line 3, then another good row.
  const std::string file = write("rows.jsonl", kGoodRow + "\n\n" + bad.line + "\n" + kGoodRow + "\n");
  std::string message = bad.message;
  if (auto at = message.find("{DIR}"); at != std::string::npos) message.replace(at, 5, dir_.string());
  const std::string expected = file + ":3: " + message;

  try {
    readRows(file, /*skipBadRows=*/false);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), expected);
    EXPECT_EQ(e.exitCode(), 2);
  }

  RowScan scan = readRows(file, /*skipBadRows=*/true);
  EXPECT_EQ(scan.lines, 4);
  ASSERT_EQ(scan.rows.size(), 2u);
  EXPECT_EQ(scan.rows[0].line, 1);
  EXPECT_EQ(scan.rows[1].line, 4);
  ASSERT_EQ(scan.skipped.size(), 1u);
  EXPECT_EQ(scan.skipped[0].file, file);
  EXPECT_EQ(scan.skipped[0].line, 3);
  EXPECT_EQ(scan.skipped[0].text(), expected);
}

INSTANTIATE_TEST_SUITE_P(Kinds, BadRowTest, ::testing::ValuesIn(badRowCases()),
                         [](const ::testing::TestParamInfo<BadRowCase>& info) { return info.param.name; });

TEST_F(RowsTest, FailFastThrowsTheFirstErrorAndSkipModeCollectsAll) {
  const std::string file = write("mixed.jsonl", kGoodRow + "\n" +                       // 1 good
                                                     R"({"messages": []})" + "\n" +     // 2 bad
                                                     "\n" +                             // 3 blank
                                                     kGoodRow + "\n" +                  // 4 good
                                                     "nonsense\n" +                     // 5 bad
                                                     R"({"messages": [{"role": "user", "content": "q"}]})" +
                                                     "\n" +       // 6 bad
                                                     kGoodRow);   // 7 good
  try {
    readRows(file, false);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), file + ":2: messages: expected a non-empty array of messages, got an empty array");
  }

  RowScan scan = readRows(file, true);
  EXPECT_EQ(scan.lines, 7);
  EXPECT_EQ(scan.blankLines, 1);
  ASSERT_EQ(scan.rows.size(), 3u);
  EXPECT_EQ(scan.rows[0].line, 1);
  EXPECT_EQ(scan.rows[1].line, 4);
  EXPECT_EQ(scan.rows[2].line, 7);
  ASSERT_EQ(scan.skipped.size(), 3u);
  EXPECT_EQ(scan.skipped[0].line, 2);
  EXPECT_EQ(scan.skipped[1].line, 5);
  EXPECT_EQ(scan.skipped[1].field, "row");
  EXPECT_EQ(scan.skipped[2].text(), file + ":6: completion: expected a string, got nothing (the key is missing)");
  EXPECT_EQ(skippedRowsReport(scan), "skipped 3 of 6 rows:\n  " + scan.skipped[0].text() + "\n  " +
                                         scan.skipped[1].text() + "\n  " + scan.skipped[2].text() + "\n");
}

TEST_F(RowsTest, OverlongLinesAreErrorsAndReadingContinues) {
  JsonlReaderOptions options;
  options.maxLineBytes = 100;
  const std::string longRow = R"({"messages": [{"role": "user", "content": ")" + std::string(200, 'x') +
                              R"("}], "completion": "c"})";
  const std::string file = write("long.jsonl", longRow + "\n" + kGoodRow + "\n");
  RowScan scan = readRows(file, true, options);
  ASSERT_EQ(scan.skipped.size(), 1u);
  EXPECT_EQ(scan.skipped[0].text(), file + ":1: row: expected a line of at most 100 bytes, got " +
                                        std::to_string(longRow.size()) + " bytes");
  ASSERT_EQ(scan.rows.size(), 1u);
  EXPECT_EQ(scan.rows[0].line, 2);
  // The default limit takes the same line.
  EXPECT_EQ(readRows(file, false).rows.size(), 2u);
}

// A device or FIFO is refused when it is opened: /dev/zero has no line end, and reading it never ended.
TEST_F(RowsTest, NonRegularFilesAreRefusedAtOnce) {
  try {
    readRows("/dev/zero", false);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "/dev/zero: expected a regular JSONL file, got a character device");
  }
  const std::string fifo = (dir_ / "rows.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    readRows(fifo, false);  // no writer: opening it must not wait for one
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), fifo + ": expected a regular JSONL file, got a FIFO");
  }
}

// Megabytes of control characters in a row reach a message only escaped and cut.
TEST_F(RowsTest, HugeStringsAreQuotedEscapedAndCut) {
  std::string escaped;
  for (int i = 0; i < 100000; ++i) escaped += "\\u0007";
  const std::string raw(1 << 20, '\x07');  // unescaped control characters: invalid JSON
  const std::string file = write("huge.jsonl", R"({"messages": [{"role": ")" + escaped + R"(", "content": "q"}], "completion": "c"})" + "\n" +
                                                   R"({"messages": [{"role": "user", "content": ")" + raw + R"("}], "completion": "c"})" + "\n");
  RowScan scan = readRows(file, true);
  ASSERT_EQ(scan.skipped.size(), 2u);
  const std::string role = scan.skipped[0].text();
  EXPECT_NE(role.find(R"(messages[0].role: expected "system", "user" or "assistant", got "\x07\x07)"), std::string::npos) << role;
  EXPECT_NE(role.find("… (100000 bytes)"), std::string::npos) << role;
  const std::string report = skippedRowsReport(scan);
  EXPECT_LT(report.size(), 1000u) << report;
  EXPECT_EQ(report.find('\x07'), std::string::npos);
  EXPECT_NE(scan.skipped[1].text().find("row: expected valid JSON, got parse error at column 44"), std::string::npos)
      << scan.skipped[1].text();
}

TEST_F(RowsTest, ParseRowOrThrowThrowsTheLocatedError) {
  EXPECT_EQ(parseRowOrThrow(kGoodRow, "mem", 4, dir_.string()).completion, "hello");
  try {
    parseRowOrThrow("[]", "mem", 4, dir_.string());
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), "mem:4: row: expected a JSON object, got array");
  }
}

TEST_F(RowsTest, LinesLongerThanTheReadBufferAreReadWhole) {
  const std::string text(3 << 20, 'y');  // spans several 1 MiB buffer fills
  const std::string file = write("big.jsonl", R"({"messages": [{"role": "user", "content": ")" + text +
                                                  R"("}], "completion": "c"})" + "\n" + kGoodRow);
  RowScan scan = readRows(file, false);
  ASSERT_EQ(scan.rows.size(), 2u);
  EXPECT_EQ(scan.rows[0].messages[0].content[0].text, text);
  EXPECT_EQ(scan.rows[1].line, 2);
}

TEST_F(RowsTest, ReaderStreamsRowsAndErrors) {
  const std::string file = write("stream.jsonl", "\n" + kGoodRow + "\n[]\n");
  JsonlRowReader reader;
  reader.open(file);
  EXPECT_EQ(reader.path(), file);
  auto first = reader.next();
  ASSERT_TRUE(first.has_value());
  ASSERT_TRUE(std::holds_alternative<Row>(*first));
  EXPECT_EQ(std::get<Row>(*first).line, 2);
  EXPECT_EQ(reader.blankLines(), 1);
  auto second = reader.next();
  ASSERT_TRUE(second.has_value());
  ASSERT_TRUE(std::holds_alternative<RowError>(*second));
  EXPECT_EQ(std::get<RowError>(*second).text(), file + ":3: row: expected a JSON object, got array");
  EXPECT_FALSE(reader.next().has_value());
  EXPECT_EQ(reader.linesRead(), 3);
}

TEST_F(RowsTest, ParseRowLineResolvesAgainstTheGivenDirectory) {
  touchImage("pics/p.png");
  auto result = parseRowLine(
      R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "./pics/../pics/p.png"}]}], "completion": "c"})",
      "mem", 9, dir_.string());
  ASSERT_TRUE(std::holds_alternative<Row>(result));
  EXPECT_EQ(std::get<Row>(result).line, 9);
  EXPECT_EQ(std::get<Row>(result).messages[0].content[0].imagePath, (dir_ / "pics/p.png").string());
}

// Generation reads prompts: without requireCompletion a row may leave "completion" out, and a
// completion that is there is still checked.
TEST_F(RowsTest, ACompletionIsOptionalWhenTheReaderDoesNotRequireOne) {
  const std::string prompt = R"({"messages": [{"role": "user", "content": "hi"}]})";
  auto required = parseRowLine(prompt, "mem", 1, dir_.string());
  ASSERT_TRUE(std::holds_alternative<RowError>(required));
  EXPECT_EQ(std::get<RowError>(required).text(), "mem:1: completion: expected a string, got nothing (the key is missing)");
  auto optional = parseRowLine(prompt, "mem", 1, dir_.string(), /*requireCompletion=*/false);
  ASSERT_TRUE(std::holds_alternative<Row>(optional));
  EXPECT_FALSE(std::get<Row>(optional).hasCompletion);
  auto given = parseRowLine(kGoodRow, "mem", 2, dir_.string(), false);
  ASSERT_TRUE(std::holds_alternative<Row>(given));
  EXPECT_TRUE(std::get<Row>(given).hasCompletion);
  EXPECT_EQ(std::get<Row>(given).completion, "hello");
  auto wrong = parseRowLine(R"({"messages": [{"role": "user", "content": "hi"}], "completion": 3})", "mem", 3, dir_.string(), false);
  ASSERT_TRUE(std::holds_alternative<RowError>(wrong));
  EXPECT_EQ(std::get<RowError>(wrong).text(), "mem:3: completion: expected a string, got number");
}

}  // namespace
}  // namespace dgemma
