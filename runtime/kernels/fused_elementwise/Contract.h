// The contract of the fused elementwise kernel (docs/kernels.md, "Fused elementwise chains"):
// inputs → y, attribute `program` (plan/FusedElementwiseProgram.h). Each input broadcasts (NumPy
// rules) to y's shape; the program's types are checked against the buffers' dtypes. Parsed once for
// every backend; throws InputError for anything the contract does not admit.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "plan/FusedElementwiseProgram.h"
#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

struct FusedElementwiseContract {
  fused::Program program;
  std::vector<DType> valueDTypes;  // the inputs', then each instruction's
  std::vector<int64_t> shape;      // y's: every value's
  bool computesInF64 = false;      // else every float value is f32, bf16 or f16 and computes in f32
};

// `dtypes`: the float dtypes the calling backend implements for the program's values.
FusedElementwiseContract parseFusedElementwiseContract(const KernelSignature& signature,
                                                       std::initializer_list<DType> dtypes);

}  // namespace dgemma
