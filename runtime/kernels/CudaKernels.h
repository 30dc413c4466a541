// The CUDA twins of the CPU kernels (runtime/kernels/<op>/cuda.cu, matmul/cuda.cpp). The arithmetic
// kernels are f32 only except matmul, attention, cross-entropy, canvas_sample and fused_elementwise
// (f32 and bf16); their factories reject other dtypes when the plan is loaded, and the CUDA backend
// runs the f32-only ones on bf16 steps widened (runtime/backends/cuda/ReducedPrecision.h). The
// kernels that move bits (layout, cast, fill, copy, select, gather) take any dtype. Plain C++ header.
#pragma once

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

// Per group; registerCudaKernels calls them all.
void registerElementwiseCudaKernels(KernelRegistry& registry);  // add ... minimum, compare, unary maps, gelu_tanh, copy
void registerMatmulCudaKernels(KernelRegistry& registry);       // matmul (cuBLAS f32, cuBLASLt bf16)
void registerRmsNormCudaKernels(KernelRegistry& registry);      // rms_norm, rms_norm_backward
void registerSoftmaxCudaKernels(KernelRegistry& registry);      // softmax (last axis)
void registerMoeDispatchCudaKernels(KernelRegistry& registry);  // moe_dispatch, moe_permute, moe_combine
void registerCanvasSampleCudaKernels(KernelRegistry& registry);  // canvas_sample
void registerAttentionCudaKernels(KernelRegistry& registry);     // attention, attention_backward (f32, bf16)
void registerCrossEntropyCudaKernels(KernelRegistry& registry);  // cross_entropy[_backward] (f32, bf16)
void registerRandomCudaKernels(KernelRegistry& registry);        // random_uniform, random_int
void registerOptimizerCudaKernels(KernelRegistry& registry);     // adamw
void registerReduceCudaKernels(KernelRegistry& registry);        // reduce_sum, reduce_max, reduce_mean
void registerRopeCudaKernels(KernelRegistry& registry);          // rope
void registerGatherCudaKernels(KernelRegistry& registry);        // gather, scatter_add
void registerLayoutCudaKernels(KernelRegistry& registry);        // transpose, reshape, concat, slice
void registerCastCudaKernels(KernelRegistry& registry);          // cast
void registerFillCudaKernels(KernelRegistry& registry);          // fill
void registerSelectCudaKernels(KernelRegistry& registry);        // select
void registerMoeRouteCudaKernels(KernelRegistry& registry);      // moe_route, moe_route_backward
// moe_experts[_backward] and moe_local_experts[_backward] (cuBLAS per expert)
void registerMoeExpertsCudaKernels(KernelRegistry& registry);
void registerFusedElementwiseCudaKernels(KernelRegistry& registry);  // fused_elementwise (f32, bf16)

void registerCudaKernels(KernelRegistry& registry);

// cudaSuccess (0) when this build's kernels have an image the current device can run; otherwise the
// cudaError_t value (e.g. cudaErrorNoKernelImageForDevice on a device of another architecture).
int probeCudaKernelImage();

}  // namespace dgemma
