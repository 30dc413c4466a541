#include "runtime/exec/TrackingBackend.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "support/Error.h"

namespace dgemma {

namespace {

class TrackedKernel : public Kernel {
 public:
  TrackedKernel(std::unique_ptr<Kernel> inner, TrackingBackend* backend, std::string name)
      : inner_(std::move(inner)), backend_(backend), name_(std::move(name)) {}
  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    backend_->nextCall();
    for (const TensorRef& input : inputs) backend_->record(input.data, input.buffer->bytes(), false, name_.c_str());
    for (const TensorRef& output : outputs) backend_->record(output.data, output.buffer->bytes(), true, name_.c_str());
    inner_->run(context, inputs, outputs);
  }

 private:
  std::unique_ptr<Kernel> inner_;
  TrackingBackend* backend_;
  std::string name_;
};

}  // namespace

TrackingBackend::TrackingBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {
  for (const std::string& name : inner_->kernels().names()) {
    const KernelFactory* factory = inner_->kernels().find(name);
    registry_.add(
        name,
        [this, factory, name](const KernelSignature& signature) -> std::unique_ptr<Kernel> {
          return std::make_unique<TrackedKernel>((*factory)(signature), this, name);
        },
        inner_->kernels().traits(name));
  }
}

void* TrackingBackend::allocate(uint64_t bytes, uint64_t alignment) {
  void* pointer = inner_->allocate(bytes, alignment);
  allocations_.push_back({static_cast<const uint8_t*>(pointer), bytes, true});
  return pointer;
}

void TrackingBackend::deallocate(void* pointer) {
  for (Allocation& allocation : allocations_)
    if (allocation.live && allocation.base == pointer && pointer != nullptr) allocation.live = false;
  inner_->deallocate(pointer);
}

void* TrackingBackend::allocateHost(uint64_t bytes, uint64_t alignment) {
  void* pointer = inner_->allocateHost(bytes, alignment);
  allocations_.push_back({static_cast<const uint8_t*>(pointer), bytes, true});
  return pointer;
}

void TrackingBackend::deallocateHost(void* pointer) {
  for (Allocation& allocation : allocations_)
    if (allocation.live && allocation.base == pointer && pointer != nullptr) allocation.live = false;
  inner_->deallocateHost(pointer);
}

void TrackingBackend::record(const void* pointer, uint64_t bytes, bool write, const char* what) {
  if (bytes == 0) return;
  const auto* address = static_cast<const uint8_t*>(pointer);
  for (size_t i = 0; i < allocations_.size(); ++i) {
    const Allocation& allocation = allocations_[i];
    if (!allocation.live || address < allocation.base || address >= allocation.base + allocation.bytes) continue;
    uint64_t offset = static_cast<uint64_t>(address - allocation.base);
    if (bytes > allocation.bytes - offset)
      throw RuntimeError(std::string(what) + ": " + std::to_string(bytes) + " bytes at offset " +
                         std::to_string(offset) + " run past the end of allocation " + std::to_string(i) + " (" +
                         std::to_string(allocation.bytes) + " bytes)");
    accesses_.push_back({call_, i, offset, bytes, write});
    return;
  }
  // Host memory (a copy's source or destination) is no allocation of this backend.
  (void)what;
}

void TrackingBackend::copyToDevice(void* dst, const void* src, uint64_t bytes) {
  nextCall();
  record(dst, bytes, true, "copy to device");
  inner_->copyToDevice(dst, src, bytes);
}

void TrackingBackend::copyToHost(void* dst, const void* src, uint64_t bytes) {
  nextCall();
  record(src, bytes, false, "copy to host");
  inner_->copyToHost(dst, src, bytes);
}

void TrackingBackend::fillZero(void* dst, uint64_t bytes) {
  nextCall();
  record(dst, bytes, true, "fill zero");
  inner_->fillZero(dst, bytes);
}

void TrackingBackend::copyOnDevice(ExecContext& context, void* dst, const void* src, uint64_t bytes) {
  nextCall();
  record(src, bytes, false, "copy on device");
  record(dst, bytes, true, "copy on device");
  inner_->copyOnDevice(context, dst, src, bytes);
}

void TrackingBackend::copyDeviceToHost(ExecContext& context, void* dst, const void* src, uint64_t bytes) {
  nextCall();
  record(src, bytes, false, "copy to the host arena");
  record(dst, bytes, true, "copy to the host arena");
  inner_->copyDeviceToHost(context, dst, src, bytes);
}

void TrackingBackend::copyHostToDevice(ExecContext& context, void* dst, const void* src, uint64_t bytes) {
  nextCall();
  record(src, bytes, false, "copy from the host arena");
  record(dst, bytes, true, "copy from the host arena");
  inner_->copyHostToDevice(context, dst, src, bytes);
}

std::vector<uint64_t> TrackingBackend::peakLiveBytes() const {
  // Each byte range's versions: a write starts one, and it lives to its range's last touch before
  // the next write. A read of a range nothing wrote yet (an input the trace did not see being
  // written) starts a version too.
  struct Version {
    int64_t first = 0;
    int64_t last = 0;
  };
  std::map<std::tuple<size_t, uint64_t, uint64_t>, std::vector<Version>> versions;
  for (const Access& access : accesses_) {
    std::vector<Version>& range = versions[{access.allocation, access.offset, access.bytes}];
    // A kernel that reads and writes the same range in one call (an in-place update) continues its version.
    if (range.empty() || (access.write && range.back().last != access.call))
      range.push_back({access.call, access.call});
    else range.back().last = access.call;
  }
  std::vector<std::map<int64_t, int64_t>> change(allocations_.size());  // call -> bytes born minus freed
  for (const auto& [key, range] : versions)
    for (const Version& version : range) {
      const int64_t bytes = static_cast<int64_t>(std::get<2>(key));
      change[std::get<0>(key)][version.first] += bytes;
      change[std::get<0>(key)][version.last + 1] -= bytes;
    }
  std::vector<uint64_t> peaks(allocations_.size(), 0);
  for (size_t i = 0; i < change.size(); ++i) {
    int64_t live = 0;
    for (const auto& [call, delta] : change[i])
      peaks[i] = std::max<uint64_t>(peaks[i], static_cast<uint64_t>(live += delta));
  }
  return peaks;
}

}  // namespace dgemma
