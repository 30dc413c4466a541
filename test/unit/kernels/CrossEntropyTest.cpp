// cross_entropy and cross_entropy_backward against closed forms (uniform rows, a bonus of log 3) and a
// plain f64 reference written directly from the definition.
#include <cmath>

#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

// One position of the definition: z = logits (+ bonus at bonusId), ce = log Σ exp(z) − z[target],
// and its gradient g · (softmax(z) − onehot(target)).
struct Position {
  std::vector<double> z;
  int64_t target;

  double loss() const {
    double sum = 0;
    for (double value : z) sum += std::exp(value);
    return std::log(sum) - z[target];
  }
  std::vector<double> gradient(double g) const {
    double sum = 0;
    for (double value : z) sum += std::exp(value);
    std::vector<double> result;
    for (size_t j = 0; j < z.size(); ++j) result.push_back(g * (std::exp(z[j]) / sum - (static_cast<int64_t>(j) == target)));
    return result;
  }
};

std::vector<Position> positions(const std::vector<double>& logits, int64_t vocabulary, const std::vector<int64_t>& targets,
                                const std::vector<int64_t>& bonusIds = {}, const std::vector<double>& bonus = {}) {
  std::vector<Position> result;
  for (size_t r = 0; r < targets.size(); ++r) {
    Position position{std::vector<double>(logits.begin() + r * vocabulary, logits.begin() + (r + 1) * vocabulary), targets[r]};
    if (!bonus.empty()) position.z[bonusIds[r]] += bonus[r];
    result.push_back(std::move(position));
  }
  return result;
}

TEST(CrossEntropyKernel, UniformRowsAndALogThreeBonus) {
  // Four equal logits: ce = log 4. A bonus of log 3 on id 2 makes the exps 1, 1, 3, 1: ce = log 6 for
  // target 1 and log 6 − log 3 = log 2 for target 2, the bonused id.
  const double log3 = std::log(3.0);
  KernelCall plain("cross_entropy", {{"softcap", 0.0}});
  plain.input<double>(DType::F64, {1, 4}, {0, 0, 0, 0}).input<int64_t>(DType::I64, {1}, {1}).output(DType::F64, {1});
  plain.run();
  expectClose(plain.result<double>(), {std::log(4.0)}, 1e-15);

  KernelCall bonused("cross_entropy", {{"softcap", 0.0}});
  bonused.input<double>(DType::F64, {2, 4}, std::vector<double>(8, 0.0))
      .input<int64_t>(DType::I64, {2}, {1, 2})
      .input<int64_t>(DType::I64, {2}, {2, 2})
      .input<double>(DType::F64, {2}, {log3, log3})
      .output(DType::F64, {2});
  bonused.run();
  expectClose(bonused.result<double>(), {std::log(6.0), std::log(2.0)}, 1e-15);
}

TEST(CrossEntropyBackwardKernel, UniformRowsAndALogThreeBonus) {
  // softmax of four equal logits is 1/4: 2 · (1/4 − onehot(1)).
  KernelCall plain("cross_entropy_backward", {{"softcap", 0.0}});
  plain.input<float>(DType::F32, {1, 4}, {0, 0, 0, 0}).input<int32_t>(DType::I32, {1}, {1});
  plain.input<float>(DType::F32, {1}, {2.0f}).output(DType::F32, {1, 4});
  plain.run();
  EXPECT_EQ(plain.result<float>(), (std::vector<float>{0.5f, -1.5f, 0.5f, 0.5f}));

  // With log 3 on id 2 the probabilities are 1/6, 1/6, 1/2, 1/6; the target is the bonused id.
  KernelCall bonused("cross_entropy_backward", {{"softcap", 0.0}});
  bonused.input<double>(DType::F64, {1, 4}, {0, 0, 0, 0})
      .input<int64_t>(DType::I64, {1}, {2})
      .input<int64_t>(DType::I64, {1}, {2})
      .input<double>(DType::F64, {1}, {std::log(3.0)})
      .input<double>(DType::F64, {1}, {1.0})
      .output(DType::F64, {1, 4});
  bonused.run();
  expectClose(bonused.result<double>(), {1.0 / 6, 1.0 / 6, -0.5, 1.0 / 6}, 1e-15);
}

// Positions [2, 3] over V = 7 in f64, across threads, with a bonus whose id sometimes is the target.
TEST(CrossEntropyKernels, RowsWithBonusesMatchTheDefinition) {
  const int64_t vocabulary = 7;
  const std::vector<double> logits = randomValues<double>(6 * vocabulary, 21, -3, 3);
  const std::vector<int32_t> targets = {0, 6, 3, 3, 1, 5};
  const std::vector<int64_t> bonusIds = {0, 2, 3, 4, 1, 0};  // equal to the target at positions 0, 2 and 4
  const std::vector<double> bonus = {2.5, 1.0, 9.0, 0.5, -1.5, 3.0};
  const std::vector<double> gradOutput = {1.0, -0.5, 2.0, 0.25, 1.5, -1.0};
  const std::vector<Position> expected =
      positions(logits, vocabulary, std::vector<int64_t>(targets.begin(), targets.end()), bonusIds, bonus);
  ThreadPool threads(2);

  KernelCall forward("cross_entropy", {{"softcap", 0.0}});
  forward.input(DType::F64, {2, 3, vocabulary}, logits).input(DType::I32, {2, 3}, targets);
  forward.input(DType::I64, {2, 3}, bonusIds).input(DType::F64, {2, 3}, bonus).output(DType::F64, {2, 3});
  forward.run(&threads);
  std::vector<double> losses;
  for (const Position& position : expected) losses.push_back(position.loss());
  expectClose(forward.result<double>(), losses, 1e-14);

  KernelCall backward("cross_entropy_backward", {{"softcap", 0.0}});
  backward.input(DType::F64, {2, 3, vocabulary}, logits).input(DType::I32, {2, 3}, targets);
  backward.input(DType::I64, {2, 3}, bonusIds).input(DType::F64, {2, 3}, bonus).input(DType::F64, {2, 3}, gradOutput);
  backward.output(DType::F64, {2, 3, vocabulary});
  backward.run(&threads);
  std::vector<double> gradients;
  for (size_t r = 0; r < expected.size(); ++r)
    for (double value : expected[r].gradient(gradOutput[r])) gradients.push_back(value);
  expectClose(backward.result<double>(), gradients, 1e-14);
}

// The definition on capped logits z = c tanh(x / c) (+ bonus): each row's loss, and the gradient
// reaching the raw logits through 1 − tanh², scaled by the row's output gradient.
struct CappedExpectation {
  std::vector<double> losses, gradients;
};

CappedExpectation cappedExpectation(const std::vector<double>& logits, int64_t vocabulary, double cap,
                                    const std::vector<int64_t>& targets, const std::vector<int64_t>& bonusIds,
                                    const std::vector<double>& bonus, const std::vector<double>& gradOutput) {
  std::vector<double> capped(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) capped[i] = cap * std::tanh(logits[i] / cap);
  const std::vector<Position> rows = positions(capped, vocabulary, targets, bonusIds, bonus);
  CappedExpectation expected;
  for (size_t r = 0; r < rows.size(); ++r) {
    expected.losses.push_back(rows[r].loss());
    const std::vector<double> gradient = rows[r].gradient(gradOutput[r]);
    for (int64_t j = 0; j < vocabulary; ++j) {
      const double squashed = std::tanh(logits[r * vocabulary + j] / cap);
      expected.gradients.push_back(gradient[j] * (1 - squashed * squashed));
    }
  }
  return expected;
}

// With `softcap` c the kernels cap the logits themselves: z = c tanh(x / c) (+ bonus), and the
// gradient reaches the raw logits through 1 − tanh². Checked in f64 and f32 (the f32 loop is the
// vectorised one) against the definition on capped logits; a cap of 2 bends logits in [-6, 6] hard.
TEST(CrossEntropyKernels, SoftcapInsideMatchesCappedLogits) {
  const int64_t vocabulary = 37, rows = 4;  // 37: the vector loop and its remainder
  const double cap = 2.0;
  const std::vector<double> logits = randomValues<double>(rows * vocabulary, 23, -6, 6);
  const std::vector<int64_t> targets = {0, 36, 5, 5}, bonusIds = {3, 36, 5, 0};
  const std::vector<double> bonus = {1.5, -0.5, 2.0, 0.25}, gradOutput = {1.0, -2.0, 0.5, 1.5};
  const CappedExpectation expected = cappedExpectation(logits, vocabulary, cap, targets, bonusIds, bonus, gradOutput);
  auto check = [&](DType dtype, auto zero, double tolerance) {
    using T = decltype(zero);
    const std::vector<T> x(logits.begin(), logits.end()), b(bonus.begin(), bonus.end()), g(gradOutput.begin(), gradOutput.end());
    ThreadPool threads(2);
    KernelCall forward("cross_entropy", {{"softcap", cap}});
    forward.input(dtype, {rows, vocabulary}, x).input(DType::I64, {rows}, targets);
    forward.input(DType::I64, {rows}, bonusIds).input(dtype, {rows}, b).output(dtype, {rows});
    forward.run(&threads);
    expectClose(forward.result<T>(), expected.losses, tolerance);
    KernelCall backward("cross_entropy_backward", {{"softcap", cap}});
    backward.input(dtype, {rows, vocabulary}, x).input(DType::I64, {rows}, targets);
    backward.input(DType::I64, {rows}, bonusIds).input(dtype, {rows}, b).input(dtype, {rows}, g);
    backward.output(dtype, {rows, vocabulary});
    backward.run(&threads);
    expectClose(backward.result<T>(), expected.gradients, tolerance);
  };
  check(DType::F64, 0.0, 1e-14);
  check(DType::F32, 0.0f, 2e-6);
}

// The capped row's maximum is taken block by block (1024 logits): bonused logits at the first and
// last logit of a block and of the row, with a bonus that makes the bonused logit the row's maximum
// in one row and the minimum in another, over three blocks (the last partial).
TEST(CrossEntropyKernels, SoftcapAcrossMaximumBlocksMatchesCappedLogits) {
  const int64_t vocabulary = 2100, rows = 4;
  const double cap = 3.0;
  const std::vector<double> logits = randomValues<double>(rows * vocabulary, 24, -6, 6);
  const std::vector<int64_t> targets = {5, 1024, 2099, 0}, bonusIds = {0, 1023, 1024, 2099};
  const std::vector<double> bonus = {8.0, -9.0, 0.5, 2.0}, gradOutput = {1.0, 0.5, -1.5, 2.0};
  const CappedExpectation expected = cappedExpectation(logits, vocabulary, cap, targets, bonusIds, bonus, gradOutput);
  const std::vector<float> x(logits.begin(), logits.end()), b(bonus.begin(), bonus.end());
  const std::vector<float> g(gradOutput.begin(), gradOutput.end());
  ThreadPool threads(3);
  KernelCall forward("cross_entropy", {{"softcap", cap}});
  forward.input(DType::F32, {rows, vocabulary}, x).input(DType::I64, {rows}, targets);
  forward.input(DType::I64, {rows}, bonusIds).input(DType::F32, {rows}, b).output(DType::F32, {rows});
  forward.run(&threads);
  expectClose(forward.result<float>(), expected.losses, 2e-6);
  KernelCall backward("cross_entropy_backward", {{"softcap", cap}});
  backward.input(DType::F32, {rows, vocabulary}, x).input(DType::I64, {rows}, targets);
  backward.input(DType::I64, {rows}, bonusIds).input(DType::F32, {rows}, b).input(DType::F32, {rows}, g);
  backward.output(DType::F32, {rows, vocabulary});
  backward.run(&threads);
  expectClose(backward.result<float>(), expected.gradients, 2e-6);
}

// The model's vocabulary in f32: the loss is within the f32 rounding of the result (2^-24 relative)
// of an f64 reference, which a running f32 sum of 262144 exps (about 1e-5 off here) would not reach.
TEST(CrossEntropyKernel, FullVocabularyInF32MatchesF64) {
  const int64_t vocabulary = 262144, rows = 3;
  const std::vector<float> logits = randomValues<float>(rows * vocabulary, 22, -4, 4);
  const std::vector<int64_t> targets = {0, 123456, vocabulary - 1};
  KernelCall call("cross_entropy", {{"softcap", 0.0}});
  call.input(DType::F32, {rows, vocabulary}, logits).input(DType::I64, {rows}, targets).output(DType::F32, {rows});
  ThreadPool threads(2);
  call.run(&threads);
  std::vector<double> expected;
  for (int64_t r = 0; r < rows; ++r) {
    // Kahan-compensated, so that the reference itself carries no summation error worth the name.
    double sum = 0, compensation = 0;
    for (int64_t j = 0; j < vocabulary; ++j) {
      const double term = std::exp(static_cast<double>(logits[r * vocabulary + j])) - compensation;
      const double next = sum + term;
      compensation = (next - sum) - term;
      sum = next;
    }
    expected.push_back(std::log(sum) - logits[r * vocabulary + targets[r]]);
  }
  expectClose(call.result<float>(), expected, 1e-7);
}

TEST(CrossEntropyKernels, OutOfRangeIdsAreRunTimeErrorsNamingTheId) {
  KernelCall target("cross_entropy", {{"softcap", 0.0}});
  target.input<float>(DType::F32, {2, 4}, std::vector<float>(8)).input<int64_t>(DType::I64, {2}, {0, 4});
  target.output(DType::F32, {2});
  try {
    target.run();
    ADD_FAILURE() << "target id 4 was accepted";
  } catch (const RuntimeError& error) {
    EXPECT_EQ(std::string(error.what()), "step 0 (cross_entropy): target id 4 at flat index 1 is outside the vocabulary [0, 4)");
  }
  KernelCall bonus("cross_entropy_backward", {{"softcap", 0.0}});
  bonus.input<double>(DType::F64, {2, 4}, std::vector<double>(8)).input<int64_t>(DType::I64, {2}, {0, 1});
  bonus.input<int32_t>(DType::I32, {2}, {-1, 0}).input<double>(DType::F64, {2}, {1, 1}).input<double>(DType::F64, {2}, {1, 1});
  bonus.output(DType::F64, {2, 4});
  try {
    bonus.run();
    ADD_FAILURE() << "bonus id -1 was accepted";
  } catch (const RuntimeError& error) {
    EXPECT_EQ(error.exitCode(), 1);
    EXPECT_EQ(std::string(error.what()),
              "step 0 (cross_entropy_backward): bonus id -1 at flat index 0 is outside the vocabulary [0, 4)");
  }
}

TEST(CrossEntropyKernels, RejectsHalfABonusAndMismatchedShapes) {
  KernelCall half("cross_entropy", {{"softcap", 0.0}});
  half.input<float>(DType::F32, {2, 4}, std::vector<float>(8)).input<int64_t>(DType::I64, {2}, {0, 1});
  half.input<int64_t>(DType::I64, {2}, {0, 1}).output(DType::F32, {2});
  EXPECT_EQ(factoryError(half), "step 0 (cross_entropy): bonus ids and bonus come together: expected 2 or 4 inputs");
  KernelCall targets("cross_entropy", {{"softcap", 0.0}});
  targets.input<float>(DType::F32, {2, 4}, std::vector<float>(8)).input<int64_t>(DType::I64, {4}, {0, 1, 2, 3});
  targets.output(DType::F32, {2});
  EXPECT_EQ(factoryError(targets), "step 0 (cross_entropy): input targets has shape [4], expected [2]");
  KernelCall bonus("cross_entropy", {{"softcap", 0.0}});
  bonus.input<float>(DType::F32, {2, 4}, std::vector<float>(8)).input<int64_t>(DType::I64, {2}, {0, 1});
  bonus.input<int64_t>(DType::I64, {2}, {0, 1}).input<double>(DType::F64, {2}, {1, 1}).output(DType::F32, {2});
  EXPECT_EQ(factoryError(bonus), "step 0 (cross_entropy): input bonus has dtype f64, expected f32");
  KernelCall gradient("cross_entropy_backward", {{"softcap", 0.0}});
  gradient.input<float>(DType::F32, {2, 4}, std::vector<float>(8)).input<int64_t>(DType::I64, {2}, {0, 1});
  gradient.input<float>(DType::F32, {2}, {1, 1}).output(DType::F32, {2});
  EXPECT_EQ(factoryError(gradient), "step 0 (cross_entropy_backward): output grad_logits has shape [2], expected [2,4]");
}

}  // namespace
}  // namespace dgemma::test
