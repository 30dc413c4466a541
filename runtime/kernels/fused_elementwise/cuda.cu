// fused_elementwise on CUDA (f32 and bf16 values, computed in f32): a thread per output element
// (grid-stride) runs FusedElementwiseMath.h's interpreter over the program, which the launch passes
// by value with the inputs' broadcast layout; no intermediate value touches memory. The kernel reads
// and writes its bf16 buffers itself (KernelTraits::handlesReducedFloats), rounding a bf16 value
// where the unfused chain would have stored it.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/fused_elementwise/Contract.h"
#include "runtime/kernels/fused_elementwise/FusedElementwiseMath.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;

struct InputPointers {
  const void* data[fused_math::kMaxInputs];
};

__global__ void fusedElementwiseKernel(const fused_math::FusedProgram program, const InputPointers inputs, void* output) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < program.count; index += stride)
    fused_math::evaluateElement(program, inputs.data, output, index);
}

class FusedElementwiseCudaKernel final : public Kernel {
 public:
  explicit FusedElementwiseCudaKernel(fused_math::FusedProgram program) : program_(program) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (program_.count == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    InputPointers pointers{};
    for (size_t k = 0; k < inputs.size(); ++k) pointers.data[k] = inputs[k].data;
    fusedElementwiseKernel<<<cuda::gridFor(static_cast<uint64_t>(program_.count), kThreads), kThreads, 0, stream>>>(
        program_, pointers, outputs[0].data);
    DGEMMA_CUDA_CHECK_LAUNCH("fusedElementwiseKernel");
  }

 private:
  fused_math::FusedProgram program_;
};

std::unique_ptr<Kernel> createFusedElementwiseCudaKernel(const KernelSignature& signature) {
  const FusedElementwiseContract contract = parseFusedElementwiseContract(signature, {DType::F32, DType::BF16});
  std::vector<std::vector<int64_t>> inputShapes, strides;
  for (const Buffer* input : signature.inputs) inputShapes.push_back(input->shape);
  const std::vector<int64_t> dims = fused_math::mergedLayout(contract.shape, inputShapes, strides);
  const std::string limits =
      fused_math::fusedProgramLimits(inputShapes.size(), contract.program.instructions.size(), dims.size());
  if (!limits.empty()) failSignature(signature, "fused_elementwise: the cuda kernel takes " + limits);
  return std::make_unique<FusedElementwiseCudaKernel>(
      fused_math::encodeProgram(contract.program, contract.valueDTypes, contract.shape, inputShapes));
}

}  // namespace

void registerFusedElementwiseCudaKernels(KernelRegistry& registry) {
  registry.add("fused_elementwise", createFusedElementwiseCudaKernel, KernelTraits{.handlesReducedFloats = true});
}

}  // namespace dgemma
