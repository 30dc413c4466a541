// Block-diffusion generation through a compiled inference plan against HF transformers' `generate`,
// replaying transformers' own random draws (test/fixtures/generation, produced by
// tools/reference/make_generation_fixtures.py; what is compared and why: docs/generation-parity.md).
//
// The generator runs with a RecordedDraws source fed from the trace, so both sides see the same
// initial canvases, categorical samples and renoise ids, and every difference is the model's or the
// sampler's. Per denoising pass: z (the self-conditioning logits the pass leaves) and the entropies
// within 1e-5 on a canvas's first two passes (2e-4 later, where self-conditioning has compounded the
// differences), the acceptance mask, the new canvas, the stop flags and the temperature identical,
// the argmax identical except at the trace's near-tie positions. Per canvas: the committed block
// identical, the cache K/V after each commit pass within 1e-5. At the end: the new tokens identical,
// the decoder passes and tokens per forward as transformers counts them.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "runtime/generate/Generator.h"
#include "runtime/generate/RecordedDraws.h"
#include "runtime/io/Safetensors.h"
#include "runtime/session/Session.h"

namespace dgemma {
namespace {

using testing::runTool;
using testing::ScratchDirectory;

constexpr double kTolerance = 1e-5;  // max|Δ| / max|ref|, the bound of every fp32 parity test
// Later passes of a canvas read the previous pass's z as self-conditioning, so the two sides'
// differences compound along the canvas (measured up to 3.5e-5 in z and 7.4e-5 in the entropy at a
// canvas's 8th pass; docs/generation-parity.md). The decisions they feed are still compared exactly.
constexpr double kChainedTolerance = 2e-4;

struct Error {
  double maxAbs = 0;
  double maxRef = 0;
  void add(double actual, double expected) {
    maxAbs = std::max(maxAbs, std::abs(actual - expected));
    maxRef = std::max(maxRef, std::abs(expected));
  }
  double relative() const { return maxRef > 0 ? maxAbs / maxRef : maxAbs; }
};

std::string sourcePath(const std::string& relative) { return std::string(DGEMMA_SOURCE_DIR) + "/" + relative; }

// The recorded HF run: trace.safetensors and meta.json of one fixture (tools/reference/README.md,
// "Generation traces").
struct Trace {
  explicit Trace(const std::string& name)
      : dir(sourcePath("test/fixtures/generation/" + name)), file(SafetensorsFile::open(dir + "/trace.safetensors")) {
    std::ifstream in(dir + "/meta.json");
    meta = nlohmann::json::parse(in);
    batch = meta["batch_size"];
    promptWidth = meta["prompt_width"];
    canvasLength = meta["canvas_length"];
    vocab = meta["vocab_size"];
    layers = meta["layer_types"].size();
    for (const char* tensor : {"input_ids", "attention_mask", "initial_canvas", "step_canvas", "temperature",
                               "sampled", "renoise", "entropy", "accepted", "argmax", "canvas_out",
                               "finished_denoising", "argmax_near_tie", "accept_marginal", "committed", "finished",
                               "sequences", "tokens_per_forward", "decoder_forward_passes"})
      tensors[tensor] = file.read(tensor);
    steps = tensors["step_canvas"].shape[0];
    canvases = tensors["committed"].shape[0];
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t canvas = i64("step_canvas")[s];
      if (int64_t(firstStep.size()) <= canvas) firstStep.push_back(s);
      if (int64_t(stepsInCanvas.size()) <= canvas) stepsInCanvas.push_back(0);
      ++stepsInCanvas[canvas];
    }
  }

  const int64_t* i64(const std::string& name) const { return tensors.at(name).as<int64_t>(); }
  const float* f32(const std::string& name) const { return tensors.at(name).as<float>(); }
  const uint8_t* u8(const std::string& name) const { return tensors.at(name).as<uint8_t>(); }
  int64_t rowOffset(int64_t step, int64_t row) const { return (step * batch + row) * canvasLength; }

  // Row `row` finished its sequence in a canvas before `canvas`: transformers still computes it, but
  // its blocks are all pad and none of its passes count.
  bool finishedBefore(int64_t canvas, int64_t row) const { return canvas > 0 && u8("finished")[(canvas - 1) * batch + row]; }
  // The row stopped denoising before step `step` (so the step left it frozen).
  bool frozenBefore(int64_t step, int64_t row) const {
    return step != firstStep[i64("step_canvas")[step]] && u8("finished_denoising")[(step - 1) * batch + row];
  }

  std::string dir;
  SafetensorsFile file;
  nlohmann::json meta;
  std::map<std::string, HostTensor> tensors;
  int64_t batch = 0, promptWidth = 0, canvasLength = 0, vocab = 0, layers = 0, steps = 0, canvases = 0;
  std::vector<int64_t> firstStep, stepsInCanvas;  // per canvas
};

// Every draw of the trace, keyed as the generator asks for them (request = batch row).
void fillDraws(const Trace& trace, RecordedDraws& draws) {
  const int64_t L = trace.canvasLength;
  auto row = [&](const int64_t* base, int64_t offset) { return std::vector<int64_t>(base + offset, base + offset + L); };
  for (int64_t c = 0; c < trace.canvases; ++c)
    for (int64_t b = 0; b < trace.batch; ++b) draws.setInitialCanvas(b, c, row(trace.i64("initial_canvas"), (c * trace.batch + b) * L));
  for (int64_t s = 0; s < trace.steps; ++s) {
    const int64_t canvas = trace.i64("step_canvas")[s];
    for (int64_t b = 0; b < trace.batch; ++b) {
      const DrawSite site{b, canvas, s - trace.firstStep[canvas]};
      draws.setSampled(site, row(trace.i64("sampled"), trace.rowOffset(s, b)));
      draws.setRenoiseIds(site, row(trace.i64("renoise"), trace.rowOffset(s, b)));
    }
  }
}

// Compares every pass and commit the generator reports with the trace, as it runs.
class TraceComparison : public GenerationObserver {
 public:
  TraceComparison(const Trace& trace, Session& session) : trace_(trace), session_(session) {
    for (const auto& step : trace.meta["z_steps"]) zSteps_.insert(step.get<int64_t>());
  }

  void onDenoisePass(const DenoisePassReport& report) override {
    const int64_t L = trace_.canvasLength, c = report.canvas;
    ASSERT_LT(c, trace_.canvases) << "more canvases than transformers ran";
    ASSERT_LT(report.step, trace_.stepsInCanvas[c]) << "canvas " << c << ": more passes than transformers ran";
    ASSERT_EQ(report.canvasLength, L);
    const int64_t s = trace_.firstStep[c] + report.step;
    EXPECT_EQ(report.remaining, trace_.meta["settings"]["max_denoising_steps"].get<int64_t>() - report.step);
    EXPECT_EQ(report.temperature, trace_.f32("temperature")[s]) << "step " << s;  // the same f32 expression
    if (report.step == 0 && c > 0) compareCache(c);
    for (size_t i = 0; i < report.requests.size(); ++i) {
      const int64_t b = report.requests[i];
      if (trace_.finishedBefore(c, b) || trace_.frozenBefore(s, b)) continue;  // transformers' values are not the row's
      reported_.insert({s, b});
      EXPECT_EQ(report.frozen[i], 0) << "step " << s << " row " << b << ": frozen, transformers was not";
      EXPECT_EQ(report.done[i], trace_.u8("finished_denoising")[s * trace_.batch + b]) << "step " << s << " row " << b;
      for (int64_t l = 0; l < L; ++l) {
        const int64_t at = trace_.rowOffset(s, b) + l, here = int64_t(i) * L + l;
        (chained(report.step) ? chainedEntropy_ : entropy_).add(report.entropy[here], trace_.f32("entropy")[at]);
        EXPECT_EQ(report.sampled[here], trace_.i64("sampled")[at]) << "replayed sample, step " << s;
        if (!trace_.u8("accept_marginal")[at]) {
          acceptDiffer_ += report.accepted[here] != trace_.u8("accepted")[at];
          canvasDiffer_ += report.newCanvas[here] != trace_.i64("canvas_out")[at];
        }
        if (trace_.u8("argmax_near_tie")[at])
          ++nearTiesSkipped_;
        else
          argmaxDiffer_ += report.argmax[here] != trace_.i64("argmax")[at];
      }
    }
    if (zSteps_.count(s)) compareZ(s, report);
  }

  void onCanvasCommitted(const CanvasCommitReport& report) override {
    const int64_t L = trace_.canvasLength, c = report.canvas;
    ASSERT_LT(c, trace_.canvases);
    committedCanvases_.insert(c);
    for (size_t i = 0; i < report.requests.size(); ++i) {
      const int64_t b = report.requests[i];
      for (int64_t l = 0; l < L; ++l)
        committedDiffer_ += report.tokens[i * L + l] != trace_.i64("committed")[(c * trace_.batch + b) * L + l];
      EXPECT_EQ(report.finished[i], trace_.u8("finished")[c * trace_.batch + b]) << "canvas " << c << " row " << b;
    }
  }

  // Every pass transformers made on a live row was reported.
  void expectEveryPassReported() const {
    for (int64_t s = 0; s < trace_.steps; ++s)
      for (int64_t b = 0; b < trace_.batch; ++b)
        if (!trace_.finishedBefore(trace_.i64("step_canvas")[s], b) && !trace_.frozenBefore(s, b)) {
          EXPECT_TRUE(reported_.count({s, b})) << "step " << s << " row " << b << " was not run";
        }
    for (int64_t c = 0; c < trace_.canvases; ++c) EXPECT_TRUE(committedCanvases_.count(c)) << "canvas " << c;
  }

  // Passes 0 and 1 of a canvas, and the later passes, whose self-conditioning input carries the
  // differences of every earlier pass of the canvas (docs/generation-parity.md).
  static bool chained(int64_t step) { return step >= 2; }
  Error entropy_, chainedEntropy_, z_, chainedZ_, cache_;
  int64_t acceptDiffer_ = 0, canvasDiffer_ = 0, argmaxDiffer_ = 0, committedDiffer_ = 0, nearTiesSkipped_ = 0;
  int64_t zCompared_ = 0, cachesCompared_ = 0;

 private:
  // The denoise entry left z of this pass in generate/self_conditioning_logits [B, L, V]; no row is
  // frozen at a z step, so every live row holds the pass's own z.
  void compareZ(int64_t s, const DenoisePassReport& report) {
    HostTensor z = convertDType(session_.executor->parameter("generate/self_conditioning_logits"), DType::F32, "z");
    const HostTensor reference = trace_.file.read("z." + std::to_string(s));
    const int64_t rowSize = trace_.canvasLength * trace_.vocab;
    ASSERT_EQ(z.shape[1] * z.shape[2], rowSize);
    for (size_t i = 0; i < report.requests.size(); ++i) {
      const int64_t b = report.requests[i];
      if (trace_.finishedBefore(report.canvas, b)) continue;
      for (int64_t k = 0; k < rowSize; ++k)
        (chained(report.step) ? chainedZ_ : z_).add(z.as<float>()[int64_t(i) * rowSize + k], reference.as<float>()[b * rowSize + k]);
    }
    ++zCompared_;
  }

  // After commit pass `canvas` (it encoded block canvas - 1): transformers' newest n slots of each
  // layer [B, Hkv, n, D] against the right-aligned cache/k.<l>, cache/v.<l> [B, C_l, Hkv, D]. Every
  // one of these slots holds a committed token, so all are valid. Rows finished before that block
  // are left out (their blocks are pad and never read).
  void compareCache(int64_t canvas) {
    for (int64_t layer = 0; layer < trace_.layers; ++layer)
      for (const char* kind : {"k", "v"}) {
        const HostTensor reference = trace_.file.read("cache_" + std::string(kind) + "." + std::to_string(canvas) + "." + std::to_string(layer));
        const HostTensor cache = convertDType(session_.executor->parameter("cache/" + std::string(kind) + "." + std::to_string(layer)), DType::F32, "cache");
        const int64_t heads = reference.shape[1], n = reference.shape[2], dim = reference.shape[3], slots = cache.shape[1];
        ASSERT_EQ(cache.shape, (std::vector<int64_t>{trace_.batch, slots, heads, dim})) << "cache/" << kind << "." << layer;
        ASSERT_GE(slots, n) << "cache/" << kind << "." << layer;
        for (int64_t b = 0; b < trace_.batch; ++b) {
          if (trace_.finishedBefore(canvas - 1, b)) continue;
          for (int64_t j = 0; j < n; ++j)
            for (int64_t h = 0; h < heads; ++h)
              for (int64_t d = 0; d < dim; ++d)
                cache_.add(cache.as<float>()[((b * slots + slots - n + j) * heads + h) * dim + d],
                           reference.as<float>()[((b * heads + h) * n + j) * dim + d]);
        }
      }
    ++cachesCompared_;
  }

  const Trace& trace_;
  Session& session_;
  std::set<int64_t> zSteps_;
  std::set<std::pair<int64_t, int64_t>> reported_;
  std::set<int64_t> committedCanvases_;
};

class GenerationParity : public ::testing::TestWithParam<std::string> {
 protected:
  ScratchDirectory dir;
};

TEST_P(GenerationParity, ReplaysTransformersGenerate) {
  const Trace trace(GetParam());
  const std::string modelDir = sourcePath(trace.meta["model"].get<std::string>());
  const int64_t B = trace.batch, P = trace.promptWidth, L = trace.canvasLength;

  // The fixture's committed blocks hold no near-tie, so they and the final text compare exactly.
  for (int64_t c = 0; c < trace.canvases; ++c) {
    const int64_t last = trace.firstStep[c] + trace.stepsInCanvas[c] - 1;
    for (int64_t k = 0; k < B * L; ++k) ASSERT_EQ(trace.u8("argmax_near_tie")[last * B * L + k], 0) << "canvas " << c;
  }

  // The model with the trace's generation settings: its config.json next to the trace's generation_config.json.
  const std::string model = dir / "model";
  std::filesystem::create_directories(model);
  std::filesystem::copy_file(modelDir + "/config.json", model + "/config.json");
  std::filesystem::copy_file(trace.dir + "/generation_config.json", model + "/generation_config.json");
  const std::string plan = dir / "plan";
  testing::ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + model + " --mode infer --micro-batch " +
                                         std::to_string(B) + " --prompt-len " + std::to_string(P) + " -o " + plan);
  ASSERT_EQ(compiled.exitCode, 0) << compiled.output;

  SessionOptions options;
  options.planDir = plan;
  options.weights = modelDir + "/model.safetensors";  // the directory also holds the forward fixtures
  std::unique_ptr<Session> session = openSession(options);
  Generator generator(*session, GeneratorOptions{});

  // The plan carries the settings transformers ran with.
  const nlohmann::json& settings = trace.meta["settings"];
  const GenerationSettings& planSettings = generator.settings();
  EXPECT_EQ(planSettings.canvasLength, L);
  EXPECT_EQ(planSettings.maxNewTokens, settings["max_new_tokens"].get<int64_t>());
  EXPECT_EQ(planSettings.maxDenoisingSteps, settings["max_denoising_steps"].get<int64_t>());
  EXPECT_EQ(planSettings.entropyBound, settings["entropy_bound"].get<double>());
  EXPECT_EQ(planSettings.tMin, settings["t_min"].get<double>());
  EXPECT_EQ(planSettings.tMax, settings["t_max"].get<double>());
  EXPECT_EQ(planSettings.stabilityThreshold, settings["stability_threshold"].get<int64_t>());
  EXPECT_EQ(planSettings.confidenceThreshold, settings["confidence_threshold"].get<double>());
  EXPECT_EQ(planSettings.eosTokenIds, settings["eos_token_id"].get<std::vector<int64_t>>());
  EXPECT_EQ(planSettings.padTokenId, settings["pad_token_id"].get<int64_t>());
  ASSERT_EQ(generator.canvases(), trace.canvases);

  // The prompts without their left padding: the generator pads them again to the batch's width.
  std::vector<GenerationRequest> requests(B);
  for (int64_t b = 0; b < B; ++b) {
    requests[b].id = b;
    for (int64_t p = 0; p < P; ++p)
      if (trace.i64("attention_mask")[b * P + p]) requests[b].promptIds.push_back(trace.i64("input_ids")[b * P + p]);
  }
  RecordedDraws draws;
  fillDraws(trace, draws);
  TraceComparison comparison(trace, *session);
  const std::vector<GenerationResult> results = generator.generate(requests, draws, &comparison);
  if (HasFatalFailure()) return;

  comparison.expectEveryPassReported();
  EXPECT_LE(comparison.entropy_.relative(), kTolerance) << "entropy, passes 0 and 1";
  EXPECT_LE(comparison.z_.relative(), kTolerance) << "z, passes 0 and 1";
  EXPECT_LE(comparison.chainedEntropy_.relative(), kChainedTolerance) << "entropy, later passes";
  EXPECT_LE(comparison.chainedZ_.relative(), kChainedTolerance) << "z, later passes";
  EXPECT_LE(comparison.cache_.relative(), kTolerance) << "cache K/V after a commit";
  EXPECT_EQ(comparison.zCompared_, int64_t(trace.meta["z_steps"].size()));
  EXPECT_EQ(comparison.cachesCompared_, trace.canvases - 1);  // the last canvas is never encoded
  EXPECT_EQ(comparison.acceptDiffer_, 0) << "acceptance decisions";
  EXPECT_EQ(comparison.canvasDiffer_, 0) << "re-randomised canvas positions";
  EXPECT_EQ(comparison.argmaxDiffer_, 0) << "argmax ids (near-ties excepted)";
  EXPECT_EQ(comparison.committedDiffer_, 0) << "committed ids";

  // The text: transformers' sequences after the prompt, up to the canvas that finished the row (the
  // rest is pad in transformers' output).
  ASSERT_EQ(results.size(), size_t(B));
  const int64_t width = trace.tensors.at("sequences").shape[1];
  for (int64_t b = 0; b < B; ++b) {
    const GenerationResult& result = results[b];
    EXPECT_EQ(result.id, b);
    std::vector<int64_t> expected(trace.i64("sequences") + b * width + P, trace.i64("sequences") + (b + 1) * width);
    ASSERT_LE(result.newTokens.size(), expected.size()) << "row " << b;
    ASSERT_EQ(result.newTokens.size() % L, 0u) << "row " << b;
    for (size_t k = result.newTokens.size(); k < expected.size(); ++k) EXPECT_EQ(expected[k], 0) << "row " << b << " beyond its last canvas";
    expected.resize(result.newTokens.size());
    EXPECT_EQ(result.newTokens, expected) << "row " << b;
    const bool finished = trace.u8("finished")[(trace.canvases - 1) * B + b];
    EXPECT_EQ(result.finishReason, finished ? FinishReason::Eos : FinishReason::Length) << "row " << b;
    EXPECT_EQ(result.decoderPasses, trace.i64("decoder_forward_passes")[b]) << "row " << b;
    // transformers divides in f32 (a long count by an int count).
    EXPECT_EQ(float(result.tokensPerForward), trace.f32("tokens_per_forward")[b]) << "row " << b;
  }
  std::cout << "[ parity ] " << GetParam() << ": z " << comparison.z_.relative() << " (later passes " << comparison.chainedZ_.relative()
            << "), entropy " << comparison.entropy_.relative() << " (later passes " << comparison.chainedEntropy_.relative() << ")"
            << ", cache K/V " << comparison.cache_.relative() << ", near-ties skipped " << comparison.nearTiesSkipped_ << "\n";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerationParity, ::testing::Values("seven_layers", "hf_tester"));

}  // namespace
}  // namespace dgemma
