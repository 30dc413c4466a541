// The CPU backend's kernels: every kernel of docs/kernels.md (collectives are not kernels). Each group
// lives in runtime/kernels/<group>/cpu.cpp and registers itself through one function declared here.
#pragma once

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

// Adds all the groups below.
void registerCpuKernels(KernelRegistry& registry);

// add, sub, mul, div, maximum, minimum, compare, select, the unary maps, gelu_tanh, copy, fill, cast
void registerElementwiseCpuKernels(KernelRegistry& registry);
void registerFusedElementwiseCpuKernels(KernelRegistry& registry);  // fused_elementwise
void registerMatmulCpuKernels(KernelRegistry& registry);       // matmul
void registerRmsNormCpuKernels(KernelRegistry& registry);      // rms_norm, rms_norm_backward
void registerSoftmaxCpuKernels(KernelRegistry& registry);      // softmax
void registerReduceCpuKernels(KernelRegistry& registry);       // reduce_sum, reduce_max, reduce_mean
void registerLayoutCpuKernels(KernelRegistry& registry);       // transpose, reshape, concat, slice
void registerGatherCpuKernels(KernelRegistry& registry);       // gather, scatter_add
void registerRandomCpuKernels(KernelRegistry& registry);       // random_uniform, random_int
void registerRopeCpuKernels(KernelRegistry& registry);         // rope
void registerAttentionCpuKernels(KernelRegistry& registry);    // attention, attention_backward
void registerMoeCpuKernels(KernelRegistry& registry);          // moe_route[_backward], moe_experts[_backward]
// moe_dispatch, moe_permute, moe_combine, moe_local_experts, moe_local_experts_backward
void registerMoeDispatchCpuKernels(KernelRegistry& registry);
void registerCrossEntropyCpuKernels(KernelRegistry& registry); // cross_entropy, cross_entropy_backward
void registerOptimizerCpuKernels(KernelRegistry& registry);    // adamw
void registerCanvasSampleCpuKernels(KernelRegistry& registry);  // canvas_sample

}  // namespace dgemma
