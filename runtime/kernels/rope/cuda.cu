// rope on CUDA (docs/kernels.md, "Model kernels"), f32; runtime/kernels/rope/cpu.cpp is its CPU twin. The
// frequencies are RopeMath.h's ropeFrequencies, computed on the host as the CPU kernel computes them
// and passed by value in the launch parameters (at most kMaxPairs of them: 2 KB, well inside the
// parameter space); the rotation is RopeMath.h's rotatePair. A block per (b, t) row (grid-stride):
// its threads compute the row's angles (an f32 multiply, as on the CPU) and their cosines and sines
// (libdevice's cosf and sinf, a few ulp from libm's) into shared memory once, then turn every head's
// pairs. Pairs from rotated_pairs on are copied bit for bit, as on the CPU.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/rope/Contract.h"
#include "runtime/kernels/rope/RopeMath.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;
constexpr int64_t kMaxPairs = 512;  // head dims up to 1024 turn every pair

struct Frequencies {
  float values[kMaxPairs];
};

__global__ void ropeKernel(const float* x, const int64_t* positions, float* y, Frequencies frequencies, int64_t rows,
                           int64_t heads, int64_t headDim, int64_t rotated, bool inverse) {
  __shared__ float cosines[kMaxPairs], sines[kMaxPairs];
  const int64_t half = headDim / 2;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float position = static_cast<float>(positions[row]);
    for (int64_t i = threadIdx.x; i < rotated; i += blockDim.x) {
      DGEMMA_CUDA_BOUNDS(i, kMaxPairs);
      const float angle = position * frequencies.values[i];
      cosines[i] = cosf(angle);
      sines[i] = inverse ? -sinf(angle) : sinf(angle);  // sin(-a) = -sin(a) exactly, as on the CPU
    }
    __syncthreads();
    const float* xRow = x + row * heads * headDim;
    float* yRow = y + row * heads * headDim;
    for (int64_t index = threadIdx.x; index < heads * half; index += blockDim.x) {
      const int64_t head = index / half, i = index % half;
      DGEMMA_CUDA_BOUNDS(row * heads * headDim + head * headDim + i + half, rows * heads * headDim);
      const float first = xRow[head * headDim + i], second = xRow[head * headDim + i + half];
      if (i < rotated) {
        const rope::RotatedPair<float> turned = rope::rotatePair(first, second, cosines[i], sines[i]);
        yRow[head * headDim + i] = turned.first;
        yRow[head * headDim + i + half] = turned.second;
      } else {
        yRow[head * headDim + i] = first;
        yRow[head * headDim + i + half] = second;
      }
    }
    __syncthreads();  // the angles are read before the next row overwrites them
  }
}

class RopeCudaKernel final : public Kernel {
 public:
  RopeCudaKernel(RopeContract contract, const std::vector<float>& frequencies) : c_(contract), frequencies_{} {
    for (size_t i = 0; i < frequencies.size(); ++i) frequencies_.values[i] = frequencies[i];
  }

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (c_.positions == 0 || c_.heads == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    ropeKernel<<<cuda::gridFor(static_cast<uint64_t>(c_.positions), 1), kThreads, 0, stream>>>(
        inputs[0].as<const float>(), inputs[1].as<const int64_t>(), outputs[0].as<float>(), frequencies_, c_.positions,
        c_.heads, c_.headDim, c_.rotatedPairs, c_.inverse);
    DGEMMA_CUDA_CHECK_LAUNCH("ropeKernel");
  }

 private:
  RopeContract c_;
  Frequencies frequencies_;
};

std::unique_ptr<Kernel> createRopeCudaKernel(const KernelSignature& signature) {
  const RopeContract c = parseRopeContract(signature, {DType::F32});
  if (c.rotatedPairs > kMaxPairs)
    failSignature(signature, "attribute 'rotated_pairs': the CUDA rope turns at most " + std::to_string(kMaxPairs) +
                                 " pairs, got " + std::to_string(c.rotatedPairs));
  return std::make_unique<RopeCudaKernel>(c, rope::ropeFrequencies<float>(c.theta, c.rotatedPairs, c.frequencyDim));
}

}  // namespace

void registerRopeCudaKernels(KernelRegistry& registry) { registry.add("rope", createRopeCudaKernel); }

}  // namespace dgemma
