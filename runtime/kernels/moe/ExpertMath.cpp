// The AVX2-cloned f32 instances of the gated GELU rows (ExpertMath.h).
#include "runtime/kernels/moe/ExpertMath.h"

namespace dgemma::expert_math {

DGEMMA_CPU_CLONES_FOR_AVX2 void gatedGeluRowF32(float* row, int64_t n) { gatedGeluRowIn(row, n); }
DGEMMA_CPU_CLONES_FOR_AVX2 void gatedGeluWeightedRowF32(const float* gate, const float* up, float weight, float* hidden,
                                                        float* weighted, int64_t n) {
  gatedGeluWeightedRowIn(gate, up, weight, hidden, weighted, n);
}
DGEMMA_CPU_CLONES_FOR_AVX2 void gatedGeluBackwardRowF32(const float* gate, const float* up, const float* dHidden,
                                                        float weight, float* dGate, float* dUp, int64_t n) {
  gatedGeluBackwardRowIn(gate, up, dHidden, weight, dGate, dUp, n);
}

}  // namespace dgemma::expert_math
