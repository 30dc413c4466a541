// readTrainPlan on hand-built plans: which parameters are the model, the optimizer state and the
// gradient buffers, and the messages for plans the trainer cannot run (compiled before gradients
// were device buffers). mockSplit: the smoke-test items fit the plan.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "runtime/train/TrainData.h"
#include "runtime/train/TrainPlan.h"
#include "support/Error.h"

namespace dgemma {
namespace {

nlohmann::json tinyConfig() {
  std::ifstream in(std::string(DGEMMA_SOURCE_DIR) + "/models/diffusion_gemma/configs/tiny-cpu.json");
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

// The entry points and parameters of a training plan, without steps: readTrainPlan reads names,
// buckets and parameter lists only.
class TrainPlanTest : public ::testing::Test {
 protected:
  TrainPlanTest() {
    plan_.modelFamily = ModelFamily::DiffusionGemma;
    plan_.modelConfig = tinyConfig();
    plan_.optimizer = OptimizerSettings{};
    addEntry("corrupt", {{"micro_batch", 2}, {"canvas_len", 16}}, {}, {});
    for (int64_t length : {48, 32})
      addEntry("train_step", {{"micro_batch", 2}, {"canvas_len", 16}, {"prompt_len", length}}, {},
               {"loss", "diffusion_loss", "encoder_loss"});
    addEntry("optimizer_step", {}, {"lr", "bias_correction1", "bias_correction2", "gradient_scale"}, {"grad_norm"});
    addEntry("gradient_check", {}, {}, {"nonfinite/grad/w"});
    addEntry("zero_gradients", {}, {}, {});
    for (const char* name : {"w", "optimizer/exp_avg/w", "grad/w", "optimizer/exp_avg_sq/w", "norm"}) {
      Parameter parameter;
      parameter.name = name;
      plan_.parameters.push_back(parameter);
    }
  }

  void addEntry(const std::string& name, std::map<std::string, int64_t> bucket, const std::vector<std::string>& inputs,
                const std::vector<std::string>& outputs) {
    EntryPoint entry;
    entry.name = name;
    entry.bucket = std::move(bucket);
    for (const std::string& input : inputs) entry.inputs.push_back({input, 0});
    for (const std::string& output : outputs) entry.outputs.push_back({output, 0});
    plan_.entryPoints.push_back(std::move(entry));
  }

  EntryPoint& entry(const std::string& name) {
    for (EntryPoint& candidate : plan_.entryPoints)
      if (candidate.name == name) return candidate;
    throw std::logic_error("no entry " + name);
  }

  std::string errorOf() {
    try {
      readTrainPlan(plan_, "p.dgplan");
    } catch (const InputError& error) {
      return error.what();
    }
    ADD_FAILURE() << "the plan was accepted";
    return "";
  }

  Plan plan_;
};

TEST_F(TrainPlanTest, SortsParametersIntoModelOptimizerStateAndGradientBuffers) {
  const TrainPlan trainPlan = readTrainPlan(plan_, "p.dgplan");
  EXPECT_EQ(trainPlan.modelParameters, (std::vector<std::string>{"w", "norm"}));
  EXPECT_EQ(trainPlan.optimizerParameters, (std::vector<std::string>{"optimizer/exp_avg/w", "optimizer/exp_avg_sq/w"}));
  EXPECT_EQ(trainPlan.gradients, (std::vector<std::string>{"grad/w"}));
  EXPECT_EQ(trainPlan.promptLengths, (std::vector<int64_t>{32, 48}));
  EXPECT_EQ(plan_.entryPoints[trainPlan.gradientCheck].name, "gradient_check");
  EXPECT_EQ(plan_.entryPoints[trainPlan.zeroGradients].name, "zero_gradients");
  EXPECT_TRUE(trainPlan.hasEncoderLoss);
  EXPECT_EQ(trainPlan.microBatch, 2);
  EXPECT_EQ(trainPlan.canvasLength, 16);
}

TEST_F(TrainPlanTest, TellsAPlanWithHostGradientsToRecompile) {
  entry("optimizer_step").inputs.push_back({"grad/w", 0});
  EXPECT_EQ(errorOf(),
            "p.dgplan: entry optimizer_step takes the gradient grad/w as an input (compiled before gradients were device "
            "buffers); recompile the plan with dgemma-compile");
}

TEST_F(TrainPlanTest, NamesAMissingGradientEntryOrOutput) {
  entry("gradient_check").outputs.clear();
  EXPECT_EQ(errorOf(), "p.dgplan: entry gradient_check: missing output nonfinite/grad/w");
  entry("zero_gradients").name = "something_else";
  EXPECT_EQ(errorOf(),
            "p.dgplan: no \"zero_gradients\" entry point (compiled before gradients were device buffers; recompile the plan)");
}

// Two ranks of a TP = 2 plan and the one-rank plan of the same model agree on the identity a
// checkpoint records; a different optimizer setting or global shape does not.
TEST_F(TrainPlanTest, CheckpointIdentityLeavesOutTheLayout) {
  plan_.metadata = {{"precision", "bf16"}, {"objective", {{"variant", "uniform"}}}, {"tp", 1}};
  plan_.buffers.push_back({0, "w", DType::F32, {8, 4}, 0, 0, std::nullopt, std::nullopt});
  for (Parameter& parameter : plan_.parameters) {
    parameter.globalShape = {8, 4};
    parameter.shardOffset = {0, 0};
    parameter.shardShape = {8, 4};
  }
  const nlohmann::json identity = checkpointIdentity(plan_, readTrainPlan(plan_, "p.dgplan"));
  EXPECT_EQ(identity["precision"], "bf16");
  EXPECT_EQ(identity["objective"], (nlohmann::json{{"variant", "uniform"}}));
  EXPECT_EQ(identity["parameters"]["w"], (nlohmann::json{{"shape", {8, 4}}, {"dtype", "f32"}}));
  EXPECT_TRUE(identity["parameters"].contains("optimizer/exp_avg/w"));
  EXPECT_FALSE(identity["parameters"].contains("grad/w"));  // never saved
  EXPECT_EQ(identity["optimizer"]["beta2"], OptimizerSettings{}.beta2);

  Plan rank1 = plan_;
  rank1.rank = 1;
  rank1.worldSize = 2;
  rank1.mesh = {{"tp", 2, 1}};
  rank1.metadata["tp"] = 2;
  rank1.buffers[0].shape = {4, 4};
  for (Parameter& parameter : rank1.parameters) {
    parameter.shardOffset = {4, 0};
    parameter.shardShape = {4, 4};
  }
  EXPECT_EQ(checkpointIdentity(rank1, readTrainPlan(rank1, "p.dgplan")), identity);

  Plan otherRecipe = plan_;
  otherRecipe.optimizer->beta2 = 0.95;
  EXPECT_NE(checkpointIdentity(otherRecipe, readTrainPlan(otherRecipe, "p.dgplan"))["optimizer"], identity["optimizer"]);
  Plan otherModel = plan_;
  otherModel.parameters[0].globalShape = {16, 4};
  EXPECT_NE(checkpointIdentity(otherModel, readTrainPlan(otherModel, "p.dgplan"))["parameters"], identity["parameters"]);
}

// An input holding the rows [first, first + count) of a global [2, width] batch field, its buffer new.
void addRowsInput(Plan& plan, EntryPoint& entry, const std::string& name, int64_t width, int64_t first, int64_t count,
                  int64_t column = 0) {
  const int64_t id = static_cast<int64_t>(plan.buffers.size());
  plan.buffers.push_back({id, name, DType::I64, {count, width - column}, 0, 0, std::nullopt, std::nullopt});
  NamedBuffer input(name, id);
  input.globalShape = {2, width};
  input.shardOffset = {first, column};
  entry.inputs.push_back(input);
}

TEST_F(TrainPlanTest, TakesTheRowsOfARankFromItsBatchInputBoxes) {
  EXPECT_EQ(readTrainPlan(plan_, "p.dgplan").rankRows, (BatchRows{0, 2}));  // no box: every row
  addRowsInput(plan_, entry("corrupt"), "canvas_ids", 16, 1, 1);
  for (EntryPoint& step : plan_.entryPoints)
    if (step.name == "train_step") addRowsInput(plan_, step, "input_ids", step.bucket.at("prompt_len"), 1, 1);
  EXPECT_EQ(readTrainPlan(plan_, "p.dgplan").rankRows, (BatchRows{1, 1}));
}

TEST_F(TrainPlanTest, RefusesBatchInputsSplitOtherwiseThanByTheSameRows) {
  addRowsInput(plan_, entry("corrupt"), "canvas_ids", 16, 1, 1);
  const Plan rowsOfRank1 = plan_;
  addRowsInput(plan_, plan_.entryPoints[1], "input_ids", 48, 0, 1);
  EXPECT_EQ(errorOf(),
            "p.dgplan: entry train_step[canvas_len=16,micro_batch=2,prompt_len=48]: input input_ids: holds rows [0, 1), "
            "p.dgplan: entry corrupt[canvas_len=16,micro_batch=2]: input canvas_ids rows [1, 2) (every batch input of a "
            "rank holds the same rows)");
  plan_ = rowsOfRank1;
  addRowsInput(plan_, plan_.entryPoints[1], "input_ids", 48, 1, 1, 24);
  EXPECT_EQ(errorOf(),
            "p.dgplan: entry train_step[canvas_len=16,micro_batch=2,prompt_len=48]: input input_ids: split in dimension 1 (the "
            "trainer splits a batch between ranks by rows only)");
  plan_.entryPoints[1].inputs.back() = NamedBuffer("input_ids", 0);  // whole, beside a split one
  EXPECT_EQ(errorOf(),
            "p.dgplan: entry train_step[canvas_len=16,micro_batch=2,prompt_len=48]: input input_ids: whole, while p.dgplan: "
            "entry corrupt[canvas_len=16,micro_batch=2]: input canvas_ids holds rows [1, 2) (every batch input of a rank "
            "holds the same rows)");
}

TEST_F(TrainPlanTest, RejectsAPlanOfAnotherModelFamily) {
  plan_.modelFamily = ModelFamily::Builtin;
  EXPECT_EQ(errorOf(), "p.dgplan: not a DiffusionGemma plan (dgemma-run train needs dgemma-compile --model CONFIG --mode train)");
}

TEST(MockSplit, FillsOneCanvasBlockPerItemWithinTheBucketsAndVocabulary) {
  SplitOptions options;
  options.canvasLength = 16;
  options.maxEncoderLength = 24;
  options.vocabSize = 256;
  const Dataset dataset = mockSplit(options, /*bosId=*/2, /*eosId=*/1, /*seed=*/7);
  ASSERT_EQ(dataset.items.size(), static_cast<size_t>(kMockItems));
  for (const DatasetItem& item : dataset.items) {
    const BlockItem& block = item.block;
    EXPECT_EQ(block.block, 0) << block.where;
    ASSERT_EQ(block.inputIds.size(), 24u) << block.where;  // <bos> + 23 prompt tokens: the bucket's limit
    EXPECT_EQ(block.inputIds.front(), 2);
    ASSERT_EQ(block.canvasIds.size(), 16u) << block.where;
    EXPECT_EQ(block.canvasIds.back(), 1) << block.where;
    for (size_t i = 1; i < block.inputIds.size(); ++i) {
      EXPECT_GE(block.inputIds[i], 64);
      EXPECT_LT(block.inputIds[i], 256);
    }
  }
  // Four fixed answers: items 0 and 4 share theirs, items 0 and 1 do not.
  EXPECT_EQ(dataset.items[0].block.canvasIds, dataset.items[4].block.canvasIds);
  EXPECT_NE(dataset.items[0].block.canvasIds, dataset.items[1].block.canvasIds);
  EXPECT_NE(dataset.items[0].block.inputIds, dataset.items[4].block.inputIds);
}

}  // namespace
}  // namespace dgemma
