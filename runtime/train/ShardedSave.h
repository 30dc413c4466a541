// A training run's parameters saved and restored as boxes of the global tensors, on any number of
// ranks (docs/training.md, "Checkpoints"; docs/parallelism.md, "Sharded checkpoints and resume").
// Every rank calls these at the same point with the same parameter lists; the ranks agree through
// the WorldGroup on who writes which box and on whether the save commits.
#pragma once

#include <string>
#include <vector>

#include "runtime/exec/Executor.h"
#include "runtime/session/Session.h"
#include "runtime/train/CheckpointReader.h"
#include "runtime/train/CheckpointWriter.h"
#include "runtime/train/WorldGroup.h"

namespace dgemma {

// One group of a checkpoint: the executor's parameters `names` (plan parameters, each with this
// rank's box), and host tensors that are whole on every rank (e.g. the optimizer step count).
struct SavedGroup {
  std::string group;
  std::vector<std::string> parameters;
  std::vector<CheckpointTensor> replicated;  // their group is `group`
};

// Saves `groups` of `executor` as step `state.step` into `saveDir`: rank 0 begins the save, every
// rank writes the boxes it is the first replica of (firstReplicaRank over every rank's box), and
// rank 0 commits once every rank has written. A failure on any rank fails the save on every rank,
// with nothing committed: the failing rank rethrows its error, the others throw RuntimeError naming
// it. The result's sizes are rank 0's (the whole checkpoint); other ranks get its directory only.
CheckpointSaveResult saveShardedCheckpoint(WorldGroup& world, const Executor& executor, const std::string& saveDir,
                                           const CheckpointState& state, const std::vector<SavedGroup>& groups,
                                           const CheckpointSaveOptions& options);

// Sets every parameter of `names` to this rank's box of it in group `group` of `checkpoint`,
// assembled from whatever layout saved it (CheckpointReader::readBox). Throws InputError as readBox does.
void restoreParameters(const CheckpointReader& checkpoint, const std::string& group,
                       const std::vector<std::string>& names, Executor& executor);

// The adapter directory's files (the family's PEFT format) of an adapter plan's current adapters
// `adapters`, on rank 0 (empty on the others): each assembled whole from the ranks' boxes, a
// collective every rank joins. `baseWeights` is the --weights base they adapt.
std::vector<std::pair<std::string, std::string>> adapterCheckpointFiles(Session& session, WorldGroup& world,
                                                                        const std::vector<std::string>& adapters,
                                                                        const std::string& baseWeights);

}  // namespace dgemma
