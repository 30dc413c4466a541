// moe_experts and moe_experts_backward on CUDA (f32; bf16 plans run them widened, backends/cuda/
// ReducedPrecision.h): the routes grouped by local expert, one cuBLAS GEMM per used expert and
// product, and small kernels in between (moe/ExpertsMath.h: row gathers, the gated GELU and its
// derivative, the weighted combine, the route-ordered sums), the CPU kernel's algorithm step by step.
//
// The grouping needs each expert's row count on the host (it sizes the GEMMs), so a call copies the
// indices to the host (one stream synchronisation), checks them as the CPU kernel does (a negative
// index is a run-time error before any output is written) and uploads the slot maps with the
// stream-ordered scratch (cudaMallocAsync) that holds the slot-ordered blocks. y sums each token's
// routes in order of j from zero, dx too, and each expert's weight gradients come from one GEMM over
// its rows in slot (token) order: nothing depends on the launch geometry.
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/moe/Contract.h"
#include "runtime/kernels/moe/ExpertsMath.h"

namespace dgemma {
namespace {

using moe_experts::RouteGroups;

constexpr unsigned kThreads = 256;

#define DGEMMA_FOR_EACH_ELEMENT(count) \
  for (int64_t element = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; element < (count); \
       element += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void gatherRowsKernel(const float* source, const int64_t* tokenOfSlot, float* rows, int64_t hidden,
                                 int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) moe_experts::gatherElement(source, tokenOfSlot, rows, hidden, element);
}

__global__ void gatedGeluKernel(float* gateUp, int64_t inner, int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) moe_experts::gatedGeluElement(gateUp, inner, element);
}

__global__ void combineKernel(const float* expertOutput, const float* weights, const int64_t* slotOfRoute, float* y,
                              int64_t topK, int64_t hidden, int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) moe_experts::combineElement(expertOutput, weights, slotOfRoute, y, topK, hidden, element);
}

__global__ void gatedGeluWeightedKernel(const float* gateUp, const float* weights, const int64_t* routeOfSlot,
                                        float* hidden, float* weighted, int64_t inner, int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count)
  moe_experts::gatedGeluWeightedElement(gateUp, weights, routeOfSlot, hidden, weighted, inner, element);
}

__global__ void routeWeightGradientKernel(const float* hidden, const float* dOutputDown, const int64_t* slotOfRoute,
                                          float* dWeights, int64_t inner, int64_t routes) {
  DGEMMA_FOR_EACH_ELEMENT(routes)
  moe_experts::routeWeightGradient(hidden, dOutputDown, slotOfRoute, dWeights, inner, element);
}

__global__ void gatedGeluBackwardKernel(const float* gateUp, const float* dHidden, const float* weights,
                                        const int64_t* routeOfSlot, float* dGateUp, int64_t inner, int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count)
  moe_experts::gatedGeluBackwardElement(gateUp, dHidden, weights, routeOfSlot, dGateUp, inner, element);
}

__global__ void inputGradientKernel(const float* dInput, const int64_t* slotOfRoute, float* dx, int64_t topK,
                                    int64_t hidden, int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) moe_experts::inputGradientElement(dInput, slotOfRoute, dx, topK, hidden, element);
}

#undef DGEMMA_FOR_EACH_ELEMENT

template <typename KernelFunction, typename... Args>
void launch(const char* name, cudaStream_t stream, int64_t count, KernelFunction kernel, Args... args) {
  if (count <= 0) return;
  kernel<<<cuda::gridFor(static_cast<uint64_t>(count), kThreads), kThreads, 0, stream>>>(args..., count);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) cuda::throwCudaError(status, name, __FILE__, __LINE__);
}

// Row-major C[m, n] = op(A) · op(B) (see matmul/cuda.cpp: cuBLAS computes the column-major Cᵀ =
// op(B)ᵀ op(A)ᵀ).
void gemm(cublasHandle_t handle, bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, const float* a,
          int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  const float one = 1.0f, zero = 0.0f;
  DGEMMA_CUBLAS_CHECK(cublasSgemm(handle, transposeB ? CUBLAS_OP_T : CUBLAS_OP_N, transposeA ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &one, b,
                                  static_cast<int>(ldb), a, static_cast<int>(lda), &zero, c, static_cast<int>(ldc)));
}

// Stream-ordered scratch, carved into the slot maps and the slot-ordered blocks; freed in stream
// order when the call ends (also by an exception).
class Scratch {
 public:
  Scratch(cudaStream_t stream, std::vector<std::pair<const std::vector<int64_t>*, int64_t**>> maps,
          std::vector<std::pair<int64_t, float**>> blocks)
      : stream_(stream) {
    uint64_t bytes = 0;
    for (const auto& [values, pointer] : maps) bytes += values->size() * sizeof(int64_t);
    for (const auto& [count, pointer] : blocks) bytes += static_cast<uint64_t>(count) * sizeof(float);
    if (bytes == 0) return;
    DGEMMA_CUDA_CHECK(cudaMallocAsync(&base_, bytes, stream));
    char* next = static_cast<char*>(base_);
    for (const auto& [values, pointer] : maps) {
      *pointer = reinterpret_cast<int64_t*>(next);
      const uint64_t size = values->size() * sizeof(int64_t);
      // From pageable memory: the copy has taken the bytes when it returns.
      if (size > 0) DGEMMA_CUDA_CHECK(cudaMemcpyAsync(next, values->data(), size, cudaMemcpyHostToDevice, stream));
      next += size;
    }
    for (const auto& [count, pointer] : blocks) {
      *pointer = reinterpret_cast<float*>(next);
      next += static_cast<uint64_t>(count) * sizeof(float);
    }
  }
  ~Scratch() {
    if (base_ != nullptr) cudaFreeAsync(base_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

 private:
  cudaStream_t stream_;
  void* base_ = nullptr;
};

// Calls body(expert, firstSlot, rows) for each local expert with at least one route.
template <typename Body>
void forEachUsedExpert(const RouteGroups& groups, int64_t experts, Body&& body) {
  for (int64_t expert = 0; expert < experts; ++expert) {
    const int64_t first = groups.firstSlot[expert], rows = groups.firstSlot[expert + 1] - first;
    if (rows > 0) body(expert, first, rows);
  }
}

// What both kernels do first: the indices to the host, checked (the CPU kernel's error, word for
// word), and grouped.
RouteGroups groupOnHost(cudaStream_t stream, const std::string& where, const MoeExpertsContract& g,
                        const int64_t* deviceIndices) {
  const int64_t routes = g.tokens * g.topK;
  std::vector<int64_t> indices(static_cast<size_t>(routes));
  if (routes > 0) {
    DGEMMA_CUDA_CHECK(
        cudaMemcpyAsync(indices.data(), deviceIndices, routes * sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
    DGEMMA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  for (int64_t route = 0; route < routes; ++route)
    if (indices[route] < 0)
      throw RuntimeError(where + ": expert index " + std::to_string(indices[route]) + " at indices[" +
                         std::to_string(route / g.topK) + ", " + std::to_string(route % g.topK) +
                         "] is negative, not an expert");
  return moe_experts::groupRoutes(indices.data(), g.tokens, g.topK, g.experts, g.expertOffset);
}

class MoeExpertsCudaKernel final : public Kernel {
 public:
  MoeExpertsCudaKernel(std::string where, MoeExpertsContract geometry) : where_(std::move(where)), g_(geometry) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const cuda::StreamState& state = cuda::streamState(context);
    cudaStream_t stream = state.stream;
    const float* x = inputs[0].as<const float>();
    const float* weights = inputs[1].as<const float>();
    const float* gateUp = inputs[3].as<const float>();
    const float* down = inputs[4].as<const float>();
    float* y = outputs[0].as<float>();
    const RouteGroups groups = groupOnHost(stream, where_, g_, inputs[2].as<const int64_t>());
    const int64_t hidden = g_.hidden, inner = g_.expertHidden, width = 2 * inner, slots = groups.slots();
    if (hidden == 0) return;
    if (inner == 0 || slots == 0) {  // every route's output is an empty sum, or no route is local
      DGEMMA_CUDA_CHECK(cudaMemsetAsync(y, 0, g_.tokens * hidden * sizeof(float), stream));
      return;
    }
    int64_t *tokenOfSlot = nullptr, *slotOfRoute = nullptr;
    float *input = nullptr, *gateUpOutput = nullptr, *expertOutput = nullptr;
    Scratch scratch(stream, {{&groups.tokenOfSlot, &tokenOfSlot}, {&groups.slotOfRoute, &slotOfRoute}},
                    {{slots * hidden, &input}, {slots * width, &gateUpOutput}, {slots * hidden, &expertOutput}});
    launch("gatherRowsKernel", stream, slots * hidden, gatherRowsKernel, x, static_cast<const int64_t*>(tokenOfSlot),
           input, hidden);
    forEachUsedExpert(groups, g_.experts, [&](int64_t e, int64_t first, int64_t rows) {
      gemm(state.cublas, false, true, rows, width, hidden, input + first * hidden, hidden, gateUp + e * width * hidden,
           hidden, gateUpOutput + first * width, width);
    });
    // gelu(gate) ⊙ up overwrites the gate half; the down product reads it with leading dimension 2I.
    launch("gatedGeluKernel", stream, slots * inner, gatedGeluKernel, gateUpOutput, inner);
    forEachUsedExpert(groups, g_.experts, [&](int64_t e, int64_t first, int64_t rows) {
      gemm(state.cublas, false, true, rows, hidden, inner, gateUpOutput + first * width, width,
           down + e * hidden * inner, inner, expertOutput + first * hidden, hidden);
    });
    launch("combineKernel", stream, g_.tokens * hidden, combineKernel, static_cast<const float*>(expertOutput), weights,
           static_cast<const int64_t*>(slotOfRoute), y, g_.topK, hidden);
  }

 private:
  std::string where_;
  MoeExpertsContract g_;
};

// Per used expert e over its R rows (slot order), with X the rows, dY their output gradients, w the
// route weights and GU = X [G_e; U_e]ᵀ recomputed: Hd = gelu(G) ⊙ U, P = dY D_e, dw = rowsum(Hd ⊙
// P), dD_e = dYᵀ (w ⊙ Hd), dG and dU from w ⊙ P, d[G_e; U_e] = [dG dU]ᵀ X, dX = [dG dU] [G_e; U_e]
// (the CPU kernel's five GEMMs per expert).
class MoeExpertsBackwardCudaKernel final : public Kernel {
 public:
  MoeExpertsBackwardCudaKernel(std::string where, MoeExpertsContract geometry)
      : where_(std::move(where)), g_(geometry) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const cuda::StreamState& state = cuda::streamState(context);
    cudaStream_t stream = state.stream;
    const float* x = inputs[0].as<const float>();
    const float* weights = inputs[1].as<const float>();
    const float* gateUp = inputs[3].as<const float>();
    const float* down = inputs[4].as<const float>();
    const float* dy = inputs[5].as<const float>();
    float* dx = outputs[0].as<float>();
    float* dWeights = outputs[1].as<float>();
    float* dGateUp = outputs[2].as<float>();
    float* dDown = outputs[3].as<float>();
    const RouteGroups groups = groupOnHost(stream, where_, g_, inputs[2].as<const int64_t>());
    const int64_t routes = g_.tokens * g_.topK, hidden = g_.hidden, inner = g_.expertHidden, width = 2 * inner;
    const int64_t slots = groups.slots();
    // Unused experts keep zero gradients; the used ones' blocks are overwritten by their GEMMs.
    for (const TensorRef& output : outputs)
      DGEMMA_CUDA_CHECK(cudaMemsetAsync(output.data, 0, output.buffer->bytes(), stream));
    if (routes == 0 || hidden == 0 || inner == 0 || slots == 0) return;
    int64_t *tokenOfSlot = nullptr, *slotOfRoute = nullptr, *routeOfSlot = nullptr;
    float *input = nullptr, *dOutput = nullptr, *dInput = nullptr, *gateUpOutput = nullptr, *dGateUpOutput = nullptr;
    float *hiddenState = nullptr, *weightedHidden = nullptr, *dOutputDown = nullptr;
    Scratch scratch(stream,
                    {{&groups.tokenOfSlot, &tokenOfSlot}, {&groups.slotOfRoute, &slotOfRoute},
                     {&groups.routeOfSlot, &routeOfSlot}},
                    {{slots * hidden, &input},
                     {slots * hidden, &dOutput},
                     {slots * hidden, &dInput},
                     {slots * width, &gateUpOutput},
                     {slots * width, &dGateUpOutput},
                     {slots * inner, &hiddenState},
                     {slots * inner, &weightedHidden},
                     {slots * inner, &dOutputDown}});
    const int64_t* tokens = tokenOfSlot;
    launch("gatherRowsKernel", stream, slots * hidden, gatherRowsKernel, x, tokens, input, hidden);
    launch("gatherRowsKernel", stream, slots * hidden, gatherRowsKernel, dy, tokens, dOutput, hidden);
    forEachUsedExpert(groups, g_.experts, [&](int64_t e, int64_t first, int64_t rows) {
      gemm(state.cublas, false, true, rows, width, hidden, input + first * hidden, hidden, gateUp + e * width * hidden,
           hidden, gateUpOutput + first * width, width);
    });
    launch("gatedGeluWeightedKernel", stream, slots * inner, gatedGeluWeightedKernel,
           static_cast<const float*>(gateUpOutput), weights, static_cast<const int64_t*>(routeOfSlot), hiddenState,
           weightedHidden, inner);
    forEachUsedExpert(groups, g_.experts, [&](int64_t e, int64_t first, int64_t rows) {
      gemm(state.cublas, true, false, hidden, inner, rows, dOutput + first * hidden, hidden, weightedHidden + first * inner,
           inner, dDown + e * hidden * inner, inner);
      gemm(state.cublas, false, false, rows, inner, hidden, dOutput + first * hidden, hidden, down + e * hidden * inner,
           inner, dOutputDown + first * inner, inner);
    });
    launch("routeWeightGradientKernel", stream, routes, routeWeightGradientKernel,
           static_cast<const float*>(hiddenState), static_cast<const float*>(dOutputDown),
           static_cast<const int64_t*>(slotOfRoute), dWeights, inner);
    launch("gatedGeluBackwardKernel", stream, slots * inner, gatedGeluBackwardKernel,
           static_cast<const float*>(gateUpOutput), static_cast<const float*>(dOutputDown), weights,
           static_cast<const int64_t*>(routeOfSlot), dGateUpOutput, inner);
    forEachUsedExpert(groups, g_.experts, [&](int64_t e, int64_t first, int64_t rows) {
      gemm(state.cublas, true, false, width, hidden, rows, dGateUpOutput + first * width, width, input + first * hidden,
           hidden, dGateUp + e * width * hidden, hidden);
      gemm(state.cublas, false, false, rows, hidden, width, dGateUpOutput + first * width, width,
           gateUp + e * width * hidden, hidden, dInput + first * hidden, hidden);
    });
    launch("inputGradientKernel", stream, g_.tokens * hidden, inputGradientKernel, static_cast<const float*>(dInput),
           static_cast<const int64_t*>(slotOfRoute), dx, g_.topK, hidden);
  }

 private:
  std::string where_;
  MoeExpertsContract g_;
};

// The products are cuBLAS GEMMs of int dimensions; an expert's block has at most N·k rows.
void expectCublasRange(const KernelSignature& signature, const MoeExpertsContract& c) {
  if (c.tokens * c.topK > INT_MAX || 2 * c.expertHidden > INT_MAX || c.hidden > INT_MAX)
    failSignature(signature, "matrix dimensions exceed the 32-bit limits of cuBLAS");
}

std::unique_ptr<Kernel> createMoeExpertsCudaKernel(const KernelSignature& signature) {
  const MoeExpertsContract c = parseMoeExpertsContract(signature, {DType::F32});
  expectCublasRange(signature, c);
  return std::make_unique<MoeExpertsCudaKernel>(signature.where, c);
}

std::unique_ptr<Kernel> createMoeExpertsBackwardCudaKernel(const KernelSignature& signature) {
  const MoeExpertsContract c = parseMoeExpertsBackwardContract(signature, {DType::F32});
  expectCublasRange(signature, c);
  return std::make_unique<MoeExpertsBackwardCudaKernel>(signature.where, c);
}

}  // namespace

void registerMoeExpertsCudaKernels(KernelRegistry& registry) {
  registry.add("moe_experts", createMoeExpertsCudaKernel);
  registry.add("moe_experts_backward", createMoeExpertsBackwardCudaKernel);
}

}  // namespace dgemma
