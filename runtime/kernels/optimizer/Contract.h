// adamw's contract (docs/kernels.md), parsed once for every backend: inputs param, grad, exp_avg,
// exp_avg_sq (one shape and float dtype) and the scalars grad_scale, lr, bias_correction1,
// bias_correction2 (same dtype); outputs the new param, exp_avg and exp_avg_sq; attributes beta1,
// beta2, epsilon, weight_decay.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

struct AdamwContract {
  DType dtype = DType::F32;
  int64_t count = 0;  // elements of the parameter
  double beta1 = 0, beta2 = 0, epsilon = 0, weightDecay = 0;
};

// Throws InputError for anything the contract does not admit; `dtypes` are the float types the
// calling backend implements.
AdamwContract parseAdamwContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);

}  // namespace dgemma
