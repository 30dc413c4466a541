#include "runtime/comm/NcclCommunicator.h"

#include <cuda_runtime.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>

#include <climits>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "runtime/comm/CollectiveArguments.h"
#include "runtime/comm/NcclLibrary.h"
#include "support/Error.h"

namespace dgemma {

namespace {

std::string cudaErrorText(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

// The NCCL type a reduction of `dtype` runs in; RuntimeError for a dtype NCCL cannot reduce.
ncclDataType_t reducibleType(DType dtype, const std::string& what) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I64: return ncclInt64;
    case DType::I32: return ncclInt32;
    case DType::I8: return ncclInt8;
    case DType::U8: return ncclUint8;
    case DType::Bool: break;
  }
  throw RuntimeError(what + ": dtype " + std::string(dtypeName(dtype)) +
                     " is not supported (f32, f64, bf16, f16, i64, i32, i8, u8 are)");
}

ncclRedOp_t reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  throw std::logic_error("unknown ReduceOp");
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclLibrary& nccl, ncclComm_t comm, int device, int64_t rank, int64_t size, std::string label)
      : nccl_(nccl), comm_(comm), device_(device), rank_(rank), size_(size), label_(std::move(label)) {
    try {
      const std::string what = describe("setup");
      activate(what);
      checkCuda(what, cudaStreamCreateWithFlags(&hostStream_, cudaStreamNonBlocking));
      checkCuda(what, cudaMalloc(&scratch_, 2 * static_cast<size_t>(size_) * sizeof(int64_t)));
    } catch (...) {
      release();
      throw;
    }
  }

  ~NcclCommunicator() override { release(); }

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }

  void allReduce(ExecContext& context, void* data, int64_t count, DType dtype, ReduceOp op) override {
    const std::string what = describe("allReduce");
    checkCollectiveCount(what, count);
    const ncclDataType_t type = reducibleType(dtype, what);
    if (count == 0) return;  // every rank has the same count, so all skip alike
    cudaStream_t stream = streamOf(context, what);
    checkNccl(what, nccl_.allReduce(data, data, static_cast<size_t>(count), type, reduction(op), comm_, stream));
  }

  void allGather(ExecContext& context, const void* send, void* recv, int64_t count, DType dtype) override {
    const std::string what = describe("allGather");
    checkCollectiveCount(what, count);
    if (count == 0) return;
    cudaStream_t stream = streamOf(context, what);
    checkNccl(what, nccl_.allGather(send, recv, bytes(count, dtype), ncclUint8, comm_, stream));
  }

  void reduceScatter(ExecContext& context, const void* send, void* recv, int64_t count, DType dtype,
                     ReduceOp op) override {
    const std::string what = describe("reduceScatter");
    checkCollectiveCount(what, count);
    const ncclDataType_t type = reducibleType(dtype, what);
    if (count == 0) return;
    cudaStream_t stream = streamOf(context, what);
    checkNccl(what, nccl_.reduceScatter(send, recv, static_cast<size_t>(count), type, reduction(op), comm_, stream));
  }

  void broadcast(ExecContext& context, void* data, int64_t count, DType dtype, int64_t root) override {
    const std::string what = describe("broadcast");
    checkCollectiveRoot(what, root, size_);
    checkCollectiveCount(what, count);
    if (count == 0) return;
    cudaStream_t stream = streamOf(context, what);
    checkNccl(what, nccl_.broadcast(data, data, bytes(count, dtype), ncclUint8, static_cast<int>(root), comm_, stream));
  }

  // ncclReduce leaves the non-root ranks' buffers as they were; the contract wants zeros there.
  void reduceToRoot(ExecContext& context, void* data, int64_t count, DType dtype, int64_t root) override {
    const std::string what = describe("reduceToRoot");
    checkCollectiveRoot(what, root, size_);
    checkCollectiveCount(what, count);
    const ncclDataType_t type = reducibleType(dtype, what);
    if (count == 0) return;
    cudaStream_t stream = streamOf(context, what);
    checkNccl(what, nccl_.reduce(data, data, static_cast<size_t>(count), type, ncclSum, static_cast<int>(root), comm_,
                                 stream));
    if (rank_ != root) checkCuda(what, cudaMemsetAsync(data, 0, bytes(count, dtype), stream));
  }

  // One i64 to and from every rank through the device scratch buffer: [0, size) sends, [size,
  // 2 size) receives.
  std::vector<int64_t> exchangeCounts(const std::vector<int64_t>& sendCounts) override {
    const std::string what = describe("exchangeCounts");
    if (static_cast<int64_t>(sendCounts.size()) != size_)
      throw InputError(what + ": sendCounts: expected " + std::to_string(size_) + " entries (one per rank), got " +
                       std::to_string(sendCounts.size()));
    for (int64_t count : sendCounts)
      if (count < 0) throw InputError(what + ": sendCounts: expected non-negative entries, got " + std::to_string(count));
    activate(what);
    auto* sendSlots = static_cast<int64_t*>(scratch_);
    int64_t* recvSlots = sendSlots + size_;
    checkCuda(what, cudaMemcpyAsync(sendSlots, sendCounts.data(), sendCounts.size() * sizeof(int64_t),
                                    cudaMemcpyHostToDevice, hostStream_));
    checkNccl(what, nccl_.groupStart());
    ncclResult_t posted = ncclSuccess;
    for (int64_t peer = 0; peer < size_ && posted == ncclSuccess; ++peer) {
      posted = nccl_.send(sendSlots + peer, 1, ncclInt64, static_cast<int>(peer), comm_, hostStream_);
      if (posted == ncclSuccess) posted = nccl_.recv(recvSlots + peer, 1, ncclInt64, static_cast<int>(peer), comm_, hostStream_);
    }
    const ncclResult_t ended = nccl_.groupEnd();  // a group once started must end, even after a failed post
    checkNccl(what, posted);
    checkNccl(what, ended);
    std::vector<int64_t> received(static_cast<size_t>(size_));
    checkCuda(what, cudaMemcpyAsync(received.data(), recvSlots, received.size() * sizeof(int64_t),
                                    cudaMemcpyDeviceToHost, hostStream_));
    checkCuda(what, cudaStreamSynchronize(hostStream_));
    return received;
  }

  // Send and receive pairs in one group (NCCL matches a rank's send to a peer with that peer's
  // receive from it; the pair with itself is a local copy). planRaggedExchange checks the
  // arguments and turns them into byte ranges.
  void allToAllV(ExecContext& context, const void* send, const std::vector<int64_t>& sendCounts,
                 const std::vector<int64_t>& sendOffsets, void* recv, const std::vector<int64_t>& recvCounts,
                 const std::vector<int64_t>& recvOffsets, DType dtype) override {
    const std::string what = describe("allToAllV");
    const std::vector<PeerTransfer> transfers =
        planRaggedExchange(what, size_, dtypeSize(dtype), sendCounts, sendOffsets, recvCounts, recvOffsets);
    cudaStream_t stream = streamOf(context, what);
    const auto* sendBytes = static_cast<const uint8_t*>(send);
    auto* recvBytes = static_cast<uint8_t*>(recv);
    checkNccl(what, nccl_.groupStart());
    ncclResult_t posted = ncclSuccess;
    for (const PeerTransfer& transfer : transfers) {
      const int peer = static_cast<int>(transfer.peer);
      if (posted == ncclSuccess && transfer.sendBytes != 0)
        posted = nccl_.send(sendBytes + transfer.sendOffset, transfer.sendBytes, ncclUint8, peer, comm_, stream);
      if (posted == ncclSuccess && transfer.recvBytes != 0)
        posted = nccl_.recv(recvBytes + transfer.recvOffset, transfer.recvBytes, ncclUint8, peer, comm_, stream);
    }
    const ncclResult_t ended = nccl_.groupEnd();
    checkNccl(what, posted);
    checkNccl(what, ended);
  }

  // NCCL has no barrier: an all-reduce of one value on the communicator's stream, waited for.
  void barrier() override {
    const std::string what = describe("barrier");
    activate(what);
    checkNccl(what, nccl_.allReduce(scratch_, scratch_, 1, ncclInt64, ncclSum, comm_, hostStream_));
    checkCuda(what, cudaStreamSynchronize(hostStream_));
  }

 private:
  std::string describe(const std::string& collective) const {
    return "nccl " + collective + (label_.empty() ? "" : " over " + label_) + " (rank " + std::to_string(rank_) +
           " of " + std::to_string(size_) + ")";
  }

  static size_t bytes(int64_t count, DType dtype) { return static_cast<size_t>(count) * dtypeSize(dtype); }

  void activate(const std::string& what) const { checkCuda(what, cudaSetDevice(device_)); }

  // The plan stream the step runs on. A context without one is not the CUDA backend's.
  cudaStream_t streamOf(const ExecContext& context, const std::string& what) const {
    if (context.streamHandle == nullptr)
      throw RuntimeError(what + ": the context has no CUDA stream (the NCCL communicator serves --backend cuda only)");
    activate(what);
    return static_cast<cudaStream_t>(context.streamHandle);
  }

  void checkNccl(const std::string& what, ncclResult_t status) const {
    if (status == ncclSuccess) return;
    std::string message = what + ": " + nccl_.getErrorString(status);
    const char* detail = nccl_.getLastError(comm_);
    if (detail != nullptr && *detail != '\0') message += ": " + std::string(detail);
    throw RuntimeError(message);
  }

  static void checkCuda(const std::string& what, cudaError_t status) {
    if (status == cudaSuccess) return;
    cudaGetLastError();
    throw RuntimeError(what + ": " + cudaErrorText(status));
  }

  // Never throws: runs from the destructor and from a failed constructor. A communicator with an
  // asynchronous error (a peer gone) is aborted, since destroying it would wait for the peer.
  void release() noexcept {
    if (cudaSetDevice(device_) == cudaSuccess && hostStream_ != nullptr) cudaStreamSynchronize(hostStream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (hostStream_ != nullptr) cudaStreamDestroy(hostStream_);
    scratch_ = nullptr;
    hostStream_ = nullptr;
    if (comm_ != nullptr) {
      ncclResult_t asyncError = ncclSuccess;
      if (nccl_.commGetAsyncError(comm_, &asyncError) == ncclSuccess && asyncError == ncclSuccess)
        nccl_.commDestroy(comm_);
      else
        nccl_.commAbort(comm_);
      comm_ = nullptr;
    }
    cudaGetLastError();
  }

  const NcclLibrary& nccl_;
  ncclComm_t comm_;
  int device_;
  int64_t rank_;
  int64_t size_;
  std::string label_;
  cudaStream_t hostStream_ = nullptr;  // exchangeCounts and barrier: host-synchronous
  void* scratch_ = nullptr;            // 2 size i64 slots on the device
};

// InputError for a rank or size NCCL cannot take; otherwise what errors of the rendezvous start with.
std::string checkRendezvous(const NcclOptions& options) {
  if (options.size < 1 || options.size > INT_MAX)
    throw InputError("nccl: size: expected 1 to " + std::to_string(INT_MAX) + " ranks, got " + std::to_string(options.size));
  if (options.rank < 0 || options.rank >= options.size)
    throw InputError("nccl: rank: expected a rank in [0, " + std::to_string(options.size) + "), got " +
                     std::to_string(options.rank));
  return "nccl rendezvous" + (options.label.empty() ? "" : " of " + options.label) + " (rank " +
         std::to_string(options.rank) + " of " + std::to_string(options.size) + ")";
}

}  // namespace

std::vector<char> exchangeNcclUniqueId(gloo::rendezvous::Store& store, const NcclOptions& options) {
  const std::string what = checkRendezvous(options);
  const NcclLibrary& nccl = ncclLibrary();
  ncclUniqueId id{};
  try {
    if (options.rank == 0) {
      ncclResult_t status = nccl.getUniqueId(&id);
      if (status != ncclSuccess) throw RuntimeError(what + ": ncclGetUniqueId: " + nccl.getErrorString(status));
      std::vector<char> bytes(id.internal, id.internal + sizeof id.internal);
      store.set(options.key, bytes);
      return bytes;
    }
    store.wait({options.key}, options.timeout);
    std::vector<char> bytes = store.get(options.key);
    if (bytes.size() != sizeof id.internal)
      throw RuntimeError(what + ": the store's '" + options.key + "' holds " + std::to_string(bytes.size()) +
                         " bytes, expected an NCCL unique id of " + std::to_string(sizeof id.internal));
    return bytes;
  } catch (const gloo::Exception& error) {
    throw RuntimeError(what + ": waiting for rank 0's NCCL unique id ('" + options.key + "'): " + error.what());
  }
}

int requireNcclDevice(const NcclOptions& options) {
  const std::string what = checkRendezvous(options);
  ncclLibrary();
  int device = options.device;
  cudaError_t status = device < 0 ? cudaGetDevice(&device) : cudaSetDevice(device);
  if (status == cudaSuccess) status = cudaFree(nullptr);  // creates the context: fails here on a bad device
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw RuntimeError(what + ": --backend cuda with several ranks needs a usable CUDA device: " + cudaErrorText(status));
  }
  return device;
}

std::unique_ptr<Communicator> createNcclCommunicator(gloo::rendezvous::Store& store, const NcclOptions& options) {
  const std::string what = checkRendezvous(options);
  const NcclLibrary& nccl = ncclLibrary();
  const int device = requireNcclDevice(options);

  const std::vector<char> idBytes = exchangeNcclUniqueId(store, options);
  ncclUniqueId id{};
  std::memcpy(id.internal, idBytes.data(), sizeof id.internal);
  ncclComm_t comm = nullptr;
  ncclResult_t result = nccl.commInitRank(&comm, static_cast<int>(options.size), id, static_cast<int>(options.rank));
  if (result != ncclSuccess) {
    const char* detail = nccl.getLastError(nullptr);
    throw RuntimeError(what + " on device " + std::to_string(device) + ": ncclCommInitRank: " +
                       nccl.getErrorString(result) + (detail != nullptr && *detail ? ": " + std::string(detail) : ""));
  }
  return std::make_unique<NcclCommunicator>(nccl, comm, device, options.rank, options.size, options.label);
}

}  // namespace dgemma
