// Shared by the DiffusionGemma config and weight-schema tests: a scratch directory per test and the
// preset paths.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/Error.h"

namespace dgemma::model_test {

inline std::string presetPath(const std::string& fileName) {
  return std::string(DGEMMA_DIFFUSION_GEMMA_CONFIGS) + "/" + fileName;
}

// A fresh directory per test, removed afterwards.
class ScratchDirectoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "dgemma-model-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    directory_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }

  std::string pathOf(const std::string& name) const { return (directory_ / name).string(); }

  std::string writeText(const std::string& name, const std::string& text) const {
    const std::string path = pathOf(name);
    std::ofstream(path) << text;
    return path;
  }
  std::string writeJson(const std::string& name, const nlohmann::json& value) const {
    return writeText(name, value.dump(2));
  }

  std::filesystem::path directory_;
};

// The InputError message `action` throws, or a failure when it throws nothing or something else.
template <typename Action>
std::string inputErrorMessage(Action&& action) {
  try {
    action();
  } catch (const InputError& error) {
    EXPECT_EQ(error.exitCode(), 2);
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected an InputError, got: " << error.what();
    return "";
  }
  ADD_FAILURE() << "expected an InputError, nothing was thrown";
  return "";
}

}  // namespace dgemma::model_test
