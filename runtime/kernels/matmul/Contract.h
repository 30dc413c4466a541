// matmul's contract (docs/kernels.md), parsed once for the CPU and the CUDA kernel: a [..., M, K]
// (or [..., K, M] with transpose_a), b [K, N] (or [N, K] with transpose_b) shared by every batch or
// with a's leading batch dims, c [..., M, N]; one dtype, row-major (a backend whose bf16 kernel
// reads bf16 itself may also take an f32 c of bf16 a and b: the product not rounded to bf16).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

struct MatmulContract {
  DType dtype = DType::F32;        // of a and b
  DType outputDType = DType::F32;  // of c
  int64_t batch = 1;  // the product of a's leading dims
  int64_t m = 0, n = 0, k = 0;
  bool transposeA = false, transposeB = false;
  bool sharedB = true;  // one b for every batch
};

// Throws InputError (through failSignature) for anything the contract does not admit; `dtypes` are
// the element types the calling backend implements, `f32OutputOfBf16` whether it also takes an f32 c
// of bf16 a and b.
MatmulContract parseMatmulContract(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                                   bool f32OutputOfBf16 = false);

}  // namespace dgemma
