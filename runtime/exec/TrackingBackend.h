// A Backend that forwards everything to another one and records memory use: every allocation
// (the executor's arenas) and every byte range a kernel, a copy or a fill touches, in call order.
// From that trace it gives, per allocation, the most bytes that were live at once: a range is live
// from the call that writes it (or first touches it) to the last call that touches it before it is
// written again. The memory planner's claim is that this never exceeds the arena it planned
// (test/unit/models/PlannedMemoryTest.cpp). Collectives move bytes through a Communicator, which
// this backend does not see; the kernels that read their results do.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/exec/ForwardingBackend.h"

namespace dgemma {

class TrackingBackend : public ForwardingBackend {
 public:
  explicit TrackingBackend(std::unique_ptr<Backend> inner);

  void* allocate(uint64_t bytes, uint64_t alignment) override;
  void deallocate(void* pointer) override;
  void copyToDevice(void* dst, const void* src, uint64_t bytes) override;
  void copyToHost(void* dst, const void* src, uint64_t bytes) override;
  void fillZero(void* dst, uint64_t bytes) override;
  void copyOnDevice(ExecContext& context, void* dst, const void* src, uint64_t bytes) override;
  // A plan's host arena is one more allocation, and the copies across it are traced; the host
  // kernels run untraced (they touch only that arena, which is persistent).
  void* allocateHost(uint64_t bytes, uint64_t alignment) override;
  void deallocateHost(void* pointer) override;
  void copyDeviceToHost(ExecContext& context, void* dst, const void* src, uint64_t bytes) override;
  void copyHostToDevice(ExecContext& context, void* dst, const void* src, uint64_t bytes) override;

  struct Allocation {
    const uint8_t* base = nullptr;
    uint64_t bytes = 0;
    bool live = true;  // not yet deallocated
  };
  // In allocation order (the executor allocates the plan's arenas in the plan's order).
  const std::vector<Allocation>& allocations() const { return allocations_; }
  // Per allocation, the most bytes live at once over the recorded trace.
  std::vector<uint64_t> peakLiveBytes() const;
  // Forgets the trace (not the allocations): the next peaks cover what runs after.
  void clearTrace() { accesses_.clear(); }

  // One touched byte range. Touching bytes outside every live allocation throws RuntimeError at once.
  struct Access {
    int64_t call = 0;
    size_t allocation = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    bool write = false;
  };
  void record(const void* pointer, uint64_t bytes, bool write, const char* what);
  void nextCall() { ++call_; }

 private:
  std::vector<Allocation> allocations_;
  std::vector<Access> accesses_;
  int64_t call_ = 0;
};

}  // namespace dgemma
