#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "runtime/kernel_api/Backend.h"
#include "support/Error.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/WeightLoader.h"
#include "runtime/io/Safetensors.h"
#include "runtime/quant/Quantize.h"

namespace dgemma {
namespace {

struct ParameterSpec {
  std::string name;
  std::vector<int64_t> globalShape, shardOffset, shardShape;
  nlohmann::json init;
  DType dtype = DType::F32;
};

// A plan with parameters only (no entry points): what the loaders see.
Plan parameterPlan(const std::vector<ParameterSpec>& specs) {
  Plan plan;
  plan.producer = "test";
  plan.arenas = {{"persistent", true, 0, 64}, {"scratch", false, 0, 64}};
  for (const ParameterSpec& spec : specs) {
    Buffer buffer{static_cast<int64_t>(plan.buffers.size()), spec.name,    spec.dtype,  spec.shardShape, 0,
                  (plan.arenas[0].bytes + 63) / 64 * 64,     std::nullopt, std::nullopt};
    plan.arenas[0].bytes = buffer.offset + buffer.bytes();
    plan.buffers.push_back(buffer);
    Parameter parameter;
    parameter.name = spec.name;
    parameter.buffer = buffer.id;
    parameter.globalShape = spec.globalShape;
    parameter.shardOffset = spec.shardOffset;
    parameter.shardShape = spec.shardShape;
    parameter.init = spec.init;
    plan.parameters.push_back(parameter);
  }
  return plan;
}

HostTensor iota(DType dtype, std::vector<int64_t> shape) {
  HostTensor f32(DType::F32, std::move(shape));
  for (int64_t i = 0; i < f32.numElements(); ++i) f32.as<float>()[i] = static_cast<float>(i);
  return convertDType(f32, dtype, "iota");
}

class WeightLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() /
          ("dgemma-weights-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  std::string write(const std::vector<std::pair<std::string, HostTensor>>& tensors) {
    std::vector<std::pair<std::string, const HostTensor*>> refs;
    for (const auto& [name, tensor] : tensors) refs.push_back({name, &tensor});
    std::string path = (dir / "model.safetensors").string();
    writeSafetensors(path, refs);
    return path;
  }

  std::filesystem::path dir;
  std::unique_ptr<Backend> backend = createBackend("cpu", 1);
  CommunicatorSet communicators;
};

TEST_F(WeightLoaderTest, LoadsConvertsAndSlicesShards) {
  Plan plan = parameterPlan({{"a", {2, 3}, {0, 0}, {2, 3}, {}}, {"c", {4, 6}, {2, 3}, {2, 3}, {}}});
  write({{"a", iota(DType::BF16, {2, 3})}, {"c", iota(DType::F32, {4, 6})}});
  Executor executor(plan, *backend, communicators, "p");
  loadWeights(executor, dir.string());
  HostTensor a = executor.parameter("a");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.as<float>()[i], i);
  HostTensor c = executor.parameter("c");  // rows 2..3, columns 3..5 of the 4x6 iota
  std::vector<float> expected = {15, 16, 17, 21, 22, 23};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(c.as<float>()[i], expected[i]) << i;
}

TEST_F(WeightLoaderTest, ListsEveryProblemInOneError) {
  Plan plan = parameterPlan({{"a", {2, 3}, {0, 0}, {2, 3}, {}}, {"b", {4}, {0}, {4}, {}}});
  std::string path = write({{"a", iota(DType::F32, {3, 2})}, {"d", iota(DType::F32, {1})}});
  Executor executor(plan, *backend, communicators, "p");
  try {
    loadWeights(executor, path);
    FAIL();
  } catch (const InputError& error) {
    std::string message = error.what();
    EXPECT_NE(message.find(path + ": 3 problem(s) with the weights:"), std::string::npos) << message;
    EXPECT_NE(message.find("tensor a: expected shape [2,3], found [3,2]"), std::string::npos) << message;
    EXPECT_NE(message.find("missing tensor b [4]"), std::string::npos) << message;
    EXPECT_NE(message.find("unexpected tensor d"), std::string::npos) << message;
  }
}

TEST_F(WeightLoaderTest, RandomInitFollowsTheSpecAndIsDeterministic) {
  nlohmann::json normal = {{"kind", "normal"}, {"std", 0.02}};
  Plan plan = parameterPlan({{"w", {128, 128}, {0, 0}, {128, 128}, normal}, {"g", {16}, {0}, {16}, {{"kind", "ones"}}}});
  Executor first(plan, *backend, communicators, "p"), second(plan, *backend, communicators, "p");
  initializeWeights(first, 7);
  initializeWeights(second, 7);
  HostTensor w = first.parameter("w");
  EXPECT_EQ(w.data, second.parameter("w").data);
  double sum = 0, squares = 0;
  for (int64_t i = 0; i < w.numElements(); ++i) {
    sum += w.as<float>()[i];
    squares += double(w.as<float>()[i]) * w.as<float>()[i];
  }
  double mean = sum / w.numElements(), stddev = std::sqrt(squares / w.numElements() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(stddev, 0.02, 0.0005);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(first.parameter("g").as<float>()[i], 1.0f);

  initializeWeights(second, 8);
  EXPECT_NE(w.data, second.parameter("w").data);
}

TEST_F(WeightLoaderTest, RandomInitOfAShardIsTheSliceOfTheGlobalDraw) {
  nlohmann::json normal = {{"kind", "normal"}, {"std", 1.0}};
  Plan whole = parameterPlan({{"w", {4, 6}, {0, 0}, {4, 6}, normal}});
  Plan shard = parameterPlan({{"w", {4, 6}, {1, 2}, {2, 3}, normal}});
  Executor wholeExecutor(whole, *backend, communicators, "p"), shardExecutor(shard, *backend, communicators, "p");
  initializeWeights(wholeExecutor, 3);
  initializeWeights(shardExecutor, 3);
  HostTensor all = wholeExecutor.parameter("w"), part = shardExecutor.parameter("w");
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(part.as<float>()[r * 3 + c], all.as<float>()[(r + 1) * 6 + c + 2]);
}

// A padded vocabulary's embedding (docs/parallelism.md, "Vocabulary padding"): the checkpoint holds the 5 real
// rows of the plan's 8; the shard straddling row 5 gets rows 4 and then zeros, the one past it zeros alone,
// and random init draws the unpadded tensor's rows and zeros after them.
TEST_F(WeightLoaderTest, PaddingRowsLoadAndDrawAsZeros) {
  const nlohmann::json init = {{"kind", "normal"}, {"std", 1.0}, {"logical_rows", 5}};
  Plan straddling = parameterPlan({{"e", {8, 3}, {4, 0}, {4, 3}, init}});
  Plan pastTheEnd = parameterPlan({{"e", {8, 3}, {6, 0}, {2, 3}, init}});
  write({{"e", iota(DType::BF16, {5, 3})}});
  Executor straddlingExecutor(straddling, *backend, communicators, "p");
  Executor pastTheEndExecutor(pastTheEnd, *backend, communicators, "p");
  loadWeights(straddlingExecutor, dir.string());
  loadWeights(pastTheEndExecutor, dir.string());
  const std::vector<float> expected = {12, 13, 14, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  HostTensor e = straddlingExecutor.parameter("e");
  for (int i = 0; i < 12; ++i) EXPECT_EQ(e.as<float>()[i], expected[i]) << i;
  HostTensor past = pastTheEndExecutor.parameter("e");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(past.as<float>()[i], 0.0f) << i;

  // A tensor of the padded shape is not the checkpoint's: it is named with the real shape.
  write({{"e", iota(DType::F32, {8, 3})}});
  try {
    loadWeights(straddlingExecutor, dir.string());
    FAIL();
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("expected shape [5,3], found [8,3]"), std::string::npos) << error.what();
  }

  Plan padded = parameterPlan({{"e", {8, 3}, {0, 0}, {8, 3}, init}});
  Plan unpadded = parameterPlan({{"e", {5, 3}, {0, 0}, {5, 3}, {{"kind", "normal"}, {"std", 1.0}}}});
  Executor paddedExecutor(padded, *backend, communicators, "p"),
      unpaddedExecutor(unpadded, *backend, communicators, "p");
  initializeWeights(paddedExecutor, 3);
  initializeWeights(unpaddedExecutor, 3);
  HostTensor drawn = paddedExecutor.parameter("e"), real = unpaddedExecutor.parameter("e");
  for (int i = 0; i < 15; ++i) EXPECT_EQ(drawn.as<float>()[i], real.as<float>()[i]) << i;
  for (int i = 15; i < 24; ++i) EXPECT_EQ(drawn.as<float>()[i], 0.0f) << i;
}

// An adapter plan's base checkpoint lacks the adapters: the parameters the caller fills elsewhere are
// neither looked up nor touched, and every other missing tensor is still an error.
TEST_F(WeightLoaderTest, ParametersFilledElsewhereMayBeAbsentAndAreLeftAlone) {
  Plan plan =
      parameterPlan({{"w", {2, 3}, {0, 0}, {2, 3}, {}}, {"w.lora_A", {4}, {0}, {4}, {}}, {"b", {2}, {0}, {2}, {}}});
  const std::string path = write({{"w", iota(DType::F32, {2, 3})}, {"b", iota(DType::F32, {2})}});
  const SafetensorsDirectory weights = SafetensorsDirectory::open(path);
  auto locate = [&](const std::string& name) { return weights.find(name); };
  auto adapters = [](const Parameter& parameter) { return parameter.name == "w.lora_A"; };
  Executor executor(plan, *backend, communicators, "p");
  HostTensor sevens(DType::F32, {4});
  std::fill(sevens.as<float>(), sevens.as<float>() + 4, 7.0f);
  executor.setParameter("w.lora_A", sevens);
  loadMappedWeights(executor, path, locate, {}, adapters);
  EXPECT_EQ(executor.parameter("w.lora_A").data, sevens.data);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(executor.parameter("w").as<float>()[i], i);

  Plan wider =
      parameterPlan({{"w", {2, 3}, {0, 0}, {2, 3}, {}}, {"w.lora_A", {4}, {0}, {4}, {}}, {"c", {2}, {0}, {2}, {}}});
  Executor other(wider, *backend, communicators, "p");
  try {
    loadMappedWeights(other, path, locate, {}, adapters);
    FAIL() << "no error for the missing tensor c";
  } catch (const InputError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("1 problem(s)"), std::string::npos) << message;
    EXPECT_NE(message.find("missing tensor c [2]"), std::string::npos) << message;
  }
}

// A LoRA A's init (docs/training.md, "LoRA adapters"): U(-b, b), every element inside the bound,
// mean 0 and variance b^2/3, deterministic per seed, and a shard the slice of the global draw.
TEST_F(WeightLoaderTest, UniformInitDrawsInsideTheBoundAndShardsLikeTheGlobalDraw) {
  const double bound = 0.125;
  nlohmann::json uniform = {{"kind", "uniform"}, {"bound", bound}};
  Plan whole = parameterPlan({{"a", {64, 67}, {0, 0}, {64, 67}, uniform}, {"b", {5}, {0}, {5}, {{"kind", "ones"}}}});
  Plan shard = parameterPlan({{"a", {64, 67}, {3, 5}, {7, 9}, uniform}});
  Executor first(whole, *backend, communicators, "p"), again(whole, *backend, communicators, "p"),
      part(shard, *backend, communicators, "p");
  initializeWeights(first, 11);
  initializeWeights(again, 11);
  initializeWeights(part, 11);
  const HostTensor a = first.parameter("a");
  EXPECT_EQ(a.data, again.parameter("a").data);
  double sum = 0, squares = 0;
  for (int64_t i = 0; i < a.numElements(); ++i) {
    const double value = a.as<float>()[i];
    ASSERT_LE(std::abs(value), bound) << "element " << i;
    sum += value;
    squares += value * value;
  }
  const double mean = sum / a.numElements(), variance = squares / a.numElements() - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.005);
  EXPECT_NEAR(variance, bound * bound / 3.0, 0.0005);
  const HostTensor box = part.parameter("a");
  for (int r = 0; r < 7; ++r)
    for (int c = 0; c < 9; ++c) EXPECT_EQ(box.as<float>()[r * 9 + c], a.as<float>()[(r + 3) * 67 + c + 5]);

  // Only the parameters the filter accepts are drawn; the others keep their contents.
  Executor some(whole, *backend, communicators, "p");
  HostTensor sevens(DType::F32, {5});
  std::fill(sevens.as<float>(), sevens.as<float>() + 5, 7.0f);
  some.setParameter("b", sevens);
  initializeWeights(some, 11, [](const Parameter& parameter) { return parameter.name == "a"; });
  EXPECT_EQ(some.parameter("a").data, a.data);
  EXPECT_EQ(some.parameter("b").data, sevens.data);
}

nlohmann::json quantizedInit(const char* format, const char* part, const std::vector<int64_t>& shape,
                             nlohmann::json base = nullptr) {
  nlohmann::json init = {{"kind", "quantized"}, {"format", format}, {"part", part}, {"weight", "w"}, {"shape", shape}};
  if (!base.is_null()) init["base"] = std::move(base);
  return init;
}

HostTensor randomTensor(DType dtype, std::vector<int64_t> shape, float scale) {
  HostTensor f32(DType::F32, std::move(shape));
  for (int64_t i = 0; i < f32.numElements(); ++i)
    f32.as<float>()[i] = scale * std::sin(0.37f * static_cast<float>(i * i + 1));
  return convertDType(f32, dtype, "random");
}

// The frozen base's codes and scales are the quantized checkpoint tensor, cut to this rank's box.
TEST_F(WeightLoaderTest, QuantizesAFloatCheckpointTensorAtLoadAndCutsTheShard) {
  const HostTensor weight = randomTensor(DType::BF16, {4, 128}, 0.1f);
  const quant::QuantizedTensor nf4 = quant::quantize(weight, quant::Format::Nf4, "w");
  Plan plan = parameterPlan({{"w", {4, 64}, {2, 0}, {2, 64}, quantizedInit("nf4", "codes", {4, 128}), DType::U8},
                             {"w.absmax", {4, 2}, {2, 0}, {2, 2}, quantizedInit("nf4", "absmax", {4, 128})}});
  write({{"w", weight}});
  Executor executor(plan, *backend, communicators, "p");
  loadWeights(executor, dir.string());
  const HostTensor codes = executor.parameter("w"), absmax = executor.parameter("w.absmax");
  ASSERT_EQ(codes.dtype, DType::U8);
  EXPECT_EQ(codes.data, std::vector<uint8_t>(nf4.codes.data.begin() + 2 * 64, nf4.codes.data.end()));
  EXPECT_EQ(absmax.data, std::vector<uint8_t>(nf4.scales.data.begin() + 2 * 2 * 4, nf4.scales.data.end()));
}

TEST_F(WeightLoaderTest, ReadsTheCodesOfAQuantizedCheckpointAsTheyAre) {
  const quant::QuantizedTensor int8 = quant::quantize(randomTensor(DType::F32, {3, 5}, 2.0f), quant::Format::Int8, "w");
  Plan plan = parameterPlan({{"w", {3, 5}, {0, 0}, {3, 5}, quantizedInit("int8", "codes", {3, 5}), DType::I8},
                             {"w.scale", {3}, {0}, {3}, quantizedInit("int8", "scale", {3, 5})}});
  write({{"w", int8.codes}, {"w.scale", int8.scales}});
  Executor executor(plan, *backend, communicators, "p");
  loadWeights(executor, dir.string());
  EXPECT_EQ(executor.parameter("w").data, int8.codes.data);
  EXPECT_EQ(executor.parameter("w.scale").data, int8.scales.data);
}

TEST_F(WeightLoaderTest, AQuantizedWeightMissingFromTheCheckpointIsNamedOnce) {
  Plan plan = parameterPlan({{"w", {2, 32}, {0, 0}, {2, 32}, quantizedInit("nf4", "codes", {2, 64}), DType::U8},
                             {"w.absmax", {2, 1}, {0, 0}, {2, 1}, quantizedInit("nf4", "absmax", {2, 64})}});
  const std::string path = write({{"other", iota(DType::F32, {1})}});
  Executor executor(plan, *backend, communicators, "p");
  try {
    loadWeights(executor, path);
    FAIL();
  } catch (const InputError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("2 problem(s)"), std::string::npos) << message;  // the weight once, "other" once
    EXPECT_NE(message.find("missing tensor w [2,64] (stored as nf4)"), std::string::npos) << message;
  }
}

// --init random draws the weight under its own name and quantizes it: the same weights as an f32 base.
TEST_F(WeightLoaderTest, RandomInitOfAQuantizedWeightQuantizesTheWeightsOwnDraw) {
  const nlohmann::json normal = {{"kind", "normal"}, {"std", 0.02}};
  Plan f32 = parameterPlan({{"w", {2, 64}, {0, 0}, {2, 64}, normal}});
  Plan nf4 = parameterPlan({{"w", {2, 32}, {0, 0}, {2, 32}, quantizedInit("nf4", "codes", {2, 64}, normal), DType::U8},
                            {"w.absmax", {2, 1}, {0, 0}, {2, 1}, quantizedInit("nf4", "absmax", {2, 64}, normal)}});
  Executor f32Executor(f32, *backend, communicators, "p"), nf4Executor(nf4, *backend, communicators, "p");
  initializeWeights(f32Executor, 5);
  initializeWeights(nf4Executor, 5);
  const quant::QuantizedTensor expected = quant::quantize(f32Executor.parameter("w"), quant::Format::Nf4, "w");
  EXPECT_EQ(nf4Executor.parameter("w").data, expected.codes.data);
  EXPECT_EQ(nf4Executor.parameter("w.absmax").data, expected.scales.data);
}

// A plan edited by hand (hash recomputed) can hold any JSON as init: a wrong type was a bare
// nlohmann type_error ("internal error"); it names the parameter and the field.
TEST_F(WeightLoaderTest, WrongTypedInitSpecsNameTheParameterAndField) {
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {{{"kind", "normal"}, {"std", "0.02"}}, "--plan: parameter w: init.std: expected a number, got \"0.02\""},
      {{{"kind", 3}}, "--plan: parameter w: init.kind: expected a string, got 3"},
      {nlohmann::json::array({1, 2}), "--plan: parameter w: init: expected an object, got an array of 2 elements"},
      {{{"kind", "xavier"}},
       "--plan: parameter w: init.kind: expected \"normal\", \"uniform\", \"ones\" or \"zeros\", got \"xavier\""},
      {{{"kind", "uniform"}}, "--plan: parameter w: init.bound: required for kind \"uniform\""},
      {{{"kind", "uniform"}, {"bound", -1.0}},
       "--plan: parameter w: init.bound: expected a finite number >= 0, got -1.0"},
  };
  for (const auto& [init, message] : cases) {
    Plan plan = parameterPlan({{"w", {2}, {0}, {2}, init}});
    Executor executor(plan, *backend, communicators, "p");
    try {
      initializeWeights(executor, 1);
      ADD_FAILURE() << "no error for " << message;
    } catch (const InputError& error) {
      EXPECT_EQ(std::string(error.what()), message);
    }
  }
}

}  // namespace
}  // namespace dgemma
