#include "runtime/backends/cuda/CudaBackend.h"

#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/backends/cuda/ReducedPrecision.h"
#include "runtime/core/ThreadPool.h"
#include "support/Error.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/CudaKernels.h"

namespace dgemma {
namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, int64_t hostThreads)
      : device_(device),
        registry_(cudaBackendKernels()),
        hostRegistry_(cudaBackendHostKernels()),
        hostThreads_(hostThreads) {
    try {
      activate();
      growStreams(1);
    } catch (...) {
      release();
      throw;
    }
  }

  ~CudaBackend() override { release(); }

  std::string name() const override { return "cuda"; }

  uint64_t memoryCapacityBytes() const override {
    activate();
    size_t freeBytes = 0, totalBytes = 0;
    DGEMMA_CUDA_CHECK(cudaMemGetInfo(&freeBytes, &totalBytes));
    return totalBytes;
  }
  void* allocate(uint64_t bytes, uint64_t alignment) override {
    if (alignment == 0) alignment = 1;
    if ((alignment & (alignment - 1)) != 0)
      throw RuntimeError("cuda backend: allocation alignment " + std::to_string(alignment) + " is not a power of two");
    activate();
    // cudaMalloc returns 256-byte aligned memory; over-allocate for stricter alignments.
    constexpr uint64_t kMallocAlignment = 256;
    uint64_t padding = alignment > kMallocAlignment ? alignment - kMallocAlignment : 0;
    uint64_t request = (bytes == 0 ? 1 : bytes);
    if (request > UINT64_MAX - padding)
      throw RuntimeError("cuda backend: allocation of " + std::to_string(bytes) + " bytes is too large");
    request += padding;
    void* base = nullptr;
    cudaError_t status = cudaMalloc(&base, request);
    if (status != cudaSuccess) {
      cudaGetLastError();
      size_t freeBytes = 0, totalBytes = 0;
      std::string memory;
      if (cudaMemGetInfo(&freeBytes, &totalBytes) == cudaSuccess)
        memory = "; " + std::to_string(freeBytes) + " of " + std::to_string(totalBytes) + " bytes free";
      cudaGetLastError();
      throw RuntimeError("cuda backend: cannot allocate " + std::to_string(bytes) + " bytes on device " +
                         std::to_string(device_) + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                         ")" + memory);
    }
    auto address = reinterpret_cast<uintptr_t>(base);
    void* aligned = reinterpret_cast<void*>((address + (alignment - 1)) & ~static_cast<uintptr_t>(alignment - 1));
    std::lock_guard<std::mutex> lock(allocationsMutex_);
    allocations_.emplace(aligned, base);
    return aligned;
  }

  void deallocate(void* pointer) override {
    if (pointer == nullptr) return;
    void* base = nullptr;
    {
      std::lock_guard<std::mutex> lock(allocationsMutex_);
      auto found = allocations_.find(pointer);
      if (found == allocations_.end())
        throw RuntimeError("cuda backend: deallocate of a pointer this backend did not allocate");
      base = found->second;
      allocations_.erase(found);
    }
    activate();
    DGEMMA_CUDA_CHECK(cudaFree(base));
  }

  // The host-facing transfers run on the legacy default stream, which the plan's (blocking) streams
  // synchronize with: they start after all work queued so far and complete before they return.
  void copyToDevice(void* deviceDst, const void* hostSrc, uint64_t bytes) override {
    if (bytes == 0) return;
    activate();
    DGEMMA_CUDA_CHECK(cudaMemcpy(deviceDst, hostSrc, bytes, cudaMemcpyHostToDevice));
    // From pageable memory, cudaMemcpy may return before the DMA lands; wait so the caller may
    // assume the copy is complete (e.g. to time it, or to hand the memory to another device).
    DGEMMA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

  void copyToHost(void* hostDst, const void* deviceSrc, uint64_t bytes) override {
    if (bytes == 0) return;
    activate();
    DGEMMA_CUDA_CHECK(cudaMemcpy(hostDst, deviceSrc, bytes, cudaMemcpyDeviceToHost));
  }

  void fillZero(void* deviceDst, uint64_t bytes) override {
    if (bytes == 0) return;
    activate();
    DGEMMA_CUDA_CHECK(cudaMemset(deviceDst, 0, bytes));
    DGEMMA_CUDA_CHECK(cudaStreamSynchronize(nullptr));
  }

  void copyOnDevice(ExecContext& context, void* deviceDst, const void* deviceSrc, uint64_t bytes) override {
    if (bytes == 0) return;
    cuda::StreamState& state = cuda::streamState(context);
    DGEMMA_CUDA_CHECK(cudaMemcpyAsync(deviceDst, deviceSrc, bytes, cudaMemcpyDeviceToDevice, state.stream));
  }

  const KernelRegistry& kernels() const override { return registry_; }

  // Grows the pools to at least the requested sizes; streams and events persist across entry points.
  void prepareStreams(int64_t numStreams, int64_t numEvents) override {
    if (numStreams < 0 || numEvents < 0)
      throw RuntimeError("cuda backend: negative stream or event count (" + std::to_string(numStreams) + ", " +
                         std::to_string(numEvents) + ")");
    activate();
    growStreams(numStreams);
    while (static_cast<int64_t>(events_.size()) < numEvents) {
      cudaEvent_t event = nullptr;
      DGEMMA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      events_.push_back(event);
    }
  }

  ExecContext context(int64_t stream) override {
    checkStream(stream);
    activate();  // kernels launch on the calling thread's current device
    ExecContext context;
    context.stream = stream;
    context.streamHandle = streams_[stream]->stream;
    context.threads = nullptr;
    context.backendState = streams_[stream].get();
    return context;
  }

  void recordEvent(int64_t event, int64_t stream) override {
    checkEvent(event);
    checkStream(stream);
    activate();
    DGEMMA_CUDA_CHECK(cudaEventRecord(events_[event], streams_[stream]->stream));
  }

  void waitEvent(int64_t event, int64_t stream) override {
    checkEvent(event);
    checkStream(stream);
    activate();
    DGEMMA_CUDA_CHECK(cudaStreamWaitEvent(streams_[stream]->stream, events_[event], 0));
  }

  void synchronize() override {
    activate();
    DGEMMA_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // The host arena (--optimizer-offload): pinned memory, so that the copies across PCIe are
  // asynchronous DMA on the plan's stream, and the CPU's kernels run on it (the host AdamW is the CPU
  // backend's arithmetic, which the CUDA adamw shares: runtime/kernels/optimizer/AdamwMath.h).
  const KernelRegistry* hostKernels() const override { return &hostRegistry_; }

  void* allocateHost(uint64_t bytes, uint64_t alignment) override {
    // cudaHostAlloc returns page-aligned memory; stricter alignments are not asked for by plans.
    constexpr uint64_t kPageAlignment = 4096;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kPageAlignment)
      throw RuntimeError("cuda backend: host allocation alignment " + std::to_string(alignment) +
                         " is not a power of two up to " + std::to_string(kPageAlignment));
    activate();
    void* pointer = nullptr;
    cudaError_t status = cudaHostAlloc(&pointer, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
    if (status != cudaSuccess) {
      cudaGetLastError();
      throw RuntimeError("cuda backend: cannot allocate " + std::to_string(bytes) + " bytes of pinned host memory: " +
                         cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
    }
    std::lock_guard<std::mutex> lock(allocationsMutex_);
    hostAllocations_.insert(pointer);
    return pointer;
  }

  void deallocateHost(void* pointer) override {
    if (pointer == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(allocationsMutex_);
      if (hostAllocations_.erase(pointer) == 0)
        throw RuntimeError("cuda backend: deallocateHost of a pointer this backend did not allocate");
    }
    activate();
    DGEMMA_CUDA_CHECK(cudaFreeHost(pointer));
  }

  void copyDeviceToHost(ExecContext& context, void* hostDst, const void* deviceSrc, uint64_t bytes) override {
    if (bytes == 0) return;
    cuda::StreamState& state = cuda::streamState(context);
    DGEMMA_CUDA_CHECK(cudaMemcpyAsync(hostDst, deviceSrc, bytes, cudaMemcpyDeviceToHost, state.stream));
  }

  void copyHostToDevice(ExecContext& context, void* deviceDst, const void* hostSrc, uint64_t bytes) override {
    if (bytes == 0) return;
    cuda::StreamState& state = cuda::streamState(context);
    DGEMMA_CUDA_CHECK(cudaMemcpyAsync(deviceDst, hostSrc, bytes, cudaMemcpyHostToDevice, state.stream));
  }

  ExecContext hostContext() override {
    ExecContext context;
    context.threads = &hostThreads_;
    return context;
  }

 private:
  void activate() const { DGEMMA_CUDA_CHECK(cudaSetDevice(device_)); }

  void checkStream(int64_t stream) const {
    if (stream < 0 || stream >= static_cast<int64_t>(streams_.size()))
      throw RuntimeError("cuda backend: stream " + std::to_string(stream) + " out of range (" +
                         std::to_string(streams_.size()) + " streams prepared)");
  }

  void checkEvent(int64_t event) const {
    if (event < 0 || event >= static_cast<int64_t>(events_.size()))
      throw RuntimeError("cuda backend: event " + std::to_string(event) + " out of range (" +
                         std::to_string(events_.size()) + " events prepared)");
  }

  void growStreams(int64_t numStreams) {
    while (static_cast<int64_t>(streams_.size()) < numStreams) {
      auto state = std::make_unique<cuda::StreamState>();
      state->device = device_;
      try {
        // Blocking streams (not cudaStreamNonBlocking): they order with the legacy default stream
        // that the host-facing copies use.
        DGEMMA_CUDA_CHECK(cudaStreamCreateWithFlags(&state->stream, cudaStreamDefault));
        DGEMMA_CUBLAS_CHECK(cublasCreate(&state->cublas));
        DGEMMA_CUBLAS_CHECK(cublasSetStream(state->cublas, state->stream));
        // Full-precision FP32: no TF32 tensor-core math for sgemm.
        DGEMMA_CUBLAS_CHECK(cublasSetMathMode(state->cublas, CUBLAS_DEFAULT_MATH));
        DGEMMA_CUBLAS_CHECK(cublasSetPointerMode(state->cublas, CUBLAS_POINTER_MODE_HOST));
        DGEMMA_CUBLAS_CHECK(cublasLtCreate(&state->cublasLt));
      } catch (...) {
        if (state->cublasLt != nullptr) cublasLtDestroy(state->cublasLt);
        if (state->cublas != nullptr) cublasDestroy(state->cublas);
        if (state->stream != nullptr) cudaStreamDestroy(state->stream);
        throw;
      }
      streams_.push_back(std::move(state));
    }
  }

  // Frees everything; never throws (runs from the destructor and from a failed constructor).
  void release() noexcept {
    if (cudaSetDevice(device_) == cudaSuccess) cudaDeviceSynchronize();
    for (auto& state : streams_) {
      if (state->cublasLt != nullptr) cublasLtDestroy(state->cublasLt);
      if (state->cublas != nullptr) cublasDestroy(state->cublas);
      if (state->stream != nullptr) cudaStreamDestroy(state->stream);
    }
    streams_.clear();
    for (cudaEvent_t event : events_) cudaEventDestroy(event);
    events_.clear();
    for (auto& [aligned, base] : allocations_) cudaFree(base);
    allocations_.clear();
    for (void* pointer : hostAllocations_) cudaFreeHost(pointer);
    hostAllocations_.clear();
    cudaGetLastError();
  }

  int device_;
  KernelRegistry registry_;
  KernelRegistry hostRegistry_;
  ThreadPool hostThreads_;  // the host kernels' threads
  std::vector<std::unique_ptr<cuda::StreamState>> streams_;  // stable addresses: contexts point here
  std::vector<cudaEvent_t> events_;
  std::mutex allocationsMutex_;
  std::unordered_map<void*, void*> allocations_;  // pointer handed out -> pointer cudaMalloc returned
  std::unordered_set<void*> hostAllocations_;     // cudaHostAlloc's pointers
};

std::string errorText(cudaError_t error) {
  return std::string(cudaGetErrorString(error)) + " (" + cudaGetErrorName(error) + ")";
}

}  // namespace

KernelRegistry cudaBackendKernels() {
  KernelRegistry f32Kernels;
  registerCudaKernels(f32Kernels);
  return cuda::withWidenedBf16(f32Kernels);
}

// f32 only: the host arena holds the f32 optimizer state and its update's operands.
KernelRegistry cudaBackendHostKernels() {
  KernelRegistry kernels;
  registerCpuKernels(kernels);
  return kernels;
}

bool cudaDeviceAvailable(std::string* reason) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    if (reason != nullptr) *reason = errorText(status);
    return false;
  }
  if (count <= 0) {
    if (reason != nullptr) *reason = "no CUDA device found";
    return false;
  }
  return true;
}

std::unique_ptr<Backend> createCudaBackend(int64_t deviceIndex, int64_t hostThreads) {
  std::string reason;
  if (!cudaDeviceAvailable(&reason)) throw RuntimeError("cuda backend: no usable CUDA device: " + reason);
  int count = 0;
  DGEMMA_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (deviceIndex < 0 || deviceIndex >= count)
    throw RuntimeError("cuda backend: device index " + std::to_string(deviceIndex) + " out of range (" +
                       std::to_string(count) + " device" + (count == 1 ? "" : "s") + ")");
  int device = static_cast<int>(deviceIndex);
  cudaError_t status = cudaSetDevice(device);
  // cudaFree(nullptr) creates the primary context: fails here, not mid-plan, when the device is
  // unusable (exclusive-process mode held by another process, out of memory, ...).
  if (status == cudaSuccess) status = cudaFree(nullptr);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw RuntimeError("cuda backend: no usable CUDA device: device " + std::to_string(device) + ": " +
                       errorText(status));
  }
  // Kernels are built for specific architectures (sm_90a); fail now with a clear message rather than
  // at the first launch with cudaErrorNoKernelImageForDevice.
  status = static_cast<cudaError_t>(probeCudaKernelImage());
  if (status != cudaSuccess) {
    cudaGetLastError();
    cudaDeviceProp properties{};
    std::string what = "device " + std::to_string(device);
    if (cudaGetDeviceProperties(&properties, device) == cudaSuccess)
      what += " (" + std::string(properties.name) + ", compute capability " + std::to_string(properties.major) + "." +
              std::to_string(properties.minor) + ")";
    cudaGetLastError();
    throw RuntimeError("cuda backend: no usable CUDA device: this build's kernels cannot run on " + what + ": " +
                       errorText(status));
  }
  return std::make_unique<CudaBackend>(device, hostThreads);
}

}  // namespace dgemma
