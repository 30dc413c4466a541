// Elementwise kernels: binary arithmetic, comparisons and select with NumPy broadcasting, unary maps,
// copy, fill and cast.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma {
namespace {

// ---------------------------------------------------------------------------------------------
// Binary operations with broadcasting

struct AddOp {
  template <typename T>
  T operator()(T a, T b) const { return a + b; }
};
struct SubOp {
  template <typename T>
  T operator()(T a, T b) const { return a - b; }
};
struct MulOp {
  template <typename T>
  T operator()(T a, T b) const { return a * b; }
};
struct DivOp {
  template <typename T>
  T operator()(T a, T b) const { return a / b; }
};
// NaN wins, as in NumPy: a NaN in an activation must not be hidden by a clamp.
struct MaximumOp {
  template <typename T>
  T operator()(T a, T b) const { return (std::isnan(a) || a > b) ? a : b; }
};
struct MinimumOp {
  template <typename T>
  T operator()(T a, T b) const { return (std::isnan(a) || a < b) ? a : b; }
};

// Strides that read `operand` in the index space of the broadcast `result` shape: dimensions the
// operand lacks or has as 1 get stride 0.
std::vector<int64_t> broadcastStrides(const std::vector<int64_t>& operand, const std::vector<int64_t>& result) {
  const std::vector<int64_t> own = cpu::rowMajorStrides(operand);
  std::vector<int64_t> strides(result.size(), 0);
  const size_t leading = result.size() - operand.size();
  for (size_t d = 0; d < operand.size(); ++d) strides[leading + d] = operand[d] == 1 ? 0 : own[d];
  return strides;
}

// The broadcast shape of the signature's inputs, which `roles` names in order; a plan error lists
// them when they do not broadcast.
std::vector<int64_t> broadcastShape(const KernelSignature& signature, const std::vector<std::string>& roles) {
  std::vector<int64_t> shape;
  for (const Buffer* input : signature.inputs) {
    const std::vector<int64_t>& next = input->shape;
    const size_t rank = std::max(shape.size(), next.size());
    std::vector<int64_t> merged(rank);
    for (size_t d = 0; d < rank; ++d) {
      // Aligned on the right: dimension d of the result is the operand's dimension d - (rank - size).
      const int64_t dimSoFar = d + shape.size() >= rank ? shape[d + shape.size() - rank] : 1;
      const int64_t dimNext = d + next.size() >= rank ? next[d + next.size() - rank] : 1;
      if (dimSoFar != dimNext && dimSoFar != 1 && dimNext != 1) {
        std::string inputs;
        for (size_t i = 0; i < roles.size(); ++i)
          inputs += (i == 0 ? "" : i + 1 == roles.size() ? " and " : ", ") + roles[i] + " " +
                    shapeToString(signature.inputs[i]->shape);
        failSignature(signature, "inputs " + inputs + " do not broadcast");
      }
      merged[d] = dimSoFar == 1 ? dimNext : dimSoFar;
    }
    shape = std::move(merged);
  }
  return shape;
}

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
      cpu::parallelFor(context, count_, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) c[i] = op(a[i], b[i]);
      });
      return;
    }
    const int64_t strideA = cursor_.innerStride(0), strideB = cursor_.innerStride(1);
    cpu::parallelFor(context, count_, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
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

// Checks float inputs a, b (one dtype) and the output c of their broadcast shape, of dtype `output`
// (a's dtype when unset).
template <typename Op>
std::unique_ptr<Kernel> createBinary(const KernelSignature& signature, std::optional<DType> output) {
  expectArity(signature, 2, 1);
  const Buffer& a = *signature.inputs[0];
  const Buffer& b = *signature.inputs[1];
  const Buffer& c = *signature.outputs[0];
  cpu::expectFloat(signature, a, "input a");
  expectDType(signature, b, {a.dtype}, "input b");
  expectDType(signature, c, {output.value_or(a.dtype)}, "output c");
  const std::vector<int64_t> shape = broadcastShape(signature, {"a", "b"});
  cpu::expectShape(signature, c, shape, "output c");
  const bool sameShapes = a.shape == shape && b.shape == shape;
  cpu::StridedCursor<2> cursor(shape, {broadcastStrides(a.shape, shape), broadcastStrides(b.shape, shape)});
  const int64_t count = numElementsOf(shape);
  if (a.dtype == DType::F64) return std::make_unique<BinaryKernel<double, Op>>(count, sameShapes, std::move(cursor));
  return std::make_unique<BinaryKernel<float, Op>>(count, sameShapes, std::move(cursor));
}

template <typename Op>
void addBinary(KernelRegistry& registry, const std::string& name) {
  registry.add(name, [](const KernelSignature& signature) { return createBinary<Op>(signature, std::nullopt); });
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

std::unique_ptr<Kernel> createCompare(const KernelSignature& signature) {
  const std::string predicate = cpu::attrString(signature, "predicate");
  if (predicate == "lt") return createBinary<LessOp>(signature, DType::Bool);
  if (predicate == "le") return createBinary<LessEqualOp>(signature, DType::Bool);
  if (predicate == "gt") return createBinary<GreaterOp>(signature, DType::Bool);
  if (predicate == "ge") return createBinary<GreaterEqualOp>(signature, DType::Bool);
  if (predicate == "eq") return createBinary<EqualOp>(signature, DType::Bool);
  if (predicate == "ne") return createBinary<NotEqualOp>(signature, DType::Bool);
  failSignature(signature, "attribute 'predicate': expected lt, le, gt, ge, eq or ne, got '" + predicate + "'");
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
        for (int64_t k = 0; k < length; ++k)
          runY[k] = runCondition[k * strideCondition] != 0 ? runTrue[k * strideTrue] : runFalse[k * strideFalse];
      });
    });
  }

 private:
  int64_t count_;
  cpu::StridedCursor<3> cursor_;
};

std::unique_ptr<Kernel> createSelect(const KernelSignature& signature) {
  expectArity(signature, 3, 1);
  const Buffer& condition = *signature.inputs[0];
  const Buffer& onTrue = *signature.inputs[1];
  const Buffer& onFalse = *signature.inputs[2];
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, condition, {DType::Bool}, "input condition");
  expectDType(signature, onFalse, {onTrue.dtype}, "input on_false");
  expectDType(signature, y, {onTrue.dtype}, "output y");
  const std::vector<int64_t> shape = broadcastShape(signature, {"condition", "on_true", "on_false"});
  cpu::expectShape(signature, y, shape, "output y");
  cpu::StridedCursor<3> cursor(shape, {broadcastStrides(condition.shape, shape), broadcastStrides(onTrue.shape, shape),
                                       broadcastStrides(onFalse.shape, shape)});
  const int64_t count = numElementsOf(shape);
  switch (dtypeSize(onTrue.dtype)) {
    case 1: return std::make_unique<SelectKernel<uint8_t>>(count, std::move(cursor));
    case 2: return std::make_unique<SelectKernel<uint16_t>>(count, std::move(cursor));
    case 4: return std::make_unique<SelectKernel<uint32_t>>(count, std::move(cursor));
    default: return std::make_unique<SelectKernel<uint64_t>>(count, std::move(cursor));
  }
}

// ---------------------------------------------------------------------------------------------
// Unary maps

struct NegOp {
  template <typename T>
  T operator()(T x) const { return -x; }
};
struct ExpOp {
  template <typename T>
  T operator()(T x) const { return cpu::fastExp(x); }
};
struct LogOp {
  template <typename T>
  T operator()(T x) const { return std::log(x); }
};
struct TanhOp {
  template <typename T>
  T operator()(T x) const { return cpu::fastTanh(x); }
};
struct SqrtOp {
  template <typename T>
  T operator()(T x) const { return std::sqrt(x); }
};
struct RsqrtOp {
  template <typename T>
  T operator()(T x) const { return T(1) / std::sqrt(x); }
};
struct GeluTanhOp {
  template <typename T>
  T operator()(T x) const { return cpu::geluTanh(x); }
};

// y[i] = op(x[i]) over [begin, end).
template <typename T, typename Op>
void mapElements(const T* x, T* y, int64_t begin, int64_t end) {
  const Op op;
  for (int64_t i = begin; i < end; ++i) y[i] = op(x[i]);
}

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
void addUnary(KernelRegistry& registry, const std::string& name) {
  registry.add(name, [](const KernelSignature& signature) -> std::unique_ptr<Kernel> {
    expectArity(signature, 1, 1);
    const Buffer& x = *signature.inputs[0];
    const Buffer& y = *signature.outputs[0];
    cpu::expectFloat(signature, x, "input x");
    expectDType(signature, y, {x.dtype}, "output y");
    cpu::expectShape(signature, y, x.shape, "output y");
    if (x.dtype == DType::F64) return std::make_unique<UnaryKernel<double, Op>>();
    return std::make_unique<UnaryKernel<float, Op>>();
  });
}

class CopyKernel final : public Kernel {
 public:
  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    cpu::copyBytes(context, outputs[0].data, inputs[0].data, inputs[0].buffer->bytes());
  }
};

void addCopy(KernelRegistry& registry) {
  registry.add("copy", [](const KernelSignature& signature) -> std::unique_ptr<Kernel> {
    expectArity(signature, 1, 1);
    const Buffer& x = *signature.inputs[0];
    const Buffer& y = *signature.outputs[0];
    expectDType(signature, y, {x.dtype}, "output y");
    cpu::expectShape(signature, y, x.shape, "output y");
    return std::make_unique<CopyKernel>();
  });
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

template <typename T>
uint64_t bitsOf(T value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof value);  // little-endian: the value's bytes land in the low bytes
  return bits;
}

template <typename Int>
uint64_t integerPattern(const KernelSignature& signature, double value, DType dtype) {
  // Bounds as doubles: the upper one is exclusive because max() + 1 is a power of two while max()
  // itself may not be representable.
  const double lowest = static_cast<double>(std::numeric_limits<Int>::lowest());
  const double upperExclusive = static_cast<double>(std::numeric_limits<Int>::max()) + 1.0;
  if (std::trunc(value) != value || value < lowest || value >= upperExclusive)
    failSignature(signature, "attribute 'value': " + std::to_string(value) + " is not representable in " +
                                 std::string(dtypeName(dtype)));
  return bitsOf(static_cast<Int>(value));
}

uint64_t fillPattern(const KernelSignature& signature, double value, DType dtype) {
  switch (dtype) {
    case DType::F32: return bitsOf(static_cast<float>(value));
    case DType::F64: return bitsOf(value);
    case DType::BF16: return f64ToBf16Bits(value);
    case DType::F16: return f64ToF16Bits(value);
    case DType::I64: return integerPattern<int64_t>(signature, value, dtype);
    case DType::I32: return integerPattern<int32_t>(signature, value, dtype);
    case DType::I8: return integerPattern<int8_t>(signature, value, dtype);
    case DType::U8: return integerPattern<uint8_t>(signature, value, dtype);
    case DType::Bool:
      if (value != 0.0 && value != 1.0)
        failSignature(signature, "attribute 'value': " + std::to_string(value) + " is not representable in bool");
      return value != 0.0;
  }
  failSignature(signature, "output y has an unknown dtype");
}

void addFill(KernelRegistry& registry) {
  registry.add("fill", [](const KernelSignature& signature) -> std::unique_ptr<Kernel> {
    expectArity(signature, 0, 1);
    const DType dtype = signature.outputs[0]->dtype;
    const double value = attrDouble(signature, "value");
    return std::make_unique<FillKernel>(fillPattern(signature, value, dtype), dtypeSize(dtype));
  });
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

void addCast(KernelRegistry& registry) {
  registry.add("cast", [](const KernelSignature& signature) -> std::unique_ptr<Kernel> {
    expectArity(signature, 1, 1);
    const Buffer& x = *signature.inputs[0];
    const Buffer& y = *signature.outputs[0];
    cpu::expectShape(signature, y, x.shape, "output y");
    if (isFloating(x.dtype) && !isFloating(y.dtype))
      failSignature(signature, "cast from " + std::string(dtypeName(x.dtype)) + " to " +
                                   std::string(dtypeName(y.dtype)) + " is not supported (float to integer)");
    return std::make_unique<CastKernel>(x.dtype, y.dtype);
  });
}

}  // namespace

void registerElementwiseCpuKernels(KernelRegistry& registry) {
  addBinary<AddOp>(registry, "add");
  addBinary<SubOp>(registry, "sub");
  addBinary<MulOp>(registry, "mul");
  addBinary<DivOp>(registry, "div");
  addBinary<MaximumOp>(registry, "maximum");
  addBinary<MinimumOp>(registry, "minimum");
  registry.add("compare", createCompare);
  registry.add("select", createSelect);
  addUnary<NegOp>(registry, "neg");
  addUnary<ExpOp>(registry, "exp");
  addUnary<LogOp>(registry, "log");
  addUnary<TanhOp>(registry, "tanh");
  addUnary<SqrtOp>(registry, "sqrt");
  addUnary<RsqrtOp>(registry, "rsqrt");
  addUnary<GeluTanhOp>(registry, "gelu_tanh");
  addCopy(registry);
  addFill(registry);
  addCast(registry);
}

}  // namespace dgemma
