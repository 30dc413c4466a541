// moe_route on CUDA (docs/kernels.md, "moe_route"), f32; runtime/kernels/moe/cpu.cpp's MoeRouteKernel
// is its CPU twin. One thread per token (grid-stride) runs RouteMath.h's softmax, top-k selection and
// weighting, the arithmetic checked against the CPU kernel on the host, with its scratch
// (probabilities and taken flags, kMaxExperts each) in the thread's local memory. Only expf differs
// from the CPU's (libdevice against libm, a few ulp): the weights agree to about 1e-6 relative and the
// indices unless two probabilities tie within those ulps.
#include <cstdint>
#include <string>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/moe/Contract.h"
#include "runtime/kernels/moe/RouteMath.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 128;
constexpr int64_t kMaxExperts = 512;

__global__ void moeRouteKernel(const float* logits, const float* expertScale, float* weights, int64_t* indices,
                               int64_t tokens, int64_t experts, int64_t topK) {
  float probabilities[kMaxExperts];
  bool taken[kMaxExperts];
  for (int64_t token = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; token < tokens;
       token += int64_t(gridDim.x) * blockDim.x) {
    moe_route::softmax(logits + token * experts, experts, probabilities);
    moe_route::topKWeights(probabilities, expertScale, experts, topK, taken, weights + token * topK,
                           indices + token * topK);
  }
}

class MoeRouteCudaKernel final : public Kernel {
 public:
  explicit MoeRouteCudaKernel(MoeRouteContract c) : c_(c) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (c_.tokens == 0) return;
    moeRouteKernel<<<cuda::gridFor(static_cast<uint64_t>(c_.tokens), kThreads), kThreads, 0,
                     cuda::streamState(context).stream>>>(inputs[0].as<const float>(), inputs[1].as<const float>(),
                                                          outputs[0].as<float>(), outputs[1].as<int64_t>(), c_.tokens,
                                                          c_.experts, c_.topK);
    DGEMMA_CUDA_CHECK_LAUNCH("moeRouteKernel");
  }

 private:
  MoeRouteContract c_;
};

std::unique_ptr<Kernel> createMoeRouteCudaKernel(const KernelSignature& signature) {
  const MoeRouteContract c = parseMoeRouteContract(signature, {DType::F32});
  if (c.experts > kMaxExperts)
    failSignature(signature, "input logits: the CUDA moe_route handles at most " + std::to_string(kMaxExperts) +
                                 " experts, got " + std::to_string(c.experts));
  return std::make_unique<MoeRouteCudaKernel>(c);
}

}  // namespace

void registerMoeRouteCudaKernels(KernelRegistry& registry) { registry.add("moe_route", createMoeRouteCudaKernel); }

}  // namespace dgemma
