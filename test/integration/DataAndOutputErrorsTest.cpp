// Issue 15's data, output and message cases through the tools as a user runs them: each ends within
// seconds in a located error with the contract's exit code (2 bad input, 1 I/O), never a hang, a
// signal, a silent accept or an "internal error".
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "ToolRunner.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

using testing::contains;
using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

namespace fs = std::filesystem;

// `timeout` turns a hang into exit 124 instead of a stuck test.
const std::string kRun = std::string("timeout 60 ") + DGEMMA_RUN;
const std::string kCompile = std::string("timeout 60 ") + DGEMMA_COMPILE;
const std::string kTokenizer = std::string(DGEMMA_SOURCE_DIR) + "/data/tokenizer";
const std::string kPng = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/images/tiny.png";

std::string imageRow(const std::string& image) {
  return R"({"messages": [{"role": "user", "content": [{"type": "image", "image": ")" + image + R"("}]}], "completion": "x"})";
}

class DataAndOutputErrorsTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir / name, std::ios::binary) << bytes;
    return dir / name;
  }
  ToolResult checkData(const std::string& data, const std::string& extra = "") {
    return runTool(kRun + " check-data --data " + data + " --tokenizer " + kTokenizer + extra);
  }
  std::string compilePlan() {
    ToolResult result = runTool(kCompile + " --model builtin:rmsnorm-matmul-softmax --mode infer --prompt-len 4 --hidden-size 8"
                                           " --vocab-size 8 -o " + (dir / "plan"));
    EXPECT_EQ(result.exitCode, 0) << result.output;
    return dir / "plan";
  }
  ToolResult forward(const std::string& plan, const std::string& out) {
    HostTensor x(DType::F32, {2, 4, 8});
    writeSafetensors(dir / "batch.safetensors", {{"x", &x}});
    return runTool(kRun + " forward --plan " + plan + " --init random --input " + (dir / "batch.safetensors") + " --out " + out);
  }

  ScratchDirectory dir;
};

// The JSON lexer stopped at the NUL: the first row was accepted, the rest of the line (a whole
// second row) ignored, exit 0.
TEST_F(DataAndOutputErrorsTest, ANulByteInARowIsAnErrorNamingItsColumn) {
  const std::string row = R"({"messages": [{"role": "user", "content": "hi"}], "completion": "x"})";
  const std::string data = write("nul.jsonl", row + std::string(1, '\0') + row + "\n");
  ToolResult result = checkData(data);
  EXPECT_EQ(result.exitCode, 2) << result.output;
  EXPECT_TRUE(contains(result, data + ":1: row: expected a line without NUL bytes, got one at byte column " +
                                   std::to_string(row.size() + 1)))
      << result.output;
}

// "x.png\u0000.txt" opened x.png.
TEST_F(DataAndOutputErrorsTest, ANulInAnImagePathIsRefused) {
  fs::copy_file(kPng, dir / "x.png");
  const std::string data = write("path.jsonl", imageRow("x.png\\u0000.txt") + "\n");
  ToolResult result = checkData(data);
  EXPECT_EQ(result.exitCode, 2) << result.output;
  EXPECT_TRUE(contains(result, data + R"(:1: messages[0].content[0].image: expected a file path without NUL bytes, got "x.png\x00.txt")"))
      << result.output;
}

// check-data --data /dev/zero never returned.
TEST_F(DataAndOutputErrorsTest, DevicesAndFifosAreRefusedAsData) {
  ToolResult zero = checkData("/dev/zero");
  EXPECT_EQ(zero.exitCode, 2) << zero.output;
  EXPECT_TRUE(contains(zero, "/dev/zero: expected a regular JSONL file, got a character device")) << zero.output;
  const std::string fifo = dir / "rows.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  ToolResult pipe = checkData(fifo);
  EXPECT_EQ(pipe.exitCode, 2) << pipe.output;
  EXPECT_TRUE(contains(pipe, fifo + ": expected a regular JSONL file, got a FIFO")) << pipe.output;
}

// A truncated PGM decoded with uninitialised pixels; a 19-byte PPM header claiming 26754 x 26754 cost
// 2.2 GB; an unreadable image was "internal error".
TEST_F(DataAndOutputErrorsTest, ImagesOtherThanPngAndJpegAndUnreadableImagesAreLocated) {
  write("truncated.pgm", std::string("P5\n4 4\n255\n") + std::string(5, '\x10'));
  write("huge.ppm", "P6\n26754 26754\n255\n");
  for (const auto& [image, format] : {std::pair{"truncated.pgm", "PGM"}, std::pair{"huge.ppm", "PPM"}}) {
    const std::string data = write("netpbm.jsonl", imageRow(image) + "\n");
    ToolResult result = checkData(data);
    EXPECT_EQ(result.exitCode, 2) << result.output;
    EXPECT_TRUE(contains(result, data + ":1: messages[0].content[0].image: expected a decodable image: " + (dir / image) +
                                     ": expected a PNG or JPEG image, got a Netpbm (" + format + ") image"))
        << result.output;
  }
  const std::string data = write("mem.jsonl", imageRow("/proc/self/mem") + "\n");
  ToolResult unreadable = checkData(data);
  EXPECT_EQ(unreadable.exitCode, 1) << unreadable.output;
  EXPECT_TRUE(contains(unreadable, data + ":1: messages[0].content[0].image: /proc/self/mem: cannot read: Input/output error"))
      << unreadable.output;
  EXPECT_FALSE(contains(unreadable, "internal error")) << unreadable.output;
}

// Megabytes of control characters were echoed to the terminal as they were.
TEST_F(DataAndOutputErrorsTest, HugeStringsAreEchoedEscapedAndCut) {
  std::string controls;
  for (int i = 0; i < 200000; ++i) controls += "\\u001b";
  const std::string row = R"({"messages": [{"role": ")" + controls + R"(", "content": "q"}], "completion": "x"})";
  const std::string data = write("huge.jsonl", row + "\n" + row + "\n");
  for (const std::string extra : {"", " --skip-bad-rows"}) {
    ToolResult result = checkData(data, extra);
    EXPECT_EQ(result.exitCode, extra.empty() ? 2 : 0) << result.output.substr(0, 2000);
    EXPECT_TRUE(contains(result, R"(:1: messages[0].role: expected "system", "user" or "assistant", got "\x1b\x1b)"))
        << result.output.substr(0, 2000);
    EXPECT_TRUE(contains(result, "… (200000 bytes)")) << result.output.substr(0, 2000);
    EXPECT_EQ(result.output.find('\x1b'), std::string::npos);
    EXPECT_LT(result.output.size(), 2000u);
  }
}

// `forward --out` naming a device node replaced it with a regular file (as root, /dev/null itself):
// every atomic output refuses an existing target that is not a regular file, and leaves it alone.
TEST_F(DataAndOutputErrorsTest, OutputsRefuseNonRegularTargets) {
  const std::string plan = compilePlan();
  const std::string fifo = dir / "out.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  fs::create_symlink("/dev/null", dir / "null-link");
  fs::create_directory(dir / "out-dir");
  for (const auto& [target, type] : {std::pair{fifo, "a FIFO"}, std::pair{dir / "null-link", "a character device"},
                                     std::pair{dir / "out-dir", "a directory"}}) {
    ToolResult result = forward(plan, target);
    EXPECT_EQ(result.exitCode, 2) << result.output;
    EXPECT_TRUE(contains(result, target + ": expected a regular file or a new path to write, got " + type)) << result.output;
  }
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_symlink(dir / "null-link"));
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  ToolResult regular = forward(plan, dir / "out.safetensors");
  EXPECT_EQ(regular.exitCode, 0) << regular.output;
}

// A batch file without a field the entry takes failed with the executor's "input x: missing",
// which named no file.
TEST_F(DataAndOutputErrorsTest, ABatchWithoutAFieldIsNamedByFileAndTensor) {
  const std::string plan = compilePlan();
  HostTensor y(DType::F32, {2, 4, 8});
  writeSafetensors(dir / "other.safetensors", {{"y", &y}});
  ToolResult result = runTool(kRun + " forward --plan " + plan + " --init random --input " + (dir / "other.safetensors") +
                              " --out " + (dir / "out.safetensors"));
  EXPECT_EQ(result.exitCode, 2) << result.output;
  EXPECT_TRUE(contains(result, dir / "other.safetensors" + ": tensor x: missing (entry forward")) << result.output;
  EXPECT_FALSE(fs::exists(dir / "out.safetensors"));
}

// A FIFO named tokenizer.model blocked check-data, generate and train forever; a directory of that
// name was "internal error: basic_filebuf::underflow".
TEST_F(DataAndOutputErrorsTest, ATokenizerModelThatIsNoRegularFileIsRefused) {
  const std::string rows = write("rows.jsonl", R"({"messages": [{"role": "user", "content": "hi"}], "completion": "x"})" "\n");
  fs::create_directory(dir / "fifo-tokenizer");
  ASSERT_EQ(::mkfifo((dir / "fifo-tokenizer/tokenizer.model").c_str(), 0600), 0);
  fs::create_directories(dir / "dir-tokenizer/tokenizer.model");
  for (const auto& [tokenizer, type] : {std::pair{dir / "fifo-tokenizer", "a FIFO"}, std::pair{dir / "dir-tokenizer", "a directory"}}) {
    ToolResult result = runTool(kRun + " check-data --data " + rows + " --tokenizer " + tokenizer);
    EXPECT_EQ(result.exitCode, 2) << result.output;
    EXPECT_TRUE(contains(result, tokenizer + "/tokenizer.model: expected a regular file, got " + type)) << result.output;
    EXPECT_FALSE(contains(result, "internal error")) << result.output;
  }
}

// A FIFO named as a weights file blocked the open forever: it is refused like any non-regular file.
TEST_F(DataAndOutputErrorsTest, AWeightsFileThatIsAFifoIsRefused) {
  const std::string plan = compilePlan();
  fs::create_directory(dir / "weights");
  ASSERT_EQ(::mkfifo((dir / "weights/model.safetensors").c_str(), 0600), 0);
  HostTensor x(DType::F32, {2, 4, 8});
  writeSafetensors(dir / "batch.safetensors", {{"x", &x}});
  ToolResult result = runTool(kRun + " forward --plan " + plan + " --weights " + (dir / "weights/model.safetensors") + " --input " +
                              (dir / "batch.safetensors") + " --out " + (dir / "out.safetensors"));
  EXPECT_EQ(result.exitCode, 2) << result.output;
  EXPECT_TRUE(contains(result, dir / "weights/model.safetensors" + ": cannot open: not a regular file")) << result.output;
}

// An existing file as -o was "internal error" with std::filesystem's text.
TEST_F(DataAndOutputErrorsTest, CompileOutputMustBeADirectory) {
  const std::string file = write("plan-file", "not a directory");
  ToolResult result = runTool(kCompile + " --model builtin:rmsnorm-matmul-softmax --mode infer --prompt-len 4 --hidden-size 8"
                                         " --vocab-size 8 -o " + file);
  EXPECT_EQ(result.exitCode, 2) << result.output;
  EXPECT_TRUE(contains(result, "-o: " + file + ": expected a directory or a new path, got a regular file")) << result.output;
  ToolResult below = runTool(kCompile + " --model builtin:rmsnorm-matmul-softmax --mode infer --prompt-len 4 --hidden-size 8"
                                        " --vocab-size 8 -o " + file + "/plan");
  EXPECT_EQ(below.exitCode, 2) << below.output;
  EXPECT_TRUE(contains(below, "-o: " + file + "/plan: cannot create the directory: " + file + " is a regular file")) << below.output;
}

}  // namespace
}  // namespace dgemma
