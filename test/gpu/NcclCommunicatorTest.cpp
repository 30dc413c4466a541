// The NCCL communicator (runtime/comm/NcclCommunicator.h) on device buffers of the CUDA backend:
// every collective the plan's collective steps use, with one rank per process (world size 1, any
// GPU) and with two ranks as threads of this process, each on its own GPU (skipped with fewer than
// two devices); and a collective on a second plan stream ordered by events, as the executor runs a
// step scheduled on a communication stream.
//
// Skips (GTEST_SKIP, naming the reason) without a usable CUDA device.
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "runtime/backends/cuda/CudaBackend.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/NcclCommunicator.h"
#include "runtime/kernel_api/Backend.h"
#include "support/DType.h"
#include "support/Error.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

using namespace std::chrono_literals;

int usableDevices(std::string* reason) {
  if (!cudaDeviceAvailable(reason)) return 0;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

// A device buffer of the backend holding `values`.
template <typename T>
class DeviceVector {
 public:
  DeviceVector(Backend& backend, const std::vector<T>& values) : backend_(backend), count_(values.size()) {
    data_ = backend_.allocate(bytes(), 256);
    backend_.copyToDevice(data_, values.data(), bytes());
  }
  ~DeviceVector() { backend_.deallocate(data_); }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;

  void* data() const { return data_; }
  std::vector<T> read() {
    backend_.synchronize();
    std::vector<T> values(count_);
    backend_.copyToHost(values.data(), data_, bytes());
    return values;
  }

 private:
  uint64_t bytes() const { return count_ * sizeof(T); }
  Backend& backend_;
  size_t count_;
  void* data_ = nullptr;
};

// One rank: its backend on device `rank` and its NCCL communicator.
struct Rank {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> communicator;
};

// Runs body(rank) on `size` threads, rank r on device r, meeting through one HashStore; a rank's
// exception fails the test with that rank's message.
void runRanks(int64_t size, const std::function<void(Rank&)>& body) {
  const std::vector<std::string> failures =
      test::runOnRanks(size, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>& store) {
        Rank self;
        self.backend = createCudaBackend(rank);
        NcclOptions options;
        options.rank = rank;
        options.size = size;
        options.device = static_cast<int>(rank);
        options.timeout = 60s;
        options.label = "the test group";
        self.communicator = createNcclCommunicator(*store, options);
        body(self);
      });
  for (int64_t rank = 0; rank < size; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
}

// Rank r contributes ±(r + 1)(i + 1), the sign alternating with i, so that sum, max and min differ.
std::vector<float> contribution(int64_t rank, int64_t count) {
  std::vector<float> values;
  for (int64_t i = 0; i < count; ++i) values.push_back(static_cast<float>((i % 2 ? -1 : 1) * (rank + 1) * (i + 1)));
  return values;
}

// Every collective over `rank`'s group, checked against the values computed here on the host.
void checkEveryCollective(Rank& rank) {
  Backend& backend = *rank.backend;
  Communicator& group = *rank.communicator;
  const int64_t size = group.size(), self = group.rank(), count = 5;
  ExecContext context = backend.context(0);

  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    DeviceVector<float> data(backend, contribution(self, count));
    group.allReduce(context, data.data(), count, DType::F32, op);
    std::vector<float> expected = contribution(0, count);
    for (int64_t peer = 1; peer < size; ++peer) {
      std::vector<float> theirs = contribution(peer, count);
      for (int64_t i = 0; i < count; ++i)
        expected[i] = op == ReduceOp::Sum ? expected[i] + theirs[i]
                      : op == ReduceOp::Max ? std::max(expected[i], theirs[i])
                                            : std::min(expected[i], theirs[i]);
    }
    EXPECT_EQ(data.read(), expected) << "allReduce op " << static_cast<int>(op);
  }

  {  // bf16 sums: 1.5 + 1.5 (+ ...) is exact in bf16
    std::vector<uint16_t> halves(3, f32ToBf16Bits(1.5f));
    DeviceVector<uint16_t> data(backend, halves);
    group.allReduce(context, data.data(), 3, DType::BF16, ReduceOp::Sum);
    for (uint16_t bits : data.read()) EXPECT_EQ(bf16BitsToF32(bits), 1.5f * static_cast<float>(size));
  }

  {  // all_gather of i64 moves bytes
    DeviceVector<int64_t> send(backend, {10 * self, 10 * self + 1});
    DeviceVector<int64_t> recv(backend, std::vector<int64_t>(2 * size, -1));
    group.allGather(context, send.data(), recv.data(), 2, DType::I64);
    std::vector<int64_t> expected;
    for (int64_t peer = 0; peer < size; ++peer) expected.insert(expected.end(), {10 * peer, 10 * peer + 1});
    EXPECT_EQ(recv.read(), expected);
  }

  {  // reduce_scatter: rank r keeps the sum of block r
    std::vector<double> input;
    for (int64_t i = 0; i < 2 * size; ++i) input.push_back(static_cast<double>(i + self));
    DeviceVector<double> send(backend, input);
    DeviceVector<double> recv(backend, {0, 0});
    group.reduceScatter(context, send.data(), recv.data(), 2, DType::F64, ReduceOp::Sum);
    const double offsets = static_cast<double>(size * (size - 1) / 2);
    EXPECT_EQ(recv.read(), (std::vector<double>{static_cast<double>(size * 2 * self) + offsets,
                                                static_cast<double>(size * (2 * self + 1)) + offsets}));
  }

  for (int64_t root = 0; root < size; ++root) {
    DeviceVector<int32_t> data(backend, {static_cast<int32_t>(100 * self + 1), static_cast<int32_t>(100 * self + 2)});
    group.broadcast(context, data.data(), 2, DType::I32, root);
    EXPECT_EQ(data.read(), (std::vector<int32_t>{static_cast<int32_t>(100 * root + 1), static_cast<int32_t>(100 * root + 2)}));

    DeviceVector<float> summed(backend, {static_cast<float>(self + 1), 2.0f});
    group.reduceToRoot(context, summed.data(), 2, DType::F32, root);
    const float total = static_cast<float>(size * (size + 1) / 2);
    EXPECT_EQ(summed.read(), self == root ? (std::vector<float>{total, 2.0f * size}) : (std::vector<float>{0, 0}))
        << "reduceToRoot root " << root;
  }

  {  // ragged all-to-all: rank s sends (s + 2 d) mod 3 + 1 elements to d, blocks in reverse rank order
     // on the send side and with a one-element gap on the receive side
    auto elementsFrom = [](int64_t source, int64_t destination) { return (source + 2 * destination) % 3 + 1; };
    std::vector<int64_t> sendCounts(size), sendOffsets(size);
    int64_t sendTotal = 0;
    for (int64_t peer = size - 1; peer >= 0; --peer) {
      sendCounts[peer] = elementsFrom(self, peer);
      sendOffsets[peer] = sendTotal;
      sendTotal += sendCounts[peer];
    }
    std::vector<float> sendValues(sendTotal);
    for (int64_t peer = 0; peer < size; ++peer)
      for (int64_t i = 0; i < sendCounts[peer]; ++i) sendValues[sendOffsets[peer] + i] = static_cast<float>(100 * self + 10 * peer + i);

    const std::vector<int64_t> recvCounts = group.exchangeCounts(sendCounts);
    std::vector<int64_t> recvOffsets(size);
    int64_t recvTotal = 0;
    for (int64_t peer = 0; peer < size; ++peer) {
      ASSERT_EQ(recvCounts[peer], elementsFrom(peer, self)) << "count from rank " << peer;
      recvOffsets[peer] = recvTotal;
      recvTotal += recvCounts[peer] + 1;
    }
    DeviceVector<float> send(backend, sendValues);
    DeviceVector<float> recv(backend, std::vector<float>(recvTotal, -1.0f));
    group.allToAllV(context, send.data(), sendCounts, sendOffsets, recv.data(), recvCounts, recvOffsets, DType::F32);
    std::vector<float> expected(recvTotal, -1.0f);
    for (int64_t peer = 0; peer < size; ++peer)
      for (int64_t i = 0; i < recvCounts[peer]; ++i)
        expected[recvOffsets[peer] + i] = static_cast<float>(100 * peer + 10 * self + i);
    EXPECT_EQ(recv.read(), expected);
  }

  group.barrier();
  EXPECT_THROW(group.broadcast(context, nullptr, 1, DType::F32, size), InputError);
  EXPECT_THROW(group.allReduce(context, nullptr, 1, DType::Bool, ReduceOp::Sum), RuntimeError);
}

TEST(NcclCommunicatorTest, EveryCollectiveWithOneRank) {
  std::string reason;
  if (usableDevices(&reason) < 1) GTEST_SKIP() << "no usable CUDA device: " << reason;
  runRanks(1, checkEveryCollective);
}

TEST(NcclCommunicatorTest, EveryCollectiveWithTwoRanksOnTwoGpus) {
  std::string reason;
  const int devices = usableDevices(&reason);
  if (devices < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << devices << (reason.empty() ? "" : ": " + reason);
  runRanks(2, checkEveryCollective);
}

// The executor's shape of a collective on a communication stream: stream 0 produces the input and
// signals event 0; stream 1 waits for it, runs the collective and signals event 1; stream 0 waits
// for that before it reads the result. A long copy queued first on stream 0 makes a missing wait
// visible (the collective would gather stale bytes).
TEST(NcclCommunicatorTest, ACollectiveOnASecondStreamIsOrderedByEvents) {
  std::string reason;
  if (usableDevices(&reason) < 1) GTEST_SKIP() << "no usable CUDA device: " << reason;
  runRanks(1, [](Rank& rank) {
    Backend& backend = *rank.backend;
    backend.prepareStreams(2, 2);
    constexpr int64_t kCount = 1 << 24;
    std::vector<float> ones(kCount, 1.0f);
    DeviceVector<float> source(backend, ones);
    DeviceVector<float> input(backend, std::vector<float>(kCount, 0.0f));
    DeviceVector<float> gathered(backend, std::vector<float>(kCount, 0.0f));
    DeviceVector<float> result(backend, std::vector<float>(kCount, 0.0f));
    backend.synchronize();

    ExecContext compute = backend.context(0);
    ExecContext communication = backend.context(1);
    backend.copyOnDevice(compute, input.data(), source.data(), kCount * sizeof(float));
    backend.recordEvent(0, 0);
    backend.waitEvent(0, 1);
    rank.communicator->allGather(communication, input.data(), gathered.data(), kCount, DType::F32);
    backend.recordEvent(1, 1);
    backend.waitEvent(1, 0);
    backend.copyOnDevice(compute, result.data(), gathered.data(), kCount * sizeof(float));
    EXPECT_EQ(result.read(), ones);
  });
}

}  // namespace
}  // namespace dgemma
