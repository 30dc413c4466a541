// runtime/kernels/moe/RouteMath.h, the per-token arithmetic of the CUDA moe_route, checked on the
// host against the CPU kernel bit for bit (f32 and f64), with exact ties among the logits so that the
// tie order (lower expert id first) is exercised.
#include "KernelTestSupport.h"
#include "runtime/kernels/moe/RouteMath.h"

namespace dgemma::test {
namespace {

template <typename T>
void expectRouteMathMatchesCpu(DType dtype) {
  for (const auto& [tokens, experts, topK] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {37, 8, 2}, {5, 128, 8}, {3, 4, 4}, {9, 1, 1}}) {
    std::vector<T> logits = randomValues<T>(tokens * experts, 81 + static_cast<uint32_t>(experts), -3.0, 3.0);
    for (size_t i = 0; i < logits.size(); i += 3) logits[i] = static_cast<T>(0.5);  // exact ties
    const std::vector<T> scale = randomValues<T>(experts, 82, 0.5, 1.5);
    KernelCall call("moe_route", {{"top_k", topK}});
    call.input(dtype, {tokens, experts}, logits).input(dtype, {experts}, scale);
    call.output(dtype, {tokens, topK}).output(DType::I64, {tokens, topK});
    call.run();
    const std::vector<T> weights = call.result<T>(0);
    const std::vector<int64_t> indices = call.result<int64_t>(1);
    std::vector<T> probabilities(experts), rowWeights(topK);
    std::vector<int64_t> rowIndices(topK);
    std::unique_ptr<bool[]> taken(new bool[experts]);
    for (int64_t token = 0; token < tokens; ++token) {
      moe_route::softmax(logits.data() + token * experts, experts, probabilities.data());
      moe_route::topKWeights(probabilities.data(), scale.data(), experts, topK, taken.get(), rowWeights.data(),
                             rowIndices.data());
      for (int64_t j = 0; j < topK; ++j) {
        ASSERT_EQ(indices[token * topK + j], rowIndices[j]) << "token " << token << " j " << j << " of " << experts;
        ASSERT_EQ(weights[token * topK + j], rowWeights[j]) << "token " << token << " j " << j << " of " << experts;
      }
    }
  }
}

TEST(MoeRouteMathTest, MatchesTheCpuKernelInF32) { expectRouteMathMatchesCpu<float>(DType::F32); }
TEST(MoeRouteMathTest, MatchesTheCpuKernelInF64) { expectRouteMathMatchesCpu<double>(DType::F64); }

}  // namespace
}  // namespace dgemma::test
