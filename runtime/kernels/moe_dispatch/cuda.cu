// moe_dispatch, moe_permute and moe_combine on CUDA, the expert dispatch around the all-to-all
// (runtime/kernels/moe_dispatch/cpu.cpp is their CPU twin; the local experts' GEMMs are
// runtime/kernels/moe/experts.cu's). moe_dispatch copies the indices to the host (one stream
// synchronisation), builds DispatchTable.h's table there, as the CPU kernel does, and copies it back.
//
// One thread per element of the token side, grid-stride: moe_permute copies the token's element to
// each of its k slots (elements of 2, 4 or 8 bytes, so 16-bit rows move as they are); moe_combine
// (f32) sums a token's k routes in order of j from zero, with FMA contraction off, so it rounds like
// the CPU kernel. The CPU kernels reject slots that are not a permutation; here, where checking
// would need a host round trip, a slot outside [0, M·k) is skipped (never written or read out of
// bounds) and the routing table that moe_dispatch builds is trusted to be a permutation; with
// -DDGEMMA_CUDA_DEBUG_BOUNDS=ON such a slot traps instead (DGEMMA_CUDA_BOUNDS), where the CPU kernel
// raises.
#include <cstdint>
#include <vector>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/moe_dispatch/Contract.h"
#include "runtime/kernels/moe_dispatch/DispatchTable.h"
#include "support/DType.h"

namespace dgemma {
namespace {

template <typename Word>
__global__ void permuteKernel(const Word* input, const int64_t* slots, Word* result, int64_t tokens, int64_t topK,
                              int64_t width) {
  const int64_t slotCount = tokens * topK;
  for (int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; index < tokens * width;
       index += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = index / width, column = index % width;
    const Word value = input[index];
    for (int64_t j = 0; j < topK; ++j) {
      const int64_t slot = slots[token * topK + j];
      DGEMMA_CUDA_BOUNDS(slot, slotCount);  // the CPU kernel rejects a slot outside the permutation
      if (slot >= 0 && slot < slotCount) result[slot * width + column] = value;
    }
  }
}

__global__ void combineKernel(const float* rows, const int64_t* slots, const float* weights, float* result, int64_t tokens,
                              int64_t topK, int64_t width) {
  const int64_t slotCount = tokens * topK;
  for (int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; index < tokens * width;
       index += int64_t(gridDim.x) * blockDim.x) {
    const int64_t token = index / width, column = index % width;
    float sum = 0.0f;
    for (int64_t j = 0; j < topK; ++j) {
      const int64_t route = token * topK + j, slot = slots[route];
      DGEMMA_CUDA_BOUNDS(slot, slotCount);  // the CPU kernel rejects a slot outside the permutation
      if (slot < 0 || slot >= slotCount) continue;
      const float row = rows[slot * width + column];
      sum += weights ? weights[route] * row : row;
    }
    result[index] = sum;
  }
}

constexpr unsigned kThreads = 256;

class MoePermuteCudaKernel final : public Kernel {
 public:
  explicit MoePermuteCudaKernel(MoePermutationContract contract) : c_(contract) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t elements = c_.tokens * c_.rowElements;
    if (elements == 0 || c_.topK == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    const unsigned blocks = cuda::gridFor(static_cast<uint64_t>(elements), kThreads);
    const int64_t* slots = inputs[1].as<const int64_t>();
    switch (dtypeSize(c_.dtype)) {
      case 2:
        permuteKernel<<<blocks, kThreads, 0, stream>>>(inputs[0].as<const uint16_t>(), slots, outputs[0].as<uint16_t>(),
                                                      c_.tokens, c_.topK, c_.rowElements);
        break;
      case 4:
        permuteKernel<<<blocks, kThreads, 0, stream>>>(inputs[0].as<const uint32_t>(), slots, outputs[0].as<uint32_t>(),
                                                      c_.tokens, c_.topK, c_.rowElements);
        break;
      default:
        permuteKernel<<<blocks, kThreads, 0, stream>>>(inputs[0].as<const uint64_t>(), slots, outputs[0].as<uint64_t>(),
                                                      c_.tokens, c_.topK, c_.rowElements);
    }
    DGEMMA_CUDA_CHECK_LAUNCH("permuteKernel");
  }

 private:
  MoePermutationContract c_;
};

std::unique_ptr<Kernel> createMoePermuteCudaKernel(const KernelSignature& signature) {
  const MoePermutationContract c = parseMoePermuteContract(signature);
  const size_t elementBytes = dtypeSize(c.dtype);
  if (elementBytes != 2 && elementBytes != 4 && elementBytes != 8)
    failSignature(signature, "input has " + std::to_string(elementBytes) +
                                 "-byte elements; the cuda kernel moves elements of 2, 4 or 8 bytes");
  return std::make_unique<MoePermuteCudaKernel>(c);
}

class MoeCombineCudaKernel final : public Kernel {
 public:
  explicit MoeCombineCudaKernel(MoePermutationContract contract) : c_(contract) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t elements = c_.tokens * c_.rowElements;
    if (elements == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    const unsigned blocks = cuda::gridFor(static_cast<uint64_t>(elements), kThreads);
    combineKernel<<<blocks, kThreads, 0, stream>>>(inputs[0].as<const float>(), inputs[1].as<const int64_t>(),
                                                  c_.weighted ? inputs[2].as<const float>() : nullptr,
                                                  outputs[0].as<float>(), c_.tokens, c_.topK, c_.rowElements);
    DGEMMA_CUDA_CHECK_LAUNCH("combineKernel");
  }

 private:
  MoePermutationContract c_;
};

std::unique_ptr<Kernel> createMoeCombineCudaKernel(const KernelSignature& signature) {
  return std::make_unique<MoeCombineCudaKernel>(parseMoeCombineContract(signature, {DType::F32}));
}

class MoeDispatchCudaKernel final : public Kernel {
 public:
  MoeDispatchCudaKernel(std::string where, MoeDispatchContract contract) : where_(std::move(where)), c_(contract) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    cudaStream_t stream = cuda::streamState(context).stream;
    const int64_t routes = c_.tokens * c_.topK, experts = c_.peers * c_.localExperts;
    std::vector<int64_t> indices(static_cast<size_t>(routes)), slots(static_cast<size_t>(routes));
    std::vector<int64_t> sendCounts(static_cast<size_t>(c_.peers)), expertCounts(static_cast<size_t>(experts));
    if (routes > 0)
      DGEMMA_CUDA_CHECK(cudaMemcpyAsync(indices.data(), inputs[0].data, routes * sizeof(int64_t), cudaMemcpyDeviceToHost,
                                        stream));
    DGEMMA_CUDA_CHECK(cudaStreamSynchronize(stream));
    moe_dispatch::buildDispatchTable(where_, indices.data(), c_.tokens, c_.topK, c_.peers, c_.localExperts,
                                     slots.data(), sendCounts.data(), expertCounts.data());
    const std::vector<int64_t>* tables[] = {&slots, &sendCounts, &expertCounts};
    for (size_t i = 0; i < 3; ++i)
      if (!tables[i]->empty())
        DGEMMA_CUDA_CHECK(cudaMemcpyAsync(outputs[i].data, tables[i]->data(), tables[i]->size() * sizeof(int64_t),
                                          cudaMemcpyHostToDevice, stream));
    // The host vectors die with this call: wait until the copies have read them.
    DGEMMA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

 private:
  std::string where_;
  MoeDispatchContract c_;
};

std::unique_ptr<Kernel> createMoeDispatchCudaKernel(const KernelSignature& signature) {
  return std::make_unique<MoeDispatchCudaKernel>(signature.where, parseMoeDispatchContract(signature));
}

}  // namespace

void registerMoeDispatchCudaKernels(KernelRegistry& registry) {
  registry.add("moe_dispatch", createMoeDispatchCudaKernel);
  registry.add("moe_permute", createMoePermuteCudaKernel, KernelTraits{.movesBitsOnly = true});
  registry.add("moe_combine", createMoeCombineCudaKernel);
}

}  // namespace dgemma
