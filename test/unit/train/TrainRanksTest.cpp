// The Trainer on two ranks in one process (threads over Gloo), each with its own session, on the
// tiny CPU model: a plan replicated over a data-parallel axis of 2, each rank computing the whole
// global batch, so the ranks must take every decision alike and a one-rank run is the reference.
// Rank 0 alone writes the metrics; a checkpoint saved on either layout resumes on the other with
// the losses of an uninterrupted one-rank run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "plan/PlanFile.h"
#include "runtime/kernels/matmul/BlasThreading.h"
#include "runtime/comm/GlooCommunicator.h"
#include "runtime/exec/WeightLoader.h"
#include "runtime/train/CheckpointReader.h"
#include "runtime/train/TrainData.h"
#include "runtime/train/TrainPlan.h"
#include "runtime/train/Trainer.h"
#include "test/unit/TestSupport.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

using test::runOnRanks;
using test::TempDir;

constexpr uint64_t kSeed = 7;

// The metrics lines without the wall-clock field.
std::vector<std::string> metricsLines(const std::string& path) {
  static const std::regex seconds(R"(, "seconds": [^,}]*)");
  std::vector<std::string> lines;
  std::istringstream in(test::fileBytes(path));
  for (std::string line; std::getline(in, line);) lines.push_back(std::regex_replace(line, seconds, ""));
  return lines;
}

class TrainRanksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // OpenBLAS's thread count is one setting for the process, and the expert kernels set it to 1
    // while they run (SingleThreadedProducts), which is sound with one rank per process. Here two
    // ranks share the process, so one rank's expert kernel would change the other's concurrent
    // products from 2-thread to 1-thread rounding: OpenBLAS is pinned to one thread instead.
    threadProductsOnPool();
    const std::string command = std::string(DGEMMA_COMPILE) + " --model " + DGEMMA_SOURCE_DIR +
                                "/models/diffusion_gemma/configs/tiny-cpu.json --mode train --micro-batch 2 --prompt-len 32,48 -o " +
                                (dir / "plan") + " > " + (dir / "compile.log") + " 2>&1";
    ASSERT_EQ(std::system(command.c_str()), 0) << test::fileBytes(dir / "compile.log");
  }

  // Mock data, a schedule fixed at 6 steps whatever --steps is, so runs of different lengths agree.
  TrainOptions options(int64_t steps, const std::string& name, bool resume) const {
    TrainOptions options;
    options.session.planDir = dir / "plan";
    options.session.init = "random";
    options.session.seed = kSeed;
    options.session.threads = 1;
    options.train = kMockSplit;
    options.steps = steps;
    options.lr = 1e-3;
    options.warmupSteps = 2;
    options.decaySteps = 6;
    options.saveDir = dir / (name + "-checkpoints");
    options.metrics = dir / (name + ".jsonl");
    options.resume = resume;
    return options;
  }

  // Rank `rank` of the plan replicated over `dp = 2`: the one-rank plan with that mesh, its
  // communicator met through `store`, its weights drawn from the seed as on one rank.
  static std::unique_ptr<Session> replicatedRank(const TrainOptions& options, int64_t rank,
                                                 const std::shared_ptr<gloo::rendezvous::Store>& store) {
    auto session = std::make_unique<Session>();
    session->plan = loadPlan(options.session);
    session->plan.rank = rank;
    session->plan.worldSize = 2;
    session->plan.mesh = {{"dp", 2, rank}};
    session->planPath = planFileForRank(options.session.planDir, 0);
    session->model = &modelAdapterFor(session->plan.modelFamily);
    session->backend = createBackend("cpu", 1);
    session->communicators.add("dp", createGlooCommunicator(store, rank, 2, std::chrono::milliseconds(60000)));
    session->executor = std::make_unique<Executor>(session->plan, *session->backend, session->communicators, session->planPath);
    initializeWeights(*session->executor, options.session.seed);
    return session;
  }

  // What each rank threw ("" when it finished).
  static std::vector<std::string> runTwoRanks(const TrainOptions& rank0, const TrainOptions& rank1) {
    return runOnRanks(2, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>& store) {
      const TrainOptions& options = rank == 0 ? rank0 : rank1;
      std::unique_ptr<Session> session = replicatedRank(options, rank, store);
      EXPECT_EQ(runTrain(options, *session), 0) << "rank " << rank;
    });
  }

  static void trainOnTwoRanks(const TrainOptions& options) {
    const std::vector<std::string> failures = runTwoRanks(options, options);
    for (size_t rank = 0; rank < failures.size(); ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
  }

  static void trainOnOneRank(const TrainOptions& options) {
    std::unique_ptr<Session> session = openSession(options.session);
    EXPECT_EQ(runTrain(options, *session), 0);
  }

  TempDir dir;
};

TEST_F(TrainRanksTest, TwoRanksSaveWhatOneRankResumesWithTheSameLosses) {
  trainOnOneRank(options(6, "one", false));
  const std::vector<std::string> reference = metricsLines(dir / "one.jsonl");
  ASSERT_EQ(reference.size(), 6u);

  trainOnTwoRanks(options(4, "split", false));
  // Rank 0 alone wrote the file: one line per step, the one-rank run's.
  EXPECT_EQ(metricsLines(dir / "split.jsonl"), std::vector<std::string>(reference.begin(), reference.begin() + 4));
  const std::string saved = dir / "split-checkpoints/step-00000004";
  const Plan plan = loadPlan(options(4, "split", false).session);
  const nlohmann::json identity = checkpointIdentity(plan, readTrainPlan(plan, "rank-0.dgplan"));
  const CheckpointReader checkpoint = CheckpointReader::load(saved, identity);
  EXPECT_EQ(checkpoint.worldSize(), 2);
  for (const std::string& group : checkpoint.groups())
    for (const nlohmann::json& tensor : checkpoint.manifest()["groups"][group]["tensors"]) {
      ASSERT_EQ(tensor["boxes"].size(), 1u) << tensor["name"];  // every box replicated: rank 0 writes it
      EXPECT_EQ(tensor["boxes"][0]["rank"], 0) << tensor["name"];
    }

  // The same checkpoint continues on one rank, another layout, with the uninterrupted run's lines.
  trainOnOneRank(options(6, "split", true));
  EXPECT_EQ(metricsLines(dir / "split.jsonl"), reference);
  const CheckpointReader oneRank = CheckpointReader::load(dir / "one-checkpoints/step-00000006", identity);
  const CheckpointReader resumed = CheckpointReader::load(dir / "split-checkpoints/step-00000006", identity);
  for (const char* group : {"model", "optimizer"})
    for (const std::string& name : oneRank.names(group))
      EXPECT_EQ(resumed.read(group, name).data, oneRank.read(group, name).data) << group << " " << name;
}

// The other way: a one-rank checkpoint continues on two ranks, which agree on every step's gradient
// check and on the saves.
TEST_F(TrainRanksTest, OneRankSavesWhatTwoRanksResumeWithTheSameLosses) {
  trainOnOneRank(options(6, "one", false));
  trainOnOneRank(options(2, "split", false));
  trainOnTwoRanks(options(6, "split", true));
  EXPECT_EQ(metricsLines(dir / "split.jsonl"), metricsLines(dir / "one.jsonl"));
  EXPECT_TRUE(std::filesystem::exists(dir / "split-checkpoints/step-00000006/manifest.json"));
}

// Ranks that would resume different steps (a --save-dir they do not share) stop together, naming both.
TEST_F(TrainRanksTest, RanksThatSeeDifferentCheckpointsRefuseToResume) {
  trainOnOneRank(options(2, "saved", false));
  TrainOptions elsewhere = options(6, "elsewhere", true);
  std::filesystem::create_directories(elsewhere.saveDir);
  const std::vector<std::string> failures = runTwoRanks(options(6, "saved", true), elsewhere);
  const std::string mismatch = ": rank 1 finds no checkpoint, rank 0 step 2 (every rank must see the same --save-dir)";
  EXPECT_TRUE(test::mentions(failures[0], "--resume: " + (dir / "saved-checkpoints") + mismatch));
  EXPECT_TRUE(test::mentions(failures[1], "--resume: " + elsewhere.saveDir + mismatch));
}

}  // namespace
}  // namespace dgemma
