#include "runtime/kernels/matmul/OpenBlasCore.h"

#include <cblas.h>
#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dgemma {

const char* betterOpenBlasCore() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
  const char* core = openblas_get_corename();
  if (core == nullptr || strcasecmp(core, "prescott") != 0) return nullptr;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return nullptr;
}

void reexecWithBetterOpenBlasCore(char** argv) {
  const char* core = betterOpenBlasCore();
  if (core == nullptr) return;
  if (::setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/1) != 0) return;
  ::execv("/proc/self/exe", argv);
  std::fprintf(stderr, "note: OpenBLAS uses its slow Prescott kernels on this CPU; re-running with OPENBLAS_CORETYPE=%s "
               "failed (%s); set it yourself for faster matrix products\n", core, std::strerror(errno));
}

}  // namespace dgemma
