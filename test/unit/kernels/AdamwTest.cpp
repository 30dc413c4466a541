// adamw against AdamW written out in double (docs/training.md, "AdamW and clipping"), with weight decay, a gradient scale
// and bias corrections of a late step; and its factory's checks.
#include <cmath>

#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

const nlohmann::json kAttrs = {{"beta1", 0.9}, {"beta2", 0.95}, {"epsilon", 1e-8}, {"weight_decay", 0.1}};

TEST(AdamwTest, MatchesAdamwInDouble) {
  const size_t count = 40000;  // several parallel chunks
  const std::vector<float> param = randomValues<float>(count, 1), grad = randomValues<float>(count, 2),
                           first = randomValues<float>(count, 3, -0.1, 0.1), second = randomValues<float>(count, 4, 0.0, 0.05);
  const float gradScale = 0.25f, lr = 3e-3f, correction1 = 0.271f, correction2 = 0.0489f;
  ThreadPool threads(2);
  KernelCall call("adamw", kAttrs);
  call.input(DType::F32, {200, 200}, param).input(DType::F32, {200, 200}, grad).input(DType::F32, {200, 200}, first);
  call.input(DType::F32, {200, 200}, second);
  for (float scalar : {gradScale, lr, correction1, correction2}) call.input(DType::F32, {}, std::vector<float>{scalar});
  call.output(DType::F32, {200, 200}).output(DType::F32, {200, 200}).output(DType::F32, {200, 200});
  call.run(&threads);

  std::vector<double> expectedParam(count), expectedFirst(count), expectedSecond(count);
  for (size_t i = 0; i < count; ++i) {
    const double g = double(grad[i]) * gradScale;
    expectedFirst[i] = 0.9 * first[i] + 0.1 * g;
    expectedSecond[i] = 0.95 * second[i] + 0.05 * g * g;
    const double adam = (expectedFirst[i] / correction1) / (std::sqrt(expectedSecond[i] / correction2) + 1e-8);
    expectedParam[i] = param[i] - double(lr) * (adam + 0.1 * param[i]);
  }
  expectClose(call.result<float>(0), expectedParam, 1e-6);
  expectClose(call.result<float>(1), expectedFirst, 1e-6);
  expectClose(call.result<float>(2), expectedSecond, 1e-6);
}

// The CPU kernel evaluates AdamwMath.h's adamwUpdate, which the CUDA kernel evaluates too; this pins
// its bytes to the op's formula written out in f32, one IEEE operation at a time, in the contract's
// order (the kernel's bytes before the header existed).
TEST(AdamwTest, EqualsTheFormulaInF32BitForBit) {
  const size_t count = 5000;
  const std::vector<float> param = randomValues<float>(count, 11), grad = randomValues<float>(count, 12),
                           first = randomValues<float>(count, 13, -0.1, 0.1),
                           second = randomValues<float>(count, 14, 0.0, 0.05);
  const float gradScale = 0.37f, lr = 1e-3f, correction1 = 0.651f, correction2 = 0.0199f;
  ThreadPool threads(2);
  KernelCall call("adamw", kAttrs);
  for (const std::vector<float>* tensor : {&param, &grad, &first, &second}) call.input(DType::F32, {5000}, *tensor);
  for (float scalar : {gradScale, lr, correction1, correction2}) call.input(DType::F32, {}, std::vector<float>{scalar});
  call.output(DType::F32, {5000}).output(DType::F32, {5000}).output(DType::F32, {5000});
  call.run(&threads);
  const std::vector<float> newParam = call.result<float>(0), newFirst = call.result<float>(1),
                           newSecond = call.result<float>(2);
  const float beta1 = 0.9f, beta2 = 0.95f, keep1 = static_cast<float>(1.0 - 0.9), keep2 = static_cast<float>(1.0 - 0.95);
  const float epsilon = 1e-8f, weightDecay = 0.1f;
  for (size_t i = 0; i < count; ++i) {
    const float g = grad[i] * gradScale;
    const float m = beta1 * first[i] + keep1 * g;
    const float v = beta2 * second[i] + keep2 * (g * g);
    const float step = (m / correction1) / (std::sqrt(v / correction2) + epsilon) + weightDecay * param[i];
    ASSERT_EQ(newParam[i], param[i] - lr * step) << i;
    ASSERT_EQ(newFirst[i], m) << i;
    ASSERT_EQ(newSecond[i], v) << i;
  }
}

TEST(AdamwTest, FactoryRejectsMismatchedBuffers) {
  KernelCall call("adamw", kAttrs);
  call.input(DType::F32, {4}, std::vector<float>(4)).input(DType::F32, {3}, std::vector<float>(3));
  call.input(DType::F32, {4}, std::vector<float>(4)).input(DType::F32, {4}, std::vector<float>(4));
  for (int i = 0; i < 4; ++i) call.input(DType::F32, {}, std::vector<float>{1.0f});
  call.output(DType::F32, {4}).output(DType::F32, {4}).output(DType::F32, {4});
  EXPECT_NE(factoryError(call).find("input grad"), std::string::npos);

  KernelCall scalar("adamw", kAttrs);
  for (int i = 0; i < 4; ++i) scalar.input(DType::F32, {4}, std::vector<float>(4));
  scalar.input(DType::F32, {1}, std::vector<float>{1.0f});
  for (int i = 0; i < 3; ++i) scalar.input(DType::F32, {}, std::vector<float>{1.0f});
  scalar.output(DType::F32, {4}).output(DType::F32, {4}).output(DType::F32, {4});
  EXPECT_NE(factoryError(scalar).find("input grad_scale"), std::string::npos);
}

}  // namespace
}  // namespace dgemma::test
