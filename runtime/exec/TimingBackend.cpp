#include "runtime/exec/TimingBackend.h"

#include <algorithm>
#include <vector>

#include "support/Shape.h"

namespace dgemma {

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

void count(OpTime& time, double seconds) {
  time.seconds += seconds;
  time.calls += 1;
}

class TimedKernel : public Kernel {
 public:
  TimedKernel(std::unique_ptr<Kernel> inner, OpTime* byOp, OpTime* byShape, const bool* enabled)
      : inner_(std::move(inner)), byOp_(byOp), byShape_(byShape), enabled_(enabled) {}
  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (!*enabled_) return inner_->run(context, inputs, outputs);
    Clock::time_point start = Clock::now();
    inner_->run(context, inputs, outputs);
    const double seconds = secondsSince(start);
    count(*byOp_, seconds);
    count(*byShape_, seconds);
  }

 private:
  std::unique_ptr<Kernel> inner_;
  OpTime* byOp_;
  OpTime* byShape_;
  const bool* enabled_;
};

std::vector<std::pair<std::string, OpTime>> slowestFirst(const std::map<std::string, OpTime>& table) {
  std::vector<std::pair<std::string, OpTime>> rows(table.begin(), table.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  return rows;
}

}  // namespace

TimingBackend::TimingBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {
  addTimed(registry_, inner_->kernels(), "");
  if (const KernelRegistry* host = inner_->hostKernels()) addTimed(hostRegistry_, *host, " (host)");
}

void TimingBackend::addTimed(KernelRegistry& timed, const KernelRegistry& registry, const std::string& suffix) {
  for (const std::string& name : registry.names()) {
    const KernelFactory* factory = registry.find(name);
    const std::string op = name + suffix;
    timed.add(name, [this, factory, op](const KernelSignature& signature) -> std::unique_ptr<Kernel> {
      std::string key = op;
      for (const Buffer* input : signature.inputs) key.append(" ").append(shapeToString(input->shape));
      return std::make_unique<TimedKernel>((*factory)(signature), &byOp_[op], &byShape_[key], &enabled_);
    });
  }
}

template <typename Work>
void TimingBackend::timeCopy(const char* what, uint64_t bytes, Work work) {
  if (!enabled_) return work();
  Clock::time_point start = Clock::now();
  work();
  const double seconds = secondsSince(start);
  count(byOp_[what], seconds);
  count(byShape_[std::string(what) + " " + std::to_string(bytes) + " B"], seconds);
}

void TimingBackend::copyToDevice(void* dst, const void* src, uint64_t bytes) {
  timeCopy("(copy to device)", bytes, [&] { inner_->copyToDevice(dst, src, bytes); });
}
void TimingBackend::copyToHost(void* dst, const void* src, uint64_t bytes) {
  timeCopy("(copy to host)", bytes, [&] { inner_->copyToHost(dst, src, bytes); });
}
void TimingBackend::fillZero(void* dst, uint64_t bytes) {
  timeCopy("(fill zero)", bytes, [&] { inner_->fillZero(dst, bytes); });
}
void TimingBackend::copyOnDevice(ExecContext& context, void* dst, const void* src, uint64_t bytes) {
  timeCopy("(copy on device)", bytes, [&] { inner_->copyOnDevice(context, dst, src, bytes); });
}
void TimingBackend::copyDeviceToHost(ExecContext& context, void* dst, const void* src, uint64_t bytes) {
  timeCopy("(copy to the host arena)", bytes, [&] { inner_->copyDeviceToHost(context, dst, src, bytes); });
}
void TimingBackend::copyHostToDevice(ExecContext& context, void* dst, const void* src, uint64_t bytes) {
  timeCopy("(copy from the host arena)", bytes, [&] { inner_->copyHostToDevice(context, dst, src, bytes); });
}

double TimingBackend::totalSeconds() const {
  double seconds = 0;
  for (const auto& [name, time] : byOp_) seconds += time.seconds;
  return seconds;
}

void printKernelProfile(std::FILE* out, const TimingBackend& backend, double per, const char* unit, int topShapes) {
  const double total = std::max(backend.totalSeconds(), 1e-300);
  std::fprintf(out, "%-28s %10s %8s %10s\n", "op", (std::string("ms/") + unit).c_str(), "share",
               (std::string("calls/") + unit).c_str());
  for (const auto& [name, time] : slowestFirst(backend.byOp())) {
    if (time.calls == 0) continue;
    std::fprintf(out, "%-28s %10.3f %7.1f%% %10.1f\n", name.c_str(), 1e3 * time.seconds / per,
                 100 * time.seconds / total, static_cast<double>(time.calls) / per);
  }
  std::fprintf(out, "\ntop %d (op, input shapes)\n%10s %8s %10s  %s\n", topShapes, (std::string("ms/") + unit).c_str(),
               "share", (std::string("calls/") + unit).c_str(), "op and input shapes");
  int shown = 0;
  for (const auto& [key, time] : slowestFirst(backend.byShape())) {
    if (time.calls == 0 || shown++ == topShapes) break;
    std::fprintf(out, "%10.3f %7.1f%% %10.1f  %s\n", 1e3 * time.seconds / per, 100 * time.seconds / total,
                 static_cast<double>(time.calls) / per, key.c_str());
  }
}

}  // namespace dgemma
