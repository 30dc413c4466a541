// What every plan-running subcommand of dgemma-run shares: a plan loaded with its weights on a
// backend (a Session), and running one entry point of it on named tensors, in the smallest bucket
// that holds them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/kernel_api/Backend.h"
#include "runtime/comm/Communicator.h"
#include "runtime/core/HostTensor.h"
#include "runtime/core/NoiseKeys.h"
#include "runtime/exec/Executor.h"
#include "plan/Plan.h"

namespace dgemma::tool {

struct ExecutionFlags {
  std::string planDir;
  std::string weights;
  std::string init;
  uint64_t seed = 0;
  std::string input;
  std::string output;
  std::string backend = "cpu";
  int64_t threads = 0;
  int64_t rank = 0;
  uint64_t step = 0;         // grad: the noise keys' step
  int64_t firstSample = 0;   // grad: the global sample index of the batch's first row
};

// The plan file of this rank; InputError when --plan is not a plan directory.
Plan loadPlan(const ExecutionFlags& flags);

// The XXH3-64 content hash the plan file's preamble records (docs/plan-format.md), as 16 hex
// digits: what a checkpoint names its plan by.
std::string planContentHash(const std::string& planPath);

// A plan loaded with its weights, ready to run entry points.
struct Session {
  Plan plan;
  std::string planPath;
  std::unique_ptr<Backend> backend;
  CommunicatorSet communicators;
  std::unique_ptr<Executor> executor;
};

// Loads the plan and fills its parameters from --weights (an HF checkpoint or a dgemma checkpoint
// directory) or --init random.
std::unique_ptr<Session> openSession(const ExecutionFlags& flags);
// The same for a plan already loaded with loadPlan(flags).
std::unique_ptr<Session> openSession(const ExecutionFlags& flags, Plan plan);

// Runs entry `entryName` on `batch` and returns its outputs. With the plan's padding contract
// (metadata.bucket_padding) the batch runs in the smallest bucket that holds it, left-padded, and
// prompt-length outputs are cropped back. Fields the entry does not take are dropped. `batchPath`
// names the batch in messages.
std::map<std::string, HostTensor> runEntry(Session& session, const std::string& entryName, std::map<std::string, HostTensor> batch,
                                           const std::string& batchPath);

// Runs the plan's "corrupt" entry on the batch's canvas_ids and canvas_mask with the noise keys of
// (seed, phase, step, samples[row]) (training.md §11.1) and adds its outputs (diffusion_t,
// noisy_canvas_ids, self_conditioning_mask) to the batch.
void addDrawnCorruption(Session& session, std::map<std::string, HostTensor>& batch, uint64_t seed, NoisePhase phase,
                        uint64_t step, const std::vector<int64_t>& samples, const std::string& batchPath);

}  // namespace dgemma::tool
