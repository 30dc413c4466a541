// A plan loaded with its weights on a backend, ready to run entry points: what every plan-running
// subcommand of dgemma-run starts from (docs/training.md, "The training loop").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "plan/Plan.h"
#include "runtime/kernel_api/Backend.h"
#include "runtime/comm/Communicator.h"
#include "runtime/exec/Executor.h"

namespace dgemma {

// Where the plan and its weights come from and what runs it.
struct SessionOptions {
  std::string planDir;  // a directory written by dgemma-compile
  std::string weights;  // an HF checkpoint or a dgemma checkpoint directory ...
  std::string init;     // ... or "random": the parameters' init distributions
  uint64_t seed = 0;    // of --init random
  std::string backend = "cpu";
  int64_t threads = 0;  // CPU worker threads (0: one per core)
  int64_t rank = 0;
};

// The plan file of this rank; InputError when `planDir` is not a plan directory.
Plan loadPlan(const SessionOptions& options);

// The XXH3-64 content hash the plan file's preamble records (docs/plan-format.md), as 16 hex
// digits: what a checkpoint names its plan by.
std::string planContentHash(const std::string& planPath);

struct Session {
  Plan plan;
  std::string planPath;
  std::unique_ptr<Backend> backend;
  CommunicatorSet communicators;
  std::unique_ptr<Executor> executor;
};

// Loads the plan and fills its model parameters from `weights` or `init` (exactly one is given).
std::unique_ptr<Session> openSession(const SessionOptions& options);
// The same for a plan already loaded with loadPlan(options).
std::unique_ptr<Session> openSession(const SessionOptions& options, Plan plan);

}  // namespace dgemma
