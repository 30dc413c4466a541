#include "runtime/core/HostTensor.h"

#include <algorithm>
#include <cstring>

#include <utility>

#include "support/Error.h"

namespace dgemma {

HostTensor::HostTensor(DType dtype, std::vector<int64_t> shape) : dtype(dtype), shape(std::move(shape)) {
  data.resize(static_cast<size_t>(numElements()) * dtypeSize(dtype));
}

int64_t HostTensor::numElements() const { return numElementsOf(shape); }

namespace {
double loadAsDouble(const HostTensor& tensor, int64_t i) {
  switch (tensor.dtype) {
    case DType::F32: return tensor.as<float>()[i];
    case DType::F64: return tensor.as<double>()[i];
    case DType::BF16: return bf16BitsToF32(tensor.as<uint16_t>()[i]);
    case DType::F16: return f16BitsToF32(tensor.as<uint16_t>()[i]);
    default: return 0;
  }
}
int64_t loadAsInt(const HostTensor& tensor, int64_t i) {
  switch (tensor.dtype) {
    case DType::I64: return tensor.as<int64_t>()[i];
    case DType::I32: return tensor.as<int32_t>()[i];
    case DType::I8: return tensor.as<int8_t>()[i];
    case DType::U8:
    case DType::Bool: return tensor.as<uint8_t>()[i];
    default: return 0;
  }
}
}  // namespace

HostTensor convertDType(HostTensor&& tensor, DType target, const std::string& what) {
  if (tensor.dtype == target) return std::move(tensor);
  return convertDType(static_cast<const HostTensor&>(tensor), target, what);
}

HostTensor convertDType(const HostTensor& tensor, DType target, const std::string& what) {
  if (tensor.dtype == target) return tensor;
  if (isFloating(tensor.dtype) != isFloating(target))
    throw InputError(what + ": dtype " + std::string(dtypeName(tensor.dtype)) + " cannot be converted to " +
                     std::string(dtypeName(target)));
  HostTensor out(target, tensor.shape);
  const int64_t count = tensor.numElements();
  for (int64_t i = 0; i < count; ++i) {
    if (isFloating(target)) {
      double value = loadAsDouble(tensor, i);
      switch (target) {
        case DType::F32: out.as<float>()[i] = static_cast<float>(value); break;
        case DType::F64: out.as<double>()[i] = value; break;
        case DType::BF16: out.as<uint16_t>()[i] = f32ToBf16Bits(static_cast<float>(value)); break;
        case DType::F16: out.as<uint16_t>()[i] = f32ToF16Bits(static_cast<float>(value)); break;
        default: break;
      }
    } else {
      int64_t value = loadAsInt(tensor, i);
      switch (target) {
        case DType::I64: out.as<int64_t>()[i] = value; break;
        case DType::I32: out.as<int32_t>()[i] = static_cast<int32_t>(value); break;
        case DType::I8: out.as<int8_t>()[i] = static_cast<int8_t>(value); break;
        case DType::U8: out.as<uint8_t>()[i] = static_cast<uint8_t>(value); break;
        case DType::Bool: out.as<uint8_t>()[i] = value != 0; break;
        default: break;
      }
    }
  }
  return out;
}

void convertElements(const uint8_t* source, DType from, uint8_t* target, DType to, uint64_t count, const std::string& what) {
  if (from == to) {
    std::memcpy(target, source, count * dtypeSize(from));
    return;
  }
  constexpr uint64_t kBlock = 1 << 16;
  for (uint64_t first = 0; first < count; first += kBlock) {
    const uint64_t n = std::min(kBlock, count - first);
    HostTensor block(from, {static_cast<int64_t>(n)});
    std::memcpy(block.data.data(), source + first * dtypeSize(from), n * dtypeSize(from));
    const HostTensor converted = convertDType(std::move(block), to, what);
    std::memcpy(target + first * dtypeSize(to), converted.data.data(), converted.data.size());
  }
}


}  // namespace dgemma
