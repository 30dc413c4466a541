// canvas_sample's contract (docs/kernels.md, "canvas_sample"), parsed once for the CPU and the CUDA
// kernel: logits [B, L, V] f32, temperature [B] f32, key [B, 2] i64 -> sampled [B, L] i64,
// argmax [B, L] i64, entropy [B, L] f32, scaled [B, L, V] f32 or bf16; attribute `softcap` (>= 0, 0: none).
#pragma once

#include <cstdint>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

struct CanvasSampleContract {
  int64_t batch = 0, canvas = 0, vocab = 0;
  DType scaledDType = DType::F32;
  float softcap = 0;  // the f32 constant the div and mul of an unfused soft-cap would use
};

// Throws InputError for anything the contract does not admit.
CanvasSampleContract parseCanvasSampleContract(const KernelSignature& signature);

}  // namespace dgemma
