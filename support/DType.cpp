#include "support/DType.h"

#include <cmath>
#include <limits>

namespace dgemma {

namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
  bool floating;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "f32", 4, true},  {DType::F64, "f64", 8, true},  {DType::BF16, "bf16", 2, true},
    {DType::F16, "f16", 2, true},  {DType::I64, "i64", 8, false}, {DType::I32, "i32", 4, false},
    {DType::I8, "i8", 1, false},   {DType::U8, "u8", 1, false},   {DType::Bool, "bool", 1, false},
};
const DTypeInfo& info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }
}  // namespace

std::string_view dtypeName(DType dtype) { return info(dtype).name; }
size_t dtypeSize(DType dtype) { return info(dtype).size; }
bool isFloating(DType dtype) { return info(dtype).floating; }

std::optional<DType> parseDType(std::string_view name) {
  for (const DTypeInfo& entry : kDTypes)
    if (entry.name == name) return entry.dtype;
  return std::nullopt;
}

uint16_t f32ToF16Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t absBits = bits & 0x7fffffffu;
  if (absBits > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (absBits >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (absBits < 0x38800000u) {                         // below the smallest normal: subnormal
    // Scale into the subnormal grid (2^-24 units) and let the FPU round to nearest even.
    float magnitude;
    std::memcpy(&magnitude, &absBits, sizeof magnitude);
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
  }
  uint32_t mantissa = absBits & 0x007fffffu;
  int32_t exponent = static_cast<int32_t>(absBits >> 23) - 127 + 15;
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  uint32_t remainder = mantissa & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half & 1u))) ++half;  // may carry into exponent
  return sign | static_cast<uint16_t>(half);
}

float f16BitsToF32(uint16_t half) {
  uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  uint32_t bits;
  std::memcpy(&bits, &magnitude, sizeof bits);
  bits |= sign;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

}  // namespace dgemma
