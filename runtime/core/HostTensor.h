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

// Converts `count` elements at `source` (possibly unaligned, e.g. inside a mapped file) into
// `target` as convertDType does, a block of 64 Ki elements at a time: no copy of the whole tensor in
// between. Throws InputError naming `what` as convertDType does.
void convertElements(const uint8_t* source, DType from, uint8_t* target, DType to, uint64_t count, const std::string& what);

}  // namespace dgemma
