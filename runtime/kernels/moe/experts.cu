// moe_experts and moe_experts_backward on CUDA (f32; bf16 plans run them widened, backends/cuda/
// ReducedPrecision.h), and expert parallelism's moe_local_experts and its backward (docs/
// parallelism.md): the rows grouped by local expert, one cuBLAS grouped GEMM per product (a problem
// per used expert), and small kernels in between (moe/ExpertsMath.h: row gathers and scatters, the gated GELU and its
// derivative, the weighted combine, the route-ordered sums), the CPU kernels' algorithm step by step.
//
// The grouping needs each expert's row count on the host (it sizes the problems), so a call copies the
// indices (or expert_counts) to the host (one stream synchronisation), checks them as the CPU kernel
// does (a bad one is a run-time error before any output is written) and uploads the slot maps with
// the stream-ordered scratch (cudaMallocAsync) that holds the slot-ordered blocks. y sums each
// token's routes in order of j from zero, dx too, and each expert's weight gradients come from one
// GEMM over its rows in slot order: nothing depends on the launch geometry. moe_experts' optional
// gate_up_rows output gets each slot's gate/up row scattered to its route's row (the others zero),
// and moe_experts_backward's optional input 6 is gathered back in place of the gate/up product.
// The per-expert adapters are grouped GEMMs of rank r beside the base products (adapterProducts),
// the rank-r rows scaled by s in between; a frozen base's gradients are skipped with their GEMMs.
#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/moe/Contract.h"
#include "runtime/kernels/moe/CudaParts.h"
#include "runtime/kernels/moe/ExpertsMath.h"
#include "runtime/kernels/moe_dispatch/Contract.h"

namespace dgemma {
namespace {

using moe_experts::RouteGroups;

constexpr unsigned kThreads = 256;

#define DGEMMA_FOR_EACH_ELEMENT(count) \
  for (int64_t element = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; element < (count); \
       element += static_cast<int64_t>(gridDim.x) * blockDim.x)

// The slot maps were built on the host from the indices or expert_counts; the bounds assertions
// check the rows, weights and slots they name against the buffers' extents (sourceRows,
// destinationRows, weightCount, slots).
__global__ void gatherRowsKernel(const float* source, int64_t sourceRows, const int64_t* rowOfSlot, float* rows,
                                 int64_t hidden, int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) {
    DGEMMA_CUDA_BOUNDS(rowOfSlot[element / hidden], sourceRows);
    moe_experts::gatherElement(source, rowOfSlot, rows, hidden, element);
  }
}

__global__ void scatterRowsKernel(const float* rows, const int64_t* rowOfSlot, float* destination,
                                  int64_t destinationRows, int64_t hidden, int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) {
    DGEMMA_CUDA_BOUNDS(rowOfSlot[element / hidden], destinationRows);
    moe_experts::scatterElement(rows, rowOfSlot, destination, hidden, element);
  }
}

__global__ void scaleKernel(float* values, float scale, int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) moe_experts::scaleElement(values, scale, element);
}

__global__ void gatedGeluKernel(float* gateUp, int64_t inner, int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) moe_experts::gatedGeluElement(gateUp, inner, element);
}

// A route's slot, checked after the math's own test for a route without one (kNoSlot).
__device__ void checkSlotsOfToken(const int64_t* slotOfRoute, int64_t token, int64_t topK, int64_t slots) {
  for (int64_t j = 0; j < topK; ++j)
    if (const int64_t slot = slotOfRoute[token * topK + j]; slot >= 0) DGEMMA_CUDA_BOUNDS(slot, slots);
}

__global__ void combineKernel(const float* expertOutput, int64_t slots, const float* weights, const int64_t* slotOfRoute,
                              float* y, int64_t topK, int64_t hidden, int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) {
    checkSlotsOfToken(slotOfRoute, element / hidden, topK, slots);
    moe_experts::combineElement(expertOutput, weights, slotOfRoute, y, topK, hidden, element);
  }
}

__global__ void gatedGeluWeightedKernel(const float* gateUp, const float* weights, int64_t weightCount,
                                        const int64_t* weightOfSlot, float* hidden, float* weighted, int64_t inner,
                                        int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) {
    DGEMMA_CUDA_BOUNDS(weightOfSlot[element / inner], weightCount);
    moe_experts::gatedGeluWeightedElement(gateUp, weights, weightOfSlot, hidden, weighted, inner, element);
  }
}

__global__ void slotWeightGradientKernel(const float* hidden, const float* dOutputDown, float* dWeights, int64_t inner,
                                         int64_t slots) {
  DGEMMA_FOR_EACH_ELEMENT(slots) moe_experts::slotWeightGradient(hidden, dOutputDown, dWeights, inner, element);
}

__global__ void routeValueKernel(const float* slotValues, int64_t slots, const int64_t* slotOfRoute, float* routeValues,
                                 int64_t routes) {
  DGEMMA_FOR_EACH_ELEMENT(routes) {
    checkSlotsOfToken(slotOfRoute, element, 1, slots);
    moe_experts::routeValueElement(slotValues, slotOfRoute, routeValues, element);
  }
}

__global__ void gatedGeluBackwardKernel(const float* gateUp, const float* dHidden, const float* weights,
                                        int64_t weightCount, const int64_t* weightOfSlot, float* dGateUp, int64_t inner,
                                        int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) {
    DGEMMA_CUDA_BOUNDS(weightOfSlot[element / inner], weightCount);
    moe_experts::gatedGeluBackwardElement(gateUp, dHidden, weights, weightOfSlot, dGateUp, inner, element);
  }
}

__global__ void inputGradientKernel(const float* dInput, int64_t slots, const int64_t* slotOfRoute, float* dx,
                                    int64_t topK, int64_t hidden, int64_t count) {
  DGEMMA_FOR_EACH_ELEMENT(count) {
    checkSlotsOfToken(slotOfRoute, element / hidden, topK, slots);
    moe_experts::inputGradientElement(dInput, slotOfRoute, dx, topK, hidden, element);
  }
}

#undef DGEMMA_FOR_EACH_ELEMENT

template <typename KernelFunction, typename... Args>
void launch(const char* name, cudaStream_t stream, int64_t count, KernelFunction kernel, Args... args) {
  if (count <= 0) return;
  kernel<<<cuda::gridFor(static_cast<uint64_t>(count), kThreads), kThreads, 0, stream>>>(args..., count);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) cuda::throwCudaError(status, name, __FILE__, __LINE__);
}

// Device bytes allocated and freed in stream order (also when an exception leaves the call).
struct StreamOrderedBytes {
  StreamOrderedBytes(cudaStream_t stream, size_t size) : stream(stream), bytes(size) {
    DGEMMA_CUDA_CHECK(cudaMallocAsync(&data, bytes, stream));
  }
  ~StreamOrderedBytes() { cudaFreeAsync(data, stream); }
  StreamOrderedBytes(const StreamOrderedBytes&) = delete;
  StreamOrderedBytes& operator=(const StreamOrderedBytes&) = delete;

  cudaStream_t stream;
  size_t bytes;
  void* data = nullptr;
};

// One product of the pipeline for every used expert, as one cuBLAS grouped GEMM (a group of one
// problem per expert: the experts' row counts differ). Row-major C = op(A) · op(B) per problem, so
// cuBLAS computes the column-major Cᵀ = op(B)ᵀ op(A)ᵀ (see matmul/cuda.cpp). The problems' sizes and
// offsets are moe/ExpertsMath.h's expertProblems, which the host test runs; the operand pointers go
// to the device in stream-ordered scratch that is freed in stream order.
// `beta` 1 adds the product to C (the adapters' terms); 0 overwrites it.
void groupedGemm(cublasHandle_t handle, cudaStream_t stream, const moe_experts::ExpertProduct& product,
                 const std::vector<int64_t>& firstSlot, const float* a, const float* b, float* c, float beta = 0.0f) {
  const std::vector<moe_experts::ExpertProblem> problems = moe_experts::expertProblems(product, firstSlot);
  if (problems.empty()) return;
  const size_t count = problems.size();
  const auto asInt = [](int64_t value) { return static_cast<int>(value); };
  std::vector<cublasOperation_t> transposeFirst(count, product.transposeB ? CUBLAS_OP_T : CUBLAS_OP_N);
  std::vector<cublasOperation_t> transposeSecond(count, product.transposeA ? CUBLAS_OP_T : CUBLAS_OP_N);
  std::vector<int> rows(count), columns(count), inner(count), groupSizes(count, 1);
  std::vector<int> firstLeading(count, asInt(product.ldb)), secondLeading(count, asInt(product.lda)),
      resultLeading(count, asInt(product.ldc));
  std::vector<float> ones(count, 1.0f), betas(count, beta);
  // The device pointer arrays, one after the other: cuBLAS's A (our B), its B (our A), C.
  std::vector<const float*> operands(3 * count);
  for (size_t i = 0; i < count; ++i) {
    const moe_experts::ExpertProblem& problem = problems[i];
    rows[i] = asInt(problem.n);
    columns[i] = asInt(problem.m);
    inner[i] = asInt(problem.k);
    operands[i] = b + problem.bOffset;
    operands[count + i] = a + problem.aOffset;
    operands[2 * count + i] = c + problem.cOffset;
  }
  const StreamOrderedBytes devicePointers(stream, operands.size() * sizeof(const float*));
  // From pageable memory: the copy has taken the bytes when it returns.
  DGEMMA_CUDA_CHECK(
      cudaMemcpyAsync(devicePointers.data, operands.data(), devicePointers.bytes, cudaMemcpyHostToDevice, stream));
  const auto* const* pointers = static_cast<const float* const*>(devicePointers.data);
  DGEMMA_CUBLAS_CHECK(cublasSgemmGroupedBatched(handle, transposeFirst.data(), transposeSecond.data(), rows.data(),
                                                columns.data(), inner.data(), ones.data(), pointers,
                                                firstLeading.data(), pointers + count, secondLeading.data(),
                                                betas.data(), const_cast<float* const*>(pointers + 2 * count),
                                                resultLeading.data(), static_cast<int>(count), groupSizes.data()));
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

// The experts' shapes and each local expert's block of slots (host), with the device map from a
// slot to the row it reads.
struct ExpertBlocksOnDevice {
  int64_t hidden = 0, inner = 0;
  const std::vector<int64_t>* firstSlot = nullptr;  // expert e's rows take slots [firstSlot[e], firstSlot[e + 1])
  const int64_t* rowOfSlot = nullptr;              // device
  int64_t sourceRows = 0;                          // rows of the buffers that rowOfSlot indexes
  int64_t slots() const { return firstSlot->back(); }
};

// moe_experts' gate_up_rows [routes, 2I] on the device (Float: float where the forward writes them,
// const float where the backward reads them) and the device map from each slot to its route (row).
template <typename Float>
struct GateUpRowsByRoute {
  Float* rows = nullptr;  // null: none kept or read
  const int64_t* routeOfSlot = nullptr;
  int64_t routes = 0;
};

// The per-expert adapters on the device (Contract.h): each pair's A and B, or nulls without it.
struct ExpertAdapters {
  const float *gateUpA = nullptr, *gateUpB = nullptr, *downA = nullptr, *downB = nullptr;
  int64_t rank = 0;
  float scale = 0.0f;
};

ExpertAdapters adaptersOf(const MoeExpertsContract& g, const std::vector<TensorRef>& inputs) {
  ExpertAdapters adapters;
  adapters.rank = g.loraRank;
  adapters.scale = static_cast<float>(g.loraScale);
  if (g.loraGateUpInput >= 0) {
    adapters.gateUpA = inputs[g.loraGateUpInput].as<const float>();
    adapters.gateUpB = inputs[g.loraGateUpInput + 1].as<const float>();
  }
  if (g.loraDownInput >= 0) {
    adapters.downA = inputs[g.loraDownInput].as<const float>();
    adapters.downB = inputs[g.loraDownInput + 1].as<const float>();
  }
  return adapters;
}

// rows [slots, r] of an adapter's low-rank product, times the scale.
void scaleLowRank(cudaStream_t stream, float* rows, int64_t slots, const ExpertAdapters& adapters) {
  launch("scaleKernel", stream, slots * adapters.rank, scaleKernel, rows, adapters.scale);
}

// The forward of every slot's row through its expert: output[slots, H]; input [slots, H] and
// gateUpOutput [slots, 2I] are scratch. With `kept`, each slot's gate/up row goes to its route's row
// before the GELU overwrites the gate half (the routes without a slot are the caller's).
// With adapters, `lowRank` [slots, r] is scratch for their rank-r rows, and each pair's term is added
// after its base product.
void expertsForward(const cuda::StreamState& state, const ExpertBlocksOnDevice& b, const float* rows,
                    const float* gateUp, const float* down, float* input, float* gateUpOutput, float* output,
                    const GateUpRowsByRoute<float>& kept = {}, const ExpertAdapters& adapters = {},
                    float* lowRank = nullptr) {
  const int64_t hidden = b.hidden, inner = b.inner;
  const moe_experts::ExpertProducts products = moe_experts::expertProducts(hidden, inner);
  const moe_experts::AdapterProducts low = moe_experts::adapterProducts(hidden, inner, adapters.rank);
  launch("gatherRowsKernel", state.stream, b.slots() * hidden, gatherRowsKernel, rows, b.sourceRows, b.rowOfSlot, input,
         hidden);
  groupedGemm(state.cublas, state.stream, products.gateUp, *b.firstSlot, input, gateUp, gateUpOutput);
  if (adapters.gateUpA != nullptr) {
    groupedGemm(state.cublas, state.stream, low.gateUpLow, *b.firstSlot, input, adapters.gateUpA, lowRank);
    scaleLowRank(state.stream, lowRank, b.slots(), adapters);
    groupedGemm(state.cublas, state.stream, low.gateUpAdd, *b.firstSlot, lowRank, adapters.gateUpB, gateUpOutput, 1.0f);
  }
  if (kept.rows != nullptr)
    launch("scatterRowsKernel", state.stream, b.slots() * 2 * inner, scatterRowsKernel,
           static_cast<const float*>(gateUpOutput), kept.routeOfSlot, kept.rows, kept.routes, 2 * inner);
  // gelu(gate) ⊙ up overwrites the gate half; the down product reads it with leading dimension 2I.
  launch("gatedGeluKernel", state.stream, b.slots() * inner, gatedGeluKernel, gateUpOutput, inner);
  groupedGemm(state.cublas, state.stream, products.down, *b.firstSlot, gateUpOutput, down, output);
  if (adapters.downA != nullptr) {
    groupedGemm(state.cublas, state.stream, low.downLow, *b.firstSlot, gateUpOutput, adapters.downA, lowRank);
    scaleLowRank(state.stream, lowRank, b.slots(), adapters);
    groupedGemm(state.cublas, state.stream, low.downAdd, *b.firstSlot, lowRank, adapters.downB, output, 1.0f);
  }
}

// The backward's slot-ordered scratch blocks.
struct BackwardBlocks {
  float *input = nullptr, *dOutput = nullptr, *gateUpOutput = nullptr, *dGateUpOutput = nullptr;
  float *hiddenState = nullptr, *weightedHidden = nullptr, *dOutputDown = nullptr;
  float* dInput = nullptr;        // [slots, H]: each slot's row gradient
  float* slotDWeights = nullptr;  // [slots]: each slot's weight gradient
  float *lowInput = nullptr, *lowGradient = nullptr;  // [slots, r]: the adapters' rank-r rows
};

// The adapters' gradients on the device: each pair's dA and dB, or nulls.
struct AdapterGradients {
  float *gateUpA = nullptr, *gateUpB = nullptr, *downA = nullptr, *downB = nullptr;
};

// Per used expert e over its R rows (slot order), with X the rows, dY their output gradients, w the
// weights (weights[weightOfSlot[slot]]) and GU = X [G_e; U_e]ᵀ recomputed, or gathered from `kept`
// (the forward's gate_up_rows): Hd = gelu(G) ⊙ U, P = dY D_e, dw = rowsum(Hd ⊙ P), dD_e = dYᵀ (w ⊙
// Hd), dG and dU from w ⊙ P, d[G_e; U_e] = [dG dU]ᵀ X, dX = [dG dU] [G_e; U_e] (the CPU kernels'
// five GEMMs per expert, four with `kept`). dGateUp and dDown must be zero for the unused experts;
// the used ones' blocks are overwritten.
// dGateUp or dDown null: a frozen base's gradient, not computed. With adapters (moe/cpu.cpp's
// formulas), their gradients must be zero for the unused experts too.
void expertsBackward(const cuda::StreamState& state, const ExpertBlocksOnDevice& b, const float* rows,
                     const float* dRows, const float* weights, int64_t weightCount, const int64_t* weightOfSlot,
                     const float* gateUp, const float* down, float* dGateUp, float* dDown, const BackwardBlocks& s,
                     const GateUpRowsByRoute<const float>& kept = {}, const ExpertAdapters& adapters = {},
                     const AdapterGradients& dAdapters = {}) {
  const int64_t hidden = b.hidden, inner = b.inner, slots = b.slots();
  const moe_experts::ExpertProducts products = moe_experts::expertProducts(hidden, inner);
  const moe_experts::AdapterProducts low = moe_experts::adapterProducts(hidden, inner, adapters.rank);
  const std::vector<int64_t>& firstSlot = *b.firstSlot;
  cudaStream_t stream = state.stream;
  launch("gatherRowsKernel", stream, slots * hidden, gatherRowsKernel, rows, b.sourceRows, b.rowOfSlot, s.input, hidden);
  launch("gatherRowsKernel", stream, slots * hidden, gatherRowsKernel, dRows, b.sourceRows, b.rowOfSlot, s.dOutput,
         hidden);
  if (kept.rows != nullptr)
    launch("gatherRowsKernel", stream, slots * 2 * inner, gatherRowsKernel, kept.rows, kept.routes, kept.routeOfSlot,
           s.gateUpOutput, 2 * inner);
  else
    groupedGemm(state.cublas, stream, products.gateUp, firstSlot, s.input, gateUp, s.gateUpOutput);
  if (adapters.gateUpA != nullptr) {  // s · X A1ᵀ: dB1 needs it even where the kept rows hold GU
    groupedGemm(state.cublas, stream, low.gateUpLow, firstSlot, s.input, adapters.gateUpA, s.lowInput);
    scaleLowRank(stream, s.lowInput, slots, adapters);
    if (kept.rows == nullptr)
      groupedGemm(state.cublas, stream, low.gateUpAdd, firstSlot, s.lowInput, adapters.gateUpB, s.gateUpOutput, 1.0f);
  }
  launch("gatedGeluWeightedKernel", stream, slots * inner, gatedGeluWeightedKernel,
         static_cast<const float*>(s.gateUpOutput), weights, weightCount, weightOfSlot, s.hiddenState, s.weightedHidden,
         inner);
  if (dDown != nullptr)
    groupedGemm(state.cublas, stream, products.downGradient, firstSlot, s.dOutput, s.weightedHidden, dDown);
  groupedGemm(state.cublas, stream, products.outputGradientDown, firstSlot, s.dOutput, down, s.dOutputDown);
  if (adapters.downA != nullptr) {
    groupedGemm(state.cublas, stream, low.outputGradientLow, firstSlot, s.dOutput, adapters.downB, s.lowGradient);
    scaleLowRank(stream, s.lowGradient, slots, adapters);
    groupedGemm(state.cublas, stream, low.downAGradient, firstSlot, s.lowGradient, s.weightedHidden, dAdapters.downA);
    groupedGemm(state.cublas, stream, low.hiddenGradientAdd, firstSlot, s.lowGradient, adapters.downA, s.dOutputDown,
                1.0f);
    groupedGemm(state.cublas, stream, low.weightedHiddenLow, firstSlot, s.weightedHidden, adapters.downA,
                s.lowGradient);
    scaleLowRank(stream, s.lowGradient, slots, adapters);
    groupedGemm(state.cublas, stream, low.downBGradient, firstSlot, s.dOutput, s.lowGradient, dAdapters.downB);
  }
  launch("slotWeightGradientKernel", stream, slots, slotWeightGradientKernel, static_cast<const float*>(s.hiddenState),
         static_cast<const float*>(s.dOutputDown), s.slotDWeights, inner);
  launch("gatedGeluBackwardKernel", stream, slots * inner, gatedGeluBackwardKernel,
         static_cast<const float*>(s.gateUpOutput), static_cast<const float*>(s.dOutputDown), weights, weightCount,
         weightOfSlot, s.dGateUpOutput, inner);
  if (dGateUp != nullptr)
    groupedGemm(state.cublas, stream, products.gateUpGradient, firstSlot, s.dGateUpOutput, s.input, dGateUp);
  groupedGemm(state.cublas, stream, products.inputGradient, firstSlot, s.dGateUpOutput, gateUp, s.dInput);
  if (adapters.gateUpA != nullptr) {
    groupedGemm(state.cublas, stream, low.gateUpBGradient, firstSlot, s.dGateUpOutput, s.lowInput, dAdapters.gateUpB);
    groupedGemm(state.cublas, stream, low.gateUpLowGradient, firstSlot, s.dGateUpOutput, adapters.gateUpB,
                s.lowGradient);
    scaleLowRank(stream, s.lowGradient, slots, adapters);
    groupedGemm(state.cublas, stream, low.gateUpAGradient, firstSlot, s.lowGradient, s.input, dAdapters.gateUpA);
    groupedGemm(state.cublas, stream, low.inputGradientAdd, firstSlot, s.lowGradient, adapters.gateUpA, s.dInput, 1.0f);
  }
}

std::vector<std::pair<int64_t, float**>> backwardScratch(int64_t slots, int64_t hidden, int64_t inner,
                                                         BackwardBlocks& s, int64_t rank = 0) {
  return {{slots * hidden, &s.input},           {slots * hidden, &s.dOutput},          {slots * hidden, &s.dInput},
          {slots * 2 * inner, &s.gateUpOutput}, {slots * 2 * inner, &s.dGateUpOutput}, {slots * inner, &s.hiddenState},
          {slots * inner, &s.weightedHidden},   {slots * inner, &s.dOutputDown},       {slots, &s.slotDWeights},
          {slots * rank, &s.lowInput},          {slots * rank, &s.lowGradient}};
}

// The indices to the host, checked (the CPU kernel's error, word for word), and grouped.
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

// expert_counts to the host, checked and turned into blocks.
moe_experts::LocalBlocks localBlocksOnHost(cudaStream_t stream, const std::string& where, const MoeLocalExpertsContract& c,
                                           const int64_t* deviceCounts) {
  std::vector<int64_t> counts(static_cast<size_t>(c.peers * c.experts));
  if (!counts.empty()) {
    DGEMMA_CUDA_CHECK(cudaMemcpyAsync(counts.data(), deviceCounts, counts.size() * sizeof(int64_t),
                                      cudaMemcpyDeviceToHost, stream));
    DGEMMA_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  return moe_experts::localBlocks(where, counts.data(), c.peers, c.experts, c.rows);
}

class MoeExpertsCudaKernel final : public Kernel {
 public:
  MoeExpertsCudaKernel(std::string where, MoeExpertsContract geometry) : where_(std::move(where)), g_(geometry) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const cuda::StreamState& state = cuda::streamState(context);
    cudaStream_t stream = state.stream;
    float* y = outputs[0].as<float>();
    const RouteGroups groups = groupOnHost(stream, where_, g_, inputs[2].as<const int64_t>());
    const int64_t hidden = g_.hidden, inner = g_.expertHidden, slots = groups.slots();
    // gate_up_rows: zero, then the local routes' rows scattered over it after the gate/up product.
    GateUpRowsByRoute<float> kept;
    if (g_.gateUpRows) {
      kept.rows = outputs[1].as<float>();
      kept.routes = g_.tokens * g_.topK;
      DGEMMA_CUDA_CHECK(cudaMemsetAsync(kept.rows, 0, outputs[1].buffer->bytes(), stream));
    }
    if (hidden == 0) return;
    if (inner == 0 || slots == 0) {  // every route's output is an empty sum, or no route is local
      DGEMMA_CUDA_CHECK(cudaMemsetAsync(y, 0, g_.tokens * hidden * sizeof(float), stream));
      return;
    }
    ExpertBlocksOnDevice blocks{hidden, inner, &groups.firstSlot, nullptr};
    int64_t *tokenOfSlot = nullptr, *slotOfRoute = nullptr, *routeOfSlot = nullptr;
    float *input = nullptr, *gateUpOutput = nullptr, *expertOutput = nullptr, *lowRank = nullptr;
    std::vector<std::pair<const std::vector<int64_t>*, int64_t**>> maps = {{&groups.tokenOfSlot, &tokenOfSlot},
                                                                          {&groups.slotOfRoute, &slotOfRoute}};
    if (g_.gateUpRows) maps.push_back({&groups.routeOfSlot, &routeOfSlot});
    Scratch scratch(stream, std::move(maps),
                    {{slots * hidden, &input},
                     {slots * 2 * inner, &gateUpOutput},
                     {slots * hidden, &expertOutput},
                     {slots * g_.loraRank, &lowRank}});
    blocks.rowOfSlot = tokenOfSlot;
    blocks.sourceRows = g_.tokens;
    kept.routeOfSlot = routeOfSlot;
    expertsForward(state, blocks, inputs[0].as<const float>(), inputs[3].as<const float>(), inputs[4].as<const float>(),
                   input, gateUpOutput, expertOutput, kept, adaptersOf(g_, inputs), lowRank);
    launch("combineKernel", stream, g_.tokens * hidden, combineKernel, static_cast<const float*>(expertOutput), slots,
           inputs[1].as<const float>(), static_cast<const int64_t*>(slotOfRoute), y, g_.topK, hidden);
  }

 private:
  std::string where_;
  MoeExpertsContract g_;
};

class MoeExpertsBackwardCudaKernel final : public Kernel {
 public:
  MoeExpertsBackwardCudaKernel(std::string where, MoeExpertsContract geometry)
      : where_(std::move(where)), g_(geometry) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const cuda::StreamState& state = cuda::streamState(context);
    cudaStream_t stream = state.stream;
    const RouteGroups groups = groupOnHost(stream, where_, g_, inputs[2].as<const int64_t>());
    const int64_t routes = g_.tokens * g_.topK, hidden = g_.hidden, inner = g_.expertHidden, slots = groups.slots();
    for (const TensorRef& output : outputs)
      DGEMMA_CUDA_CHECK(cudaMemsetAsync(output.data, 0, output.buffer->bytes(), stream));
    if (routes == 0 || hidden == 0 || inner == 0 || slots == 0) return;
    ExpertBlocksOnDevice blocks{hidden, inner, &groups.firstSlot, nullptr};
    int64_t *tokenOfSlot = nullptr, *slotOfRoute = nullptr, *routeOfSlot = nullptr;
    BackwardBlocks s;
    Scratch scratch(
        stream,
        {{&groups.tokenOfSlot, &tokenOfSlot}, {&groups.slotOfRoute, &slotOfRoute}, {&groups.routeOfSlot, &routeOfSlot}},
        backwardScratch(slots, hidden, inner, s, g_.loraRank));
    blocks.rowOfSlot = tokenOfSlot;
    blocks.sourceRows = g_.tokens;
    // With the forward's gate_up_rows (input 6), each slot's gate/up row is gathered from its route's.
    const GateUpRowsByRoute<const float> kept{g_.gateUpRows ? inputs[6].as<const float>() : nullptr, routeOfSlot, routes};
    // The outputs the step lists (Contract.h): a frozen base's gradients and absent adapters' are null.
    const auto output = [&](int index, int offset = 0) {
      return index < 0 ? nullptr : outputs[index + offset].as<float>();
    };
    const AdapterGradients dAdapters{output(g_.gradLoraGateUpOutput), output(g_.gradLoraGateUpOutput, 1),
                                     output(g_.gradLoraDownOutput), output(g_.gradLoraDownOutput, 1)};
    expertsBackward(state, blocks, inputs[0].as<const float>(), inputs[5].as<const float>(),
                    inputs[1].as<const float>(), routes, routeOfSlot, inputs[3].as<const float>(),
                    inputs[4].as<const float>(), output(g_.gradGateUpOutput), output(g_.gradDownOutput), s, kept,
                    adaptersOf(g_, inputs), dAdapters);
    launch("routeValueKernel", stream, routes, routeValueKernel, static_cast<const float*>(s.slotDWeights), slots,
           static_cast<const int64_t*>(slotOfRoute), outputs[1].as<float>());
    launch("inputGradientKernel", stream, g_.tokens * hidden, inputGradientKernel, static_cast<const float*>(s.dInput),
           slots, static_cast<const int64_t*>(slotOfRoute), outputs[0].as<float>(), g_.topK, hidden);
  }

 private:
  std::string where_;
  MoeExpertsContract g_;
};

// moe_local_experts: (rows [C, H], expert_counts [G, E], gate_up, down) -> [C, H]; the capacity's
// uncounted rows give zeros.
class MoeLocalExpertsCudaKernel final : public Kernel {
 public:
  MoeLocalExpertsCudaKernel(std::string where, MoeLocalExpertsContract contract)
      : where_(std::move(where)), c_(contract) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const cuda::StreamState& state = cuda::streamState(context);
    cudaStream_t stream = state.stream;
    const moe_experts::LocalBlocks local = localBlocksOnHost(stream, where_, c_, inputs[1].as<const int64_t>());
    const int64_t hidden = c_.hidden, inner = c_.expertHidden, slots = local.slots();
    float* result = outputs[0].as<float>();
    DGEMMA_CUDA_CHECK(cudaMemsetAsync(result, 0, outputs[0].buffer->bytes(), stream));
    if (slots == 0 || hidden == 0 || inner == 0) return;
    ExpertBlocksOnDevice blocks{hidden, inner, &local.firstSlot, nullptr};
    int64_t* rowOfSlot = nullptr;
    float *input = nullptr, *gateUpOutput = nullptr, *expertOutput = nullptr;
    Scratch scratch(stream, {{&local.rowOfSlot, &rowOfSlot}},
                    {{slots * hidden, &input}, {slots * 2 * inner, &gateUpOutput}, {slots * hidden, &expertOutput}});
    blocks.rowOfSlot = rowOfSlot;
    blocks.sourceRows = c_.rows;
    expertsForward(state, blocks, inputs[0].as<const float>(), inputs[2].as<const float>(), inputs[3].as<const float>(),
                   input, gateUpOutput, expertOutput);
    launch("scatterRowsKernel", stream, slots * hidden, scatterRowsKernel, static_cast<const float*>(expertOutput),
           static_cast<const int64_t*>(rowOfSlot), result, c_.rows, hidden);
  }

 private:
  std::string where_;
  MoeLocalExpertsContract c_;
};

// moe_local_experts_backward: (rows, weights [C], grad_output [C, H], expert_counts, gate_up, down)
// -> grad_rows, grad_weights, grad_gate_up, grad_down; a row's weight is weights[row].
class MoeLocalExpertsBackwardCudaKernel final : public Kernel {
 public:
  MoeLocalExpertsBackwardCudaKernel(std::string where, MoeLocalExpertsContract contract)
      : where_(std::move(where)), c_(contract) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const cuda::StreamState& state = cuda::streamState(context);
    cudaStream_t stream = state.stream;
    const moe_experts::LocalBlocks local = localBlocksOnHost(stream, where_, c_, inputs[3].as<const int64_t>());
    const int64_t hidden = c_.hidden, inner = c_.expertHidden, slots = local.slots();
    for (const TensorRef& output : outputs)
      DGEMMA_CUDA_CHECK(cudaMemsetAsync(output.data, 0, output.buffer->bytes(), stream));
    if (slots == 0 || hidden == 0 || inner == 0) return;
    ExpertBlocksOnDevice blocks{hidden, inner, &local.firstSlot, nullptr};
    int64_t* rowOfSlot = nullptr;
    BackwardBlocks s;
    Scratch scratch(stream, {{&local.rowOfSlot, &rowOfSlot}}, backwardScratch(slots, hidden, inner, s));
    blocks.rowOfSlot = rowOfSlot;
    blocks.sourceRows = c_.rows;
    expertsBackward(state, blocks, inputs[0].as<const float>(), inputs[2].as<const float>(), inputs[1].as<const float>(),
                    c_.rows, rowOfSlot, inputs[4].as<const float>(), inputs[5].as<const float>(), outputs[2].as<float>(),
                    outputs[3].as<float>(), s);
    launch("scatterRowsKernel", stream, slots * hidden, scatterRowsKernel, static_cast<const float*>(s.dInput),
           static_cast<const int64_t*>(rowOfSlot), outputs[0].as<float>(), c_.rows, hidden);
    launch("scatterRowsKernel", stream, slots, scatterRowsKernel, static_cast<const float*>(s.slotDWeights),
           static_cast<const int64_t*>(rowOfSlot), outputs[1].as<float>(), c_.rows, int64_t{1});
  }

 private:
  std::string where_;
  MoeLocalExpertsContract c_;
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

// An expert's block of received rows has at most C rows.
void expectCublasRange(const KernelSignature& signature, const MoeLocalExpertsContract& c) {
  if (c.rows > INT_MAX || 2 * c.expertHidden > INT_MAX || c.hidden > INT_MAX)
    failSignature(signature, "matrix dimensions exceed the 32-bit limits of cuBLAS");
}

std::unique_ptr<Kernel> createMoeLocalExpertsCudaKernel(const KernelSignature& signature) {
  const MoeLocalExpertsContract c = parseMoeLocalExpertsContract(signature, {DType::F32});
  expectCublasRange(signature, c);
  return std::make_unique<MoeLocalExpertsCudaKernel>(signature.where, c);
}

std::unique_ptr<Kernel> createMoeLocalExpertsBackwardCudaKernel(const KernelSignature& signature) {
  const MoeLocalExpertsContract c = parseMoeLocalExpertsBackwardContract(signature, {DType::F32});
  expectCublasRange(signature, c);
  return std::make_unique<MoeLocalExpertsBackwardCudaKernel>(signature.where, c);
}

}  // namespace

void registerMoeCudaKernels(KernelRegistry& registry) {
  registerMoeRouteCudaKernels(registry);
  registry.add("moe_experts", createMoeExpertsCudaKernel);
  registry.add("moe_experts_backward", createMoeExpertsBackwardCudaKernel);
  registry.add("moe_local_experts", createMoeLocalExpertsCudaKernel);
  registry.add("moe_local_experts_backward", createMoeLocalExpertsBackwardCudaKernel);
}

}  // namespace dgemma
