#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "runtime/comm/GlooCommunicator.h"
#include "support/Error.h"

namespace dgemma {
namespace {

using namespace std::chrono_literals;

// Runs `body` on `size` ranks, each a thread with its own communicator, meeting through one
// HashStore. A rank's exception fails the test with that rank's message.
void runRanks(int64_t size, const std::function<void(Communicator&)>& body) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::string> failures(static_cast<size_t>(size));
  std::vector<std::thread> ranks;
  for (int64_t rank = 0; rank < size; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        std::unique_ptr<Communicator> communicator = createGlooCommunicator(store, rank, size, 10s);
        body(*communicator);
      } catch (const std::exception& error) {
        failures[static_cast<size_t>(rank)] = error.what();
      }
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (int64_t rank = 0; rank < size; ++rank) EXPECT_EQ(failures[static_cast<size_t>(rank)], "") << "rank " << rank;
}

class GlooRanksTest : public ::testing::TestWithParam<int64_t> {
 protected:
  int64_t size() const { return GetParam(); }
};

// Rank r contributes ±(r + 1) * (i + 1), the sign alternating with i, so that sum, max and min all
// differ and depend on every rank.
template <typename T>
std::vector<T> contribution(int64_t rank, int64_t count) {
  std::vector<T> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = static_cast<T>((i % 2 ? -1 : 1) * (rank + 1) * (i + 1));
  return values;
}

template <typename T>
void expectAllReduce(Communicator& communicator, ExecContext& context, DType dtype) {
  // Not a multiple of the group size, and long enough that the ring splits it into several chunks.
  const int64_t count = 1001;
  const int64_t size = communicator.size();
  std::vector<T> sum = contribution<T>(communicator.rank(), count);
  std::vector<T> max = sum, min = sum;
  communicator.allReduce(context, sum.data(), count, dtype, ReduceOp::Sum);
  communicator.allReduce(context, max.data(), count, dtype, ReduceOp::Max);
  communicator.allReduce(context, min.data(), count, dtype, ReduceOp::Min);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t sign = i % 2 ? -1 : 1;
    ASSERT_EQ(sum[i], static_cast<T>(sign * (i + 1) * size * (size + 1) / 2)) << "element " << i;
    ASSERT_EQ(max[i], static_cast<T>(sign > 0 ? size * (i + 1) : -(i + 1))) << "element " << i;
    ASSERT_EQ(min[i], static_cast<T>(sign > 0 ? (i + 1) : -size * (i + 1))) << "element " << i;
  }
}

TEST_P(GlooRanksTest, AllReduceSumMaxMinForF32F64I64) {
  runRanks(size(), [&](Communicator& communicator) {
    EXPECT_EQ(communicator.size(), size());
    ExecContext context;
    expectAllReduce<float>(communicator, context, DType::F32);
    expectAllReduce<double>(communicator, context, DType::F64);
    expectAllReduce<int64_t>(communicator, context, DType::I64);
  });
}

TEST_P(GlooRanksTest, AllReduceI32AndBf16) {
  runRanks(size(), [&](Communicator& communicator) {
    ExecContext context;
    std::vector<int32_t> integers = {static_cast<int32_t>(communicator.rank()), -7};
    communicator.allReduce(context, integers.data(), 2, DType::I32, ReduceOp::Sum);
    EXPECT_EQ(integers, (std::vector<int32_t>{static_cast<int32_t>(size() * (size() - 1) / 2),
                                              static_cast<int32_t>(-7 * size())}));

    // 0.5 * (r + 1) is exact in bf16, and so are the sums.
    std::vector<uint16_t> halves = {f32ToBf16Bits(0.5f * static_cast<float>(communicator.rank() + 1))};
    std::vector<uint16_t> largest = halves;
    communicator.allReduce(context, halves.data(), 1, DType::BF16, ReduceOp::Sum);
    communicator.allReduce(context, largest.data(), 1, DType::BF16, ReduceOp::Max);
    EXPECT_EQ(bf16BitsToF32(halves[0]), 0.25f * static_cast<float>(size() * (size() + 1)));
    EXPECT_EQ(bf16BitsToF32(largest[0]), 0.5f * static_cast<float>(size()));
  });
}

TEST_P(GlooRanksTest, AllGatherOrdersBlocksByRank) {
  runRanks(size(), [&](Communicator& communicator) {
    ExecContext context;
    const int64_t rank = communicator.rank();
    const std::vector<double> send = {100.0 * rank, 100.0 * rank + 1, 100.0 * rank + 2};
    std::vector<double> gathered(static_cast<size_t>(3 * size()), -1);
    communicator.allGather(context, send.data(), gathered.data(), 3, DType::F64);
    for (int64_t source = 0; source < size(); ++source)
      for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(gathered[source * 3 + i], 100.0 * source + i);

    // Gathering moves bytes, so dtypes without arithmetic work too.
    const uint8_t flag = static_cast<uint8_t>(rank % 2);
    std::vector<uint8_t> flags(static_cast<size_t>(size()), 7);
    communicator.allGather(context, &flag, flags.data(), 1, DType::Bool);
    for (int64_t source = 0; source < size(); ++source) EXPECT_EQ(flags[source], source % 2);
  });
}

TEST_P(GlooRanksTest, ReduceScatterGivesEachRankItsReducedBlock) {
  runRanks(size(), [&](Communicator& communicator) {
    ExecContext context;
    const int64_t rank = communicator.rank();
    const int64_t count = 3;
    // Element i of block b on rank r is 1000 r + 10 b + i.
    std::vector<float> send(static_cast<size_t>(count * size()));
    std::vector<int64_t> sendIntegers(send.size());
    for (int64_t block = 0; block < size(); ++block)
      for (int64_t i = 0; i < count; ++i) {
        send[block * count + i] = static_cast<float>(1000 * rank + 10 * block + i);
        sendIntegers[block * count + i] = 1000 * rank + 10 * block + i;
      }
    std::vector<float> summed(count, -1);
    std::vector<int64_t> largest(count, -1);
    communicator.reduceScatter(context, send.data(), summed.data(), count, DType::F32, ReduceOp::Sum);
    communicator.reduceScatter(context, sendIntegers.data(), largest.data(), count, DType::I64, ReduceOp::Max);
    for (int64_t i = 0; i < count; ++i) {
      EXPECT_EQ(summed[i], static_cast<float>(1000 * size() * (size() - 1) / 2 + size() * (10 * rank + i)));
      EXPECT_EQ(largest[i], 1000 * (size() - 1) + 10 * rank + i);
    }
  });
}

TEST_P(GlooRanksTest, BroadcastFromTheLastRank) {
  runRanks(size(), [&](Communicator& communicator) {
    ExecContext context;
    const int64_t root = size() - 1;
    const bool isRoot = communicator.rank() == root;
    std::vector<float> values = isRoot ? std::vector<float>{3.5f, -1, 42} : std::vector<float>(3, 0);
    std::vector<uint16_t> bf16 = {f32ToBf16Bits(isRoot ? 1.25f : 0.0f)};
    communicator.broadcast(context, values.data(), 3, DType::F32, root);
    communicator.broadcast(context, bf16.data(), 1, DType::BF16, root);
    EXPECT_EQ(values, (std::vector<float>{3.5f, -1, 42}));
    EXPECT_EQ(bf16BitsToF32(bf16[0]), 1.25f);
    EXPECT_THROW(communicator.broadcast(context, values.data(), 3, DType::F32, size()), InputError);
  });
}

TEST_P(GlooRanksTest, BarrierWaitsForTheSlowestRank) {
  std::atomic<int64_t> arrived = 0;
  runRanks(size(), [&](Communicator& communicator) {
    if (communicator.rank() == 0) std::this_thread::sleep_for(100ms);
    ++arrived;
    communicator.barrier();
    EXPECT_EQ(arrived.load(), size());
  });
}

TEST_P(GlooRanksTest, ManyConsecutiveCollectivesStayInStep) {
  runRanks(size(), [&](Communicator& communicator) {
    ExecContext context;
    const int64_t rank = communicator.rank();
    for (int64_t step = 0; step < 100; ++step) {
      std::vector<int64_t> value = {step * 10 + rank};
      communicator.allReduce(context, value.data(), 1, DType::I64, ReduceOp::Sum);
      ASSERT_EQ(value[0], size() * step * 10 + size() * (size() - 1) / 2) << "step " << step;

      std::vector<int32_t> gathered(static_cast<size_t>(size()));
      const int32_t mine = static_cast<int32_t>(step + rank);
      communicator.allGather(context, &mine, gathered.data(), 1, DType::I32);
      for (int64_t source = 0; source < size(); ++source) ASSERT_EQ(gathered[source], step + source);

      const int64_t root = step % size();
      double broadcast = rank == root ? static_cast<double>(step) : -1.0;
      communicator.broadcast(context, &broadcast, 1, DType::F64, root);
      ASSERT_EQ(broadcast, static_cast<double>(step));
    }
    communicator.barrier();
  });
}

TEST_P(GlooRanksTest, EmptyCollectivesCompleteAndKeepRanksInStep) {
  runRanks(size(), [&](Communicator& communicator) {
    ExecContext context;
    float unused = 5;
    communicator.allReduce(context, &unused, 0, DType::F32, ReduceOp::Sum);
    communicator.allGather(context, &unused, &unused, 0, DType::F32);
    communicator.reduceScatter(context, &unused, &unused, 0, DType::F32, ReduceOp::Sum);
    communicator.broadcast(context, &unused, 0, DType::F32, size() - 1);
    EXPECT_EQ(unused, 5);
    int64_t one = 1;
    communicator.allReduce(context, &one, 1, DType::I64, ReduceOp::Sum);
    EXPECT_EQ(one, size());
  });
}

TEST_P(GlooRanksTest, ReductionsOfUnsupportedDTypesThrowOnEveryRank) {
  runRanks(size(), [&](Communicator& communicator) {
    ExecContext context;
    std::vector<uint8_t> bytes(static_cast<size_t>(size()), 1);
    uint8_t block = 0;
    EXPECT_THROW(communicator.allReduce(context, bytes.data(), 1, DType::U8, ReduceOp::Sum), RuntimeError);
    EXPECT_THROW(communicator.reduceScatter(context, bytes.data(), &block, 1, DType::I8, ReduceOp::Max), RuntimeError);
    // The rejected calls exchanged nothing, so the ranks are still in step.
    communicator.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooRanksTest, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int64_t>& info) { return std::to_string(info.param); });

TEST(GlooCommunicatorTest, RejectsRankOutsideTheGroup) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  EXPECT_THROW(createGlooCommunicator(store, 2, 2, 1s), InputError);
  EXPECT_THROW(createGlooCommunicator(store, -1, 2, 1s), InputError);
  EXPECT_THROW(createGlooCommunicator(store, 0, 0, 1s), InputError);
}

TEST(GlooCommunicatorTest, RejectsAnUnresolvableHostname) {
  GlooOptions options;
  options.storeDirectory = (std::filesystem::temp_directory_path() / "dgemma-gloo-unused-store").string();
  options.hostname = "no-such-host.invalid";  // .invalid never resolves (RFC 6761)
  try {
    createGlooCommunicator(options);
    FAIL() << "expected an InputError";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("cannot resolve 'no-such-host.invalid'"), std::string::npos)
        << error.what();
  }
  std::filesystem::remove_all(options.storeDirectory);
}

// One rank of the forked test; returns the process exit status (0 = every check passed).
int runForkedRank(const std::string& storeDirectory, int64_t rank) {
  try {
    GlooOptions options;
    options.storeDirectory = storeDirectory;
    options.prefix = "forked";
    options.rank = rank;
    options.size = 2;
    options.timeout = 10s;
    std::unique_ptr<Communicator> communicator = createGlooCommunicator(options);
    ExecContext context;
    float sum = static_cast<float>(rank + 1);
    communicator->allReduce(context, &sum, 1, DType::F32, ReduceOp::Sum);
    if (sum != 3.0f) return 10;
    std::vector<int64_t> gathered(2, -1);
    const int64_t mine = 7 * rank;
    communicator->allGather(context, &mine, gathered.data(), 1, DType::I64);
    if (gathered != std::vector<int64_t>{0, 7}) return 11;
    double fromRoot = rank == 1 ? 2.5 : 0.0;
    communicator->broadcast(context, &fromRoot, 1, DType::F64, 1);
    if (fromRoot != 2.5) return 12;
    communicator->barrier();
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %ld: %s\n", static_cast<long>(rank), error.what());
    return 20;
  }
}

TEST(GlooCommunicatorTest, TwoForkedProcessesMeetThroughAFileStore) {
  std::string pattern = (std::filesystem::temp_directory_path() / "dgemma-gloo-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  // The store lives in a subdirectory that the communicator itself has to create.
  const std::string storeDirectory = pattern + "/store";

  // This test's process starts no threads before forking; each child builds its own communicator.
  std::vector<pid_t> children;
  for (int64_t rank = 0; rank < 2; ++rank) {
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::alarm(60);  // a child that hangs dies instead of hanging the test
      ::_exit(runForkedRank(storeDirectory, rank));
    }
    children.push_back(child);
  }
  for (size_t rank = 0; rank < children.size(); ++rank) {
    int status = 0;
    ASSERT_EQ(::waitpid(children[rank], &status, 0), children[rank]);
    EXPECT_TRUE(WIFEXITED(status)) << "rank " << rank << " did not exit normally (status " << status << ")";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "rank " << rank;
  }
  std::filesystem::remove_all(pattern);
}

}  // namespace
}  // namespace dgemma
