// The inference entries (docs/inference-plan.md) against the forward entry of the same plan, on the
// HF-checked fixtures (test/fixtures/diffusion_gemma). seven_layers has sliding_window 4, so every
// sliding cache keeps 3 of the prompt's 11 positions: the truncation is exercised, not assumed.
//   (a) prefill + denoise (temperature 1, so the stored z is the logits) = forward's logits, without
//       and with a self-conditioning signal;
//   (b) after committing a block X, each cache = the last C_l slots of forward's encoder K/V for the
//       prompt + X as one longer prompt (zeros where nothing was written);
//   (c) a denoise after that commit = forward on the longer prompt (positions moved on by L);
//   (d) frozen rows keep their stored self-conditioning logits bit for bit;
//   (e) denoise_first = denoise with self-conditioning mask 0, bit for bit.
// Tolerance: max|Δ| / max|ref| <= 1e-5 (fp32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "runtime/io/Safetensors.h"
#include "runtime/session/RunEntry.h"
#include "runtime/session/Session.h"

namespace dgemma {
namespace {

using testing::runTool;
using testing::ScratchDirectory;

constexpr double kTolerance = 1e-5;

// max|actual - expected| / max|expected| over every element (both read as f32).
double relativeError(const HostTensor& actual, const HostTensor& expected) {
  EXPECT_EQ(actual.shape, expected.shape);
  if (actual.shape != expected.shape) return INFINITY;
  double maxAbs = 0, maxRef = 0;
  for (int64_t i = 0; i < actual.numElements(); ++i) {
    maxAbs = std::max(maxAbs, std::abs(double(actual.as<float>()[i]) - expected.as<float>()[i]));
    maxRef = std::max(maxRef, std::abs(double(expected.as<float>()[i])));
  }
  return maxRef > 0 ? maxAbs / maxRef : maxAbs;
}

// Expects max|Δ| / max|ref| within the tolerance and prints it, as the parity tests do.
void expectClose(const HostTensor& actual, const HostTensor& expected, const std::string& what) {
  const double error = relativeError(actual, expected);
  EXPECT_LE(error, kTolerance) << what;
  std::cout << "[ inference ] " << ::testing::UnitTest::GetInstance()->current_test_info()->value_param() << " " << what
            << ": " << error << "\n";
}

HostTensor filled(DType dtype, std::vector<int64_t> shape, double value) {
  HostTensor tensor(dtype, std::move(shape));
  for (int64_t i = 0; i < tensor.numElements(); ++i) {
    if (dtype == DType::I64) tensor.as<int64_t>()[i] = static_cast<int64_t>(value);
    else tensor.as<float>()[i] = static_cast<float>(value);
  }
  return tensor;
}

// Rows start + arange(count), the same on every row.
HostTensor positions(int64_t batch, int64_t start, int64_t count) {
  HostTensor tensor(DType::I64, {batch, count});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < count; ++i) tensor.as<int64_t>()[b * count + i] = start + i;
  return tensor;
}

// [a ; b] along axis 1 of two [B, ...] tensors of one dtype.
HostTensor concatRows(const HostTensor& a, const HostTensor& b) {
  std::vector<int64_t> shape = a.shape;
  shape[1] += b.shape[1];
  HostTensor out(a.dtype, shape);
  const size_t rowA = a.data.size() / a.shape[0], rowB = b.data.size() / b.shape[0];
  for (int64_t r = 0; r < a.shape[0]; ++r) {
    std::memcpy(out.data.data() + r * (rowA + rowB), a.data.data() + r * rowA, rowA);
    std::memcpy(out.data.data() + r * (rowA + rowB) + rowA, b.data.data() + r * rowB, rowB);
  }
  return out;
}

// The last `slots` positions (axis 1) of [zeros ; tensor]: what a right-aligned cache of that many
// slots holds when `tensor` is everything written to it.
HostTensor rightAligned(const HostTensor& tensor, int64_t slots) {
  std::vector<int64_t> shape = tensor.shape;
  const int64_t length = shape[1];
  shape[1] = slots;
  HostTensor out(tensor.dtype, shape);
  const size_t position = tensor.data.size() / (tensor.shape[0] * length);
  for (int64_t r = 0; r < tensor.shape[0]; ++r)
    for (int64_t s = 0; s < slots; ++s) {
      const int64_t source = length - slots + s;
      if (source < 0) continue;
      std::memcpy(out.data.data() + (r * slots + s) * position, tensor.data.data() + (r * length + source) * position, position);
    }
  return out;
}

class InferenceEntries : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    fixture_ = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/" + GetParam();
    SafetensorsFile batchFile = SafetensorsFile::open(fixture_ + "/batch.safetensors");
    inputIds_ = batchFile.read("input_ids");
    attentionMask_ = batchFile.read("attention_mask");
    canvasIds_ = batchFile.read("canvas_ids");
    noisyCanvasIds_ = batchFile.read("noisy_canvas_ids");
    selfConditioningLogits_ = batchFile.read("self_conditioning_logits");
    batch_ = inputIds_.shape[0];
    promptLength_ = inputIds_.shape[1];
    canvasLength_ = canvasIds_.shape[1];

    // Buckets P and P + L (the prompt and the prompt plus one committed block); room for two
    // canvases, so C = (P + L) + 2L - L and the full caches keep zeros on the left.
    const std::string plan = dir_ / "plan";
    testing::ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + fixture_ + " --mode infer --micro-batch " +
                                           std::to_string(batch_) + " --prompt-len " + std::to_string(promptLength_) + "," +
                                           std::to_string(promptLength_ + canvasLength_) + " --max-new-tokens " +
                                           std::to_string(2 * canvasLength_) + " -o " + plan);
    ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
    SessionOptions options;
    options.planDir = plan;
    options.weights = fixture_ + "/model.safetensors";
    options.threads = 2;
    session_ = openSession(options);
    ASSERT_TRUE(session_->plan.generation.has_value());
    cacheLength_ = session_->plan.generation->cacheLength;
    ASSERT_EQ(cacheLength_, promptLength_ + 2 * canvasLength_);
  }

  std::map<std::string, HostTensor> run(const std::string& entry, std::map<std::string, HostTensor> inputs) {
    return runEntry(*session_, entry, std::move(inputs), "test batch");
  }

  std::map<std::string, HostTensor> forward(const HostTensor& ids, const HostTensor& mask, const HostTensor& canvas,
                                            const HostTensor* selfConditioning) {
    std::map<std::string, HostTensor> inputs = {{"input_ids", ids}, {"attention_mask", mask}, {"noisy_canvas_ids", canvas}};
    if (selfConditioning) inputs["self_conditioning_logits"] = *selfConditioning;
    return run("forward", inputs);
  }

  // cache_valid after prefill: the attention mask right-aligned in C columns.
  HostTensor prefilledValidity() const { return rightAligned(attentionMask_, cacheLength_); }

  void prefill() {
    run("prefill", {{"input_ids", inputIds_},
                    {"attention_mask", attentionMask_},
                    {"positions", positions(batch_, 0, promptLength_)},
                    {"write_rows", filled(DType::F32, {batch_}, 1.0)}});
  }

  std::map<std::string, HostTensor> denoise(const HostTensor& canvas, const HostTensor& cacheValid, int64_t start,
                                            double selfConditioningMask, const HostTensor& frozen) {
    HostTensor keys(DType::I64, {batch_, 2});
    for (int64_t i = 0; i < keys.numElements(); ++i) keys.as<int64_t>()[i] = 1000 + i;
    return run("denoise", {{"canvas_ids", canvas},
                           {"cache_valid", cacheValid},
                           {"positions", positions(batch_, start, canvasLength_)},
                           {"self_conditioning_mask", filled(DType::F32, {batch_}, selfConditioningMask)},
                           {"frozen", frozen},
                           {"temperature", filled(DType::F32, {batch_}, 1.0)},
                           {"sample_keys", keys}});
  }

  void commit(const HostTensor& block, const HostTensor& writeRows) {
    run("commit", {{"block_ids", block},
                   {"cache_valid", prefilledValidity()},
                   {"positions", positions(batch_, promptLength_, canvasLength_)},
                   {"write_rows", writeRows}});
  }

  // Every cache parameter's bytes, by name.
  std::map<std::string, std::vector<uint8_t>> caches() const {
    std::map<std::string, std::vector<uint8_t>> bytes;
    for (const Parameter& parameter : session_->plan.parameters)
      if (parameter.name.rfind("cache/", 0) == 0)
        bytes[parameter.name] = session_->executor->parameter(parameter.name).data;
    return bytes;
  }

  HostTensor storedLogits() const { return session_->executor->parameter("generate/self_conditioning_logits"); }

  HostTensor noneFrozen() const { return filled(DType::F32, {batch_}, 0.0); }

  ScratchDirectory dir_;
  std::string fixture_;
  std::unique_ptr<Session> session_;
  HostTensor inputIds_, attentionMask_, canvasIds_, noisyCanvasIds_, selfConditioningLogits_;
  int64_t batch_ = 0, promptLength_ = 0, canvasLength_ = 0, cacheLength_ = 0;
};

// (a) without a signal (mask 0 gives exactly none) and with the fixture's logits fed as the stored state.
TEST_P(InferenceEntries, PrefillAndDenoiseReproduceForward) {
  prefill();
  std::map<std::string, HostTensor> step = denoise(noisyCanvasIds_, prefilledValidity(), promptLength_, 0.0, noneFrozen());
  HostTensor reference = forward(inputIds_, attentionMask_, noisyCanvasIds_, nullptr).at("logits");
  expectClose(storedLogits(), reference, "denoise vs forward, no self-conditioning");
  // The sampler's argmax is the logits' (lowest index among ties).
  HostTensor argmax = step.at("argmax_ids");
  const int64_t vocab = reference.shape[2];
  int64_t agree = 0;
  for (int64_t row = 0; row < batch_ * canvasLength_; ++row) {
    const float* logits = reference.as<float>() + row * vocab;
    agree += argmax.as<int64_t>()[row] == std::max_element(logits, logits + vocab) - logits;
  }
  EXPECT_EQ(agree, batch_ * canvasLength_);

  session_->executor->setParameter("generate/self_conditioning_logits", selfConditioningLogits_);
  denoise(noisyCanvasIds_, prefilledValidity(), promptLength_, 1.0, noneFrozen());
  HostTensor conditioned = forward(inputIds_, attentionMask_, noisyCanvasIds_, &selfConditioningLogits_).at("logits");
  expectClose(storedLogits(), conditioned, "denoise vs forward, with self-conditioning");
  EXPECT_GT(relativeError(conditioned, reference), 1e-2) << "the signal must matter for the check to mean something";
}

// (b) and (c): commit the clean canvas, then compare the caches and the next step with forward on
// the prompt + block as one prompt.
TEST_P(InferenceEntries, CommitAppendsTheBlocksCausalKeyValues) {
  prefill();
  const HostTensor& block = canvasIds_;
  commit(block, filled(DType::F32, {batch_}, 1.0));

  const HostTensor longerIds = concatRows(inputIds_, block);
  const HostTensor longerMask = concatRows(attentionMask_, filled(DType::I64, {batch_, canvasLength_}, 1));
  std::map<std::string, HostTensor> longer = forward(longerIds, longerMask, noisyCanvasIds_, nullptr);
  const nlohmann::json& config = session_->plan.modelConfig;
  const nlohmann::json& text = config.contains("text_config") ? config["text_config"] : config;
  const int64_t window = text.at("sliding_window").get<int64_t>();
  int64_t truncated = 0;
  for (int64_t layer = 0; longer.count("encoder_k." + std::to_string(layer)); ++layer) {
    for (const char* kind : {"k", "v"}) {
      const std::string suffix = std::string(kind) + "." + std::to_string(layer);
      HostTensor cache = session_->executor->parameter("cache/" + suffix);
      const int64_t slots = cache.shape[1];
      const bool sliding = text.at("layer_types")[layer] == "sliding_attention";
      EXPECT_EQ(slots, sliding ? std::min(cacheLength_, window - 1) : cacheLength_) << suffix;
      truncated += slots < promptLength_ + canvasLength_;
      expectClose(cache, rightAligned(longer.at("encoder_" + suffix), slots), "cache/" + suffix + " after commit");
    }
  }
  if (GetParam() == "seven_layers") {
    EXPECT_GT(truncated, 0) << "W = 4 truncates the sliding caches";
  }

  // The host's cache_valid after a commit: shifted left by L, L ones appended.
  const HostTensor validity = rightAligned(longerMask, cacheLength_);
  denoise(noisyCanvasIds_, validity, promptLength_ + canvasLength_, 0.0, noneFrozen());
  expectClose(storedLogits(), longer.at("logits"), "denoise after the commit vs forward on prompt + block");
}

// (d) a frozen row's stored logits stay exactly; the others take the step's.
TEST_P(InferenceEntries, FrozenRowsKeepTheirSelfConditioningLogits) {
  prefill();
  session_->executor->setParameter("generate/self_conditioning_logits", selfConditioningLogits_);
  HostTensor frozen = noneFrozen();
  for (int64_t b = 0; b < batch_; b += 2) frozen.as<float>()[b] = 1.0f;
  denoise(noisyCanvasIds_, prefilledValidity(), promptLength_, 1.0, frozen);
  HostTensor stored = storedLogits();
  HostTensor conditioned = forward(inputIds_, attentionMask_, noisyCanvasIds_, &selfConditioningLogits_).at("logits");
  const int64_t rowElements = stored.numElements() / batch_;
  for (int64_t b = 0; b < batch_; ++b) {
    const float* actual = stored.as<float>() + b * rowElements;
    if (b % 2 == 0) {
      EXPECT_EQ(std::memcmp(actual, selfConditioningLogits_.as<float>() + b * rowElements, rowElements * sizeof(float)), 0)
          << "frozen row " << b;
      continue;
    }
    double maxAbs = 0, maxRef = 0;
    for (int64_t i = 0; i < rowElements; ++i) {
      maxAbs = std::max(maxAbs, std::abs(double(actual[i]) - conditioned.as<float>()[b * rowElements + i]));
      maxRef = std::max(maxRef, std::abs(double(conditioned.as<float>()[b * rowElements + i])));
    }
    EXPECT_LE(maxAbs / maxRef, kTolerance) << "row " << b;
  }
}

// (e) denoise_first (a canvas's first step) gives the bytes of denoise with self-conditioning mask 0:
// the outputs and the stored state, whatever the state held before.
TEST_P(InferenceEntries, DenoiseFirstIsDenoiseWithoutSignalBitForBit) {
  prefill();
  HostTensor frozen = noneFrozen();
  frozen.as<float>()[0] = 1.0f;  // a frozen row keeps its state in both entries
  session_->executor->setParameter("generate/self_conditioning_logits", selfConditioningLogits_);
  std::map<std::string, HostTensor> reference = denoise(noisyCanvasIds_, prefilledValidity(), promptLength_, 0.0, frozen);
  const HostTensor referenceState = storedLogits();

  session_->executor->setParameter("generate/self_conditioning_logits", selfConditioningLogits_);
  HostTensor keys(DType::I64, {batch_, 2});
  for (int64_t i = 0; i < keys.numElements(); ++i) keys.as<int64_t>()[i] = 1000 + i;
  std::map<std::string, HostTensor> first = run("denoise_first", {{"canvas_ids", noisyCanvasIds_},
                                                                  {"cache_valid", prefilledValidity()},
                                                                  {"positions", positions(batch_, promptLength_, canvasLength_)},
                                                                  {"frozen", frozen},
                                                                  {"temperature", filled(DType::F32, {batch_}, 1.0)},
                                                                  {"sample_keys", keys}});
  for (const char* name : {"sampled_ids", "argmax_ids", "entropy"}) {
    const HostTensor& expected = reference.at(name);
    const HostTensor& actual = first.at(name);
    ASSERT_EQ(actual.shape, expected.shape) << name;
    EXPECT_EQ(actual.data, expected.data) << name;
  }
  const HostTensor state = storedLogits();
  EXPECT_EQ(state.data, referenceState.data) << "the stored self-conditioning logits";
}

// (f) write_rows: a commit that writes some rows leaves the others' caches byte for byte as they
// were, and gives the written rows the bytes an all-rows commit gives them (a row's cache does not
// depend on the other rows of the call).
TEST_P(InferenceEntries, WriteRowsLeaveTheOtherRowsCaches) {
  prefill();
  const std::map<std::string, std::vector<uint8_t>> prefilled = caches();
  commit(canvasIds_, filled(DType::F32, {batch_}, 1.0));
  const std::map<std::string, std::vector<uint8_t>> allCommitted = caches();

  prefill();
  HostTensor writeRows = filled(DType::F32, {batch_}, 0.0);
  for (int64_t b = 0; b < batch_; b += 2) writeRows.as<float>()[b] = 1.0f;
  commit(canvasIds_, writeRows);
  const std::map<std::string, std::vector<uint8_t>> someCommitted = caches();
  ASSERT_FALSE(someCommitted.empty());
  for (const auto& [name, bytes] : someCommitted) {
    const size_t rowBytes = bytes.size() / batch_;
    for (int64_t b = 0; b < batch_; ++b) {
      const std::vector<uint8_t>& expected = b % 2 == 0 ? allCommitted.at(name) : prefilled.at(name);
      EXPECT_EQ(std::memcmp(bytes.data() + b * rowBytes, expected.data() + b * rowBytes, rowBytes), 0)
          << name << " row " << b << (b % 2 == 0 ? " (written)" : " (kept)");
    }
    if (batch_ > 1) {
      EXPECT_NE(std::memcmp(prefilled.at(name).data() + rowBytes, allCommitted.at(name).data() + rowBytes, rowBytes), 0)
          << name << ": the commit must change a row for the check to mean something";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, InferenceEntries, ::testing::Values("seven_layers", "hf_tester", "all_experts"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace dgemma
