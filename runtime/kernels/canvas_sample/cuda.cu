// canvas_sample on CUDA (docs/kernels.md, "canvas_sample"); runtime/kernels/canvas_sample/cpu.cpp is
// its CPU twin. One block per (b, l) position (grid-stride when there are more positions than
// blocks). Each thread streams over Philox blocks of the position's vocabulary (four consecutive
// entries per block, so each thread computes the words it uses exactly once), keeping its own online
// statistics: the max with the CPU kernel's f64 (ties, rest, weighted) sums (see RunningSoftmax in
// cpu.cpp), the first index of the max, and the best Gumbel-max key. A shared-memory tree then
// combines the threads' statistics.
//
// The chosen ids equal the CPU kernel's when the kernel does not soft-cap: z = x / T is an IEEE
// division (no fast math), the noise is
// GumbelNoise.h's portable arithmetic (FMA contraction is off for these kernels, see CMakeLists.txt),
// and both sides keep the lowest index among equal maxima. The soft-cap uses tanhf, as the CUDA tanh
// kernel does, where the CPU uses fastTanh: capped logits (like the unfused ops' on the two
// backends) may differ in their last bit, and an id at such an edge with them. The entropy uses libdevice's expf where
// the CPU uses fastExp, so it agrees to about 1e-6 relative rather than bit for bit. A non-positive
// temperature, which the CPU kernel rejects, is not checked here (checking would need a host round
// trip); the caller computes temperatures from its schedule.
#include <cmath>
#include <cstdint>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/core/Philox.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/canvas_sample/Contract.h"
#include "runtime/kernels/canvas_sample/GumbelNoise.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;
constexpr int64_t kNoIndex = INT64_MAX;
constexpr float kLowestExponent = -104.0f;  // as the CPU kernel: e^(z−m) is 0 in f32 below it

// The statistics of some of one position's vocabulary entries.
struct Partial {
  float maximum;
  double ties, rest, weighted;  // entries equal to maximum, Σ e^(z−maximum) over the others, Σ e^(z−maximum)·(z−maximum)
  int64_t argmax;        // the lowest index of `maximum`
  float bestKey;
  int64_t sampled;  // the lowest index of `bestKey`
};

__device__ Partial emptyPartial() { return {-INFINITY, 0.0, 0.0, 0.0, kNoIndex, -INFINITY, kNoIndex}; }

// Adds the softmax sums of `part` to `into`, whose max is at least part's.
__device__ void addSums(const Partial& part, Partial& into) {
  if (part.maximum == into.maximum) {
    into.ties += part.ties;
    into.rest += part.rest;
    into.weighted += part.weighted;
    return;
  }
  const double count = part.ties + part.rest;
  if (!(count > 0.0)) return;
  const double shift = static_cast<double>(part.maximum) - into.maximum;
  const double scale = exp(shift);
  into.rest += scale * count;
  into.weighted += scale * (part.weighted + shift * count);
}

__device__ bool wins(float value, int64_t index, float otherValue, int64_t otherIndex) {
  return value > otherValue || (value == otherValue && index < otherIndex);
}

__device__ Partial combine(const Partial& a, const Partial& b) {
  Partial result;
  result.maximum = fmaxf(a.maximum, b.maximum);
  result.ties = result.rest = result.weighted = 0.0;
  addSums(a, result);
  addSums(b, result);
  result.argmax = wins(b.maximum, b.argmax, a.maximum, a.argmax) ? b.argmax : a.argmax;
  const bool keyB = wins(b.bestKey, b.sampled, a.bestKey, a.sampled);
  result.bestKey = keyB ? b.bestKey : a.bestKey;
  result.sampled = keyB ? b.sampled : a.sampled;
  return result;
}

// support/DType.h's f32ToBf16Bits on the device: round to nearest even, NaN quietened.
__device__ uint16_t bf16Bits(float value) {
  const uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

__device__ void storeScaled(float* scaled, int64_t at, float z) { scaled[at] = z; }
__device__ void storeScaled(uint16_t* scaled, int64_t at, float z) { scaled[at] = bf16Bits(z); }

template <typename Scaled>
__global__ void canvasSampleKernel(const float* logits, const float* temperature, const int64_t* keys, int64_t* sampled,
                                   int64_t* argmax, float* entropy, Scaled* scaled, float softcap, int64_t canvas,
                                   int64_t vocab, int64_t positions) {
  __shared__ Partial partials[kThreads];
  for (int64_t position = blockIdx.x; position < positions; position += gridDim.x) {
    const int64_t b = position / canvas, l = position % canvas;
    DGEMMA_CUDA_BOUNDS(2 * b + 1, 2 * (positions / canvas));  // keys [B, 2]
    const float t = temperature[b];
    const uint64_t seed = static_cast<uint64_t>(keys[2 * b]), offset = static_cast<uint64_t>(keys[2 * b + 1]);
    const uint64_t firstIndex = static_cast<uint64_t>(l) * static_cast<uint64_t>(vocab);
    const uint64_t endIndex = firstIndex + static_cast<uint64_t>(vocab);
    const float* row = logits + position * vocab;
    Scaled* scaledRow = scaled + position * vocab;

    Partial mine = emptyPartial();
    for (uint64_t block = firstIndex / 4 + threadIdx.x; 4 * block < endIndex; block += blockDim.x) {
      const PhiloxCounter words = philoxUniformBlock(seed, 0, offset, block);
      for (int j = 0; j < 4; ++j) {
        const uint64_t index = 4 * block + j;
        if (index < firstIndex || index >= endIndex) continue;
        const int64_t v = static_cast<int64_t>(index - firstIndex);
        DGEMMA_CUDA_BOUNDS(position * vocab + v, positions * vocab);
        // cap(x) / T, the cap as the div, tanh and mul kernels compute it.
        const float z = (softcap > 0.0f ? tanhf(row[v] / softcap) * softcap : row[v]) / t;
        storeScaled(scaledRow, v, z);
        if (z > mine.maximum) {
          Partial raised = mine;
          raised.maximum = z;
          raised.ties = raised.rest = raised.weighted = 0.0;
          addSums(mine, raised);
          raised.argmax = v;
          mine = raised;
        }
        if (mine.maximum != -INFINITY) {
          const float shifted = fmaxf(z - mine.maximum, kLowestExponent);
          if (shifted == 0.0f) {
            mine.ties += 1.0;
          } else {
            const float e = expf(shifted);
            mine.rest += e;
            mine.weighted += static_cast<double>(e * shifted);
          }
        }
        const float key = z + canvas_sample::gumbelNoise(words[j]);
        if (key > mine.bestKey) {
          mine.bestKey = key;
          mine.sampled = v;
        }
      }
    }

    partials[threadIdx.x] = mine;
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) DGEMMA_CUDA_BOUNDS(threadIdx.x + stride, kThreads);
      if (threadIdx.x < stride) partials[threadIdx.x] = combine(partials[threadIdx.x], partials[threadIdx.x + stride]);
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      const Partial all = partials[0];
      // Every z -inf: no key and no max won, and the CPU kernel's answer is index 0.
      sampled[position] = all.sampled == kNoIndex ? 0 : all.sampled;
      argmax[position] = all.argmax == kNoIndex ? 0 : all.argmax;
      entropy[position] = static_cast<float>(log(all.ties) + log1p(all.rest / all.ties) - all.weighted / (all.ties + all.rest));
    }
    __syncthreads();  // partials[0] is read before the next position overwrites it
  }
}

class CanvasSampleCudaKernel final : public Kernel {
 public:
  explicit CanvasSampleCudaKernel(CanvasSampleContract contract) : c_(contract) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t positions = c_.batch * c_.canvas;
    if (positions == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    const unsigned blocks = cuda::gridFor(static_cast<uint64_t>(positions), 1);
    const float* logits = inputs[0].as<const float>();
    const float* temperature = inputs[1].as<const float>();
    const int64_t* keys = inputs[2].as<const int64_t>();
    int64_t* sampled = outputs[0].as<int64_t>();
    int64_t* argmax = outputs[1].as<int64_t>();
    float* entropy = outputs[2].as<float>();
    if (c_.scaledDType == DType::BF16)
      canvasSampleKernel<<<blocks, kThreads, 0, stream>>>(logits, temperature, keys, sampled, argmax, entropy,
                                                          outputs[3].as<uint16_t>(), c_.softcap, c_.canvas, c_.vocab,
                                                          positions);
    else
      canvasSampleKernel<<<blocks, kThreads, 0, stream>>>(logits, temperature, keys, sampled, argmax, entropy,
                                                          outputs[3].as<float>(), c_.softcap, c_.canvas, c_.vocab,
                                                          positions);
    DGEMMA_CUDA_CHECK_LAUNCH("canvasSampleKernel");
  }

 private:
  CanvasSampleContract c_;
};

std::unique_ptr<Kernel> createCanvasSampleCudaKernel(const KernelSignature& signature) {
  return std::make_unique<CanvasSampleCudaKernel>(parseCanvasSampleContract(signature));
}

}  // namespace

void registerCanvasSampleCudaKernels(KernelRegistry& registry) {
  registry.add("canvas_sample", createCanvasSampleCudaKernel, KernelTraits{.handlesReducedFloats = true});
}

}  // namespace dgemma
