// The serving engine's continuous batching (docs/serving.md, "Continuous batching") on the
// seven_layers fixture with a generation config under which rows stop at different passes and
// finish in different canvases. Checked: a job's tokens equal `Generator` on a batch of one with the
// same seed whatever else runs beside it and whenever it joins; budgets cut the text; cancelled and
// queued jobs end as documented; a full queue refuses.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include "ToolRunner.h"
#include "runtime/generate/Generator.h"
#include "runtime/serve/engine/BatchEngine.h"
#include "runtime/session/Session.h"
#include "support/Error.h"

namespace dgemma::serve {
namespace {

using testing::runTool;
using testing::ToolResult;

constexpr int64_t kMaxNewTokens = 48;  // three canvases of 16
constexpr int64_t kSteps = 12;

std::string fixture() { return std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/seven_layers"; }

// Collects what the engine reports for one job.
class CollectingSink : public JobSink {
 public:
  void onDraft(int64_t canvas, int64_t step, std::span<const int64_t> canvasIds) override {
    (void)canvas;
    (void)step;
    (void)canvasIds;
    ++drafts;
  }
  void onCanvas(int64_t canvas, std::span<const int64_t> tokens) override {
    canvases.push_back(canvas);
    text.insert(text.end(), tokens.begin(), tokens.end());
  }
  void onEnd(const JobSummary& summary) override { ended.set_value(summary); }

  std::vector<int64_t> text, canvases;
  int64_t drafts = 0;
  std::promise<JobSummary> ended;
};

struct Prompt {
  std::vector<int64_t> ids;
  uint64_t seed;
  int64_t maxTokens;
};

std::vector<Prompt> prompts() {
  std::vector<Prompt> all;
  uint32_t state = 999;
  const int64_t lengths[] = {11, 5, 3, 40, 7, 1, 16, 9};
  const int64_t budgets[] = {48, 48, 20, 48, 33, 1, 48, 2};
  for (int64_t i = 0; i < 8; ++i) {
    Prompt prompt{{2}, static_cast<uint64_t>(100 + i % 3), budgets[i]};
    while (static_cast<int64_t>(prompt.ids.size()) < lengths[i]) {
      state = state * 1664525u + 1013904223u;
      prompt.ids.push_back(13 + (state >> 8) % 115);
    }
    all.push_back(prompt);
  }
  return all;
}

class ServeEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    suiteDir_ = std::filesystem::temp_directory_path() / ("dgemma-it-" + std::to_string(::getpid()) + "-serve-engine");
    std::filesystem::remove_all(suiteDir_);
    std::filesystem::create_directories(suiteDir_ / "eager");
    std::filesystem::copy_file(fixture() + "/config.json", suiteDir_ / "eager/config.json");
    std::ofstream(suiteDir_ / "eager/generation_config.json")
        << R"({"confidence_threshold": 1.0, "stability_threshold": 0, "eos_token_id": [1, 20, 30, 40, 50, 60, 70, 80]})";
    for (const auto& [name, batch] : {std::pair<std::string, int>{"one", 1}, std::pair<std::string, int>{"slots", 3}}) {
      const ToolResult compiled =
          runTool(std::string(DGEMMA_COMPILE) + " --model " + (suiteDir_ / "eager").string() +
                  " --mode infer --micro-batch " + std::to_string(batch) + " --prompt-len 8,16,64 --max-new-tokens " +
                  std::to_string(kMaxNewTokens) + " -o " + (suiteDir_ / name).string());
      ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
    }
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(suiteDir_); }

  static std::unique_ptr<Session> open(const std::string& plan) {
    SessionOptions options;
    options.planDir = (suiteDir_ / plan).string();
    options.weights = fixture() + "/model.safetensors";
    options.threads = 2;
    return openSession(options);
  }

  // What `dgemma-run generate --prompt` gives: the Generator on a batch of one, cut at the first EOS
  // and at the budget.
  static std::vector<int64_t> expectedText(Session& session, const Prompt& prompt, int64_t drawRequest) {
    Generator generator(session, GeneratorOptions{kMaxNewTokens, kSteps});
    CounterDrawSource draws(prompt.seed, 128);
    const std::vector<GenerationRequest> requests = {{drawRequest, prompt.ids}};
    std::vector<int64_t> tokens = generator.generate(requests, draws)[0].newTokens;
    const std::vector<int64_t>& eos = session.plan.generation->eosTokenIds;
    std::vector<int64_t> text;
    for (int64_t id : tokens) {
      if (static_cast<int64_t>(text.size()) == prompt.maxTokens) break;
      if (std::find(eos.begin(), eos.end(), id) != eos.end()) break;
      text.push_back(id);
    }
    return text;
  }

  static GenerationJob job(const Prompt& prompt, int64_t drawRequest, std::shared_ptr<JobSink> sink) {
    GenerationJob job;
    job.promptIds = prompt.ids;
    job.sampling.seed = prompt.seed;
    job.sampling.drawRequest = drawRequest;
    job.sampling.maxTokens = prompt.maxTokens;
    job.sampling.denoisingSteps = kSteps;
    job.sink = std::move(sink);
    return job;
  }

  static std::filesystem::path suiteDir_;
};

std::filesystem::path ServeEngineTest::suiteDir_;

TEST_F(ServeEngineTest, AJobsTextIsItsSeedsWhateverRunsBesideIt) {
  std::unique_ptr<Session> one = open("one");
  std::unique_ptr<Session> slots = open("slots");
  BatchEngine engine(*slots, EngineOptions{});
  ASSERT_EQ(engine.slots(), 3);
  std::thread loop([&] { engine.run(); });
  // Eight jobs over three slots: they queue, join as slots free up, and run beside jobs at other
  // canvases and passes.
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  const std::vector<Prompt> all = prompts();
  for (size_t i = 0; i < all.size(); ++i) {
    sinks.push_back(std::make_shared<CollectingSink>());
    engine.submit(job(all[i], static_cast<int64_t>(i % 2), sinks.back()));
  }
  std::vector<JobSummary> summaries;
  for (auto& sink : sinks) summaries.push_back(sink->ended.get_future().get());
  engine.stop();
  loop.join();

  int64_t byEos = 0, byLength = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const std::vector<int64_t> expected = expectedText(*one, all[i], static_cast<int64_t>(i % 2));
    EXPECT_EQ(sinks[i]->text, expected) << "job " << i;
    EXPECT_LE(summaries[i].completionTokens, all[i].maxTokens) << "job " << i;
    EXPECT_GE(summaries[i].completionTokens, static_cast<int64_t>(expected.size())) << "job " << i;
    byEos += summaries[i].end == JobEnd::Eos;
    byLength += summaries[i].end == JobEnd::Length;
    if (summaries[i].end == JobEnd::Length) {
      EXPECT_EQ(summaries[i].completionTokens, all[i].maxTokens) << "job " << i;
    }
  }
  EXPECT_EQ(byEos + byLength, static_cast<int64_t>(all.size()));
  EXPECT_GT(byEos, 0) << "some job must end by EOS for the check to cover it";
  EXPECT_GT(byLength, 0) << "some job must end by its budget";
}

TEST_F(ServeEngineTest, CancelledJobsEndAndAFullQueueRefuses) {
  std::unique_ptr<Session> slots = open("slots");
  BatchEngine engine(*slots, EngineOptions{2, {}});
  const Prompt prompt = prompts()[0];
  // Before the loop runs, the queue fills: two wait, the third is refused.
  auto first = std::make_shared<CollectingSink>(), second = std::make_shared<CollectingSink>();
  std::shared_ptr<JobHandle> firstHandle = engine.submit(job(prompt, 0, first));
  engine.submit(job(prompt, 1, second));
  EXPECT_THROW(engine.submit(job(prompt, 2, std::make_shared<CollectingSink>())), EngineFull);
  EXPECT_EQ(engine.queued(), 2);
  firstHandle->cancel();  // cancelled while queued
  std::thread loop([&] { engine.run(); });
  EXPECT_EQ(first->ended.get_future().get().end, JobEnd::Cancelled);
  EXPECT_TRUE(first->text.empty());
  EXPECT_NE(second->ended.get_future().get().end, JobEnd::Cancelled);

  // Cancelled while running: its slot frees and the next job runs.
  auto drafting = std::make_shared<CollectingSink>();
  GenerationJob running = job(prompt, 3, drafting);
  running.sampling.drafts = true;
  std::shared_ptr<JobHandle> handle = engine.submit(std::move(running));
  handle->cancel();
  const JobSummary cancelled = drafting->ended.get_future().get();
  EXPECT_EQ(cancelled.end, JobEnd::Cancelled);
  auto after = std::make_shared<CollectingSink>();
  engine.submit(job(prompt, 0, after));
  EXPECT_NE(after->ended.get_future().get().end, JobEnd::Cancelled);
  EXPECT_EQ(engine.activeSlots(), 0);
  engine.stop();
  loop.join();
  EXPECT_THROW(engine.submit(job(prompt, 0, std::make_shared<CollectingSink>())), EngineFull) << "stopped";
}

TEST_F(ServeEngineTest, BadJobsAreRefusedByName) {
  std::unique_ptr<Session> slots = open("slots");
  BatchEngine engine(*slots, EngineOptions{});
  Prompt prompt = prompts()[0];
  auto sink = std::make_shared<CollectingSink>();
  prompt.ids.assign(65, 2);
  try {
    engine.submit(job(prompt, 0, sink));
    FAIL() << "a prompt longer than every bucket";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("65 tokens"), std::string::npos) << error.what();
  }
  prompt = prompts()[0];
  prompt.maxTokens = kMaxNewTokens + 1;
  EXPECT_THROW(engine.submit(job(prompt, 0, sink)), InputError);
  prompt = prompts()[0];
  prompt.ids.push_back(128);
  EXPECT_THROW(engine.submit(job(prompt, 0, sink)), InputError);
  prompt = prompts()[0];
  prompt.ids.clear();
  EXPECT_THROW(engine.submit(job(prompt, 0, sink)), InputError);
}

}  // namespace
}  // namespace dgemma::serve
