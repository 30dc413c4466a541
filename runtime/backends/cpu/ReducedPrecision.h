// bf16 and f16 on the CPU backend. The CPU kernels compute in f32 (or f64); a step whose float
// buffers include a 16-bit type runs its f32 kernel on widened copies and rounds each 16-bit result
// once, to nearest even. That is where a GPU kernel on 16-bit tensors rounds too (it loads, computes
// in f32 registers and rounds its stores), so a bf16 plan's numerics can be tested on the CPU.
#pragma once

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

// Returns a registry with every kernel of `f32Kernels` and its traits; kernels registered with
// KernelTraits::movesBitsOnly (copy, fill, cast and the layout ops) or handlesReducedFloats
// (canvas_sample) already handle 16-bit floats and are kept as they are, the others run as described above when a step has a 16-bit float buffer.
KernelRegistry withReducedPrecisionFloats(const KernelRegistry& f32Kernels);

}  // namespace dgemma
