// Helpers shared by the tokenizer tests.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "runtime/core/Error.h"

namespace dgemma::test {

// The message of the InputError `f` throws; a test failure if it throws none.
inline std::string expectInputError(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an InputError";
  return "";
}

// A fresh temporary directory, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    const auto* test = ::testing::UnitTest::GetInstance();
    path = std::filesystem::temp_directory_path() /
           ("dgemma_text_test_" + std::to_string(test->random_seed()) + "_" + test->current_test_info()->test_suite_name() +
            "_" + test->current_test_info()->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace dgemma::test
