// The pre-training objectives (docs/pretraining-objectives.md) through the compiled plan
// (`dgemma-compile --mode train --objective autoregressive|masked-diffusion --seq-len 24`, run
// in-process by the session) against torch autograd in float64 over HF's text stack with explicit
// document masks (test/fixtures/diffusion_gemma_pretrain, from
// tools/reference/make_pretraining_fixtures.py): packed rows of 2 and 3 documents, documents longer
// than the sliding window, padding, fp32 plans on the all_experts fixture. The loss within 1e-6
// relative, every parameter gradient ‖Δ‖/‖ref‖ <= 1e-5. The masked-diffusion step's own draws
// (p_mask, the masked positions and ids, the fallback row that the draw left unmasked) equal the
// reference's, which are docs/kernels.md's Philox uniforms written out in Python.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "runtime/io/Safetensors.h"
#include "runtime/session/RunEntry.h"
#include "runtime/session/Session.h"

namespace dgemma {
namespace {

using testing::runTool;
using testing::ScratchDirectory;

constexpr double kLossTolerance = 1e-6;
constexpr double kGradientTolerance = 1e-5;
const std::string kGradientPrefix = "grad/";
const std::string kFixtureRoot = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/";

std::vector<double> toDoubles(const HostTensor& tensor, const std::string& what) {
  const HostTensor wide = convertDType(tensor, DType::F64, what);
  return std::vector<double>(wide.as<double>(), wide.as<double>() + wide.numElements());
}

std::vector<int64_t> toInts(const HostTensor& tensor) {
  EXPECT_EQ(tensor.dtype, DType::I64);
  return std::vector<int64_t>(tensor.as<int64_t>(), tensor.as<int64_t>() + tensor.numElements());
}

nlohmann::json readJson(const std::string& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file) << path;
  return nlohmann::json::parse(file);
}

std::map<std::string, HostTensor> readAll(const std::string& path) {
  SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, HostTensor> tensors;
  for (const SafetensorsEntry& entry : file.entries()) tensors[entry.name] = file.read(entry.name);
  return tensors;
}

class DiffusionGemmaPretrainingParity : public ::testing::TestWithParam<std::string> {
 protected:
  const std::string fixtureDir = kFixtureRoot + "diffusion_gemma_pretrain/all_experts";
  const std::string modelDir = kFixtureRoot + "diffusion_gemma/all_experts";
  ScratchDirectory dir;
};

TEST_P(DiffusionGemmaPretrainingParity, MatchesTorchAutograd) {
  const std::string objective = GetParam();
  const nlohmann::json meta = readJson(fixtureDir + "/meta.json");
  const std::string flags = meta.at("cases").at(objective).at("flags").get<std::string>();
  const std::string inputPath = fixtureDir + "/" + objective + ".input.safetensors";
  const std::map<std::string, HostTensor> batch = readAll(inputPath);
  const std::map<std::string, HostTensor> expected = readAll(fixtureDir + "/" + objective + ".safetensors");
  const HostTensor& inputIds = batch.at("input_ids");

  const std::string plan = dir / "plan";
  testing::ToolResult compiled =
      runTool(std::string(DGEMMA_COMPILE) + " --model " + modelDir + " --mode train " + flags + " --micro-batch " +
              std::to_string(inputIds.shape[0]) + " --seq-len " + std::to_string(inputIds.shape[1]) + " -o " + plan);
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  SessionOptions options;
  options.planDir = plan;
  options.weights = modelDir + "/model.safetensors";
  options.threads = 2;
  std::unique_ptr<Session> session = openSession(options);
  const std::map<std::string, HostTensor> outputs = runEntry(*session, "train_step", batch, inputPath);

  const double loss = toDoubles(outputs.at("loss"), "loss").at(0);
  const double referenceLoss = toDoubles(expected.at("loss"), "reference loss").at(0);
  EXPECT_LE(std::abs(loss - referenceLoss) / std::abs(referenceLoss), kLossTolerance)
      << "loss " << loss << " vs " << referenceLoss;

  if (objective == "masked-diffusion") {
    // The draws are exact: the same Philox words, compared in the same float32 arithmetic.
    EXPECT_EQ(toDoubles(outputs.at("p_mask"), "p_mask"), toDoubles(expected.at("p_mask"), "reference p_mask"));
    EXPECT_EQ(toDoubles(outputs.at("masked_positions"), "masked_positions"),
              toDoubles(expected.at("masked_positions"), "reference masked_positions"));
    EXPECT_EQ(toInts(outputs.at("masked_input_ids")), toInts(expected.at("masked_input_ids")));
    ASSERT_EQ(meta.at("cases").at(objective).at("fallback_rows"), nlohmann::json::array({2}))
        << "the fixture must exercise the at-least-one-masked-token fallback";
  }

  std::set<std::string> planGradients;
  for (const Parameter& parameter : session->plan.parameters) {
    if (parameter.name.rfind(kGradientPrefix, 0) != 0) continue;
    planGradients.insert(parameter.name);
    ASSERT_TRUE(expected.count(parameter.name)) << parameter.name << " has no reference";
    const std::vector<double> got = toDoubles(session->executor->parameter(parameter.name), parameter.name);
    const std::vector<double> want = toDoubles(expected.at(parameter.name), "reference " + parameter.name);
    ASSERT_EQ(got.size(), want.size()) << parameter.name;
    double difference = 0, reference = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      difference += (got[i] - want[i]) * (got[i] - want[i]);
      reference += want[i] * want[i];
    }
    // A gradient that is exactly zero in the reference (the pad row's embedding) must be zero here too.
    if (reference == 0) {
      EXPECT_EQ(difference, 0) << parameter.name;
      continue;
    }
    EXPECT_LE(std::sqrt(difference / reference), kGradientTolerance) << parameter.name;
  }
  // The parameters the objective does not read (the decoder's self-conditioning block) have no
  // gradient buffer; the reference's gradient of each is exactly zero. Every other one was compared.
  int64_t unused = 0;
  for (const auto& [name, tensor] : expected) {
    if (name.rfind(kGradientPrefix, 0) != 0 || planGradients.count(name)) continue;
    ++unused;
    EXPECT_NE(name.find("self_conditioning"), std::string::npos) << name << ": no gradient buffer in the plan";
    for (double value : toDoubles(tensor, name)) ASSERT_EQ(value, 0.0) << name;
  }
  EXPECT_EQ(unused, 4) << "the self-conditioning block: pre_norm, gate_proj, up_proj, down_proj";
  EXPECT_GT(planGradients.size(), 60u);
}

INSTANTIATE_TEST_SUITE_P(Objectives, DiffusionGemmaPretrainingParity,
                         ::testing::Values("autoregressive", "masked-diffusion"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

}  // namespace
}  // namespace dgemma
