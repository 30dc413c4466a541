#include "runtime/comm/GlooCommunicator.h"
#include "runtime/comm/PeerLostError.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <vector>

#include "support/Error.h"

namespace dgemma {

namespace {

using ReduceFunction = gloo::AllreduceOptions::Func;

// An elementwise reduction of `Element`s computed in the type `load` returns. Gloo may pass `out`
// equal to either input, which an elementwise loop tolerates.
template <typename Element, typename Load, typename Store>
ReduceFunction makeReduceFunction(ReduceOp op, Load load, Store store) {
  auto elementwise = [&](auto combine) -> ReduceFunction {
    return [=](void* out, const void* first, const void* second, size_t count) {
      auto* result = static_cast<Element*>(out);
      const auto* a = static_cast<const Element*>(first);
      const auto* b = static_cast<const Element*>(second);
      for (size_t i = 0; i < count; ++i) result[i] = store(combine(load(a[i]), load(b[i])));
    };
  };
  switch (op) {
    case ReduceOp::Sum: return elementwise([](auto x, auto y) { return x + y; });
    case ReduceOp::Max: return elementwise([](auto x, auto y) { return std::max(x, y); });
    case ReduceOp::Min: return elementwise([](auto x, auto y) { return std::min(x, y); });
  }
  throw std::logic_error("unknown ReduceOp");
}

template <typename Element>
ReduceFunction makeNativeReduceFunction(ReduceOp op) {
  auto same = [](Element value) { return value; };
  return makeReduceFunction<Element>(op, same, same);
}

ReduceFunction reduceFunctionFor(DType dtype, ReduceOp op, const std::string& collective) {
  switch (dtype) {
    case DType::F32: return makeNativeReduceFunction<float>(op);
    case DType::F64: return makeNativeReduceFunction<double>(op);
    case DType::I64: return makeNativeReduceFunction<int64_t>(op);
    case DType::I32: return makeNativeReduceFunction<int32_t>(op);
    case DType::BF16: return makeReduceFunction<uint16_t>(op, bf16BitsToF32, f32ToBf16Bits);
    default:
      throw RuntimeError("gloo " + collective + ": dtype " + std::string(dtypeName(dtype)) +
                         " is not supported (f32, f64, i64, i32, bf16 are)");
  }
}

// Gloo reports I/O failures and timeouts (a peer that went away or fell silent) as
// gloo::IoException, its other failures as gloo::Exception, and failed internal checks as
// EnforceNotMet, which is not a gloo::Exception.
template <typename Body>
void translateGlooErrors(const std::string& what, Body&& body) {
  try {
    body();
  } catch (const gloo::IoException& error) {
    throw PeerLostError(what + ": " + error.what());
  } catch (const gloo::Exception& error) {
    throw RuntimeError(what + ": " + error.what());
  } catch (const gloo::EnforceNotMet& error) {
    throw RuntimeError(what + ": " + error.what());
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, std::string label)
      : context_(std::move(context)), label_(std::move(label)) {}

  int64_t rank() const override { return context_->rank; }
  int64_t size() const override { return context_->size; }

  void allReduce(ExecContext&, void* data, int64_t count, DType dtype, ReduceOp op) override {
    allReduceInPlace("allReduce", data, count, dtype, op);
  }

  void allGather(ExecContext&, const void* send, void* recv, int64_t count, DType dtype) override {
    if (count == 0) return;  // Gloo's allgather divides by the input size
    const size_t bytes = static_cast<size_t>(count) * dtypeSize(dtype);
    runCollective("allGather", [&] {
      gloo::AllgatherOptions options(context_);
      // Gloo's API takes a mutable pointer for the input but only reads it.
      options.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), bytes);
      options.setOutput(static_cast<uint8_t*>(recv), bytes * static_cast<size_t>(size()));
      options.setTag(takeTag());
      gloo::allgather(options);
    });
  }

  // Gloo 0.5 has no reduce-scatter with the options API, so this all-reduces a copy of the whole
  // input and keeps this rank's block: size() times the traffic of a true reduce-scatter, which is
  // acceptable for the CPU runs this communicator serves.
  void reduceScatter(ExecContext&, const void* send, void* recv, int64_t count, DType dtype, ReduceOp op) override {
    if (count == 0) return;
    const size_t blockBytes = static_cast<size_t>(count) * dtypeSize(dtype);
    const auto* sendBytes = static_cast<const uint8_t*>(send);
    std::vector<uint8_t> reduced(sendBytes, sendBytes + blockBytes * static_cast<size_t>(size()));
    allReduceInPlace("reduceScatter", reduced.data(), count * size(), dtype, op);
    std::memcpy(recv, reduced.data() + blockBytes * static_cast<size_t>(rank()), blockBytes);
  }

  void broadcast(ExecContext&, void* data, int64_t count, DType dtype, int64_t root) override {
    checkRoot("broadcast", root);
    if (count == 0) return;  // every rank has the same count, so all skip alike
    const size_t bytes = static_cast<size_t>(count) * dtypeSize(dtype);
    runCollective("broadcast", [&] {
      gloo::BroadcastOptions options(context_);
      options.setOutput(static_cast<uint8_t*>(data), bytes);
      options.setRoot(static_cast<int>(root));
      options.setTag(takeTag());
      gloo::broadcast(options);
    });
  }

  // Gloo has a true reduce, but the in-place all-reduce already handles every dtype and bf16
  // rounding; this is (size() - 1) times the traffic the root needs, acceptable for CPU runs.
  void reduceToRoot(ExecContext&, void* data, int64_t count, DType dtype, int64_t root) override {
    checkRoot("reduceToRoot", root);
    if (count == 0) return;
    allReduceInPlace("reduceToRoot", data, count, dtype, ReduceOp::Sum);
    if (rank() != root) std::memset(data, 0, static_cast<size_t>(count) * dtypeSize(dtype));
  }

  std::vector<int64_t> exchangeCounts(const std::vector<int64_t>& sendCounts) override {
    checkPerRank("exchangeCounts", "sendCounts", sendCounts);
    std::vector<int64_t> input = sendCounts;  // Gloo's API takes a mutable pointer for the input
    std::vector<int64_t> received(static_cast<size_t>(size()));
    runCollective("exchangeCounts", [&] {
      gloo::AlltoallOptions options(context_);
      options.setInput(input.data(), input.size());
      options.setOutput(received.data(), received.size());
      options.setTag(takeTag());
      gloo::alltoall(options);
    });
    return received;
  }

  // gloo::alltoallv takes each side's blocks back to back in rank order; blocks laid out otherwise
  // go through a staging copy on that side.
  void allToAllV(ExecContext&, const void* send, const std::vector<int64_t>& sendCounts,
                 const std::vector<int64_t>& sendOffsets, void* recv, const std::vector<int64_t>& recvCounts,
                 const std::vector<int64_t>& recvOffsets, DType dtype) override {
    for (const auto& [name, values] : {std::pair{"sendCounts", &sendCounts}, {"sendOffsets", &sendOffsets},
                                       {"recvCounts", &recvCounts}, {"recvOffsets", &recvOffsets}})
      checkPerRank("allToAllV", name, *values);
    const size_t elementBytes = dtypeSize(dtype);
    std::vector<int64_t> sendBytes = scaled(sendCounts, elementBytes), recvBytes = scaled(recvCounts, elementBytes);

    std::vector<uint8_t> sendStage, recvStage;
    std::optional<int64_t> sendBase = packedBase(sendCounts, sendOffsets);
    auto* sendPointer = const_cast<uint8_t*>(static_cast<const uint8_t*>(send));  // Gloo only reads it
    if (sendBase) {
      sendPointer += static_cast<size_t>(*sendBase) * elementBytes;
    } else {
      for (int64_t peer = 0; peer < size(); ++peer) {
        const uint8_t* block = static_cast<const uint8_t*>(send) + static_cast<size_t>(sendOffsets[peer]) * elementBytes;
        sendStage.insert(sendStage.end(), block, block + sendBytes[peer]);
      }
      sendPointer = sendStage.data();
    }
    std::optional<int64_t> recvBase = packedBase(recvCounts, recvOffsets);
    uint8_t* recvPointer = static_cast<uint8_t*>(recv);
    if (recvBase) {
      recvPointer += static_cast<size_t>(*recvBase) * elementBytes;
    } else {
      recvStage.resize(static_cast<size_t>(std::accumulate(recvBytes.begin(), recvBytes.end(), int64_t{0})));
      recvPointer = recvStage.data();
    }

    runCollective("allToAllV", [&] {
      gloo::AlltoallvOptions options(context_);
      options.setInput(sendPointer, sendBytes);
      options.setOutput(recvPointer, recvBytes);
      options.setTag(takeTag());
      gloo::alltoallv(options);
    });

    if (!recvBase) {
      const uint8_t* block = recvStage.data();
      for (int64_t peer = 0; peer < size(); ++peer) {
        std::memcpy(static_cast<uint8_t*>(recv) + static_cast<size_t>(recvOffsets[peer]) * elementBytes, block,
                    static_cast<size_t>(recvBytes[peer]));
        block += recvBytes[peer];
      }
    }
  }

  void barrier() override {
    runCollective("barrier", [&] {
      gloo::BarrierOptions options(context_);
      options.setTag(takeTag());
      gloo::barrier(options);
    });
  }

 private:
  void checkRoot(const std::string& collective, int64_t root) const {
    if (root < 0 || root >= size())
      throw InputError("gloo " + collective + ": root: expected a rank in [0, " + std::to_string(size()) + "), got " +
                       std::to_string(root));
  }

  void checkPerRank(const std::string& collective, const std::string& name, const std::vector<int64_t>& values) const {
    if (static_cast<int64_t>(values.size()) != size())
      throw InputError("gloo " + collective + ": " + name + ": expected " + std::to_string(size()) +
                       " entries (one per rank), got " + std::to_string(values.size()));
    for (int64_t value : values)
      if (value < 0)
        throw InputError("gloo " + collective + ": " + name + ": expected non-negative entries, got " +
                         std::to_string(value));
  }

  static std::vector<int64_t> scaled(const std::vector<int64_t>& counts, size_t factor) {
    std::vector<int64_t> result;
    for (int64_t count : counts) result.push_back(count * static_cast<int64_t>(factor));
    return result;
  }

  // The offset of the first block when the non-empty blocks sit back to back in rank order (what
  // gloo::alltoallv reads and writes), none otherwise.
  static std::optional<int64_t> packedBase(const std::vector<int64_t>& counts, const std::vector<int64_t>& offsets) {
    std::optional<int64_t> base;
    int64_t next = 0;
    for (size_t peer = 0; peer < counts.size(); ++peer) {
      if (counts[peer] == 0) continue;
      if (!base) base = next = offsets[peer];
      if (offsets[peer] != next) return std::nullopt;
      next += counts[peer];
    }
    return base.value_or(0);
  }

  void allReduceInPlace(const std::string& collective, void* data, int64_t count, DType dtype, ReduceOp op) {
    ReduceFunction reduce = reduceFunctionFor(dtype, op, collective);
    // Gloo segments the buffer by element size; any type of the right size does, since `reduce`
    // interprets the elements.
    switch (dtypeSize(dtype)) {
      case 2: return runAllReduce<uint16_t>(collective, data, count, reduce);
      case 4: return runAllReduce<uint32_t>(collective, data, count, reduce);
      case 8: return runAllReduce<uint64_t>(collective, data, count, reduce);
    }
    throw std::logic_error("reducible dtype of unexpected size");
  }

  template <typename SameSizeElement>
  void runAllReduce(const std::string& collective, void* data, int64_t count, const ReduceFunction& reduce) {
    runCollective(collective, [&] {
      gloo::AllreduceOptions options(context_);
      options.setOutput(static_cast<SameSizeElement*>(data), static_cast<size_t>(count));
      options.setReduceFunction(reduce);
      options.setTag(takeTag());
      gloo::allreduce(options);
    });
  }

  template <typename Body>
  void runCollective(const std::string& collective, Body&& body) {
    translateGlooErrors("gloo " + collective + (label_.empty() ? "" : " over " + label_) + " (rank " +
                            std::to_string(rank()) + " of " + std::to_string(size()) + ")",
                        body);
  }

  uint32_t takeTag() { return nextTag_++; }

  std::shared_ptr<gloo::Context> context_;
  std::string label_;
  uint32_t nextTag_ = 0;
};

std::unique_ptr<Communicator> connect(gloo::rendezvous::Store& store, int64_t rank, int64_t size,
                                      std::chrono::milliseconds timeout, const std::string& hostname,
                                      const std::string& label) {
  if (size < 1) throw InputError("gloo: size: expected at least 1 rank, got " + std::to_string(size));
  if (rank < 0 || rank >= size)
    throw InputError("gloo: rank: expected a rank in [0, " + std::to_string(size) + "), got " + std::to_string(rank));
  // Gloo's TCP device crashes on a name that does not resolve, so resolve it here first.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  int resolveStatus = ::getaddrinfo(hostname.c_str(), nullptr, &hints, &addresses);
  if (resolveStatus != 0)
    throw InputError("gloo: hostname: cannot resolve '" + hostname + "': " + ::gai_strerror(resolveStatus));
  ::freeaddrinfo(addresses);

  auto context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(rank), static_cast<int>(size));
  const std::string what = "gloo rendezvous" + (label.empty() ? "" : " of " + label) + " (rank " +
                           std::to_string(rank) + " of " + std::to_string(size) + ")";
  translateGlooErrors(what, [&] {
    gloo::transport::tcp::attr address;
    address.hostname = hostname;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(address);
    context->setTimeout(timeout);
    context->connectFullMesh(store, device);
  });
  return std::make_unique<GlooCommunicator>(std::move(context), label);
}

}  // namespace

std::unique_ptr<Communicator> createGlooCommunicator(const GlooOptions& options) {
  std::error_code error;
  std::filesystem::create_directories(options.storeDirectory, error);
  if (error)
    throw RuntimeError(options.storeDirectory + ": cannot create the gloo store directory: " + error.message());
  gloo::rendezvous::FileStore fileStore(options.storeDirectory);
  return createGlooCommunicator(fileStore, options);
}

std::unique_ptr<Communicator> createGlooCommunicator(gloo::rendezvous::Store& store, const GlooOptions& options) {
  if (options.prefix.empty())
    return connect(store, options.rank, options.size, options.timeout, options.hostname, options.label);
  gloo::rendezvous::PrefixStore prefixedStore(options.prefix, store);
  return connect(prefixedStore, options.rank, options.size, options.timeout, options.hostname, options.label);
}

std::unique_ptr<Communicator> createGlooCommunicator(std::shared_ptr<gloo::rendezvous::Store> store, int64_t rank,
                                                     int64_t size, std::chrono::milliseconds timeout) {
  return connect(*store, rank, size, timeout, "127.0.0.1", "");
}

}  // namespace dgemma
