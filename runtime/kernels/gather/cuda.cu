// gather and scatter_add on CUDA (docs/kernels.md); runtime/kernels/gather/cpu.cpp is their CPU twin,
// and RowMap.h, which both call, maps an id to its row of the table's block.
//
// gather: one thread per element of y (grid-stride), moving elements of 1, 2, 4 or 8 bytes as they
// are (any table dtype), a zero for an id outside the block.
//
// scatter_add (f32), deterministic and bit for bit the CPU kernel's: the contract adds a row's
// updates in id order, starting from zero. The positions are sorted by their row with CUB's radix
// sort, which is stable, so each row's positions stay in id order; then one thread per (first
// position of a row, column) sums that row's updates in that order from 0 and writes the row once (no
// atomics, whose order would vary). Skipped positions and ids outside the block sort last under the
// key V and add nothing. The sort's buffers come from the stream-ordered allocator (cudaMallocAsync)
// and are freed on the stream, so nothing synchronizes.
//
// Neither kernel checks for negative ids, which the CPU kernels reject (checking would need a host
// round trip): gather reads a zero row for them and scatter_add adds nothing.
#include <cstdint>
#include <string>

#include <cub/device/device_radix_sort.cuh>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/gather/Contract.h"
#include "runtime/kernels/gather/RowMap.h"
#include "support/DType.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;

template <typename Word, typename Id>
__global__ void gatherKernel(const Word* table, const Id* ids, Word* y, int64_t count, int64_t width, int64_t rowOffset,
                             int64_t vocabulary) {
  for (int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; index < count * width;
       index += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = gather::localRowOf(static_cast<int64_t>(ids[index / width]), rowOffset, vocabulary);
    if (row == gather::kNoRow) {  // an id outside the block (or negative) reads a zero row
      y[index] = Word(0);
      continue;
    }
    DGEMMA_CUDA_BOUNDS(row * width + index % width, vocabulary * width);
    y[index] = table[row * width + index % width];
  }
}

template <typename Id>
class GatherCudaKernel final : public Kernel {
 public:
  explicit GatherCudaKernel(GatherContract c) : c_(c) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t count = inputs[1].numElements();
    if (count == 0 || c_.width == 0) return;
    cuda::withElementWord(dtypeSize(c_.dtype), [&](auto word) { launch<decltype(word)>(context, inputs, outputs, count); });
  }

 private:
  template <typename Word>
  void launch(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs,
              int64_t count) {
    gatherKernel<<<cuda::gridFor(static_cast<uint64_t>(count * c_.width), kThreads), kThreads, 0,
                   cuda::streamState(context).stream>>>(inputs[0].as<const Word>(), inputs[1].as<const Id>(),
                                                        outputs[0].as<Word>(), count, c_.width, c_.rowOffset,
                                                        c_.vocabulary);
    DGEMMA_CUDA_CHECK_LAUNCH("gatherKernel");
  }

  GatherContract c_;
};

// keys[i] = the row position i adds into, or V when it adds nothing; positions[i] = i.
template <typename Id>
__global__ void scatterKeysKernel(const Id* ids, uint32_t* keys, int32_t* positions, int64_t count, bool hasSkip,
                                  int64_t skipId, int64_t rowOffset, int64_t vocabulary) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = gather::scatterRowOf(static_cast<int64_t>(ids[i]), hasSkip, skipId, rowOffset, vocabulary);
    if (row != gather::kNoRow) DGEMMA_CUDA_BOUNDS(row, vocabulary);  // skip_id and other blocks' ids sort last
    keys[i] = static_cast<uint32_t>(row == gather::kNoRow ? vocabulary : row);
    positions[i] = static_cast<int32_t>(i);
  }
}

// Thread (j, h) for the first sorted position j of a row: the row's column h, summed in id order.
__global__ void scatterRowsKernel(const uint32_t* sortedKeys, const int32_t* sortedPositions, const float* updates,
                                  float* table, int64_t count, int64_t width, uint32_t noRow) {
  for (int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; index < count * width;
       index += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = index / width, h = index % width;
    const uint32_t row = sortedKeys[j];
    if (row == noRow || (j > 0 && sortedKeys[j - 1] == row)) continue;
    float sum = 0.0f;
    for (int64_t k = j; k < count && sortedKeys[k] == row; ++k) {
      DGEMMA_CUDA_BOUNDS(sortedPositions[k], count);
      sum += updates[sortedPositions[k] * width + h];
    }
    DGEMMA_CUDA_BOUNDS(static_cast<int64_t>(row) * width + h, static_cast<int64_t>(noRow) * width);  // noRow = V
    table[static_cast<int64_t>(row) * width + h] = sum;
  }
}

template <typename Id>
class ScatterAddCudaKernel final : public Kernel {
 public:
  explicit ScatterAddCudaKernel(GatherContract c) : c_(c) {
    while (keyBits_ < 32 && (uint64_t{1} << keyBits_) <= static_cast<uint64_t>(c_.vocabulary)) ++keyBits_;
  }

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    cudaStream_t stream = cuda::streamState(context).stream;
    float* table = outputs[0].as<float>();
    const int64_t count = inputs[0].numElements();
    DGEMMA_CUDA_CHECK(cudaMemsetAsync(table, 0, static_cast<size_t>(c_.vocabulary * c_.width) * sizeof(float), stream));
    if (count == 0 || c_.width == 0) return;
    const int items = static_cast<int>(count);
    size_t sortBytes = 0;
    DGEMMA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sortBytes, static_cast<const uint32_t*>(nullptr),
                                                      static_cast<uint32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                      static_cast<int32_t*>(nullptr), items, 0, keyBits_, stream));
    // keys, sorted keys, positions, sorted positions, then CUB's temporary storage (256-byte aligned).
    const size_t arrayBytes = (static_cast<size_t>(count) * 4 + 255) / 256 * 256;
    void* workspace = nullptr;
    DGEMMA_CUDA_CHECK(cudaMallocAsync(&workspace, 4 * arrayBytes + sortBytes, stream));
    char* base = static_cast<char*>(workspace);
    uint32_t* keys = reinterpret_cast<uint32_t*>(base);
    uint32_t* sortedKeys = reinterpret_cast<uint32_t*>(base + arrayBytes);
    int32_t* positions = reinterpret_cast<int32_t*>(base + 2 * arrayBytes);
    int32_t* sortedPositions = reinterpret_cast<int32_t*>(base + 3 * arrayBytes);
    scatterKeysKernel<<<cuda::gridFor(static_cast<uint64_t>(count), kThreads), kThreads, 0, stream>>>(
        inputs[0].as<const Id>(), keys, positions, count, c_.skipId.has_value(), c_.skipId.value_or(0), c_.rowOffset,
        c_.vocabulary);
    DGEMMA_CUDA_CHECK_LAUNCH("scatterKeysKernel");
    DGEMMA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 4 * arrayBytes, sortBytes, keys, sortedKeys, positions,
                                                      sortedPositions, items, 0, keyBits_, stream));
    scatterRowsKernel<<<cuda::gridFor(static_cast<uint64_t>(count * c_.width), kThreads), kThreads, 0, stream>>>(
        sortedKeys, sortedPositions, inputs[1].as<const float>(), table, count, c_.width,
        static_cast<uint32_t>(c_.vocabulary));
    DGEMMA_CUDA_CHECK_LAUNCH("scatterRowsKernel");
    DGEMMA_CUDA_CHECK(cudaFreeAsync(workspace, stream));
  }

 private:
  GatherContract c_;
  int keyBits_ = 1;  // enough bits for the keys 0 ... V
};

std::unique_ptr<Kernel> createGatherCudaKernel(const KernelSignature& signature) {
  const GatherContract c = parseGatherContract(signature);
  if (c.idsDtype == DType::I32) return std::make_unique<GatherCudaKernel<int32_t>>(c);
  return std::make_unique<GatherCudaKernel<int64_t>>(c);
}

std::unique_ptr<Kernel> createScatterAddCudaKernel(const KernelSignature& signature) {
  const GatherContract c = parseScatterAddContract(signature, {DType::F32});
  const int64_t count = signature.inputs[0]->numElements();
  if (c.vocabulary >= (int64_t{1} << 32) - 1 || count > INT32_MAX)
    failSignature(signature, "the CUDA scatter_add sorts at most 2^31 - 1 ids into at most 2^32 - 2 rows, got " +
                                 std::to_string(count) + " ids and " + std::to_string(c.vocabulary) + " rows");
  if (c.idsDtype == DType::I32) return std::make_unique<ScatterAddCudaKernel<int32_t>>(c);
  return std::make_unique<ScatterAddCudaKernel<int64_t>>(c);
}

}  // namespace

void registerGatherCudaKernels(KernelRegistry& registry) {
  registry.add("gather", createGatherCudaKernel);
  registry.add("scatter_add", createScatterAddCudaKernel);
}

}  // namespace dgemma
