#include <gtest/gtest.h>

#include <chrono>

#include "runtime/kernel_api/Backend.h"
#include "support/CheckedSize.h"
#include "support/Error.h"
#include "runtime/comm/GlooCommunicator.h"
#include "test/unit/comm/GlooRanks.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/ForwardingBackend.h"
#include "runtime/exec/TimingBackend.h"
#include "plan/HostArena.h"

namespace dgemma {
namespace {

const char* kEntry = "forward";

// y = softmax(x + w) over the last dim, then z = reshape(y) as a view: exercises kernels, params,
// inputs, outputs and views.
Plan addSoftmaxPlan() {
  Plan plan;
  plan.producer = "test";
  plan.arenas = {{"persistent", true, 64, 64}, {"scratch", false, 256, 64}};
  auto scratch = [&](int64_t id, const char* name, std::vector<int64_t> shape, uint64_t offset, int64_t first,
                     int64_t last) {
    return Buffer{id, name, DType::F32, std::move(shape), 1, offset, Lifetime{kEntry, first, last}, std::nullopt};
  };
  plan.buffers = {
      Buffer{0, "w", DType::F32, {3}, 0, 0, std::nullopt, std::nullopt},
      scratch(1, "x", {2, 3}, 0, 0, 0),
      scratch(2, "sum", {2, 3}, 64, 0, 1),
      scratch(3, "y", {2, 3}, 128, 1, 1),
      scratch(4, "y.view", {6}, 128, 1, 1),
  };
  plan.buffers[4].aliasOf = 3;
  Parameter weight;
  weight.name = "w";
  weight.buffer = 0;
  weight.globalShape = weight.shardShape = {3};
  weight.shardOffset = {0};
  plan.parameters = {weight};
  EntryPoint entry;
  entry.name = kEntry;
  entry.inputs = {{"x", 1}};
  entry.outputs = {{"probs", 4}};
  Step add;
  add.op = "add";
  add.inputs = {1, 0};
  add.outputs = {2};
  Step softmax;
  softmax.op = "softmax";
  softmax.attrs = {{"axis", -1}};
  softmax.inputs = {2};
  softmax.outputs = {3};
  entry.steps = {add, softmax};
  plan.entryPoints = {entry};
  return plan;
}

HostTensor tensorOf(std::vector<int64_t> shape, std::vector<float> values) {
  HostTensor tensor(DType::F32, std::move(shape));
  std::copy(values.begin(), values.end(), tensor.as<float>());
  return tensor;
}

class ExecutorTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = createBackend("cpu", 2);
  CommunicatorSet communicators;
};

TEST_F(ExecutorTest, RunsKernelsParamsAndViews) {
  Plan plan = addSoftmaxPlan();
  Executor executor(plan, *backend, communicators, "test.dgplan");
  executor.setParameter("w", tensorOf({3}, {0.0f, 1.0f, 2.0f}));
  auto outputs = executor.run(plan.entryPoints[0], {{"x", tensorOf({2, 3}, {1, 1, 1, 0, -1, -2})}});
  ASSERT_EQ(outputs.count("probs"), 1u);
  const HostTensor& probs = outputs["probs"];
  EXPECT_EQ(probs.shape, std::vector<int64_t>{6});
  // Row 0: softmax(1, 2, 3); row 1: softmax(0, 0, 0).
  double denominator = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(probs.as<float>()[0], std::exp(1.0) / denominator, 1e-7);
  EXPECT_NEAR(probs.as<float>()[2], std::exp(3.0) / denominator, 1e-7);
  for (int i = 3; i < 6; ++i) EXPECT_NEAR(probs.as<float>()[i], 1.0 / 3, 1e-7);
  // Parameters read back unchanged, and a second run reuses the prepared steps.
  EXPECT_EQ(executor.parameter("w").as<float>()[2], 2.0f);
  auto again = executor.run(plan.entryPoints[0], {{"x", tensorOf({2, 3}, {0, 0, 0, 0, 0, 0})}});
  EXPECT_NEAR(again["probs"].as<float>()[0], 1.0 / (1 + std::exp(1.0) + std::exp(2.0)), 1e-7);
}

TEST_F(ExecutorTest, RejectsUnknownKernelAtLoad) {
  Plan plan = addSoftmaxPlan();
  plan.entryPoints[0].steps[1].op = "softmax_v2";
  plan.entryPoints[0].steps[1].location = "model.mlir:7:3";
  try {
    Executor executor(plan, *backend, communicators, "test.dgplan");
    FAIL();
  } catch (const InputError& error) {
    EXPECT_EQ(
        std::string(error.what()),
        "test.dgplan: entry forward: step 1 (softmax_v2 at model.mlir:7:3): kernel \"softmax_v2\" is not provided by "
        "the cpu backend");
  }
}

// A plan with a host arena (--optimizer-offload) runs on a backend with host kernels (the CPU's
// here; the CUDA backend's in test/integration/OptimizerOffloadCudaTest.cpp) and is refused by one
// without. Setting a parameter also sets its host master (offload/<name>, plan/HostArena.h): here
// a host step doubles it and a copy across puts the result into w before the device's steps.
TEST_F(ExecutorTest, RunsAHostArenaOnlyWithHostKernels) {
  Plan plan = addSoftmaxPlan();
  plan.arenas.push_back({kHostArenaName, true, 128, 64});
  plan.buffers.push_back({5, std::string(kHostCopyPrefix) + "w", DType::F32, {3}, 2, 0, std::nullopt, std::nullopt});
  plan.buffers.push_back({6, "offload/twice", DType::F32, {3}, 2, 64, std::nullopt, std::nullopt});
  Step doubleOnHost;
  doubleOnHost.op = "add";
  doubleOnHost.inputs = {5, 5};
  doubleOnHost.outputs = {6};
  Step copyBack;
  copyBack.op = "copy";
  copyBack.inputs = {6};
  copyBack.outputs = {0};
  std::vector<Step>& steps = plan.entryPoints[0].steps;
  steps.insert(steps.begin(), {doubleOnHost, copyBack});
  for (Buffer& buffer : plan.buffers)
    if (buffer.lifetime) buffer.lifetime->last += 2;  // each ends two steps later; the input is live from step 0
  {
    Executor executor(plan, *backend, communicators, "test.dgplan");
    executor.setParameter("w", tensorOf({3}, {0.0f, 1.0f, 2.0f}));
    auto outputs = executor.run(plan.entryPoints[0], {{"x", tensorOf({2, 3}, {0, 0, 0, 0, 0, 0})}});
    const double denominator = 1 + std::exp(2.0) + std::exp(4.0);
    EXPECT_NEAR(outputs["probs"].as<float>()[2], std::exp(4.0) / denominator, 1e-7);
    EXPECT_EQ(executor.parameter("w").as<float>()[2], 4.0f);
  }
  // A profile (TimingBackend) counts the host kernels and the copies across apart.
  {
    TimingBackend timing(createBackend("cpu", 1));
    Executor executor(plan, timing, communicators, "test.dgplan");
    executor.run(plan.entryPoints[0], {{"x", tensorOf({2, 3}, {0, 0, 0, 0, 0, 0})}});
    EXPECT_EQ(timing.byOp().at("add (host)").calls, 1);
    EXPECT_EQ(timing.byOp().at("(copy from the host arena)").calls, 1);
    EXPECT_EQ(timing.byOp().at("add").calls, 1);
  }
  // Only a copy may cross between the host arena and the device's.
  {
    Plan mixed = plan;
    mixed.entryPoints[0].steps[2].inputs = {1, 5};
    try {
      Executor executor(mixed, *backend, communicators, "test.dgplan");
      FAIL();
    } catch (const InputError& error) {
      EXPECT_EQ(std::string(error.what()),
                "test.dgplan: entry forward: step 2 (add): mixes buffers of the host arena with device buffers (only "
                "a copy may cross)");
    }
  }
  class DeviceBackend : public ForwardingBackend {
   public:
    using ForwardingBackend::ForwardingBackend;
    std::string name() const override { return "device"; }
    const KernelRegistry* hostKernels() const override { return nullptr; }
  } device(createBackend("cpu", 1));
  try {
    Executor executor(plan, device, communicators, "test.dgplan");
    FAIL();
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()),
              "test.dgplan: arena \"host\" lives in host memory (a plan compiled with --optimizer-offload), which the "
              "device backend cannot run; compile without --optimizer-offload");
  }
}

TEST_F(ExecutorTest, RejectsKernelSignatureMismatchAtLoad) {
  Plan plan = addSoftmaxPlan();
  plan.entryPoints[0].steps[1].attrs = nlohmann::json::object();  // softmax without its axis
  EXPECT_THROW(Executor(plan, *backend, communicators, "test.dgplan"), InputError);
}

TEST_F(ExecutorTest, RefusesArenasLargerThanTheMachinesMemoryBeforeAllocating) {
  Plan plan = addSoftmaxPlan();
  plan.arenas[1].bytes = uint64_t{1} << 60;  // an exbibyte of scratch: granted by overcommit, killed when touched
  try {
    Executor executor(plan, *backend, communicators, "test.dgplan");
    FAIL();
  } catch (const RuntimeError& error) {
    const std::string message = error.what();
    EXPECT_EQ(
        message.rfind("test.dgplan: the plan's 2 arenas need 1152921504606847040 bytes (1.0 EiB), more than the " +
                          formatBytes(backend->memoryCapacityBytes()) + " of memory of the cpu backend;",
                      0),
        0u)
        << message;
  }
}

TEST_F(ExecutorTest, RejectsWrongInputsAndParameters) {
  Plan plan = addSoftmaxPlan();
  Executor executor(plan, *backend, communicators, "test.dgplan");
  try {
    executor.run(plan.entryPoints[0], {{"x", tensorOf({3, 2}, {0, 0, 0, 0, 0, 0})}});
    FAIL();
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()), "input x: expected f32 [2,3], got f32 [3,2]");
  }
  EXPECT_THROW(executor.run(plan.entryPoints[0], {}), InputError);
  EXPECT_THROW(
      executor.run(plan.entryPoints[0], {{"x", tensorOf({2, 3}, {0, 0, 0, 0, 0, 0})}, {"y", tensorOf({1}, {0})}}),
      InputError);
  EXPECT_THROW(executor.setParameter("w", tensorOf({4}, {0, 0, 0, 0})), InputError);
  EXPECT_THROW(executor.setParameter("missing", tensorOf({3}, {0, 0, 0})), InputError);
}

TEST_F(ExecutorTest, CollectivesNeedACommunicatorForTheirAxis) {
  Plan plan = addSoftmaxPlan();
  plan.mesh = {{"tp", 1, 0}};
  Step reduce;
  reduce.kind = Step::Kind::Collective;
  reduce.op = "all_reduce";
  reduce.attrs = {{"reduce", "sum"}};
  reduce.axis = "tp";
  reduce.inputs = reduce.outputs = {3};
  plan.entryPoints[0].steps.push_back(reduce);
  plan.buffers[3].lifetime->last = plan.buffers[4].lifetime->last = 2;
  EXPECT_THROW(Executor(plan, *backend, communicators, "test.dgplan"), InputError);

  communicators.add("tp", std::make_unique<LocalCommunicator>(*backend));
  Executor executor(plan, *backend, communicators, "test.dgplan");
  executor.setParameter("w", tensorOf({3}, {0, 0, 0}));
  auto outputs = executor.run(plan.entryPoints[0], {{"x", tensorOf({2, 3}, {0, 0, 0, 0, 0, 0})}});
  EXPECT_NEAR(outputs["probs"].as<float>()[4], 1.0 / 3, 1e-7);  // a group of one leaves values alone
}

// One ragged all_to_all step over an axis of `peers` ranks: rows f32 [4, 2] and send counts in,
// the received rows (capacity rows) and counts out.
Plan allToAllPlan(int64_t peers, int64_t capacity) {
  Plan plan;
  plan.producer = "test";
  plan.mesh = {{"ep", peers, 0}};
  plan.arenas = {{"persistent", true, 64, 64}, {"scratch", false, 1024, 64}};
  auto scratch = [&](int64_t id, const char* name, DType dtype, std::vector<int64_t> shape, uint64_t offset) {
    return Buffer{id, name, dtype, std::move(shape), 1, offset, Lifetime{kEntry, 0, 0}, std::nullopt};
  };
  plan.buffers = {scratch(0, "rows", DType::F32, {4, 2}, 0), scratch(1, "send_counts", DType::I64, {peers}, 64),
                  scratch(2, "received", DType::F32, {capacity, 2}, 128),
                  scratch(3, "recv_counts", DType::I64, {peers}, 512)};
  EntryPoint entry;
  entry.name = kEntry;
  entry.inputs = {{"rows", 0}, {"send_counts", 1}};
  entry.outputs = {{"received", 2}, {"recv_counts", 3}};
  Step exchange;
  exchange.kind = Step::Kind::Collective;
  exchange.op = "all_to_all";
  exchange.axis = "ep";
  exchange.inputs = {0, 1};
  exchange.outputs = {2, 3};
  entry.steps = {exchange};
  plan.entryPoints = {entry};
  return plan;
}

HostTensor countsOf(std::vector<int64_t> counts) {
  HostTensor tensor(DType::I64, {static_cast<int64_t>(counts.size())});
  std::copy(counts.begin(), counts.end(), tensor.as<int64_t>());
  return tensor;
}

TEST_F(ExecutorTest, AllToAllInAGroupOfOneKeepsTheSentRowsAndZeroesTheRest) {
  Plan plan = allToAllPlan(1, 5);
  communicators.add("ep", std::make_unique<LocalCommunicator>(*backend));
  Executor executor(plan, *backend, communicators, "test.dgplan");
  HostTensor rows = tensorOf({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  // A first run fills four rows, so the second's zero tail is written, not left over.
  executor.run(plan.entryPoints[0], {{"rows", rows}, {"send_counts", countsOf({4})}});
  auto outputs = executor.run(plan.entryPoints[0], {{"rows", rows}, {"send_counts", countsOf({3})}});
  const float* received = outputs["received"].as<float>();
  EXPECT_EQ(std::vector<float>(received, received + 10), (std::vector<float>{1, 2, 3, 4, 5, 6, 0, 0, 0, 0}));
  EXPECT_EQ(outputs["recv_counts"].as<int64_t>()[0], 3);
  try {
    executor.run(plan.entryPoints[0], {{"rows", rows}, {"send_counts", countsOf({5})}});
    FAIL() << "sending more rows than the input holds must fail";
  } catch (const RuntimeError& error) {
    EXPECT_EQ(std::string(error.what()),
              "test.dgplan: entry forward: step 0 (all_to_all): send 5 rows, more than the 4 the buffer holds");
  }
  EXPECT_THROW(executor.run(plan.entryPoints[0], {{"rows", rows}, {"send_counts", countsOf({-1})}}), RuntimeError);
}

TEST_F(ExecutorTest, AllToAllRejectsCountBuffersThatDoNotMatchTheGroup) {
  Plan plan = allToAllPlan(2, 5);  // counts for two ranks, but a group of one
  communicators.add("ep", std::make_unique<LocalCommunicator>(*backend));
  EXPECT_THROW(Executor(plan, *backend, communicators, "test.dgplan"), InputError);
}

// Rank r sends (r + p) % 3 rows to rank p, row i of the block holding (10 r + p, i), over Gloo.
TEST(ExecutorGlooTest, AllToAllStepsExchangeUnevenCountsOverTwoAndThreeRanks) {
  for (int64_t peers : {2, 3}) {
    const int64_t capacity = 6;
    const std::vector<std::string> failures =
        test::runOnRanks(peers, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>& store) {
          Plan plan = allToAllPlan(peers, capacity);
          plan.worldSize = peers;
          plan.rank = rank;
          plan.mesh[0].coord = rank;
          std::unique_ptr<Backend> backend = createBackend("cpu", 1);
          CommunicatorSet communicators;
          communicators.add("ep", createGlooCommunicator(store, rank, peers, std::chrono::seconds(10)));
          Executor executor(plan, *backend, communicators, "rank.dgplan");
          std::vector<int64_t> sendCounts;
          HostTensor rows = tensorOf({4, 2}, std::vector<float>(8, -1));
          int64_t row = 0;
          for (int64_t peer = 0; peer < peers; ++peer) {
            sendCounts.push_back((rank + peer) % 3);
            for (int64_t i = 0; i < sendCounts.back(); ++i, ++row) {
              rows.as<float>()[2 * row] = float(10 * rank + peer);
              rows.as<float>()[2 * row + 1] = float(i);
            }
          }
          auto outputs = executor.run(plan.entryPoints[0], {{"rows", rows}, {"send_counts", countsOf(sendCounts)}});
          std::vector<float> expected;
          for (int64_t peer = 0; peer < peers; ++peer) {
            EXPECT_EQ(outputs["recv_counts"].as<int64_t>()[peer], (peer + rank) % 3) << "rank " << rank;
            for (int64_t i = 0; i < (peer + rank) % 3; ++i)
              expected.insert(expected.end(), {float(10 * peer + rank), float(i)});
          }
          expected.resize(2 * capacity, 0.0f);
          const float* received = outputs["received"].as<float>();
          EXPECT_EQ(std::vector<float>(received, received + 2 * capacity), expected) << "rank " << rank;
        });
    for (int64_t rank = 0; rank < peers; ++rank) EXPECT_EQ(failures[rank], "") << peers << " ranks, rank " << rank;
  }
}

TEST_F(ExecutorTest, UnknownBackendIsAnInputError) { EXPECT_THROW(createBackend("tpu"), InputError); }

}  // namespace
}  // namespace dgemma
