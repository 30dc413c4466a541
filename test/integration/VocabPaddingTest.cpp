// Vocabulary padding (docs/parallelism.md, "Vocabulary padding"): a vocabulary of 253 ids, which TP 2
// does not divide, padded to a multiple of lcm(TP, --vocab-alignment) computes what one unpadded rank
// computes, and no padded row shows outside the plan:
//   - train: three steps give the same losses and gradient norms; the padded layout's checkpoint
//     resumes on the unpadded rank (checkpoints hold the 253 real rows) and exports them;
//   - grad: the loss terms and every gradient equal one rank's, the padded rows' gradient exactly 0;
//   - generate: an aligned inference plan writes the same text as the unpadded one.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "TrainingOutputs.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

using testing::expectSameLosses;
using testing::relativeDistance;
using testing::runTool;
using testing::ScratchDirectory;
using testing::splitRecords;
using testing::ToolResult;

constexpr int64_t kVocabulary = 253;
constexpr int64_t kHidden = 48;
const std::string kEmbedding = "model.decoder.embed_tokens.weight";

struct Layout {
  std::string name;
  std::string flags;  // dgemma-compile's layout flags
  int64_t ranks;
  int64_t dataParallel;
  int64_t paddedRows;  // the plan's embedding rows
};

std::ostream& operator<<(std::ostream& out, const Layout& layout) { return out << layout.name; }

const std::vector<Layout>& trainingLayouts() {
  static const std::vector<Layout> all = {
      {"tp2", "--tp 2", 2, 1, 254},
      {"tp2_sp", "--tp 2 --sp", 2, 1, 254},
      {"tp2_dp2_ep2_sp", "--tp 2 --dp 2 --ep 2 --sp", 4, 2, 254},
      {"tp2_align16", "--tp 2 --vocab-alignment 16", 2, 1, 256},
      // TP 4 beyond the config's 2 KV heads (each on 2 ranks) with a vocabulary 4 does not divide.
      {"tp4", "--tp 4", 4, 1, 256},
      {"tp4_sp", "--tp 4 --sp", 4, 1, 256},
      {"one_rank_align64", "--vocab-alignment 64", 1, 1, 256},
  };
  return all;
}

std::string source(const std::string& path) { return std::string(DGEMMA_SOURCE_DIR) + "/" + path; }
std::string model() { return source("test/fixtures/diffusion_gemma/vocab253/config.json"); }

class PaddingRun : public ::testing::Test {
 protected:
  ToolResult compile(const std::string& flags, const std::string& out) {
    ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + model() + " " + flags + " -o " + out);
    EXPECT_EQ(compiled.exitCode, 0) << compiled.output;
    return compiled;
  }
  std::string run(const std::string& command, int64_t ranks = 1) {
    ToolResult ran = runTool(std::string(DGEMMA_RUN) + " " + command +
                             (ranks > 1 ? " --nproc-per-node " + std::to_string(ranks) : std::string()));
    EXPECT_EQ(ran.exitCode, 0) << ran.output;
    return ran.output;
  }
  // An HF directory of random weights with the real vocabulary: one step of an unpadded run, exported.
  std::string randomHfWeights() {
    compile("--mode train --preset tiny-cpu", dir / "seed-plan");
    run("train --plan " + (dir / "seed-plan") +
        " --train mock --init random --seed 3 --steps 1 --warmup 1 --decay-steps 2 --eval-every 0 --save-every 1 "
        "--save-dir " +
        (dir / "seed-ckpt"));
    run("export --weights " + (dir / "seed-ckpt/step-00000001") + " --out " + (dir / "seed-hf"));
    return dir / "seed-hf";
  }
  ScratchDirectory dir;
};

class VocabPadding : public PaddingRun, public ::testing::WithParamInterface<Layout> {};

// An alignment the vocabulary already meets changes nothing: the plan is byte-identical to the
// default's (tiny-cpu's 256 ids at TP 2 with alignment 128).
TEST_F(PaddingRun, AlignmentTheVocabularyMeetsLeavesThePlanUnchanged) {
  const std::string tiny = source("models/diffusion_gemma/configs/tiny-cpu.json");
  for (const char* flags : {"", " --vocab-alignment 128"}) {
    ToolResult compiled =
        runTool(std::string(DGEMMA_COMPILE) + " --model " + tiny + " --mode train --preset tiny-cpu --tp 2" + flags +
                " -o " + (dir / (*flags ? "aligned" : "default")));
    ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
  }
  for (const char* file : {"rank-0.dgplan", "rank-1.dgplan"}) {
    std::ifstream a(dir / ("default/" + std::string(file)), std::ios::binary),
        b(dir / ("aligned/" + std::string(file)), std::ios::binary);
    const std::string defaultPlan((std::istreambuf_iterator<char>(a)), {}),
        alignedPlan((std::istreambuf_iterator<char>(b)), {});
    EXPECT_FALSE(defaultPlan.empty());
    EXPECT_TRUE(defaultPlan == alignedPlan) << file;
  }
}

// A bad --vocab-alignment is refused by name, and nothing is written.
TEST_F(PaddingRun, BadAlignmentIsRefusedNamingTheFlag) {
  for (const char* alignment : {"0", "-8", "65537"}) {
    ToolResult compiled =
        runTool(std::string(DGEMMA_COMPILE) + " --model " + model() +
                " --mode train --preset tiny-cpu --vocab-alignment " + alignment + " -o " + (dir / "plan"));
    EXPECT_NE(compiled.exitCode, 0) << alignment;
    EXPECT_NE(compiled.output.find("--vocab-alignment " + std::string(alignment)), std::string::npos)
        << compiled.output;
    EXPECT_FALSE(std::filesystem::exists(dir / "plan")) << alignment;
  }
  // The built-in graph has no embedding to pad.
  ToolResult builtin = runTool(std::string(DGEMMA_COMPILE) +
                               " --model builtin:rmsnorm-matmul-softmax --mode infer --prompt-len 4 --hidden-size 8"
                               " --vocab-size 8 --vocab-alignment 4 -o " +
                               (dir / "plan"));
  EXPECT_NE(builtin.exitCode, 0);
  EXPECT_NE(builtin.output.find("--vocab-alignment: "), std::string::npos) << builtin.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "plan"));
}

// Three steps from the same random init equal one unpadded rank's; the padded checkpoint continues
// for a fourth step equal to the unpadded rank's own, both on the unpadded rank and in the padded
// layout itself (whose restore refills the padding rows), and exports the real rows only.
TEST_P(VocabPadding, TrainingAndResumeEqualUnpaddedOneRank) {
  const Layout& layout = GetParam();
  compile("--mode train --preset tiny-cpu --micro-batch 2", dir / "one");
  compile(
      "--mode train --preset tiny-cpu --micro-batch " + std::to_string(2 / layout.dataParallel) + " " + layout.flags,
      dir / "padded");
  const std::string train =
      " --train mock --init random --seed 5 --warmup 1 --decay-steps 4 --eval-every 0 --save-every 3";
  run("train --plan " + (dir / "one") + train + " --steps 4 --metrics " + (dir / "one.jsonl") + " --save-dir " +
      (dir / "one-ckpt"));
  run("train --plan " + (dir / "padded") + train + " --steps 3 --metrics " + (dir / "padded.jsonl") + " --save-dir " +
          (dir / "padded-ckpt"),
      layout.ranks);
  if (HasFailure()) return;
  run("export --weights " + (dir / "padded-ckpt/step-00000003") + " --out " + (dir / "padded-hf"));
  std::filesystem::copy(dir / "padded-ckpt", dir / "padded-ckpt-again", std::filesystem::copy_options::recursive);
  std::filesystem::copy_file(dir / "padded.jsonl", dir / "padded-again.jsonl");
  run("train --plan " + (dir / "one") + train + " --steps 4 --resume --metrics " + (dir / "padded.jsonl") +
      " --save-dir " + (dir / "padded-ckpt"));
  run("train --plan " + (dir / "padded") + train + " --steps 4 --resume --metrics " + (dir / "padded-again.jsonl") +
          " --save-dir " + (dir / "padded-ckpt-again"),
      layout.ranks);
  if (HasFailure()) return;

  const std::vector<nlohmann::json> want = splitRecords(dir / "one.jsonl");
  ASSERT_EQ(want.size(), 4u);
  for (const char* metrics : {"padded.jsonl", "padded-again.jsonl"}) {
    SCOPED_TRACE(metrics);
    const std::vector<nlohmann::json> got = splitRecords(dir / metrics);
    ASSERT_EQ(got.size(), 4u);
    for (size_t step = 0; step < want.size(); ++step) expectSameLosses(got[step], want[step]);
  }

  SafetensorsFile exported = SafetensorsFile::open(dir / "padded-hf/model.safetensors");
  ASSERT_TRUE(exported.find(kEmbedding));
  EXPECT_EQ(exported.find(kEmbedding)->shape, (std::vector<int64_t>{kVocabulary, kHidden}));
}

// The gradient fixture's batch (4 prompts of 11 tokens crossing the window of 8, ids < 128) with
// self-conditioning and the encoder loss: every loss term and gradient equals one unpadded rank's;
// the embedding's gradient has V' rows, the padded ones exactly zero.
TEST_P(VocabPadding, GradientsEqualUnpaddedOneRank) {
  const Layout& layout = GetParam();
  const std::string weights = randomHfWeights();
  const std::string batch = source("test/fixtures/diffusion_gemma_train/seven_layers/batch.safetensors");
  const std::string objective = "--mode train --self-cond-prob 1 --encoder-loss-weight 1 --prompt-len 12";
  compile(objective + " --micro-batch 4", dir / "one");
  compile(objective + " --micro-batch " + std::to_string(4 / layout.dataParallel) + " " + layout.flags, dir / "padded");
  const std::string grad = " --weights " + weights + " --input " + batch;
  run("grad --plan " + (dir / "one") + grad + " --out " + (dir / "one.safetensors"));
  run("grad --plan " + (dir / "padded") + grad + " --out " + (dir / "padded.safetensors"), layout.ranks);
  if (HasFailure()) return;

  SafetensorsFile want = SafetensorsFile::open(dir / "one.safetensors");
  SafetensorsFile got = SafetensorsFile::open(dir / "padded.safetensors");
  int64_t compared = 0;
  for (const SafetensorsEntry& entry : want.entries()) {
    ASSERT_TRUE(got.find(entry.name)) << entry.name << ": missing from the padded run's output";
    HostTensor a = got.read(entry.name), b = want.read(entry.name);
    if (entry.name == kEmbedding) {
      ASSERT_EQ(b.shape, (std::vector<int64_t>{kVocabulary, kHidden}));
      ASSERT_EQ(a.shape, (std::vector<int64_t>{layout.paddedRows, kHidden}));
      const float* padding = a.as<float>() + kVocabulary * kHidden;
      for (int64_t i = 0; i < (layout.paddedRows - kVocabulary) * kHidden; ++i)
        ASSERT_EQ(padding[i], 0.0f) << "padded row " << kVocabulary + i / kHidden;
    } else {
      ASSERT_EQ(a.shape, b.shape) << entry.name;
    }
    // As test/integration/ShardedParityTest.cpp: fp32 sums in another order, the router's
    // per-expert scale worse conditioned.
    const double tolerance = entry.name.find("router.per_expert_scale") != std::string::npos ? 3e-5 : 1e-5;
    EXPECT_LE(relativeDistance(a, b), tolerance) << entry.name;
    ++compared;
  }
  EXPECT_GT(compared, 20);
}

INSTANTIATE_TEST_SUITE_P(Layouts, VocabPadding, ::testing::ValuesIn(trainingLayouts()),
                         [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

// The pre-training objectives score the V real logits too: three steps of each at TP 2 (V' = 254) on
// packed text equal one unpadded rank's.
TEST_F(PaddingRun, PretrainingObjectivesEqualUnpaddedOneRank) {
  {
    static const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran"};
    std::ofstream corpus(dir / "corpus.jsonl");
    for (int document = 0; document < 200; ++document) {
      corpus << "{\"text\": \"";
      for (int word = 0; word < 3 + document % 29; ++word)
        corpus << (word ? " " : "") << words[(document * 5 + word * 4) % 9];
      corpus << "\"}\n";
    }
  }
  run("preprocess --input " + (dir / "corpus.jsonl") + " --json-keys text --tokenizer " + source("data/tokenizer") +
      " --output-prefix " + (dir / "corpus"));
  const std::string train = " --init random --seed 5 --data-path " + (dir / "corpus") +
                            " --split 100,0,0 --data-cache-dir " + (dir / "cache") +
                            " --eval-every 0 --warmup 1 --steps 3 --lr 3e-3";
  for (const std::string objective :
       {"autoregressive", "masked-diffusion --mask-token-id 3", "block-diffusion --canvas-len 8"}) {
    SCOPED_TRACE(objective);
    const std::string one = dir / ("one-" + objective.substr(0, 2)), padded = dir / ("tp2-" + objective.substr(0, 2));
    const std::string flags = "--mode train --seq-len 32 --micro-batch 4 --objective " + objective;
    compile(flags, one);
    compile(flags + " --tp 2", padded);
    run("train --plan " + one + train + " --metrics " + one + ".jsonl");
    run("train --plan " + padded + train + " --metrics " + padded + ".jsonl", 2);
    if (HasFailure()) return;
    const std::vector<nlohmann::json> want = splitRecords(one + ".jsonl"), got = splitRecords(padded + ".jsonl");
    ASSERT_EQ(want.size(), 3u);
    ASSERT_EQ(got.size(), 3u);
    for (size_t step = 0; step < want.size(); ++step)
      for (auto [field, tolerance] : {std::pair{"loss", 1e-6}, {"grad_norm", 1e-5}}) {
        const double a = got[step].at(field).get<double>(), b = want[step].at(field).get<double>();
        EXPECT_LE(std::fabs(a - b), tolerance * std::fabs(b))
            << "step " << step + 1 << " " << field << ": " << a << " vs " << b;
      }
  }
}

// The sampler sees the V real logits only: an inference plan padded to 256 rows generates exactly
// the unpadded plan's text from the same weights and seed.
TEST_F(PaddingRun, AlignedGenerationWritesTheUnpaddedText) {
  const std::string weights = randomHfWeights();
  compile("--mode infer --prompt-len 32", dir / "infer-one");
  compile("--mode infer --prompt-len 32 --vocab-alignment 64", dir / "infer-padded");
  const std::string generate = " --weights " + weights + " --tokenizer " +
                               source("test/fixtures/generate/char_tokenizer") + " --prompt hello --seed 11 --json";
  // The request's JSON line (the summary after it holds timings).
  auto request = [](const std::string& output) { return nlohmann::json::parse(output.substr(0, output.find('\n'))); };
  const std::string want = run("generate --plan " + (dir / "infer-one") + generate);
  const std::string got = run("generate --plan " + (dir / "infer-padded") + generate);
  if (HasFailure()) return;
  const nlohmann::json wantRequest = request(want), gotRequest = request(got);
  ASSERT_FALSE(wantRequest.at("tokens").empty()) << want;
  EXPECT_EQ(gotRequest.at("tokens"), wantRequest.at("tokens"));
  EXPECT_EQ(gotRequest.at("text"), wantRequest.at("text"));
  for (const nlohmann::json& token : gotRequest.at("tokens")) EXPECT_LT(token.get<int64_t>(), kVocabulary);
}

}  // namespace
}  // namespace dgemma
