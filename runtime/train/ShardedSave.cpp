#include "runtime/train/ShardedSave.h"

#include <unistd.h>

#include <chrono>
#include <exception>
#include <algorithm>
#include <map>

#include "runtime/exec/PaddedRows.h"
#include "runtime/session/GlobalTensors.h"
#include "runtime/train/CheckpointListing.h"
#include "support/Error.h"

namespace dgemma {

namespace {

const Parameter& parameterNamed(const Plan& plan, const std::string& name) {
  for (const Parameter& parameter : plan.parameters)
    if (parameter.name == name) return parameter;
  throw InputError("checkpoint: the plan has no parameter " + name);
}

ShardBox boxOf(const Parameter& parameter) { return {parameter.shardOffset, parameter.shardShape}; }

// The part of this rank's box a checkpoint holds: its logical rows (docs/parallelism.md, "Vocabulary
// padding"; the padding rows are zero in every layout, so a checkpoint of any padding restores any
// other). Empty (0 rows) when the box is padding alone.
ShardBox savedBoxOf(const Parameter& parameter) {
  ShardBox box = boxOf(parameter);
  if (const std::optional<int64_t> rows = logicalRows(parameter))
    box.shape[0] = std::clamp<int64_t>(*rows - box.offset[0], 0, box.shape[0]);
  return box;
}

// The first rank whose flag is 0, or -1 when every rank's is 1.
int64_t firstFailedRank(WorldGroup& world, bool succeeded) {
  const std::vector<int64_t> flags = world.allGather({succeeded ? 1 : 0});
  for (size_t rank = 0; rank < flags.size(); ++rank)
    if (flags[rank] == 0) return static_cast<int64_t>(rank);
  return -1;
}

// After a failed phase: the failing rank's own error on that rank, one naming it on the others.
[[noreturn]] void failTogether(const std::exception_ptr& ownFailure, int64_t failedRank, const std::string& what) {
  if (ownFailure) std::rethrow_exception(ownFailure);
  throw RuntimeError(what + ": rank " + std::to_string(failedRank) + " failed (its own error says why); nothing was committed");
}

}  // namespace

CheckpointSaveResult saveShardedCheckpoint(WorldGroup& world, const Executor& executor, const std::string& saveDir,
                                           const CheckpointState& state, const std::vector<SavedGroup>& groups,
                                           const CheckpointSaveOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  const Plan& plan = executor.plan();
  const std::string what = "checkpoint " + checkpointStepDirectory(saveDir, state.step);

  // Every rank's box of every parameter, in the callers' common order: who writes each box.
  std::vector<const Parameter*> parameters;
  std::vector<int64_t> packedBoxes;
  for (const SavedGroup& group : groups)
    for (const std::string& name : group.parameters) {
      const Parameter& parameter = parameterNamed(plan, name);
      parameters.push_back(&parameter);
      const ShardBox saved = savedBoxOf(parameter);
      packedBoxes.insert(packedBoxes.end(), saved.offset.begin(), saved.offset.end());
      packedBoxes.insert(packedBoxes.end(), saved.shape.begin(), saved.shape.end());
    }
  const std::vector<int64_t> counts = world.allGather({static_cast<int64_t>(packedBoxes.size())});
  for (size_t rank = 0; rank < counts.size(); ++rank)
    if (counts[rank] != counts[0])
      throw InputError(what + ": rank " + std::to_string(rank) + " saves " + std::to_string(counts[rank]) +
                       " box extents, rank 0 " + std::to_string(counts[0]) +
                       " (their plans hold different parameters: a plan directory of mixed models)");
  const std::vector<int64_t> everyBox = world.allGather(packedBoxes);

  std::vector<HostTensor> held;
  held.reserve(parameters.size());  // the shards point into it
  std::vector<CheckpointShard> shards;
  size_t parameterIndex = 0, position = 0;
  for (const SavedGroup& group : groups) {
    for (size_t i = 0; i < group.parameters.size(); ++i, ++parameterIndex) {
      const Parameter& parameter = *parameters[parameterIndex];
      const size_t dims = parameter.shardOffset.size();
      std::vector<ShardBox> boxOfRank;
      for (int64_t rank = 0; rank < world.size(); ++rank) {
        auto first = everyBox.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(rank) * packedBoxes.size() + position);
        boxOfRank.push_back({std::vector<int64_t>(first, first + dims), std::vector<int64_t>(first + dims, first + 2 * dims)});
      }
      position += 2 * dims;
      const ShardBox saved = savedBoxOf(parameter);
      if ((!saved.shape.empty() && saved.shape[0] == 0) ||
          firstReplicaRank(boxOfRank, static_cast<int>(world.rank())) != world.rank())
        continue;
      held.push_back(saved == boxOf(parameter) ? executor.parameter(parameter.name)
                                               : firstRows(executor.parameter(parameter.name), saved.shape[0]));
      shards.push_back({group.group, parameter.name, logicalShape(parameter), saved, &held.back()});
    }
    if (world.rank() == 0)
      for (const CheckpointTensor& tensor : group.replicated)
        shards.push_back({group.group, tensor.name, tensor.tensor->shape, wholeBox(tensor.tensor->shape), tensor.tensor});
  }

  // Rank 0 creates the temporary directory; its process id names it on every rank.
  std::exception_ptr failure;
  int64_t saveId = -1;
  if (world.rank() == 0) {
    try {
      CheckpointWriter::beginSave(saveDir, state.step);
      saveId = ::getpid();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  saveId = world.fromRankZero(saveId);
  if (saveId < 0) failTogether(failure, 0, what);
  const std::string tmp = CheckpointWriter::temporaryDirectory(saveDir, state.step, saveId);

  try {
    CheckpointWriter::saveRank(tmp, static_cast<int>(world.rank()), static_cast<int>(world.size()), shards, options);
  } catch (...) {
    failure = std::current_exception();
  }
  if (const int64_t failed = firstFailedRank(world, !failure); failed >= 0) {
    if (world.rank() == 0) CheckpointWriter::abortSave(tmp);
    failTogether(failure, failed, what);
  }

  // Every rank's files are in place: rank 0 merges their box lists and commits.
  CheckpointSaveResult result;
  if (world.rank() == 0) {
    try {
      result = CheckpointWriter::commitSave(saveDir, tmp, state, static_cast<int>(world.size()), options);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  if (world.fromRankZero(failure ? 0 : 1) == 0) failTogether(failure, 0, what);
  result.directory = checkpointStepDirectory(saveDir, state.step);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

void restoreParameters(const CheckpointReader& checkpoint, const std::string& group,
                       const std::vector<std::string>& names, Executor& executor) {
  for (const std::string& name : names) {
    const Parameter& parameter = parameterNamed(executor.plan(), name);
    // The checkpoint holds the logical tensor; a box reaching into the padding rows gets them as zeros.
    const ShardBox saved = savedBoxOf(parameter);
    HostTensor logical = saved.shape.empty() || saved.shape[0] > 0
                             ? checkpoint.readBox(group, name, logicalShape(parameter), saved)
                             : HostTensor(checkpoint.dtype(group, name), saved.shape);
    executor.setParameter(
        name, saved == boxOf(parameter) ? std::move(logical) : withZeroRows(logical, parameter.shardShape[0]));
  }
}

std::vector<std::pair<std::string, std::string>> adapterCheckpointFiles(Session& session, WorldGroup& world,
                                                                        const std::vector<std::string>& adapters,
                                                                        const std::string& baseWeights) {
  const Plan& plan = session.executor->plan();
  if (session.worldSize > 1 && !session.world)
    throw RuntimeError("checkpoint: an adapter plan on " + std::to_string(session.worldSize) +
                       " ranks needs the session's world communicator to assemble its adapters");
  std::map<std::string, HostTensor> whole;
  for (const std::string& name : adapters) {
    const auto parameter = std::find_if(plan.parameters.begin(), plan.parameters.end(),
                                        [&](const Parameter& candidate) { return candidate.name == name; });
    HostTensor local = session.executor->parameter(name);
    HostTensor global = session.worldSize > 1
                            ? assembleGlobal(*session.world, local, {parameter->shardOffset, parameter->shardShape},
                                             parameter->globalShape, "adapter " + name)
                            : std::move(local);
    if (world.rank() == 0) whole.emplace(name, std::move(global));
  }
  if (world.rank() != 0) return {};
  return session.model->adapterFiles(plan, whole, baseWeights);
}

}  // namespace dgemma
