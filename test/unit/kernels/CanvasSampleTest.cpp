// canvas_sample (docs/kernels.md, "canvas_sample"): the scaled logits bit for bit (the f32 quotient
// and its bf16 rounding), the entropy and argmax against an f64 reference computed here, the
// sampled id against the documented Philox/Gumbel recipe evaluated here element by element, its
// determinism per key, a chi-square test that the draws follow softmax(z), and the fused soft-cap
// against the div, tanh and mul kernels it replaces, bit for bit.
#include <cstring>
#include <limits>
#include <tuple>

#include "KernelTestSupport.h"
#include "runtime/core/Philox.h"
#include "runtime/kernels/canvas_sample/GumbelNoise.h"
#include "support/DType.h"

namespace dgemma::test {
namespace {

using canvas_sample::gumbelNoise;
using canvas_sample::openUniform;

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Problem {
  int64_t batch = 1, canvas = 1, vocab = 1;
  std::vector<float> logits, temperature;
  std::vector<int64_t> keys;  // [B, 2]
};

struct Outcome {
  std::vector<int64_t> sampled, argmax;
  std::vector<float> entropy;
  std::vector<float> scaledF32;      // f32 runs
  std::vector<uint16_t> scaledBf16;  // bf16 runs
};

Outcome sample(const Problem& p, DType scaled = DType::F32, ThreadPool* threads = nullptr, double softcap = 0) {
  KernelCall call("canvas_sample", {{"softcap", softcap}});
  call.input(DType::F32, {p.batch, p.canvas, p.vocab}, p.logits)
      .input(DType::F32, {p.batch}, p.temperature)
      .input(DType::I64, {p.batch, 2}, p.keys);
  call.output(DType::I64, {p.batch, p.canvas})
      .output(DType::I64, {p.batch, p.canvas})
      .output(DType::F32, {p.batch, p.canvas})
      .output(scaled, {p.batch, p.canvas, p.vocab});
  call.run(threads);
  Outcome outcome{call.result<int64_t>(0), call.result<int64_t>(1), call.result<float>(2), {}, {}};
  if (scaled == DType::F32)
    outcome.scaledF32 = call.result<float>(3);
  else
    outcome.scaledBf16 = call.result<uint16_t>(3);
  return outcome;
}

Problem randomProblem(int64_t batch, int64_t canvas, int64_t vocab, uint32_t seed, double spread = 4.0) {
  Problem p{batch, canvas, vocab, randomValues<float>(static_cast<size_t>(batch * canvas * vocab), seed, -spread, spread), {}, {}};
  for (int64_t b = 0; b < batch; ++b) {
    p.temperature.push_back(0.4083333f + 0.13f * static_cast<float>(b));
    p.keys.push_back(static_cast<int64_t>(0x9E3779B97F4A7C15ull * static_cast<uint64_t>(b + seed)));
    p.keys.push_back(b);
  }
  return p;
}

float quotient(const Problem& p, int64_t position, int64_t v) {
  return p.logits[static_cast<size_t>(position * p.vocab + v)] / p.temperature[static_cast<size_t>(position / p.canvas)];
}

uint32_t bitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// −Σ p log p of softmax(z) in f64 from the f32 quotients: with m = max z, `ties` entries at m and
// rest = Σ e^(z−m) over the others, log s = log ties + log1p(rest / ties) keeps tiny entropies.
double referenceEntropy(const Problem& p, int64_t position) {
  double maximum = -kInf;
  for (int64_t v = 0; v < p.vocab; ++v) maximum = std::max<double>(maximum, quotient(p, position, v));
  double ties = 0, rest = 0, weighted = 0;
  for (int64_t v = 0; v < p.vocab; ++v) {
    const double shifted = static_cast<double>(quotient(p, position, v)) - maximum;
    if (shifted == 0) {
      ties += 1;
    } else if (shifted > -kInf) {
      rest += std::exp(shifted);
      weighted += std::exp(shifted) * shifted;
    }
  }
  return std::log(ties) + std::log1p(rest / ties) - weighted / (ties + rest);
}

int64_t referenceArgmax(const Problem& p, int64_t position) {
  int64_t best = 0;
  for (int64_t v = 1; v < p.vocab; ++v)
    if (quotient(p, position, v) > quotient(p, position, best)) best = v;
  return best;
}

// The documented recipe, one element at a time: argmax_v (z_v + g(word of element l·V + v)).
int64_t referenceSample(const Problem& p, int64_t position) {
  const int64_t b = position / p.canvas, l = position % p.canvas;
  const uint64_t seed = static_cast<uint64_t>(p.keys[2 * b]), offset = static_cast<uint64_t>(p.keys[2 * b + 1]);
  int64_t best = 0;
  float bestKey = -kInf;
  for (int64_t v = 0; v < p.vocab; ++v) {
    const uint32_t word = philoxWord(seed, 0, offset, static_cast<uint64_t>(l * p.vocab + v));
    const float key = quotient(p, position, v) + gumbelNoise(word);
    if (key > bestKey) {
      bestKey = key;
      best = v;
    }
  }
  return best;
}

TEST(CanvasSampleNoise, UniformIsInsideTheOpenIntervalAndTheNoiseIsGumbel) {
  EXPECT_EQ(openUniform(0), 1.0f / 16777216.0f);
  EXPECT_EQ(openUniform(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
  EXPECT_EQ(openUniform(0x80000000u), 0.5f + 1.0f / 16777216.0f);
  EXPECT_LT(gumbelNoise(0xffffffffu), canvas_sample::kGumbelNoiseBound);
  // The portable log against libm's in f64, over words spread across the whole range.
  for (uint64_t word = 0; word <= 0xffffffffull; word += 0x10001ull) {
    const double u = openUniform(static_cast<uint32_t>(word));
    const double expected = -std::log(-std::log(u));
    ASSERT_NEAR(gumbelNoise(static_cast<uint32_t>(word)), expected, 2e-6 * std::max(1.0, std::abs(expected))) << word;
  }
}

TEST(CanvasSampleKernel, ScaledIsTheF32QuotientAndItsBf16Rounding) {
  const Problem p = randomProblem(2, 3, 1003, 11, 30.0);
  const Outcome f32 = sample(p, DType::F32);
  const Outcome bf16 = sample(p, DType::BF16);
  for (int64_t position = 0; position < p.batch * p.canvas; ++position)
    for (int64_t v = 0; v < p.vocab; ++v) {
      const size_t flat = static_cast<size_t>(position * p.vocab + v);
      ASSERT_EQ(bitsOf(f32.scaledF32[flat]), bitsOf(quotient(p, position, v))) << flat;
      ASSERT_EQ(bf16.scaledBf16[flat], f32ToBf16Bits(quotient(p, position, v))) << flat;
    }
  // The statistics come from the f32 quotients whatever the scaled output's type.
  EXPECT_EQ(bf16.sampled, f32.sampled);
  EXPECT_EQ(bf16.argmax, f32.argmax);
  EXPECT_EQ(bf16.entropy, f32.entropy);
}

// Rows of different character: random, nearly one-hot (entropy ~1e-20), uniform (log V, argmax 0),
// masked with -inf over a prefix longer than a chunk, a tie between two maxima in different chunks,
// and a single-entry vocabulary.
TEST(CanvasSampleKernel, EntropyAndArgmaxMatchAnF64Reference) {
  Problem p = randomProblem(2, 4, 1003, 5);
  auto row = [&](int64_t position) { return p.logits.begin() + position * p.vocab; };
  row(1)[517] = 30.0f;                                      // nearly one-hot at T ≈ 0.41
  std::fill(row(2), row(2) + p.vocab, 0.25f);               // uniform
  std::fill(row(3), row(3) + 300, -kInf);                   // masked prefix
  row(4)[7] = 9.0f, row(4)[700] = 9.0f;                     // tie across chunks: the lower index
  row(5)[3] = 9.0f, row(5)[4] = 9.0f, row(5)[1000] = 9.0f;  // ties inside one chunk and across
  const Outcome out = sample(p);
  for (int64_t position = 0; position < p.batch * p.canvas; ++position) {
    const double expected = referenceEntropy(p, position);
    // The nearly one-hot row's entropy lives in terms e^(z−m) with z − m ≈ −70, and an f32 z − m
    // carries a relative rounding of 2^-24, i.e. 70 · 2^-24 ≈ 4e-6 in e^(z−m): f32 arithmetic
    // allows no better there.
    const double tolerance = position == 1 ? 1e-5 : 1e-6;
    EXPECT_NEAR(out.entropy[position], expected, tolerance * std::abs(expected)) << position;
    EXPECT_EQ(out.argmax[position], referenceArgmax(p, position)) << position;
  }
  EXPECT_LT(out.entropy[1], 1e-15);
  EXPECT_GT(out.entropy[1], 0.0f);
  EXPECT_NEAR(out.entropy[2], std::log(1003.0), 1e-6 * std::log(1003.0));
  EXPECT_EQ(out.argmax[2], 0);
  EXPECT_EQ(out.argmax[4], 7);
  EXPECT_EQ(out.argmax[5], 3);

  const Problem single = randomProblem(1, 3, 1, 8);
  const Outcome one = sample(single);
  EXPECT_EQ(one.entropy, (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(one.sampled, (std::vector<int64_t>{0, 0, 0}));
}

// Peaked rows let the kernel skip the noise of hopeless entries; flat rows leave nothing to skip.
// Either way the id is the Gumbel-max of the documented words. The large vocabularies run many chunks
// after the best key has a lead, where the kernel takes the logs of the few words that could still
// win only; the offset logits check its margin at magnitudes where an f32 ulp is large.
TEST(CanvasSampleKernel, SampledIdIsTheGumbelMaxOfTheDocumentedPhiloxWords) {
  for (const auto& [vocab, spread, offset] : std::vector<std::tuple<int64_t, double, float>>{
           {517, 0.5, 0}, {517, 4.0, 0}, {517, 40.0, 0}, {16384, 0.05, 0}, {16384, 0.5, 0}, {16384, 4.0, 0},
           {9001, 1.0, 3.0e5f}, {9001, 1.0, -7.0e5f}}) {
    Problem p = randomProblem(3, 5, vocab, 21, spread);
    for (float& logit : p.logits) logit += offset;
    const Outcome out = sample(p);
    for (int64_t position = 0; position < p.batch * p.canvas; ++position)
      EXPECT_EQ(out.sampled[position], referenceSample(p, position))
          << "V " << vocab << ", spread " << spread << ", offset " << offset << ", position " << position;
  }
}

TEST(CanvasSampleKernel, DrawsAreAPureFunctionOfKeyAndPosition) {
  const Problem p = randomProblem(3, 16, 64, 3, 0.5);
  const Outcome serial = sample(p);
  ThreadPool threads(3);
  const Outcome threaded = sample(p, DType::F32, &threads);
  EXPECT_EQ(threaded.sampled, serial.sampled);
  EXPECT_EQ(threaded.entropy, serial.entropy);
  // Row 1 alone, with its key, draws what it drew in the batch.
  Problem alone{1, p.canvas, p.vocab, {p.logits.begin() + p.canvas * p.vocab, p.logits.begin() + 2 * p.canvas * p.vocab},
                {p.temperature[1]}, {p.keys[2], p.keys[3]}};
  const Outcome single = sample(alone);
  EXPECT_TRUE(std::equal(single.sampled.begin(), single.sampled.end(), serial.sampled.begin() + p.canvas));
  // Another seed, or another offset, draws differently (near-flat logits: 16 draws out of 64 ids).
  Problem reseeded = alone, shifted = alone;
  reseeded.keys[0] += 1;
  shifted.keys[1] += 1;
  EXPECT_NE(sample(reseeded).sampled, single.sampled);
  EXPECT_NE(sample(shifted).sampled, single.sampled);
}

// 40 rows x 500 positions = 20000 draws from one softmax over 8 ids; the chi-square statistic of 7
// degrees of freedom exceeds 29 with probability 1e-4. The keys are fixed, so the test is
// deterministic; a biased sampler (e.g. a wrong noise sign or u recipe) lands in the hundreds.
TEST(CanvasSampleKernel, DrawsFollowTheSoftmaxOfTheScaledLogits) {
  const std::vector<float> logits = {0.0f, 0.5f, 1.0f, -1.0f, 2.0f, 0.1f, -0.5f, 1.5f};
  const float temperature = 0.7f;
  Problem p;
  p.batch = 40, p.canvas = 500, p.vocab = static_cast<int64_t>(logits.size());
  for (int64_t position = 0; position < p.batch * p.canvas; ++position) p.logits.insert(p.logits.end(), logits.begin(), logits.end());
  for (int64_t b = 0; b < p.batch; ++b) {
    p.temperature.push_back(temperature);
    p.keys.push_back(1000 + b);
    p.keys.push_back(0);
  }
  const Outcome out = sample(p);
  std::vector<double> probabilities(logits.size());
  double total = 0;
  for (size_t v = 0; v < logits.size(); ++v) total += probabilities[v] = std::exp(static_cast<double>(logits[v] / temperature));
  std::vector<double> counts(logits.size(), 0);
  for (int64_t id : out.sampled) counts.at(static_cast<size_t>(id)) += 1;
  double chiSquare = 0;
  const double draws = static_cast<double>(out.sampled.size());
  for (size_t v = 0; v < logits.size(); ++v) {
    const double expected = draws * probabilities[v] / total;
    chiSquare += (counts[v] - expected) * (counts[v] - expected) / expected;
  }
  EXPECT_LT(chiSquare, 29.0);
}

TEST(CanvasSampleKernel, ANonPositiveTemperatureIsARunTimeErrorNamingTheRow) {
  Problem p = randomProblem(2, 1, 4, 1);
  p.temperature[1] = 0.0f;
  try {
    sample(p);
    ADD_FAILURE() << "a zero temperature was accepted";
  } catch (const RuntimeError& error) {
    EXPECT_EQ(std::string(error.what()), "step 0 (canvas_sample): temperature[1] = 0.000000 is not a positive finite number");
  }
}

// `softcap` c fuses what the unfused graph computes before the sampler: x / c, tanh, · c, each a CPU
// kernel of its own. The fused kernel must give every output bit for bit as the sampler over those
// kernels' capped logits does (generation's tokens do not change with the fusion).
TEST(CanvasSampleKernel, SoftcapIsTheDivTanhAndMulKernelsBitForBit) {
  ThreadPool threads(2);
  const float cap = 30.0f;
  // Logits out to ±120, so the cap's tanh runs through its small, large and saturated ranges.
  const Problem raw = randomProblem(2, 3, 1037, 17, 120.0);
  const std::vector<int64_t> shape{raw.batch, raw.canvas, raw.vocab};
  auto binary = [&](const std::string& op, const std::vector<float>& x) {
    KernelCall call(op);
    call.input(DType::F32, shape, x).input(DType::F32, {}, std::vector<float>{cap}).output(DType::F32, shape);
    call.run(&threads);
    return call.result<float>();
  };
  KernelCall tanh("tanh");
  tanh.input(DType::F32, shape, binary("div", raw.logits)).output(DType::F32, shape);
  tanh.run(&threads);
  Problem capped = raw;
  capped.logits = binary("mul", tanh.result<float>());
  for (const DType scaled : {DType::F32, DType::BF16}) {
    const Outcome fused = sample(raw, scaled, &threads, cap);
    const Outcome unfused = sample(capped, scaled, &threads);
    EXPECT_EQ(fused.sampled, unfused.sampled);
    EXPECT_EQ(fused.argmax, unfused.argmax);
    ASSERT_EQ(fused.entropy.size(), unfused.entropy.size());
    EXPECT_EQ(std::memcmp(fused.entropy.data(), unfused.entropy.data(), fused.entropy.size() * sizeof(float)), 0);
    ASSERT_EQ(fused.scaledF32.size(), unfused.scaledF32.size());
    // Empty for a bf16 output, and memcmp must not be handed the null data() of an empty vector.
    if (!fused.scaledF32.empty())
      EXPECT_EQ(std::memcmp(fused.scaledF32.data(), unfused.scaledF32.data(), fused.scaledF32.size() * sizeof(float)), 0);
    EXPECT_EQ(fused.scaledBf16, unfused.scaledBf16);
  }
  // The cap did something: the capped logits differ from the raw ones.
  EXPECT_NE(capped.logits, raw.logits);
}

TEST(CanvasSampleKernel, FactoryRejectsShapesAndTypesOutsideTheContract) {
  KernelCall key("canvas_sample", {{"softcap", 0.0}});
  key.input(DType::F32, {2, 3, 5}, std::vector<float>(30)).input(DType::F32, {2}, std::vector<float>(2));
  key.input(DType::I64, {2}, std::vector<int64_t>(2));
  key.output(DType::I64, {2, 3}).output(DType::I64, {2, 3}).output(DType::F32, {2, 3}).output(DType::F32, {2, 3, 5});
  EXPECT_EQ(factoryError(key), "step 0 (canvas_sample): input key has shape [2], expected [2,2]");

  KernelCall scaled("canvas_sample", {{"softcap", 0.0}});
  scaled.input(DType::F32, {2, 3, 5}, std::vector<float>(30)).input(DType::F32, {2}, std::vector<float>(2));
  scaled.input(DType::I64, {2, 2}, std::vector<int64_t>(4));
  scaled.output(DType::I64, {2, 3}).output(DType::I64, {2, 3}).output(DType::F32, {2, 3}).output(DType::F16, {2, 3, 5});
  EXPECT_NE(factoryError(scaled).find("output scaled"), std::string::npos);

  KernelCall softcap("canvas_sample", {{"softcap", -1.0}});
  softcap.input(DType::F32, {2, 3, 5}, std::vector<float>(30)).input(DType::F32, {2}, std::vector<float>(2));
  softcap.input(DType::I64, {2, 2}, std::vector<int64_t>(4));
  softcap.output(DType::I64, {2, 3}).output(DType::I64, {2, 3}).output(DType::F32, {2, 3}).output(DType::F32, {2, 3, 5});
  EXPECT_NE(factoryError(softcap).find("softcap"), std::string::npos);
}

}  // namespace
}  // namespace dgemma::test
