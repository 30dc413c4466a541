// One element of dequantize's output in f32, shared by the CPU kernel and its CUDA twin (the CUDA twin
// passes its __constant__ copy of the NF4 table): int8 code * its row's scale, or the NF4 table value
// of the element's 4-bit code * its block's absmax (docs/kernels.md, "Core kernels").
#pragma once

#include <cstdint>

#include "runtime/kernels/HostDevice.h"
#include "runtime/quant/Nf4Table.h"

namespace dgemma::dequantize {

DGEMMA_HOST_DEVICE inline float int8Element(const int8_t* codes, const float* scales, int64_t index, int64_t width) {
  return static_cast<float>(codes[index]) * scales[index / width];
}

// absmax is [..., N/64] for rows of N (a multiple of 64), so element i's block is i / 64 of the flat
// tensor.
DGEMMA_HOST_DEVICE inline float nf4Element(const uint8_t* codes, const float* absmax, const float* table,
                                           int64_t index) {
  return table[quant::nf4CodeAt(codes, index)] * absmax[index / quant::kNf4BlockSize];
}

}  // namespace dgemma::dequantize
