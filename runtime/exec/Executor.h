// Runs a validated plan on a backend. It knows nothing of any model: it binds named inputs and
// parameters to buffers, runs an entry point's steps in order (kernels through the backend's registry,
// collectives through the communicator of their mesh axis) and reads named outputs back.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/kernel_api/Backend.h"
#include "runtime/comm/Communicator.h"
#include "runtime/core/HostTensor.h"
#include "plan/Plan.h"

namespace dgemma {

class Executor {
 public:
  // Prepares every step of every entry point (kernel lookup and signature checks: a plan the backend
  // cannot run fails here with InputError), allocates the arenas and uploads constants.
  // `plan` must outlive the executor; `source` names the plan file in messages.
  Executor(const Plan& plan, Backend& backend, CommunicatorSet& communicators, std::string source);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  const Plan& plan() const { return plan_; }

  // Shape and dtype must equal the parameter's buffer (its shard on this rank); throws InputError.
  void setParameter(const std::string& name, const HostTensor& value);
  HostTensor parameter(const std::string& name) const;

  // Runs `entry` (one of plan().entryPoints). Every entry input must be given with its exact shape
  // and dtype; returns every entry output.
  std::map<std::string, HostTensor> run(const EntryPoint& entry, const std::map<std::string, HostTensor>& inputs);

 private:
  struct PreparedStep;
  struct PreparedEntry;

  // A ragged all_to_all step: reads the send counts, exchanges them, moves the rows, zeroes the
  // result's unreceived tail and writes the received counts.
  void runAllToAll(const PreparedStep& step, ExecContext& context);
  void* address(int64_t bufferId) const;
  bool inHostArena(int64_t bufferId) const;  // plan/HostArena.h: the CPU reads and writes it directly
  HostTensor download(int64_t bufferId) const;

  const Plan& plan_;
  Backend& backend_;
  CommunicatorSet& communicators_;
  std::string source_;
  std::vector<void*> arenaBases_;
  std::map<std::string, std::unique_ptr<PreparedEntry>> entries_;
};

}  // namespace dgemma
