// Philox4x32-10 known answers, the element mapping of docs/kernels.md, and random_uniform.
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

}  // namespace
}  // namespace dgemma::test
