// The failure report torchrun reads from TORCHELASTIC_ERROR_FILE (ElasticErrorFile.h). That torchrun
// itself shows it is proven by the launcher tests (test/launchers), which run the real torchrun.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/launch/ElasticErrorFile.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;

TEST(ElasticErrorFile, HoldsTheMessageWhereTorchrunLooks) {
  const nlohmann::json report = nlohmann::json::parse(elasticErrorJson("dgemma-run (rank 1): error: --train x: no such file", 1700000000));
  EXPECT_EQ(report["message"]["message"], "dgemma-run (rank 1): error: --train x: no such file");
  EXPECT_EQ(report["message"]["extraInfo"]["py_callstack"], "dgemma-run (rank 1): error: --train x: no such file");
  // torch parses the timestamp with int(): a decimal string.
  EXPECT_EQ(report["message"]["extraInfo"]["timestamp"], "1700000000");
}

TEST(ElasticErrorFile, InvalidUtf8InTheMessageStillGivesJson) {
  const std::string text = elasticErrorJson(std::string("bad path \xff\xfe"), 1);
  EXPECT_NO_THROW(nlohmann::json::parse(text));
}

TEST(ElasticErrorFile, IsWrittenWholeAndReplacesAnOldOne) {
  const fs::path directory = fs::temp_directory_path() / ("dgemma-error-file-" + std::to_string(::getpid()));
  fs::create_directories(directory);
  const fs::path path = directory / "error.json";
  std::ofstream(path) << "stale";
  ASSERT_TRUE(writeElasticErrorFile(path.string(), "first"));
  ASSERT_TRUE(writeElasticErrorFile(path.string(), "second"));
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  EXPECT_EQ(nlohmann::json::parse(text.str())["message"]["message"], "second");
  EXPECT_EQ(std::distance(fs::directory_iterator(directory), fs::directory_iterator{}), 1);  // no temporary left
  EXPECT_FALSE(writeElasticErrorFile((directory / "missing" / "error.json").string(), "x"));
  fs::remove_all(directory);
}

}  // namespace
}  // namespace dgemma
