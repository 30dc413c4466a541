// Bounds assertions for the CUDA kernels' computed indices, compiled in only with the CMake option
// DGEMMA_CUDA_DEBUG_BOUNDS (runtime/kernels/CMakeLists.txt): a failed check prints the file, line and
// condition from the device and traps, so the next synchronizing call reports the launch failure
// (run under compute-sanitizer to find the thread). Off, the checks cost nothing.
#pragma once

#if defined(DGEMMA_CUDA_DEBUG_BOUNDS)
#include <cstdio>
#define DGEMMA_CUDA_CHECK_BOUNDS(condition)                                                        \
  do {                                                                                             \
    if (!(condition)) {                                                                            \
      printf("%s:%d: CUDA bounds check failed: %s\n", __FILE__, __LINE__, #condition);             \
      __trap();                                                                                    \
    }                                                                                              \
  } while (0)
#else
#define DGEMMA_CUDA_CHECK_BOUNDS(condition) \
  do {                                      \
  } while (0)
#endif
