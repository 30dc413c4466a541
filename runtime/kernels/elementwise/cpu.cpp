// Elementwise kernels: binary arithmetic, comparisons and select with NumPy broadcasting, unary maps,
// copy, fill and cast.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/elementwise/Contract.h"
#include "runtime/kernels/elementwise/FillPattern.h"
#include "runtime/kernels/elementwise/MapOps.h"

namespace dgemma {

namespace cpu {
// The transcendental f32 maps, the ones whose arithmetic (not memory) bounds them, in AVX2 clones.
DGEMMA_CPU_CLONES_FOR_AVX2 void mapExp(const float* x, float* y, int64_t begin, int64_t end) {
  mapElements<float, ExpOp>(x, y, begin, end);
}
DGEMMA_CPU_CLONES_FOR_AVX2 void mapTanh(const float* x, float* y, int64_t begin, int64_t end) {
  mapElements<float, TanhOp>(x, y, begin, end);
}
DGEMMA_CPU_CLONES_FOR_AVX2 void mapGeluTanh(const float* x, float* y, int64_t begin, int64_t end) {
  mapElements<float, GeluTanhOp>(x, y, begin, end);
}
}  // namespace cpu

namespace {

using namespace cpu;  // the element functors of MapOps.h

// ---------------------------------------------------------------------------------------------
// Binary operations with broadcasting

// Strides that read `operand` in the index space of the broadcast `result` shape: dimensions the
// operand lacks or has as 1 get stride 0.
std::vector<int64_t> broadcastStrides(const std::vector<int64_t>& operand, const std::vector<int64_t>& result) {
  const std::vector<int64_t> own = cpu::rowMajorStrides(operand);
  std::vector<int64_t> strides(result.size(), 0);
  const size_t leading = result.size() - operand.size();
  for (size_t d = 0; d < operand.size(); ++d) strides[leading + d] = operand[d] == 1 ? 0 : own[d];
  return strides;
}

// Elements per chunk of a binary kernel. One IEEE operation per element runs at memory speed, about
// 10 µs for 2^16 f32 elements in L2, which is what waking a second thread costs (and more on a loaded
// machine): the [B, L, H] adds of a training step (2^16 to 2^17 elements) take one or two chunks.
inline constexpr int64_t kBinaryElementGrain = int64_t{1} << 16;

// Results are stored in Op's result type: T for arithmetic, uint8_t (0 or 1) for comparisons into bool.
template <typename T, typename Op>
class BinaryKernel final : public Kernel {
  using Out = decltype(Op{}(T{}, T{}));

 public:
  BinaryKernel(int64_t count, bool sameShapes, cpu::StridedCursor<2> cursor)
      : count_(count), sameShapes_(sameShapes), cursor_(std::move(cursor)) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* a = inputs[0].as<const T>();
    const T* b = inputs[1].as<const T>();
    Out* c = outputs[0].as<Out>();
    const Op op;
    if (sameShapes_) {
      cpu::parallelFor(context, count_, kBinaryElementGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) c[i] = op(a[i], b[i]);
      });
      return;
    }
    const int64_t strideA = cursor_.innerStride(0), strideB = cursor_.innerStride(1);
    cpu::parallelFor(context, count_, kBinaryElementGrain, [&](int64_t begin, int64_t end) {
      cpu::StridedCursor<2> cursor = cursor_;
      cursor.forEachRun(begin, end, [&](int64_t index, const std::array<int64_t, 2>& offsets, int64_t length) {
        const T* runA = a + offsets[0];
        const T* runB = b + offsets[1];
        Out* runC = c + index;
        // The usual broadcasts (a row times a per-row scalar or a scalar, a row plus a bias row) get
        // loops with constant strides, which vectorise; a runtime stride keeps the loop scalar.
        if (strideA == 1 && strideB == 0) {
          const T scalarB = runB[0];
          for (int64_t k = 0; k < length; ++k) runC[k] = op(runA[k], scalarB);
        } else if (strideA == 0 && strideB == 1) {
          const T scalarA = runA[0];
          for (int64_t k = 0; k < length; ++k) runC[k] = op(scalarA, runB[k]);
        } else if (strideA == 1 && strideB == 1) {
          for (int64_t k = 0; k < length; ++k) runC[k] = op(runA[k], runB[k]);
        } else {
          for (int64_t k = 0; k < length; ++k) runC[k] = op(runA[k * strideA], runB[k * strideB]);
        }
      });
    });
  }

 private:
  int64_t count_;
  bool sameShapes_;
  cpu::StridedCursor<2> cursor_;
};

// The kernel for a parsed binary or compare contract, in its dtype.
template <typename Op>
std::unique_ptr<Kernel> instantiateBinaryKernel(const BinaryContract& contract, const KernelSignature& signature) {
  const std::vector<int64_t>& shape = contract.shape;
  cpu::StridedCursor<2> cursor(shape, {broadcastStrides(signature.inputs[0]->shape, shape),
                                       broadcastStrides(signature.inputs[1]->shape, shape)});
  const int64_t count = numElementsOf(shape);
  if (contract.dtype == DType::F64)
    return std::make_unique<BinaryKernel<double, Op>>(count, contract.sameShapes, std::move(cursor));
  return std::make_unique<BinaryKernel<float, Op>>(count, contract.sameShapes, std::move(cursor));
}

template <typename Op>
std::unique_ptr<Kernel> createBinaryKernel(const KernelSignature& signature) {
  return instantiateBinaryKernel<Op>(parseBinaryContract(signature, {DType::F32, DType::F64}), signature);
}

// ---------------------------------------------------------------------------------------------
// compare: IEEE comparisons (false against NaN, except ne) into bool

struct LessOp {
  template <typename T>
  uint8_t operator()(T a, T b) const { return a < b; }
};
struct LessEqualOp {
  template <typename T>
  uint8_t operator()(T a, T b) const { return a <= b; }
};
struct GreaterOp {
  template <typename T>
  uint8_t operator()(T a, T b) const { return a > b; }
};
struct GreaterEqualOp {
  template <typename T>
  uint8_t operator()(T a, T b) const { return a >= b; }
};
struct EqualOp {
  template <typename T>
  uint8_t operator()(T a, T b) const { return a == b; }
};
struct NotEqualOp {
  template <typename T>
  uint8_t operator()(T a, T b) const { return a != b; }
};

std::unique_ptr<Kernel> createCompareKernel(const KernelSignature& signature) {
  const CompareContract contract = parseCompareContract(signature, {DType::F32, DType::F64});
  switch (contract.predicate) {
    case ComparePredicate::Less: return instantiateBinaryKernel<LessOp>(contract.operands, signature);
    case ComparePredicate::LessEqual: return instantiateBinaryKernel<LessEqualOp>(contract.operands, signature);
    case ComparePredicate::Greater: return instantiateBinaryKernel<GreaterOp>(contract.operands, signature);
    case ComparePredicate::GreaterEqual: return instantiateBinaryKernel<GreaterEqualOp>(contract.operands, signature);
    case ComparePredicate::Equal: return instantiateBinaryKernel<EqualOp>(contract.operands, signature);
    case ComparePredicate::NotEqual: break;
  }
  return instantiateBinaryKernel<NotEqualOp>(contract.operands, signature);
}

// ---------------------------------------------------------------------------------------------
// select: condition ? on_true : on_false with broadcasting. Values are copied as words of their
// dtype's size, so every dtype takes the same loop.

template <typename Word>
class SelectKernel final : public Kernel {
 public:
  SelectKernel(int64_t count, cpu::StridedCursor<3> cursor) : count_(count), cursor_(std::move(cursor)) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const uint8_t* condition = inputs[0].as<const uint8_t>();
    const Word* onTrue = inputs[1].as<const Word>();
    const Word* onFalse = inputs[2].as<const Word>();
    Word* y = outputs[0].as<Word>();
    const int64_t strideCondition = cursor_.innerStride(0), strideTrue = cursor_.innerStride(1),
                  strideFalse = cursor_.innerStride(2);
    cpu::parallelFor(context, count_, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
      cpu::StridedCursor<3> cursor = cursor_;
      cursor.forEachRun(begin, end, [&](int64_t index, const std::array<int64_t, 3>& offsets, int64_t length) {
        const uint8_t* runCondition = condition + offsets[0];
        const Word* runTrue = onTrue + offsets[1];
        const Word* runFalse = onFalse + offsets[2];
        Word* runY = y + index;
        // A condition broadcast along the run (a per-row flag) picks one side for all of it: a copy.
        if (strideCondition == 0) {
          const Word* source = runCondition[0] != 0 ? runTrue : runFalse;
          const int64_t stride = runCondition[0] != 0 ? strideTrue : strideFalse;
          if (stride == 1) {
            // In place (y is that side's storage, dg::inPlaceAssignTarget): the run is already there.
            if (source != runY) std::copy(source, source + length, runY);
            return;
          }
        }
        for (int64_t k = 0; k < length; ++k)
          runY[k] = runCondition[k * strideCondition] != 0 ? runTrue[k * strideTrue] : runFalse[k * strideFalse];
      });
    });
  }

 private:
  int64_t count_;
  cpu::StridedCursor<3> cursor_;
};

std::unique_ptr<Kernel> createSelectKernel(const KernelSignature& signature) {
  const SelectContract contract = parseSelectContract(signature);
  const std::vector<int64_t>& shape = contract.shape;
  cpu::StridedCursor<3> cursor(shape, {broadcastStrides(signature.inputs[0]->shape, shape),
                                       broadcastStrides(signature.inputs[1]->shape, shape),
                                       broadcastStrides(signature.inputs[2]->shape, shape)});
  const int64_t count = numElementsOf(shape);
  switch (dtypeSize(contract.dtype)) {
    case 1: return std::make_unique<SelectKernel<uint8_t>>(count, std::move(cursor));
    case 2: return std::make_unique<SelectKernel<uint16_t>>(count, std::move(cursor));
    case 4: return std::make_unique<SelectKernel<uint32_t>>(count, std::move(cursor));
    default: return std::make_unique<SelectKernel<uint64_t>>(count, std::move(cursor));
  }
}

// ---------------------------------------------------------------------------------------------
// Unary maps

template <typename T, typename Op>
class UnaryKernel final : public Kernel {
 public:
  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* x = inputs[0].as<const T>();
    T* y = outputs[0].as<T>();
    cpu::parallelFor(context, inputs[0].numElements(), cpu::kElementGrain, [&](int64_t begin, int64_t end) {
      if constexpr (std::is_same_v<T, float> && std::is_same_v<Op, ExpOp>)
        mapExp(x, y, begin, end);
      else if constexpr (std::is_same_v<T, float> && std::is_same_v<Op, TanhOp>)
        mapTanh(x, y, begin, end);
      else if constexpr (std::is_same_v<T, float> && std::is_same_v<Op, GeluTanhOp>)
        mapGeluTanh(x, y, begin, end);
      else
        mapElements<T, Op>(x, y, begin, end);
    });
  }
};

template <typename Op>
std::unique_ptr<Kernel> createUnaryKernel(const KernelSignature& signature) {
  const UnaryContract contract = parseUnaryContract(signature, {DType::F32, DType::F64});
  if (contract.dtype == DType::F64) return std::make_unique<UnaryKernel<double, Op>>();
  return std::make_unique<UnaryKernel<float, Op>>();
}

class CopyKernel final : public Kernel {
 public:
  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    cpu::copyBytes(context, outputs[0].data, inputs[0].data, inputs[0].buffer->bytes());
  }
};

std::unique_ptr<Kernel> createCopyKernel(const KernelSignature& signature) {
  parseCopyContract(signature);
  return std::make_unique<CopyKernel>();
}

// ---------------------------------------------------------------------------------------------
// Conversions to the narrow float formats

// f64 -> f32 with round-to-odd: inexact results keep a sticky low bit. Rounding that f32 to a format
// at least two bits narrower (bf16, f16) then gives the correctly rounded result of the f64, where
// rounding to nearest twice could land on a false tie (1 + 2^-8 + 2^-40 would become bf16 1.0).
float roundToOddF32(double value) {
  const float nearest = static_cast<float>(value);
  if (std::isnan(value) || static_cast<double>(nearest) == value) return nearest;
  const float towardZero =
      std::fabs(static_cast<double>(nearest)) > std::fabs(value) ? std::nextafter(nearest, 0.0f) : nearest;
  uint32_t bits;
  std::memcpy(&bits, &towardZero, sizeof bits);
  bits |= 1u;  // of the two f32 neighbours of `value`, the one with an odd significand
  float odd;
  std::memcpy(&odd, &bits, sizeof odd);
  return odd;
}

uint16_t f64ToBf16Bits(double value) { return f32ToBf16Bits(roundToOddF32(value)); }
uint16_t f64ToF16Bits(double value) { return f32ToF16Bits(roundToOddF32(value)); }

// ---------------------------------------------------------------------------------------------
// fill

// Fills with a precomputed element bit pattern, so run() is a typed store loop whatever the dtype.
template <typename Word>
void fillWords(const ExecContext& context, void* data, int64_t count, Word pattern) {
  Word* words = static_cast<Word*>(data);
  cpu::parallelFor(context, count, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
    std::fill(words + begin, words + end, pattern);
  });
}

class FillKernel final : public Kernel {
 public:
  FillKernel(uint64_t pattern, size_t elementSize) : pattern_(pattern), elementSize_(elementSize) {}

  void run(ExecContext& context, const std::vector<TensorRef>&, const std::vector<TensorRef>& outputs) override {
    void* data = outputs[0].data;
    const int64_t count = outputs[0].numElements();
    switch (elementSize_) {
      case 1: fillWords(context, data, count, static_cast<uint8_t>(pattern_)); break;
      case 2: fillWords(context, data, count, static_cast<uint16_t>(pattern_)); break;
      case 4: fillWords(context, data, count, static_cast<uint32_t>(pattern_)); break;
      default: fillWords(context, data, count, pattern_); break;
    }
  }

 private:
  uint64_t pattern_;  // the element's bytes in its low elementSize_ bytes
  size_t elementSize_;
};

std::unique_ptr<Kernel> createFillKernel(const KernelSignature& signature) {
  const FillContract contract = parseFillContract(signature);
  return std::make_unique<FillKernel>(fill::fillPattern(contract), dtypeSize(contract.dtype));
}

// ---------------------------------------------------------------------------------------------
// cast: elements go through a small f64 (float source) or i64 (integer source) block, so each
// conversion is two tight loops chosen once per block instead of a dtype switch per element.

constexpr int64_t kCastBlock = 256;

void loadFloats(const void* source, DType dtype, int64_t begin, int64_t count, double* values) {
  switch (dtype) {
    case DType::F32: {
      const float* data = static_cast<const float*>(source) + begin;
      for (int64_t i = 0; i < count; ++i) values[i] = data[i];
      break;
    }
    case DType::F64: std::memcpy(values, static_cast<const double*>(source) + begin, count * sizeof(double)); break;
    case DType::BF16: {
      const uint16_t* data = static_cast<const uint16_t*>(source) + begin;
      for (int64_t i = 0; i < count; ++i) values[i] = bf16BitsToF32(data[i]);
      break;
    }
    case DType::F16: {
      const uint16_t* data = static_cast<const uint16_t*>(source) + begin;
      for (int64_t i = 0; i < count; ++i) values[i] = f16BitsToF32(data[i]);
      break;
    }
    default: break;  // the factory admits float dtypes only
  }
}

void storeFloats(void* destination, DType dtype, int64_t begin, int64_t count, const double* values) {
  switch (dtype) {
    case DType::F32: {
      float* data = static_cast<float*>(destination) + begin;
      for (int64_t i = 0; i < count; ++i) data[i] = static_cast<float>(values[i]);
      break;
    }
    case DType::F64: std::memcpy(static_cast<double*>(destination) + begin, values, count * sizeof(double)); break;
    case DType::BF16: {
      uint16_t* data = static_cast<uint16_t*>(destination) + begin;
      for (int64_t i = 0; i < count; ++i) data[i] = f64ToBf16Bits(values[i]);
      break;
    }
    case DType::F16: {
      uint16_t* data = static_cast<uint16_t*>(destination) + begin;
      for (int64_t i = 0; i < count; ++i) data[i] = f64ToF16Bits(values[i]);
      break;
    }
    default: break;
  }
}

template <typename Int>
void loadIntegersAs(const void* source, int64_t begin, int64_t count, int64_t* values) {
  const Int* data = static_cast<const Int*>(source) + begin;
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<int64_t>(data[i]);
}

void loadIntegers(const void* source, DType dtype, int64_t begin, int64_t count, int64_t* values) {
  switch (dtype) {
    case DType::I64: loadIntegersAs<int64_t>(source, begin, count, values); break;
    case DType::I32: loadIntegersAs<int32_t>(source, begin, count, values); break;
    case DType::I8: loadIntegersAs<int8_t>(source, begin, count, values); break;
    case DType::U8:
    case DType::Bool: loadIntegersAs<uint8_t>(source, begin, count, values); break;
    default: break;
  }
}

// Narrowing integer casts wrap (two's complement), as C++ and CUDA conversions do.
template <typename Int>
void storeIntegersAs(void* destination, int64_t begin, int64_t count, const int64_t* values) {
  Int* data = static_cast<Int*>(destination) + begin;
  for (int64_t i = 0; i < count; ++i) data[i] = static_cast<Int>(values[i]);
}

void storeIntegers(void* destination, DType dtype, int64_t begin, int64_t count, const int64_t* values) {
  switch (dtype) {
    case DType::I64: storeIntegersAs<int64_t>(destination, begin, count, values); break;
    case DType::I32: storeIntegersAs<int32_t>(destination, begin, count, values); break;
    case DType::I8: storeIntegersAs<int8_t>(destination, begin, count, values); break;
    case DType::U8: storeIntegersAs<uint8_t>(destination, begin, count, values); break;
    case DType::Bool: {
      uint8_t* data = static_cast<uint8_t*>(destination) + begin;
      for (int64_t i = 0; i < count; ++i) data[i] = values[i] != 0;
      break;
    }
    default: break;
  }
}

class CastKernel final : public Kernel {
 public:
  CastKernel(DType from, DType to) : from_(from), to_(to) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const void* source = inputs[0].data;
    void* destination = outputs[0].data;
    if (from_ == to_) {
      cpu::copyBytes(context, destination, source, inputs[0].buffer->bytes());
      return;
    }
    cpu::parallelFor(context, inputs[0].numElements(), cpu::kElementGrain, [&](int64_t begin, int64_t end) {
      std::array<double, kCastBlock> floats;
      std::array<int64_t, kCastBlock> integers;
      for (int64_t block = begin; block < end; block += kCastBlock) {
        const int64_t count = std::min(kCastBlock, end - block);
        if (isFloating(from_)) {
          loadFloats(source, from_, block, count, floats.data());
          storeFloats(destination, to_, block, count, floats.data());
        } else if (!isFloating(to_)) {
          loadIntegers(source, from_, block, count, integers.data());
          storeIntegers(destination, to_, block, count, integers.data());
        } else {
          // Through f64: exact for integers up to 2^53, and the f64 -> narrow float stores round once.
          loadIntegers(source, from_, block, count, integers.data());
          for (int64_t i = 0; i < count; ++i) floats[i] = static_cast<double>(integers[i]);
          storeFloats(destination, to_, block, count, floats.data());
        }
      }
    });
  }

 private:
  DType from_;
  DType to_;
};

std::unique_ptr<Kernel> createCastKernel(const KernelSignature& signature) {
  const CastContract contract = parseCastContract(signature);
  return std::make_unique<CastKernel>(contract.from, contract.to);
}

}  // namespace

void registerElementwiseCpuKernels(KernelRegistry& registry) {
  const KernelTraits movesBits{.movesBitsOnly = true};
  registerMapKernels<AddOp, SubOp, MulOp, DivOp, MaximumOp, MinimumOp>(
      registry, kBinaryMapNames, [](auto op) -> KernelFactory { return createBinaryKernel<decltype(op)>; });
  registerMapKernels<NegOp, ExpOp, LogOp, TanhOp, SqrtOp, RsqrtOp, GeluTanhOp>(
      registry, kUnaryMapNames, [](auto op) -> KernelFactory { return createUnaryKernel<decltype(op)>; });
  registry.add("compare", createCompareKernel);
  registry.add("select", createSelectKernel);
  registry.add("copy", createCopyKernel, movesBits);
  registry.add("fill", createFillKernel, movesBits);
  registry.add("cast", createCastKernel, movesBits);
}

}  // namespace dgemma
