// The contract of dequantize (docs/kernels.md, "Core kernels"), parsed once for every backend:
//   format int8: (codes i8 [..., N], scales f32 [...]) -> y [..., N]
//   format nf4:  (codes u8 [..., N/2], absmax f32 [..., N/64]) -> y [..., N], N a multiple of 64
// y is f32, bf16 or f64: each element is formed in f32 (code * scale, nf4_table[code] * absmax) and
// rounded once to y's dtype (docs/training.md, "Frozen low-precision base").
#pragma once

#include <cstdint>

#include "runtime/kernel_api/Kernel.h"
#include "runtime/quant/Quantize.h"

namespace dgemma {

struct DequantizeContract {
  quant::Format format = quant::Format::Int8;
  DType outputDtype = DType::F32;
  int64_t count = 0;  // elements of y
  int64_t width = 0;  // N, y's last dimension
};

// Throws InputError for anything the contract does not admit.
DequantizeContract parseDequantizeContract(const KernelSignature& signature);

}  // namespace dgemma
