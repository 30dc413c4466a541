// adamw: one fused pass of the AdamW update over a parameter, its gradient and its two moments
// (docs/kernels.md), the op's formula evaluated in T (f32 moments and masters, as Megatron keeps them)
// by AdamwMath.h, which the CUDA kernel evaluates too.

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/optimizer/AdamwMath.h"
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
    T* newParam = outputs[0].as<T>();
    T* newFirst = outputs[1].as<T>();
    T* newSecond = outputs[2].as<T>();
    const optimizer::AdamwStepScalars<T> scalars = {inputs[4].as<const T>()[0], inputs[5].as<const T>()[0],
                                                    inputs[6].as<const T>()[0], inputs[7].as<const T>()[0]};
    const optimizer::AdamwAttributes<T> attributes = optimizer::adamwAttributes<T>(
        settings_.beta1, settings_.beta2, settings_.epsilon, settings_.weightDecay);
    cpu::parallelFor(context, settings_.count, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const optimizer::AdamwElement<T> updated =
            optimizer::adamwUpdate(attributes, scalars, param[i], grad[i], firstMoment[i], secondMoment[i]);
        newParam[i] = updated.param;
        newFirst[i] = updated.firstMoment;
        newSecond[i] = updated.secondMoment;
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
