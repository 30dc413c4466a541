// Elementwise kernels on CUDA (f32): add sub mul div maximum minimum and compare (into bool, IEEE
// comparisons as on the CPU: false against NaN except ne) with NumPy broadcasting; neg exp log tanh
// sqrt rsqrt gelu_tanh; copy (any dtype, a device-to-device memcpy).
//
// All launches are 1-D grid-stride loops, 256 threads per block, one output element per iteration.
// Binary ops: the broadcast is analysed once, at plan-load time: dims where the output has size 1
// are dropped and neighbouring dims that broadcast the same way for a and for b are merged, so that
// e.g. [B,S,H] + [H] becomes a 2-D [B*S, H] + [1, H] problem. The kernel then turns the flat output
// index into a's and b's offsets with one div/mod per remaining dim (32-bit arithmetic when the
// output has fewer than 2^32 elements). Same-shape operands take a kernel without index math.
// The accurate libdevice functions are used (no fast math); rsqrt is 1/sqrtf, as on the CPU.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/elementwise/CudaParts.h"
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/elementwise/Contract.h"
#include "support/Shape.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;
constexpr int kMaxDims = 8;

// ---- operations ---------------------------------------------------------------------------------

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct SubOp {
  __device__ float operator()(float a, float b) const { return a - b; }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct DivOp {
  __device__ float operator()(float a, float b) const { return a / b; }
};
// NaN wins (as in NumPy and the CPU twin): a NaN must not be hidden by a clamp.
struct MaximumOp {
  __device__ float operator()(float a, float b) const { return (isnan(a) || a > b) ? a : b; }
};
struct MinimumOp {
  __device__ float operator()(float a, float b) const { return (isnan(a) || a < b) ? a : b; }
};

// compare's predicates: one byte, 1 or 0.
struct LessOp {
  __device__ uint8_t operator()(float a, float b) const { return a < b; }
};
struct LessEqualOp {
  __device__ uint8_t operator()(float a, float b) const { return a <= b; }
};
struct GreaterOp {
  __device__ uint8_t operator()(float a, float b) const { return a > b; }
};
struct GreaterEqualOp {
  __device__ uint8_t operator()(float a, float b) const { return a >= b; }
};
struct EqualOp {
  __device__ uint8_t operator()(float a, float b) const { return a == b; }
};
struct NotEqualOp {
  __device__ uint8_t operator()(float a, float b) const { return a != b; }
};

struct NegOp {
  __device__ float operator()(float x) const { return -x; }
};
struct ExpOp {
  __device__ float operator()(float x) const { return expf(x); }
};
struct LogOp {
  __device__ float operator()(float x) const { return logf(x); }
};
struct TanhOp {
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct SqrtOp {
  __device__ float operator()(float x) const { return sqrtf(x); }
};
struct RsqrtOp {
  __device__ float operator()(float x) const { return 1.0f / sqrtf(x); }
};
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
struct GeluTanhOp {
  __device__ float operator()(float x) const {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    constexpr float kCubic = 0.044715f;
    const float inner = kSqrt2OverPi * (x + kCubic * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  }
};

// ---- kernels ------------------------------------------------------------------------------------

// Flat output index -> offsets in a and b. dims/strides are innermost first; stride 0 broadcasts.
template <typename Index>
struct BroadcastLayout {
  int rank = 0;
  Index dims[kMaxDims] = {};
  Index aStrides[kMaxDims] = {};
  Index bStrides[kMaxDims] = {};
  Index aCount = 0, bCount = 0;  // elements of a and b, the extents of the bounds assertions
};

template <typename Op>
__global__ void unaryKernel(const float* x, float* y, uint64_t n, Op op) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = op(x[i]);
}

template <typename Op, typename Out>
__global__ void binarySameShapeKernel(const float* a, const float* b, Out* c, uint64_t n, Op op) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    c[i] = op(a[i], b[i]);
}

template <typename Op, typename Out, typename Index>
__global__ void binaryBroadcastKernel(const float* a, const float* b, Out* c, uint64_t n,
                                      BroadcastLayout<Index> layout, Op op) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Index rest = static_cast<Index>(i);
    Index aOffset = 0;
    Index bOffset = 0;
#pragma unroll
    for (int d = 0; d < kMaxDims; ++d) {
      if (d == layout.rank) break;
      const Index coordinate = rest % layout.dims[d];
      rest /= layout.dims[d];
      aOffset += coordinate * layout.aStrides[d];
      bOffset += coordinate * layout.bStrides[d];
    }
    DGEMMA_CUDA_BOUNDS(aOffset, layout.aCount);
    DGEMMA_CUDA_BOUNDS(bOffset, layout.bCount);
    c[i] = op(a[aOffset], b[bOffset]);
  }
}

// The smallest kernel of this file: createCudaBackend asks the runtime for its attributes to learn
// whether this build has an image for the device.
__global__ void probeKernel() {}

// ---- broadcast analysis (host) ------------------------------------------------------------------

// Dims innermost first, with the output size and whether a / b broadcast along each.
struct CollapsedBroadcast {
  std::vector<int64_t> dims;
  std::vector<int64_t> aStrides;
  std::vector<int64_t> bStrides;
  int64_t aCount = 1, bCount = 1;  // elements of a and b
};

CollapsedBroadcast collapseBroadcast(const std::vector<int64_t>& aShape, const std::vector<int64_t>& bShape,
                                     const std::vector<int64_t>& cShape) {
  const size_t rank = cShape.size();
  struct Dim {
    int64_t size;
    bool aBroadcast;
    bool bBroadcast;
  };
  std::vector<Dim> dims;  // outermost first, without the output's size-1 dims
  for (size_t d = 0; d < rank; ++d) {
    if (cShape[d] == 1) continue;
    const size_t fromEnd = rank - d;  // 1 for the last dim
    const int64_t aSize = fromEnd <= aShape.size() ? aShape[aShape.size() - fromEnd] : 1;
    const int64_t bSize = fromEnd <= bShape.size() ? bShape[bShape.size() - fromEnd] : 1;
    Dim dim{cShape[d], aSize == 1, bSize == 1};
    if (!dims.empty() && dims.back().aBroadcast == dim.aBroadcast && dims.back().bBroadcast == dim.bBroadcast)
      dims.back().size *= dim.size;
    else
      dims.push_back(dim);
  }
  CollapsedBroadcast out;
  int64_t aStride = 1;
  int64_t bStride = 1;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    out.dims.push_back(it->size);
    out.aStrides.push_back(it->aBroadcast ? 0 : aStride);
    out.bStrides.push_back(it->bBroadcast ? 0 : bStride);
    if (!it->aBroadcast) aStride *= it->size;
    if (!it->bBroadcast) bStride *= it->size;
  }
  out.aCount = aStride;  // the product of the dims a does not broadcast along: its element count
  out.bCount = bStride;
  return out;
}

template <typename Index>
BroadcastLayout<Index> toLayout(const CollapsedBroadcast& collapsed) {
  BroadcastLayout<Index> layout;
  layout.rank = static_cast<int>(collapsed.dims.size());
  for (int d = 0; d < layout.rank; ++d) {
    layout.dims[d] = static_cast<Index>(collapsed.dims[d]);
    layout.aStrides[d] = static_cast<Index>(collapsed.aStrides[d]);
    layout.bStrides[d] = static_cast<Index>(collapsed.bStrides[d]);
  }
  layout.aCount = static_cast<Index>(collapsed.aCount);
  layout.bCount = static_cast<Index>(collapsed.bCount);
  return layout;
}

// ---- kernel objects -----------------------------------------------------------------------------

template <typename Op>
class UnaryCudaKernel final : public Kernel {
 public:
  explicit UnaryCudaKernel(uint64_t n) : n_(n) {}
  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (n_ == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    unaryKernel<<<cuda::gridFor(n_, kThreads), kThreads, 0, stream>>>(inputs[0].as<const float>(),
                                                                      outputs[0].as<float>(), n_, Op{});
    DGEMMA_CUDA_CHECK_LAUNCH("unaryKernel");
  }

 private:
  uint64_t n_;
};

// Out: float for the arithmetic maps, uint8_t (bool) for compare's predicates.
template <typename Op>
class BinaryCudaKernel final : public Kernel {
  using Out = decltype(Op{}(0.0f, 0.0f));

 public:
  BinaryCudaKernel(uint64_t n, const CollapsedBroadcast& collapsed) : n_(n) {
    sameShape_ = collapsed.dims.size() <= 1 && (collapsed.dims.empty() ||
                                                (collapsed.aStrides[0] == 1 && collapsed.bStrides[0] == 1));
    use32_ = n <= std::numeric_limits<uint32_t>::max();
    if (use32_)
      layout32_ = toLayout<uint32_t>(collapsed);
    else
      layout64_ = toLayout<uint64_t>(collapsed);
  }

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (n_ == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    const float* a = inputs[0].as<const float>();
    const float* b = inputs[1].as<const float>();
    Out* c = outputs[0].as<Out>();
    const unsigned blocks = cuda::gridFor(n_, kThreads);
    if (sameShape_) {
      binarySameShapeKernel<<<blocks, kThreads, 0, stream>>>(a, b, c, n_, Op{});
      DGEMMA_CUDA_CHECK_LAUNCH("binarySameShapeKernel");
    } else if (use32_) {
      binaryBroadcastKernel<<<blocks, kThreads, 0, stream>>>(a, b, c, n_, layout32_, Op{});
      DGEMMA_CUDA_CHECK_LAUNCH("binaryBroadcastKernel");
    } else {
      binaryBroadcastKernel<<<blocks, kThreads, 0, stream>>>(a, b, c, n_, layout64_, Op{});
      DGEMMA_CUDA_CHECK_LAUNCH("binaryBroadcastKernel");
    }
  }

 private:
  uint64_t n_;
  bool sameShape_ = false;
  bool use32_ = true;
  BroadcastLayout<uint32_t> layout32_;
  BroadcastLayout<uint64_t> layout64_;
};

class CopyCudaKernel final : public Kernel {
 public:
  explicit CopyCudaKernel(uint64_t bytes) : bytes_(bytes) {}
  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (bytes_ == 0 || inputs[0].data == outputs[0].data) return;
    DGEMMA_CUDA_CHECK(cudaMemcpyAsync(outputs[0].data, inputs[0].data, bytes_, cudaMemcpyDeviceToDevice,
                                      cuda::streamState(context).stream));
  }

 private:
  uint64_t bytes_;
};

// ---- factories ----------------------------------------------------------------------------------

template <typename Op>
std::unique_ptr<Kernel> makeBinaryKernel(const BinaryContract& contract, const KernelSignature& signature) {
  const std::vector<int64_t>& aShape = signature.inputs[0]->shape;
  const std::vector<int64_t>& bShape = signature.inputs[1]->shape;
  CollapsedBroadcast collapsed = collapseBroadcast(aShape, bShape, contract.shape);
  if (collapsed.dims.size() > static_cast<size_t>(kMaxDims))
    failSignature(signature, "broadcasting input a " + shapeToString(aShape) + " with input b " +
                                 shapeToString(bShape) + " needs " + std::to_string(collapsed.dims.size()) +
                                 " index dims; the cuda kernel handles " + std::to_string(kMaxDims));
  return std::make_unique<BinaryCudaKernel<Op>>(static_cast<uint64_t>(numElementsOf(contract.shape)), collapsed);
}

template <typename Op>
std::unique_ptr<Kernel> createBinaryKernel(const KernelSignature& signature) {
  return makeBinaryKernel<Op>(parseBinaryContract(signature, {DType::F32}), signature);
}

std::unique_ptr<Kernel> createCompareKernel(const KernelSignature& signature) {
  const CompareContract contract = parseCompareContract(signature, {DType::F32});
  switch (contract.predicate) {
    case ComparePredicate::Less: return makeBinaryKernel<LessOp>(contract.operands, signature);
    case ComparePredicate::LessEqual: return makeBinaryKernel<LessEqualOp>(contract.operands, signature);
    case ComparePredicate::Greater: return makeBinaryKernel<GreaterOp>(contract.operands, signature);
    case ComparePredicate::GreaterEqual: return makeBinaryKernel<GreaterEqualOp>(contract.operands, signature);
    case ComparePredicate::Equal: return makeBinaryKernel<EqualOp>(contract.operands, signature);
    case ComparePredicate::NotEqual: break;
  }
  return makeBinaryKernel<NotEqualOp>(contract.operands, signature);
}

template <typename Op>
std::unique_ptr<Kernel> createUnaryKernel(const KernelSignature& signature) {
  const UnaryContract contract = parseUnaryContract(signature, {DType::F32});
  return std::make_unique<UnaryCudaKernel<Op>>(static_cast<uint64_t>(contract.count));
}

std::unique_ptr<Kernel> createCopyKernel(const KernelSignature& signature) {
  return std::make_unique<CopyCudaKernel>(parseCopyContract(signature).bytes);
}

}  // namespace

void registerElementwiseCudaKernels(KernelRegistry& registry) {
  registerMapKernels<AddOp, SubOp, MulOp, DivOp, MaximumOp, MinimumOp>(
      registry, kBinaryMapNames, [](auto op) -> KernelFactory { return createBinaryKernel<decltype(op)>; });
  registerMapKernels<NegOp, ExpOp, LogOp, TanhOp, SqrtOp, RsqrtOp, GeluTanhOp>(
      registry, kUnaryMapNames, [](auto op) -> KernelFactory { return createUnaryKernel<decltype(op)>; });
  registry.add("compare", createCompareKernel);
  registry.add("copy", createCopyKernel, KernelTraits{.movesBitsOnly = true});
  registerCastCudaKernels(registry);
  registerFillCudaKernels(registry);
  registerSelectCudaKernels(registry);
}

int probeCudaKernelImage() {
  cudaFuncAttributes attributes{};
  return static_cast<int>(cudaFuncGetAttributes(&attributes, probeKernel));
}

}  // namespace dgemma
