// cross_entropy and cross_entropy_backward on CUDA (docs/kernels.md), f32 or bf16 logits;
// runtime/kernels/cross_entropy/cpu.cpp is the CPU twin. What a block does for one row is
// cross_entropy/CrossEntropyMath.h (the CPU kernel's arithmetic in its order and precision), which
// the CPU unit test runs on the host against the CPU kernel; this file holds the block reductions,
// the __global__ wrappers, the id check and the launches.
//
// One block per row (grid-stride over rows). Each thread walks the columns j = threadIdx.x + n ·
// blockDim.x, recomputing the soft-cap and the bonus on the fly, so no [N, V] tensor other than the
// backward's output exists: pass 1 the row max of z (f64 block reduction), pass 2 Σ exp(z − max) with
// each exp in f32 and the sum in f64 (f64 block reduction); the forward's thread 0 then writes the
// loss, the backward's threads write grad_logits once in a third pass.
//
// Ids outside [0, V): before the main kernel a check kernel records the lowest bad row of the targets
// and of the bonus ids; the launch code copies the two to the host, synchronising the stream, and
// throws the CPU kernel's RuntimeError (the first bad target, else the first bad bonus id) before any
// output is written.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/cross_entropy/Contract.h"
#include "runtime/kernels/cross_entropy/CrossEntropyMath.h"

namespace dgemma {
namespace {

using cross_entropy::IdTensor;
using cross_entropy::RowInputs;

constexpr unsigned kMaxThreads = 256;
constexpr unsigned long long kNoBadRow = ~0ull;

// Reduces one double per thread over the block (blockDim.x a multiple of 32, every thread calls it).
template <typename Combine>
__device__ double blockReduceDouble(double value, Combine combine, double identity) {
  __shared__ double partial[32];
  __shared__ double result;
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
  __syncthreads();  // a previous call's `result` has been read by every thread
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < warps ? partial[lane] : identity;
    for (int offset = 16; offset > 0; offset >>= 1)
      value = combine(value, __shfl_xor_sync(0xffffffffu, value, offset));
    if (lane == 0) result = value;
  }
  __syncthreads();
  return result;
}

// The CUDA block as CrossEntropyMath.h's row bodies see it (host-device, as the bodies are).
struct CudaBlock : kernels::CudaThreadIndex {
  DGEMMA_HOST_DEVICE double reduceMaximum(double value) const {
#if defined(__CUDA_ARCH__)
    return blockReduceDouble(value, [](double a, double b) { return cross_entropy::combineMaximum(a, b); }, -INFINITY);
#else
    return value;
#endif
  }
  DGEMMA_HOST_DEVICE double reduceSum(double value) const {
#if defined(__CUDA_ARCH__)
    return blockReduceDouble(value, [](double a, double b) { return cross_entropy::combineSum(a, b); }, 0.0);
#else
    return value;
#endif
  }
};

// One block per row, grid-stride over the rows.
template <typename T>
__global__ void crossEntropyKernel(RowInputs<T> in, T* loss) {
  for (int64_t r = blockIdx.x; r < in.rows; r += gridDim.x) cross_entropy::lossRow(CudaBlock{}, in, r, loss);
}

template <typename T>
__global__ void crossEntropyBackwardKernel(RowInputs<T> in, const T* gradOutput, T* gradLogits) {
  for (int64_t r = blockIdx.x; r < in.rows; r += gridDim.x)
    cross_entropy::gradientRow(CudaBlock{}, in, r, gradOutput, gradLogits);
}

// Records the lowest row whose id lies outside [0, V).
__global__ void findIdOutsideVocabulary(IdTensor ids, int64_t rows, int64_t vocabulary, unsigned long long* firstBad) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (!cross_entropy::idInVocabulary(ids[r], vocabulary)) atomicMin(firstBad, static_cast<unsigned long long>(r));
}

// Runs the id checks on the stream and throws the CPU kernel's RuntimeError for the first bad id.
void checkIds(const std::string& where, cudaStream_t stream, int64_t rows, int64_t vocabulary, IdTensor targets,
              const IdTensor* bonusIds) {
  if (rows == 0) return;
  unsigned long long* firstBad = nullptr;
  DGEMMA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&firstBad), 2 * sizeof(unsigned long long), stream));
  DGEMMA_CUDA_CHECK(cudaMemsetAsync(firstBad, 0xff, 2 * sizeof(unsigned long long), stream));
  const unsigned threads = 256;
  const unsigned blocks = cuda::gridFor(static_cast<uint64_t>(rows), threads);
  findIdOutsideVocabulary<<<blocks, threads, 0, stream>>>(targets, rows, vocabulary, firstBad);
  DGEMMA_CUDA_CHECK_LAUNCH("findIdOutsideVocabulary");
  if (bonusIds != nullptr) {
    findIdOutsideVocabulary<<<blocks, threads, 0, stream>>>(*bonusIds, rows, vocabulary, firstBad + 1);
    DGEMMA_CUDA_CHECK_LAUNCH("findIdOutsideVocabulary");
  }
  unsigned long long bad[2];
  DGEMMA_CUDA_CHECK(cudaMemcpyAsync(bad, firstBad, sizeof(bad), cudaMemcpyDeviceToHost, stream));
  DGEMMA_CUDA_CHECK(cudaFreeAsync(firstBad, stream));
  DGEMMA_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (int role = 0; role < 2; ++role) {
    if (bad[role] == kNoBadRow) continue;
    const IdTensor& ids = role == 0 ? targets : *bonusIds;
    const int64_t row = static_cast<int64_t>(bad[role]);
    int64_t id = 0;
    if (ids.wide) {
      DGEMMA_CUDA_CHECK(cudaMemcpy(&id, static_cast<const int64_t*>(ids.data) + row, sizeof(int64_t),
                                   cudaMemcpyDeviceToHost));
    } else {
      int32_t narrow = 0;
      DGEMMA_CUDA_CHECK(cudaMemcpy(&narrow, static_cast<const int32_t*>(ids.data) + row, sizeof(int32_t),
                                   cudaMemcpyDeviceToHost));
      id = narrow;
    }
    throw RuntimeError(idOutsideVocabularyMessage(where, role == 0 ? "target" : "bonus", id, row, vocabulary));
  }
}

unsigned threadsFor(int64_t vocabulary) {
  return vocabulary >= kMaxThreads ? kMaxThreads : static_cast<unsigned>((vocabulary + 31) / 32 * 32);
}

template <typename T>
class CrossEntropyCudaKernel final : public Kernel {
 public:
  CrossEntropyCudaKernel(std::string where, CrossEntropyContract contract, bool backward)
      : where_(std::move(where)), c_(contract), backward_(backward) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (c_.rows == 0 || c_.vocabulary == 0) {
      // No rows: nothing to do. V = 0: every target is outside the (empty) vocabulary.
      if (c_.rows > 0) throw RuntimeError(idOutsideVocabularyMessage(where_, "target", readFirstTarget(inputs), 0, 0));
      return;
    }
    cudaStream_t stream = cuda::streamState(context).stream;
    RowInputs<T> in{inputs[0].as<const T>(),
               c_.rows,
               c_.vocabulary,
               IdTensor{inputs[1].data, c_.wideTargets},
               IdTensor{c_.hasBonus ? inputs[2].data : nullptr, c_.wideBonusIds},
               c_.hasBonus ? inputs[3].as<const T>() : nullptr,
               static_cast<float>(c_.softcap)};
    checkIds(where_, stream, c_.rows, c_.vocabulary, in.targets, c_.hasBonus ? &in.bonusIds : nullptr);
    const unsigned blocks = cuda::gridFor(static_cast<uint64_t>(c_.rows), 1);
    const unsigned threads = threadsFor(c_.vocabulary);
    if (backward_) {
      crossEntropyBackwardKernel<T><<<blocks, threads, 0, stream>>>(in, inputs.back().as<const T>(), outputs[0].as<T>());
      DGEMMA_CUDA_CHECK_LAUNCH("crossEntropyBackwardKernel");
    } else {
      crossEntropyKernel<T><<<blocks, threads, 0, stream>>>(in, outputs[0].as<T>());
      DGEMMA_CUDA_CHECK_LAUNCH("crossEntropyKernel");
    }
  }

 private:
  int64_t readFirstTarget(const std::vector<TensorRef>& inputs) const {
    int64_t id = 0;
    if (c_.wideTargets) {
      DGEMMA_CUDA_CHECK(cudaMemcpy(&id, inputs[1].data, sizeof(int64_t), cudaMemcpyDeviceToHost));
    } else {
      int32_t narrow = 0;
      DGEMMA_CUDA_CHECK(cudaMemcpy(&narrow, inputs[1].data, sizeof(int32_t), cudaMemcpyDeviceToHost));
      id = narrow;
    }
    return id;
  }

  std::string where_;  // run-time errors name the step as the CPU kernel's do
  CrossEntropyContract c_;
  bool backward_;
};

template <bool kBackward>
std::unique_ptr<Kernel> createCrossEntropyCudaKernel(const KernelSignature& signature) {
  const CrossEntropyContract c = kBackward ? parseCrossEntropyBackwardContract(signature, {DType::F32, DType::BF16})
                                           : parseCrossEntropyContract(signature, {DType::F32, DType::BF16});
  if (c.dtype == DType::BF16) return std::make_unique<CrossEntropyCudaKernel<uint16_t>>(signature.where, c, kBackward);
  return std::make_unique<CrossEntropyCudaKernel<float>>(signature.where, c, kBackward);
}

}  // namespace

void registerCrossEntropyCudaKernels(KernelRegistry& registry) {
  // bf16 buffers are read and written as they are, each result rounded once.
  registry.add("cross_entropy", createCrossEntropyCudaKernel<false>, KernelTraits{.handlesReducedFloats = true});
  registry.add("cross_entropy_backward", createCrossEntropyCudaKernel<true>, KernelTraits{.handlesReducedFloats = true});
}

}  // namespace dgemma
