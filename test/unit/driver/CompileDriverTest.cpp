// The compiler driver in-process (compiler/Driver): options -> the module built for the built-in
// graph and the tiny DiffusionGemma config, the checks of options against the model that live in
// the library, the preset defaults the tool applies, and a whole compile writing its plan.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "compiler/Driver/CompileOptions.h"
#include "compiler/Driver/Driver.h"
#include "compiler/Driver/ModelBuild.h"
#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/IR/DgOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "plan/PlanFile.h"
#include "support/Error.h"

namespace dgemma {
namespace {

const std::string kTinyConfig = std::string(DGEMMA_SOURCE_DIR) + "/models/diffusion_gemma/configs/tiny-cpu.json";

// The InputError message `action` throws, or a failure when it throws nothing or something else.
template <typename Action>
std::string inputErrorMessage(Action&& action) {
  try {
    action();
  } catch (const InputError& error) {
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected an InputError, got: " << error.what();
    return "";
  }
  ADD_FAILURE() << "expected an InputError, nothing was thrown";
  return "";
}

std::vector<std::string> entryNames(mlir::ModuleOp module) {
  std::vector<std::string> names;
  for (auto function : module.getOps<mlir::func::FuncOp>())
    if (auto entry = function->getAttrOfType<mlir::StringAttr>(mlir::dg::kEntryAttr)) names.push_back(entry.str());
  return names;
}

struct Built {
  mlir::OwningOpRef<mlir::ModuleOp> module;
  RuntimeFields fields;
  nlohmann::json metadata = nlohmann::json::object();
};

Built build(mlir::MLIRContext& context, const CompileOptions& options) {
  Built built;
  built.module = buildModel(context, options, built.fields, built.metadata);
  return built;
}

TEST(CompileDriverTest, BuiltinModelIsBuiltForEachPromptBucket) {
  mlir::MLIRContext context;
  CompileOptions options;
  options.model = builtinModelName();
  options.mode = "infer";
  options.promptLengths = "8,4,8";
  Built built = build(context, options);
  ASSERT_TRUE(built.module);
  EXPECT_EQ(entryNames(*built.module).size(), 2u);  // the buckets 4 and 8
  EXPECT_EQ(built.fields.family, ModelFamily::Builtin);
  EXPECT_EQ(built.fields.modelHiddenSize(), 0);
}

TEST(CompileDriverTest, TinyConfigTrainModuleCarriesTheConfigAndLayout) {
  mlir::MLIRContext context;
  CompileOptions options;
  options.model = kTinyConfig;
  options.mode = "train";
  options.microBatch = 1;
  Built built = build(context, options);
  ASSERT_TRUE(built.module);
  EXPECT_FALSE(entryNames(*built.module).empty());
  EXPECT_EQ(built.fields.family, ModelFamily::DiffusionGemma);
  EXPECT_GT(built.fields.modelHiddenSize(), 0);
  ASSERT_TRUE(built.fields.bucketPadding);
  EXPECT_EQ(built.metadata["layout"]["tp"], 1);
  EXPECT_EQ(built.metadata["objective"]["variant"], "base-sft");
}

TEST(CompileDriverTest, OptionsThatDoNotFitTheModelAreInputErrors) {
  mlir::MLIRContext context;
  CompileOptions options;
  options.model = kTinyConfig;
  options.mode = "train";
  options.tp = 3;
  EXPECT_NE(inputErrorMessage([&] { build(context, options); }).find("--tp 3"), std::string::npos);

  CompileOptions builtin;
  builtin.model = builtinModelName();
  builtin.mode = "train";
  builtin.dp = 2;
  EXPECT_NE(inputErrorMessage([&] { build(context, builtin); }).find("has no parallel mapping"), std::string::npos);

  CompileOptions missing;
  missing.model = "/nonexistent/config.json";
  missing.mode = "train";
  EXPECT_NE(
      inputErrorMessage([&] { build(context, missing); }).find("--model: /nonexistent/config.json does not exist"),
      std::string::npos);
}

TEST(CompileDriverTest, PromptLengthsAreSortedBucketsInRange) {
  EXPECT_EQ(parsePromptLengths("16,4,16,8"), (std::vector<int64_t>{4, 8, 16}));
  EXPECT_NE(inputErrorMessage([] { parsePromptLengths("4,x"); }).find("--prompt-len: expected integers"),
            std::string::npos);
  EXPECT_NE(inputErrorMessage([] { parsePromptLengths("0"); }).find("--prompt-len"), std::string::npos);
}

TEST(CompileDriverTest, PresetFlagsAreCommandLineText) {
  const auto flags = presetCompileFlags("tiny-cpu");
  EXPECT_FALSE(flags.empty());
  for (const auto& [flag, value] : flags) {
    EXPECT_NE(flag.rfind("--", 0), 0u) << flag;  // the name without the leading --
    EXPECT_FALSE(value.empty()) << flag;
  }
  EXPECT_NE(inputErrorMessage([] { presetCompileFlags("no-such-preset"); }).find("no-such-preset"), std::string::npos);
}

TEST(CompileDriverTest, CompileWritesThePlanFile) {
  std::string pattern = (std::filesystem::temp_directory_path() / "dgemma-driver-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::filesystem::path output = std::filesystem::path(pattern) / "plan";
  CompileOptions options;
  options.model = builtinModelName();
  options.mode = "train";
  options.promptLengths = "4";
  options.hiddenSize = 8;
  options.vocabSize = 16;
  options.output = output.string();
  compile(options);
  const Plan plan = readPlanFile(planFileForRank(output.string(), 0));
  EXPECT_EQ(plan.producer, "dgemma-compile");
  EXPECT_EQ(plan.metadata["mode"], "train");
  EXPECT_FALSE(plan.entryPoints.empty());
  std::filesystem::remove_all(pattern);
}

TEST(CompileDriverTest, LoraFlagsResolveToAdapterOptions) {
  CompileOptions options;
  options.mode = "train";
  EXPECT_FALSE(loraOptions(options).has_value());
  options.lora = "16";
  options.loraTargets = "attention,router,up_proj";
  std::optional<mlir::dg::LoraOptions> lora = loraOptions(options);
  ASSERT_TRUE(lora.has_value());
  EXPECT_EQ(lora->rank, 16);
  EXPECT_EQ(lora->alpha, 16.0);  // ALPHA defaults to RANK
  EXPECT_EQ(lora->targets,
            (std::vector<std::string>{"k_proj", "o_proj", "q_proj", "router.proj", "up_proj", "v_proj"}));
  EXPECT_FALSE(lora->dropoutKeys.empty());  // the train steps draw dropout masks
  options.lora = "4:32";
  EXPECT_EQ(loraOptions(options)->alpha, 32.0);
  options.mode = "infer";
  EXPECT_TRUE(loraOptions(options)->dropoutEntries.empty());  // inference runs the adapters whole

  for (const char* bad : {"0", "x", "4:", "4:0", "4:-1", "2.5", "4:1e7", "99999999"})
    EXPECT_NE(inputErrorMessage([&] {
                CompileOptions trial = options;
                trial.lora = bad;
                loraOptions(trial);
              }).find("--lora: expected RANK or RANK:ALPHA"),
              std::string::npos)
        << bad;
  options.lora = "4";
  options.loraTargets = "attention,lm_head";
  EXPECT_NE(inputErrorMessage([&] { loraOptions(options); }).find("--lora-targets: unknown target 'lm_head'"),
            std::string::npos);
  CompileOptions withoutLora;
  withoutLora.loraDropout = 0.1;
  EXPECT_EQ(inputErrorMessage([&] { loraOptions(withoutLora); }), "--lora-dropout: only with --lora RANK");
}

// --base-dtype int8 under --lora: the frozen attention and MLP weights become i8 codes and f32 row scales
// filled by quantizing the checkpoint at load, the embedding and norms bf16, the adapters f32 and
// trainable; the plan's adapter record names the format.
TEST(CompileDriverTest, ALowPrecisionBaseStoresTheFrozenWeightsPacked) {
  std::string pattern = (std::filesystem::temp_directory_path() / "dgemma-driver-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  const std::filesystem::path output = std::filesystem::path(pattern) / "plan";
  CompileOptions options;
  options.model = kTinyConfig;
  options.mode = "train";
  options.lora = "4";
  options.loraTargets = "attention,mlp";
  options.baseDtype = "int8";
  options.output = output.string();
  compile(options);
  const Plan plan = readPlanFile(planFileForRank(output.string(), 0));
  ASSERT_TRUE(plan.adapter.has_value());
  EXPECT_EQ(plan.adapter->baseDtype, "int8");
  std::map<std::string, const Parameter*> parameters;
  for (const Parameter& parameter : plan.parameters) parameters[parameter.name] = &parameter;
  auto dtypeOf = [&](const std::string& name) {
    const auto found = parameters.find(name);
    return found == parameters.end() ? std::string("absent")
                                     : std::string(dtypeName(plan.buffers[found->second->buffer].dtype));
  };
  const std::string q = "model.decoder.layers.0.self_attn.q_proj.weight";
  EXPECT_EQ(dtypeOf(q), "i8");
  EXPECT_EQ(dtypeOf(q + ".scale"), "f32");
  ASSERT_TRUE(parameters.count(q + ".scale"));
  EXPECT_EQ(parameters[q + ".scale"]->init["kind"], "quantized");
  EXPECT_EQ(parameters[q + ".scale"]->init["weight"], q);
  EXPECT_EQ(parameters[q + ".scale"]->globalShape, std::vector<int64_t>{parameters[q]->globalShape[0]});
  EXPECT_FALSE(parameters[q]->trainable);
  EXPECT_EQ(dtypeOf("model.decoder.layers.0.self_attn.q_proj.lora_A.weight"), "f32");
  EXPECT_TRUE(parameters["model.decoder.layers.0.self_attn.q_proj.lora_A.weight"]->trainable);
  EXPECT_EQ(dtypeOf("model.decoder.embed_tokens.weight"), "bf16");
  EXPECT_FALSE(parameters.count("grad/" + q));
  EXPECT_FALSE(parameters.count("optimizer/exp_avg/" + q));
  bool decodes = false;
  for (const EntryPoint& entry : plan.entryPoints)
    for (const Step& step : entry.steps)
      decodes = decodes || (step.op == "dequantize" && step.attrs["format"] == "int8");
  EXPECT_TRUE(decodes);
  std::filesystem::remove_all(pattern);

  CompileOptions withoutLora;
  withoutLora.model = kTinyConfig;
  withoutLora.baseDtype = "nf4";
  withoutLora.output = output.string();
  EXPECT_NE(inputErrorMessage([&] { compile(withoutLora); }).find("--base-dtype nf4: needs --lora"), std::string::npos);
}

TEST(CompileDriverTest, CompileNeedsAnOutputOrAStageToEmit) {
  CompileOptions options;
  options.model = builtinModelName();
  options.mode = "train";
  EXPECT_EQ(inputErrorMessage([&] { compile(options); }), "-o: an output plan directory is required (or --emit)");
}

}  // namespace
}  // namespace dgemma
