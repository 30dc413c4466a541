// The GRPO policy objective (docs/rl.md) through the compiled plan (`dgemma-compile --mode train
// --policy-loss grpo`, `dgemma-run grad`) against torch autograd in float64
// (test/fixtures/diffusion_gemma_grpo, from tools/reference/make_grpo_fixtures.py): base-sft and
// reweighted-ce (clip 100) × self-conditioning on/off × kl_coeff 0 / 0.04, on all_experts and
// seven_layers, fp32 plans.
//
// The loss is exp of a difference of log-probabilities of magnitude 50 to 500, so a float32 logps
// that is 1e-7 relative off moves the ratio, and with it the loss, kl and the gradient's per-example
// coefficients, by up to 5e-5 relative: more than the 1e-6 a loss is held to. The test therefore
// separates the two sources of error:
//   - logps within 1e-6 relative per example of the float64 reference (and of the Megatron Bridge
//     definition −ℓ_b max(Σ_l M_bl, 1) over the SFT fixtures' per-example loss), clipped exact;
//   - loss and kl within 1e-6 relative of the GRPO formula evaluated in float64 at the plan's own
//     logps (the plan's GRPO arithmetic), and of the reference up to what the logps gap explains;
//   - every gradient within 1e-5 ‖ref‖ plus Σ_b |Δ coefficient_b| ‖∂logps_b/∂θ‖ (the fixture's
//     per-example gradient norms), the move the logps gap alone makes.
// Beside the parity: the logps entry adds nothing to the gradient buffers and gives train_step's
// logps, and a padding row (canvas_mask 0, advantage 0, old = ref = 0) changes no gradient.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
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
constexpr double kClipEpsilon = 0.2;  // every fixture case's (meta.json "clip_epsilon")
const std::string kGradientPrefix = "grad/";
const std::string kNormPrefix = "logps_grad_norm/";

const std::string kFixtureRoot = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/";

struct GrpoCase {
  std::string model;
  std::string name;  // <objective>.sc<0|1>.kl<β>[.clip<c>]
};

std::string caseName(const ::testing::TestParamInfo<GrpoCase>& info) {
  std::string name = info.param.model + "_" + info.param.name;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

std::vector<double> toDoubles(const HostTensor& tensor, const std::string& what) {
  const HostTensor wide = convertDType(tensor, DType::F64, what);
  return std::vector<double>(wide.as<double>(), wide.as<double>() + wide.numElements());
}

double norm(const std::vector<double>& values) {
  double sum = 0;
  for (double value : values) sum += value * value;
  return std::sqrt(sum);
}

// The GRPO loss of docs/rl.md in float64 at given logps, and its derivative by each logps_b.
struct GrpoValues {
  double loss = 0;
  std::vector<double> kl, coefficient;  // coefficient_b = ∂loss/∂logps_b
};

GrpoValues grpo(const std::vector<double>& logps, const std::vector<double>& advantages, const std::vector<double>& old,
                const std::vector<double>& ref, double klCoeff, std::optional<double> clipDelta) {
  GrpoValues values;
  const double examples = static_cast<double>(logps.size());
  for (size_t b = 0; b < logps.size(); ++b) {
    const double ratio = std::exp(logps[b] - old[b]);
    const double unclipped = ratio * advantages[b];
    const double clippedBranch = std::clamp(ratio, 1 - kClipEpsilon, 1 + kClipEpsilon) * advantages[b];
    // The two-sided clip: a negative advantage's ratio above δ counts as δ, a constant.
    const bool capped = clipDelta && advantages[b] < 0 && ratio > *clipDelta;
    const bool clipped = clippedBranch < unclipped || capped;
    double objective = capped ? *clipDelta * advantages[b] : clipped ? clippedBranch : unclipped;
    double slope = clipped ? 0.0 : unclipped;
    if (klCoeff > 0) {
      const double difference = ref[b] - logps[b];
      values.kl.push_back(std::exp(difference) - difference - 1);
      objective -= klCoeff * values.kl.back();
      slope -= klCoeff * (1 - std::exp(difference));
    }
    values.loss -= objective / examples;
    values.coefficient.push_back(-slope / examples);
  }
  return values;
}

nlohmann::json readJson(const std::string& path) {
  std::ifstream file(path);
  EXPECT_TRUE(file) << path;
  return nlohmann::json::parse(file);
}

class DiffusionGemmaGrpoParity : public ::testing::TestWithParam<GrpoCase> {
 protected:
  std::string grpoDir() const { return kFixtureRoot + "diffusion_gemma_grpo/" + GetParam().model; }
  std::string modelDir() const { return kFixtureRoot + "diffusion_gemma/" + GetParam().model; }
  ScratchDirectory dir;
};

TEST_P(DiffusionGemmaGrpoParity, MatchesTorchAutograd) {
  const nlohmann::json meta = readJson(grpoDir() + "/meta.json");
  ASSERT_EQ(meta.at("clip_epsilon").get<double>(), kClipEpsilon);
  const nlohmann::json& fixtureCase = meta.at("cases").at(GetParam().name);
  const std::string flags = fixtureCase.at("flags").get<std::string>();
  const double klCoeff = flags.find("--kl-coeff 0.04") != std::string::npos ? 0.04 : 0.0;
  const std::optional<double> clipDelta =
      fixtureCase.contains("clip_delta") ? std::optional(fixtureCase.at("clip_delta").get<double>()) : std::nullopt;
  EXPECT_EQ(clipDelta.has_value(), flags.find("--clip-delta") != std::string::npos) << flags;
  const std::string inputPath = grpoDir() + "/" + GetParam().name + ".input.safetensors";
  SafetensorsFile input = SafetensorsFile::open(inputPath);
  SafetensorsFile expected = SafetensorsFile::open(grpoDir() + "/" + GetParam().name + ".safetensors");
  const HostTensor inputIds = input.read("input_ids");
  const std::string plan = dir / "plan", outPath = dir / "grad.safetensors";

  testing::ToolResult compiled =
      runTool(std::string(DGEMMA_COMPILE) + " --model " + modelDir() + " --mode train " + flags + " --micro-batch " +
              std::to_string(inputIds.shape[0]) + " --prompt-len " + std::to_string(inputIds.shape[1]) + " -o " + plan);
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  testing::ToolResult ran = runTool(std::string(DGEMMA_RUN) + " grad --plan " + plan + " --weights " + modelDir() +
                                    "/model.safetensors --input " + inputPath + " --out " + outPath);
  ASSERT_EQ(ran.exitCode, 0) << ran.output;
  SafetensorsFile out = SafetensorsFile::open(outPath);

  // The estimate.
  const std::vector<double> logps = toDoubles(out.read("logps"), "logps");
  const std::vector<double> referenceLogps = toDoubles(expected.read("logps"), "reference logps");
  ASSERT_EQ(logps.size(), referenceLogps.size());
  const size_t examples = logps.size();
  double worstLogps = 0;
  for (size_t b = 0; b < examples; ++b) {
    const double error = std::abs(logps[b] - referenceLogps[b]) / std::abs(referenceLogps[b]);
    EXPECT_LE(error, kLossTolerance) << "logps[" << b << "]";
    worstLogps = std::max(worstLogps, error);
  }
  // Megatron Bridge's diffusion_sft_logps over the SFT fixture of the same batch (all_experts has
  // the enc0 case of each objective; the weight clip 100 is above every w(t) of the batch).
  const std::string objective = GetParam().name.substr(0, GetParam().name.find('.'));
  const std::string selfConditioning = GetParam().name.substr(objective.size() + 1, 3);
  const std::string sftPath = kFixtureRoot + "diffusion_gemma_train/" + GetParam().model + "/" + objective + "." +
                              selfConditioning + ".enc0.safetensors";
  if (std::ifstream(sftPath)) {
    const std::vector<double> perExample =
        toDoubles(SafetensorsFile::open(sftPath).read("diffusion_loss_per_example"), "diffusion_loss_per_example");
    const std::vector<double> canvasMask = toDoubles(input.read("canvas_mask"), "canvas_mask");
    const size_t canvas = canvasMask.size() / examples;
    for (size_t b = 0; b < examples; ++b) {
      double tokens = 0;
      for (size_t l = 0; l < canvas; ++l) tokens += canvasMask[b * canvas + l];
      const double megatron = -perExample[b] * std::max(tokens, 1.0);
      EXPECT_LE(std::abs(logps[b] - megatron) / std::abs(megatron), kLossTolerance)
          << "logps[" << b << "] vs " << sftPath;
    }
  } else {
    EXPECT_NE(GetParam().model, "all_experts") << sftPath << ": missing";
  }
  EXPECT_EQ(toDoubles(out.read("clipped"), "clipped"), toDoubles(expected.read("clipped"), "reference clipped"));

  // The GRPO arithmetic at the plan's logps, and the reference up to what the logps gap explains.
  const std::vector<double> advantages = toDoubles(input.read("advantages"), "advantages");
  const std::vector<double> old = toDoubles(input.read("old_logps"), "old_logps");
  const std::vector<double> ref =
      klCoeff > 0 ? toDoubles(input.read("ref_logps"), "ref_logps") : std::vector<double>(examples, 0.0);
  EXPECT_EQ(input.find("ref_logps") != nullptr, klCoeff > 0);
  const GrpoValues atPlan = grpo(logps, advantages, old, ref, klCoeff, clipDelta);
  const GrpoValues atReference = grpo(referenceLogps, advantages, old, ref, klCoeff, clipDelta);
  const double loss = out.read("loss").as<float>()[0];
  const double referenceLoss = toDoubles(expected.read("loss"), "reference loss")[0];
  ASSERT_LE(std::abs(atReference.loss - referenceLoss), 1e-12 * std::abs(referenceLoss)) << "the test's formula";
  const double arithmeticError = std::abs(loss - atPlan.loss) / std::abs(atPlan.loss);
  EXPECT_LE(arithmeticError, kLossTolerance) << "loss at the plan's logps";
  const double explained = std::abs(atPlan.loss - atReference.loss);
  EXPECT_LE(std::abs(loss - referenceLoss), kLossTolerance * std::abs(referenceLoss) + explained) << "loss";
  ASSERT_EQ(out.find("kl") != nullptr, klCoeff > 0);
  ASSERT_EQ(expected.find("kl") != nullptr, klCoeff > 0);
  if (klCoeff > 0) {
    const std::vector<double> kl = toDoubles(out.read("kl"), "kl"),
                              referenceKl = toDoubles(expected.read("kl"), "reference kl");
    for (size_t b = 0; b < examples; ++b) {
      // e^d − d − 1 cancels: float32 keeps it to the size of its terms, not of the result.
      const double difference = ref[b] - logps[b];
      const double scale = std::exp(difference) + std::abs(difference) + 1;
      EXPECT_LE(std::abs(kl[b] - atPlan.kl[b]), kLossTolerance * scale) << "kl[" << b << "] at the plan's logps";
      EXPECT_LE(std::abs(kl[b] - referenceKl[b]), kLossTolerance * scale + std::abs(atPlan.kl[b] - atReference.kl[b]))
          << "kl[" << b << "]";
    }
  }

  // Every trainable parameter, and nothing else, gets a gradient.
  std::set<std::string> expectedNames, writtenNames;
  for (const SafetensorsEntry& entry : expected.entries())
    if (entry.name.rfind(kGradientPrefix, 0) == 0) expectedNames.insert(entry.name.substr(kGradientPrefix.size()));
  for (const SafetensorsEntry& entry : out.entries())
    if (entry.name.find('.') != std::string::npos) writtenNames.insert(entry.name);
  EXPECT_EQ(writtenNames, expectedNames);
  double worstGradient = 0, worstMove = 0;
  for (const std::string& name : expectedNames) {
    if (!writtenNames.count(name)) continue;
    const std::vector<double> actual = toDoubles(out.read(name), name);
    const std::vector<double> reference = toDoubles(expected.read(kGradientPrefix + name), name);
    ASSERT_EQ(actual.size(), reference.size()) << name;
    std::vector<double> difference(actual.size());
    for (size_t i = 0; i < actual.size(); ++i) difference[i] = actual[i] - reference[i];
    const std::vector<double> perExampleNorm = toDoubles(expected.read(kNormPrefix + name), name);
    double moved = 0;
    for (size_t b = 0; b < examples; ++b)
      moved += std::abs(atPlan.coefficient[b] - atReference.coefficient[b]) * perExampleNorm[b];
    const double scale = norm(reference), gap = norm(difference);
    EXPECT_LE(gap, kGradientTolerance * scale + moved) << name << ": ‖Δ‖ " << gap << ", ‖ref‖ " << scale;
    if (scale > 0) {
      worstGradient = std::max(worstGradient, gap / scale);
      worstMove = std::max(worstMove, moved / scale);
    }
  }
  std::cout << "[ grpo parity ] " << GetParam().model << " " << GetParam().name << ": logps " << worstLogps
            << ", loss at the plan's logps " << arithmeticError << ", loss vs reference "
            << std::abs(loss - referenceLoss) / std::abs(referenceLoss) << ", worst gradient ‖Δ‖/‖ref‖ "
            << worstGradient << " (the logps gap explains up to " << worstMove << ")\n";
  // The allowance stays far below the gradients themselves: the check is not vacuous.
  EXPECT_LE(worstMove, 2e-3);
}

std::vector<GrpoCase> grpoCases() {
  std::vector<GrpoCase> cases;
  for (const char* model : {"all_experts", "seven_layers"})
    for (const char* objective : {"base-sft", "reweighted-ce"})
      for (const char* selfConditioning : {"sc0", "sc1"})
        for (const char* kl : {"kl0", "kl0.04"})
          cases.push_back({model, std::string(objective) + "." + selfConditioning + "." + kl +
                                      (std::string(objective) == "reweighted-ce" ? ".clip100" : "")});
  for (const char* model : {"all_experts", "seven_layers"})
    for (const char* name : {"base-sft.sc0.kl0.delta1.38", "base-sft.sc1.kl0.04.delta1.38"})
      cases.push_back({model, name});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DiffusionGemmaGrpoParity, ::testing::ValuesIn(grpoCases()), caseName);

// In-process runs of one GRPO plan's entries (all_experts, base-sft, self-conditioning, kl 0.04).
class DiffusionGemmaGrpoEntries : public ::testing::Test {
 protected:
  const std::string model = kFixtureRoot + "diffusion_gemma/all_experts";
  const std::string caseName = "base-sft.sc1.kl0.04";
  const std::string inputPath = kFixtureRoot + "diffusion_gemma_grpo/all_experts/" + caseName + ".input.safetensors";

  std::map<std::string, HostTensor> readInput() const {
    SafetensorsFile file = SafetensorsFile::open(inputPath);
    std::map<std::string, HostTensor> batch;
    for (const SafetensorsEntry& entry : file.entries()) batch[entry.name] = file.read(entry.name);
    return batch;
  }

  std::unique_ptr<Session> compileAndOpen(int64_t microBatch, const std::string& name) {
    const std::string plan = dir / name;
    testing::ToolResult compiled = runTool(
        std::string(DGEMMA_COMPILE) + " --model " + model +
        " --mode train --objective base-sft --self-cond-prob 0.5 --policy-loss grpo --kl-coeff 0.04 --micro-batch " +
        std::to_string(microBatch) + " --prompt-len 9 -o " + plan);
    EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
    SessionOptions options;
    options.planDir = plan;
    options.weights = model + "/model.safetensors";
    options.threads = 2;
    return openSession(options);
  }

  // The gradient buffers (the plan's "grad/<parameter>" parameters), by parameter name.
  static std::map<std::string, std::vector<double>> gradientBuffers(const Session& session) {
    std::map<std::string, std::vector<double>> buffers;
    for (const Parameter& parameter : session.plan.parameters)
      if (parameter.name.rfind(kGradientPrefix, 0) == 0)
        buffers[parameter.name] = toDoubles(session.executor->parameter(parameter.name), parameter.name);
    return buffers;
  }

  ScratchDirectory dir;
};

TEST_F(DiffusionGemmaGrpoEntries, LogpsEntryAddsNoGradientAndMatchesTrainStep) {
  std::unique_ptr<Session> session = compileAndOpen(3, "plan");
  const ModelContract& names = session->model->contract();
  ASSERT_EQ(names.logpsEntry, "logps");
  const std::map<std::string, HostTensor> logpsOutputs = runEntry(*session, names.logpsEntry, readInput(), inputPath);
  ASSERT_EQ(logpsOutputs.size(), 1u) << "the logps entry outputs logps alone";
  const std::vector<double> fromLogpsEntry = toDoubles(logpsOutputs.at(names.logps), "logps");
  const auto untouched = gradientBuffers(*session);
  ASSERT_FALSE(untouched.empty());
  for (const auto& [name, values] : untouched)
    EXPECT_TRUE(std::all_of(values.begin(), values.end(), [](double v) { return v == 0; })) << name << " after logps";

  const std::map<std::string, HostTensor> stepOutputs =
      runEntry(*session, names.trainStepEntry, readInput(), inputPath);
  EXPECT_EQ(toDoubles(stepOutputs.at(names.logps), "train_step logps"), fromLogpsEntry);
  // train_step does add into them: the check above could fail.
  double total = 0;
  for (const auto& [name, values] : gradientBuffers(*session)) total += norm(values);
  EXPECT_GT(total, 0);
}

// A padding row adds exactly nothing: the B + 1 plan's loss and gradients are the B plan's scaled by B / (B + 1).
TEST_F(DiffusionGemmaGrpoEntries, PaddingRowContributesNothing) {
  std::map<std::string, HostTensor> batch = readInput();
  const int64_t examples = batch.at("advantages").shape[0];
  std::unique_ptr<Session> unpadded = compileAndOpen(examples, "plan");
  const ModelContract& names = unpadded->model->contract();
  const std::map<std::string, HostTensor> reference = runEntry(*unpadded, names.trainStepEntry, batch, inputPath);
  const auto referenceGradients = gradientBuffers(*unpadded);
  unpadded.reset();

  // The padding row: row 0's prompt and canvas ids (any valid ids), nothing scored, advantage 0, old = ref = 0.
  for (auto& [name, tensor] : batch) {
    HostTensor padded(tensor.dtype, tensor.shape);
    padded.shape[0] += 1;
    padded.data.resize(padded.data.size() + tensor.data.size() / examples);
    std::copy(tensor.data.begin(), tensor.data.end(), padded.data.begin());
    const size_t row = tensor.data.size() / examples;
    const bool zeroed =
        name == names.batch.canvasMask || name == names.advantages || name == names.oldLogps || name == names.refLogps;
    if (zeroed) std::fill(padded.data.begin() + tensor.data.size(), padded.data.end(), 0);
    else std::copy(tensor.data.begin(), tensor.data.begin() + row, padded.data.begin() + tensor.data.size());
    tensor = std::move(padded);
  }
  std::unique_ptr<Session> session = compileAndOpen(examples + 1, "plan-padded");
  const std::map<std::string, HostTensor> outputs = runEntry(*session, names.trainStepEntry, batch, inputPath);
  for (const std::string& field : {names.logps, names.clipped, names.klTerm})
    EXPECT_EQ(toDoubles(outputs.at(field), field).back(), 0.0) << field << " of the padding row";
  const double scale = static_cast<double>(examples) / static_cast<double>(examples + 1);
  const double loss = outputs.at(names.loss).as<float>()[0], referenceLoss = reference.at(names.loss).as<float>()[0];
  // Both sides are f32 plans whose GEMMs see B and B + 1 rows, which BLAS may block differently:
  // they agree to rounding, measured at 1.0e-6 relative on one CPU, within the 1e-5 the GRPO loss is
  // held to against float64.
  EXPECT_LE(std::abs(loss - scale * referenceLoss), kGradientTolerance * std::abs(referenceLoss));
  for (const auto& [name, values] : gradientBuffers(*session)) {
    const std::vector<double>& expectedValues = referenceGradients.at(name);
    std::vector<double> difference(values.size());
    for (size_t i = 0; i < values.size(); ++i) difference[i] = values[i] - scale * expectedValues[i];
    EXPECT_LE(norm(difference), kGradientTolerance * scale * norm(expectedValues)) << name;
  }
}

}  // namespace
}  // namespace dgemma
