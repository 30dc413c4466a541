// adamw: one fused pass of the AdamW update over a parameter, its gradient and its two moments
// (docs/kernels.md), the op's formula evaluated in T (f32 moments and masters, as Megatron keeps them).
#include <cmath>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/optimizer/Contract.h"

namespace dgemma {
namespace {

template <typename T>
class AdamwKernel final : public Kernel {
 public:
  explicit AdamwKernel(AdamwContract settings) : settings_(settings) {}

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
    cpu::parallelFor(context, settings_.count, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
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
  AdamwContract settings_;
};

std::unique_ptr<Kernel> createAdamwKernel(const KernelSignature& signature) {
  const AdamwContract contract = parseAdamwContract(signature, {DType::F32, DType::F64});
  if (contract.dtype == DType::F64) return std::make_unique<AdamwKernel<double>>(contract);
  return std::make_unique<AdamwKernel<float>>(contract);
}

}  // namespace

void registerOptimizerCpuKernels(KernelRegistry& registry) { registry.add("adamw", createAdamwKernel); }

}  // namespace dgemma
