// runtime/kernels/cross_entropy/CrossEntropyMath.h, the arithmetic of the CUDA cross-entropy
// kernels, against the CPU kernel without a GPU: the kernels' row bodies run on the host with a block
// of one thread and with a block of four host threads (a barrier for each reduction) give the CPU
// kernel's loss and gradient, with and without the soft-cap and the bonus, i32 and i64 ids, up to the
// model's vocabulary of 262144.
// The bodies' bounds assertions (KernelElements.h) are compiled in: a bad index aborts the test.
#define DGEMMA_CUDA_DEBUG_BOUNDS 1

#include <barrier>
#include <cmath>
#include <thread>

#include "KernelTestSupport.h"
#include "runtime/kernels/cross_entropy/CrossEntropyMath.h"

namespace dgemma::test {
namespace {

using cross_entropy::IdTensor;
using cross_entropy::RowBonus;
using cross_entropy::RowInputs;

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

// The row bodies' inputs over host vectors (the ids as i64 or i32, as the case says).
struct HostRows {
  std::vector<int32_t> narrowTargets, narrowBonusIds;
  RowInputs<float> in;

  HostRows(const Case& c, const Inputs& inputs)
      : narrowTargets(narrow(inputs.targets)), narrowBonusIds(narrow(inputs.bonusIds)) {
    in = {inputs.logits.data(),
          c.rows,
          c.vocabulary,
          IdTensor{c.wideIds ? static_cast<const void*>(inputs.targets.data()) : narrowTargets.data(), c.wideIds},
          IdTensor{c.bonus ? (c.wideIds ? static_cast<const void*>(inputs.bonusIds.data()) : narrowBonusIds.data())
                           : nullptr,
                   c.wideIds},
          c.bonus ? inputs.bonus.data() : nullptr,
          static_cast<float>(c.softcap)};
  }
};

// A CUDA block of one thread: its reductions return the thread's own partials.
struct SerialBlock {
  int thread() const { return 0; }
  int threads() const { return 1; }
  double reduceMaximum(double value) const { return value; }
  double reduceSum(double value) const { return value; }
};

// A CUDA block of `threads` host threads: each runs the row body with its own index; the reductions
// gather every thread's partial through a barrier and combine them in thread order.
class ThreadedBlock {
 public:
  explicit ThreadedBlock(int threads) : threads_(threads), barrier_(threads), slots_(threads) {}

  struct Block {
    ThreadedBlock* group;
    int index;
    int thread() const { return index; }
    int threads() const { return group->threads_; }
    double reduceMaximum(double value) const {
      return reduce(value, -INFINITY, [](double a, double b) { return cross_entropy::combineMaximum(a, b); });
    }
    double reduceSum(double value) const {
      return reduce(value, 0.0, [](double a, double b) { return cross_entropy::combineSum(a, b); });
    }
    template <typename Combine>
    double reduce(double value, double identity, Combine combine) const {
      group->slots_[index] = value;
      group->barrier_.arrive_and_wait();
      double result = identity;
      for (double slot : group->slots_) result = combine(result, slot);
      group->barrier_.arrive_and_wait();  // every thread has read the slots before they are reused
      return result;
    }
  };

  template <typename Body>
  void run(const Body& body) {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads_; ++t) workers.emplace_back([&, t] { body(Block{this, t}); });
    for (std::thread& worker : workers) worker.join();
  }

 private:
  int threads_;
  std::barrier<> barrier_;
  std::vector<double> slots_;
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

TEST(CrossEntropyMath, RowBodiesMatchTheCpuLoss) {
  uint32_t seed = 40;
  for (const Case& c : kCases) {
    const Inputs inputs = randomInputs(c, seed += 10);
    KernelCall call("cross_entropy", {{"softcap", c.softcap}});
    addInputs(call, c, inputs);
    call.output(DType::F32, {c.rows});
    call.run();
    const std::vector<float> cpu = call.result<float>();
    const HostRows rows(c, inputs);
    std::vector<float> loss(c.rows, std::nanf("")), threadedLoss(c.rows, std::nanf(""));
    for (int64_t r = 0; r < c.rows; ++r) cross_entropy::lossRow(SerialBlock{}, rows.in, r, loss.data());
    ThreadedBlock(4).run([&](const auto& block) {
      for (int64_t r = 0; r < c.rows; ++r) cross_entropy::lossRow(block, rows.in, r, threadedLoss.data());
    });
    for (int64_t r = 0; r < c.rows; ++r) {
      // libm's expf against the CPU kernel's fastExp (2 ulp), summed over V: ~1e-7 relative.
      const double tolerance = 1e-6 * std::max(1.0f, std::fabs(cpu[r]));
      EXPECT_NEAR(loss[r], cpu[r], tolerance) << describe(c) << " row " << r;
      EXPECT_NEAR(threadedLoss[r], cpu[r], tolerance) << describe(c) << " row " << r << " (4 threads)";
    }
  }
}

TEST(CrossEntropyMath, RowBodiesMatchTheCpuGradient) {
  uint32_t seed = 140;
  for (const Case& c : kCases) {
    const Inputs inputs = randomInputs(c, seed += 10);
    KernelCall call("cross_entropy_backward", {{"softcap", c.softcap}});
    addInputs(call, c, inputs);
    call.input(DType::F32, {c.rows}, inputs.gradOutput);
    call.output(DType::F32, {c.rows, c.vocabulary});
    call.run();
    const std::vector<float> cpu = call.result<float>();
    const HostRows rows(c, inputs);
    std::vector<float> gradient(c.rows * c.vocabulary, std::nanf("")), threaded(gradient);
    for (int64_t r = 0; r < c.rows; ++r)
      cross_entropy::gradientRow(SerialBlock{}, rows.in, r, inputs.gradOutput.data(), gradient.data());
    ThreadedBlock(4).run([&](const auto& block) {
      for (int64_t r = 0; r < c.rows; ++r)
        cross_entropy::gradientRow(block, rows.in, r, inputs.gradOutput.data(), threaded.data());
    });
    for (size_t e = 0; e < cpu.size(); ++e) {
      // Relative to the element (an exp's 2 ulp and the sum's 1e-7), with a floor far below 1/V.
      const double tolerance = 2e-6 * std::fabs(cpu[e]) + 1e-12;
      ASSERT_NEAR(gradient[e], cpu[e], tolerance) << describe(c) << " row " << e / c.vocabulary << " column "
                                                  << e % c.vocabulary;
      ASSERT_NEAR(threaded[e], cpu[e], tolerance) << describe(c) << " row " << e / c.vocabulary << " column "
                                                  << e % c.vocabulary << " (4 threads)";
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
