// The built-in rms_norm -> matmul -> softmax graph through the whole system, against a plain C++
// reference in double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ToolRunner.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

using testing::runTool;
using testing::ScratchDirectory;

constexpr int64_t kBatch = 2, kHidden = 16, kVocab = 24;
constexpr double kEps = 1e-6;

HostTensor randomTensor(std::vector<int64_t> shape, std::mt19937& rng, double scale, double offset = 0) {
  HostTensor tensor(DType::F32, std::move(shape));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < tensor.numElements(); ++i) tensor.as<float>()[i] = static_cast<float>(offset + scale * normal(rng));
  return tensor;
}

struct Weights {
  std::vector<double> norm;        // [H]
  std::vector<double> projection;  // [H, V]
};

// probs[b, s, :] = softmax(rms_norm(x[b, s, :]) * norm . projection), all in double.
std::vector<double> referenceProbs(const HostTensor& x, const Weights& w, int64_t rows) {
  std::vector<double> probs(rows * kVocab);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x.as<float>() + r * kHidden;
    double meanSquare = 0;
    for (int64_t h = 0; h < kHidden; ++h) meanSquare += double(row[h]) * row[h];
    double scale = 1.0 / std::sqrt(meanSquare / kHidden + kEps);
    std::vector<double> logits(kVocab, 0.0);
    for (int64_t h = 0; h < kHidden; ++h) {
      double normed = row[h] * scale * w.norm[h];
      for (int64_t v = 0; v < kVocab; ++v) logits[v] += normed * w.projection[h * kVocab + v];
    }
    double peak = *std::max_element(logits.begin(), logits.end()), total = 0;
    for (double& logit : logits) total += (logit = std::exp(logit - peak));
    for (int64_t v = 0; v < kVocab; ++v) probs[r * kVocab + v] = logits[v] / total;
  }
  return probs;
}

// loss = -sum(target * log(probs)) / rows.
double referenceLoss(const HostTensor& x, const HostTensor& target, const Weights& w, int64_t rows) {
  std::vector<double> probs = referenceProbs(x, w, rows);
  double loss = 0;
  for (int64_t i = 0; i < rows * kVocab; ++i) loss -= target.as<float>()[i] * std::log(probs[i]);
  return loss / rows;
}

std::vector<double> toDoubles(const HostTensor& tensor) {
  return std::vector<double>(tensor.as<float>(), tensor.as<float>() + tensor.numElements());
}

void writeTensors(const std::string& path, const std::vector<std::pair<std::string, const HostTensor*>>& tensors) {
  writeSafetensors(path, tensors);
}

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(1234);
    norm = randomTensor({kHidden}, rng, 0.1, 1.0);
    projection = randomTensor({kHidden, kVocab}, rng, 0.3);
    writeTensors(dir / "weights.safetensors", {{"norm.weight", &norm}, {"proj.weight", &projection}});
    weights = {toDoubles(norm), toDoubles(projection)};
  }

  std::string compile(const std::string& mode, const std::string& lengths) {
    std::string command = std::string(DGEMMA_COMPILE) + " --model builtin:rmsnorm-matmul-softmax --mode " + mode +
                          " --micro-batch " + std::to_string(kBatch) + " --prompt-len " + lengths + " --hidden-size " +
                          std::to_string(kHidden) + " --vocab-size " + std::to_string(kVocab) + " -o " + (dir / "plan");
    testing::ToolResult result = runTool(command);
    EXPECT_EQ(result.exitCode, 0) << result.output;
    return dir / "plan";
  }

  ScratchDirectory dir;
  HostTensor norm, projection;
  Weights weights;
};

TEST_F(PipelineTest, ForwardMatchesReferenceForEveryBucket) {
  std::string plan = compile("infer", "5,8");
  std::mt19937 rng(99);
  for (int64_t length : {5, 8}) {
    HostTensor x = randomTensor({kBatch, length, kHidden}, rng, 1.0);
    std::string batch = dir / ("batch" + std::to_string(length) + ".safetensors");
    std::string out = dir / ("out" + std::to_string(length) + ".safetensors");
    writeTensors(batch, {{"x", &x}});
    testing::ToolResult result = runTool(std::string(DGEMMA_RUN) + " forward --plan " + plan + " --weights " + (dir / "weights.safetensors") +
                                         " --input " + batch + " --out " + out + " --threads 2");
    ASSERT_EQ(result.exitCode, 0) << result.output;

    HostTensor probs = SafetensorsFile::open(out).read("probs");
    ASSERT_EQ(probs.shape, (std::vector<int64_t>{kBatch, length, kVocab}));
    std::vector<double> expected = referenceProbs(x, weights, kBatch * length);
    double maxError = 0, maxValue = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      maxError = std::max(maxError, std::abs(probs.as<float>()[i] - expected[i]));
      maxValue = std::max(maxValue, std::abs(expected[i]));
    }
    EXPECT_LE(maxError / maxValue, 1e-5) << "prompt_len " << length;
  }
}

TEST_F(PipelineTest, GradientsMatchFiniteDifferences) {
  std::string plan = compile("train", "6");
  constexpr int64_t kLength = 6, kRows = kBatch * kLength;
  std::mt19937 rng(5);
  HostTensor x = randomTensor({kBatch, kLength, kHidden}, rng, 1.0);
  HostTensor target(DType::F32, {kBatch, kLength, kVocab});  // one-hot targets
  std::uniform_int_distribution<int> token(0, kVocab - 1);
  for (int64_t r = 0; r < kRows; ++r) target.as<float>()[r * kVocab + token(rng)] = 1.0f;
  std::string batch = dir / "batch.safetensors", out = dir / "grads.safetensors";
  writeTensors(batch, {{"x", &x}, {"target", &target}});
  testing::ToolResult result = runTool(std::string(DGEMMA_RUN) + " grad --plan " + plan + " --weights " + (dir / "weights.safetensors") +
                                       " --input " + batch + " --out " + out);
  ASSERT_EQ(result.exitCode, 0) << result.output;

  SafetensorsFile grads = SafetensorsFile::open(out);
  HostTensor loss = grads.read("loss");
  ASSERT_EQ(loss.shape, std::vector<int64_t>{1});
  double expectedLoss = referenceLoss(x, target, weights, kRows);
  EXPECT_NEAR(loss.as<float>()[0], expectedLoss, 1e-6 * std::abs(expectedLoss));

  // Central differences of the double-precision reference, per parameter element.
  auto check = [&](const std::string& name, std::vector<double>& parameter) {
    HostTensor gradient = grads.read(name);
    ASSERT_EQ(static_cast<size_t>(gradient.numElements()), parameter.size()) << name;
    double errorSquares = 0, referenceSquares = 0;
    for (size_t i = 0; i < parameter.size(); ++i) {
      const double original = parameter[i], step = 1e-6;
      parameter[i] = original + step;
      double up = referenceLoss(x, target, weights, kRows);
      parameter[i] = original - step;
      double down = referenceLoss(x, target, weights, kRows);
      parameter[i] = original;
      double numeric = (up - down) / (2 * step);
      errorSquares += std::pow(gradient.as<float>()[i] - numeric, 2);
      referenceSquares += numeric * numeric;
    }
    EXPECT_GT(referenceSquares, 0) << name;
    EXPECT_LE(std::sqrt(errorSquares / referenceSquares), 1e-5) << name;
  };
  check("proj.weight", weights.projection);
  check("norm.weight", weights.norm);
}

TEST_F(PipelineTest, RandomInitRunsWithoutWeights) {
  std::string plan = compile("infer", "4");
  std::mt19937 rng(1);
  HostTensor x = randomTensor({kBatch, 4, kHidden}, rng, 1.0);
  writeTensors(dir / "batch.safetensors", {{"x", &x}});
  std::string base = std::string(DGEMMA_RUN) + " forward --plan " + plan + " --init random --input " + (dir / "batch.safetensors");
  ASSERT_EQ(runTool(base + " --seed 3 --out " + (dir / "a.safetensors")).exitCode, 0);
  ASSERT_EQ(runTool(base + " --seed 3 --out " + (dir / "b.safetensors")).exitCode, 0);
  HostTensor a = SafetensorsFile::open(dir / "a.safetensors").read("probs");
  HostTensor b = SafetensorsFile::open(dir / "b.safetensors").read("probs");
  EXPECT_EQ(a.data, b.data);  // same seed, same numbers
  double rowSum = 0;
  for (int64_t v = 0; v < kVocab; ++v) rowSum += a.as<float>()[v];
  EXPECT_NEAR(rowSum, 1.0, 1e-6);
}

}  // namespace
}  // namespace dgemma
