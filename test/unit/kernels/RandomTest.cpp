// Philox4x32-10 known answers, the element mappings of docs/kernels.md, random_uniform and random_int.
#include <optional>
#include <set>

#include "KernelTestSupport.h"
#include "runtime/core/Philox.h"

namespace dgemma::test {
namespace {

// The published known-answer vectors of Random123 (kat_vectors, philox4x32_10).
TEST(Philox, KnownAnswers) {
  EXPECT_EQ(philox4x32x10({0, 0, 0, 0}, {0, 0}), (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32x10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32x10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, UniformFollowsTheDocumentedCounterLayout) {
  const uint64_t seed = 0x0123456789abcdefull, stream = 5, offset = 0x1122334455667788ull;
  const uint64_t block = 0x100000002ull;  // a block index with a non-zero high word
  // key = (seed low, seed high); counter = (block low, block high ^ stream, offset low, offset high).
  const PhiloxCounter words =
      philox4x32x10({0x00000002, 0x00000001 ^ 5, 0x55667788, 0x11223344}, {0x89abcdef, 0x01234567});
  for (uint64_t word = 0; word < 4; ++word)
    EXPECT_EQ(philoxUniform(seed, stream, offset, 4 * block + word),
              static_cast<float>(words[word] >> 8) / 16777216.0f);
}

TEST(Philox, UniformStaysBelowOne) {
  EXPECT_EQ(philoxWordToUniform(0), 0.0f);
  EXPECT_LT(philoxWordToUniform(0xffffffffu), 1.0f);
  EXPECT_EQ(philoxWordToUniform(0xffffffffu), 1.0f - 1.0f / 16777216.0f);
}

// The word of element `index` straight from the documented counter layout.
uint32_t referenceWord(uint64_t seed, uint64_t stream, uint64_t offset, uint64_t index) {
  const uint64_t block = index / 4;
  const PhiloxCounter counter = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32) ^ static_cast<uint32_t>(stream),
                                 static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)};
  return philox4x32x10(counter, {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)})[index % 4];
}

// docs/kernels.md's integer rule written out: low bits for a power of two, else Lemire's product with
// the words whose low half is below 2^32 mod high rejected and redrawn at offset + attempt.
uint64_t referenceInt(uint64_t seed, uint64_t stream, uint64_t offset, uint64_t index, uint64_t high, int* attempts = nullptr) {
  for (uint64_t attempt = 0;; ++attempt) {
    const uint64_t word = referenceWord(seed, stream, offset + attempt, index);
    if (attempts != nullptr) *attempts = static_cast<int>(attempt) + 1;
    if ((high & (high - 1)) == 0) return word % high;
    const uint64_t product = word * high;
    if (product % (uint64_t{1} << 32) >= (uint64_t{1} << 32) % high) return product >> 32;
  }
}

TEST(Philox, WordToIntByHand) {
  // 2^32 = 5 · 858993459 + 1: only a word with a zero low half (word 0) is rejected for high 5.
  EXPECT_EQ(philoxWordToInt(0, 5), std::nullopt);
  EXPECT_EQ(philoxWordToInt(1, 5), 0u);            // 5 = 0 · 2^32 + 5
  EXPECT_EQ(philoxWordToInt(0x80000000u, 5), 2u);  // 5 · 2^31 = 2 · 2^32 + 2^31
  EXPECT_EQ(philoxWordToInt(0xffffffffu, 5), 4u);  // 5 · (2^32 − 1) = 4 · 2^32 + (2^32 − 5)
  // Powers of two keep the low bits, from one value (high 1) to the whole word (high 2^32).
  EXPECT_EQ(philoxWordToInt(0xdeadbeefu, 1), 0u);
  EXPECT_EQ(philoxWordToInt(0xdeadbeefu, 1u << 18), 0x1beefu);
  EXPECT_EQ(philoxWordToInt(0xdeadbeefu, uint64_t{1} << 32), 0xdeadbeefu);
}

TEST(Philox, IntFollowsTheDocumentedRuleIncludingRetries) {
  const uint64_t seed = 0x0123456789abcdefull, stream = 2, offset = 40;
  // high = 2^31 + 1 rejects almost half the words (2^32 mod high = 2^31 − 1), so retries happen.
  int retried = 0;
  for (uint64_t index = 0; index < 2000; ++index) {
    int attempts = 0;
    const uint64_t expected = referenceInt(seed, stream, offset, index, (uint64_t{1} << 31) + 1, &attempts);
    ASSERT_EQ(philoxInt(seed, stream, offset, index, (uint64_t{1} << 31) + 1), expected) << "element " << index;
    retried += attempts > 1;
    for (uint64_t high : {uint64_t{1} << 18, uint64_t{5}, uint64_t{262143}, uint64_t{1} << 32})
      ASSERT_EQ(philoxInt(seed, stream, offset, index, high), referenceInt(seed, stream, offset, index, high))
          << "element " << index << ", high " << high;
  }
  EXPECT_GT(retried, 500);
}

std::vector<float> randomUniform(int64_t seed, int64_t offset, int64_t stream, int64_t count,
                                 ThreadPool* threads = nullptr) {
  KernelCall call("random_uniform", {{"stream", stream}});
  call.input<int64_t>(DType::I64, {2}, {seed, offset}).output(DType::F32, {count});
  call.run(threads);
  return call.result<float>();
}

TEST(RandomUniformKernel, ElementIIsPhiloxUniformOfI) {
  const int64_t seed = -42;  // the seed's bits, as uint64, form the key
  const std::vector<float> values = randomUniform(seed, 7, 3, 1001);  // not a multiple of 4
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(values[i], philoxUniform(static_cast<uint64_t>(seed), 3, 7, i)) << "element " << i;
}

TEST(RandomUniformKernel, DeterministicPerKeyAndDistinctPerStreamAndOffset) {
  ThreadPool threads(2);
  const std::vector<float> base = randomUniform(1234, 0, 0, 100000);
  EXPECT_EQ(randomUniform(1234, 0, 0, 100000, &threads), base);  // threads do not change the numbers
  EXPECT_NE(randomUniform(1234, 0, 1, 100000), base);
  EXPECT_NE(randomUniform(1234, 1, 0, 100000), base);
  EXPECT_NE(randomUniform(1235, 0, 0, 100000), base);

  double sum = 0;
  for (float value : base) {
    ASSERT_GE(value, 0.0f);
    ASSERT_LT(value, 1.0f);
    sum += value;
  }
  EXPECT_NEAR(sum / base.size(), 0.5, 0.01);  // 100000 uniforms: the mean's std is about 0.001
  EXPECT_GT(std::set<float>(base.begin(), base.end()).size(), 99000u);
}

// A draw with keys `keys` ([2] or [N, 2]) into `shape`.
template <typename T>
std::vector<T> draw(const std::string& op, nlohmann::json attrs, std::vector<int64_t> keyShape, const std::vector<int64_t>& keys,
                    std::vector<int64_t> shape, ThreadPool* threads = nullptr) {
  KernelCall call(op, std::move(attrs));
  call.input(DType::I64, std::move(keyShape), keys).output(op == "random_int" ? DType::I64 : DType::F32, std::move(shape));
  call.run(threads);
  return call.result<T>();
}

// Row n of a draw with one key per row equals a one-row draw with key[n]: a sample's numbers do not
// depend on its position in the batch (or on the rows around it).
TEST(RandomKernels, RowKeysMakeRowsIndependentOfTheirPosition) {
  const std::vector<int64_t> keys = {11, 0, -5, 3, 11, 1};  // rows 0 and 2 differ only in the offset
  ThreadPool threads(2);
  for (const std::vector<int64_t>& rowShape : {std::vector<int64_t>{}, std::vector<int64_t>{7}, std::vector<int64_t>{3, 5}}) {
    std::vector<int64_t> shape = {3}, oneRow = {1};
    shape.insert(shape.end(), rowShape.begin(), rowShape.end());
    oneRow.insert(oneRow.end(), rowShape.begin(), rowShape.end());
    const std::vector<float> uniforms = draw<float>("random_uniform", {{"stream", 4}}, {3, 2}, keys, shape, &threads);
    const std::vector<int64_t> ints = draw<int64_t>("random_int", {{"stream", 4}, {"high", 1000}}, {3, 2}, keys, shape, &threads);
    const size_t rowLength = uniforms.size() / 3;
    for (size_t row = 0; row < 3; ++row) {
      const std::vector<int64_t> key = {keys[2 * row], keys[2 * row + 1]};
      const std::vector<float> alone = draw<float>("random_uniform", {{"stream", 4}}, {1, 2}, key, oneRow);
      EXPECT_EQ(std::vector<float>(uniforms.begin() + row * rowLength, uniforms.begin() + (row + 1) * rowLength), alone);
      // The same as a whole-tensor draw with that key: element indices restart at 0 in every row.
      EXPECT_EQ(draw<float>("random_uniform", {{"stream", 4}}, {2}, key, {static_cast<int64_t>(rowLength)}), alone);
      const std::vector<int64_t> aloneInts = draw<int64_t>("random_int", {{"stream", 4}, {"high", 1000}}, {1, 2}, key, oneRow);
      EXPECT_EQ(std::vector<int64_t>(ints.begin() + row * rowLength, ints.begin() + (row + 1) * rowLength), aloneInts);
    }
  }
}

TEST(RandomIntKernel, ElementIIsPhiloxIntOfIAndDeterministic) {
  ThreadPool threads(2);
  for (int64_t high : {int64_t{5}, int64_t{1} << 18, (int64_t{1} << 31) + 1}) {
    const std::vector<int64_t> values = draw<int64_t>("random_int", {{"stream", 3}, {"high", high}}, {2}, {-42, 7}, {1001});
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(values[i], static_cast<int64_t>(referenceInt(static_cast<uint64_t>(-42), 3, 7, i, high))) << "element " << i;
    EXPECT_EQ(draw<int64_t>("random_int", {{"stream", 3}, {"high", high}}, {2}, {-42, 7}, {1001}, &threads), values);
  }
}

TEST(RandomIntKernel, StaysInRangeAndReachesEveryValue) {
  const std::vector<int64_t> five = draw<int64_t>("random_int", {{"stream", 0}, {"high", 5}}, {2}, {9, 0}, {10000});
  std::vector<int> counts(5, 0);
  for (int64_t value : five) {
    ASSERT_GE(value, 0);
    ASSERT_LT(value, 5);
    ++counts[value];
  }
  for (int count : counts) EXPECT_GT(count, 1800);  // each expected 2000 times, std about 40

  const std::vector<int64_t> one = draw<int64_t>("random_int", {{"stream", 0}, {"high", 1}}, {2}, {9, 0}, {100});
  EXPECT_EQ(one, std::vector<int64_t>(100, 0));
  const std::vector<int64_t> wide =
      draw<int64_t>("random_int", {{"stream", 0}, {"high", int64_t{1} << 32}}, {2}, {9, 0}, {1000});
  for (int64_t value : wide) ASSERT_TRUE(value >= 0 && value < (int64_t{1} << 32));
  EXPECT_GT(*std::max_element(wide.begin(), wide.end()), int64_t{1} << 31);  // the top bit is used
}

// A power of two takes the low bits of the very word random_uniform turns into a float.
TEST(RandomIntKernel, PowerOfTwoIsTheLowBitsOfTheUniformsWord) {
  const int64_t high = int64_t{1} << 18;
  const std::vector<int64_t> ints = draw<int64_t>("random_int", {{"stream", 6}, {"high", high}}, {2, 2}, {5, 1, 6, 2}, {2, 50});
  for (size_t i = 0; i < ints.size(); ++i) {
    const uint64_t row = i / 50, index = i % 50;
    ASSERT_EQ(static_cast<uint64_t>(ints[i]), referenceWord(5 + row, 6, 1 + row, index) & (high - 1)) << "element " << i;
  }
}

TEST(RandomKernels, RejectBadKeysStreamsAndBounds) {
  KernelCall key("random_uniform", {{"stream", 0}});
  key.input<int64_t>(DType::I64, {3}, {1, 2, 3}).output(DType::F32, {4});
  EXPECT_EQ(factoryError(key), "step 0 (random_uniform): input key has shape [3], expected [2] or [N, 2]");
  KernelCall rows("random_int", {{"stream", 0}, {"high", 4}});
  rows.input<int64_t>(DType::I64, {2, 2}, {1, 2, 3, 4}).output(DType::I64, {3, 4});
  EXPECT_EQ(factoryError(rows), "step 0 (random_int): output y has shape [3,4], expected [2, ...] (one row per key)");
  for (int64_t high : {int64_t{0}, (int64_t{1} << 32) + 1}) {
    KernelCall bound("random_int", {{"stream", 0}, {"high", high}});
    bound.input<int64_t>(DType::I64, {2}, {1, 2}).output(DType::I64, {4});
    EXPECT_EQ(factoryError(bound),
              "step 0 (random_int): attribute 'high': expected an integer in [1, 2^32], got " + std::to_string(high));
  }
  KernelCall stream("random_int", {{"stream", int64_t{1} << 32}, {"high", 4}});
  stream.input<int64_t>(DType::I64, {2}, {1, 2}).output(DType::I64, {4});
  EXPECT_EQ(factoryError(stream), "step 0 (random_int): attribute 'stream': expected an integer in [0, 2^32), got 4294967296");
}

}  // namespace
}  // namespace dgemma::test
