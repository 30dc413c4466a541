// A plan loaded with its weights on a backend, ready to run entry points: what every plan-running
// subcommand of dgemma-run starts from (docs/training.md, "The training loop").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "plan/Plan.h"
#include "runtime/kernel_api/Backend.h"
#include "runtime/comm/Communicator.h"
#include "runtime/comm/MeshCommunicators.h"
#include "runtime/exec/Executor.h"
#include "runtime/model/ModelAdapter.h"

namespace dgemma {

// Where the plan and its weights come from and what runs it.
struct SessionOptions {
  std::string planDir;  // a directory written by dgemma-compile
  std::string weights;  // an HF checkpoint or a dgemma checkpoint directory ...
  std::string init;     // ... or "random": the parameters' init distributions
  // An adapter plan's LoRA adapters (docs/training.md, "LoRA adapters"): from this adapter directory;
  // empty: from their init specs (with --weights, the base alone comes from there).
  std::string adapter;
  uint64_t seed = 0;    // of --init random
  std::string backend = "cpu";
  int64_t threads = 0;  // CPU worker threads (0: one per core)
  int64_t device = 0;   // --backend cuda: the GPU index (a rank's LOCAL_RANK: one GPU per local rank)
  bool timeKernels = false;  // wrap the backend in a TimingBackend (runtime/exec/TimingBackend.h): --profile
  int64_t rank = 0;
  int64_t worldSize = 1;          // the plan directory must hold this many rank plans
  RendezvousOptions rendezvous;   // how the ranks meet when worldSize > 1
};

// Rank `rank`'s plan file of `planDir`; InputError when there is none.
Plan readRankPlan(const std::string& planDir, int64_t rank);

// InputError naming both numbers when `planDir` holds another number of rank plans
// (rank-0.dgplan, rank-1.dgplan, ...) than the run has ranks.
void checkRankPlanCount(const std::string& planDir, int64_t worldSize);

// This rank's plan: readRankPlan after checkRankPlanCount; InputError when the plan is another
// rank's or another world size's.
Plan loadPlan(const SessionOptions& options);

// One rank's share of a run. With several ranks, every rank opens its session at the same point
// (the communicators' rendezvous waits for all), runs the same entry points in the same order, and
// rank 0 alone prints and writes files.
struct Session {
  Plan plan;
  std::string planPath;
  int64_t rank = 0;
  int64_t worldSize = 1;
  const ModelAdapter* model = nullptr;  // the plan's model family's (runtime/model/ModelAdapter.h)
  std::unique_ptr<Backend> backend;
  CommunicatorSet communicators;        // one per plan.mesh axis: what the plan's collectives use
  std::unique_ptr<Communicator> world;  // every rank, on host memory: barriers, assembling outputs
  std::unique_ptr<Executor> executor;

  bool isRankZero() const { return rank == 0; }
};

// Loads the plan, connects the ranks (options.rendezvous) and fills its model parameters from
// `weights` or `init` (exactly one is given); an adapter plan's adapters from `adapter`, or from
// their init specs (seed `seed`) when it is empty.
std::unique_ptr<Session> openSession(const SessionOptions& options);
// The same for a plan already loaded with loadPlan(options).
std::unique_ptr<Session> openSession(const SessionOptions& options, Plan plan);

// Sets the adapter plan's LoRA adapters to `directory`'s (this rank's boxes). InputError naming it
// when the plan has no adapters or the directory disagrees with the plan (ModelAdapter::readAdapter).
void loadAdapter(Session& session, const std::string& directory);

}  // namespace dgemma
