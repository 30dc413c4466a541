// The bf16 matmul of the CUDA backend (matmul/cuda_bf16.cpp, through cuBLASLt), built by the matmul
// factory of matmul/cuda.cpp for a step with bf16 a and b (c bf16 or f32). Internal to the CUDA
// kernels.
#pragma once

#include <memory>

#include "runtime/kernel_api/Kernel.h"
#include "runtime/kernels/matmul/Contract.h"

namespace dgemma {

// `contract.dtype` is bf16, `contract.outputDType` bf16 or f32, and its dimensions fit cuBLAS's 32-bit limits (checked by the caller).
std::unique_ptr<Kernel> createMatmulBf16CudaKernel(const MatmulContract& contract);

}  // namespace dgemma
