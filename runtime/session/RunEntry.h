// Running one entry point of a session's plan on named host tensors, in the smallest bucket that
// holds them (the plan's bucket padding, docs/plan-format.md), and the drawn corruption of a
// training batch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/HostTensor.h"
#include "runtime/core/NoiseKeys.h"
#include "runtime/session/Session.h"

namespace dgemma {

// Runs entry `entryName` on `batch` and returns its outputs. With the plan's padding contract
// (Plan::bucketPadding) the batch runs in the smallest bucket that holds it, left-padded, and
// prompt-length outputs are cropped back. The model adapter adds the optional inputs the batch
// leaves out (ModelAdapter::addEntryDefaults); fields the entry does not take are dropped. `batchPath`
// names the batch in messages. On a sharded plan `batch` holds the global tensors on every rank,
// each rank feeds its box of them, and every rank gets every output whole (assembled from the
// ranks' boxes: a collective, so all ranks run the same entries in the same order).
std::map<std::string, HostTensor> runEntry(Session& session, const std::string& entryName, std::map<std::string, HostTensor> batch,
                                           const std::string& batchPath);

// Runs the model's corrupt entry (ModelContract::corruptEntry) on the batch's canvas ids and canvas
// mask with the noise keys of (seed, phase, step, samples[row]) (docs/training.md) and adds its
// outputs (the diffusion time, the noisy canvas ids and the self-conditioning mask) to the batch.
void addDrawnCorruption(Session& session, std::map<std::string, HostTensor>& batch, uint64_t seed, NoisePhase phase,
                        uint64_t step, const std::vector<int64_t>& samples, const std::string& batchPath);

}  // namespace dgemma
