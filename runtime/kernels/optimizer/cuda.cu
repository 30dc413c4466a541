// adamw on CUDA (docs/kernels.md, "Optimizer kernel"), f32; runtime/kernels/optimizer/cpu.cpp is its CPU twin.
// One fused pass over the flat buffers, one thread per element (grid-stride), each evaluating
// AdamwMath.h's adamwUpdate, the function the CPU kernel calls: with FMA contraction off and IEEE
// division and sqrt, the new parameter and moments equal the CPU kernel's bit for bit. The run-time
// scalars (grad_scale, lr, the bias corrections) stay on the device: each thread reads them, so the
// step needs no host round trip.
#include <cstdint>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/optimizer/AdamwMath.h"
#include "runtime/kernels/optimizer/Contract.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;

__global__ void adamwKernel(const float* param, const float* grad, const float* firstMoment, const float* secondMoment,
                            const float* gradScale, const float* lr, const float* correction1,
                            const float* correction2, float* newParam, float* newFirst, float* newSecond,
                            optimizer::AdamwAttributes<float> attributes, int64_t count) {
  const optimizer::AdamwStepScalars<float> scalars = {*gradScale, *lr, *correction1, *correction2};
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const optimizer::AdamwElement<float> updated =
        optimizer::adamwUpdate(attributes, scalars, param[i], grad[i], firstMoment[i], secondMoment[i]);
    newParam[i] = updated.param;
    newFirst[i] = updated.firstMoment;
    newSecond[i] = updated.secondMoment;
  }
}

class AdamwCudaKernel final : public Kernel {
 public:
  explicit AdamwCudaKernel(AdamwContract contract)
      : count_(contract.count),
        attributes_(optimizer::adamwAttributes<float>(contract.beta1, contract.beta2, contract.epsilon,
                                                      contract.weightDecay)) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (count_ == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    adamwKernel<<<cuda::gridFor(static_cast<uint64_t>(count_), kThreads), kThreads, 0, stream>>>(
        inputs[0].as<const float>(), inputs[1].as<const float>(), inputs[2].as<const float>(),
        inputs[3].as<const float>(), inputs[4].as<const float>(), inputs[5].as<const float>(),
        inputs[6].as<const float>(), inputs[7].as<const float>(), outputs[0].as<float>(), outputs[1].as<float>(),
        outputs[2].as<float>(), attributes_, count_);
    DGEMMA_CUDA_CHECK_LAUNCH("adamwKernel");
  }

 private:
  int64_t count_;
  optimizer::AdamwAttributes<float> attributes_;
};

std::unique_ptr<Kernel> createAdamwCudaKernel(const KernelSignature& signature) {
  return std::make_unique<AdamwCudaKernel>(parseAdamwContract(signature, {DType::F32}));
}

}  // namespace

void registerOptimizerCudaKernels(KernelRegistry& registry) { registry.add("adamw", createAdamwCudaKernel); }

}  // namespace dgemma
