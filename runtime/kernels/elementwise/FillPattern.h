// fill's element bit pattern (docs/kernels.md, "Core kernels"): the value's bits in the output dtype, computed
// once on the host by the CPU kernel (cpu.cpp) and the CUDA kernel (fill.cu) alike, so both fill the
// same bytes. The 16-bit floats round the f64 once, to nearest even (CastMath.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "runtime/kernels/elementwise/CastMath.h"
#include "runtime/kernels/elementwise/Contract.h"

namespace dgemma::fill {

template <typename T>
uint64_t bitsOf(T value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof value);  // little-endian: the value's bytes land in the low bytes
  return bits;
}

// The value's bits in the dtype, in the low dtypeSize bytes; the contract checked that integers and
// bools represent it exactly.
inline uint64_t fillPattern(const FillContract& contract) {
  const double value = contract.value;
  switch (contract.dtype) {
    case DType::F32: return bitsOf(static_cast<float>(value));
    case DType::F64: return bitsOf(value);
    case DType::BF16: return cast::f64ToBf16Bits(value);
    case DType::F16: return cast::f64ToF16Bits(value);
    case DType::I64: return bitsOf(static_cast<int64_t>(value));
    case DType::I32: return bitsOf(static_cast<int32_t>(value));
    case DType::I8: return bitsOf(static_cast<int8_t>(value));
    case DType::U8: return bitsOf(static_cast<uint8_t>(value));
    case DType::Bool: break;
  }
  return value != 0.0;  // bool: 0 or 1
}

}  // namespace dgemma::fill
