// dgemma-run --nproc-per-node N: starts N ranks of this executable on this host and watches them
// (docs/cli.md, "Several ranks").
#pragma once

#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace dgemma {

struct LocalLaunch {
  int64_t processes = 1;
  // The command line each rank runs: the executable (exec'd by path) and its arguments. The ranks
  // see RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and DGEMMA_RENDEZVOUS_DIR (a fresh
  // directory, removed afterwards) in their environment.
  std::vector<std::string> command;
  // After the first failure the other ranks get SIGTERM, and SIGKILL when they are still running
  // after this long.
  std::chrono::milliseconds gracePeriod{5000};
};

// Runs the ranks and waits for them. 0 when every rank exited 0. When one exits non-zero or dies
// by a signal, the others are stopped, `errors` gets a line naming the rank and the cause ("rank 1
// killed by signal 9 (Killed)"), and the result is that rank's exit code (1 for a signal).
// SIGINT and SIGTERM sent to the launcher are passed on to the ranks. RuntimeError when a rank
// cannot be started.
int runLocalRanks(const LocalLaunch& launch, std::ostream& errors);

// This process's executable, for LocalLaunch::command (readlink /proc/self/exe).
std::string currentExecutable();

}  // namespace dgemma
