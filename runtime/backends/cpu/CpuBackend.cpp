#include "runtime/backends/cpu/CpuBackend.h"

#include <unistd.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "runtime/backends/cpu/ReducedPrecision.h"
#include "support/Error.h"
#include "runtime/core/ThreadPool.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma {

namespace {

// The CPU kernels allocate their temporaries per call: the MoE kernels' slot-ordered blocks (10 MB
// per moe_experts_backward call at small-20m's [512, 256] tokens, top-2 of 8), attention's tiles, the
// widened copies of bf16 operands. glibc adapts its mmap and trim thresholds to the allocations it
// has seen, so whether a call gets fresh pages depended on the process's history: a process that
// runs one kernel over and over (dgemma-bench-cpu-kernels) page-faulted on every block, about 3700
// faults per such backward call, a fifth of its time (12.1 ms against 9.4 ms), while the training
// step's mix of allocations happened to keep them (no faults per step measured either way). Fixed
// thresholds keep blocks up to glibc's largest mmap threshold (32 MiB) in the heap, and the freed
// memory there, for every process; the plan's arenas are larger and still mapped on their own. Once
// per process: the settings are the allocator's, for every thread.
void keepKernelTemporariesInTheHeap() {
#ifdef __GLIBC__
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
#endif
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int64_t numThreads) : threads_(numThreads), registry_(cpuKernels()) {
    keepKernelTemporariesInTheHeap();
  }

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

  // Its memory is the host's: the host arena is one more arena, run by the same kernels.
  const KernelRegistry* hostKernels() const override { return &registry_; }
  void* allocateHost(uint64_t bytes, uint64_t alignment) override { return allocate(bytes, alignment); }
  void deallocateHost(void* pointer) override { deallocate(pointer); }
  void copyDeviceToHost(ExecContext&, void* dst, const void* src, uint64_t bytes) override { copy(dst, src, bytes); }
  void copyHostToDevice(ExecContext&, void* dst, const void* src, uint64_t bytes) override { copy(dst, src, bytes); }
  ExecContext hostContext() override { return context(0); }

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
