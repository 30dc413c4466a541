// The contracts of rms_norm and rms_norm_backward (docs/kernels.md), parsed once for every backend:
// normalisation over the last dimension of x, an optional weight w of that width, attribute `eps` >= 0.
//   rms_norm:          (x[, w]) -> y, y of x's shape
//   rms_norm_backward: (x, dy[, w]) -> dx[, dw], dy and dx of x's shape, dw of w's
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

struct RmsNormContract {
  DType dtype = DType::F32;
  int64_t rows = 0;   // x's leading dims flattened (0 when the width is 0)
  int64_t width = 0;  // x's last dim
  double eps = 0;
  bool weighted = false;  // w given (and, for the backward, dw produced)
};

// Both throw InputError for anything the contract does not admit; `dtypes` are the element types the
// calling backend implements.
RmsNormContract parseRmsNormContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);
RmsNormContract parseRmsNormBackwardContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);

}  // namespace dgemma
