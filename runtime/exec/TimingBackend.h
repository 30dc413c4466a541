// A Backend that forwards everything to another one and times every kernel call and every copy it
// makes: where a plan's entries spend their time (dgemma-bench-train-step --profile, dgemma-run
// generate / eval --profile). The times are wall-clock per call, which measures the work of the CPU
// backend, whose kernels return when they are done; on an asynchronous backend they would measure
// the launches only.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "runtime/exec/ForwardingBackend.h"

namespace dgemma {

struct OpTime {
  double seconds = 0;
  int64_t calls = 0;
};

class TimingBackend : public ForwardingBackend {
 public:
  explicit TimingBackend(std::unique_ptr<Backend> inner);

  void copyToDevice(void* dst, const void* src, uint64_t bytes) override;
  void copyToHost(void* dst, const void* src, uint64_t bytes) override;
  void fillZero(void* dst, uint64_t bytes) override;
  void copyOnDevice(ExecContext& context, void* dst, const void* src, uint64_t bytes) override;
  // A plan's host arena (--optimizer-offload): its kernels count as "<kernel> (host)", its copies as
  // "(copy to the host arena)" and "(copy from the host arena)".
  const KernelRegistry* hostKernels() const override { return inner_->hostKernels() ? &hostRegistry_ : nullptr; }
  void copyDeviceToHost(ExecContext& context, void* dst, const void* src, uint64_t bytes) override;
  void copyHostToDevice(ExecContext& context, void* dst, const void* src, uint64_t bytes) override;

  // Nothing is counted while disabled (a warm-up); a new TimingBackend starts enabled.
  void setEnabled(bool enabled) { enabled_ = enabled; }

  // By kernel name, and by kernel name with its input shapes ("matmul [8,64,256] [16384,256]").
  // Copies count under "(copy to device)", "(copy to host)", "(copy on device)" and "(fill zero)"
  // with their byte count as the shape. std::map nodes never move, so the kernels' pointers into
  // these stay valid.
  const std::map<std::string, OpTime>& byOp() const { return byOp_; }
  const std::map<std::string, OpTime>& byShape() const { return byShape_; }
  double totalSeconds() const;

 private:
  template <typename Work>
  void timeCopy(const char* what, uint64_t bytes, Work work);

  // The inner backend's kernels of `registry`, timed under their names with `suffix`.
  void addTimed(KernelRegistry& timed, const KernelRegistry& registry, const std::string& suffix);

  KernelRegistry hostRegistry_;
  std::map<std::string, OpTime> byOp_, byShape_;
  bool enabled_ = true;
};

// The tables of a profile: time per op (ms per `per`, share of the timed total, calls per `per`),
// then the `topShapes` most expensive (op, input shapes). `per` counts what the caller divides by
// (steps, passes); `unit` names it ("step").
void printKernelProfile(std::FILE* out, const TimingBackend& backend, double per, const char* unit, int topShapes);

}  // namespace dgemma
