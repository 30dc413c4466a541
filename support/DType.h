// Element types shared by the plan format, the kernels and the IO code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace dgemma {

enum class DType : uint8_t { F32, F64, BF16, F16, I64, I32, I8, U8, Bool };

// Stable names used in plan files and safetensors headers ("f32", "bf16", ...).
std::string_view dtypeName(DType dtype);
std::optional<DType> parseDType(std::string_view name);
size_t dtypeSize(DType dtype);
bool isFloating(DType dtype);

// bf16 <-> f32 with round-to-nearest-even, the rounding a GPU applies on conversion, so that CPU runs
// in bf16 mode reproduce GPU numerics. NaN stays NaN (quietened), infinities are preserved.
inline uint16_t f32ToBf16Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  uint32_t roundingBias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + roundingBias) >> 16);
}

inline float bf16BitsToF32(uint16_t half) {
  uint32_t bits = static_cast<uint32_t>(half) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// IEEE binary16, round-to-nearest-even, with subnormals.
uint16_t f32ToF16Bits(float value);
float f16BitsToF32(uint16_t half);

}  // namespace dgemma
