// What two `dgemma-run train` runs are compared by when they must agree bit for bit: the metrics
// lines (losses, grad norms) and the checkpoint's tensor files.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace dgemma::testing {

inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The metrics lines without the wall-clock field, the one field two runs may differ in.
inline std::vector<std::string> metricsLines(const std::string& path) {
  static const std::regex seconds(R"(, "seconds": [^,}]*)");
  std::vector<std::string> lines;
  std::istringstream in(readFile(path));
  for (std::string line; std::getline(in, line);) lines.push_back(std::regex_replace(line, seconds, ""));
  return lines;
}

// Every safetensors file under `root`, by its path relative to it, with its bytes.
inline std::map<std::string, std::string> checkpointTensors(const std::filesystem::path& root) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors")
      files[std::filesystem::relative(entry.path(), root).string()] = readFile(entry.path().string());
  return files;
}

}  // namespace dgemma::testing
