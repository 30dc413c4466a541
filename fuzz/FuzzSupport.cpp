#include "fuzz/FuzzSupport.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <typeinfo>

#include "support/Error.h"

namespace dgemma::fuzz {

void expectCleanVerdict(std::string_view bytes, void (*parse)(std::string_view bytes)) {
  try {
    parse(bytes);
  } catch (const dgemma::Error&) {
    // A clean rejection: the located message the CLI would print.
  } catch (const std::exception& error) {
    std::fprintf(stderr, "\n==fuzz finding: uncaught %s (not a dgemma::Error): %s\n", typeid(error).name(), error.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "\n==fuzz finding: uncaught exception of unknown type\n");
    std::abort();
  }
}

namespace {

struct ScratchDirectory {
  std::string path;
  ScratchDirectory() {
    std::filesystem::path base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path();
    if (const char* tmp = std::getenv("TMPDIR"); tmp && *tmp) base = tmp;
    path = (base / ("dgemma-fuzz-" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

const std::string& scratchDirectory() {
  static ScratchDirectory directory;
  return directory.path;
}

std::string writeScratchFile(const std::string& name, std::string_view bytes) {
  std::string path = scratchDirectory() + "/" + name;
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) {
    std::fprintf(stderr, "fuzz: cannot write the scratch file %s\n", path.c_str());
    std::abort();
  }
  return path;
}

std::string sourcePath(const std::string& relative) { return std::string(DGEMMA_SOURCE_DIR) + "/" + relative; }

}  // namespace dgemma::fuzz
