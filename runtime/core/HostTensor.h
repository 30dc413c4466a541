// A dense, row-major tensor in host memory: what crosses the runtime's boundary (batch files,
// weights, outputs). Device memory never appears here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "support/DType.h"
#include "support/Shape.h"

namespace dgemma {

struct HostTensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;  // numElements() * dtypeSize(dtype) bytes

  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape);

  int64_t numElements() const;
  template <typename T>
  T* as() { return reinterpret_cast<T*>(data.data()); }
  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data.data()); }
};

// Converts between floating dtypes (f32, f64, bf16, f16) and between integer dtypes; throws
// InputError (naming `what`) for a conversion that could lose meaning (float <-> int).
HostTensor convertDType(const HostTensor& tensor, DType target, const std::string& what);
// The same, taking over the bytes instead of copying them when the dtype already matches (the
// training loop's per-step gradients, tens of MB each).
HostTensor convertDType(HostTensor&& tensor, DType target, const std::string& what);

}  // namespace dgemma
