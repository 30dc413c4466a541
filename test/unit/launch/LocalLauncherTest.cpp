// dgemma-run --nproc-per-node: the ranks' environment, and stopping every rank when one fails.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/launch/LocalLauncher.h"

namespace dgemma {
namespace {

std::string scratchFile(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("dgemma-launch-" + std::to_string(::getpid()) + "-" + name)).string();
}

LocalLaunch shell(int64_t processes, const std::string& script) {
  LocalLaunch launch;
  launch.processes = processes;
  launch.command = {"/bin/sh", "-c", script};
  launch.gracePeriod = std::chrono::milliseconds(2000);
  return launch;
}

TEST(LocalLauncher, EveryRankSeesItsRankAndTheSharedDirectory) {
  const std::string prefix = scratchFile("env");
  std::ostringstream errors;
  int code = runLocalRanks(
      shell(3, "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $DGEMMA_RENDEZVOUS_DIR\" > " + prefix + ".$RANK"),
      errors);
  EXPECT_EQ(code, 0) << errors.str();
  std::string directory;
  for (int rank = 0; rank < 3; ++rank) {
    std::ifstream file(prefix + "." + std::to_string(rank));
    int seenRank = -1, localRank = -1, worldSize = 0, localWorldSize = 0;
    std::string seenDirectory;
    file >> seenRank >> localRank >> worldSize >> localWorldSize >> seenDirectory;
    EXPECT_EQ(seenRank, rank);
    EXPECT_EQ(localRank, rank);
    EXPECT_EQ(worldSize, 3);
    EXPECT_EQ(localWorldSize, 3);
    if (rank == 0) directory = seenDirectory;
    EXPECT_EQ(seenDirectory, directory);
    std::filesystem::remove(prefix + "." + std::to_string(rank));
  }
  EXPECT_FALSE(directory.empty());
  EXPECT_FALSE(std::filesystem::exists(directory)) << "the rendezvous directory is removed afterwards";
}

TEST(LocalLauncher, ARankKilledBySignalStopsTheOthers) {
  std::ostringstream errors;
  const auto start = std::chrono::steady_clock::now();
  int code = runLocalRanks(shell(3, "if [ \"$RANK\" = 1 ]; then sleep 0.2; kill -9 $$; fi; exec sleep 60"), errors);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(code, 0);
  EXPECT_LT(seconds, 10.0) << "ranks 0 and 2 should have been stopped";
  EXPECT_NE(errors.str().find("dgemma-run: error: rank 1 killed by signal 9"), std::string::npos) << errors.str();
  EXPECT_EQ(errors.str().find("rank 0"), std::string::npos) << "only the first failure is the cause";
}

TEST(LocalLauncher, AFailingRankPassesOnItsExitCode) {
  std::ostringstream errors;
  int code = runLocalRanks(shell(2, "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 60"), errors);
  EXPECT_EQ(code, 3);
  EXPECT_NE(errors.str().find("rank 1 exited with code 3; stopping the other ranks"), std::string::npos) << errors.str();
}

TEST(LocalLauncher, ARankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  std::ostringstream errors;
  const auto start = std::chrono::steady_clock::now();
  int code = runLocalRanks(shell(2, "if [ \"$RANK\" = 1 ]; then exit 2; fi; trap '' TERM; exec sleep 60"), errors);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(code, 2);
  EXPECT_LT(seconds, 10.0);
}

TEST(LocalLauncher, NamesARankThatCannotStart) {
  LocalLaunch launch;
  launch.processes = 2;
  launch.command = {"/nonexistent/dgemma-run"};
  std::ostringstream errors;
  EXPECT_EQ(runLocalRanks(launch, errors), 127);
  EXPECT_NE(errors.str().find("exited with code 127"), std::string::npos) << errors.str();
}

}  // namespace
}  // namespace dgemma
