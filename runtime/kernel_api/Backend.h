// A backend owns device memory and runs kernels. The executor drives any backend through this
// interface only; backends are chosen at run time by name ("cpu", "cuda").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/kernel_api/Kernel.h"
#include "support/Error.h"

namespace dgemma {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // The memory allocate() draws from (the CPU's physical memory, the GPU's device memory): the
  // executor refuses a plan whose arenas need more before it allocates anything.
  virtual uint64_t memoryCapacityBytes() const = 0;
  virtual void* allocate(uint64_t bytes, uint64_t alignment) = 0;
  virtual void deallocate(void* pointer) = 0;
  virtual void copyToDevice(void* deviceDst, const void* hostSrc, uint64_t bytes) = 0;
  virtual void copyToHost(void* hostDst, const void* deviceSrc, uint64_t bytes) = 0;
  virtual void fillZero(void* deviceDst, uint64_t bytes) = 0;
  // Ordered on `context`'s stream.
  virtual void copyOnDevice(ExecContext& context, void* deviceDst, const void* deviceSrc, uint64_t bytes) = 0;

  virtual const KernelRegistry& kernels() const = 0;

  // Streams and events as the plan numbers them. The CPU backend executes everything in plan order,
  // so its implementations only hand out contexts.
  virtual void prepareStreams(int64_t numStreams, int64_t numEvents) = 0;
  virtual ExecContext context(int64_t stream) = 0;
  virtual void recordEvent(int64_t event, int64_t stream) = 0;
  virtual void waitEvent(int64_t event, int64_t stream) = 0;
  virtual void synchronize() = 0;

  // A plan's host arena (plan/HostArena.h; docs/parallelism.md, "Optimizer-state offload"): memory
  // the CPU reads and writes, which the device copies to and from on a stream (pinned memory on a
  // GPU), and the kernels that run on it. A backend without them returns null from hostKernels() and
  // the executor refuses such a plan; the other calls are then never made.
  virtual const KernelRegistry* hostKernels() const { return nullptr; }
  virtual void* allocateHost(uint64_t, uint64_t) { throw RuntimeError(name() + " backend: no host arena"); }
  virtual void deallocateHost(void*) { throw RuntimeError(name() + " backend: no host arena"); }
  // Ordered on `context`'s stream like a kernel: the host side may be read or written by the CPU only
  // after synchronize().
  virtual void copyDeviceToHost(ExecContext&, void*, const void*, uint64_t) {
    throw RuntimeError(name() + " backend: no host arena");
  }
  virtual void copyHostToDevice(ExecContext&, void*, const void*, uint64_t) {
    throw RuntimeError(name() + " backend: no host arena");
  }
  // What hostKernels() run in: on the calling thread, after synchronize().
  virtual ExecContext hostContext() { throw RuntimeError(name() + " backend: no host arena"); }
};

// "cpu" always exists; "cuda" exists when built with CUDA and a device is usable. Throws
// RuntimeError naming the reason otherwise (no driver, no device, not built with CUDA).
// `deviceIndex` is the GPU of "cuda" (a rank of a multi-rank run uses its LOCAL_RANK).
// `numThreads` (<= 0: one per core) is the CPU backend's pool, and the pool of "cuda"'s host kernels.
std::unique_ptr<Backend> createBackend(const std::string& name, int64_t numThreads = 0, int64_t deviceIndex = 0);

}  // namespace dgemma
