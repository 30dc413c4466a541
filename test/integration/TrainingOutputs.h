// What two `dgemma-run train` runs are compared by: the metrics lines (losses, grad norms) and the
// checkpoint's tensor files when they must agree bit for bit, the parsed records and tensors'
// relative distance when they must agree to a tolerance.
#pragma once

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "runtime/core/HostTensor.h"

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

// The metrics records of one split ("train", "validation", ...), parsed, in file order.
inline std::vector<nlohmann::json> splitRecords(const std::string& path, const std::string& split = "train") {
  std::vector<nlohmann::json> records;
  std::istringstream in(readFile(path));
  for (std::string line; std::getline(in, line);) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.at("split") == split) records.push_back(record);
  }
  return records;
}

// ||got - want|| / ||want|| of two f32 tensors over want's elements (L2; the absolute distance for
// a zero tensor); `got` may hold more elements after them (a padded vocabulary's rows).
inline double relativeDistance(const HostTensor& got, const HostTensor& want) {
  double difference = 0, norm = 0;
  const float* a = got.as<float>();
  const float* b = want.as<float>();
  for (int64_t i = 0; i < want.numElements(); ++i) {
    difference += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    norm += double(b[i]) * double(b[i]);
  }
  return norm > 0 ? std::sqrt(difference / norm) : std::sqrt(difference);
}

// One metrics record against another (splitRecords): the losses to 1e-6 and the gradient norm to
// 1e-5, relative to `want`, as every layout-parity test compares a step.
inline void expectSameLosses(const nlohmann::json& got, const nlohmann::json& want) {
  for (auto [field, tolerance] :
       {std::pair{"loss", 1e-6}, {"diffusion_loss", 1e-6}, {"encoder_loss", 1e-6}, {"grad_norm", 1e-5}}) {
    const double a = got.at(field).get<double>(), b = want.at(field).get<double>();
    EXPECT_LE(std::fabs(a - b), tolerance * std::fabs(b))
        << "step " << want.at("step") << " " << field << ": " << a << " vs " << b;
  }
}

}  // namespace dgemma::testing
