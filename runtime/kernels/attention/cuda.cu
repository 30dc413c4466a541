// attention and attention_backward on CUDA (docs/kernels.md), f32 or bf16 buffers with f32
// arithmetic; runtime/kernels/attention/cpu.cpp is the CPU twin. The visibility rules, index maps,
// tile geometry and the online softmax are attention/AttentionMath.h, and what a block does for one
// task is attention/AttentionTiles.h: the CPU unit test runs those same bodies on the host (blocks of
// one and of five host threads) against the CPU kernel. This file holds the __global__ wrappers and
// the launches.
//
// Forward (flash-style): a block takes a tile of queries of one (b, head) and streams over the key
// tiles their candidate keys span (every key tile when segment ids overlay the causal mask), keeping
// K, V, the scores and the output accumulators in shared memory: per key tile, (1) every (query, key)
// pair's score, −inf when invisible, (2) per query row takeInTile (raise the running max, rescale the
// running sum, weights exp(s − max)), (3) per output element acc = acc · factor + Σ weight · v. At the
// end o = acc / sum, 0 for a row without visible keys.
//
// Backward: the query kernel (a block per query tile) recomputes each row's max, sum and
// delta = Σ p · (do·v) in a first pass over the key tiles, then in a second pass
// ds = scale · p · (dp − delta) and dq = Σ ds · k; it leaves (max, sum, delta) per row in a stream-ordered
// scratch buffer. The key kernel (a block per tile of keys of one (b, KV head)) then walks the query
// tiles of every query head of the group, recomputes p and ds from those statistics, and sums
// dv = Σ p · do and dk = Σ ds · q. Each block owns the rows it writes, so nothing needs atomics and
// the result does not depend on scheduling.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/attention/AttentionMath.h"
#include "runtime/kernels/attention/AttentionTiles.h"
#include "runtime/kernels/attention/Contract.h"

namespace dgemma {
namespace {

using attention::AttentionBuffers;
using attention::TileShape;

constexpr unsigned kThreads = 128;
// Shared memory per block: H200 allows 227 KiB; 96 KiB keeps two blocks per multiprocessor.
constexpr int64_t kSharedBudgetBytes = 96 * 1024;

// The CUDA block as AttentionTiles.h's task bodies see it (host-device, as the bodies are).
struct CudaBlock : kernels::CudaThreadIndex {
  DGEMMA_HOST_DEVICE void sync() const {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }
};

// Grid-stride over the tasks, one block per task at a time.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    attentionForwardKernel(AttentionContract g, TileShape tiles, AttentionBuffers<T> t) {
  extern __shared__ float shared[];
  const int64_t tasks = attention::queryTileTasks(g, tiles);
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x)
    attention::forwardTask(CudaBlock{}, shared, g, tiles, t, task);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attentionBackwardQueryKernel(AttentionContract g, TileShape tiles, AttentionBuffers<T> t) {
  extern __shared__ float shared[];
  const int64_t tasks = attention::queryTileTasks(g, tiles);
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x)
    attention::backwardQueryTask(CudaBlock{}, shared, g, tiles, t, task);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    attentionBackwardKeyKernel(AttentionContract g, TileShape tiles, AttentionBuffers<T> t) {
  extern __shared__ float shared[];
  const int64_t tasks = attention::keyTileTasks(g, tiles);
  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x)
    attention::backwardKeyTask(CudaBlock{}, shared, g, tiles, t, task);
}

// Raises the kernel's dynamic shared memory limit past the default 48 KiB when the tiles need it.
template <typename KernelFunction>
void allowSharedMemory(KernelFunction kernel, int64_t bytes) {
  if (bytes > 48 * 1024)
    DGEMMA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

int64_t forwardShared(TileShape t, int64_t d, int64_t dv) { return attention::forwardSharedFloats(t, d, dv); }
int64_t backwardQueryShared(TileShape t, int64_t d, int64_t dv) { return attention::backwardQuerySharedFloats(t, d, dv); }
int64_t backwardKeyShared(TileShape t, int64_t d, int64_t dv) { return attention::backwardKeySharedFloats(t, d, dv); }

// The tiles for a kernel, or a plan error when the head dims are too large for its shared memory.
TileShape tilesFor(const KernelSignature& signature, const AttentionContract& g,
                   int64_t (*sharedFloats)(TileShape, int64_t, int64_t)) {
  const TileShape tiles = attention::chooseTiles(g.headDim, g.valueDim, kSharedBudgetBytes, sharedFloats);
  if (tiles.queryTile == 0)
    failSignature(signature, "head dims D=" + std::to_string(g.headDim) + ", Dv=" + std::to_string(g.valueDim) +
                                 " are too large for the cuda kernel's shared memory (" +
                                 std::to_string(kSharedBudgetBytes) + " bytes)");
  return tiles;
}

template <typename T>
class AttentionCudaKernel final : public Kernel {
 public:
  AttentionCudaKernel(AttentionContract g, TileShape tiles) : g_(g), tiles_(tiles) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t tasks = attention::queryTileTasks(g_, tiles_);
    if (tasks == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    const int64_t bytes = forwardShared(tiles_, g_.headDim, g_.valueDim) * 4;
    allowSharedMemory(attentionForwardKernel<T>, bytes);
    const int64_t* segmentIds = g_.segmented ? inputs[g_.segmentInput].as<const int64_t>() : nullptr;
    const int64_t* documentIds = g_.documented ? inputs[g_.documentInput].as<const int64_t>() : nullptr;
    const AttentionBuffers<T> t{inputs[0].as<const T>(),
                                inputs[1].as<const T>(),
                                inputs[2].as<const T>(),
                                inputs[3].as<const uint8_t>(),
                                segmentIds,
                                documentIds,
                                nullptr,
                                outputs[0].as<T>(),
                                nullptr,
                                nullptr,
                                nullptr};
    attentionForwardKernel<T><<<cuda::gridFor(static_cast<uint64_t>(tasks), 1), kThreads, bytes, stream>>>(g_, tiles_, t);
    DGEMMA_CUDA_CHECK_LAUNCH("attentionForwardKernel");
  }

 private:
  AttentionContract g_;
  TileShape tiles_;
};

template <typename T>
class AttentionBackwardCudaKernel final : public Kernel {
 public:
  AttentionBackwardCudaKernel(AttentionContract g, TileShape queryTiles, TileShape keyTiles)
      : g_(g), queryTiles_(queryTiles), keyTiles_(keyTiles) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t queryTasks = attention::queryTileTasks(g_, queryTiles_);
    const int64_t keyTasks = attention::keyTileTasks(g_, keyTiles_);
    if (queryTasks == 0 && keyTasks == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    // The per-row statistics live in stream-ordered scratch memory: the key kernel, later on the same
    // stream, reads them, and the free is ordered after it.
    const int64_t rows = g_.batch * g_.queries * g_.queryHeads;
    float* statistics = nullptr;
    DGEMMA_CUDA_CHECK(cudaMallocAsync(
        reinterpret_cast<void**>(&statistics),
        static_cast<size_t>(std::max<int64_t>(rows, 1) * attention::kStatistics) * sizeof(float), stream));
    const int64_t* segmentIds = g_.segmented ? inputs[g_.segmentInput].as<const int64_t>() : nullptr;
    const int64_t* documentIds = g_.documented ? inputs[g_.documentInput].as<const int64_t>() : nullptr;
    const AttentionBuffers<T> t{inputs[0].as<const T>(),
                                inputs[1].as<const T>(),
                                inputs[2].as<const T>(),
                                inputs[3].as<const uint8_t>(),
                                segmentIds,
                                documentIds,
                                inputs[4].as<const T>(),
                                outputs[0].as<T>(),
                                outputs[1].as<T>(),
                                outputs[2].as<T>(),
                                statistics};
    if (queryTasks > 0) {
      const int64_t bytes = backwardQueryShared(queryTiles_, g_.headDim, g_.valueDim) * 4;
      allowSharedMemory(attentionBackwardQueryKernel<T>, bytes);
      attentionBackwardQueryKernel<T>
          <<<cuda::gridFor(static_cast<uint64_t>(queryTasks), 1), kThreads, bytes, stream>>>(g_, queryTiles_, t);
      DGEMMA_CUDA_CHECK_LAUNCH("attentionBackwardQueryKernel");
    }
    if (keyTasks > 0) {
      const int64_t bytes = backwardKeyShared(keyTiles_, g_.headDim, g_.valueDim) * 4;
      allowSharedMemory(attentionBackwardKeyKernel<T>, bytes);
      attentionBackwardKeyKernel<T>
          <<<cuda::gridFor(static_cast<uint64_t>(keyTasks), 1), kThreads, bytes, stream>>>(g_, keyTiles_, t);
      DGEMMA_CUDA_CHECK_LAUNCH("attentionBackwardKeyKernel");
    }
    DGEMMA_CUDA_CHECK(cudaFreeAsync(statistics, stream));
  }

 private:
  AttentionContract g_;
  TileShape queryTiles_, keyTiles_;
};

std::unique_ptr<Kernel> createAttentionCudaKernel(const KernelSignature& signature) {
  const AttentionContract g = parseAttentionContract(signature, {DType::F32, DType::BF16});
  const TileShape tiles = tilesFor(signature, g, forwardShared);
  if (g.dtype == DType::BF16) return std::make_unique<AttentionCudaKernel<uint16_t>>(g, tiles);
  return std::make_unique<AttentionCudaKernel<float>>(g, tiles);
}

std::unique_ptr<Kernel> createAttentionBackwardCudaKernel(const KernelSignature& signature) {
  const AttentionContract g = parseAttentionBackwardContract(signature, {DType::F32, DType::BF16});
  const TileShape queryTiles = tilesFor(signature, g, backwardQueryShared);
  const TileShape keyTiles = tilesFor(signature, g, backwardKeyShared);
  if (g.dtype == DType::BF16)
    return std::make_unique<AttentionBackwardCudaKernel<uint16_t>>(g, queryTiles, keyTiles);
  return std::make_unique<AttentionBackwardCudaKernel<float>>(g, queryTiles, keyTiles);
}

}  // namespace

void registerAttentionCudaKernels(KernelRegistry& registry) {
  // bf16 buffers are read and written as they are, each result rounded once.
  registry.add("attention", createAttentionCudaKernel, KernelTraits{.handlesReducedFloats = true});
  registry.add("attention_backward", createAttentionBackwardCudaKernel, KernelTraits{.handlesReducedFloats = true});
}

}  // namespace dgemma
