// reduce_sum, reduce_max, reduce_mean on CUDA (docs/kernels.md), f32; runtime/kernels/reduce/cpu.cpp
// is their CPU twin. The index maps (which x elements an output reads) and the max step are
// ReduceIndex.h's, shared with the CPU kernel and checked against it on the host. Sums accumulate in
// f64 and are rounded once, as on the CPU: the two differ only in the f64 summation order, so an
// output differs from the CPU's by at most one f32 rounding step (the max is exact in any order).
//
// Two launch shapes, both grid-stride over the outputs:
//  - a block per output with a shared-memory tree over its threads' partials, when the reduced
//    elements of one output are contiguous in x (a row reduction: the block's reads coalesce) or
//    there are fewer outputs than a block has threads;
//  - a thread per output, walking its reduced elements in order, otherwise (a reduction over leading
//    dims, such as a bias gradient: neighbouring threads read neighbouring elements of x).
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/reduce/Contract.h"
#include "runtime/kernels/reduce/ReduceIndex.h"
#include "support/Shape.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;

enum class Reduction { Sum, Max, Mean };

template <Reduction kind>
struct Accumulate {
  using Value = std::conditional_t<kind == Reduction::Max, float, double>;
  __device__ static Value start() { return kind == Reduction::Max ? Value(-INFINITY) : Value(0); }
  __device__ static Value step(Value value, float x) {
    if constexpr (kind == Reduction::Max)
      return reduce::maxStep(value, x);
    else
      return value + x;
  }
  __device__ static Value merge(Value a, Value b) {
    if constexpr (kind == Reduction::Max)
      return reduce::maxStep(a, b);
    else
      return a + b;
  }
  __device__ static float result(Value value, int64_t count) {
    if constexpr (kind == Reduction::Mean) return static_cast<float>(value / static_cast<double>(count));
    return static_cast<float>(value);
  }
};

template <Reduction kind>
__global__ void reduceBlockPerOutput(const float* x, float* y, reduce::ReduceGeometry geometry) {
  using A = Accumulate<kind>;
  __shared__ typename A::Value partials[kThreads];
  for (int64_t output = blockIdx.x; output < geometry.kept.count; output += gridDim.x) {
    const float* base = x + reduce::offsetOf(geometry.kept, output);
    typename A::Value mine = A::start();
    for (int64_t r = threadIdx.x; r < geometry.reduced.count; r += blockDim.x) {
      DGEMMA_CUDA_BOUNDS(base + reduce::offsetOf(geometry.reduced, r) - x, geometry.kept.count * geometry.reduced.count);
      mine = A::step(mine, base[reduce::offsetOf(geometry.reduced, r)]);
    }
    partials[threadIdx.x] = mine;
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) partials[threadIdx.x] = A::merge(partials[threadIdx.x], partials[threadIdx.x + stride]);
      __syncthreads();
    }
    if (threadIdx.x == 0) y[output] = A::result(partials[0], geometry.reduced.count);
    __syncthreads();  // partials[0] is read before the next output overwrites it
  }
}

template <Reduction kind>
__global__ void reduceThreadPerOutput(const float* x, float* y, reduce::ReduceGeometry geometry) {
  using A = Accumulate<kind>;
  for (int64_t output = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; output < geometry.kept.count;
       output += int64_t(gridDim.x) * blockDim.x) {
    const float* base = x + reduce::offsetOf(geometry.kept, output);
    typename A::Value value = A::start();
    for (int64_t r = 0; r < geometry.reduced.count; ++r) {
      DGEMMA_CUDA_BOUNDS(base + reduce::offsetOf(geometry.reduced, r) - x, geometry.kept.count * geometry.reduced.count);
      value = A::step(value, base[reduce::offsetOf(geometry.reduced, r)]);
    }
    y[output] = A::result(value, geometry.reduced.count);
  }
}

template <Reduction kind>
class ReduceCudaKernel final : public Kernel {
 public:
  explicit ReduceCudaKernel(reduce::ReduceGeometry geometry) : geometry_(geometry) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const uint64_t count = static_cast<uint64_t>(geometry_.kept.count);
    if (count == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    const reduce::DimWalk& reduced = geometry_.reduced;
    const bool contiguousRows = reduced.rank == 1 && reduced.strides[0] == 1;
    if (contiguousRows || count < kThreads) {
      reduceBlockPerOutput<kind><<<cuda::gridFor(count, 1), kThreads, 0, stream>>>(
          inputs[0].as<const float>(), outputs[0].as<float>(), geometry_);
      DGEMMA_CUDA_CHECK_LAUNCH("reduceBlockPerOutput");
    } else {
      reduceThreadPerOutput<kind><<<cuda::gridFor(count, kThreads), kThreads, 0, stream>>>(
          inputs[0].as<const float>(), outputs[0].as<float>(), geometry_);
      DGEMMA_CUDA_CHECK_LAUNCH("reduceThreadPerOutput");
    }
  }

 private:
  reduce::ReduceGeometry geometry_;
};

template <Reduction kind>
std::unique_ptr<Kernel> createReduceCudaKernel(const KernelSignature& signature) {
  const ReduceContract contract = parseReduceContract(signature, {DType::F32});
  reduce::ReduceGeometry geometry;
  if (!makeReduceGeometry(signature.inputs[0]->shape, contract, geometry))
    failSignature(signature, "input x " + shapeToString(signature.inputs[0]->shape) +
                                 ": the CUDA reduction walks at most " + std::to_string(reduce::DimWalk::kMaxRank) +
                                 " non-contiguous kept and reduced dims each");
  return std::make_unique<ReduceCudaKernel<kind>>(geometry);
}

}  // namespace

void registerReduceCudaKernels(KernelRegistry& registry) {
  registry.add("reduce_sum", createReduceCudaKernel<Reduction::Sum>);
  registry.add("reduce_max", createReduceCudaKernel<Reduction::Max>);
  registry.add("reduce_mean", createReduceCudaKernel<Reduction::Mean>);
}

}  // namespace dgemma
