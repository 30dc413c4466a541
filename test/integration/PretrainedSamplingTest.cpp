// Sampling from pre-trained checkpoints (docs/pretraining.md, "Sampling"): the logits entry of
// `dgemma-compile --mode infer --objective autoregressive|masked-diffusion` against the train step of
// the same objective (cross-entropy of its logits computed here gives train_step's loss), and the
// samplers of runtime/generate/PretrainedSampler.h in-process and through `dgemma-run sample`: the
// argmax at temperature 0 recomputed from the logits entry on batches laid out here, determinism
// for a seed, the stop id, LLaDA's first commit, and the located errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ToolRunner.h"
#include "runtime/data/text/Tokenizer.h"
#include "runtime/generate/PretrainedSampler.h"
#include "runtime/io/Safetensors.h"
#include "runtime/session/RunEntry.h"
#include "runtime/session/Session.h"
#include "support/Error.h"

namespace dgemma {
namespace {

using testing::contains;
using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

const std::string kFixtureRoot = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/";
const std::string kTinyModel = std::string(DGEMMA_SOURCE_DIR) + "/models/diffusion_gemma/configs/tiny-cpu.json";
const std::string kTokenizer = std::string(DGEMMA_SOURCE_DIR) + "/data/tokenizer";
constexpr uint64_t kInitSeed = 11;
constexpr int64_t kTinyMaskTokenId = 3;
constexpr int64_t kTinySequenceLength = 32;

std::map<std::string, HostTensor> readAll(const std::string& path) {
  SafetensorsFile file = SafetensorsFile::open(path);
  std::map<std::string, HostTensor> tensors;
  for (const SafetensorsEntry& entry : file.entries()) tensors[entry.name] = file.read(entry.name);
  return tensors;
}

std::vector<double> toDoubles(const HostTensor& tensor) {
  const HostTensor wide = convertDType(tensor, DType::F64, "tensor");
  return std::vector<double>(wide.as<double>(), wide.as<double>() + wide.numElements());
}

std::vector<int64_t> toInts(const HostTensor& tensor) {
  const HostTensor wide = convertDType(tensor, DType::I64, "tensor");
  return std::vector<int64_t>(wide.as<int64_t>(), wide.as<int64_t>() + wide.numElements());
}

void compileOrFail(const std::string& command) {
  const ToolResult result = runTool(command);
  ASSERT_EQ(result.exitCode, 0) << command << "\n" << result.output;
}

// log Σ exp(z) − z[target] of one position's logits, in double.
double crossEntropy(const std::vector<double>& logits, size_t offset, int64_t vocabSize, int64_t target) {
  double top = logits[offset];
  for (int64_t v = 1; v < vocabSize; ++v) top = std::max(top, logits[offset + v]);
  double sum = 0;
  for (int64_t v = 0; v < vocabSize; ++v) sum += std::exp(logits[offset + v] - top);
  return top + std::log(sum) - logits[offset + target];
}

// The torch fixture's packed rows (2 and 3 documents, padding, documents longer than the sliding
// window) through the train step and through the logits entry: CE of the logits, weighted and
// normalised as docs/pretraining.md writes each loss, is train_step's loss.
class LogitsEntryParity : public ::testing::TestWithParam<std::string> {};

TEST_P(LogitsEntryParity, CrossEntropyOfTheLogitsIsTheTrainStepsLoss) {
  const std::string objective = GetParam();
  const bool autoregressive = objective == "autoregressive";
  const std::string model = kFixtureRoot + "diffusion_gemma/all_experts";
  const std::string inputPath =
      kFixtureRoot + "diffusion_gemma_pretrain/all_experts/" + objective + ".input.safetensors";
  std::map<std::string, HostTensor> batch = readAll(inputPath);
  const int64_t rows = batch.at("input_ids").shape[0], length = batch.at("input_ids").shape[1];
  const std::string shape = " --micro-batch " + std::to_string(rows) + " --seq-len " + std::to_string(length);
  const std::string objectiveFlags =
      autoregressive ? "--objective autoregressive" : "--objective masked-diffusion --mask-token-id 63";
  ScratchDirectory dir;
  compileOrFail(std::string(DGEMMA_COMPILE) + " --model " + model + " --mode train " + objectiveFlags + shape + " -o " +
                (dir / "train"));
  compileOrFail(std::string(DGEMMA_COMPILE) + " --model " + model + " --mode infer " + objectiveFlags + shape + " -o " +
                (dir / "infer"));
  auto open = [&](const std::string& plan) {
    SessionOptions options;
    options.planDir = dir / plan;
    options.weights = model + "/model.safetensors";
    options.threads = 2;
    return openSession(options);
  };
  std::unique_ptr<Session> train = open("train");
  const std::map<std::string, HostTensor> step = runEntry(*train, "train_step", batch, inputPath);
  const double trainLoss = toDoubles(step.at("loss")).at(0);

  // Masked diffusion: the logits of the ids the step masked (its own draw, an output of the step).
  std::map<std::string, HostTensor> logitsBatch = batch;
  if (!autoregressive) logitsBatch["input_ids"] = step.at("masked_input_ids");
  std::unique_ptr<Session> infer = open("infer");
  const HostTensor logitsTensor = runEntry(*infer, "logits", logitsBatch, inputPath).at("logits");
  ASSERT_EQ(logitsTensor.dtype, DType::F32);
  ASSERT_EQ(logitsTensor.shape.size(), 3u);
  const int64_t vocabSize = logitsTensor.shape[2];
  ASSERT_EQ(logitsTensor.shape[0], rows);
  ASSERT_EQ(logitsTensor.shape[1], length);
  const std::vector<double> logits = toDoubles(logitsTensor);

  const std::vector<double> lossMask = toDoubles(batch.at("loss_mask"));
  const std::vector<int64_t> targets = toInts(batch.at(autoregressive ? "labels" : "input_ids"));
  std::vector<double> weights = lossMask;  // autoregressive: the loss mask scores
  if (!autoregressive) {
    const std::vector<double> masked = toDoubles(step.at("masked_positions"));
    const std::vector<double> maskProbability = toDoubles(step.at("p_mask"));
    for (int64_t at = 0; at < rows * length; ++at)
      weights[at] = masked[at] / static_cast<double>(static_cast<float>(maskProbability[at / length]));
  }
  double weighted = 0, counted = 0;
  for (int64_t at = 0; at < rows * length; ++at) {
    counted += lossMask[at];
    if (weights[at] != 0) weighted += weights[at] * crossEntropy(logits, at * vocabSize, vocabSize, targets[at]);
  }
  const double hostLoss = weighted / std::max(counted, 1.0);
  EXPECT_LE(std::abs(hostLoss - trainLoss) / std::abs(trainLoss), 1e-6) << hostLoss << " vs " << trainLoss;
  // And so is the float64 reference's (the parity test holds train_step to it).
  const double referenceLoss =
      toDoubles(readAll(kFixtureRoot + "diffusion_gemma_pretrain/all_experts/" + objective + ".safetensors").at("loss"))
          .at(0);
  EXPECT_LE(std::abs(hostLoss - referenceLoss) / std::abs(referenceLoss), 1e-6) << hostLoss << " vs " << referenceLoss;
}

INSTANTIATE_TEST_SUITE_P(Objectives, LogitsEntryParity, ::testing::Values("autoregressive", "masked-diffusion"),
                         [](const auto& info) {
                           return info.param == "autoregressive" ? "Autoregressive" : "MaskedDiffusion";
                         });

std::vector<nlohmann::json> jsonLines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// Inference plans of the tiny CPU model (micro-batch 2: the sampler pads the second row), randomly
// initialised, compiled once for the suite.
class PretrainedSamplerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(
        (std::filesystem::temp_directory_path() / ("dgemma-pretrained-sampling-" + std::to_string(::getpid())))
            .string());
    std::filesystem::remove_all(*root_);
    std::filesystem::create_directories(*root_);
    const std::string compile = std::string(DGEMMA_COMPILE) + " --model " + kTinyModel +
                                " --mode infer --micro-batch 2 --seq-len 16," + std::to_string(kTinySequenceLength) +
                                " ";
    compileOrFail(compile + "--objective autoregressive -o " + plan("ar"));
    compileOrFail(compile + "--objective masked-diffusion --mask-token-id " + std::to_string(kTinyMaskTokenId) +
                  " -o " + plan("md"));
    compileOrFail(std::string(DGEMMA_COMPILE) + " --model " + kTinyModel + " --mode infer --prompt-len 16 -o " +
                  plan("sft"));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }
  static std::string plan(const std::string& name) { return *root_ + "/" + name; }

  static std::unique_ptr<Session> open(const std::string& name) {
    SessionOptions options;
    options.planDir = plan(name);
    options.init = "random";
    options.seed = kInitSeed;
    options.threads = 2;
    return openSession(options);
  }

  // The logits [S, V] of row 1 of a batch laid out unlike the sampler's: the document in the second
  // row at the bucket's full length, its padding another id in another document, the first row
  // another text. No real query reads either, so the document's logits are the same.
  static std::vector<float> independentLogits(Session& session, const std::vector<int64_t>& tokens, bool keysReal) {
    const int64_t length = kTinySequenceLength, count = static_cast<int64_t>(tokens.size());
    HostTensor ids(DType::I64, {2, length}), positions(DType::I64, {2, length}), documents(DType::I64, {2, length});
    HostTensor real(DType::F32, {2, length});
    for (int64_t column = 0; column < length; ++column) {
      ids.as<int64_t>()[column] = 7 + column % 50;  // row 0: one other document
      positions.as<int64_t>()[column] = column;
      documents.as<int64_t>()[column] = 4;
      real.as<float>()[column] = 1.0f;
      const int64_t at = length + column;
      const bool inDocument = column < count;
      ids.as<int64_t>()[at] = inDocument ? tokens[column] : 9;
      positions.as<int64_t>()[at] = inDocument ? column : column - count;
      documents.as<int64_t>()[at] = inDocument ? 2 : 5;
      real.as<float>()[at] = inDocument || !keysReal ? 1.0f : 0.0f;
    }
    std::map<std::string, HostTensor> batch = {
        {"input_ids", ids}, {"position_ids", positions}, {"document_ids", documents}, {"loss_mask", real}};
    const HostTensor logits = runEntry(session, "logits", batch, "<test batch>").at("logits");
    const int64_t vocabSize = logits.shape[2];
    return std::vector<float>(logits.as<float>() + length * vocabSize,
                              logits.as<float>() + (length + count) * vocabSize);
  }

  static int64_t argmax(const std::vector<float>& logits, int64_t position, int64_t vocabSize, int64_t excluded = -1) {
    int64_t best = -1;
    for (int64_t v = 0; v < vocabSize; ++v)
      if (v != excluded && (best < 0 || logits[position * vocabSize + v] > logits[position * vocabSize + best]))
        best = v;
    return best;
  }

  const std::vector<int64_t> prompt_ = {40, 12, 99, 7, 150};

  static std::string* root_;
};

std::string* PretrainedSamplerTest::root_ = nullptr;

TEST_F(PretrainedSamplerTest, AutoregressiveArgmaxIsTheLogitsEntrysArgmaxStepByStep) {
  std::unique_ptr<Session> session = open("ar");
  PretrainedSampler sampler(*session);
  ASSERT_EQ(sampler.objective(), PretrainedObjective::Autoregressive);
  EXPECT_EQ(sampler.maxSequenceLength(), kTinySequenceLength);
  PretrainedSamplingOptions options;
  options.maxNewTokens = 10;
  const PretrainedCompletion completion = sampler.complete(0, prompt_, options, "prompt");
  ASSERT_EQ(completion.newTokens.size(), 10u);
  EXPECT_EQ(completion.finish, PretrainedFinish::Length);
  EXPECT_EQ(completion.passes, 10);
  std::vector<int64_t> sequence = prompt_;
  for (int64_t token : completion.newTokens) {
    const std::vector<float> logits = independentLogits(*session, sequence, /*keysReal=*/false);
    EXPECT_EQ(token, argmax(logits, static_cast<int64_t>(sequence.size()) - 1, sampler.vocabSize()))
        << "new token " << sequence.size() - prompt_.size();
    sequence.push_back(token);
  }
  // A prompt that fills the sequence up to one token stops there.
  const std::vector<int64_t> longPrompt(kTinySequenceLength - 2, 17);
  const PretrainedCompletion full = sampler.complete(1, longPrompt, options, "long prompt");
  EXPECT_EQ(full.newTokens.size(), 2u);
  EXPECT_EQ(full.finish, PretrainedFinish::Sequence);
}

TEST_F(PretrainedSamplerTest, SamplingIsDeterministicForASeedAndStopsAtAStopId) {
  std::unique_ptr<Session> session = open("ar");
  PretrainedSampler sampler(*session);
  PretrainedSamplingOptions options;
  options.maxNewTokens = 12;
  options.temperature = 1.0;
  options.seed = 4;
  const PretrainedCompletion first = sampler.complete(3, prompt_, options, "prompt");
  EXPECT_EQ(sampler.complete(3, prompt_, options, "prompt").newTokens, first.newTokens);
  options.seed = 5;
  EXPECT_NE(sampler.complete(3, prompt_, options, "prompt").newTokens, first.newTokens);
  options.seed = 4;
  EXPECT_NE(sampler.complete(4, prompt_, options, "prompt").newTokens, first.newTokens) << "the request keys the draws";
  options.temperature = 0;
  const PretrainedCompletion greedy = sampler.complete(3, prompt_, options, "prompt");
  EXPECT_NE(greedy.newTokens, first.newTokens);

  // The first token of the greedy run that did not come earlier, as the stop id: the completion ends
  // with it, after the same tokens.
  size_t stopAt = 2;
  while (std::find(greedy.newTokens.begin(), greedy.newTokens.begin() + stopAt, greedy.newTokens[stopAt]) !=
         greedy.newTokens.begin() + stopAt)
    ++stopAt;
  ASSERT_LT(stopAt, greedy.newTokens.size());
  options.stopIds = {greedy.newTokens[stopAt]};
  const PretrainedCompletion stopped = sampler.complete(3, prompt_, options, "prompt");
  EXPECT_EQ(stopped.finish, PretrainedFinish::Stop);
  EXPECT_EQ(stopped.newTokens,
            std::vector<int64_t>(greedy.newTokens.begin(), greedy.newTokens.begin() + static_cast<long>(stopAt) + 1));
  EXPECT_EQ(stopped.passes, static_cast<int64_t>(stopAt) + 1);
  EXPECT_EQ(tokensBeforeStop(stopped.newTokens, options.stopIds),
            std::vector<int64_t>(greedy.newTokens.begin(), greedy.newTokens.begin() + static_cast<long>(stopAt)));
}

TEST_F(PretrainedSamplerTest, MaskedDiffusionUnmasksByConfidence) {
  std::unique_ptr<Session> session = open("md");
  PretrainedSampler sampler(*session);
  ASSERT_EQ(sampler.objective(), PretrainedObjective::MaskedDiffusion);
  ASSERT_EQ(sampler.maskTokenId(), kTinyMaskTokenId);
  const int64_t vocabSize = sampler.vocabSize(), newTokens = 8, promptLength = static_cast<int64_t>(prompt_.size());
  std::vector<int64_t> masked = prompt_;
  masked.resize(promptLength + newTokens, kTinyMaskTokenId);
  const std::vector<float> firstPass = independentLogits(*session, masked, /*keysReal=*/true);

  // One pass commits every position: the argmax of the prompt followed by the mask tokens (the mask
  // token itself never chosen).
  PretrainedSamplingOptions options;
  options.maxNewTokens = newTokens;
  options.steps = 1;
  const PretrainedCompletion onePass = sampler.complete(0, prompt_, options, "prompt");
  EXPECT_EQ(onePass.passes, 1);
  ASSERT_EQ(onePass.newTokens.size(), static_cast<size_t>(newTokens));
  for (int64_t i = 0; i < newTokens; ++i)
    EXPECT_EQ(onePass.newTokens[i], argmax(firstPass, promptLength + i, vocabSize, kTinyMaskTokenId)) << i;

  // N passes, one commit each: the first is the position whose argmax is most probable, and it keeps
  // that token.
  options.steps = 0;
  const PretrainedCompletion byConfidence = sampler.complete(0, prompt_, options, "prompt");
  EXPECT_EQ(byConfidence.passes, newTokens);
  int64_t surest = -1;
  double surestProbability = -1;
  for (int64_t i = 0; i < newTokens; ++i) {
    const int64_t position = promptLength + i, token = argmax(firstPass, position, vocabSize, kTinyMaskTokenId);
    double sum = 0;
    for (int64_t v = 0; v < vocabSize; ++v)
      sum += std::exp(double(firstPass[position * vocabSize + v]) - double(firstPass[position * vocabSize + token]));
    if (1 / sum > surestProbability) {
      surestProbability = 1 / sum;
      surest = i;
    }
  }
  EXPECT_EQ(byConfidence.newTokens[surest], onePass.newTokens[surest]);
  EXPECT_EQ(std::count(byConfidence.newTokens.begin(), byConfidence.newTokens.end(), kTinyMaskTokenId), 0);

  // Three passes of ceil(8/3), ceil(5/2), 2 commits; a seed's draws are repeatable.
  options.steps = 3;
  options.temperature = 1.0;
  options.seed = 9;
  const PretrainedCompletion sampled = sampler.complete(2, prompt_, options, "prompt");
  EXPECT_EQ(sampled.passes, 3);
  EXPECT_EQ(sampler.complete(2, prompt_, options, "prompt").newTokens, sampled.newTokens);
  options.seed = 10;
  EXPECT_NE(sampler.complete(2, prompt_, options, "prompt").newTokens, sampled.newTokens);

  // The prompt and the mask tokens must fit the largest seq_len.
  options.maxNewTokens = kTinySequenceLength - promptLength + 1;
  EXPECT_THROW(sampler.complete(0, prompt_, options, "prompt"), InputError);
}

TEST_F(PretrainedSamplerTest, SampleCommandPrintsTheSamplersCompletions) {
  const std::string common = std::string(DGEMMA_RUN) + " sample --init random --init-seed " +
                             std::to_string(kInitSeed) + " --tokenizer " + kTokenizer +
                             " --threads 2 --prompt 'the cat sat' --prompt 'a dog' ";
  const Tokenizer tokenizer(kTokenizer);
  for (const std::string name : {"ar", "md"}) {
    const std::string flags = "--plan " + plan(name) + " --max-new-tokens 6 --temperature 0.8 --seed 3 ";
    const ToolResult result = runTool(common + flags + "--json");
    ASSERT_EQ(result.exitCode, 0) << result.output;
    const std::vector<nlohmann::json> lines = jsonLines(result.output);
    ASSERT_EQ(lines.size(), 2u) << result.output;
    std::unique_ptr<Session> session = open(name);
    PretrainedSampler sampler(*session);
    PretrainedSamplingOptions options;
    options.maxNewTokens = 6;
    options.temperature = 0.8;
    options.seed = 3;
    options.stopIds = {tokenizer.eosId()};
    const std::vector<std::string> prompts = {"the cat sat", "a dog"};
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<int32_t> ids = tokenizer.encode(prompts[i]);
      const std::vector<int64_t> prompt(ids.begin(), ids.end());  // no BOS: as preprocess encodes documents
      EXPECT_EQ(lines[i].at("prompt_tokens").get<std::vector<int64_t>>(), prompt);
      const PretrainedCompletion completion = sampler.complete(i, prompt, options, "prompt");
      EXPECT_EQ(lines[i].at("tokens").get<std::vector<int64_t>>(), completion.newTokens) << name << " prompt " << i;
      EXPECT_EQ(lines[i].at("text"), tokenizer.decode(tokensBeforeStop(completion.newTokens, options.stopIds)));
      EXPECT_EQ(lines[i].at("finish_reason"), pretrainedFinishName(completion.finish));
    }
    // The same run as text: the prompt followed by its completion, a line each.
    const ToolResult text = runTool(common + flags);
    ASSERT_EQ(text.exitCode, 0) << text.output;
    EXPECT_TRUE(contains(text, "the cat sat" + lines[0].at("text").get<std::string>() + "\n")) << text.output;
  }
}

// A pre-training run's checkpoint (which has no self-conditioning block: the step never reads it)
// loads into the inference plan of its objective, and `sample` completes from it; an SFT plan,
// whose decoder reads that block, refuses it by name.
TEST_F(PretrainedSamplerTest, SamplesFromAPretrainingRunsCheckpoint) {
  const std::string corpus = plan("corpus.jsonl");
  {
    std::ofstream out(corpus);
    for (int d = 0; d < 60; ++d) out << "{\"text\": \"the cat sat on the mat " << d % 7 << "\"}\n";
  }
  const std::string run = std::string(DGEMMA_RUN) + " ";
  for (const std::string& command : {
           run + "preprocess --input " + corpus + " --tokenizer " + kTokenizer + " --output-prefix " + plan("corpus"),
           std::string(DGEMMA_COMPILE) + " --model " + kTinyModel +
               " --mode train --objective autoregressive --seq-len 32 --micro-batch 2 -o " + plan("ar-train"),
           run + "train --plan " + plan("ar-train") + " --init random --data-path " + plan("corpus") +
               " --split 1,0,0 --steps 2 --lr 1e-3 --tokenizer " + kTokenizer + " --save-dir " + plan("ar-run"),
       }) {
    const ToolResult result = runTool(command);
    ASSERT_EQ(result.exitCode, 0) << command << "\n" << result.output;
  }
  const std::string checkpoint = plan("ar-run") + "/step-00000002";
  const ToolResult sampled = runTool(run + "sample --plan " + plan("ar") + " --weights " + checkpoint +
                                     " --prompt 'the cat' --max-new-tokens 4 --json");
  ASSERT_EQ(sampled.exitCode, 0) << sampled.output;
  ASSERT_EQ(jsonLines(sampled.output).size(), 1u) << sampled.output;
  EXPECT_EQ(jsonLines(sampled.output)[0].at("tokens").size(), 4u);
  const ToolResult refused = runTool(run + "generate --plan " + plan("sft") + " --weights " + checkpoint +
                                     " --tokenizer " + kTokenizer + " --prompt 'the cat'");
  EXPECT_EQ(refused.exitCode, 2) << refused.output;
  EXPECT_TRUE(contains(refused, "missing tensor model.decoder.self_conditioning.gate_proj.weight")) << refused.output;
}

TEST_F(PretrainedSamplerTest, SampleCommandLocatesItsErrors) {
  const std::string common = std::string(DGEMMA_RUN) + " sample --init random --tokenizer " + kTokenizer + " ";
  std::string longPrompt;
  for (int i = 0; i < 40; ++i) longPrompt += "the cat ";
  struct Case {
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {"--plan " + plan("ar") + " --prompt 'a dog' --prompt '" + longPrompt + "'",
       "--prompt 2: expected at most 31 tokens (one below the plan's largest seq_len 32"},
      {"--plan " + plan("md") + " --prompt 'a dog' --max-new-tokens 31",
       "mask tokens (--max-new-tokens): expected at most the plan's largest seq_len 32 in all"},
      {"--plan " + plan("sft") + " --prompt 'a dog'",
       "has no \"logits\" entry: it is a block-diffusion inference plan"},
      {"--plan " + plan("ar") + " --prompt 'a dog' --steps 4", "--steps: only for a masked-diffusion plan"},
      {"--plan " + plan("ar") + " --prompt ''", "--prompt 1: expected a prompt of at least one token, got none"},
  };
  for (const Case& c : cases) {
    const ToolResult result = runTool(common + c.flags);
    EXPECT_EQ(result.exitCode, 2) << c.flags << "\n" << result.output;
    EXPECT_TRUE(contains(result, c.message)) << c.flags << "\n" << result.output;
    EXPECT_FALSE(contains(result, "sampled ")) << "nothing runs before every prompt is checked";
  }
}

}  // namespace
}  // namespace dgemma
