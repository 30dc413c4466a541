#include "runtime/backends/cpu/CpuBackend.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "runtime/backends/cpu/ReducedPrecision.h"
#include "support/Error.h"
#include "runtime/core/ThreadPool.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma {

namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int64_t numThreads) : threads_(numThreads), registry_(cpuKernels()) {}

  std::string name() const override { return "cpu"; }

  // Physical memory: Linux overcommits, so an arena larger than this would be granted and the process
  // killed when it is first touched, instead of refused.
  uint64_t memoryCapacityBytes() const override {
    const long pages = sysconf(_SC_PHYS_PAGES), pageBytes = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || pageBytes <= 0) return UINT64_MAX;  // unknown: allocate() reports failures itself
    return static_cast<uint64_t>(pages) * static_cast<uint64_t>(pageBytes);
  }
  void* allocate(uint64_t bytes, uint64_t alignment) override {
    if (bytes == 0) return nullptr;
    uint64_t rounded = (bytes + alignment - 1) / alignment * alignment;
    void* pointer = std::aligned_alloc(alignment, rounded);
    if (!pointer) throw RuntimeError("cpu backend: cannot allocate " + std::to_string(bytes) + " bytes");
    return pointer;
  }
  void deallocate(void* pointer) override { std::free(pointer); }
  void copyToDevice(void* dst, const void* src, uint64_t bytes) override { copy(dst, src, bytes); }
  void copyToHost(void* dst, const void* src, uint64_t bytes) override { copy(dst, src, bytes); }
  void fillZero(void* dst, uint64_t bytes) override {
    if (bytes) std::memset(dst, 0, bytes);
  }
  void copyOnDevice(ExecContext&, void* dst, const void* src, uint64_t bytes) override { copy(dst, src, bytes); }

  const KernelRegistry& kernels() const override { return registry_; }

  void prepareStreams(int64_t, int64_t) override {}
  ExecContext context(int64_t stream) override {
    ExecContext context;
    context.stream = stream;
    context.threads = &threads_;
    return context;
  }
  void recordEvent(int64_t, int64_t) override {}
  void waitEvent(int64_t, int64_t) override {}
  void synchronize() override {}

 private:
  static KernelRegistry cpuKernels() {
    KernelRegistry f32Kernels;
    registerCpuKernels(f32Kernels);
    return withReducedPrecisionFloats(f32Kernels);
  }

  static void copy(void* dst, const void* src, uint64_t bytes) {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }

  ThreadPool threads_;
  KernelRegistry registry_;
};

}  // namespace

std::unique_ptr<Backend> createCpuBackend(int64_t numThreads) { return std::make_unique<CpuBackend>(numThreads); }

}  // namespace dgemma
