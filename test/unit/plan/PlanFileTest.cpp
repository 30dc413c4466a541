#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "PlanFixtures.h"
#include "support/Error.h"
#include "support/AtomicFile.h"
#include "plan/PlanFile.h"

namespace dgemma {
namespace {

using testing::smallPlan;

// Builds a container around arbitrary header text, independently of serializePlan, so that the
// tests check the documented layout rather than the writer's own idea of it.
std::string container(const std::string& header, const std::string& sections = "", uint32_t version = kPlanFormatVersion,
                      uint32_t flags = 0, uint64_t reserved = 0) {
  size_t sectionsStart = (48 + header.size() + 63) / 64 * 64;
  std::string out(sectionsStart + sections.size(), '\0');
  std::memcpy(out.data(), "DGEMMAPL", 8);
  auto put = [&](size_t at, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out[at + i] = static_cast<char>((value >> (8 * i)) & 0xff);
  };
  put(8, version, 4);
  put(12, flags, 4);
  put(16, header.size(), 8);
  put(24, sections.size(), 8);
  std::memcpy(out.data() + 48, header.data(), header.size());
  std::memcpy(out.data() + sectionsStart, sections.data(), sections.size());
  put(32, XXH3_64bits(out.data() + 48, out.size() - 48), 8);
  put(40, reserved, 8);
  return out;
}

std::string headerOf(const Plan& plan) {
  nlohmann::json header = planToJson(plan);
  header["sections"] = nlohmann::json::array();
  for (const BinarySection& section : plan.sections) header["sections"].push_back({{"name", section.name}, {"offset", 0}, {"bytes", section.data.size()}});
  return header.dump();
}

std::string errorOf(const std::string& bytes) {
  try {
    deserializePlan(bytes, "plan.dgplan");
  } catch (const InputError& error) {
    EXPECT_EQ(error.exitCode(), 2);
    return error.what();
  }
  ADD_FAILURE() << "plan was accepted";
  return "";
}

TEST(PlanFile, RoundTripsEveryField) {
  Plan plan = smallPlan();
  plan.mesh = {{"dp", 1, 0}};
  plan.metadata = {{"model", "toy"}};
  plan.modelFamily = ModelFamily::DiffusionGemma;
  plan.modelConfig = {{"model_type", "toy"}};
  plan.modelGenerationConfig = {{"t_min", 0.4}, {"sampler_config", nullptr}};
  // Names no input or output of the entry: its axis has nothing to check against here.
  plan.bucketPadding = BucketPadding{"prompt_len", 1, {{"ids", 7}}, {"logits"}};
  plan.runDefaults = RunDefaults{"toy-preset", {{"lr", 0.5}, {"steps", 3}}};
  plan.generation = GenerationSettings{4, 9, 14, 7, 0.25, 0.3, 0.9, 2, 0.01, {1, 106}, 3};
  plan.sections.push_back({"constants", {1, 2, 3, 4, 5}});
  plan.entryPoints[0].numStreams = 2;
  plan.entryPoints[0].numEvents = 1;
  plan.entryPoints[0].steps[0].stream = 1;
  plan.entryPoints[0].steps[0].signalEvents = {0};
  plan.entryPoints[0].steps[0].attrs = {{"eps", 1e-6}, {"perm", {1, 0}}};
  plan.entryPoints[0].inputs[0].globalShape = {8};
  plan.entryPoints[0].inputs[0].shardOffset = {4};
  std::string bytes = serializePlan(plan);
  Plan back = deserializePlan(bytes, "plan.dgplan");
  EXPECT_EQ(planToJson(back), planToJson(plan));
  ASSERT_EQ(back.sections.size(), 1u);
  EXPECT_EQ(back.sections[0].data, plan.sections[0].data);
  EXPECT_EQ(serializePlan(back), bytes);  // deterministic
}

TEST(PlanFile, ReadsAnInputWithoutABoxAsWhole) {
  Plan plan = deserializePlan(serializePlan(smallPlan()), "plan.dgplan");
  EXPECT_TRUE(plan.entryPoints[0].inputs[0].isWhole());
  EXPECT_FALSE(planToJson(plan)["entry_points"][0]["inputs"][0].contains("global_shape"));
}

TEST(PlanFile, RejectsAHalfWrittenBox) {
  nlohmann::json header = nlohmann::json::parse(headerOf(smallPlan()));
  header["entry_points"][0]["outputs"][0]["global_shape"] = {8};
  EXPECT_EQ(errorOf(container(header.dump())), "plan.dgplan: entry_points[0].outputs[0].shard_offset: missing");
}

TEST(PlanFile, MatchesTheDocumentedLayout) {
  Plan plan = smallPlan();
  EXPECT_EQ(serializePlan(plan), container(headerOf(plan)));
}

TEST(PlanFile, RejectsTruncatedPreamble) {
  EXPECT_EQ(errorOf(serializePlan(smallPlan()).substr(0, 20)),
            "plan.dgplan: truncated: 20 bytes, a plan file has at least 48");
}

TEST(PlanFile, RejectsTruncatedBody) {
  std::string bytes = serializePlan(smallPlan());
  EXPECT_NE(errorOf(bytes.substr(0, bytes.size() - 1)).find("truncated or extended"), std::string::npos);
  EXPECT_NE(errorOf(bytes + "x").find("truncated or extended"), std::string::npos);
}

TEST(PlanFile, RejectsForeignFiles) {
  std::string bytes = serializePlan(smallPlan());
  bytes[0] = 'X';
  EXPECT_EQ(errorOf(bytes), "plan.dgplan: not a dgemma plan file (bad magic)");
}

TEST(PlanFile, RejectsOtherVersionsBeforeCheckingTheHash) {
  std::string bytes = serializePlan(smallPlan());
  bytes[8] = 3;
  EXPECT_NE(errorOf(bytes).find("plan format version 3 is not supported (this dgemma reads version 2)"), std::string::npos);
}

TEST(PlanFile, TellsAVersionOneFileToRecompile) {
  std::string bytes = serializePlan(smallPlan());
  bytes[8] = 1;
  EXPECT_EQ(errorOf(bytes), "plan.dgplan: plan format version 1 is no longer read; recompile with dgemma-compile");
  nlohmann::json header = nlohmann::json::parse(headerOf(smallPlan()));
  header["version"] = 1;
  EXPECT_EQ(errorOf(container(header.dump())),
            "plan.dgplan: version: plan format version 1 is no longer read; recompile with dgemma-compile");
}

TEST(PlanFile, NamesTheFieldOfABadBehaviourField) {
  const nlohmann::json good = nlohmann::json::parse(headerOf(smallPlan()));
  auto errorWith = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json header = good;
    edit(header);
    return errorOf(container(header.dump()));
  };
  EXPECT_EQ(errorWith([](nlohmann::json& h) { h.erase("model"); }), "plan.dgplan: model: missing");
  EXPECT_EQ(errorWith([](nlohmann::json& h) { h["model"]["family"] = "llama"; }),
            "plan.dgplan: model.family: expected \"builtin\" or \"diffusion_gemma\", got \"llama\"");
  EXPECT_EQ(errorWith([](nlohmann::json& h) { h["model"] = {{"family", "diffusion_gemma"}}; }),
            "plan.dgplan: model.config: missing (a DiffusionGemma plan carries its config.json)");
  EXPECT_EQ(errorWith([](nlohmann::json& h) { h["model"]["generation_config"] = "gen.json"; }),
            "plan.dgplan: model.generation_config: expected an object (the model's generation_config.json)");
  nlohmann::json padding = {{"dimension", "prompt_len"}, {"axis", 1}, {"inputs", {{"x", 0}}}, {"output_prefixes", {"y"}}};
  EXPECT_EQ(errorWith([&](nlohmann::json& h) { h["bucket_padding"] = padding; h["bucket_padding"]["inputs"]["x"] = "zero"; }),
            "plan.dgplan: bucket_padding.inputs.x: expected an integer, got \"zero\"");
  EXPECT_EQ(errorWith([&](nlohmann::json& h) { h["bucket_padding"] = padding; h["bucket_padding"].erase("output_prefixes"); }),
            "plan.dgplan: bucket_padding.output_prefixes: missing");
  EXPECT_EQ(errorWith([&](nlohmann::json& h) { h["bucket_padding"] = padding; h["bucket_padding"]["dimension"] = "canvas_len"; }),
            "plan.dgplan: bucket_padding.dimension: \"canvas_len\" is no entry point's bucket dimension");
  nlohmann::json adam = {{"kind", "adamw"}, {"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}, {"weight_decay", 0.1},
                         {"max_grad_norm", 1.0}};
  EXPECT_EQ(errorWith([&](nlohmann::json& h) { h["optimizer"] = adam; h["optimizer"]["beta2"] = 1.0; }),
            "plan.dgplan: optimizer.beta2: expected a value in [0, 1), got 1.0");
  EXPECT_EQ(errorWith([&](nlohmann::json& h) { h["optimizer"] = adam; h["optimizer"].erase("eps"); }),
            "plan.dgplan: optimizer.eps: missing");
  EXPECT_EQ(errorWith([](nlohmann::json& h) { h["run_defaults"] = {{"preset", "p"}, {"train", 3}}; }),
            "plan.dgplan: run_defaults.train: expected an object");
  Plan withGeneration = smallPlan();
  withGeneration.generation = GenerationSettings{4, 8, 12};
  withGeneration.generation->eosTokenIds = {1};
  const nlohmann::json generation = planToJson(withGeneration)["generation"];
  auto generationError = [&](const std::function<void(nlohmann::json&)>& edit) {
    return errorWith([&](nlohmann::json& h) { h["generation"] = generation; edit(h["generation"]); });
  };
  EXPECT_EQ(generationError([](nlohmann::json& g) { g["canvas_length"] = 0; }),
            "plan.dgplan: generation.canvas_length: expected a positive integer, got 0");
  EXPECT_EQ(generationError([](nlohmann::json& g) { g.erase("cache_length"); }), "plan.dgplan: generation.cache_length: missing");
  EXPECT_EQ(generationError([](nlohmann::json& g) { g["t_max"] = 0.4; }),
            "plan.dgplan: generation.t_max: expected a number above t_min 0.4, got 0.4");
  EXPECT_EQ(generationError([](nlohmann::json& g) { g["entropy_bound"] = 0; }),
            "plan.dgplan: generation.entropy_bound: expected a positive number, got 0.0");
  EXPECT_EQ(generationError([](nlohmann::json& g) { g["eos_token_ids"] = {1, -2}; }),
            "plan.dgplan: generation.eos_token_ids[1]: expected a non-negative token id, got -2");
  EXPECT_EQ(generationError([](nlohmann::json& g) { g["eos_token_ids"] = 1; }),
            "plan.dgplan: generation.eos_token_ids: expected an array of integers");
}

TEST(PlanFile, RejectsEditedContent) {
  std::string bytes = serializePlan(smallPlan());
  size_t at = bytes.find("\"add\"");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1] = 'b';  // "bdd": an edit that keeps the JSON valid
  EXPECT_NE(errorOf(bytes).find("content hash mismatch"), std::string::npos);
}

TEST(PlanFile, RejectsInvalidJsonWithValidHash) {
  EXPECT_NE(errorOf(container("{\"format\": ")).find("plan.dgplan: header: invalid JSON"), std::string::npos);
}

TEST(PlanFile, NamesTheFieldOfASchemaError) {
  nlohmann::json header = nlohmann::json::parse(headerOf(smallPlan()));
  header["buffers"][1]["dtype"] = "f8";
  EXPECT_EQ(errorOf(container(header.dump())), "plan.dgplan: buffers[1].dtype: unknown dtype \"f8\"");
  header = nlohmann::json::parse(headerOf(smallPlan()));
  header["entry_points"][0]["steps"][0].erase("inputs");
  EXPECT_EQ(errorOf(container(header.dump())), "plan.dgplan: entry_points[0].steps[0].inputs: missing");
  header = nlohmann::json::parse(headerOf(smallPlan()));
  header["arenas"][0]["bytes"] = "many";
  EXPECT_EQ(errorOf(container(header.dump())), "plan.dgplan: arenas[0].bytes: expected an integer, got \"many\"");
}

TEST(PlanFile, RejectsOutOfRangeOffsets) {
  nlohmann::json header = nlohmann::json::parse(headerOf(smallPlan()));
  header["buffers"][2]["offset"] = 128;
  EXPECT_EQ(errorOf(container(header.dump())),
            "plan.dgplan: buffers[2].offset: 128 + 16 bytes exceeds arena \"scratch\" of 128 bytes");
}

TEST(PlanFile, RejectsSectionsOutsideTheFile) {
  nlohmann::json header = nlohmann::json::parse(headerOf(smallPlan()));
  header["sections"] = {{{"name", "constants"}, {"offset", 0}, {"bytes", 100}}};
  EXPECT_EQ(errorOf(container(header.dump(), std::string(8, '\0'))), "plan.dgplan: sections[0]: range leaves the section area");
}

TEST(PlanFile, WritesAtomicallyAndReadsBack) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / ("dgemma-plan-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string path = planFileForRank(dir.string(), 0);
  EXPECT_EQ(path, dir.string() + "/rank-0.dgplan");
  writePlanFile(smallPlan(), path);
  EXPECT_EQ(planToJson(readPlanFile(path)), planToJson(smallPlan()));
  size_t files = std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator());
  EXPECT_EQ(files, 1u);  // no temporary left behind
  std::filesystem::remove_all(dir);
}

TEST(PlanFile, MissingFileIsAnInputError) {
  try {
    readPlanFile("/nonexistent/rank-0.dgplan");
    FAIL();
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent/rank-0.dgplan: cannot read"), std::string::npos);
  }
}

TEST(PlanFile, EntryKeysAndBucketSelection) {
  Plan plan = smallPlan();
  EntryPoint longer = plan.entryPoints[0];
  longer.bucket = {{"prompt_len", 16}};
  plan.entryPoints.push_back(longer);
  EXPECT_EQ(plan.entryPoints[0].key(), "forward[prompt_len=4]");
  EXPECT_EQ(plan.selectEntry("forward", {{"prompt_len", 3}}), &plan.entryPoints[0]);
  EXPECT_EQ(plan.selectEntry("forward", {{"prompt_len", 5}}), &plan.entryPoints[1]);
  EXPECT_EQ(plan.selectEntry("forward", {{"prompt_len", 17}}), nullptr);
  EXPECT_EQ(plan.selectEntry("train_step", {{"prompt_len", 1}}), nullptr);
}

// Issue 15: the hash covers only the header and sections, so a plan with a correct hash and a
// non-zero preamble flags or reserved field was accepted.
TEST(PlanFile, RejectsNonZeroFlagsAndReservedFields) {
  const std::string header = headerOf(smallPlan());
  EXPECT_EQ(errorOf(container(header, "", kPlanFormatVersion, 1)), "plan.dgplan: preamble flags (byte 12): expected 0, got 1");
  EXPECT_EQ(errorOf(container(header, "", kPlanFormatVersion, 0, 7)),
            "plan.dgplan: preamble reserved field (byte 40): expected 0, got 7");
}

TEST(PlanFile, RefusesADeepHeaderWhileReadingIt) {
  nlohmann::json header = nlohmann::json::parse(headerOf(smallPlan()));
  std::string text = header.dump();
  text.pop_back();
  text += ",\"metadata\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_EQ(errorOf(container(text)).rfind("plan.dgplan: header: JSON nested deeper than 64 levels", 0), 0u);
}

// Issue 15: bucket_padding.axis was checked against the rank but not for sign; the runtime pads and
// crops every bucketed input and output along it, so the validator checks it against them all.
TEST(PlanFile, BucketPaddingAxisMustExistInEveryPaddedTensor) {
  const nlohmann::json good = nlohmann::json::parse(headerOf(smallPlan()));
  auto errorWithAxis = [&](const nlohmann::json& axis) {
    nlohmann::json header = good;
    header["bucket_padding"] = {{"dimension", "prompt_len"}, {"axis", axis}, {"inputs", {{"x", 0}}}, {"output_prefixes", {"y"}}};
    return errorOf(container(header.dump()));
  };
  EXPECT_EQ(errorWithAxis(-1), "plan.dgplan: bucket_padding.axis: expected a non-negative integer, got -1");
  EXPECT_EQ(errorWithAxis(UINT64_MAX), "plan.dgplan: bucket_padding.axis: expected an integer below 2^63, got 18446744073709551615");
  EXPECT_EQ(errorWithAxis(1), "plan.dgplan: bucket_padding.axis: 1: entry_points[0].inputs[0] (\"x\", shape [4]) has no axis 1 "
                              "of the bucket's prompt_len 4");
  EXPECT_NO_THROW(deserializePlan(
      [&] {
        nlohmann::json header = good;
        header["bucket_padding"] = {{"dimension", "prompt_len"}, {"axis", 0}, {"inputs", {{"x", 0}}}, {"output_prefixes", {"y"}}};
        return container(header.dump());
      }(),
      "plan.dgplan"));
}

TEST(PlanFile, RejectsUnknownFieldsAndOutOfRangeNumbers) {
  const nlohmann::json good = nlohmann::json::parse(headerOf(smallPlan()));
  auto errorWith = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json header = good;
    edit(header);
    return errorOf(container(header.dump()));
  };
  EXPECT_EQ(errorWith([](nlohmann::json& h) { h["flags"] = 1; }),
            "plan.dgplan: \"flags\": unknown field (not written by any dgemma-compile of format version 2)");
  EXPECT_EQ(errorWith([](nlohmann::json& h) { h["version"] = (uint64_t{1} << 32) + 2; }),
            "plan.dgplan: version: plan format version 4294967298 is not supported (this dgemma reads version 2); "
            "recompile the plan with this dgemma-compile");
  // Shapes whose element count or byte size overflows, or exceeds what one tensor may hold.
  EXPECT_EQ(errorWith([](nlohmann::json& h) { h["buffers"][1]["shape"] = {int64_t{1} << 62, int64_t{1} << 62}; }),
            "plan.dgplan: buffers[1].shape: [4611686018427387904,4611686018427387904] holds more than 1.0 TiB (the bound "
            "on one tensor), or a negative dimension");
  EXPECT_EQ(errorWith([](nlohmann::json& h) {
              h["parameters"][0]["global_shape"] = {INT64_MAX};
              h["parameters"][0]["shard_offset"] = {INT64_MAX - 1};
            }),
            "plan.dgplan: parameters[0].global_shape: [9223372036854775807] holds more than 1.0 TiB (the bound on one "
            "tensor), or a negative dimension");
  EXPECT_EQ(errorWith([](nlohmann::json& h) {
              h["parameters"][0]["global_shape"] = {8};
              h["parameters"][0]["shard_offset"] = {INT64_MAX};
            }),
            "plan.dgplan: parameters[0].shard_offset: the shard box leaves the global shape in dimension 0");
  EXPECT_EQ(errorWith([](nlohmann::json& h) {
              h["world_size"] = 1;
              h["mesh"] = {{{"name", "a"}, {"size", 1 << 20}, {"coord", 0}}, {{"name", "b"}, {"size", 1 << 20}, {"coord", 0}}};
            }),
            "plan.dgplan: mesh: axis sizes multiply to more than 1048576 ranks");
  EXPECT_EQ(errorWith([](nlohmann::json& h) { h["entry_points"][0]["events"] = int64_t{1} << 40; }),
            "plan.dgplan: entry_points[0].events: expected an integer in [0, 16777216], got 1099511627776");
  EXPECT_EQ(errorWith([](nlohmann::json& h) { h["run_defaults"] = {{"preset", "p"}, {"train", {{"steps", {1, 2}}}}}; }),
            "plan.dgplan: run_defaults.train.steps: expected a string, number or boolean, got an array of 2 elements");
}

// Issue 15: an init std of -1 or 1e308 was accepted (and a wrong-typed init was an internal error).
TEST(PlanFile, ValidatesParameterInits) {
  const nlohmann::json good = nlohmann::json::parse(headerOf(smallPlan()));
  auto errorWithInit = [&](const nlohmann::json& init) {
    nlohmann::json header = good;
    header["parameters"][0]["init"] = init;
    return errorOf(container(header.dump()));
  };
  EXPECT_EQ(errorWithInit({{"kind", "normal"}, {"std", -1}}),
            "plan.dgplan: parameters[0].init.std: expected a number in (0, 1.0], got -1");
  EXPECT_EQ(errorWithInit({{"kind", "normal"}, {"std", 1e308}}),
            "plan.dgplan: parameters[0].init.std: expected a number in (0, 1.0], got 1e+308");
  EXPECT_EQ(errorWithInit({{"kind", "normal"}, {"std", "wide"}}), "plan.dgplan: parameters[0].init.std: expected a number");
  EXPECT_EQ(errorWithInit({{"kind", 3}}), "plan.dgplan: parameters[0].init.kind: expected a string");
  EXPECT_EQ(errorWithInit({{"kind", "uniform"}}), "plan.dgplan: parameters[0].init.bound: missing");
  EXPECT_EQ(errorWithInit({{"kind", "laplace"}}),
            "plan.dgplan: parameters[0].init.kind: expected \"normal\", \"uniform\", \"ones\" or \"zeros\", got "
            "\"laplace\"");
  // A quantized frozen weight's part (docs/plan-format.md, "Header").
  const nlohmann::json codes = {
      {"kind", "quantized"}, {"format", "nf4"}, {"part", "codes"}, {"weight", "w"}, {"shape", {4, 64}}};
  nlohmann::json wrongPart = codes;
  wrongPart["part"] = "scale";
  EXPECT_EQ(errorWithInit(wrongPart),
            "plan.dgplan: parameters[0].init.part: expected \"codes\" or \"absmax\", got \"scale\"");
  nlohmann::json badBase = codes;
  badBase["base"] = {{"kind", "normal"}, {"std", -1}};
  EXPECT_EQ(errorWithInit(badBase), "plan.dgplan: parameters[0].init.base.std: expected a number in (0, 1.0], got -1");
  EXPECT_EQ(errorWithInit({{"kind", "ones"}, {"std", 0.1}}),
            "plan.dgplan: parameters[0].init.std: unknown field (init ones takes kind and optionally logical_rows)");
  // A padded vocabulary's real rows (docs/parallelism.md, "Vocabulary padding").
  EXPECT_EQ(errorWithInit({{"kind", "zeros"}, {"logical_rows", 0}}),
            "plan.dgplan: parameters[0].init.logical_rows: expected a positive row count");
  EXPECT_EQ(errorWithInit("normal"), "plan.dgplan: parameters[0].init: expected an object");
}

}  // namespace
}  // namespace dgemma
