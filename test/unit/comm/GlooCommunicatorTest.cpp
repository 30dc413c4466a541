#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <thread>
#include <vector>

#include "runtime/comm/GlooCommunicator.h"
#include "test/unit/comm/GlooRanks.h"
#include "support/Error.h"

namespace dgemma {
namespace {

using namespace std::chrono_literals;

// Runs `body` on `size` ranks, each a thread with its own communicator, meeting through one
// HashStore. A rank's exception fails the test with that rank's message.
void runRanks(int64_t size, const std::function<void(Communicator&)>& body) {
  const std::vector<std::string> failures =
      test::runOnRanks(size, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>& store) {
        std::unique_ptr<Communicator> communicator = createGlooCommunicator(store, rank, size, 10s);
        body(*communicator);
      });
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

TEST_P(GlooRanksTest, ReduceToRootSumsOnTheRootAndZeroesTheOthers) {
  runRanks(size(), [&](Communicator& communicator) {
    ExecContext context;
    const int64_t root = size() - 1, rank = communicator.rank();
    std::vector<double> values = {double(rank + 1), -2.0 * double(rank)};
    communicator.reduceToRoot(context, values.data(), 2, DType::F64, root);
    const double n = double(size());
    if (rank == root) EXPECT_EQ(values, (std::vector<double>{n * (n + 1) / 2, -n * (n - 1)}));
    else EXPECT_EQ(values, (std::vector<double>{0, 0}));
    EXPECT_THROW(communicator.reduceToRoot(context, values.data(), 2, DType::F64, -1), InputError);
  });
}

// A ragged exchange in which rank r sends `count(r, p)` rows of two f32 to rank p; row i of that
// block holds (100 r + 10 p + i, -i). Counts come from the counts exchange.
struct RaggedPattern {
  std::function<int64_t(int64_t source, int64_t destination)> count;

  static float cell(int64_t source, int64_t destination, int64_t row, int64_t column) {
    return column == 0 ? float(100 * source + 10 * destination + row) : -float(row);
  }

  // Sends with the given layout (offsets in rows; blocks back to back when `gap` is 0), checks the
  // exchanged counts and every received row, and that the bytes outside the blocks stay untouched.
  void run(Communicator& communicator, int64_t gap) const {
    ExecContext context;
    const int64_t size = communicator.size(), rank = communicator.rank(), columns = 2;
    std::vector<int64_t> sendCounts, sendOffsets;
    int64_t rows = 0;
    for (int64_t peer = 0; peer < size; ++peer) {
      sendOffsets.push_back(rows);
      sendCounts.push_back(count(rank, peer));
      rows += count(rank, peer) + gap;
    }
    std::vector<float> send(static_cast<size_t>(rows * columns), 7.0f);
    for (int64_t peer = 0; peer < size; ++peer)
      for (int64_t row = 0; row < sendCounts[peer]; ++row)
        for (int64_t column = 0; column < columns; ++column)
          send[(sendOffsets[peer] + row) * columns + column] = cell(rank, peer, row, column);

    std::vector<int64_t> recvCounts = communicator.exchangeCounts(sendCounts);
    std::vector<int64_t> recvOffsets;
    int64_t received = 0;
    for (int64_t peer = 0; peer < size; ++peer) {
      ASSERT_EQ(recvCounts[peer], count(peer, rank)) << "from rank " << peer;
      recvOffsets.push_back(received);
      received += recvCounts[peer] + gap;
    }
    const float untouched = -99.0f;
    std::vector<float> recv(static_cast<size_t>(received * columns), untouched);
    auto elements = [&](std::vector<int64_t> values) {
      for (int64_t& value : values) value *= columns;
      return values;
    };
    communicator.allToAllV(context, send.data(), elements(sendCounts), elements(sendOffsets), recv.data(),
                           elements(recvCounts), elements(recvOffsets), DType::F32);
    for (int64_t peer = 0; peer < size; ++peer) {
      for (int64_t row = 0; row < recvCounts[peer]; ++row)
        for (int64_t column = 0; column < columns; ++column)
          ASSERT_EQ(recv[(recvOffsets[peer] + row) * columns + column], cell(peer, rank, row, column))
              << "rank " << rank << " from " << peer << " row " << row;
      for (int64_t row = recvCounts[peer]; row < recvCounts[peer] + gap; ++row)
        ASSERT_EQ(recv[(recvOffsets[peer] + row) * columns], untouched) << "gap after rank " << peer << "'s block";
    }
  }
};

TEST_P(GlooRanksTest, AllToAllVWithUnevenAndZeroCounts) {
  // (source + 2 destination) mod 3 rows: uneven, with zero blocks, including some to itself.
  RaggedPattern pattern{[](int64_t source, int64_t destination) { return (source + 2 * destination) % 3; }};
  runRanks(size(), [&](Communicator& communicator) {
    pattern.run(communicator, 0);
    pattern.run(communicator, 1);  // blocks with gaps between them go through the staging copies
  });
}

TEST_P(GlooRanksTest, AllToAllVWithARankThatSendsNothing) {
  RaggedPattern pattern{[](int64_t source, int64_t destination) { return source == 0 ? 0 : destination + 1; }};
  runRanks(size(), [&](Communicator& communicator) { pattern.run(communicator, 0); });
}

TEST_P(GlooRanksTest, AllToAllVWhereNobodySendsAnything) {
  RaggedPattern pattern{[](int64_t, int64_t) { return int64_t{0}; }};
  runRanks(size(), [&](Communicator& communicator) {
    pattern.run(communicator, 0);
    communicator.barrier();  // still in step
  });
}

TEST_P(GlooRanksTest, AllToAllVRejectsCountsOfTheWrongLength) {
  runRanks(size(), [&](Communicator& communicator) {
    ExecContext context;
    std::vector<int64_t> tooFew(static_cast<size_t>(size() - 1), 0), right(static_cast<size_t>(size()), 0);
    EXPECT_THROW(communicator.exchangeCounts(tooFew), InputError);
    EXPECT_THROW(communicator.exchangeCounts({-1, 0}), InputError);
    float dummy = 0;
    EXPECT_THROW(communicator.allToAllV(context, &dummy, tooFew, right, &dummy, right, right, DType::F32), InputError);
    communicator.barrier();
  });
}

// The derivative rules pair each collective with its adjoint A^T (docs/architecture.md,
// "Interfaces"): summed over the ranks, <g, A x> must equal <A^T g, x> for any x and g. Each rank
// draws its own x and g; the sums over ranks go through an f64 all-reduce.
class AdjointCheck {
 public:
  explicit AdjointCheck(Communicator& communicator) : communicator_(communicator) {}

  std::vector<double> draw(int64_t count, int64_t salt) const {
    std::vector<double> values(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
      values[i] = std::sin(double(1 + i) * 0.7 + double(communicator_.rank()) * 1.3 + double(salt) * 2.1);
    return values;
  }

  // <a, b> on this rank, summed over the group.
  double groupDot(const std::vector<double>& a, const std::vector<double>& b) {
    double local = 0;
    for (size_t i = 0; i < a.size(); ++i) local += a[i] * b[i];
    communicator_.allReduce(context_, &local, 1, DType::F64, ReduceOp::Sum);
    return local;
  }

  ExecContext& context() { return context_; }

 private:
  Communicator& communicator_;
  ExecContext context_;
};

TEST_P(GlooRanksTest, EachCollectivesDerivativeRuleIsItsAdjoint) {
  runRanks(size(), [&](Communicator& communicator) {
    AdjointCheck check(communicator);
    ExecContext& context = check.context();
    const int64_t n = size(), block = 3;
    const double tolerance = 1e-12;

    // all_gather ⇄ reduce_scatter (sum).
    std::vector<double> x = check.draw(block, 1), gathered(static_cast<size_t>(n * block));
    std::vector<double> g = check.draw(n * block, 2), scattered(static_cast<size_t>(block));
    communicator.allGather(context, x.data(), gathered.data(), block, DType::F64);
    communicator.reduceScatter(context, g.data(), scattered.data(), block, DType::F64, ReduceOp::Sum);
    EXPECT_NEAR(check.groupDot(g, gathered), check.groupDot(scattered, x), tolerance);

    // all_reduce (sum) is its own adjoint.
    std::vector<double> reduced = x, g3 = check.draw(block, 3), g3Reduced = g3;
    communicator.allReduce(context, reduced.data(), block, DType::F64, ReduceOp::Sum);
    communicator.allReduce(context, g3Reduced.data(), block, DType::F64, ReduceOp::Sum);
    EXPECT_NEAR(check.groupDot(g3, reduced), check.groupDot(g3Reduced, x), tolerance);

    // broadcast ⇄ reduce_to_root.
    const int64_t root = n - 1;
    std::vector<double> broadcasted = x, g4 = check.draw(block, 4), g4Reduced = g4;
    communicator.broadcast(context, broadcasted.data(), block, DType::F64, root);
    communicator.reduceToRoot(context, g4Reduced.data(), block, DType::F64, root);
    EXPECT_NEAR(check.groupDot(g4, broadcasted), check.groupDot(g4Reduced, x), tolerance);

    // all_to_all → the reverse all_to_all with the received counts as send counts. Rank r sends
    // (r + p) % 3 rows of one element to p from a capacity of 3n; the rows it does not send have
    // a zero cotangent, which the check's inner product sees through the reverse's zero tail.
    const int64_t capacity = 3 * n;
    std::vector<int64_t> sendCounts;
    for (int64_t peer = 0; peer < n; ++peer) sendCounts.push_back((communicator.rank() + peer) % 3);
    std::vector<int64_t> recvCounts = communicator.exchangeCounts(sendCounts);
    auto packedOffsets = [](const std::vector<int64_t>& counts) {
      std::vector<int64_t> offsets(counts.size(), 0);
      for (size_t p = 1; p < counts.size(); ++p) offsets[p] = offsets[p - 1] + counts[p - 1];
      return offsets;
    };
    std::vector<double> rows = check.draw(capacity, 5), exchanged(static_cast<size_t>(capacity), 0.0);
    communicator.allToAllV(context, rows.data(), sendCounts, packedOffsets(sendCounts), exchanged.data(), recvCounts,
                           packedOffsets(recvCounts), DType::F64);
    std::vector<double> g5 = check.draw(capacity, 6), returned(static_cast<size_t>(capacity), 0.0);
    // The forward's result is zero past its received rows, so only those rows of g5 matter.
    std::vector<int64_t> reverseCounts = communicator.exchangeCounts(recvCounts);
    EXPECT_EQ(reverseCounts, sendCounts);
    communicator.allToAllV(context, g5.data(), recvCounts, packedOffsets(recvCounts), returned.data(), reverseCounts,
                           packedOffsets(reverseCounts), DType::F64);
    EXPECT_NEAR(check.groupDot(g5, exchanged), check.groupDot(returned, rows), tolerance);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooRanksTest, ::testing::Values(2, 3, 4),
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
