#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "runtime/kernel_api/Backend.h"
#include "runtime/comm/Communicator.h"
#include "support/Error.h"

namespace dgemma {
namespace {

// A host-memory backend that records the device copies it is asked for.
class RecordingBackend : public Backend {
 public:
  struct Copy {
    int64_t stream;
    void* dst;
    const void* src;
    uint64_t bytes;
  };

  std::string name() const override { return "recording"; }
  uint64_t memoryCapacityBytes() const override { return UINT64_MAX; }
  void* allocate(uint64_t bytes, uint64_t) override { return ::operator new(bytes); }
  void deallocate(void* pointer) override { ::operator delete(pointer); }
  void copyToDevice(void* dst, const void* src, uint64_t bytes) override { std::memcpy(dst, src, bytes); }
  void copyToHost(void* dst, const void* src, uint64_t bytes) override { std::memcpy(dst, src, bytes); }
  void fillZero(void* dst, uint64_t bytes) override { std::memset(dst, 0, bytes); }
  void copyOnDevice(ExecContext& context, void* dst, const void* src, uint64_t bytes) override {
    copies.push_back({context.stream, dst, src, bytes});
    std::memcpy(dst, src, bytes);
  }
  const KernelRegistry& kernels() const override { return registry_; }
  void prepareStreams(int64_t, int64_t) override {}
  ExecContext context(int64_t stream) override { return ExecContext{stream}; }
  void recordEvent(int64_t, int64_t) override {}
  void waitEvent(int64_t, int64_t) override {}
  void synchronize() override {}

  std::vector<Copy> copies;

 private:
  KernelRegistry registry_;
};

TEST(LocalCommunicatorTest, GatherAndReduceScatterCopyThroughTheBackendOnTheStepsStream) {
  RecordingBackend backend;
  LocalCommunicator communicator(backend);
  EXPECT_EQ(communicator.rank(), 0);
  EXPECT_EQ(communicator.size(), 1);
  ExecContext context = backend.context(3);

  const std::vector<double> send = {1.5, -2, 3};
  std::vector<double> gathered(3, 0);
  communicator.allGather(context, send.data(), gathered.data(), 3, DType::F64);
  EXPECT_EQ(gathered, send);

  std::vector<double> scattered(3, 0);
  communicator.reduceScatter(context, send.data(), scattered.data(), 3, DType::F64, ReduceOp::Sum);
  EXPECT_EQ(scattered, send);

  ASSERT_EQ(backend.copies.size(), 2u);
  for (const RecordingBackend::Copy& copy : backend.copies) {
    EXPECT_EQ(copy.stream, 3);
    EXPECT_EQ(copy.src, send.data());
    EXPECT_EQ(copy.bytes, 3 * sizeof(double));
  }
}

TEST(LocalCommunicatorTest, InPlaceCollectivesCopyNothing) {
  RecordingBackend backend;
  LocalCommunicator communicator(backend);
  ExecContext context = backend.context(0);
  std::vector<float> data = {1, 2};
  communicator.allGather(context, data.data(), data.data(), 2, DType::F32);
  communicator.reduceScatter(context, data.data(), data.data(), 2, DType::F32, ReduceOp::Max);
  communicator.allReduce(context, data.data(), 2, DType::F32, ReduceOp::Sum);
  communicator.broadcast(context, data.data(), 2, DType::F32, 0);
  communicator.barrier();
  EXPECT_TRUE(backend.copies.empty());
  EXPECT_EQ(data, (std::vector<float>{1, 2}));
}

TEST(LocalCommunicatorTest, AllToAllVCopiesTheOwnBlockBetweenItsOffsets) {
  RecordingBackend backend;
  LocalCommunicator communicator(backend);
  ExecContext context = backend.context(2);
  EXPECT_EQ(communicator.exchangeCounts({3}), (std::vector<int64_t>{3}));
  const std::vector<float> send = {9, 1, 2, 3};
  std::vector<float> recv(5, 0);
  communicator.allToAllV(context, send.data(), {3}, {1}, recv.data(), {3}, {2}, DType::F32);
  EXPECT_EQ(recv, (std::vector<float>{0, 0, 1, 2, 3}));
  ASSERT_EQ(backend.copies.size(), 1u);
  EXPECT_EQ(backend.copies[0].stream, 2);
  // Nothing to send copies nothing; counts that disagree are a caller's bug.
  communicator.allToAllV(context, send.data(), {0}, {0}, recv.data(), {0}, {0}, DType::F32);
  EXPECT_EQ(backend.copies.size(), 1u);
  EXPECT_THROW(communicator.allToAllV(context, send.data(), {2}, {0}, recv.data(), {3}, {0}, DType::F32),
               std::invalid_argument);
  // The root of a group of one is the group: its sum is its own data.
  std::vector<float> data = {4, 5};
  communicator.reduceToRoot(context, data.data(), 2, DType::F32, 0);
  EXPECT_EQ(data, (std::vector<float>{4, 5}));
}

TEST(CommunicatorSetTest, FindsCommunicatorsByAxisAndNamesAMissingAxis) {
  RecordingBackend backend;
  CommunicatorSet communicators;
  auto local = std::make_unique<LocalCommunicator>(backend);
  Communicator* dataParallel = local.get();
  communicators.add("dp", std::move(local));
  EXPECT_TRUE(communicators.has("dp"));
  EXPECT_FALSE(communicators.has("tp"));
  EXPECT_EQ(&communicators.axis("dp", "plan.dgplan: step 4"), dataParallel);

  try {
    communicators.axis("tp", "plan.dgplan: step 4");
    FAIL() << "expected an InputError";
  } catch (const InputError& error) {
    EXPECT_STREQ(error.what(), "plan.dgplan: step 4: mesh axis 'tp' has no communicator");
  }
  EXPECT_THROW(communicators.add("dp", std::make_unique<LocalCommunicator>(backend)), std::invalid_argument);
  EXPECT_THROW(communicators.add("ep", nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace dgemma
