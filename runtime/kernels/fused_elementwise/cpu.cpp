// fused_elementwise on the CPU: a chain of elementwise ops (the program of dg-fuse-elementwise)
// evaluated tile by tile. Each tile of up to kTile consecutive output elements loads its inputs
// once, runs every instruction over the tile on the stack (in L1, never in a tensor of the plan)
// and stores the last value once: the chain costs one pass over memory instead of one per op.
//
// Bit for bit the unfused chain: each instruction calls the element functors (and, for exp, tanh
// and gelu_tanh on f32, the very compiled AVX2 clones) of elementwise/MapOps.h, in the precision
// the unfused kernel uses: f64 in an f64 chain, f32 otherwise. A 16-bit value is rounded to its
// dtype (nearest even) where the unfused program would have stored it, which is what the CPU
// backend's widening does around each unfused step (backends/cpu/ReducedPrecision.h): so the kernel
// reads and writes its bf16 and f16 buffers itself (KernelTraits::handlesReducedFloats).
//
// An input broadcast along the whole run (a scalar, a per-row value) is one element, not a tile: the
// binary instructions read it as such, and only the others get it spread over a tile. The f32
// binary loops run in AVX2 clones without FMA: each element is still the one IEEE operation.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/elementwise/MapOps.h"
#include "runtime/kernels/fused_elementwise/Contract.h"

namespace dgemma {
namespace {

using namespace cpu;  // the element functors

constexpr int64_t kTile = 256;

// The output's index space with each input's strides (0 along a broadcast dimension), after
// dropping size-1 dimensions and merging neighbours that every input walks alike, so that runs
// along the last dimension are as long as the layout allows.
struct Geometry {
  std::vector<int64_t> shape;
  std::vector<std::vector<int64_t>> strides;  // per input, per dimension of `shape`
};

Geometry geometryOf(const std::vector<int64_t>& shape, const KernelSignature& signature) {
  std::vector<std::vector<int64_t>> full;
  for (const Buffer* input : signature.inputs) {
    const std::vector<int64_t> own = rowMajorStrides(input->shape);
    std::vector<int64_t> strides(shape.size(), 0);
    const size_t leading = shape.size() - input->shape.size();
    for (size_t d = 0; d < input->shape.size(); ++d) strides[leading + d] = input->shape[d] == 1 ? 0 : own[d];
    full.push_back(std::move(strides));
  }
  Geometry geometry;
  geometry.strides.resize(full.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merges = !geometry.shape.empty();
    for (size_t k = 0; merges && k < full.size(); ++k) merges = geometry.strides[k].back() == full[k][d] * shape[d];
    if (merges) {
      geometry.shape.back() *= shape[d];
      for (size_t k = 0; k < full.size(); ++k) geometry.strides[k].back() = full[k][d];
      continue;
    }
    geometry.shape.push_back(shape[d]);
    for (size_t k = 0; k < full.size(); ++k) geometry.strides[k].push_back(full[k][d]);
  }
  if (geometry.shape.empty()) {  // one element
    geometry.shape.push_back(1);
    for (std::vector<int64_t>& strides : geometry.strides) strides.push_back(0);
  }
  return geometry;
}

// cpu::StridedCursor with as many operands as the program has inputs.
class Cursor {
 public:
  explicit Cursor(const Geometry& geometry)
      : geometry_(&geometry), coord_(geometry.shape.size(), 0), offsets_(geometry.strides.size(), 0) {}

  void seek(int64_t index) {
    std::fill(offsets_.begin(), offsets_.end(), 0);
    for (size_t d = shape().size(); d-- > 0;) {
      coord_[d] = index % shape()[d];
      index /= shape()[d];
      for (size_t k = 0; k < offsets_.size(); ++k) offsets_[k] += coord_[d] * strides(k)[d];
    }
  }
  int64_t runLength() const { return shape().back() - coord_.back(); }
  int64_t innerStride(size_t k) const { return strides(k).back(); }
  int64_t offset(size_t k) const { return offsets_[k]; }

  void advance(int64_t length) {
    const size_t last = shape().size() - 1;
    coord_[last] += length;
    for (size_t k = 0; k < offsets_.size(); ++k) offsets_[k] += length * strides(k)[last];
    for (size_t d = last; d > 0 && coord_[d] == shape()[d]; --d) {
      coord_[d] = 0;
      ++coord_[d - 1];
      for (size_t k = 0; k < offsets_.size(); ++k) offsets_[k] += strides(k)[d - 1] - shape()[d] * strides(k)[d];
    }
  }

 private:
  const std::vector<int64_t>& shape() const { return geometry_->shape; }
  const std::vector<int64_t>& strides(size_t k) const { return geometry_->strides[k]; }

  const Geometry* geometry_;
  std::vector<int64_t> coord_;
  std::vector<int64_t> offsets_;
};

// Loads `length` elements of a buffer of `dtype` from `offset` with stride 0 or 1 into the tile.
template <typename C>
void loadTile(const void* data, DType dtype, int64_t offset, int64_t stride, int64_t length, C* tile) {
  auto load = [&](auto convert, auto* typed) {
    const auto* source = typed + offset;
    if (stride == 0) std::fill(tile, tile + length, static_cast<C>(convert(source[0])));
    else
      for (int64_t k = 0; k < length; ++k) tile[k] = static_cast<C>(convert(source[k]));
  };
  auto same = [](auto value) { return value; };
  switch (dtype) {
    case DType::F32: load(same, static_cast<const float*>(data)); break;
    case DType::F64: load(same, static_cast<const double*>(data)); break;
    case DType::BF16: load(bf16BitsToF32, static_cast<const uint16_t*>(data)); break;
    case DType::F16: load(f16BitsToF32, static_cast<const uint16_t*>(data)); break;
    default: load([](uint8_t flag) { return flag != 0 ? 1 : 0; }, static_cast<const uint8_t*>(data)); break;  // bool
  }
}

template <typename C>
void storeTile(const C* tile, DType dtype, int64_t length, void* destination) {
  switch (dtype) {
    case DType::F32: std::copy(tile, tile + length, static_cast<float*>(destination)); break;
    case DType::F64: std::copy(tile, tile + length, static_cast<double*>(destination)); break;
    case DType::BF16:
      for (int64_t k = 0; k < length; ++k) static_cast<uint16_t*>(destination)[k] = f32ToBf16Bits(tile[k]);
      break;
    default:  // f16
      for (int64_t k = 0; k < length; ++k) static_cast<uint16_t*>(destination)[k] = f32ToF16Bits(tile[k]);
      break;
  }
}

// A 16-bit value as the unfused program holds it: stored rounded to nearest even, read widened.
template <typename C>
void roundTile(DType dtype, int64_t length, C* tile) {
  if (dtype == DType::BF16)
    for (int64_t k = 0; k < length; ++k) tile[k] = bf16BitsToF32(f32ToBf16Bits(tile[k]));
  else if (dtype == DType::F16)
    for (int64_t k = 0; k < length; ++k) tile[k] = f16BitsToF32(f32ToF16Bits(tile[k]));
}

// A value of the tile: `length` elements, or one element standing for all of them (uniform).
template <typename C>
struct TileValue {
  const C* data = nullptr;
  bool uniform = false;
};

template <typename C, typename Op>
[[gnu::always_inline]] inline void binaryLoop(TileValue<C> a, TileValue<C> b, C* out, int64_t length) {
  const Op op;
  if (a.uniform && b.uniform) {
    const C result = op(a.data[0], b.data[0]);
    for (int64_t k = 0; k < length; ++k) out[k] = result;
  } else if (a.uniform) {
    const C scalar = a.data[0];
    for (int64_t k = 0; k < length; ++k) out[k] = op(scalar, b.data[k]);
  } else if (b.uniform) {
    const C scalar = b.data[0];
    for (int64_t k = 0; k < length; ++k) out[k] = op(a.data[k], scalar);
  } else {
    for (int64_t k = 0; k < length; ++k) out[k] = op(a.data[k], b.data[k]);
  }
}

template <typename C>
[[gnu::always_inline]] inline void binaryTileIn(fused::Opcode opcode, TileValue<C> a, TileValue<C> b, C* out,
                                                int64_t length) {
  using fused::Opcode;
  switch (opcode) {
    case Opcode::Add: binaryLoop<C, AddOp>(a, b, out, length); break;
    case Opcode::Sub: binaryLoop<C, SubOp>(a, b, out, length); break;
    case Opcode::Mul: binaryLoop<C, MulOp>(a, b, out, length); break;
    case Opcode::Div: binaryLoop<C, DivOp>(a, b, out, length); break;
    case Opcode::Maximum: binaryLoop<C, MaximumOp>(a, b, out, length); break;
    default: binaryLoop<C, MinimumOp>(a, b, out, length); break;
  }
}

DGEMMA_CPU_CLONES_FOR_AVX2_WITHOUT_FMA void binaryTileF32(fused::Opcode opcode, TileValue<float> a, TileValue<float> b,
                                                          float* out, int64_t length) {
  binaryTileIn(opcode, a, b, out, length);
}

template <typename C>
void binaryTile(fused::Opcode opcode, TileValue<C> a, TileValue<C> b, C* out, int64_t length) {
  if constexpr (std::is_same_v<C, float>)
    binaryTileF32(opcode, a, b, out, length);
  else
    binaryTileIn(opcode, a, b, out, length);
}

bool isBinary(fused::Opcode opcode) {
  using fused::Opcode;
  return opcode == Opcode::Add || opcode == Opcode::Sub || opcode == Opcode::Mul || opcode == Opcode::Div ||
         opcode == Opcode::Maximum || opcode == Opcode::Minimum;
}

// The unary maps as UnaryKernel<C, Op> computes them.
template <typename C, typename Op>
void unaryTile(const C* x, C* out, int64_t length) {
  if constexpr (std::is_same_v<C, float> && std::is_same_v<Op, ExpOp>) mapExp(x, out, 0, length);
  else if constexpr (std::is_same_v<C, float> && std::is_same_v<Op, TanhOp>) mapTanh(x, out, 0, length);
  else if constexpr (std::is_same_v<C, float> && std::is_same_v<Op, GeluTanhOp>) mapGeluTanh(x, out, 0, length);
  else mapElements<C, Op>(x, out, 0, length);
}

// The unary ops, cast and select, over whole tiles (binary ops take binaryTile).
template <typename C>
void runInstruction(const fused::Instruction& instruction, const C* const* args, C* out, int64_t length) {
  using fused::Opcode;
  switch (instruction.opcode) {
    case Opcode::Add:
    case Opcode::Sub:
    case Opcode::Mul:
    case Opcode::Div:
    case Opcode::Maximum:
    case Opcode::Minimum: break;  // binaryTile
    case Opcode::Neg: unaryTile<C, NegOp>(args[0], out, length); break;
    case Opcode::Exp: unaryTile<C, ExpOp>(args[0], out, length); break;
    case Opcode::Log: unaryTile<C, LogOp>(args[0], out, length); break;
    case Opcode::Tanh: unaryTile<C, TanhOp>(args[0], out, length); break;
    case Opcode::Sqrt: unaryTile<C, SqrtOp>(args[0], out, length); break;
    case Opcode::Rsqrt: unaryTile<C, RsqrtOp>(args[0], out, length); break;
    case Opcode::GeluTanh: unaryTile<C, GeluTanhOp>(args[0], out, length); break;
    // The value holds its source's number exactly; rounding to the target dtype is the cast (as the
    // cast kernel's round-to-odd f64 step is exact for a float that fits in f32).
    case Opcode::Cast: std::copy(args[0], args[0] + length, out); break;
    case Opcode::Select:
      for (int64_t k = 0; k < length; ++k) out[k] = args[0][k] != 0 ? args[1][k] : args[2][k];
      break;
  }
}

// C is the compute type: double for an f64 chain, float otherwise.
template <typename C>
class FusedElementwiseKernel final : public Kernel {
 public:
  FusedElementwiseKernel(FusedElementwiseContract contract, Geometry geometry)
      : contract_(std::move(contract)), geometry_(std::move(geometry)) {
    count_ = 1;
    for (int64_t size : contract_.shape) count_ *= size;
    inputs_ = geometry_.strides.size();
  }

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const size_t values = contract_.valueDTypes.size();
    const DType outputDType = contract_.valueDTypes.back();
    uint8_t* output = static_cast<uint8_t*>(outputs[0].data);
    const size_t outputSize = dtypeSize(outputDType);
    // An input of the compute type read along the run is used where it lies, and the last value
    // of the compute type is written straight into y: only the other values take tiles.
    const DType computeDType = contract_.computesInF64 ? DType::F64 : DType::F32;
    parallelFor(context, count_, kElementGrain, [&](int64_t begin, int64_t end) {
      // Per thread and reused: a tile's elements are always written before they are read.
      thread_local std::vector<C> tiles;
      thread_local std::vector<const C*> args;
      thread_local std::vector<TileValue<C>> valueData;
      if (tiles.size() < values * kTile) tiles.resize(values * kTile);
      valueData.resize(values);
      Cursor cursor(geometry_);
      cursor.seek(begin);
      for (int64_t index = begin; index < end;) {
        const int64_t length = std::min({end - index, cursor.runLength(), kTile});
        for (size_t k = 0; k < inputs_; ++k) {
          if (contract_.valueDTypes[k] == computeDType && cursor.innerStride(k) == 1) {
            valueData[k] = {inputs[k].as<const C>() + cursor.offset(k), false};
            continue;
          }
          // A broadcast input loads its one element; spreadOver fills the tile if an op needs it.
          const bool uniform = cursor.innerStride(k) == 0;
          C* tile = tiles.data() + k * kTile;
          loadTile(inputs[k].data, contract_.valueDTypes[k], cursor.offset(k), cursor.innerStride(k),
                   uniform ? 1 : length, tile);
          valueData[k] = {tile, uniform};
        }
        for (size_t i = 0; i < contract_.program.instructions.size(); ++i) {
          const fused::Instruction& instruction = contract_.program.instructions[i];
          const size_t value = inputs_ + i;
          const bool last = value + 1 == values;
          C* out = last && outputDType == computeDType ? reinterpret_cast<C*>(output + index * outputSize)
                                                       : tiles.data() + value * kTile;
          if (isBinary(instruction.opcode)) {
            binaryTile(instruction.opcode, valueData[instruction.args[0]], valueData[instruction.args[1]], out, length);
          } else {
            args.clear();
            for (int64_t arg : instruction.args) {
              TileValue<C>& argument = valueData[arg];
              if (argument.uniform) {  // only inputs are uniform, and their tiles are their own
                C* tile = tiles.data() + arg * kTile;
                std::fill(tile + 1, tile + length, tile[0]);
                argument.uniform = false;
              }
              args.push_back(argument.data);
            }
            runInstruction(instruction, args.data(), out, length);
          }
          // The last value is rounded once, by the store.
          if (!last) roundTile(contract_.valueDTypes[value], length, out);
          else if (outputDType != computeDType) storeTile(out, outputDType, length, output + index * outputSize);
          valueData[value] = {out, false};
        }
        cursor.advance(length);
        index += length;
      }
    });
  }

 private:
  FusedElementwiseContract contract_;
  Geometry geometry_;
  int64_t count_ = 0;
  size_t inputs_ = 0;
};

std::unique_ptr<Kernel> createFusedElementwiseKernel(const KernelSignature& signature) {
  FusedElementwiseContract contract =
      parseFusedElementwiseContract(signature, {DType::F32, DType::F64, DType::BF16, DType::F16});
  Geometry geometry = geometryOf(contract.shape, signature);
  if (contract.computesInF64)
    return std::make_unique<FusedElementwiseKernel<double>>(std::move(contract), std::move(geometry));
  return std::make_unique<FusedElementwiseKernel<float>>(std::move(contract), std::move(geometry));
}

}  // namespace

void registerFusedElementwiseCpuKernels(KernelRegistry& registry) {
  registry.add("fused_elementwise", createFusedElementwiseKernel, KernelTraits{.handlesReducedFloats = true});
}

}  // namespace dgemma
