// The NF4 code book (QLoRA's NormalFloat4: the 16 quantiles of a normal distribution scaled to [-1, 1],
// with an exact 0), as bitsandbytes' functional.py spells it in f32, and the per-element decode that
// the host quantizer, the CPU kernel and the CUDA kernel share (docs/training.md, "Frozen low-precision
// base").
#pragma once

#include <cstdint>

#include "runtime/kernels/HostDevice.h"

namespace dgemma::quant {

constexpr int64_t kNf4BlockSize = 64;  // consecutive elements of the row-major tensor per absmax

// Index i is the 4-bit code i; the table is sorted, so a code's neighbours are its value's.
#define DGEMMA_NF4_TABLE  \
  {-1.0f,                 \
   -0.6961928009986877f,  \
   -0.5250730514526367f,  \
   -0.39491748809814453f, \
   -0.28444138169288635f, \
   -0.18477343022823334f, \
   -0.09105003625154495f, \
   0.0f,                  \
   0.07958029955625534f,  \
   0.16093020141124725f,  \
   0.24611230194568634f,  \
   0.33791524171829224f,  \
   0.44070982933044434f,  \
   0.5626170039176941f,   \
   0.7229568362236023f,   \
   1.0f}

inline constexpr float kNf4Table[16] = DGEMMA_NF4_TABLE;

// Element i of a packed row: two codes per byte, the even element in the high nibble (bitsandbytes'
// packing), so byte b holds elements 2b and 2b + 1.
DGEMMA_HOST_DEVICE inline uint32_t nf4CodeAt(const uint8_t* packed, int64_t index) {
  const uint32_t byte = packed[index >> 1];
  return (index & 1) ? (byte & 0xFu) : (byte >> 4);
}

}  // namespace dgemma::quant
