// The products threaded on the backend's pool (runtime/kernels/matmul/BlasThreading.h) give the
// same bytes whatever the pool's size: matmul split into row or column blocks on pools of 2 and 3
// threads against the same blocks run one after another without a pool, and moe_experts with its
// experts side by side against the serial loop. threadProductsOnPool() lasts for the process.
#include <cstring>

#include "KernelTestSupport.h"
#include "runtime/kernels/matmul/BlasThreading.h"

namespace dgemma::test {
namespace {

struct ProductCase {
  int64_t m, k, n;
  bool transposeA = false, transposeB = false;
  int64_t batch = 1;  // leading dim of a, b shared
};

std::vector<float> runMatmul(const ProductCase& c, const std::vector<float>& a, const std::vector<float>& b,
                             ThreadPool* threads) {
  KernelCall call("matmul", {{"transpose_a", c.transposeA}, {"transpose_b", c.transposeB}});
  std::vector<int64_t> aShape = {c.transposeA ? c.k : c.m, c.transposeA ? c.m : c.k};
  if (c.batch > 1) aShape.insert(aShape.begin(), c.batch);
  std::vector<int64_t> cShape = {c.m, c.n};
  if (c.batch > 1) cShape.insert(cShape.begin(), c.batch);
  call.input(DType::F32, aShape, a)
      .input(DType::F32, {c.transposeB ? c.n : c.k, c.transposeB ? c.k : c.n}, b)
      .output(DType::F32, cShape);
  call.run(threads);
  return call.result<float>();
}

bool sameBytes(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

TEST(PooledProducts, MatmulBlocksGiveTheSameBytesOnEveryPool) {
  threadProductsOnPool();
  ASSERT_TRUE(productsThreadedOnPool());
  ThreadPool two(2), three(3);
  // Rows split (n <= m) and columns split (n > m), every transpose, extents that are no multiple of
  // the block alignment, a batched a with a shared b, and the head's shape of a small model.
  const std::vector<ProductCase> cases = {
      {300, 200, 100}, {100, 200, 300}, {300, 200, 100, true, false}, {100, 200, 300, false, true},
      {150, 130, 170, true, true},     {45, 96, 700, false, true, 3}, {512, 256, 2048, false, true},
  };
  for (const ProductCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "m=" << c.m << " k=" << c.k << " n=" << c.n << " transpose_a=" << c.transposeA
                                      << " transpose_b=" << c.transposeB << " batch=" << c.batch);
    const std::vector<float> a = randomValues<float>(c.batch * c.m * c.k, 21);
    const std::vector<float> b = randomValues<float>(c.k * c.n, 22);
    const std::vector<float> serial = runMatmul(c, a, b, nullptr);
    EXPECT_TRUE(sameBytes(runMatmul(c, a, b, &two), serial));
    EXPECT_TRUE(sameBytes(runMatmul(c, a, b, &three), serial));
  }
}

TEST(PooledProducts, MoeExpertsSideBySideGiveTheSerialBytes) {
  threadProductsOnPool();
  ThreadPool threads(2);
  const int64_t tokens = 300, hidden = 64, topK = 2, experts = 8, expertHidden = 48;
  std::vector<int64_t> indices;
  for (int64_t route = 0; route < tokens * topK; ++route) indices.push_back((route * 5 + route / 7) % 7);  // expert 7 unused
  const std::vector<float> x = randomValues<float>(tokens * hidden, 31), weights = randomValues<float>(tokens * topK, 32),
                           gateUp = randomValues<float>(experts * 2 * expertHidden * hidden, 33, -0.3, 0.3),
                           down = randomValues<float>(experts * hidden * expertHidden, 34, -0.3, 0.3);
  auto run = [&](ThreadPool* pool) {
    KernelCall call("moe_experts", {{"expert_offset", 0}});
    call.input(DType::F32, {tokens, hidden}, x).input(DType::F32, {tokens, topK}, weights);
    call.input(DType::I64, {tokens, topK}, indices);
    call.input(DType::F32, {experts, 2 * expertHidden, hidden}, gateUp);
    call.input(DType::F32, {experts, hidden, expertHidden}, down);
    call.output(DType::F32, {tokens, hidden});
    call.run(pool);
    return call.result<float>();
  };
  EXPECT_TRUE(sameBytes(run(&threads), run(nullptr)));
}

}  // namespace
}  // namespace dgemma::test
