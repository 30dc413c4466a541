// The host arena: the one pool of a plan that lives in the host's memory instead of the device's.
// dgemma-compile --optimizer-offload puts the offloaded AdamW moments and the staging of their
// update there (docs/parallelism.md, "Optimizer-state offload"; docs/plan-format.md, "Header").
#pragma once

#include "plan/Plan.h"

namespace dgemma {

inline constexpr const char* kHostArenaName = "host";

inline bool isHostArena(const Arena& arena) { return arena.name == kHostArenaName; }

}  // namespace dgemma
