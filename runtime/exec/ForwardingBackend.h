// A Backend that forwards every call to another one and serves a kernel registry of its own: the
// base of the backends that observe another (TimingBackend, TrackingBackend). They override the
// calls they watch and fill `registry_` with the inner backend's kernels wrapped.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "runtime/kernel_api/Backend.h"

namespace dgemma {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  std::string name() const override { return inner_->name(); }
  uint64_t memoryCapacityBytes() const override { return inner_->memoryCapacityBytes(); }
  void* allocate(uint64_t bytes, uint64_t alignment) override { return inner_->allocate(bytes, alignment); }
  void deallocate(void* pointer) override { inner_->deallocate(pointer); }
  void copyToDevice(void* dst, const void* src, uint64_t bytes) override { inner_->copyToDevice(dst, src, bytes); }
  void copyToHost(void* dst, const void* src, uint64_t bytes) override { inner_->copyToHost(dst, src, bytes); }
  void fillZero(void* dst, uint64_t bytes) override { inner_->fillZero(dst, bytes); }
  void copyOnDevice(ExecContext& context, void* dst, const void* src, uint64_t bytes) override {
    inner_->copyOnDevice(context, dst, src, bytes);
  }
  const KernelRegistry& kernels() const override { return registry_; }
  void prepareStreams(int64_t streams, int64_t events) override { inner_->prepareStreams(streams, events); }
  ExecContext context(int64_t stream) override { return inner_->context(stream); }
  void recordEvent(int64_t event, int64_t stream) override { inner_->recordEvent(event, stream); }
  void waitEvent(int64_t event, int64_t stream) override { inner_->waitEvent(event, stream); }
  void synchronize() override { inner_->synchronize(); }
  // The host arena's kernels run unwrapped: they touch no device memory.
  const KernelRegistry* hostKernels() const override { return inner_->hostKernels(); }
  void* allocateHost(uint64_t bytes, uint64_t alignment) override { return inner_->allocateHost(bytes, alignment); }
  void deallocateHost(void* pointer) override { inner_->deallocateHost(pointer); }
  void copyDeviceToHost(ExecContext& context, void* dst, const void* src, uint64_t bytes) override {
    inner_->copyDeviceToHost(context, dst, src, bytes);
  }
  void copyHostToDevice(ExecContext& context, void* dst, const void* src, uint64_t bytes) override {
    inner_->copyHostToDevice(context, dst, src, bytes);
  }
  ExecContext hostContext() override { return inner_->hostContext(); }

 protected:
  std::unique_ptr<Backend> inner_;
  KernelRegistry registry_;
};

}  // namespace dgemma
