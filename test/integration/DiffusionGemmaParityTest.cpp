// DiffusionGemma forward through the compiled plan against HF transformers reference tensors
// (test/fixtures/diffusion_gemma, produced by tools/reference/make_diffusion_gemma_fixtures.py):
// soft-capped decoder logits without, with and with masked self-conditioning; encoder final hidden
// states and per-layer K/V at the valid (non-padding) prompt positions. Tolerance: max|Δ| / max|ref|
// <= 1e-5 in fp32. A bf16 plan's logits (all_experts, whose routing takes every expert, so no top-k
// choice can flip) must be within 1.5x of HF transformers' own bf16 error (bf16.json).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

using testing::runTool;
using testing::ScratchDirectory;

constexpr double kTolerance = 1e-5;

struct Error {
  double maxAbs = 0;
  double maxRef = 0;
  double relative() const { return maxRef > 0 ? maxAbs / maxRef : maxAbs; }
};

void accumulate(Error& error, float actual, float expected) {
  error.maxAbs = std::max(error.maxAbs, std::abs(double(actual) - expected));
  error.maxRef = std::max(error.maxRef, std::abs(double(expected)));
}

struct ParityCase {
  std::string fixture;
  std::string expectedLogits;  // logits | logits_sc | logits_sc_masked
};

class DiffusionGemmaParity : public ::testing::TestWithParam<ParityCase> {
 protected:
  std::string fixtureDir() const { return std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/" + GetParam().fixture; }

  // Compiles the fixture's forward plan at `precision`, runs the case's batch and returns the outputs' file.
  std::string runForward(const std::string& precision) {
    const std::string fixture = fixtureDir();
    SafetensorsFile batchFile = SafetensorsFile::open(fixture + "/batch.safetensors");
    SafetensorsFile expected = SafetensorsFile::open(fixture + "/expected.safetensors");
    HostTensor inputIds = batchFile.read("input_ids");
    const int64_t batch = inputIds.shape[0], promptLength = inputIds.shape[1];

    // The batch as the case needs it: no self-conditioning logits, the fixture's, or the fixture's
    // with its per-example mask.
    std::vector<HostTensor> tensors;
    std::vector<std::string> names;
    for (const SafetensorsEntry& entry : batchFile.entries()) {
      if (entry.name == "self_conditioning_logits" && GetParam().expectedLogits == "logits") continue;
      names.push_back(entry.name);
      tensors.push_back(batchFile.read(entry.name));
    }
    if (GetParam().expectedLogits == "logits_sc_masked") {
      names.push_back("self_conditioning_mask");
      tensors.push_back(convertDType(expected.read("self_conditioning_mask"), DType::F32, "mask"));
    }
    std::vector<std::pair<std::string, const HostTensor*>> refs;
    for (size_t i = 0; i < names.size(); ++i) refs.push_back({names[i], &tensors[i]});
    writeSafetensors(dir / "batch.safetensors", refs);

    const std::string plan = dir / ("plan-" + precision), out = dir / ("out-" + precision + ".safetensors");
    testing::ToolResult compiled =
        runTool(std::string(DGEMMA_COMPILE) + " --model " + fixture + " --mode infer --precision " + precision +
                " --micro-batch " + std::to_string(batch) + " --prompt-len " + std::to_string(promptLength) + " -o " + plan);
    EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
    testing::ToolResult ran = runTool(std::string(DGEMMA_RUN) + " forward --plan " + plan + " --weights " + fixture +
                                      "/model.safetensors --input " + (dir / "batch.safetensors") + " --out " + out);
    EXPECT_EQ(ran.exitCode, 0) << ran.output;
    return out;
  }

  // max|Δ| / max|ref| of the case's logits.
  Error logitsError(const std::string& outputs) {
    HostTensor logits = SafetensorsFile::open(outputs).read("logits");
    HostTensor reference = SafetensorsFile::open(fixtureDir() + "/expected.safetensors").read(GetParam().expectedLogits);
    EXPECT_EQ(logits.shape, reference.shape);
    Error error;
    if (logits.shape != reference.shape) return error;
    for (int64_t i = 0; i < logits.numElements(); ++i) accumulate(error, logits.as<float>()[i], reference.as<float>()[i]);
    return error;
  }

  ScratchDirectory dir;
};

TEST_P(DiffusionGemmaParity, MatchesTransformers) {
  const std::string fixture = fixtureDir();
  SafetensorsFile batchFile = SafetensorsFile::open(fixture + "/batch.safetensors");
  SafetensorsFile expected = SafetensorsFile::open(fixture + "/expected.safetensors");
  HostTensor inputIds = batchFile.read("input_ids");
  HostTensor attentionMask = batchFile.read("attention_mask");
  const int64_t batch = inputIds.shape[0], promptLength = inputIds.shape[1];

  const std::string outputs = runForward("fp32");
  if (HasFailure()) return;
  SafetensorsFile out = SafetensorsFile::open(outputs);

  // Logits over every canvas position.
  const Error logits = logitsError(outputs);
  EXPECT_LE(logits.relative(), kTolerance) << "logits";
  std::cout << "[ parity ] " << GetParam().fixture << " " << GetParam().expectedLogits << ": logits " << logits.relative();

  // Encoder outputs at real prompt tokens (padding rows are not defined by the reference).
  auto valid = [&](int64_t b, int64_t p) { return attentionMask.as<int64_t>()[b * promptLength + p] != 0; };
  HostTensor hidden = out.read("encoder_hidden"), referenceHidden = expected.read("encoder_hidden");
  ASSERT_EQ(hidden.shape, referenceHidden.shape);
  const int64_t width = hidden.shape[2];
  Error hiddenError;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t p = 0; p < promptLength; ++p)
      if (valid(b, p))
        for (int64_t h = 0; h < width; ++h) {
          int64_t i = (b * promptLength + p) * width + h;
          accumulate(hiddenError, hidden.as<float>()[i], referenceHidden.as<float>()[i]);
        }
  EXPECT_LE(hiddenError.relative(), kTolerance) << "encoder_hidden";

  // K/V per layer: dgemma's [B, P, Hkv, D] against HF's untrimmed cache [B, Hkv, P, D].
  Error keyValueError;
  int64_t layers = 0;
  for (; expected.find("encoder_k_untrimmed." + std::to_string(layers)); ++layers) {
    for (const char* kind : {"k", "v"}) {
      std::string suffix = std::string(kind) + "." + std::to_string(layers);
      HostTensor actual = out.read("encoder_" + suffix), reference = expected.read("encoder_" + std::string(kind) + "_untrimmed." + std::to_string(layers));
      const int64_t heads = actual.shape[2], headDim = actual.shape[3];
      ASSERT_EQ(reference.shape, (std::vector<int64_t>{batch, heads, promptLength, headDim})) << suffix;
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t p = 0; p < promptLength; ++p)
          if (valid(b, p))
            for (int64_t h = 0; h < heads; ++h)
              for (int64_t d = 0; d < headDim; ++d)
                accumulate(keyValueError, actual.as<float>()[((b * promptLength + p) * heads + h) * headDim + d],
                           reference.as<float>()[((b * heads + h) * promptLength + p) * headDim + d]);
    }
  }
  EXPECT_GT(layers, 0);
  EXPECT_LE(keyValueError.relative(), kTolerance) << "encoder K/V";
  std::cout << ", encoder_hidden " << hiddenError.relative() << ", K/V " << keyValueError.relative() << "\n";
}

std::vector<ParityCase> allCases() {
  std::vector<ParityCase> cases;
  for (const char* fixture : {"hf_tester", "seven_layers", "all_experts"})
    for (const char* logits : {"logits", "logits_sc", "logits_sc_masked"}) cases.push_back({fixture, logits});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DiffusionGemmaParity, ::testing::ValuesIn(allCases()),
                         [](const ::testing::TestParamInfo<ParityCase>& info) {
                           return info.param.fixture + "_" + info.param.expectedLogits;
                         });

// bf16 on all_experts only: with top-k routing, one expert choice that bf16 flips would dominate
// max|Δ| for HF and dgemma alike.
class DiffusionGemmaBf16Parity : public DiffusionGemmaParity {};

TEST_P(DiffusionGemmaBf16Parity, WithinHfBf16Error) {
  std::ifstream file(std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma_train/all_experts/bf16.json");
  ASSERT_TRUE(file) << "bf16.json: missing (tools/reference/make_bf16_training_reference.py)";
  const double hfError = nlohmann::json::parse(file).at("forward").at(GetParam().expectedLogits + "_rel_err").get<double>();
  const std::string outputs = runForward("bf16");
  if (HasFailure()) return;
  const double error = logitsError(outputs).relative();
  std::cout << "[ parity bf16 ] " << GetParam().expectedLogits << ": logits " << error << " (HF bf16 " << hfError << ")\n";
  EXPECT_LE(error, 1.5 * hfError);
  EXPECT_GT(error, 1e-4) << "the bf16 plan rounds like an fp32 one";
}

INSTANTIATE_TEST_SUITE_P(AllExperts, DiffusionGemmaBf16Parity,
                         ::testing::Values(ParityCase{"all_experts", "logits"}, ParityCase{"all_experts", "logits_sc"},
                                           ParityCase{"all_experts", "logits_sc_masked"}),
                         [](const ::testing::TestParamInfo<ParityCase>& info) { return info.param.expectedLogits; });

}  // namespace
}  // namespace dgemma

namespace dgemma {
namespace {

// Older HF versions spell the full-layer geometry as global_head_dim / num_global_key_value_heads
// instead of per_layer_config; both must compile to the same model (docs/model.md, "Text config").
TEST(DiffusionGemmaConfigForms, LegacyGlobalFieldsGiveTheSameLogits) {
  const std::string fixture = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/seven_layers";
  ScratchDirectory dir;
  std::vector<std::vector<uint8_t>> logits;
  for (const std::string& config : {fixture + "/config.json", fixture + "/config_legacy.json"}) {
    std::string plan = dir / ("plan" + std::to_string(logits.size()));
    std::string out = dir / ("out" + std::to_string(logits.size()) + ".safetensors");
    testing::ToolResult compiled =
        runTool(std::string(DGEMMA_COMPILE) + " --model " + config + " --mode infer --micro-batch 4 --prompt-len 11 -o " + plan);
    ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
    testing::ToolResult ran = runTool(std::string(DGEMMA_RUN) + " forward --plan " + plan + " --weights " + fixture +
                                      "/model.safetensors --input " + fixture + "/batch.safetensors --out " + out);
    ASSERT_EQ(ran.exitCode, 0) << ran.output;
    logits.push_back(SafetensorsFile::open(out).read("logits").data);
  }
  EXPECT_EQ(logits[0], logits[1]);
}

}  // namespace
}  // namespace dgemma

namespace dgemma {
namespace {

// A batch shorter than every bucket runs left-padded in the smallest bucket that holds it, and the
// prompt-length outputs come back cropped. Logits and the encoder's hidden states are unchanged up to
// rounding: RoPE, the window and the decoder's prefix truncation depend on distances only. (Keys
// after RoPE carry the bucket's absolute positions, as HF's would for a batch padded that wide.)
TEST(DiffusionGemmaBuckets, ShorterPromptsRunLeftPaddedInALargerBucket) {
  const std::string fixture = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/seven_layers";
  ScratchDirectory dir;
  testing::ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + fixture +
                                         " --mode infer --micro-batch 4 --prompt-len 8,16,32 -o " + (dir / "plan"));
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  testing::ToolResult ran = runTool(std::string(DGEMMA_RUN) + " forward --plan " + (dir / "plan") + " --weights " + fixture +
                                    "/model.safetensors --input " + fixture + "/batch.safetensors --out " + (dir / "out.safetensors"));
  ASSERT_EQ(ran.exitCode, 0) << ran.output;

  SafetensorsFile out = SafetensorsFile::open(dir / "out.safetensors");
  SafetensorsFile expected = SafetensorsFile::open(fixture + "/expected.safetensors");
  HostTensor mask = SafetensorsFile::open(fixture + "/batch.safetensors").read("attention_mask");
  HostTensor logits = out.read("logits"), reference = expected.read("logits_sc");
  ASSERT_EQ(logits.shape, reference.shape);
  Error logitsError;
  for (int64_t i = 0; i < logits.numElements(); ++i) accumulate(logitsError, logits.as<float>()[i], reference.as<float>()[i]);
  EXPECT_LE(logitsError.relative(), kTolerance);

  HostTensor hidden = out.read("encoder_hidden"), referenceHidden = expected.read("encoder_hidden");
  ASSERT_EQ(hidden.shape, referenceHidden.shape);  // cropped back from the bucket of 16 to the batch's 11
  const int64_t width = hidden.shape[2];
  Error hiddenError;
  for (int64_t row = 0; row < mask.numElements(); ++row)
    if (mask.as<int64_t>()[row])
      for (int64_t h = 0; h < width; ++h)
        accumulate(hiddenError, hidden.as<float>()[row * width + h], referenceHidden.as<float>()[row * width + h]);
  EXPECT_LE(hiddenError.relative(), kTolerance);
  EXPECT_EQ(out.read("encoder_k.0").shape[1], 11);
  std::cout << "[ parity ] seven_layers in bucket 16: logits " << logitsError.relative() << ", encoder_hidden "
            << hiddenError.relative() << "\n";
}

}  // namespace
}  // namespace dgemma

namespace dgemma {
namespace {

// The forward contract's masks (docs/cli.md) may come in any numeric dtype, and a batch that carries
// self_conditioning_mask = 1 but no self_conditioning_logits gets an exactly zero signal, as in
// transformers: its logits are the reference's without self-conditioning.
TEST(DiffusionGemmaForwardContract, MaskWithoutLogitsGivesNoSignalAndMasksTakeAnyDType) {
  const std::string fixture = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/seven_layers";
  ScratchDirectory dir;
  SafetensorsFile batchFile = SafetensorsFile::open(fixture + "/batch.safetensors");
  std::vector<std::string> names;
  std::vector<HostTensor> tensors;
  for (const SafetensorsEntry& entry : batchFile.entries()) {
    if (entry.name == "self_conditioning_logits" || entry.name == "self_conditioning_mask") continue;
    names.push_back(entry.name);
    HostTensor tensor = batchFile.read(entry.name);
    if (entry.name == "attention_mask") {  // the same 0/1 values as f32
      HostTensor asFloat(DType::F32, tensor.shape);
      for (int64_t i = 0; i < tensor.numElements(); ++i) asFloat.as<float>()[i] = static_cast<float>(tensor.as<int64_t>()[i]);
      tensor = asFloat;
    }
    tensors.push_back(tensor);
  }
  const int64_t batch = batchFile.read("input_ids").shape[0];
  HostTensor conditioned(DType::I32, {batch});
  for (int64_t row = 0; row < batch; ++row) conditioned.as<int32_t>()[row] = 1;
  names.push_back("self_conditioning_mask");
  tensors.push_back(conditioned);
  std::vector<std::pair<std::string, const HostTensor*>> refs;
  for (size_t i = 0; i < names.size(); ++i) refs.push_back({names[i], &tensors[i]});
  writeSafetensors(dir / "batch.safetensors", refs);

  testing::ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + fixture +
                                         " --mode infer --micro-batch 4 --prompt-len 11 -o " + (dir / "plan"));
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  testing::ToolResult ran = runTool(std::string(DGEMMA_RUN) + " forward --plan " + (dir / "plan") + " --weights " + fixture +
                                    "/model.safetensors --input " + (dir / "batch.safetensors") + " --out " + (dir / "out.safetensors"));
  ASSERT_EQ(ran.exitCode, 0) << ran.output;
  HostTensor logits = SafetensorsFile::open(dir / "out.safetensors").read("logits");
  HostTensor reference = SafetensorsFile::open(fixture + "/expected.safetensors").read("logits");
  ASSERT_EQ(logits.shape, reference.shape);
  Error error;
  for (int64_t i = 0; i < logits.numElements(); ++i) accumulate(error, logits.as<float>()[i], reference.as<float>()[i]);
  EXPECT_LE(error.relative(), kTolerance);

  // A mask value other than 0 or 1 is bad input, in any dtype.
  HostTensor half(DType::F32, {batch});
  for (int64_t row = 0; row < batch; ++row) half.as<float>()[row] = 0.5f;
  tensors.back() = half;
  writeSafetensors(dir / "bad.safetensors", refs);
  testing::ToolResult rejected = runTool(std::string(DGEMMA_RUN) + " forward --plan " + (dir / "plan") + " --weights " + fixture +
                                         "/model.safetensors --input " + (dir / "bad.safetensors") + " --out " + (dir / "bad-out.safetensors"));
  EXPECT_EQ(rejected.exitCode, 2) << rejected.output;
  EXPECT_NE(rejected.output.find("self_conditioning_mask: element 0: expected 0 or 1, got 0.5"), std::string::npos) << rejected.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "bad-out.safetensors"));
}

}  // namespace
}  // namespace dgemma
