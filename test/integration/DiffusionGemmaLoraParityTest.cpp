// LoRA fine-tuning through the compiled plan (`dgemma-compile --mode train --lora 4:8 --lora-targets
// GROUP`, `dgemma-run grad`) against torch autograd on HF transformers + PEFT
// (test/fixtures/diffusion_gemma_lora, produced in float64 by tools/reference/make_lora_fixtures.py,
// with each encoder adapter tied to its decoder adapter as dgemma has one adapter for both passes).
// Each case loads the fixture model's frozen base weights (--weights) and the fixture's adapters from
// the directory PEFT's own save_pretrained wrote (--adapter; lora_B non-zero, so every gradient is
// informative) and requires: each loss term within 1e-6 relative (or 1.5x the float32 noise floor
// the generator measured, where that is larger: hf_tester), a gradient for exactly the adapter
// parameters (the frozen base gets none), and each adapter gradient within 1e-5 relative
// (‖Δ‖/‖ref‖). docs/training.md, "LoRA adapters", "Parity".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include <fstream>
#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

using testing::runTool;
using testing::ScratchDirectory;

constexpr double kLossTolerance = 1e-6;
constexpr double kGradientTolerance = 1e-5;
constexpr double kNoiseFloorFactor = 1.5;
const std::string kGradientPrefix = "grad/";

struct LoraCase {
  std::string model;  // a fixture model under test/fixtures/diffusion_gemma
  std::string group;  // the --lora-targets value; also the fixture files' prefix
  std::string name;   // <objective>.sc<0|1>.enc<0|1>
};

void PrintTo(const LoraCase& c, std::ostream* os) { *os << c.model << " " << c.group << " " << c.name; }

std::string caseName(const ::testing::TestParamInfo<LoraCase>& info) {
  std::string name = info.param.model + "_" + info.param.group + "_" + info.param.name;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

// The dgemma-compile flags of a case name <objective>.sc<0|1>.enc<0|1>. The self-conditioning mask
// itself comes from the batch (the test hook of docs/training.md, "Uniform-state corruption"), so
// any probability in (0, 1] turns the second pass on.
std::string objectiveFlags(const std::string& name) {
  const size_t first = name.find('.'), second = name.find('.', first + 1);
  EXPECT_TRUE(first != std::string::npos && second != std::string::npos) << name;
  const std::string objective = name.substr(0, first), sc = name.substr(first + 1, second - first - 1),
                    enc = name.substr(second + 1);
  EXPECT_TRUE((sc == "sc0" || sc == "sc1") && (enc == "enc0" || enc == "enc1")) << name;
  return " --objective " + objective + " --self-cond-prob " + (sc == "sc1" ? "0.5" : "0") + " --encoder-loss-weight " +
         (enc == "enc1" ? "1" : "0");
}

double norm(const HostTensor& tensor) {
  double sum = 0;
  for (int64_t i = 0; i < tensor.numElements(); ++i) sum += double(tensor.as<float>()[i]) * tensor.as<float>()[i];
  return std::sqrt(sum);
}

class DiffusionGemmaLoraParity : public ::testing::TestWithParam<LoraCase> {
 protected:
  std::string fixtureRoot() const { return std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/"; }
  std::string modelDir() const { return fixtureRoot() + "diffusion_gemma/" + GetParam().model; }
  std::string loraDir() const { return fixtureRoot() + "diffusion_gemma_lora/" + GetParam().model; }
  std::string batchPath() const {
    return fixtureRoot() + "diffusion_gemma_train/" + GetParam().model + "/batch.safetensors";
  }

  // The adapter parameters under dgemma's names: those of the fixture's adapter weights.
  std::set<std::string> adapterNames() const {
    SafetensorsFile adapter = SafetensorsFile::open(loraDir() + "/" + GetParam().group + ".adapter.safetensors");
    std::set<std::string> names;
    for (const SafetensorsEntry& entry : adapter.entries()) names.insert(entry.name);
    return names;
  }

  // The case's entry in the fixture's meta.json (groups.<group>.cases[] with this file).
  nlohmann::json caseMeta() const {
    std::ifstream file(loraDir() + "/meta.json");
    EXPECT_TRUE(file) << loraDir() << "/meta.json: missing";
    const nlohmann::json meta = nlohmann::json::parse(file);
    const std::string wanted = GetParam().group + "." + GetParam().name + ".safetensors";
    for (const nlohmann::json& entry : meta.at("groups").at(GetParam().group).at("cases"))
      if (entry.at("file").get<std::string>() == wanted) return entry;
    ADD_FAILURE() << loraDir() << "/meta.json: no case " << wanted;
    return nlohmann::json{{"fp32_noise_floor", nlohmann::json::object()}};
  }

  ScratchDirectory dir;
};

TEST_P(DiffusionGemmaLoraParity, MatchesTorchAutogradWithPeft) {
  const LoraCase& param = GetParam();
  SafetensorsFile batch = SafetensorsFile::open(batchPath());
  SafetensorsFile expected = SafetensorsFile::open(loraDir() + "/" + param.group + "." + param.name + ".safetensors");
  const HostTensor inputIds = batch.read("input_ids");
  const std::string plan = dir / "plan", grads = dir / "grad.safetensors";
  const std::set<std::string> adapters = adapterNames();
  ASSERT_FALSE(adapters.empty());

  testing::ToolResult compiled =
      runTool(std::string(DGEMMA_COMPILE) + " --model " + modelDir() + " --mode train --precision fp32" +
              objectiveFlags(param.name) + " --lora 4:8 --lora-targets " + param.group + " --micro-batch " +
              std::to_string(inputIds.shape[0]) + " --prompt-len " + std::to_string(inputIds.shape[1]) + " -o " + plan);
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  // The base from the fixture model, the adapters from the directory PEFT's save_pretrained wrote.
  testing::ToolResult ran = runTool(std::string(DGEMMA_RUN) + " grad --plan " + plan + " --weights " + modelDir() +
                                    "/model.safetensors --adapter " + loraDir() + "/peft-" + param.group + " --input " +
                                    batchPath() + " --out " + grads);
  ASSERT_EQ(ran.exitCode, 0) << ran.output;
  SafetensorsFile out = SafetensorsFile::open(grads);

  const nlohmann::json floor = caseMeta().at("fp32_noise_floor");
  std::cout << "[ lora parity ] " << param.model << " " << param.group << " " << param.name;
  for (const char* name : {"loss", "diffusion_loss", "encoder_loss"}) {
    if (!expected.find(name)) {
      EXPECT_FALSE(out.find(name)) << name << ": written, but the case has no such term";
      continue;
    }
    ASSERT_TRUE(out.find(name)) << name << ": not written";
    const double reference = convertDType(expected.read(name), DType::F64, name).as<double>()[0];
    const double actual = out.read(name).as<float>()[0];
    const double error = std::abs(actual - reference) / std::abs(reference);
    // 1e-6, unless float32 itself cannot resolve the term that finely on this case (hf_tester, whose
    // head_dim-256 attention at scale 1 is peaky): then 1.5x the float32 noise floor the generator
    // measured (fp32_noise_floor in meta.json: HF + PEFT in float32 with one rounding of noise on the
    // base weights).
    const double bound = std::max(kLossTolerance, kNoiseFloorFactor * floor.at(name).get<double>());
    std::cout << " " << name << " " << error << " (bound " << bound << ")";
    EXPECT_LE(error, bound) << name << ": " << actual << " against " << reference;
  }

  // Exactly the adapters get a gradient: the frozen base weights are no trainable parameters.
  std::set<std::string> expectedNames, writtenNames;
  for (const SafetensorsEntry& entry : expected.entries())
    if (entry.name.rfind(kGradientPrefix, 0) == 0) expectedNames.insert(entry.name.substr(kGradientPrefix.size()));
  for (const SafetensorsEntry& entry : out.entries())
    if (entry.name.find('.') != std::string::npos) writtenNames.insert(entry.name);
  EXPECT_EQ(expectedNames, adapters) << "the fixture's gradients and adapter weights disagree";
  EXPECT_EQ(writtenNames, expectedNames);

  double worst = 0;
  std::string worstName;
  for (const std::string& name : expectedNames) {
    if (!writtenNames.count(name)) continue;
    const HostTensor reference = expected.read(kGradientPrefix + name), actual = out.read(name);
    ASSERT_EQ(actual.shape, reference.shape) << name;
    ASSERT_EQ(actual.dtype, DType::F32) << name;
    HostTensor difference(DType::F32, reference.shape);
    for (int64_t i = 0; i < reference.numElements(); ++i)
      difference.as<float>()[i] = actual.as<float>()[i] - reference.as<float>()[i];
    const double scale = norm(reference);
    // The fixture's adapters have non-zero lora_B, so every reference gradient is non-zero.
    ASSERT_GT(scale, 0) << name;
    const double error = norm(difference) / scale;
    if (error > worst) worst = error, worstName = name;
    EXPECT_LE(error, kGradientTolerance) << name;
  }
  std::cout << " worst gradient " << worst << " (" << worstName << ")\n";
}

std::vector<LoraCase> loraCases() {
  std::vector<LoraCase> cases;
  for (const char* group : {"attention", "mlp", "experts", "router"}) {
    cases.push_back({"all_experts", group, "reweighted-loo-ce.sc1.enc1"});
    cases.push_back({"all_experts", group, "base-sft.sc0.enc0"});
    cases.push_back({"seven_layers", group, "reweighted-loo-ce.sc1.enc1"});
    cases.push_back({"hf_tester", group, "reweighted-loo-ce.sc1.enc1"});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DiffusionGemmaLoraParity, ::testing::ValuesIn(loraCases()), caseName);

}  // namespace
}  // namespace dgemma
