// moe_route and moe_route_backward on CUDA (docs/kernels.md, "Model kernels"), f32; runtime/kernels/moe/
// cpu.cpp's MoeRouteKernel and MoeRouteBackwardKernel are their CPU twins. The backward runs
// RouteMath.h's routeBackward per token (a thread each), keeping each route's dscale term in a
// stream-ordered scratch buffer; then a thread per expert sums its terms in route order from zero, as
// the CPU kernel does, so dscale does not depend on the launch shape.
//
// moe_route: one thread per token (grid-stride) runs RouteMath.h's softmax, top-k selection and
// weighting, the arithmetic checked against the CPU kernel on the host, with its scratch
// (probabilities and taken flags, kMaxExperts each) in the thread's local memory. Only expf differs
// from the CPU's (libdevice against libm, a few ulp): the weights agree to about 1e-6 relative and the
// indices unless two probabilities tie within those ulps.
#include <cstdint>
#include <string>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/moe/CudaParts.h"
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

__global__ void moeRouteBackwardKernel(const float* logits, const float* expertScale, const int64_t* indices,
                                       const float* dWeights, float* dLogits, float* scaleTerms, int64_t tokens,
                                       int64_t experts, int64_t topK) {
  float probabilities[kMaxExperts], dProbabilities[kMaxExperts];
  for (int64_t token = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; token < tokens;
       token += int64_t(gridDim.x) * blockDim.x) {
    moe_route::softmax(logits + token * experts, experts, probabilities);
    moe_route::routeBackward(probabilities, expertScale, indices + token * topK, dWeights + token * topK, experts,
                             topK, dProbabilities, dLogits + token * experts, scaleTerms + token * topK);
  }
}

// dscale[e] = Σ over the routes to e, in route order, of their terms.
__global__ void sumScaleTermsKernel(const int64_t* indices, const float* scaleTerms, float* dScale, int64_t routes,
                                    int64_t experts) {
  for (int64_t expert = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; expert < experts;
       expert += int64_t(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t route = 0; route < routes; ++route)
      if (indices[route] == expert) sum += scaleTerms[route];
    dScale[expert] = sum;
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

class MoeRouteBackwardCudaKernel final : public Kernel {
 public:
  explicit MoeRouteBackwardCudaKernel(MoeRouteContract c) : c_(c) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    cudaStream_t stream = cuda::streamState(context).stream;
    const int64_t routes = c_.tokens * c_.topK;
    float* scaleTerms = nullptr;
    if (routes > 0) {
      DGEMMA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&scaleTerms), routes * sizeof(float), stream));
      moeRouteBackwardKernel<<<cuda::gridFor(static_cast<uint64_t>(c_.tokens), kThreads), kThreads, 0, stream>>>(
          inputs[0].as<const float>(), inputs[1].as<const float>(), inputs[2].as<const int64_t>(),
          inputs[3].as<const float>(), outputs[0].as<float>(), scaleTerms, c_.tokens, c_.experts, c_.topK);
      DGEMMA_CUDA_CHECK_LAUNCH("moeRouteBackwardKernel");
    }
    sumScaleTermsKernel<<<cuda::gridFor(static_cast<uint64_t>(c_.experts), kThreads), kThreads, 0, stream>>>(
        inputs[2].as<const int64_t>(), scaleTerms, outputs[1].as<float>(), routes, c_.experts);
    DGEMMA_CUDA_CHECK_LAUNCH("sumScaleTermsKernel");
    if (scaleTerms != nullptr) DGEMMA_CUDA_CHECK(cudaFreeAsync(scaleTerms, stream));
  }

 private:
  MoeRouteContract c_;
};

std::unique_ptr<Kernel> createMoeRouteBackwardCudaKernel(const KernelSignature& signature) {
  const MoeRouteContract c = parseMoeRouteBackwardContract(signature, {DType::F32});
  if (c.experts > kMaxExperts)
    failSignature(signature, "input logits: the CUDA moe_route_backward handles at most " +
                                 std::to_string(kMaxExperts) + " experts, got " + std::to_string(c.experts));
  return std::make_unique<MoeRouteBackwardCudaKernel>(c);
}

std::unique_ptr<Kernel> createMoeRouteCudaKernel(const KernelSignature& signature) {
  const MoeRouteContract c = parseMoeRouteContract(signature, {DType::F32});
  if (c.experts > kMaxExperts)
    failSignature(signature, "input logits: the CUDA moe_route handles at most " + std::to_string(kMaxExperts) +
                                 " experts, got " + std::to_string(c.experts));
  return std::make_unique<MoeRouteCudaKernel>(c);
}

}  // namespace

void registerMoeRouteCudaKernels(KernelRegistry& registry) {
  registry.add("moe_route", createMoeRouteCudaKernel);
  registry.add("moe_route_backward", createMoeRouteBackwardCudaKernel);
}

}  // namespace dgemma
