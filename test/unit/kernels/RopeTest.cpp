// rope against a pair-by-pair reference: full rotation, partial (proportional) rotation, positions
// with per-row offsets, and the factory's attribute checks.
#include <cmath>

#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

struct RopeCase {
  int64_t batch = 2, tokens = 5, heads = 3, headDim = 8;
  double theta = 10000.0;
  int64_t rotatedPairs = 4;
  int64_t frequencyDim = 8;
};

// The contract fixes the angle's precision: f_i = 1 / theta^(2i/frequency_dim) and θ = pos · f_i,
// each step in T. The reference follows it there and does the rotation itself in double.
template <typename T>
double contractAngle(const RopeCase& c, int64_t position, int64_t pair) {
  if (pair >= c.rotatedPairs) return 0.0;
  const T frequency = T(1) / std::pow(static_cast<T>(c.theta), static_cast<T>(2 * pair) / static_cast<T>(c.frequencyDim));
  return static_cast<double>(static_cast<T>(position) * frequency);
}

template <typename T>
std::vector<double> ropeReference(const RopeCase& c, const std::vector<T>& x, const std::vector<int64_t>& positions) {
  std::vector<double> y(x.size());
  const int64_t half = c.headDim / 2;
  for (int64_t row = 0; row < c.batch * c.tokens; ++row)
    for (int64_t head = 0; head < c.heads; ++head) {
      const int64_t base = (row * c.heads + head) * c.headDim;
      for (int64_t i = 0; i < half; ++i) {
        const double angle = contractAngle<T>(c, positions[row], i);
        const double first = x[base + i], second = x[base + i + half];
        y[base + i] = first * std::cos(angle) - second * std::sin(angle);
        y[base + i + half] = second * std::cos(angle) + first * std::sin(angle);
      }
    }
  return y;
}

template <typename T>
std::vector<T> runRope(DType dtype, const RopeCase& c, const std::vector<T>& x, const std::vector<int64_t>& positions,
                       ThreadPool* threads = nullptr) {
  KernelCall call(
      "rope",
      {{"theta", c.theta}, {"rotated_pairs", c.rotatedPairs}, {"frequency_dim", c.frequencyDim}, {"inverse", false}});
  const std::vector<int64_t> shape = {c.batch, c.tokens, c.heads, c.headDim};
  call.input(dtype, shape, x).input(DType::I64, {c.batch, c.tokens}, positions).output(dtype, shape);
  call.run(threads);
  return call.result<T>();
}

// Row 0 starts at 0; row 1 is left-padded by two (its pads repeat position 0, its real tokens count
// from 0); row 2 continues after a prefix of 37, as decoder canvases do.
std::vector<int64_t> offsetPositions(int64_t batch, int64_t tokens) {
  const std::vector<int64_t> starts = {0, -2, 37};
  std::vector<int64_t> positions;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < tokens; ++t) positions.push_back(std::max<int64_t>(0, starts[b % 3] + t));
  return positions;
}

template <typename T>
void checkRope(DType dtype, const RopeCase& c, ThreadPool* threads = nullptr) {
  const std::vector<T> x = randomValues<T>(c.batch * c.tokens * c.heads * c.headDim, 61);
  const std::vector<int64_t> positions = offsetPositions(c.batch, c.tokens);
  expectClose(runRope(dtype, c, x, positions, threads), ropeReference(c, x, positions),
              dtype == DType::F64 ? 1e-12 : 1e-5);
}

TEST(RopeKernel, DefaultRotatesEveryPair) {
  checkRope<float>(DType::F32, RopeCase{});
  checkRope<double>(DType::F64, RopeCase{});
  checkRope<double>(DType::F64, RopeCase{.batch = 3, .tokens = 4, .heads = 2, .headDim = 16, .theta = 1e4,
                                         .rotatedPairs = 8, .frequencyDim = 16});
}

TEST(RopeKernel, ProportionalRotatesTheFirstPairsWithTheFullHeadDimAsDenominator) {
  // Gemma 4's full layers in miniature: 2 of 8 pairs turn, the exponent denominator is D = 16.
  const RopeCase c{.batch = 3, .tokens = 4, .heads = 2, .headDim = 16, .theta = 1e6, .rotatedPairs = 2,
                   .frequencyDim = 16};
  checkRope<float>(DType::F32, c);
  checkRope<double>(DType::F64, c);
}

TEST(RopeKernel, UnrotatedDimsPassThroughBitExactly) {
  const RopeCase c{.batch = 2, .tokens = 3, .heads = 2, .headDim = 12, .theta = 1e6, .rotatedPairs = 2,
                   .frequencyDim = 12};
  std::vector<float> x = randomValues<float>(c.batch * c.tokens * c.heads * c.headDim, 62);
  x[3] = -0.0f;           // unrotated dim 3 of the first head; the formula x·1 − x'·0 would give +0
  x[3 + 6] = -INFINITY;   // its partner: x'·0 would make NaN of dim 3
  const std::vector<int64_t> positions = offsetPositions(c.batch, c.tokens);
  const std::vector<float> y = runRope(DType::F32, c, x, positions);
  for (size_t index = 0; index < x.size(); ++index) {
    const int64_t dim = static_cast<int64_t>(index) % c.headDim;
    if (dim % 6 < c.rotatedPairs) continue;  // dims 0, 1 and 6, 7 rotate
    ASSERT_EQ(std::memcmp(&y[index], &x[index], sizeof(float)), 0) << "flat index " << index;
  }
  EXPECT_TRUE(std::signbit(y[3]));
  // Pairs that do rotate moved (position 1 and above turn them by a nonzero angle).
  const int64_t secondToken = c.heads * c.headDim;
  EXPECT_NE(y[secondToken], x[secondToken]);
}

TEST(RopeKernel, LargePositionsUseFrequenciesAndAnglesInTheDataPrecision) {
  // Far out, one f32 rounding of f_i or θ moves the angle by up to ~1e-3, so only a kernel that
  // computes both in f32, as the contract says, matches the reference's f32 angles to 1e-5. An
  // exponent 2i/12 that f32 cannot hold exactly makes the f32 power differ from a rounded f64 one.
  const RopeCase c{.batch = 1, .tokens = 4, .heads = 1, .headDim = 12, .theta = 1e6, .rotatedPairs = 6,
                   .frequencyDim = 12};
  const std::vector<float> x = randomValues<float>(c.tokens * c.headDim, 63);
  const std::vector<int64_t> positions = {4999, 5003, 65000, 123457};
  expectClose(runRope(DType::F32, c, x, positions), ropeReference(c, x, positions), 1e-5);
}

TEST(RopeKernel, ManyPositionsAcrossThreads) {
  ThreadPool threads(2);
  const RopeCase c{.batch = 3, .tokens = 200, .heads = 4, .headDim = 32, .theta = 1e4, .rotatedPairs = 16,
                   .frequencyDim = 32};
  checkRope<float>(DType::F32, c, &threads);
  checkRope<double>(DType::F64, RopeCase{.batch = 3, .tokens = 150, .heads = 4, .headDim = 32, .theta = 1e6,
                                         .rotatedPairs = 4, .frequencyDim = 32},
                    &threads);
}

KernelCall ropeCall(nlohmann::json attrs, std::vector<int64_t> shape = {1, 2, 1, 8},
                    std::vector<int64_t> positionShape = {1, 2}, DType positionType = DType::I64) {
  KernelCall call("rope", std::move(attrs));
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  call.input(DType::F32, shape, std::vector<float>(count));
  if (positionType == DType::I64)
    call.input(DType::I64, positionShape, std::vector<int64_t>(positionShape[0] * positionShape[1]));
  else
    call.input(DType::I32, positionShape, std::vector<int32_t>(positionShape[0] * positionShape[1]));
  call.output(DType::F32, shape);
  return call;
}

// The CPU kernel's f32 bytes are the contract's steps written out in f32 (frequency, angle, libm's
// cos and sin, the rotation one IEEE operation at a time): the CUDA kernel takes the same frequencies
// and rotation from rope/RopeMath.h, so the two differ only where libdevice's cos and sin do.
TEST(RopeKernel, EqualsTheStepsInF32BitForBit) {
  RopeCase c;
  c.batch = 2, c.tokens = 7, c.heads = 2, c.headDim = 16, c.rotatedPairs = 5, c.frequencyDim = 16, c.theta = 1e6;
  const std::vector<float> x = randomValues<float>(c.batch * c.tokens * c.heads * c.headDim, 31);
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < c.batch * c.tokens; ++i) positions.push_back(i * 9973);
  const std::vector<float> y = runRope<float>(DType::F32, c, x, positions);
  const int64_t half = c.headDim / 2;
  for (int64_t row = 0; row < c.batch * c.tokens; ++row)
    for (int64_t head = 0; head < c.heads; ++head)
      for (int64_t i = 0; i < half; ++i) {
        const int64_t at = (row * c.heads + head) * c.headDim + i;
        float first = x[at], second = x[at + half];
        if (i < c.rotatedPairs) {
          const float frequency = 1.0f / std::pow(1e6f, static_cast<float>(2 * i) / 16.0f);
          const float angle = static_cast<float>(positions[row]) * frequency;
          const float cosine = std::cos(angle), sine = std::sin(angle);
          const float turnedFirst = first * cosine - second * sine;
          second = second * cosine + first * sine;
          first = turnedFirst;
        }
        ASSERT_EQ(y[at], first) << "row " << row << " head " << head << " pair " << i;
        ASSERT_EQ(y[at + half], second) << "row " << row << " head " << head << " pair " << i;
      }
}

TEST(RopeKernel, FactoryRejectsBadAttributesAndShapes) {
  const nlohmann::json good = {{"theta", 1e4}, {"rotated_pairs", 4}, {"frequency_dim", 8}, {"inverse", false}};
  EXPECT_NO_THROW(ropeCall(good).create());

  nlohmann::json tooMany = good;
  tooMany["rotated_pairs"] = 5;
  EXPECT_EQ(factoryError(ropeCall(tooMany)), "step 0 (rope): attribute 'rotated_pairs': 5 is outside [1, D/2 = 4]");
  nlohmann::json none = good;
  none["rotated_pairs"] = 0;
  EXPECT_EQ(factoryError(ropeCall(none)), "step 0 (rope): attribute 'rotated_pairs': 0 is outside [1, D/2 = 4]");
  nlohmann::json frequencyDim = good;
  frequencyDim["frequency_dim"] = 0;
  EXPECT_EQ(factoryError(ropeCall(frequencyDim)),
            "step 0 (rope): attribute 'frequency_dim': expected a positive integer, got 0");
  nlohmann::json theta = good;
  theta["theta"] = -1.0;
  EXPECT_EQ(factoryError(ropeCall(theta)),
            "step 0 (rope): attribute 'theta': expected a positive finite number, got -1.000000");
  nlohmann::json missing = good;
  missing.erase("frequency_dim");
  EXPECT_EQ(factoryError(ropeCall(missing)), "step 0 (rope): attribute 'frequency_dim' is missing");

  EXPECT_EQ(factoryError(ropeCall(good, {1, 2, 1, 7})),
            "step 0 (rope): input x has head dim D=7; the rotate-half layout needs an even D");
  EXPECT_EQ(factoryError(ropeCall(good, {2, 8})), "step 0 (rope): input x has shape [2,8], expected [B, T, H, D]");
  EXPECT_EQ(factoryError(ropeCall(good, {1, 2, 1, 8}, {2, 1})),
            "step 0 (rope): input positions has shape [2,1], expected [1,2]");
  EXPECT_EQ(factoryError(ropeCall(good, {1, 2, 1, 8}, {1, 2}, DType::I32)),
            "step 0 (rope): input positions has dtype i32, expected i64");
}

}  // namespace
}  // namespace dgemma::test
