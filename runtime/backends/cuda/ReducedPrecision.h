// bf16 on the CUDA backend for the kernels that compute in f32 only. A step with a bf16 buffer whose
// kernel does not read and write bf16 itself runs its f32 kernel on f32 twins: each bf16 input is
// widened (exactly) into a stream-ordered scratch buffer, the f32 kernel runs, and each bf16 output
// is rounded once, to nearest even. That is the CPU backend's rule (runtime/backends/cpu/
// ReducedPrecision.h), so a bf16 plan computes the same numbers on both backends up to each f32
// kernel's own tolerance. Kernels registered with KernelTraits::movesBitsOnly or
// handlesReducedFloats are kept as they are. f16 buffers are passed through untouched (the f32
// factories reject them). Plain C++ header.
#pragma once

#include "runtime/kernel_api/Kernel.h"

namespace dgemma::cuda {

// Every kernel of `f32Kernels` with its traits, the f32-only ones wrapped as described above. Needs
// no device: the scratch buffers are allocated when a step runs.
KernelRegistry withWidenedBf16(const KernelRegistry& f32Kernels);

}  // namespace dgemma::cuda
