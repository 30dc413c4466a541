// The moe folder's CUDA kernels span two files; registerMoeCudaKernels (experts.cu, the twin of
// cpu.cpp's registration) adds the router's through this. Plain C++ header.
#pragma once

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

void registerMoeRouteCudaKernels(KernelRegistry& registry);  // route.cu: moe_route, moe_route_backward

}  // namespace dgemma
