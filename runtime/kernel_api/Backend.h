// A backend owns device memory and runs kernels. The executor drives any backend through this
// interface only; backends are chosen at run time by name ("cpu", "cuda").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/kernel_api/Kernel.h"

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
};

// "cpu" always exists; "cuda" exists when built with CUDA and a device is usable. Throws
// RuntimeError naming the reason otherwise (no driver, no device, not built with CUDA).
// `deviceIndex` is the GPU of "cuda" (a rank of a multi-rank run uses its LOCAL_RANK).
std::unique_ptr<Backend> createBackend(const std::string& name, int64_t numThreads = 0, int64_t deviceIndex = 0);

}  // namespace dgemma
