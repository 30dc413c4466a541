// Block-diffusion generation end to end on the seven_layers fixture (docs/generation.md): an
// inference plan compiled by dgemma-compile, driven by the Generator in this process and by
// `dgemma-run generate` / `eval`. Checked: the same seed gives the same tokens, whatever the batch a
// request runs in; every pass follows the sampler's rules (seen through the observer); replaying
// the recorded draws reproduces a run; the commands' outputs are well-formed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "runtime/generate/DrawSource.h"
#include "runtime/generate/EntropyBoundAcceptance.h"
#include "runtime/generate/Generator.h"
#include "runtime/generate/RecordedDraws.h"
#include "runtime/generate/Temperature.h"
#include "runtime/session/Session.h"
#include "support/Error.h"

namespace dgemma {
namespace {

using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

constexpr int64_t kMaxNewTokens = 48;  // three canvases of 16
constexpr int64_t kSteps = 12;

std::string fixture() { return std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/seven_layers"; }

// Two plans of the fixture's weights: "defaults" (its generation_config.json: every row runs all
// its passes, as the random model is never confident) and "eager" (a generation config under which
// every canvas is confident and EOS is likely, so rows stop at different passes, freeze while the
// others go on, and finish in different canvases).
class GenerationTest : public ::testing::TestWithParam<std::string> {
 protected:
  // The plans for the suite (no test is running yet, so no per-test ScratchDirectory).
  static void SetUpTestSuite() {
    suiteDir_ = std::filesystem::temp_directory_path() / ("dgemma-it-" + std::to_string(::getpid()) + "-generation");
    std::filesystem::remove_all(suiteDir_);
    std::filesystem::create_directories(suiteDir_ / "eager");
    std::filesystem::copy_file(fixture() + "/config.json", suiteDir_ / "eager/config.json");
    std::ofstream(suiteDir_ / "eager/generation_config.json")
        << R"({"confidence_threshold": 1.0, "stability_threshold": 0, "eos_token_id": [1, 20, 30, 40, 50, 60, 70, 80]})";
    for (const auto& [name, model] : {std::pair<std::string, std::string>{"defaults", fixture()},
                                      std::pair<std::string, std::string>{"eager", (suiteDir_ / "eager").string()}}) {
      const ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + model +
                                          " --mode infer --micro-batch 2 --prompt-len 8,16,64 --max-new-tokens " +
                                          std::to_string(kMaxNewTokens) + " -o " + (suiteDir_ / name).string() + "-plan");
      ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
    }
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(suiteDir_); }

  static std::string planDir(const std::string& name) { return (suiteDir_ / name).string() + "-plan"; }

  void SetUp() override {
    planDir_ = planDir(GetParam());
    SessionOptions options;
    options.planDir = planDir_;
    options.weights = fixture() + "/model.safetensors";
    session_ = openSession(options);
  }

  std::vector<GenerationResult> generate(const std::vector<GenerationRequest>& requests, DrawSource& draws,
                                         GenerationObserver* observer = nullptr, int64_t steps = kSteps) {
    Generator generator(*session_, GeneratorOptions{kMaxNewTokens, steps});
    return generator.generate(requests, draws, observer);
  }

  // Prompts of 11, 5 and 3 ids (in the ordinary-token range of the fixture's 128), <bos> first.
  static std::vector<GenerationRequest> requests() {
    std::vector<GenerationRequest> all;
    uint32_t state = 12345;
    for (int64_t length : {11, 5, 3}) {
      GenerationRequest request{static_cast<int64_t>(all.size()), {2}};
      while (static_cast<int64_t>(request.promptIds.size()) < length) {
        state = state * 1664525u + 1013904223u;
        request.promptIds.push_back(13 + (state >> 8) % 115);
      }
      all.push_back(request);
    }
    return all;
  }

  static std::filesystem::path suiteDir_;
  std::string planDir_;
  std::unique_ptr<Session> session_;
};

std::filesystem::path GenerationTest::suiteDir_;
INSTANTIATE_TEST_SUITE_P(Plans, GenerationTest, ::testing::Values("defaults", "eager"));

TEST_P(GenerationTest, TheSameSeedGivesTheSameTokensInAnyBatch) {
  CounterDrawSource draws(7, 128);
  const std::vector<GenerationResult> batched = generate(requests(), draws);  // micro-batches {0, 1} and {2, padding}
  ASSERT_EQ(batched.size(), 3u);
  EXPECT_EQ(generate(requests(), draws)[1].newTokens, batched[1].newTokens);
  for (const GenerationRequest& request : requests()) {
    const std::vector<GenerationResult> alone = generate({request}, draws);
    EXPECT_EQ(alone[0].id, request.id);
    EXPECT_EQ(alone[0].newTokens, batched[request.id].newTokens) << "request " << request.id;
    EXPECT_EQ(alone[0].stepsPerCanvas, batched[request.id].stepsPerCanvas) << "request " << request.id;
  }
  // Request 2 with request 0 in a batch of its own order.
  std::vector<GenerationRequest> swapped = {requests()[2], requests()[0]};
  const std::vector<GenerationResult> other = generate(swapped, draws);
  EXPECT_EQ(other[0].newTokens, batched[2].newTokens);
  EXPECT_EQ(other[1].newTokens, batched[0].newTokens);
  CounterDrawSource otherSeed(8, 128);
  const std::vector<GenerationResult> reseeded = generate(requests(), otherSeed);
  bool anyDiffers = false;
  for (size_t i = 0; i < reseeded.size(); ++i) anyDiffers |= reseeded[i].newTokens != batched[i].newTokens;
  EXPECT_TRUE(anyDiffers);
}

TEST_P(GenerationTest, ResultsFollowTheEosAndLengthRules) {
  CounterDrawSource draws(3, 128);
  const GenerationSettings& settings = *session_->plan.generation;
  const int64_t L = settings.canvasLength;
  int64_t finishedByEos = 0;
  for (const GenerationResult& result : generate(requests(), draws)) {
    finishedByEos += result.finishReason == FinishReason::Eos ? 1 : 0;
    ASSERT_FALSE(result.stepsPerCanvas.empty());
    EXPECT_EQ(static_cast<int64_t>(result.newTokens.size()), static_cast<int64_t>(result.stepsPerCanvas.size()) * L);
    int64_t passes = 0;
    for (int64_t steps : result.stepsPerCanvas) {
      // The history starts at -1: stability_threshold passes are never stable.
      EXPECT_GE(steps, std::min<int64_t>(settings.stabilityThreshold + 1, kSteps));
      EXPECT_LE(steps, kSteps);
      passes += steps;
    }
    EXPECT_EQ(result.decoderPasses, passes);
    auto isEos = [&](int64_t id) { return std::count(settings.eosTokenIds.begin(), settings.eosTokenIds.end(), id) > 0; };
    auto firstEos = std::find_if(result.newTokens.begin(), result.newTokens.end(), isEos);
    if (result.finishReason == FinishReason::Eos) {
      ASSERT_NE(firstEos, result.newTokens.end());
      EXPECT_GE(firstEos - result.newTokens.begin(), static_cast<int64_t>(result.newTokens.size()) - L);  // in the last canvas
      EXPECT_TRUE(std::all_of(firstEos + 1, result.newTokens.end(), [&](int64_t id) { return id == settings.padTokenId; }));
    } else {
      EXPECT_EQ(firstEos, result.newTokens.end());
      EXPECT_EQ(static_cast<int64_t>(result.newTokens.size()), kMaxNewTokens);
    }
    const auto nonPad = std::count_if(result.newTokens.begin(), result.newTokens.end(), [&](int64_t id) { return id != settings.padTokenId; });
    EXPECT_DOUBLE_EQ(result.tokensPerForward, static_cast<double>(nonPad) / result.decoderPasses);
  }
  if (GetParam() == "eager") {
    EXPECT_GT(finishedByEos, 0);
  }
}

// Checks every pass against the sampler's rules, and records its draws for a replay.
class CheckingObserver : public GenerationObserver {
 public:
  explicit CheckingObserver(int64_t maxSteps) : maxSteps_(maxSteps) {}

  void onDenoisePass(const DenoisePassReport& report) override {
    ++passes;
    EXPECT_EQ(report.remaining, maxSteps_ - report.step);
    EXPECT_EQ(report.temperature, scheduledTemperature(0.4, 0.8, report.remaining, maxSteps_));
    const int64_t L = report.canvasLength;
    for (size_t row = 0; row < report.requests.size(); ++row) {
      const int64_t request = report.requests[row];
      std::vector<int64_t> canvas(report.newCanvas.begin() + row * L, report.newCanvas.begin() + (row + 1) * L);
      const auto key = std::make_tuple(request, report.canvas);
      if (report.frozen[row]) {
        auto last = lastCanvas_.find(key);
        if (last == lastCanvas_.end()) {
          // Finished by an earlier canvas: frozen from the start, on a pad canvas.
          EXPECT_EQ(canvas, std::vector<int64_t>(L, 0));
        } else {
          ++frozenRowPasses;
          EXPECT_EQ(canvas, last->second) << "a frozen row keeps its canvas";
        }
        continue;
      }
      const std::vector<uint8_t> accepted = entropyBoundAccept(report.entropy.subspan(row * L, L), 0.1);
      EXPECT_EQ(std::vector<uint8_t>(report.accepted.begin() + row * L, report.accepted.begin() + (row + 1) * L), accepted);
      std::vector<int64_t> sampled(report.sampled.begin() + row * L, report.sampled.begin() + (row + 1) * L);
      for (int64_t l = 0; l < L; ++l)
        if (accepted[l]) {
          EXPECT_EQ(canvas[l], sampled[l]);
        }
      recordedSamples[{request, report.canvas, report.step}] = sampled;
      lastCanvas_[key] = canvas;
    }
  }

  int64_t passes = 0;
  int64_t frozenRowPasses = 0;  // passes a row sat out after stopping, while another row of its batch went on
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<int64_t>> recordedSamples;

 private:
  int64_t maxSteps_;
  std::map<std::tuple<int64_t, int64_t>, std::vector<int64_t>> lastCanvas_;
};

// The counter draws, with every uniform draw recorded.
class RecordingDraws : public CounterDrawSource {
 public:
  using CounterDrawSource::CounterDrawSource;
  void initialCanvas(int64_t request, int64_t canvas, std::span<int64_t> ids) override {
    CounterDrawSource::initialCanvas(request, canvas, ids);
    recorded.setInitialCanvas(request, canvas, {ids.begin(), ids.end()});
  }
  void renoiseIds(const DrawSite& site, std::span<int64_t> ids) override {
    CounterDrawSource::renoiseIds(site, ids);
    recorded.setRenoiseIds(site, {ids.begin(), ids.end()});
  }
  RecordedDraws recorded;
};

TEST_P(GenerationTest, EveryPassFollowsTheSamplerAndARecordedRunReplays) {
  RecordingDraws draws(5, 128);
  CheckingObserver observer(kSteps);
  const std::vector<GenerationResult> original = generate(requests(), draws, &observer);
  EXPECT_GT(observer.passes, 0);
  if (GetParam() == "eager") {
    EXPECT_GT(observer.frozenRowPasses, 0);
  }
  for (const auto& [site, sampled] : observer.recordedSamples)
    draws.recorded.setSampled({std::get<0>(site), std::get<1>(site), std::get<2>(site)}, sampled);
  // The replay's device draws are made under another key and replaced by the recorded ones.
  const std::vector<GenerationResult> replayed = generate(requests(), draws.recorded);
  for (size_t i = 0; i < original.size(); ++i) {
    EXPECT_EQ(replayed[i].newTokens, original[i].newTokens) << "request " << i;
    EXPECT_EQ(replayed[i].stepsPerCanvas, original[i].stepsPerCanvas) << "request " << i;
  }
}

TEST_P(GenerationTest, OptionsBeyondThePlanAreRefused) {
  EXPECT_THROW(Generator(*session_, (GeneratorOptions{kMaxNewTokens + 1, 0})), InputError);
  Generator generator(*session_, GeneratorOptions{});
  EXPECT_EQ(generator.settings().maxNewTokens, kMaxNewTokens);
  EXPECT_EQ(generator.settings().maxDenoisingSteps, 48);  // neither generation config sets it
  EXPECT_EQ(generator.maxPromptLength(), 64);
  CounterDrawSource draws(1, 128);
  GenerationRequest tooLong{0, std::vector<int64_t>(65, 20)};
  EXPECT_THROW(generator.generate(std::vector<GenerationRequest>{tooLong}, draws), InputError);
  GenerationRequest outOfRange{0, {2, 128}};
  EXPECT_THROW(generator.generate(std::vector<GenerationRequest>{outOfRange}, draws), InputError);
}

// The commands, on the "defaults" plan: stdout alone (stderr to a file) so that its lines can be
// parsed.
class GenerationCommandTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    suiteDir_ = std::filesystem::temp_directory_path() / ("dgemma-it-" + std::to_string(::getpid()) + "-generation-commands");
    std::filesystem::remove_all(suiteDir_);
    std::filesystem::create_directories(suiteDir_);
    planDir_ = (suiteDir_ / "plan").string();
    const ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + fixture() +
                                        " --mode infer --micro-batch 2 --prompt-len 8,16,64 --max-new-tokens " +
                                        std::to_string(kMaxNewTokens) + " -o " + planDir_);
    ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(suiteDir_); }

  ToolResult run(const std::string& arguments, std::string& errors) {
    const std::string errorFile = dir / "stderr.txt";
    ToolResult result = runTool("( " + std::string(DGEMMA_RUN) + " " + arguments + " --plan " + planDir_ + " --weights " +
                                fixture() + "/model.safetensors --tokenizer " + DGEMMA_SOURCE_DIR + "/test/fixtures/generate/char_tokenizer 2> " +
                                errorFile + " )");
    std::ifstream in(errorFile);
    errors.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    return result;
  }
  static std::filesystem::path suiteDir_;
  static std::string planDir_;
  ScratchDirectory dir;
};

std::filesystem::path GenerationCommandTest::suiteDir_;
std::string GenerationCommandTest::planDir_;

std::vector<nlohmann::json> jsonLines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

TEST_F(GenerationCommandTest, GenerateWritesOneObjectPerRequestAndASummary) {
  std::string errors;
  const ToolResult result = run("generate --prompt 'What is 2 + 3?' --json --seed 4 --steps 6", errors);
  ASSERT_EQ(result.exitCode, 0) << result.output << errors;
  const std::vector<nlohmann::json> lines = jsonLines(result.output);
  ASSERT_EQ(lines.size(), 1u) << result.output;
  for (const char* key : {"id", "text", "tokens", "steps_per_canvas", "tokens_per_step", "finish_reason"})
    EXPECT_TRUE(lines[0].contains(key)) << key;
  EXPECT_EQ(lines[0]["tokens"].size() % 16, 0u);
  EXPECT_NE(errors.find("generated 1 requests: "), std::string::npos) << errors;
  EXPECT_NE(errors.find(" tokens/s, "), std::string::npos) << errors;
  EXPECT_NE(errors.find(" denoising steps per canvas, "), std::string::npos) << errors;
  std::string again;
  EXPECT_EQ(run("generate --prompt 'What is 2 + 3?' --json --seed 4 --steps 6", again).output, result.output);
  const ToolResult tooMany = run("generate --prompt hi --max-new-tokens 49", errors);
  EXPECT_EQ(tooMany.exitCode, 2);
  EXPECT_NE(errors.find("--max-new-tokens: 49 is above the plan's max_new_tokens 48"), std::string::npos) << errors;
}

TEST_F(GenerationCommandTest, EvalScoresRunnableRowsAndCountsTheSkippedOnes) {
  const std::string test = dir / "test.jsonl";
  std::ofstream(dir / "x.png") << "not decoded: the row is skipped before";
  std::ofstream(test) << R"({"messages": [{"role": "user", "content": "What is 2 + 3?"}], "completion": "5"})" "\n"
                      << R"({"messages": [{"role": "user", "content": [{"type": "image", "image": "x.png"}, {"type": "text", "text": "What?"}]}], "completion": "A cat."})" "\n"
                      << R"({"messages": [{"role": "user", "content": ")" << std::string(80, 'a') << R"("}], "completion": "a"})" "\n"
                      << R"({"messages": [{"role": "user", "content": "What is 1 + 1?"}], "completion": "2"})" "\n";
  std::string errors;
  const ToolResult result = run("eval --test " + test + " --out " + (dir / "rows.jsonl") + " --steps 6", errors);
  ASSERT_EQ(result.exitCode, 0) << result.output << errors;
  const std::vector<nlohmann::json> lines = jsonLines(result.output);
  ASSERT_FALSE(lines.empty());
  const nlohmann::json& summary = lines.back();
  for (const char* key : {"exact_match", "token_accuracy", "rows", "skipped", "tokens_per_second", "steps_per_canvas", "tokens_per_step"})
    EXPECT_TRUE(summary.contains(key)) << key << " in " << summary.dump();
  EXPECT_EQ(summary["rows"], 2);
  EXPECT_EQ(summary["skipped"], 2);
  EXPECT_GE(summary["exact_match"].get<double>(), 0.0);
  EXPECT_LE(summary["token_accuracy"].get<double>(), 1.0);
  EXPECT_NE(errors.find(test + ":2: images: the plan is text-only"), std::string::npos) << errors;
  EXPECT_NE(errors.find(test + ":3: messages: the prompt has"), std::string::npos) << errors;
  std::ifstream rowsFile(dir / "rows.jsonl");
  const std::vector<nlohmann::json> rows =
      jsonLines(std::string(std::istreambuf_iterator<char>(rowsFile), std::istreambuf_iterator<char>()));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["id"], 0);
  EXPECT_EQ(rows[1]["id"], 3);
  EXPECT_EQ(rows[1]["completion"], "2");
}

}  // namespace
}  // namespace dgemma
