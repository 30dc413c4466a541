// adamw: one fused pass of the AdamW update over a parameter, its gradient and its two moments
// (docs/kernels.md), the op's formula evaluated in T (f32 moments and masters, as Megatron keeps them).
#include <cmath>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma {
namespace {

struct AdamwSettings {
  double beta1, beta2, epsilon, weightDecay;
};

template <typename T>
class AdamwKernel final : public Kernel {
 public:
  AdamwKernel(int64_t count, AdamwSettings settings) : count_(count), settings_(settings) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* param = inputs[0].as<const T>();
    const T* grad = inputs[1].as<const T>();
    const T* firstMoment = inputs[2].as<const T>();
    const T* secondMoment = inputs[3].as<const T>();
    const T gradScale = inputs[4].as<const T>()[0], lr = inputs[5].as<const T>()[0];
    const T correction1 = inputs[6].as<const T>()[0], correction2 = inputs[7].as<const T>()[0];
    T* newParam = outputs[0].as<T>();
    T* newFirst = outputs[1].as<T>();
    T* newSecond = outputs[2].as<T>();
    const T beta1 = static_cast<T>(settings_.beta1), beta2 = static_cast<T>(settings_.beta2);
    const T keep1 = static_cast<T>(1.0 - settings_.beta1), keep2 = static_cast<T>(1.0 - settings_.beta2);
    const T epsilon = static_cast<T>(settings_.epsilon), weightDecay = static_cast<T>(settings_.weightDecay);
    cpu::parallelFor(context, count_, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const T g = grad[i] * gradScale;
        const T m = beta1 * firstMoment[i] + keep1 * g;
        const T v = beta2 * secondMoment[i] + keep2 * (g * g);
        const T step = (m / correction1) / (std::sqrt(v / correction2) + epsilon) + weightDecay * param[i];
        newParam[i] = param[i] - lr * step;
        newFirst[i] = m;
        newSecond[i] = v;
      }
    });
  }

 private:
  int64_t count_;
  AdamwSettings settings_;
};

std::unique_ptr<Kernel> createAdamw(const KernelSignature& signature) {
  expectArity(signature, 8, 3);
  const Buffer& param = *signature.inputs[0];
  expectDType(signature, param, {DType::F32, DType::F64}, "input param");
  static const char* const kTensorRoles[] = {"input param", "input grad", "input exp_avg", "input exp_avg_sq"};
  for (size_t i = 1; i < 4; ++i) {
    expectDType(signature, *signature.inputs[i], {param.dtype}, kTensorRoles[i]);
    cpu::expectShape(signature, *signature.inputs[i], param.shape, kTensorRoles[i]);
  }
  static const char* const kScalarRoles[] = {"input grad_scale", "input lr", "input bias_correction1", "input bias_correction2"};
  for (size_t i = 4; i < 8; ++i) {
    expectDType(signature, *signature.inputs[i], {param.dtype}, kScalarRoles[i - 4]);
    cpu::expectShape(signature, *signature.inputs[i], {}, kScalarRoles[i - 4]);
  }
  for (size_t i = 0; i < 3; ++i) {
    const std::string role = "output " + std::to_string(i);
    expectDType(signature, *signature.outputs[i], {param.dtype}, role);
    cpu::expectShape(signature, *signature.outputs[i], param.shape, role);
  }
  AdamwSettings settings{attrDouble(signature, "beta1"), attrDouble(signature, "beta2"), attrDouble(signature, "epsilon"),
                         attrDouble(signature, "weight_decay")};
  if (param.dtype == DType::F64) return std::make_unique<AdamwKernel<double>>(param.numElements(), settings);
  return std::make_unique<AdamwKernel<float>>(param.numElements(), settings);
}

}  // namespace

void registerOptimizerCpuKernels(KernelRegistry& registry) { registry.add("adamw", createAdamw); }

}  // namespace dgemma
