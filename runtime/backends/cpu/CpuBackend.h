#pragma once

#include <memory>

#include "runtime/kernel_api/Backend.h"

namespace dgemma {

// Host memory, OpenBLAS GEMMs and a thread pool; streams and events collapse to program order.
std::unique_ptr<Backend> createCpuBackend(int64_t numThreads);

}  // namespace dgemma
