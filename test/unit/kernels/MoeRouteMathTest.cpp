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

// routeBackward per token, then each expert's terms summed in route order, against the CPU backward.
template <typename T>
void expectRouteBackwardMatchesCpu(DType dtype) {
  const int64_t tokens = 29, experts = 16, topK = 3;
  const std::vector<T> logits = randomValues<T>(tokens * experts, 91, -3.0, 3.0);
  const std::vector<T> scale = randomValues<T>(experts, 92, 0.5, 1.5);
  const std::vector<T> dWeights = randomValues<T>(tokens * topK, 93);
  std::vector<int64_t> indices(tokens * topK);
  std::vector<T> probabilities(experts), unusedWeights(topK);
  std::unique_ptr<bool[]> taken(new bool[experts]);
  for (int64_t token = 0; token < tokens; ++token) {  // the forward's choice
    moe_route::softmax(logits.data() + token * experts, experts, probabilities.data());
    moe_route::topKWeights(probabilities.data(), scale.data(), experts, topK, taken.get(), unusedWeights.data(),
                           indices.data() + token * topK);
  }
  KernelCall call("moe_route_backward", {{"top_k", topK}});
  call.input(dtype, {tokens, experts}, logits).input(dtype, {experts}, scale);
  call.input(DType::I64, {tokens, topK}, indices).input(dtype, {tokens, topK}, dWeights);
  call.output(dtype, {tokens, experts}).output(dtype, {experts});
  call.run();
  const std::vector<T> dLogits = call.result<T>(0), dScale = call.result<T>(1);
  std::vector<T> dProbabilities(experts), rowDLogits(experts), scaleTerms(tokens * topK);
  for (int64_t token = 0; token < tokens; ++token) {
    moe_route::softmax(logits.data() + token * experts, experts, probabilities.data());
    moe_route::routeBackward(probabilities.data(), scale.data(), indices.data() + token * topK,
                             dWeights.data() + token * topK, experts, topK, dProbabilities.data(), rowDLogits.data(),
                             scaleTerms.data() + token * topK);
    for (int64_t e = 0; e < experts; ++e) ASSERT_EQ(dLogits[token * experts + e], rowDLogits[e]) << token << ", " << e;
  }
  for (int64_t e = 0; e < experts; ++e) {
    T sum = 0;
    for (int64_t route = 0; route < tokens * topK; ++route)
      if (indices[route] == e) sum += scaleTerms[route];
    EXPECT_EQ(dScale[e], sum) << "expert " << e;
  }
}

TEST(MoeRouteMathTest, BackwardMatchesTheCpuKernel) {
  expectRouteBackwardMatchesCpu<float>(DType::F32);
  expectRouteBackwardMatchesCpu<double>(DType::F64);
}

TEST(MoeRouteMathTest, MatchesTheCpuKernelInF32) { expectRouteMathMatchesCpu<float>(DType::F32); }
TEST(MoeRouteMathTest, MatchesTheCpuKernelInF64) { expectRouteMathMatchesCpu<double>(DType::F64); }

}  // namespace
}  // namespace dgemma::test
