// runtime/kernels/cross_entropy/CrossEntropyMath.h, the arithmetic of the CUDA cross-entropy
// kernels, against the CPU kernel without a GPU: a host emulation of the kernels (each of a block's
// threads walking the columns j = t + n · threads, then the f64 block reductions, then the loss or
// the gradient per element) through the same functions gives the CPU kernel's loss and gradient, with
// and without the soft-cap and the bonus, up to the model's vocabulary of 262144.
#include <cmath>

#include "KernelTestSupport.h"
#include "runtime/kernels/cross_entropy/CrossEntropyMath.h"

namespace dgemma::test {
namespace {

using cross_entropy::IdTensor;
using cross_entropy::RowBonus;

struct Case {
  int64_t rows, vocabulary;
  double softcap;
  bool bonus;
  bool wideIds;
};

struct Inputs {
  std::vector<float> logits, bonus, gradOutput;
  std::vector<int64_t> targets, bonusIds;  // as int64; passed narrowed when !wideIds
};

Inputs randomInputs(const Case& c, uint32_t seed) {
  Inputs in;
  in.logits = randomValues<float>(c.rows * c.vocabulary, seed, -8.0, 8.0);
  in.bonus = randomValues<float>(c.rows, seed + 1, 0.0, 3.0);
  in.gradOutput = randomValues<float>(c.rows, seed + 2, -1.5, 1.5);
  std::mt19937 generator(seed + 3);
  for (int64_t r = 0; r < c.rows; ++r) {
    in.targets.push_back(generator() % c.vocabulary);
    // Every third row's bonus sits on its target.
    in.bonusIds.push_back(r % 3 == 0 ? in.targets.back() : static_cast<int64_t>(generator() % c.vocabulary));
    // A row whose target logit is the row's clear maximum, so that p is near 1 there.
    if (r % 4 == 1) in.logits[r * c.vocabulary + in.targets.back()] = 30.0f;
  }
  return in;
}

std::vector<int32_t> narrow(const std::vector<int64_t>& ids) { return std::vector<int32_t>(ids.begin(), ids.end()); }

void addInputs(KernelCall& call, const Case& c, const Inputs& in) {
  call.input(DType::F32, {c.rows, c.vocabulary}, in.logits);
  if (c.wideIds)
    call.input(DType::I64, {c.rows}, in.targets);
  else
    call.input(DType::I32, {c.rows}, narrow(in.targets));
  if (!c.bonus) return;
  if (c.wideIds)
    call.input(DType::I64, {c.rows}, in.bonusIds);
  else
    call.input(DType::I32, {c.rows}, narrow(in.bonusIds));
  call.input(DType::F32, {c.rows}, in.bonus);
}

// The kernels' pieces for one row, as a block of `threads` threads computes them.
struct EmulatedRow {
  const Case& c;
  const Inputs& in;
  int64_t r;
  int threads;

  RowBonus bonus() const { return c.bonus ? RowBonus{in.bonusIds[r], static_cast<double>(in.bonus[r])} : RowBonus{}; }
  double z(int64_t j, float* squashed = nullptr) const {
    float logit = in.logits[r * c.vocabulary + j];
    if (c.softcap > 0) {
      const float s = cross_entropy::squash(logit, static_cast<float>(c.softcap));
      if (squashed != nullptr) *squashed = s;
      logit = cross_entropy::cappedFromSquashed(s, static_cast<float>(c.softcap));
    }
    return cross_entropy::zOf(logit, j, bonus());
  }
  // Per-thread partials over the strided columns, then the block's combine.
  void statistics(double& maximum, double& sum) const {
    std::vector<double> partial(threads, -INFINITY);
    for (int t = 0; t < threads; ++t)
      for (int64_t j = t; j < c.vocabulary; j += threads) partial[t] = cross_entropy::combineMaximum(partial[t], z(j));
    maximum = -INFINITY;
    for (double p : partial) maximum = cross_entropy::combineMaximum(maximum, p);
    std::fill(partial.begin(), partial.end(), 0.0);
    for (int t = 0; t < threads; ++t)
      for (int64_t j = t; j < c.vocabulary; j += threads) partial[t] += cross_entropy::expTerm(z(j), maximum);
    // The warp butterflies, then the warps' results: a pairwise tree.
    for (int width = threads / 2; width > 0; width /= 2)
      for (int t = 0; t < width; ++t) partial[t] = cross_entropy::combineSum(partial[t], partial[t + width]);
    sum = partial[0];
  }
};

std::string describe(const Case& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.vocabulary) + " softcap " + std::to_string(c.softcap) +
         (c.bonus ? " bonus" : "") + (c.wideIds ? " i64" : " i32");
}

const std::vector<Case> kCases = {
    {6, 1000, 0.0, false, true}, {6, 1000, 0.0, true, false}, {6, 1000, 30.0, false, false},
    {6, 1000, 30.0, true, true}, {5, 7, 0.0, true, true},     {5, 7, 2.0, true, false},
    {3, 70001, 30.0, true, true}, {2, 262144, 30.0, true, true}, {2, 262144, 0.0, false, true},
};

int threadsFor(int64_t vocabulary) { return vocabulary >= 256 ? 256 : static_cast<int>((vocabulary + 31) / 32 * 32); }

TEST(CrossEntropyMath, BlockEmulationMatchesTheCpuLoss) {
  uint32_t seed = 40;
  for (const Case& c : kCases) {
    const Inputs in = randomInputs(c, seed += 10);
    KernelCall call("cross_entropy", {{"softcap", c.softcap}});
    addInputs(call, c, in);
    call.output(DType::F32, {c.rows});
    call.run();
    const std::vector<float> cpu = call.result<float>();
    for (int64_t r = 0; r < c.rows; ++r) {
      const EmulatedRow row{c, in, r, threadsFor(c.vocabulary)};
      double maximum, sum;
      row.statistics(maximum, sum);
      const float loss = static_cast<float>(cross_entropy::lossOf(maximum, sum, row.z(in.targets[r])));
      // libm's expf against the CPU kernel's fastExp (2 ulp), summed over V: ~1e-7 relative.
      EXPECT_NEAR(loss, cpu[r], 1e-6 * std::max(1.0f, std::fabs(cpu[r]))) << describe(c) << " row " << r;
    }
  }
}

TEST(CrossEntropyMath, BlockEmulationMatchesTheCpuGradient) {
  uint32_t seed = 140;
  for (const Case& c : kCases) {
    const Inputs in = randomInputs(c, seed += 10);
    KernelCall call("cross_entropy_backward", {{"softcap", c.softcap}});
    addInputs(call, c, in);
    call.input(DType::F32, {c.rows}, in.gradOutput);
    call.output(DType::F32, {c.rows, c.vocabulary});
    call.run();
    const std::vector<float> cpu = call.result<float>();
    for (int64_t r = 0; r < c.rows; ++r) {
      const EmulatedRow row{c, in, r, threadsFor(c.vocabulary)};
      double maximum, sum;
      row.statistics(maximum, sum);
      const double g = in.gradOutput[r];
      const int64_t target = in.targets[r];
      for (int64_t j = 0; j < c.vocabulary; ++j) {
        float squashed = 0.0f;
        const double z = row.z(j, &squashed);
        float gradient = j == target ? cross_entropy::targetGradientOf(g, z, maximum, sum)
                                     : cross_entropy::gradientOf(cross_entropy::expTerm(z, maximum), g / sum);
        if (c.softcap > 0) gradient = cross_entropy::throughCap(gradient, squashed);
        const float expected = cpu[r * c.vocabulary + j];
        // Relative to the element (an exp's 2 ulp and the sum's 1e-7), with a floor far below 1/V.
        ASSERT_NEAR(gradient, expected, 2e-6 * std::fabs(expected) + 1e-12)
            << describe(c) << " row " << r << " column " << j << (j == target ? " (target)" : "");
      }
    }
  }
}

TEST(CrossEntropyMath, IdsOfEitherWidthAndTheVocabularyBounds) {
  const std::vector<int32_t> narrowIds = {0, -1, 7};
  const std::vector<int64_t> wideIds = {int64_t{1} << 40, 6, -5};
  const IdTensor narrowTensor{narrowIds.data(), false}, wideTensor{wideIds.data(), true};
  EXPECT_EQ(narrowTensor[1], -1);
  EXPECT_EQ(wideTensor[0], int64_t{1} << 40);
  EXPECT_TRUE(cross_entropy::idInVocabulary(narrowTensor[0], 7));
  EXPECT_FALSE(cross_entropy::idInVocabulary(narrowTensor[1], 7));
  EXPECT_FALSE(cross_entropy::idInVocabulary(narrowTensor[2], 7));
  EXPECT_FALSE(cross_entropy::idInVocabulary(wideTensor[0], 7));
  EXPECT_TRUE(cross_entropy::idInVocabulary(wideTensor[1], 7));
  EXPECT_FALSE(cross_entropy::idInVocabulary(wideTensor[2], 7));
}

}  // namespace
}  // namespace dgemma::test
