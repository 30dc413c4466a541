// fused_elementwise per element, as the CUDA kernel evaluates it (fused_elementwise/cuda.cu): the
// program of docs/kernels.md ("Fused elementwise chains") encoded in a fixed-size struct that is
// passed by value to the kernel, and the interpreter of one output element. Each value lives in an
// f32 register; a bf16 value that is not the last is rounded to nearest even where the unfused
// program would have stored it, and the last value is rounded once by its store, as the CPU kernel
// does. Each op is the single-op CUDA kernel's arithmetic (elementwise/cuda.cu: IEEE + − × ÷, expf,
// logf, tanhf, sqrtf, 1/sqrtf, the tanh GELU), so on the device a fused chain equals the unfused CUDA
// chain; on the host (libm's expf and tanhf against the CPU kernel's fastExp and fastTanh)
// test/unit/kernels/FusedElementwiseMathTest.cpp checks it against the CPU kernel: exact for the
// IEEE ops, within a few ulp for the transcendental ones.
//
// The CPU kernel (cpu.cpp) evaluates tiles with the compiled AVX2 clones of elementwise/MapOps.h
// instead, to stay bit for bit its own unfused chain, so it does not call this interpreter.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "plan/FusedElementwiseProgram.h"
#include "runtime/kernels/HostDevice.h"
#include "runtime/kernels/KernelElements.h"
#include "support/DType.h"

namespace dgemma::fused_math {

constexpr int kMaxInputs = 8;
constexpr int kMaxInstructions = 32;
constexpr int kMaxDims = 6;

enum class ValueKind : uint8_t { F32, BF16, Bool };

// A program and its inputs' layout: the output's index space (size-1 dims dropped, neighbours that
// every input walks alike merged; innermost last) with each input's strides (0 where it broadcasts).
struct FusedProgram {
  int inputs = 0;
  int instructions = 0;
  int rank = 0;
  int64_t count = 0;  // elements of y
  uint8_t opcode[kMaxInstructions] = {};
  uint8_t kind[kMaxInputs + kMaxInstructions] = {};  // ValueKind of every value
  int16_t args[kMaxInstructions][3] = {};
  int64_t dims[kMaxDims] = {};
  int64_t strides[kMaxInputs][kMaxDims] = {};
  int64_t inputCounts[kMaxInputs] = {};  // elements of each input buffer, the extent of its bounds assertions
};

// What limits the encoding, or an empty string when the program fits.
inline std::string fusedProgramLimits(size_t inputs, size_t instructions, size_t rank) {
  if (inputs > static_cast<size_t>(kMaxInputs)) return "at most " + std::to_string(kMaxInputs) + " inputs";
  if (instructions > static_cast<size_t>(kMaxInstructions))
    return "at most " + std::to_string(kMaxInstructions) + " instructions";
  if (rank > static_cast<size_t>(kMaxDims)) return "at most " + std::to_string(kMaxDims) + " separate dimensions";
  return "";
}

// The output's index space and the inputs' strides (see FusedProgram). Returns the merged dims;
// `strides` gets one row per input.
inline std::vector<int64_t> mergedLayout(const std::vector<int64_t>& shape, const std::vector<std::vector<int64_t>>& inputShapes,
                                         std::vector<std::vector<int64_t>>& strides) {
  std::vector<std::vector<int64_t>> full;
  for (const std::vector<int64_t>& inputShape : inputShapes) {
    std::vector<int64_t> own(inputShape.size(), 1);
    for (size_t d = inputShape.size(); d-- > 1;) own[d - 1] = own[d] * inputShape[d];
    std::vector<int64_t> row(shape.size(), 0);
    const size_t leading = shape.size() - inputShape.size();
    for (size_t d = 0; d < inputShape.size(); ++d) row[leading + d] = inputShape[d] == 1 ? 0 : own[d];
    full.push_back(std::move(row));
  }
  std::vector<int64_t> dims;
  strides.assign(inputShapes.size(), {});
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merges = !dims.empty();
    for (size_t k = 0; merges && k < full.size(); ++k) merges = strides[k].back() == full[k][d] * shape[d];
    if (merges) {
      dims.back() *= shape[d];
      for (size_t k = 0; k < full.size(); ++k) strides[k].back() = full[k][d];
      continue;
    }
    dims.push_back(shape[d]);
    for (size_t k = 0; k < full.size(); ++k) strides[k].push_back(full[k][d]);
  }
  return dims;
}

// Encodes a program whose values have `valueDTypes` (f32, bf16 or bool; the contract checked the
// types) for an output of `shape`; the caller checked fusedProgramLimits on the merged layout.
inline FusedProgram encodeProgram(const fused::Program& program, const std::vector<DType>& valueDTypes,
                                  const std::vector<int64_t>& shape, const std::vector<std::vector<int64_t>>& inputShapes) {
  FusedProgram encoded;
  encoded.inputs = static_cast<int>(inputShapes.size());
  encoded.instructions = static_cast<int>(program.instructions.size());
  for (size_t value = 0; value < valueDTypes.size(); ++value)
    encoded.kind[value] = static_cast<uint8_t>(valueDTypes[value] == DType::BF16   ? ValueKind::BF16
                                               : valueDTypes[value] == DType::Bool ? ValueKind::Bool
                                                                                   : ValueKind::F32);
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    encoded.opcode[i] = static_cast<uint8_t>(program.instructions[i].opcode);
    for (size_t a = 0; a < program.instructions[i].args.size(); ++a)
      encoded.args[i][a] = static_cast<int16_t>(program.instructions[i].args[a]);
  }
  std::vector<std::vector<int64_t>> strides;
  const std::vector<int64_t> dims = mergedLayout(shape, inputShapes, strides);
  encoded.rank = static_cast<int>(dims.size());
  encoded.count = 1;
  for (int64_t size : shape) encoded.count *= size;
  for (size_t k = 0; k < inputShapes.size(); ++k) {
    encoded.inputCounts[k] = 1;
    for (int64_t size : inputShapes[k]) encoded.inputCounts[k] *= size;
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    encoded.dims[d] = dims[d];
    for (size_t k = 0; k < strides.size(); ++k) encoded.strides[k][d] = strides[k][d];
  }
  return encoded;
}

DGEMMA_HOST_DEVICE inline float roundedToBf16(float value) {
  uint16_t bits = 0;
  kernels::storeFloat(&bits, 0, value);
  return kernels::loadFloat(&bits, 0);
}

DGEMMA_HOST_DEVICE inline float loadValue(const void* data, ValueKind kind, int64_t offset) {
  switch (kind) {
    case ValueKind::BF16: return kernels::loadFloat(static_cast<const uint16_t*>(data), offset);
    case ValueKind::Bool: return static_cast<const uint8_t*>(data)[offset] != 0 ? 1.0f : 0.0f;
    default: return static_cast<const float*>(data)[offset];
  }
}

DGEMMA_HOST_DEVICE inline float geluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCubic = 0.044715f;
  const float inner = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

// One instruction on f32 operands (NaN wins in maximum and minimum, as in the single-op kernels).
DGEMMA_HOST_DEVICE inline float apply(fused::Opcode opcode, float a, float b, float c) {
  using fused::Opcode;
  switch (opcode) {
    case Opcode::Add: return a + b;
    case Opcode::Sub: return a - b;
    case Opcode::Mul: return a * b;
    case Opcode::Div: return a / b;
    case Opcode::Maximum: return (a != a || a > b) ? a : b;  // a != a: a is NaN
    case Opcode::Minimum: return (a != a || a < b) ? a : b;
    case Opcode::Neg: return -a;
    case Opcode::Exp: return expf(a);
    case Opcode::Log: return logf(a);
    case Opcode::Tanh: return tanhf(a);
    case Opcode::Sqrt: return sqrtf(a);
    case Opcode::Rsqrt: return 1.0f / sqrtf(a);
    case Opcode::GeluTanh: return geluTanh(a);
    case Opcode::Cast: return a;  // the value's rounding to its dtype is the cast
    case Opcode::Select: return a != 0.0f ? b : c;
  }
  return a;
}

// y[index] = the program's last value at output element `index` (inputs[k] are the input buffers).
DGEMMA_HOST_DEVICE inline void evaluateElement(const FusedProgram& program, const void* const* inputs, void* output,
                                               int64_t index) {
  float values[kMaxInputs + kMaxInstructions];
  int64_t coordinate[kMaxDims];
  int64_t rest = index;
  for (int d = program.rank; d-- > 0;) {
    coordinate[d] = rest % program.dims[d];
    rest /= program.dims[d];
  }
  for (int k = 0; k < program.inputs; ++k) {
    int64_t offset = 0;
    for (int d = 0; d < program.rank; ++d) offset += coordinate[d] * program.strides[k][d];
    DGEMMA_CUDA_BOUNDS(offset, program.inputCounts[k]);
    values[k] = loadValue(inputs[k], static_cast<ValueKind>(program.kind[k]), offset);
  }
  const int last = program.inputs + program.instructions - 1;
  for (int i = 0; i < program.instructions; ++i) {
    const int value = program.inputs + i;
    const int16_t* args = program.args[i];
    const fused::Opcode opcode = static_cast<fused::Opcode>(program.opcode[i]);
    const int arity = opcode == fused::Opcode::Select ? 3
                      : (opcode <= fused::Opcode::Minimum) ? 2
                                                           : 1;
    for (int a = 0; a < arity; ++a) DGEMMA_CUDA_BOUNDS(args[a], value);  // only earlier values
    float result = apply(opcode, values[args[0]], arity > 1 ? values[args[1]] : 0.0f, arity > 2 ? values[args[2]] : 0.0f);
    if (value != last && static_cast<ValueKind>(program.kind[value]) == ValueKind::BF16) result = roundedToBf16(result);
    values[value] = result;
  }
  if (static_cast<ValueKind>(program.kind[last]) == ValueKind::BF16)
    kernels::storeFloat(static_cast<uint16_t*>(output), index, values[last]);
  else
    static_cast<float*>(output)[index] = values[last];
}

}  // namespace dgemma::fused_math
